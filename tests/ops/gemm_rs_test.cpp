// GEMM+RS on the CPU backend: fused output bit-identical to the unfused baseline and to the
// rank-ordered fp32 sum of the rounded partials, both near the float64 reference; across world
// sizes 1..8 and ragged shapes (uneven segments with empties, K_r ragged per rank).
#include <gtest/gtest.h>

#include <sstream>

#include "op_harness.hpp"
#include "../support/refused.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink {
namespace {

using test::Bytes;

struct RsCase {
  int world;
  int64_t m;
  bool uneven;
  CommMode mode;
  DType dtype;
  int reduce_rows, reduce_cols, tile_m, tile_n, group_m;
  int comm_workers, compute_workers;
};

std::string case_name(const ::testing::TestParamInfo<RsCase>& info) {
  const RsCase& c = info.param;
  std::ostringstream os;
  os << "w" << c.world << "_m" << c.m << (c.uneven ? "_uneven" : "_even")
     << (c.mode == CommMode::kPull ? "_pull_" : "_push_") << dtype_name(c.dtype) << "_r"
     << c.reduce_rows << "x" << c.reduce_cols << "_t" << c.tile_m << "x" << c.tile_n << "_g"
     << c.group_m << "_wk" << c.comm_workers << c.compute_workers;
  return os.str();
}

std::vector<RsCase> cases() {
  std::vector<RsCase> out;
  const int64_t ms[] = {1, 17, 100, 257};
  const DType dtypes[] = {DType::kBF16, DType::kF32, DType::kF32, DType::kBF16};
  // (reduce rows, reduce cols, gemm tile m, gemm tile n)
  const int tiles[][4] = {{8, 16, 32, 16},      {64, 512, 16, 32}, {5, 7, 7, 9},
                          {128, 512, 128, 128}, {1, 96, 3, 96},    {33, 20, 64, 20}};
  int i = 0;
  for (int w = 1; w <= 8; ++w)
    for (int64_t m : ms) {
      const int* t = tiles[(i + 1) % 6];
      out.push_back(RsCase{w, m, (i % 3) != 1, (i % 2) ? CommMode::kPull : CommMode::kPush,
                           dtypes[i % 4], t[0], t[1], t[2], t[3], 1 + (i % 4 == 3), 1 + (i / 2) % 3,
                           1 + i % 3});
      ++i;
    }
  out.push_back(RsCase{3, 100, true, CommMode::kPush, DType::kF16, 16, 24, 32, 16, 2, 2, 2});
  out.push_back(RsCase{5, 61, true, CommMode::kPull, DType::kF16, 7, 11, 8, 24, 1, 3, 1});
  return out;
}

class GemmRsFused : public ::testing::TestWithParam<RsCase> {};

TEST_P(GemmRsFused, BitIdenticalToUnfusedAndNearReference) {
  const RsCase& c = GetParam();
  TL_SEEDED_RNG(rng);
  std::vector<int64_t> counts = c.uneven ? rng.uneven_counts(c.m, c.world) : std::vector<int64_t>{};
  RowPartition rows =
      c.uneven ? RowPartition::from_counts(counts) : RowPartition::even(c.m, c.world);
  const int64_t n = rng.uniform(1, 96);
  std::vector<int64_t> k;
  for (int r = 0; r < c.world; ++r) k.push_back(rng.uniform(1, 96));  // K_r ragged per rank
  std::ostringstream shape;
  shape << "N " << n << " (rows:K_r) [";
  for (int r = 0; r < c.world; ++r) shape << (r ? " " : "") << rows.size(r) << ":" << k[r];
  shape << "]";
  SCOPED_TRACE(shape.str());

  GemmRsConfig cfg;
  cfg.mode = c.mode;
  cfg.comm_tile_rows = c.reduce_rows;
  cfg.comm_tile_cols = c.reduce_cols;
  cfg.gemm_tile_m = c.tile_m;
  cfg.gemm_tile_n = c.tile_n;
  cfg.group_m = c.group_m;
  cfg.comm_workers = c.comm_workers;
  cfg.compute_workers = c.compute_workers;
  cpu::World world(c.world);
  cpu::GemmRs op(world, rows, n, k, c.dtype, cfg);

  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call);
    test::RsInputs in = test::rs_inputs(rng, rows, n, k, c.dtype);
    std::vector<Bytes> fused = test::rs_outputs(rows, n, c.dtype), unfused = fused;
    world.run([&](cpu::RankContext& ctx) {
      op.run(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(),
             test::data_or_null(fused[ctx.rank]));
    });
    world.run([&](cpu::RankContext& ctx) {
      op.run_unfused(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(),
                     test::data_or_null(unfused[ctx.rank]));
    });
    std::vector<Bytes> want = test::rs_expected_bits(in, rows, n, k, c.dtype);
    for (int r = 0; r < c.world; ++r) {
      int64_t d = test::first_difference(fused[r], unfused[r], c.dtype);
      ASSERT_EQ(d, -1) << "rank " << r << ": fused and unfused differ at element " << d << " (row "
                       << rows.begin(r) + d / n << ", col " << d % n << ")";
      ASSERT_EQ(test::first_difference(unfused[r], want[r], c.dtype), -1)
          << "rank " << r << ": not the rank-ordered sum of the rounded partials";
    }
    test::expect_rs_near_reference(in, fused, rows, n, k, c.dtype, "fused");
    test::expect_rs_near_reference(in, unfused, rows, n, k, c.dtype, "unfused");
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmRsFused, ::testing::ValuesIn(cases()), case_name);

TEST(GemmRs, FiftyCallsAlternatingFusedAndUnfusedStayExact) {
  TL_SEEDED_RNG(rng);
  std::vector<int64_t> counts = {0, 45, 30, 26};
  RowPartition rows = RowPartition::from_counts(counts);
  const int64_t n = 36;
  std::vector<int64_t> k = {16, 40, 3, 25};
  GemmRsConfig cfg;
  cfg.comm_tile_rows = 16;
  cfg.comm_tile_cols = 12;
  cfg.gemm_tile_m = 24;
  cfg.gemm_tile_n = 16;
  cfg.comm_workers = 2;
  cfg.compute_workers = 2;
  for (CommMode mode : {CommMode::kPull, CommMode::kPush}) {
    cfg.mode = mode;
    cpu::World world(4);
    cpu::GemmRs op(world, rows, n, k, DType::kBF16, cfg);
    for (int call = 0; call < 50; ++call) {
      SCOPED_TRACE(::testing::Message()
                   << (mode == CommMode::kPull ? "pull" : "push") << " call " << call);
      test::RsInputs in = test::rs_inputs(rng, rows, n, k, DType::kBF16);
      std::vector<Bytes> c = test::rs_outputs(rows, n, DType::kBF16);
      world.run([&](cpu::RankContext& ctx) {
        if (call % 2 == 0)
          op.run(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(),
                 test::data_or_null(c[ctx.rank]));
        else
          op.run_unfused(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(),
                         test::data_or_null(c[ctx.rank]));
      });
      std::vector<Bytes> want = test::rs_expected_bits(in, rows, n, k, DType::kBF16);
      for (int r = 0; r < 4; ++r)
        ASSERT_EQ(test::first_difference(c[r], want[r], DType::kBF16), -1) << "rank " << r;
    }
  }
}

// Both ops on one world, each called 1000 times: epochs only grow, signals are never reset.
TEST(Ops, AThousandCallsReuseEpochsWithoutReset) {
  TL_SEEDED_RNG(rng);
  std::vector<int64_t> counts = {3, 0, 4};
  RowPartition rows = RowPartition::from_counts(counts);
  cpu::World world(3);
  AgGemmConfig ag_cfg;
  ag_cfg.comm_tile_rows = 2;
  ag_cfg.gemm_tile_m = 3;
  ag_cfg.gemm_tile_n = 2;
  ag_cfg.mode = CommMode::kPull;
  GemmRsConfig rs_cfg;
  rs_cfg.comm_tile_rows = 2;
  rs_cfg.comm_tile_cols = 3;
  rs_cfg.gemm_tile_m = 3;
  rs_cfg.gemm_tile_n = 2;
  rs_cfg.mode = CommMode::kPush;
  std::vector<int64_t> n = {4, 3, 5}, k = {2, 5, 3};
  cpu::AgGemm ag(world, rows, n, 6, DType::kF32, ag_cfg);
  cpu::GemmRs rs(world, rows, 5, k, DType::kF32, rs_cfg);
  for (int call = 0; call < 1000; ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call);
    test::AgInputs ag_in = test::ag_inputs(rng, rows, n, 6, DType::kF32);
    test::RsInputs rs_in = test::rs_inputs(rng, rows, 5, k, DType::kF32);
    std::vector<Bytes> ag_c = test::ag_outputs(rows, n, DType::kF32),
                       rs_c = test::rs_outputs(rows, 5, DType::kF32);
    world.run([&](cpu::RankContext& ctx) {
      int r = ctx.rank;
      ag.run(ctx, test::data_or_null(ag_in.a[r]), ag_in.b[r].data(), ag_c[r].data());
      rs.run(ctx, rs_in.a[r].data(), rs_in.b[r].data(), test::data_or_null(rs_c[r]));
    });
    std::vector<Bytes> want = test::rs_expected_bits(rs_in, rows, 5, k, DType::kF32);
    for (int r = 0; r < 3; ++r) {
      Bytes ag_want(ag_c[r].size());
      gemm_tile_cpu(ag_in.a_full.data(), 6, ag_in.b[r].data(), 6, ag_want.data(), n[r], DType::kF32,
                    rows.total(), n[r], 6);
      ASSERT_EQ(test::first_difference(ag_c[r], ag_want, DType::kF32), -1) << "ag_gemm rank " << r;
      ASSERT_EQ(test::first_difference(rs_c[r], want[r], DType::kF32), -1) << "gemm_rs rank " << r;
    }
  }
}

TEST(GemmRs, RefusesBadInput) {
  cpu::World world(2);
  RowPartition rows = RowPartition::even(10, 2);
  GemmRsConfig cfg;
  test::expect_refused([&] { cpu::GemmRs(world, RowPartition::even(10, 1), 8, {8}, DType::kBF16, cfg); },
               "the row partition has 1 ranks, the world 2");
  test::expect_refused([&] { cpu::GemmRs(world, rows, 8, {8}, DType::kBF16, cfg); },
               "1 K_r values for a world of 2");
  test::expect_refused([&] { cpu::GemmRs(world, rows, 8, {8, 0}, DType::kBF16, cfg); }, "K must be >= 1");
  test::expect_refused([&] { cpu::GemmRs(world, rows, 0, {8, 8}, DType::kBF16, cfg); }, "N must be >= 1");
  GemmRsConfig zero = cfg;
  zero.comm_workers = 0;
  test::expect_refused(
      [&] {
        cpu::GemmRs(world, rows, 8, {8, 8}, DType::kBF16, zero);
      },
      "at least one comm and one compute worker");
  zero = cfg;
  zero.compute_workers = 0;
  test::expect_refused(
      [&] {
        cpu::GemmRs(world, rows, 8, {8, 8}, DType::kBF16, zero);
      },
      "at least one comm and one compute worker");
  GemmRsConfig bad_tile = cfg;
  bad_tile.comm_tile_cols = 0;
  test::expect_refused(
      [&] {
        cpu::GemmRs(world, rows, 8, {8, 8}, DType::kBF16, bad_tile);
      },
      "comm_tile_cols");
}

TEST(GemmRs, ANullTensorIsRefusedAndTheOpStaysUsable) {
  TL_SEEDED_RNG(rng);
  cpu::World world(3, std::chrono::seconds(5));
  std::vector<int64_t> counts = {5, 7, 4};
  RowPartition rows = RowPartition::from_counts(counts);
  std::vector<int64_t> k = {6, 3, 8};
  GemmRsConfig cfg;
  cfg.comm_tile_rows = 3;
  cfg.comm_tile_cols = 5;
  cfg.gemm_tile_m = 4;
  cfg.gemm_tile_n = 4;
  for (CommMode mode : {CommMode::kPull, CommMode::kPush}) {
    cfg.mode = mode;
    cpu::GemmRs op(world, rows, 9, k, DType::kF32, cfg);
    test::RsInputs in = test::rs_inputs(rng, rows, 9, k, DType::kF32);
    for (bool fused : {true, false}) {
      std::vector<Bytes> c = test::rs_outputs(rows, 9, DType::kF32);
      try {
        world.run([&](cpu::RankContext& ctx) {
          const void* a = ctx.rank == 2 ? nullptr : in.a[ctx.rank].data();
          if (fused)
            op.run(ctx, a, in.b[ctx.rank].data(), c[ctx.rank].data());
          else
            op.run_unfused(ctx, a, in.b[ctx.rank].data(), c[ctx.rank].data());
        });
        ADD_FAILURE() << "a null A was accepted";
      } catch (const TimeoutError& e) {
        ADD_FAILURE() << "waited instead of refusing: " << e.what();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("null tensor on rank 2"), std::string::npos)
            << e.what();
      }
      world.run([&](cpu::RankContext& ctx) {
        if (fused)
          op.run(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(), c[ctx.rank].data());
        else
          op.run_unfused(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(), c[ctx.rank].data());
      });
      test::expect_rs_near_reference(in, c, rows, 9, k, DType::kF32, fused ? "fused" : "unfused");
    }
  }
}

}  // namespace
}  // namespace tilelink
