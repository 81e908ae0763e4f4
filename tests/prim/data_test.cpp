// Data primitives on the CPU backend: push, pull and rank_copy of pitched 2-D tiles between ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "../support/random.hpp"
#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/backend/cpu/world.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {
namespace {

enum class Kind { kPush, kPull, kRankCopy };

// One random pitched copy from rank `src` to rank `dst` of a world of 3, issued by the rank the
// primitive belongs to (push: the source, pull and rank_copy: the destination). Checks the copied
// bytes and that every byte outside the destination rows is untouched (still 0xFF).
void check_copy(test::Rng& rng, Kind kind) {
  World world(3);
  const int64_t kBytes = 1 << 15;
  SymmetricAllocation heap = world.allocate(kBytes);
  for (int iter = 0; iter < 100; ++iter) {
    Copy2D c;
    c.rows = rng.uniform(0, 20);
    c.row_bytes = rng.uniform(1, 200);
    c.src_pitch = c.row_bytes + (rng.coin() ? 0 : rng.uniform(1, 50));
    c.dst_pitch = c.row_bytes + (rng.coin() ? 0 : rng.uniform(1, 50));
    const int64_t src_off = rng.uniform(0, 500), dst_off = rng.uniform(0, 500);
    const int src = rng.uniform_int(0, 2), dst = rng.uniform_int(0, 2);
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " rows " << c.rows << " row_bytes "
                                      << c.row_bytes << " pitches " << c.src_pitch << "/"
                                      << c.dst_pitch << " " << src << " -> " << dst);
    // Fresh source bytes, poisoned destination.
    for (int r = 0; r < 3; ++r) test::poison(heap.base(r), kBytes);
    auto* sbase = static_cast<std::byte*>(heap.base(src)) + src_off;
    std::vector<std::byte> want(static_cast<size_t>(c.rows * c.row_bytes));
    for (int64_t i = 0; i < c.rows; ++i)
      for (int64_t j = 0; j < c.row_bytes; ++j) {
        auto v = static_cast<std::byte>(rng.uniform(0, 254));
        sbase[i * c.src_pitch + j] = v;
        want[i * c.row_bytes + j] = v;
      }
    std::vector<std::byte> before_src(static_cast<std::byte*>(heap.base(src)),
                                      static_cast<std::byte*>(heap.base(src)) + kBytes);
    c.src = sbase;
    c.dst = static_cast<std::byte*>(heap.base(dst)) + kBytes / 2 + dst_off;
    world.run([&](RankContext& ctx) {
      if (kind == Kind::kPush && ctx.rank == src) tile_push_data(ctx, dst, c);
      if (kind == Kind::kPull && ctx.rank == dst) tile_pull_data(ctx, src, c);
      if (kind == Kind::kRankCopy && ctx.rank == dst) rank_copy_data(ctx, src, c);
    });
    auto* d = static_cast<const std::byte*>(heap.base(dst));
    for (int64_t b = 0; b < kBytes; ++b) {
      int64_t rel = b - (kBytes / 2 + dst_off);
      bool inside = rel >= 0 && rel / c.dst_pitch < c.rows && rel % c.dst_pitch < c.row_bytes;
      if (inside) {
        ASSERT_EQ(d[b], want[(rel / c.dst_pitch) * c.row_bytes + rel % c.dst_pitch])
            << "byte " << b;
      } else if (dst != src || b >= kBytes / 2) {
        ASSERT_EQ(d[b], std::byte{0xFF}) << "byte " << b << " outside the copy was written";
      }
    }
    // The source is only read.
    if (src != dst) {
      ASSERT_EQ(std::memcmp(before_src.data(), heap.base(src), kBytes), 0) << "the source changed";
    }
  }
}

TEST(Data, PushCopiesPitchedTiles) {
  TL_SEEDED_RNG(rng);
  check_copy(rng, Kind::kPush);
}
TEST(Data, PullCopiesPitchedTiles) {
  TL_SEEDED_RNG(rng);
  check_copy(rng, Kind::kPull);
}
TEST(Data, RankCopyCopiesPitchedTiles) {
  TL_SEEDED_RNG(rng);
  check_copy(rng, Kind::kRankCopy);
}

TEST(Data, OutOfRangeRankThrowsAndEmptyCopiesAreNoOps) {
  World world(2);
  std::byte a[64], b[64];
  Copy2D c{a, 64, b, 64, 1, 64};
  world.run([&](RankContext& ctx) {
    if (ctx.rank != 0) return;
    EXPECT_THROW(tile_push_data(ctx, 2, c), Error);
    EXPECT_THROW(tile_push_data(ctx, -1, c), Error);
    EXPECT_THROW(tile_pull_data(ctx, 2, c), Error);
    EXPECT_THROW(rank_copy_data(ctx, 9, c), Error);
    // No rows or no bytes: nothing is touched, even through null pointers.
    EXPECT_NO_THROW(tile_push_data(ctx, 1, Copy2D{nullptr, 0, nullptr, 0, 0, 64}));
    EXPECT_NO_THROW(tile_pull_data(ctx, 1, Copy2D{nullptr, 0, nullptr, 0, 5, 0}));
    // A real copy through a null pointer is refused.
    EXPECT_THROW(rank_copy_data(ctx, 1, Copy2D{nullptr, 64, b, 64, 1, 64}), Error);
  });
}

}  // namespace
}  // namespace tilelink::cpu
