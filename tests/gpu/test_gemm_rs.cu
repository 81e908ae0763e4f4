// Fused GEMM+RS on the CUDA backend over virtual ranks (one GPU, green contexts), world 1, 2, 4, 8:
// against the float64 reference and the cuBLAS + reduce baseline, ragged M and K_r, repeated calls.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstring>
#include <random>
#include <vector>

#include "../support/random.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/ops/gemm_rs_cuda.hpp"

using namespace tilelink;
namespace tlc = tilelink::cuda;  // NOTE: plain `cuda::` would be ambiguous with CCCL's ::cuda

namespace {

using test::random_bf16;

struct Case {
  int world;
  std::vector<int64_t> m_split;
  std::vector<int64_t> k_split;
  int64_t n;
  int comm_sms;
  int comm_tile_rows, comm_tile_cols;
  CommMode mode = CommMode::kPull;
};

// split_ranks: set to the number of ranks whose GEMM splits its last wave; narrow_ranks: to the
// number whose unfused GEMM takes 192-wide tiles (the fused one keeps the plan's 256).
void run_case(const Case& tc, uint64_t seed, int* split_ranks = nullptr,
              int* narrow_ranks = nullptr) {
  SCOPED_TRACE(::testing::Message() << "world " << tc.world << " n " << tc.n << " comm SMs "
                                    << tc.comm_sms << " seed " << seed);
  tlc::WorldOptions wo;
  wo.transport = tlc::Transport::kVirtual;
  wo.world_size = tc.world;
  wo.timeout = std::chrono::milliseconds(10000);
  tlc::World world(wo);
  RowPartition rows = RowPartition::from_counts(tc.m_split);
  const int64_t M = rows.total(), N = tc.n;
  int64_t K = 0;
  for (int64_t k : tc.k_split) K += k;
  GemmRsConfig cfg;
  cfg.comm_workers = tc.comm_sms;
  cfg.compute_workers = 0;
  cfg.mode = tc.mode;
  cfg.comm_tile_rows = tc.comm_tile_rows;
  cfg.comm_tile_cols = tc.comm_tile_cols;
  tlc::GemmRs op(world, rows, N, tc.k_split, DType::kBF16, cfg);
  if (split_ranks != nullptr) {
    *split_ranks = 0;
    for (int r = 0; r < tc.world; ++r) *split_ranks += op.gemm_work(r).split.tiles > 0;
  }
  if (narrow_ranks != nullptr) {
    *narrow_ranks = 0;
    for (int r = 0; r < tc.world; ++r) {
      EXPECT_EQ(op.gemm_work(r).tile_n, compute::sm90::kTileN);  // the fused GEMM: the plan's tiles
      *narrow_ranks += compute::sm90::gemm_pick_tile_n(M, N, tc.k_split[r], op.gemm_sms(r)) ==
                       compute::sm90::kTileNNarrow;
    }
  }

  std::mt19937_64 rng(seed);
  std::vector<std::vector<BF16>> ha(tc.world), hb(tc.world);
  std::vector<BF16> a_cat(M * K), b_cat(N * K);
  std::vector<const void*> da(tc.world), db(tc.world);
  std::vector<void*> dc(tc.world), dc_ref(tc.world);
  int64_t k0 = 0;
  for (int r = 0; r < tc.world; ++r) {
    const int64_t kr = tc.k_split[r];
    ha[r] = random_bf16(M * kr, rng);
    hb[r] = random_bf16(N * kr, rng);
    for (int64_t i = 0; i < M; ++i) std::memcpy(&a_cat[i * K + k0], &ha[r][i * kr], kr * 2);
    for (int64_t i = 0; i < N; ++i) std::memcpy(&b_cat[i * K + k0], &hb[r][i * kr], kr * 2);
    k0 += kr;
    world.bind(r);
    void *pa, *pb;
    TL_CUDA_CHECK(cudaMalloc(&pa, ha[r].size() * 2));
    TL_CUDA_CHECK(cudaMemcpy(pa, ha[r].data(), ha[r].size() * 2, cudaMemcpyHostToDevice));
    TL_CUDA_CHECK(cudaMalloc(&pb, hb[r].size() * 2));
    TL_CUDA_CHECK(cudaMemcpy(pb, hb[r].data(), hb[r].size() * 2, cudaMemcpyHostToDevice));
    TL_CUDA_CHECK(cudaMalloc(&dc[r], rows.size(r) * N * 2 + 16));
    TL_CUDA_CHECK(cudaMalloc(&dc_ref[r], rows.size(r) * N * 2 + 16));
    da[r] = pa;
    db[r] = pb;
  }
  const std::vector<double> full = gemm_reference_f64(a_cat.data(), b_cat.data(), DType::kBF16, M, N, K);
  for (int call = 0; call < 3; ++call) {
    for (int r = 0; r < tc.world; ++r) {  // poison: unwritten tiles show as NaN
      world.bind(r);
      TL_CUDA_CHECK(cudaMemset(dc[r], 0xff, rows.size(r) * N * 2));
      TL_CUDA_CHECK(cudaMemset(dc_ref[r], 0xff, rows.size(r) * N * 2));
      TL_CUDA_CHECK(cudaDeviceSynchronize());
    }
    op.run(da, db, dc);
    world.sync("gemm_rs");
    op.run_unfused(da, db, dc_ref);
    world.sync("gemm_rs(unfused)");
    for (int r = 0; r < tc.world; ++r) {
      const int64_t mr = rows.size(r);
      if (mr == 0) continue;
      std::vector<BF16> c(mr * N), c_ref(mr * N);
      world.bind(r);
      TL_CUDA_CHECK(cudaMemcpy(c.data(), dc[r], c.size() * 2, cudaMemcpyDeviceToHost));
      TL_CUDA_CHECK(cudaMemcpy(c_ref.data(), dc_ref[r], c.size() * 2, cudaMemcpyDeviceToHost));
      std::vector<double> ref(full.begin() + rows.begin(r) * N, full.begin() + rows.end(r) * N);
      EXPECT_LT(relative_error(c.data(), DType::kBF16, ref), 1e-2) << "fused, rank " << r << ", call " << call;
      EXPECT_LT(relative_error(c_ref.data(), DType::kBF16, ref), 1e-2) << "baseline, rank " << r << ", call " << call;
    }
  }
  for (int r = 0; r < tc.world; ++r) {
    world.bind(r);
    cudaFree(const_cast<void*>(da[r]));
    cudaFree(const_cast<void*>(db[r]));
    cudaFree(dc[r]);
    cudaFree(dc_ref[r]);
  }
}

}  // namespace

// World1's GEMM (6 tiles, 8 k-blocks) splits its last wave in two parts of K (checked).
TEST(GemmRsCuda, World1) {
  int split = 0;
  run_case({1, {300}, {512}, 512, 2, 64, 256}, 1, &split);
  EXPECT_EQ(split, 1);
}
TEST(GemmRsCuda, World2Ragged) { run_case({2, {1000, 777}, {256, 512}, 1024, 8, 128, 512}, 2); }
TEST(GemmRsCuda, World4EmptySegment) { run_case({4, {500, 0, 1, 620}, {128, 256, 64, 192}, 768, 4, 96, 256}, 3); }
// An unfused call's GEMM maps no signals onto its tiles: it takes the engine's pick of the width.
// 256 x 5120 on a rank's ~58 SMs is 40 tiles of 256 (a wave 2/3 full) or 54 of 192: narrow.
TEST(GemmRsCuda, World2UnfusedTakesNarrowTiles) {
  int narrow = 0;
  run_case({2, {128, 128}, {256, 256}, 5120, 8, 128, 512}, 7, nullptr, &narrow);
  EXPECT_EQ(narrow, 2);
}

TEST(GemmRsCuda, World2RaggedPush) { run_case({2, {1000, 777}, {256, 512}, 1024, 8, 128, 512, CommMode::kPush}, 5); }
TEST(GemmRsCuda, World4PushEmptySegment) { run_case({4, {500, 0, 1, 620}, {128, 256, 64, 192}, 768, 4, 96, 256, CommMode::kPush}, 6); }
TEST(GemmRsCuda, World8Push) { run_case({8, {300, 17, 512, 1, 256, 300, 9, 700}, {64, 128, 64, 64, 128, 64, 64, 128}, 512, 2, 64, 512, CommMode::kPush}, 7); }
TEST(GemmRsCuda, World8) { run_case({8, {300, 17, 512, 1, 256, 300, 9, 700}, {64, 128, 64, 64, 128, 64, 64, 128}, 512, 2, 64, 512}, 4); }

TEST(GemmRsCuda, RefusesBadInput) {
  tlc::World world({.transport = tlc::Transport::kVirtual, .world_size = 2});
  GemmRsConfig cfg;
  cfg.comm_workers = 2;
  cfg.compute_workers = 0;
  EXPECT_THROW(tlc::GemmRs(world, RowPartition::even(100, 2), 100, {128, 128}, DType::kBF16, cfg), Error);  // N % 8
  EXPECT_THROW(tlc::GemmRs(world, RowPartition::even(100, 2), 128, {128, 100}, DType::kBF16, cfg), Error);  // K_r % 8
  EXPECT_THROW(tlc::GemmRs(world, RowPartition::even(100, 2), 128, {128, 128}, DType::kF32, cfg), Error);
  cfg.mode = CommMode::kPush;  // push needs pushers and reducers: comm_workers >= 2
  cfg.comm_workers = 1;
  EXPECT_THROW(tlc::GemmRs(world, RowPartition::even(100, 2), 128, {128, 128}, DType::kBF16, cfg), Error);
  cfg.mode = CommMode::kPull;
  cfg.comm_workers = -1;
  EXPECT_THROW(tlc::GemmRs(world, RowPartition::even(100, 2), 128, {128, 128}, DType::kBF16, cfg),
               Error);
  cfg.comm_workers = 0;
  cfg.compute_workers = world.sm_count(0);  // nothing left for the reduce the model picks
  EXPECT_THROW(tlc::GemmRs(world, RowPartition::even(100, 2), 128, {128, 128}, DType::kBF16, cfg), Error);
}

// comm_workers = 0: each rank's reduce SMs come from the cost model (tune/path_model.hpp), within
// [2, SMs / 4], fewer for a longer GEMM; the op then runs as with the SMs given.
TEST(GemmRsCuda, ReduceSmsFromTheModel) {
  tlc::World world({.transport = tlc::Transport::kVirtual, .world_size = 2});
  GemmRsConfig cfg;
  cfg.comm_workers = 0;
  cfg.compute_workers = 0;  // the GEMM on the rest
  auto sms_for = [&](int64_t k) {
    tlc::GemmRs op(world, RowPartition::even(8192, 2), 8192, {k, k}, DType::kBF16, cfg);
    const int chosen = op.plan(0).config.comm_workers;
    EXPECT_GE(chosen, 2);
    EXPECT_LE(chosen, world.sm_count(0) / 4);
    EXPECT_EQ(op.gemm_sms(0), world.sm_count(0) - chosen);
    return chosen;
  };
  EXPECT_GE(sms_for(2048), sms_for(16384));
  run_case({2, {1000, 777}, {256, 512}, 1024, 0, 128, 512}, 8);
}
