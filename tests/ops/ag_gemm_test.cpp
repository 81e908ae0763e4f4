// AG+GEMM on the CPU backend: fused output bit-identical to the unfused baseline, both near the
// float64 reference, the gathered A complete on every rank; across world sizes 1..8 and ragged
// shapes.
#include <gtest/gtest.h>

#include <sstream>

#include "op_harness.hpp"
#include "../support/refused.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink {
namespace {

using test::Bytes;

struct AgCase {
  int world;
  int64_t m;
  bool uneven;  // random counts with empty segments likely; otherwise RowPartition::even
  CommMode mode;
  DType dtype;
  int comm_rows, tile_m, tile_n, group_m;
  int comm_workers, compute_workers;
};

std::string case_name(const ::testing::TestParamInfo<AgCase>& info) {
  const AgCase& c = info.param;
  std::ostringstream os;
  os << "w" << c.world << "_m" << c.m << (c.uneven ? "_uneven" : "_even")
     << (c.mode == CommMode::kPull ? "_pull_" : "_push_") << dtype_name(c.dtype) << "_c"
     << c.comm_rows << "_t" << c.tile_m << "x" << c.tile_n << "_g" << c.group_m << "_wk"
     << c.comm_workers << c.compute_workers;
  return os.str();
}

// A sampling of the combinations: every world size with every M, the other axes rotated through.
std::vector<AgCase> cases() {
  std::vector<AgCase> out;
  const int64_t ms[] = {1, 17, 100, 257};
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kBF16, DType::kF32};
  // (comm_rows, tile_m, tile_n): comm tiles smaller, larger, and unrelated to gemm tiles.
  const int tiles[][3] = {{8, 32, 16},     {64, 16, 32}, {5, 7, 9},
                          {128, 128, 128}, {1, 3, 96},   {33, 64, 20}};
  int i = 0;
  for (int w = 1; w <= 8; ++w)
    for (int64_t m : ms) {
      const int* t = tiles[i % 6];
      out.push_back(AgCase{w, m, (i % 3) != 0, (i % 2) ? CommMode::kPush : CommMode::kPull,
                           dtypes[i % 4], t[0], t[1], t[2], 1 + (i % 3 == 2), 1 + i % 3,
                           1 + (i / 3) % 3});
      ++i;
    }
  out.push_back(AgCase{3, 100, true, CommMode::kPull, DType::kF16, 16, 32, 32, 2, 2, 2});
  out.push_back(AgCase{4, 57, true, CommMode::kPush, DType::kF16, 7, 8, 24, 1, 3, 1});
  return out;
}

class AgGemmFused : public ::testing::TestWithParam<AgCase> {};

TEST_P(AgGemmFused, BitIdenticalToUnfusedAndNearReference) {
  const AgCase& c = GetParam();
  TL_SEEDED_RNG(rng);
  std::vector<int64_t> counts = c.uneven ? rng.uneven_counts(c.m, c.world) : std::vector<int64_t>{};
  RowPartition rows =
      c.uneven ? RowPartition::from_counts(counts) : RowPartition::even(c.m, c.world);
  std::vector<int64_t> n;
  for (int r = 0; r < c.world; ++r) n.push_back(rng.uniform(1, 96));  // N_r ragged per rank
  const int64_t k = rng.uniform(1, 96);
  std::ostringstream shape;
  shape << "counts [";
  for (int r = 0; r < c.world; ++r) shape << (r ? " " : "") << rows.size(r) << ":" << n[r];
  shape << "] (rows:N_r) K " << k;
  SCOPED_TRACE(shape.str());

  AgGemmConfig cfg;
  cfg.mode = c.mode;
  cfg.comm_tile_rows = c.comm_rows;
  cfg.gemm_tile_m = c.tile_m;
  cfg.gemm_tile_n = c.tile_n;
  cfg.group_m = c.group_m;
  cfg.comm_workers = c.comm_workers;
  cfg.compute_workers = c.compute_workers;
  cpu::World world(c.world);
  cpu::AgGemm op(world, rows, n, k, c.dtype, cfg);

  for (int call = 0; call < 2; ++call) {  // the second call runs on reused signals (epoch 2, 3)
    SCOPED_TRACE(::testing::Message() << "call " << call);
    test::AgInputs in = test::ag_inputs(rng, rows, n, k, c.dtype);
    std::vector<Bytes> fused = test::ag_outputs(rows, n, c.dtype), unfused = fused;
    // NOTE: the gathered buffers are the op's workspace; poisoned so that a stale copy cannot pass.
    for (int r = 0; r < c.world; ++r)
      test::poison(const_cast<void*>(op.gathered(r)), in.a_full.size());
    world.run([&](cpu::RankContext& ctx) {
      op.run(ctx, test::data_or_null(in.a[ctx.rank]), in.b[ctx.rank].data(),
             fused[ctx.rank].data());
    });
    for (int r = 0; r < c.world; ++r)
      ASSERT_EQ(std::memcmp(op.gathered(r), in.a_full.data(), in.a_full.size()), 0)
          << "gathered A of rank " << r;
    world.run([&](cpu::RankContext& ctx) {
      op.run_unfused(ctx, test::data_or_null(in.a[ctx.rank]), in.b[ctx.rank].data(),
                     unfused[ctx.rank].data());
    });
    for (int r = 0; r < c.world; ++r) {
      int64_t d = test::first_difference(fused[r], unfused[r], c.dtype);
      ASSERT_EQ(d, -1) << "rank " << r << ": fused and unfused differ at element " << d << " (row "
                       << d / n[r] << ", col " << d % n[r] << ")";
    }
    test::expect_ag_near_reference(in, fused, rows, n, k, c.dtype, "fused");
    test::expect_ag_near_reference(in, unfused, rows, n, k, c.dtype, "unfused");
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AgGemmFused, ::testing::ValuesIn(cases()), case_name);

TEST(AgGemm, FiftyCallsAlternatingFusedAndUnfusedStayExact) {
  TL_SEEDED_RNG(rng);
  const int world_size = 3;
  std::vector<int64_t> counts = {40, 0, 61};
  RowPartition rows = RowPartition::from_counts(counts);
  std::vector<int64_t> n = {24, 17, 5};
  const int64_t k = 40;
  AgGemmConfig cfg;
  cfg.comm_tile_rows = 16;
  cfg.gemm_tile_m = 24;
  cfg.gemm_tile_n = 8;
  cfg.comm_workers = 2;
  cfg.compute_workers = 2;
  for (CommMode mode : {CommMode::kPull, CommMode::kPush}) {
    cfg.mode = mode;
    cpu::World world(world_size);
    cpu::AgGemm op(world, rows, n, k, DType::kBF16, cfg);
    for (int call = 0; call < 50; ++call) {
      SCOPED_TRACE(::testing::Message()
                   << (mode == CommMode::kPull ? "pull" : "push") << " call " << call);
      test::AgInputs in = test::ag_inputs(rng, rows, n, k, DType::kBF16);
      std::vector<Bytes> c = test::ag_outputs(rows, n, DType::kBF16);
      world.run([&](cpu::RankContext& ctx) {
        if (call % 2 == 0)
          op.run(ctx, test::data_or_null(in.a[ctx.rank]), in.b[ctx.rank].data(),
                 c[ctx.rank].data());
        else
          op.run_unfused(ctx, test::data_or_null(in.a[ctx.rank]), in.b[ctx.rank].data(),
                         c[ctx.rank].data());
      });
      for (int r = 0; r < world_size; ++r) {
        Bytes want(c[r].size());
        gemm_tile_cpu(in.a_full.data(), k, in.b[r].data(), k, want.data(), n[r], DType::kBF16,
                      rows.total(), n[r], k);
        ASSERT_EQ(test::first_difference(c[r], want, DType::kBF16), -1) << "rank " << r;
      }
    }
  }
}

TEST(AgGemm, RefusesBadInput) {
  cpu::World world(2);
  RowPartition rows = RowPartition::even(10, 2);
  AgGemmConfig cfg;
  test::expect_refused(
      [&] {
        cpu::AgGemm(world, RowPartition::even(10, 3), {8, 8, 8}, 8, DType::kBF16, cfg);
      },
      "the row partition has 3 ranks, the world 2");
  test::expect_refused(
      [&] {
        cpu::AgGemm(world, rows, {8, 8, 8}, 8, DType::kBF16, cfg);
      },
      "3 N_r values for a world of 2");
  test::expect_refused([&] { cpu::AgGemm(world, rows, {8, 8}, 0, DType::kBF16, cfg); }, "K must be >= 1");
  test::expect_refused([&] { cpu::AgGemm(world, rows, {8, 0}, 8, DType::kBF16, cfg); }, "N must be >= 1");
  test::expect_refused(
      [&] {
        cpu::AgGemm(world, RowPartition::even(0, 2), {8, 8}, 8, DType::kBF16, cfg);
      },
      "M must be >= 1");
  AgGemmConfig zero = cfg;
  zero.comm_workers = 0;
  test::expect_refused(
      [&] {
        cpu::AgGemm(world, rows, {8, 8}, 8, DType::kBF16, zero);
      },
      "at least one comm and one compute worker");
  zero = cfg;
  zero.compute_workers = 0;
  test::expect_refused(
      [&] {
        cpu::AgGemm(world, rows, {8, 8}, 8, DType::kBF16, zero);
      },
      "at least one comm and one compute worker");
  std::vector<int64_t> neg = {12, -2};
  test::expect_refused([&] { RowPartition::from_counts(neg); }, "negative row count");
}

TEST(AgGemm, ANullTensorIsRefusedAndTheOpStaysUsable) {
  TL_SEEDED_RNG(rng);
  cpu::World world(3, std::chrono::seconds(5));
  std::vector<int64_t> counts = {5, 7, 4};
  RowPartition rows = RowPartition::from_counts(counts);
  std::vector<int64_t> n = {6, 6, 6};
  AgGemmConfig cfg;
  cfg.comm_tile_rows = 3;
  cfg.gemm_tile_m = 4;
  cfg.gemm_tile_n = 4;
  cpu::AgGemm op(world, rows, n, 8, DType::kF32, cfg);
  test::AgInputs in = test::ag_inputs(rng, rows, n, 8, DType::kF32);
  for (bool fused : {true, false}) {
    std::vector<Bytes> c = test::ag_outputs(rows, n, DType::kF32);
    try {
      world.run([&](cpu::RankContext& ctx) {
        const void* b = ctx.rank == 1 ? nullptr : in.b[ctx.rank].data();
        if (fused)
          op.run(ctx, in.a[ctx.rank].data(), b, c[ctx.rank].data());
        else
          op.run_unfused(ctx, in.a[ctx.rank].data(), b, c[ctx.rank].data());
      });
      ADD_FAILURE() << "a null B was accepted";
    } catch (const TimeoutError& e) {
      ADD_FAILURE() << "waited instead of refusing: " << e.what();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("null tensor on rank 1"), std::string::npos) << e.what();
    }
    // The next call on every rank works.
    world.run([&](cpu::RankContext& ctx) {
      if (fused)
        op.run(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(), c[ctx.rank].data());
      else
        op.run_unfused(ctx, in.a[ctx.rank].data(), in.b[ctx.rank].data(), c[ctx.rank].data());
    });
    test::expect_ag_near_reference(in, c, rows, n, 8, DType::kF32, fused ? "fused" : "unfused");
  }
}

}  // namespace
}  // namespace tilelink
