// MoE routing tables and the CPU grouped GEMM / top-k reduce: against brute force and float64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "../support/moe_routing.hpp"
#include "../support/random.hpp"
#include "../support/refused.hpp"
#include "tilelink/backend/cpu/moe_ops.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/compute/cpu_moe.hpp"
#include "tilelink/core/dynamic_partition.hpp"
#include "tilelink/ops/moe_plan.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace tilelink {
namespace {

using test::draw_ids;
using test::Routing;
using test::name;

// A random MoE layer on a world: ragged tokens (empty segments likely), ragged F_r (multiples of 8).
struct Layer {
  int world, experts, topk;
  int64_t tokens, hidden;
  DType dtype;
  RowPartition part;
  std::vector<int64_t> ffn;

  static Layer draw(test::Rng& rng, int max_experts, int max_topk, int64_t min_tokens, int64_t max_tokens,
                    int max_h8, int max_f8, std::vector<DType> dtypes) {
    Layer l;
    l.world = rng.uniform_int(1, 8);
    l.experts = rng.coin(0.3) ? rng.uniform_int(1, 4) : rng.uniform_int(1, max_experts);
    l.topk = rng.uniform_int(1, std::min(max_topk, l.experts));
    l.tokens = rng.uniform(min_tokens, max_tokens);
    l.hidden = 8 * rng.uniform(1, max_h8);
    l.dtype = rng.pick(dtypes);
    l.part = RowPartition::from_counts(rng.uneven_counts(l.tokens, l.world));
    l.ffn.resize(l.world);
    for (auto& v : l.ffn) v = 8 * rng.uniform(1, max_f8);
    return l;
  }
  friend std::ostream& operator<<(std::ostream& os, const Layer& l) {
    return os << "W " << l.world << " tokens " << l.tokens << " H " << l.hidden << " experts " << l.experts
              << " topk " << l.topk << " " << dtype_name(l.dtype);
  }
};

TEST(MoeRouting, TablesMatchBruteForce) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 300; ++trial) {
    const int experts = rng.coin(0.2) ? rng.uniform_int(1, 4) : rng.uniform_int(1, 256);
    const int topk = rng.uniform_int(1, std::min(8, experts));
    const int64_t tokens = rng.coin(0.1) ? 0 : rng.uniform(1, 300);
    const Routing how = static_cast<Routing>(rng.uniform_int(0, 3));
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " tokens " << tokens << " topk " << topk
                                      << " experts " << experts << " " << name(how));
    const std::vector<int32_t> ids = draw_ids(rng, tokens, topk, experts, how);
    const MoeRouting r = moe_route(ids, tokens, topk, experts);
    ASSERT_EQ(r.rows(), tokens * topk);
    // counts and offsets by brute force
    std::vector<int64_t> counts(experts, 0);
    for (int32_t e : ids) ++counts[e];
    EXPECT_EQ(r.counts, counts);
    ASSERT_EQ(r.offsets.front(), 0);
    for (int e = 0; e < experts; ++e) EXPECT_EQ(r.offsets[e + 1] - r.offsets[e], counts[e]);
    // the rows: a permutation of the pairs, each in its expert's range, ascending within it,
    // and row_of_pair its inverse
    std::vector<int> seen(tokens * topk, 0);
    for (int e = 0; e < experts; ++e) {
      for (int64_t i = r.offsets[e]; i < r.offsets[e + 1]; ++i) {
        const int64_t p = r.pair_of_row[i];
        ASSERT_GE(p, 0);
        ASSERT_LT(p, tokens * topk);
        EXPECT_EQ(ids[p], e) << "row " << i;
        if (i > r.offsets[e]) {
          EXPECT_LT(r.pair_of_row[i - 1], p) << "row " << i;
        }
        EXPECT_EQ(r.row_of_pair[p], i);
        EXPECT_EQ(r.token_of_row(i), p / topk);
        ++seen[p];
      }
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    // the offsets are a dynamic partition's table
    const DynamicRowPartition part{experts, r.offsets.data()};
    EXPECT_EQ(part.total(), tokens * topk);
    for (int64_t i = 0; i < r.rows(); ++i) EXPECT_EQ(ids[r.pair_of_row[i]], part.owner_of_row(i));
  }
}

TEST(MoeRouting, ImbalancedRoutings) {
  TL_SEEDED_RNG(rng);
  const int64_t tokens = 64;
  {  // one expert takes every token
    const MoeRouting r = moe_route(std::vector<int32_t>(tokens, 3), tokens, 1, 8);
    EXPECT_EQ(r.counts[3], tokens);
    for (int e = 0; e < 8; ++e)
      if (e != 3) {
        EXPECT_EQ(r.counts[e], 0);
      }
    for (int64_t i = 0; i < tokens; ++i) EXPECT_EQ(r.pair_of_row[i], i);
  }
  {  // empty experts, top-8 of 256
    const std::vector<int32_t> ids = draw_ids(rng, tokens, 8, 256, Routing::kEmptyExperts);
    const MoeRouting r = moe_route(ids, tokens, 8, 256);
    EXPECT_EQ(std::count(r.counts.begin(), r.counts.end(), 0) >= 128, true);
    EXPECT_EQ(r.offsets.back(), tokens * 8);
  }
  {  // no tokens
    const MoeRouting r = moe_route({}, 0, 2, 8);
    EXPECT_EQ(r.offsets.back(), 0);
  }
}

TEST(MoeRouting, RefusesBadIds) {
  std::vector<int32_t> ids{0, 1, 2, 7};  // token 1, slot 1 names expert 7 of 4
  test::expect_refused([&] { moe_route(ids, 2, 2, 4); }, "token 1, slot 1 names expert 7");
  ids[3] = -1;
  test::expect_refused([&] { moe_route(ids, 2, 2, 4); }, "names expert -1");
  test::expect_refused([&] { moe_route(ids, 3, 2, 4); }, "topk_ids holds 4 ids");
  test::expect_refused([&] { moe_route(ids, 2, 5, 4); }, "top-k must be in [1, experts = 4]");
  test::expect_refused([&] { moe_route(ids, 2, 2, 0); }, "experts must be at least 1");
  // the device form reports by its result
  std::vector<int64_t> counts(4), offsets(5), rows(4), pairs(4);
  EXPECT_FALSE(moe_route(ids.data(), 2, 2, 4, counts.data(), offsets.data(), rows.data(), pairs.data()));
}

// The routing's first-tile table in tile rows of tile_rows rows (first[e]: the tile rows before e).
std::vector<int> first_tile_rows(const MoeRouting& r, int tile_rows) {
  std::vector<int> first(r.experts + 1, 0);
  for (int e = 0; e < r.experts; ++e)
    first[e + 1] = first[e] + static_cast<int>((r.counts[e] + tile_rows - 1) / tile_rows);
  return first;
}

// The arrival order of layer 0's grouped tile rows (ops/moe_routing.hpp): a stable sort by the
// latest owner position among each tile row's tokens, against brute force; the plan's pull order
// agrees with moe_row_arrival.
TEST(MoeRouting, ArrivalOrderSortsTileRowsByTheirLatestToken) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 200; ++trial) {
    const int world = rng.uniform_int(1, 9), experts = rng.uniform_int(1, 40);
    const int topk = rng.uniform_int(1, std::min(experts, 6)), tile_rows = rng.pick(std::vector<int>{1, 4, 16, 128});
    const int64_t tokens = rng.uniform(1, 300);
    const RowPartition part = RowPartition::from_counts(rng.uneven_counts(tokens, world));
    const Routing how = rng.pick(std::vector<Routing>{Routing::kUniform, Routing::kSkewed, Routing::kOneExpert,
                                                      Routing::kEmptyExperts});
    const MoeRouting r = moe_route(draw_ids(rng, tokens, topk, experts, how), tokens, topk, experts);
    const std::vector<int> first = first_tile_rows(r, tile_rows);
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("world " + std::to_string(world) + " rank " + std::to_string(rank) + " experts " +
                   std::to_string(experts) + " top-" + std::to_string(topk) + " tile rows " + std::to_string(tile_rows));
      const std::vector<int> order = moe_arrival_row_order(r.offsets, first, tile_rows, r.pair_of_row, topk, part, rank);
      ASSERT_EQ(static_cast<int>(order.size()), first[experts]);
      // brute force: each tile row's rows, their tokens' owners
      std::vector<int> key(first[experts], 0);
      for (int e = 0; e < experts; ++e)
        for (int64_t i = r.offsets[e]; i < r.offsets[e + 1]; ++i) {
          int owner = 0;
          while (!(r.token_of_row(i) >= part.begin(owner) && r.token_of_row(i) < part.end(owner))) ++owner;
          const int t = first[e] + static_cast<int>((i - r.offsets[e]) / tile_rows);
          key[t] = std::max(key[t], (owner - rank + world) % world);
        }
      std::vector<int> seen(order.size(), 0);
      for (size_t i = 0; i < order.size(); ++i) {
        ++seen.at(order[i]);
        if (i > 0) {
          ASSERT_LE(key[order[i - 1]], key[order[i]]) << "position " << i;
          if (key[order[i - 1]] == key[order[i]]) {
            ASSERT_LT(order[i - 1], order[i]) << "not stable at " << i;
          }
        }
      }
      for (int v : seen) ASSERT_EQ(v, 1);
      // the plan's pull order is the one moe_row_arrival assumes
      const MoeAgGemmPlan plan = MoeAgGemmPlan::make(rank, part, 8, 8, experts, topk, DType::kF32, {});
      for (int64_t i = 0; i < r.rows(); ++i)
        ASSERT_EQ(plan.arrival_of(r.token_of_row(i)), moe_row_arrival(r.pair_of_row.data(), topk, part, rank, i));
    }
  }
}

// The completion order of layer 1's grouped tile rows (ops/moe_routing.hpp): a stable sort by the
// earliest reduce-tile place among each tile row's tokens (scaled to at most kMoeOrderKeys keys),
// against brute force; and the property the reduce relies on: once every tile row of keys <= k is
// done, every reduce tile whose key is k has all its rows.
TEST(MoeRouting, CompletionOrderSortsTileRowsByTheirEarliestReduceTile) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 200; ++trial) {
    const int experts = rng.uniform_int(1, 40);
    const int topk = rng.uniform_int(1, std::min(experts, 6)), tile_rows = rng.pick(std::vector<int>{1, 4, 16, 128});
    const int64_t tokens = rng.uniform(1, 3000);
    const int reduce_rows = rng.pick(std::vector<int>{1, 7, 64, 128});
    const Routing how = rng.pick(std::vector<Routing>{Routing::kUniform, Routing::kSkewed, Routing::kOneExpert,
                                                      Routing::kEmptyExperts});
    const MoeRouting r = moe_route(draw_ids(rng, tokens, topk, experts, how), tokens, topk, experts);
    const std::vector<int> first = first_tile_rows(r, tile_rows);
    const int64_t tiles = (tokens + reduce_rows - 1) / reduce_rows;
    const int first_tile = static_cast<int>(rng.uniform(0, tiles - 1));
    const MoeCompletion c = MoeCompletion::make(tokens, reduce_rows, first_tile);
    SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " experts " << experts << " top-" << topk
                                      << " tile rows " << tile_rows << " reduce rows " << reduce_rows << " first "
                                      << first_tile);
    ASSERT_EQ(c.keys, std::min<int64_t>(tiles, kMoeOrderKeys));
    const std::vector<int> order = moe_completion_row_order(r.offsets, first, tile_rows, r.pair_of_row, topk, c);
    ASSERT_EQ(static_cast<int>(order.size()), first[experts]);
    // brute force: a token's reduce tile's place in the walk from first_tile, scaled to the keys
    auto key_of_token = [&](int64_t t) {
      const int64_t place = (t / reduce_rows - first_tile + tiles) % tiles;
      return static_cast<int>(place * c.keys / tiles);
    };
    std::vector<int> key(first[experts], c.keys);
    for (int e = 0; e < experts; ++e)
      for (int64_t i = r.offsets[e]; i < r.offsets[e + 1]; ++i) {
        const int t = first[e] + static_cast<int>((i - r.offsets[e]) / tile_rows);
        key[t] = std::min(key[t], key_of_token(r.token_of_row(i)));
      }
    std::vector<int> seen(order.size(), 0);
    for (size_t i = 0; i < order.size(); ++i) {
      ++seen.at(order[i]);
      ASSERT_LT(key[order[i]], c.keys);
      if (i > 0) {
        ASSERT_LE(key[order[i - 1]], key[order[i]]) << "position " << i;
        if (key[order[i - 1]] == key[order[i]]) {
          ASSERT_LT(order[i - 1], order[i]) << "not stable at " << i;
        }
      }
    }
    for (int v : seen) ASSERT_EQ(v, 1);
    // every row of a token of key k lies in a tile row of key <= k
    for (int e = 0; e < experts; ++e)
      for (int64_t i = r.offsets[e]; i < r.offsets[e + 1]; ++i) {
        const int t = first[e] + static_cast<int>((i - r.offsets[e]) / tile_rows);
        ASSERT_LE(key[t], key_of_token(r.token_of_row(i)));
      }
  }
  EXPECT_THROW(moe_completion_row_order(std::vector<int64_t>{0, 1}, std::vector<int>{0, 1}, 1,
                                        std::vector<int64_t>{0}, 1, MoeCompletion::make(1, 1, 1)),
               Error);
}

// Layer 0 (gather X by token, per-expert W1) then the top-k reduce of layer 1's shape, against
// float64, every dtype.
TEST(MoeCompute, GroupedGemmAndTopkReduceMatchFloat64) {
  TL_SEEDED_RNG(rng);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int trial = 0; trial < 12; ++trial) {
      const int experts = rng.uniform_int(1, 16);
      const int topk = rng.uniform_int(1, std::min(4, experts));
      const int64_t tokens = rng.uniform(0, 40), h = 8 * rng.uniform(1, 8), f = 8 * rng.uniform(1, 6);
      const Routing how = static_cast<Routing>(rng.uniform_int(0, 3));
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " trial " << trial << " tokens " << tokens
                                        << " topk " << topk << " experts " << experts << " H " << h
                                        << " F " << f << " " << name(how));
      const std::vector<int32_t> ids = draw_ids(rng, tokens, topk, experts, how);
      const MoeRouting r = moe_route(ids, tokens, topk, experts);
      const auto x = rng.tensor(dtype, tokens * h);
      std::vector<std::vector<std::byte>> w1(experts);
      std::vector<ExpertWeight> w1s(experts);
      for (int e = 0; e < experts; ++e) w1[e] = rng.tensor(dtype, f * h), w1s[e] = {w1[e].data(), 0};
      std::vector<int64_t> a_rows(r.rows());
      for (int64_t i = 0; i < r.rows(); ++i) a_rows[i] = r.token_of_row(i);
      std::vector<std::byte> h1(r.rows() * f * dtype_size(dtype));
      test::poison(h1);
      moe_grouped_gemm_cpu(x.data(), h, a_rows, r.offsets, w1s, h1.data(), f, f, h, dtype);
      const std::vector<double> ref = moe_grouped_gemm_f64(x.data(), h, a_rows, r.offsets, w1s, f, h, dtype);
      const double tol = dtype == DType::kF32 ? 1e-5 : 1e-2;
      if (r.rows() > 0) {
        EXPECT_LT(relative_error(h1.data(), dtype, ref), tol);
      }
      // each row is its token's X times its expert's W1 (the brute force of the gather)
      for (int64_t p = 0; p < r.rows(); ++p) {
        const int64_t i = r.row_of_pair[p], t = p / topk;
        const int e = ids[p];
        double acc = 0;
        for (int64_t q = 0; q < h; ++q)
          acc += double(load_as_float(x.data(), dtype, t * h + q)) * load_as_float(w1[e].data(), dtype, q);
        EXPECT_NEAR(ref[i * f], acc, 1e-9 * (1 + std::abs(acc))) << "pair " << p;
      }
      // the top-k reduce over h1 as layer 1's output [rows, f]
      std::vector<float> weights(r.rows());
      for (float& v : weights) v = rng.uniform_float(0.f, 1.f);
      std::vector<std::byte> y(tokens * f * dtype_size(dtype));
      test::poison(y);
      moe_topk_reduce_cpu(h1.data(), f, r, weights, y.data(), f, f, dtype);
      std::vector<double> h1d(r.rows() * f);
      for (int64_t i = 0; i < r.rows() * f; ++i) h1d[i] = load_as_float(h1.data(), dtype, i);
      const std::vector<double> yref = moe_topk_reduce_f64(h1d, r, weights, f);
      if (tokens > 0) {
        EXPECT_LT(relative_error(y.data(), dtype, yref), tol);
      }
    }
  }
}

TEST(MoeCompute, RefusesBadTables) {
  const std::vector<std::byte> a(64), out(64);
  std::vector<ExpertWeight> w(2, ExpertWeight{a.data(), 0});
  const std::vector<int64_t> offsets{0, 2, 1};
  test::expect_refused(
      [&] { moe_grouped_gemm_cpu(a.data(), 8, {}, offsets, w, (void*)out.data(), 8, 8, 8, DType::kF32); },
      "offsets decrease at expert 1");
  const std::vector<int64_t> short_offsets{0, 1};
  test::expect_refused(
      [&] { moe_grouped_gemm_cpu(a.data(), 8, {}, short_offsets, w, (void*)out.data(), 8, 8, 8, DType::kF32); },
      "2 offsets for 2 experts");
  const MoeRouting r = moe_route(std::vector<int32_t>{0, 1}, 2, 1, 2);
  test::expect_refused(
      [&] { moe_topk_reduce_cpu(a.data(), 8, r, std::vector<float>(3), (void*)out.data(), 8, 8, DType::kF32); },
      "3 weights for 2 tokens");
}

// Layer 0 on CPU worlds of 1-8 ranks: ragged tokens (empty segments), ragged F_r, every routing
// pattern, pull and push, random tiles and workers; every call against float64 and bit for bit
// against the unfused baseline, outputs poisoned first; two calls a world with fresh routing (the
// tables are dynamic), the grouped layout checked against the routing of every rank's ids.
TEST(MoeAgGemm, MatchesFloat64AndUnfusedOnAnyWorld) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 24; ++trial) {
    const Layer l = Layer::draw(rng, 40, 8, 0, 48, 6, 4, {DType::kF32, DType::kBF16, DType::kF16});
    const int W = l.world, experts = l.experts, topk = l.topk;
    const int64_t tokens = l.tokens, h = l.hidden;
    const DType dtype = l.dtype;
    const RowPartition& part = l.part;
    const std::vector<int64_t>& f = l.ffn;
    MoeAgGemmConfig cfg;
    cfg.mode = rng.coin() ? CommMode::kPull : CommMode::kPush;
    cfg.comm_tile_rows = rng.uniform_int(1, 16);
    cfg.tile_m = rng.uniform_int(1, 32);
    cfg.tile_n = rng.uniform_int(1, 40);
    cfg.comm_workers = rng.uniform_int(1, 3);
    cfg.compute_workers = rng.uniform_int(1, 3);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << l
                                      << (cfg.mode == CommMode::kPull ? " pull" : " push") << " comm tile "
                                      << cfg.comm_tile_rows << " tile " << cfg.tile_m << "x" << cfg.tile_n);
    cpu::World world(W);
    cpu::MoeAgGemm op(world, part, h, f, experts, topk, dtype, cfg);
    const auto x = rng.tensor(dtype, tokens * h);
    std::vector<std::vector<std::byte>> w1(W);
    for (int r = 0; r < W; ++r) w1[r] = rng.tensor(dtype, experts * f[r] * h);
    const int64_t eb = dtype_size(dtype);
    for (int call = 0; call < 2; ++call) {
      SCOPED_TRACE(::testing::Message() << "call " << call);
      const Routing how = static_cast<Routing>(rng.uniform_int(0, 3));
      const std::vector<int32_t> ids = draw_ids(rng, tokens, topk, experts, how);
      const MoeRouting want = moe_route(ids, tokens, topk, experts);
      std::vector<std::vector<std::byte>> fused(W), unfused(W);
      for (int r = 0; r < W; ++r) {
        fused[r].resize(tokens * topk * f[r] * eb);
        unfused[r].resize(fused[r].size());
        test::poison(fused[r]);
        test::poison(unfused[r]);
      }
      std::vector<float> weights(tokens * topk);
      for (float& v : weights) v = rng.uniform_float(0.f, 1.f);
      auto x_of = [&](int r) { return x.data() + part.begin(r) * h * eb; };
      auto ids_of = [&](int r) { return ids.data() + part.begin(r) * topk; };
      auto weights_of = [&](int r) { return weights.data() + part.begin(r) * topk; };
      world.run([&](cpu::RankContext& ctx) {
        const int r = ctx.rank;
        op.run(ctx, x_of(r), ids_of(r), weights_of(r), w1[r].data(), fused[r].data());
      });
      for (int r = 0; r < W; ++r) {
        ASSERT_EQ(op.routing(r).pair_of_row, want.pair_of_row) << "rank " << r;
        ASSERT_EQ(op.routing(r).offsets, want.offsets) << "rank " << r;
        EXPECT_TRUE(std::equal(ids.begin(), ids.end(), op.gathered_ids(r))) << "rank " << r;
        EXPECT_TRUE(std::equal(weights.begin(), weights.end(), op.gathered_weights(r))) << "rank " << r;
      }
      world.run([&](cpu::RankContext& ctx) {
        const int r = ctx.rank;
        op.run_unfused(ctx, x_of(r), ids_of(r), weights_of(r), w1[r].data(), unfused[r].data());
      });
      for (int r = 0; r < W; ++r) {
        SCOPED_TRACE(::testing::Message() << "rank " << r);
        EXPECT_EQ(fused[r], unfused[r]) << "fused and unfused differ";
        if (want.rows() == 0) continue;
        const std::vector<double> ref = moe_layer0_f64(x.data(), want, w1[r].data(), h, f[r], dtype);
        EXPECT_LT(relative_error(fused[r].data(), dtype, ref), dtype == DType::kF32 ? 1e-5 : 1e-2);
      }
    }
  }
}

// An id out of range on one rank is refused on every rank (each sees it after the AllGather), with
// the token and slot named; the world runs again after it.
TEST(MoeAgGemm, RefusesABadIdOnEveryRank) {
  const int W = 3, experts = 4, topk = 2;
  const int64_t tokens = 6, h = 8;
  const RowPartition part = RowPartition::even(tokens, W);
  cpu::World world(W);
  cpu::MoeAgGemm op(world, part, h, {8, 8, 8}, experts, topk, DType::kF32, {});
  std::vector<float> x(tokens * h, 1.0f), w1(experts * 8 * h, 1.0f), weights(tokens * topk, 0.5f);
  std::vector<int32_t> ids{0, 1, 2, 3, 0, 9, 1, 2, 3, 0, 1, 2};  // token 2 (rank 1's first), slot 1
  std::vector<std::vector<float>> out(W, std::vector<float>(tokens * topk * 8));
  for (bool fused : {true, false}) {
    test::expect_refused(
        [&] {
          world.run([&](cpu::RankContext& ctx) {
            const int r = ctx.rank;
            const float* wr = weights.data() + part.begin(r) * topk;
            if (fused) op.run(ctx, x.data() + part.begin(r) * h, ids.data() + part.begin(r) * topk, wr, w1.data(), out[r].data());
            else op.run_unfused(ctx, x.data() + part.begin(r) * h, ids.data() + part.begin(r) * topk, wr, w1.data(), out[r].data());
          });
        },
        "token 2, slot 1 names expert 9");
  }
  test::expect_refused([&] { cpu::MoeAgGemm bad(world, part, h, {8, 8}, experts, topk, DType::kF32, {}); },
                       "2 F_r values for a world of 3");
  test::expect_refused([&] { cpu::MoeAgGemm bad(world, part, h, {8, 8, 8}, experts, 5, DType::kF32, {}); },
                       "top-k must be in [1, experts = 4]");
}

// Layer 1 on CPU worlds of 1-8 ranks, as layer 0's test: against float64 (every rank's grouped
// products, reduced by token in slot order and summed over the ranks) and bit for bit against the
// unfused baseline, two calls a world with fresh routing.
TEST(MoeGemmRs, MatchesFloat64AndUnfusedOnAnyWorld) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 24; ++trial) {
    const Layer l = Layer::draw(rng, 40, 8, 0, 48, 6, 4, {DType::kF32, DType::kBF16, DType::kF16});
    const int W = l.world, experts = l.experts, topk = l.topk;
    const int64_t tokens = l.tokens, h = l.hidden;
    const DType dtype = l.dtype;
    const RowPartition& part = l.part;
    const std::vector<int64_t>& f = l.ffn;
    MoeGemmRsConfig cfg;
    cfg.mode = rng.coin() ? CommMode::kPull : CommMode::kPush;
    cfg.tile_m = rng.uniform_int(1, 32);
    cfg.tile_n = rng.uniform_int(1, 40);
    cfg.reduce_tile_m = rng.uniform_int(1, 16);
    cfg.reduce_tile_n = rng.uniform_int(1, 40);
    cfg.band_rows = rng.uniform_int(1, 16);
    cfg.band_cols = rng.uniform_int(1, 40);
    cfg.comm_workers = rng.uniform_int(1, 3);
    cfg.compute_workers = rng.uniform_int(1, 3);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << l
                                      << (cfg.mode == CommMode::kPull ? " pull" : " push") << " tile " << cfg.tile_m
                                      << "x" << cfg.tile_n << " reduce tile " << cfg.reduce_tile_m << "x"
                                      << cfg.reduce_tile_n);
    cpu::World world(W);
    cpu::MoeGemmRs op(world, part, h, f, experts, topk, dtype, cfg);
    const int64_t eb = dtype_size(dtype), rows = tokens * topk;
    std::vector<std::vector<std::byte>> h1(W), w2(W);
    for (int r = 0; r < W; ++r) h1[r] = rng.tensor(dtype, rows * f[r]), w2[r] = rng.tensor(dtype, experts * h * f[r]);
    for (int call = 0; call < 2; ++call) {
      SCOPED_TRACE(::testing::Message() << "call " << call);
      const std::vector<int32_t> ids = draw_ids(rng, tokens, topk, experts, static_cast<Routing>(rng.uniform_int(0, 3)));
      std::vector<float> weights(rows);
      for (float& v : weights) v = rng.uniform_float(0.f, 1.f);
      const MoeRouting rt = moe_route(ids, tokens, topk, experts);
      std::vector<std::vector<std::byte>> fused(W), unfused(W);
      for (int r = 0; r < W; ++r) {
        fused[r].resize(part.size(r) * h * eb);
        unfused[r].resize(fused[r].size());
        test::poison(fused[r]);
        test::poison(unfused[r]);
      }
      world.run([&](cpu::RankContext& ctx) {
        const int r = ctx.rank;
        op.run(ctx, h1[r].data(), ids.data(), weights.data(), w2[r].data(), fused[r].data());
      });
      world.run([&](cpu::RankContext& ctx) {
        const int r = ctx.rank;
        op.run_unfused(ctx, h1[r].data(), ids.data(), weights.data(), w2[r].data(), unfused[r].data());
      });
      // float64: Σ over ranks of the top-k reduce of each rank's grouped products
      std::vector<double> want(tokens * h, 0.0);
      for (int r = 0; r < W; ++r) {
        const std::vector<double> pr = moe_layer1_partial_f64(h1[r].data(), rt, w2[r].data(), weights, h, f[r], dtype);
        for (int64_t i = 0; i < tokens * h; ++i) want[i] += pr[i];
      }
      for (int r = 0; r < W; ++r) {
        SCOPED_TRACE(::testing::Message() << "rank " << r);
        EXPECT_EQ(fused[r], unfused[r]) << "fused and unfused differ";
        if (part.size(r) == 0) continue;
        const std::vector<double> mine(want.begin() + part.begin(r) * h, want.begin() + part.end(r) * h);
        EXPECT_LT(relative_error(fused[r].data(), dtype, mine), dtype == DType::kF32 ? 1e-5 : 2e-2);
      }
    }
  }
}

TEST(MoeGemmRs, RefusesBadInput) {
  const int W = 2, experts = 4, topk = 2;
  const int64_t tokens = 4, h = 8;
  const RowPartition part = RowPartition::even(tokens, W);
  cpu::World world(W);
  cpu::MoeGemmRs op(world, part, h, {8, 8}, experts, topk, DType::kF32, {});
  std::vector<float> h1(tokens * topk * 8, 1.0f), w2(experts * h * 8, 1.0f), weights(tokens * topk, 0.5f);
  const std::vector<int32_t> ids{0, 1, 2, 3, 0, 4, 1, 2};  // token 2, slot 1: expert 4 of 4
  std::vector<std::vector<float>> c(W, std::vector<float>(2 * h));
  for (bool fused : {true, false}) {
    test::expect_refused(
        [&] {
          world.run([&](cpu::RankContext& ctx) {
            const int r = ctx.rank;
            if (fused) op.run(ctx, h1.data(), ids.data(), weights.data(), w2.data(), c[r].data());
            else op.run_unfused(ctx, h1.data(), ids.data(), weights.data(), w2.data(), c[r].data());
          });
        },
        "token 2, slot 1 names expert 4");
  }
  test::expect_refused([&] { cpu::MoeGemmRs bad(world, part, h, {8}, experts, topk, DType::kF32, {}); },
                       "1 F_r values for a world of 2");
  MoeGemmRsConfig zero;
  zero.reduce_tile_m = 0;
  test::expect_refused([&] { cpu::MoeGemmRs bad(world, part, h, {8, 8}, experts, topk, DType::kF32, zero); },
                       "tile and band sizes must be >= 1");
}

// The whole layer (layer 0, SiLU(gate) · up, layer 1) on CPU worlds of 1-8 ranks, against a float64
// chain of the same steps and bit for bit against both layers' unfused baselines.
TEST(MoeMlp, MatchesFloat64AndUnfusedOnAnyWorld) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 16; ++trial) {
    const Layer l = Layer::draw(rng, 16, 4, 0, 40, 4, 3, {DType::kF32, DType::kBF16});
    const int W = l.world, experts = l.experts, topk = l.topk;
    const int64_t tokens = l.tokens, h = l.hidden;
    const DType dtype = l.dtype;
    const RowPartition& part = l.part;
    const std::vector<int64_t>& f = l.ffn;
    MoeAgGemmConfig c0;
    c0.mode = rng.coin() ? CommMode::kPull : CommMode::kPush;
    c0.comm_tile_rows = rng.uniform_int(1, 8), c0.tile_m = rng.uniform_int(1, 16), c0.tile_n = rng.uniform_int(1, 24);
    MoeGemmRsConfig c1;
    c1.mode = rng.coin() ? CommMode::kPull : CommMode::kPush;
    c1.tile_m = rng.uniform_int(1, 16), c1.tile_n = rng.uniform_int(1, 24);
    c1.reduce_tile_m = rng.uniform_int(1, 8), c1.reduce_tile_n = rng.uniform_int(1, 24);
    c0.compute_workers = c1.compute_workers = rng.uniform_int(1, 2);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << l);
    cpu::World world(W);
    cpu::MoeMlp op(world, part, h, f, experts, topk, dtype, c0, c1);
    const int64_t eb = dtype_size(dtype), rows = tokens * topk;
    const auto x = rng.tensor(dtype, tokens * h);
    std::vector<std::vector<std::byte>> w1(W), w2(W);
    for (int r = 0; r < W; ++r) w1[r] = rng.tensor(dtype, experts * 2 * f[r] * h), w2[r] = rng.tensor(dtype, experts * h * f[r]);
    const std::vector<int32_t> ids = draw_ids(rng, tokens, topk, experts, static_cast<Routing>(rng.uniform_int(0, 3)));
    std::vector<float> weights(rows);
    for (float& v : weights) v = rng.uniform_float(0.f, 1.f);
    std::vector<std::vector<std::byte>> fused(W), unfused(W);
    for (int r = 0; r < W; ++r) {
      fused[r].resize(part.size(r) * h * eb), unfused[r].resize(part.size(r) * h * eb);
      test::poison(fused[r]), test::poison(unfused[r]);
    }
    auto at = [&](int r) { return part.begin(r); };
    world.run([&](cpu::RankContext& ctx) {
      const int r = ctx.rank;
      op.run(ctx, x.data() + at(r) * h * eb, ids.data() + at(r) * topk, weights.data() + at(r) * topk, w1[r].data(),
             w2[r].data(), fused[r].data());
    });
    world.run([&](cpu::RankContext& ctx) {
      const int r = ctx.rank;
      op.run_unfused(ctx, x.data() + at(r) * h * eb, ids.data() + at(r) * topk, weights.data() + at(r) * topk,
                     w1[r].data(), w2[r].data(), unfused[r].data());
    });
    // float64: per rank, gate and up rows, SiLU(gate) · up, times W2, the top-k reduce; summed
    const MoeRouting rt = moe_route(ids, tokens, topk, experts);
    std::vector<double> want(tokens * h, 0.0);
    for (int r = 0; r < W; ++r) {
      const std::vector<double> pr = moe_mlp_partial_f64(x.data(), rt, w1[r].data(), w2[r].data(), weights, h, f[r], dtype);
      for (int64_t i = 0; i < tokens * h; ++i) want[i] += pr[i];
    }
    for (int r = 0; r < W; ++r) {
      SCOPED_TRACE(::testing::Message() << "rank " << r);
      EXPECT_EQ(fused[r], unfused[r]) << "fused and unfused differ";
      if (part.size(r) == 0) continue;
      const std::vector<double> mine(want.begin() + at(r) * h, want.begin() + part.end(r) * h);
      EXPECT_LT(relative_error(fused[r].data(), dtype, mine), dtype == DType::kF32 ? 1e-4 : 3e-2);
    }
  }
}

// A batch of no tokens on every rank: both layers and the whole layer run (nothing to compute, every
// output empty) and the world runs again after.
TEST(MoeMlp, ABatchOfNoTokens) {
  const int W = 3, experts = 4, topk = 2;
  const int64_t h = 8;
  cpu::World world(W);
  cpu::MoeMlp op(world, RowPartition::even(0, W), h, {8, 8, 8}, experts, topk, DType::kF32);
  std::vector<float> w1(experts * 16 * h, 1.0f), w2(experts * h * 8, 1.0f);
  for (int call = 0; call < 2; ++call) {
    world.run([&](cpu::RankContext& ctx) {
      op.run(ctx, nullptr, nullptr, nullptr, w1.data(), w2.data(), nullptr);
      op.run_unfused(ctx, nullptr, nullptr, nullptr, w1.data(), w2.data(), nullptr);
    });
  }
  EXPECT_EQ(op.layer0().routing(0).rows(), 0);
}

}  // namespace
}  // namespace tilelink
