// GEMM+AR on the CPU backend: one-shot and two-shot bit-identical to the unfused baseline and to the
// rank-ordered fp32 sum of the rounded partials on every rank, near the float64 reference; worlds
// 1..8 (odd ones too), ragged K_r, uneven and empty two-shot segments, tiles and bands off the shape.
#include <gtest/gtest.h>

#include <sstream>

#include "op_harness.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink {
namespace {

using test::Bytes;

struct ArCase {
  int world;
  int64_t m;
  bool uneven;
  AllReduceAlgo algo;
  DType dtype;
  int band_cols, tile_m, tile_n, group_m;
  int comm_workers, compute_workers;
};

std::string case_name(const ::testing::TestParamInfo<ArCase>& info) {
  const ArCase& c = info.param;
  std::ostringstream os;
  os << "w" << c.world << "_m" << c.m << (c.uneven ? "_uneven_" : "_even_")
     << (c.algo == AllReduceAlgo::kOneShot ? "oneshot_" : "twoshot_") << dtype_name(c.dtype) << "_b"
     << c.band_cols << "_t" << c.tile_m << "x" << c.tile_n << "_g" << c.group_m << "_wk" << c.comm_workers
     << c.compute_workers;
  return os.str();
}

std::vector<ArCase> cases() {
  std::vector<ArCase> out;
  const int64_t ms[] = {1, 16, 45, 130};
  const DType dtypes[] = {DType::kBF16, DType::kF32, DType::kF16};
  const int tiles[][3] = {{8, 16, 32}, {16, 32, 16}, {512, 7, 9}, {24, 128, 128}, {8, 3, 96}, {40, 64, 20}};
  int i = 0;
  for (int w = 1; w <= 8; ++w)
    for (int64_t m : ms)
      for (AllReduceAlgo algo : {AllReduceAlgo::kOneShot, AllReduceAlgo::kTwoShot}) {
        const int* t = tiles[i % 6];
        out.push_back(ArCase{w, m, (i % 3) != 1, algo, dtypes[i % 3], t[0], t[1], t[2], 1 + (i % 4 == 3),
                             1 + (i / 2) % 3, 1 + i % 2});
        ++i;
      }
  return out;
}

class GemmArFused : public ::testing::TestWithParam<ArCase> {};

TEST_P(GemmArFused, BitIdenticalToUnfusedOnEveryRankAndNearReference) {
  const ArCase& c = GetParam();
  TL_SEEDED_RNG(rng);
  RowPartition rows = c.uneven ? RowPartition::from_counts(rng.uneven_counts(c.m, c.world))
                               : RowPartition::even(c.m, c.world);
  const int64_t n = rng.uniform(1, 80);
  std::vector<int64_t> k;
  for (int r = 0; r < c.world; ++r) k.push_back(rng.uniform(1, 64));  // ragged K_r
  std::ostringstream shape;
  shape << "N " << n << " (segment:K_r) [";
  for (int r = 0; r < c.world; ++r) shape << (r ? " " : "") << rows.size(r) << ":" << k[r];
  shape << "]";
  SCOPED_TRACE(shape.str());

  GemmArConfig cfg;
  cfg.algo = c.algo;
  cfg.band_cols = c.band_cols;
  cfg.gemm_tile_m = c.tile_m;
  cfg.gemm_tile_n = c.tile_n;
  cfg.group_m = c.group_m;
  cfg.comm_workers = c.comm_workers;
  cfg.compute_workers = c.compute_workers;
  cpu::World world(c.world);
  cpu::GemmAr op(world, rows, n, k, c.dtype, cfg);

  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call);
    test::RsInputs in = test::rs_inputs(rng, rows, n, k, c.dtype);
    std::vector<Bytes> fused = test::ar_outputs(c.world, c.m, n, c.dtype), unfused = fused;
    world.run([&](cpu::RankContext& ctx) {
      op.run(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(), fused[ctx.rank].data());
    });
    world.run([&](cpu::RankContext& ctx) {
      op.run_unfused(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(), unfused[ctx.rank].data());
    });
    const Bytes want = test::ar_expected_bits(in, c.m, n, k, c.dtype);
    for (int r = 0; r < c.world; ++r) {
      const int64_t d = test::first_difference(fused[r], want, c.dtype);
      ASSERT_EQ(d, -1) << "rank " << r << ": fused differs from the rank-ordered sum at element " << d
                       << " (row " << d / n << ", col " << d % n << ")";
      ASSERT_EQ(test::first_difference(unfused[r], want, c.dtype), -1) << "rank " << r << ": unfused";
    }
    test::expect_ar_near_reference(in, fused, c.m, n, k, c.dtype, "fused");
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmArFused, ::testing::ValuesIn(cases()), case_name);

TEST(GemmAr, ThirtyCallsAlternatingAlgorithmsStayExact) {
  TL_SEEDED_RNG(rng);
  const RowPartition rows = RowPartition::from_counts(std::vector<int64_t>{0, 45, 30, 26, 0});
  const int64_t m = rows.total(), n = 40;
  const std::vector<int64_t> k = {16, 40, 3, 25, 8};
  GemmArConfig one, two;
  one.gemm_tile_m = two.gemm_tile_m = 16;
  one.gemm_tile_n = two.gemm_tile_n = 24;
  one.band_cols = two.band_cols = 16;
  one.comm_workers = two.comm_workers = 2;
  two.algo = AllReduceAlgo::kTwoShot;
  cpu::World world(5);
  cpu::GemmAr op1(world, rows, n, k, DType::kBF16, one), op2(world, rows, n, k, DType::kBF16, two);
  for (int call = 0; call < 30; ++call) {
    test::RsInputs in = test::rs_inputs(rng, rows, n, k, DType::kBF16);
    std::vector<Bytes> out = test::ar_outputs(5, m, n, DType::kBF16);
    cpu::GemmAr& op = call % 2 ? op2 : op1;
    world.run([&](cpu::RankContext& ctx) {
      if (call % 3 == 2) op.run_unfused(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(), out[ctx.rank].data());
      else op.run(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(), out[ctx.rank].data());
    });
    const Bytes want = test::ar_expected_bits(in, m, n, k, DType::kBF16);
    for (int r = 0; r < 5; ++r) ASSERT_EQ(test::first_difference(out[r], want, DType::kBF16), -1) << "call " << call;
  }
}

TEST(GemmAr, PlanRefusesBadInputBeforeRunning) {
  const RowPartition rows = RowPartition::even(64, 2);
  GemmArConfig cfg;
  EXPECT_THROW(GemmArPlan::make(2, rows, 64, 64, DType::kBF16, cfg), Error);  // rank outside the world
  EXPECT_THROW(GemmArPlan::make(0, rows, 0, 64, DType::kBF16, cfg), Error);   // N = 0
  cfg.band_cols = 12;
  EXPECT_THROW(GemmArPlan::make(0, rows, 64, 64, DType::kBF16, cfg), Error);  // band not 8-aligned
  cpu::World world(3);
  EXPECT_THROW(cpu::GemmAr(world, rows, 64, {8, 8}, DType::kBF16, GemmArConfig{}), Error);  // 2 vs 3 ranks
}

// Every rank's reduce items tile exactly the rows it reduces; the gather covers every owner's
// bands exactly once; the waits of an item are the producer tiles covering it on every source.
TEST(AllReducePlan, ItemsTileTheRowsAndGatherCoversEveryBandOnce) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 200; ++trial) {
    const int W = static_cast<int>(rng.uniform(1, 8));
    const int64_t m = rng.uniform(1, 300), n = 8 * rng.uniform(1, 40);
    const RowPartition rows = RowPartition::from_counts(rng.uneven_counts(m, W));
    const AllReduceAlgo algo = trial % 2 ? AllReduceAlgo::kTwoShot : AllReduceAlgo::kOneShot;
    const int tm = static_cast<int>(rng.uniform(1, 130)), tn = static_cast<int>(rng.uniform(1, 130));
    const int bc = 8 * static_cast<int>(rng.uniform(1, 70)), g = static_cast<int>(rng.uniform(1, 4));
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " W " << W << " M " << m << " N " << n);
    for (int r = 0; r < W; ++r) {
      const AllReducePlan p = AllReducePlan::make(r, algo, rows, n, DType::kBF16, tm, tn, g, bc);
      std::vector<int> hits(static_cast<size_t>(m * n), 0);
      for (int j = 0; j < p.reduce_count(); ++j) {
        const Rect rect = p.reduce_rect(j);
        ASSERT_FALSE(rect.empty());
        for (int64_t i = rect.row; i < rect.row + rect.rows; ++i)
          for (int64_t c = rect.col; c < rect.col + rect.cols; ++c) ++hits[i * n + c];
        const TileSpan span = p.producer.covering(rect);
        ASSERT_EQ(p.reduce_waits(j), W * span.count());
        for (int w = 0; w < p.reduce_waits(j); ++w) {
          int src = -1, slot = -1;
          p.reduce_wait(j, w, &src, &slot);
          ASSERT_GE(src, 0);
          ASSERT_LT(src, W);
          ASSERT_EQ(src, peer_at(r, 1 + w / span.count(), W));
          const Rect t = p.producer.region(p.producer.coord(slot));
          ASSERT_TRUE(t.row < rect.row + rect.rows && rect.row < t.row + t.rows && t.col < rect.col + rect.cols &&
                      rect.col < t.col + t.cols);
        }
      }
      const RowRange mine = p.rows_of(r);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = 0; c < n; ++c)
          ASSERT_EQ(hits[i * n + c], i >= mine.begin && i < mine.end ? 1 : 0) << "row " << i << " col " << c;
      if (algo == AllReduceAlgo::kOneShot) {
        EXPECT_EQ(p.gather_count(), 0);
        continue;
      }
      std::vector<int> got(static_cast<size_t>(m * n), 0);
      for (int i = 0; i < p.gather_count(); ++i) {
        int owner = -1, band = -1;
        if (!p.gather_item(i, &owner, &band)) continue;
        const Rect rect = p.item_rect(owner, band);
        ASSERT_GE(rect.row, rows.begin(owner));
        ASSERT_LE(rect.row + rect.rows, rows.end(owner));
        for (int64_t a = rect.row; a < rect.row + rect.rows; ++a)
          for (int64_t c = rect.col; c < rect.col + rect.cols; ++c) ++got[a * n + c];
      }
      for (int v : got) ASSERT_EQ(v, 1);
    }
  }
}

}  // namespace
}  // namespace tilelink
