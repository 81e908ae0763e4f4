// Fused AG+GEMM on the CUDA backend over virtual ranks (one GPU, green contexts), world 1, 2, 4, 8,
// and on two GPUs (peer transport) where the machine has them: against the float64 reference,
// bit-exact gathered A (poisoned before every call), pull and push, ragged M, repeated calls (with
// the bench's unlinked calls between two of them).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstring>
#include <random>
#include <vector>

#include "../support/gpu.hpp"
#include "../support/random.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/ops/ag_gemm_cuda.hpp"

using namespace tilelink;
namespace tlc = tilelink::cuda;  // NOTE: plain `cuda::` would be ambiguous with CCCL's ::cuda

namespace {

using test::random_bf16;

struct Case {
  int world;
  std::vector<int64_t> m_split;
  int64_t n_r, k;
  CommMode mode;
  int comm_tile_rows;
  int comm_sms = 0;         // 0: copy engine; k: SM-driven comm on k SMs
  int compute_workers = 1;  // GEMM SMs; 0: the rest of the rank's SMs
  tlc::Transport transport = tlc::Transport::kVirtual;
};

// split_ranks: set to the number of ranks whose GEMM splits its last wave; narrow_ranks: to the
// number whose unfused GEMM takes 192-wide tiles (the fused one keeps the plan's 256).
void run_case(const Case& tc, uint64_t seed, int* split_ranks = nullptr,
              int* narrow_ranks = nullptr) {
  SCOPED_TRACE(::testing::Message() << "world " << tc.world << " comm SMs " << tc.comm_sms
                                    << " GEMM SMs " << tc.compute_workers << " n_r " << tc.n_r << " k " << tc.k
                                    << (tc.mode == CommMode::kPush ? " push" : " pull") << " seed " << seed);
  tlc::WorldOptions wo;
  wo.transport = tc.transport;
  wo.world_size = tc.world;
  wo.timeout = std::chrono::milliseconds(10000);
  tlc::World world(wo);
  RowPartition rows = RowPartition::from_counts(tc.m_split);
  const int64_t M = rows.total();
  AgGemmConfig cfg;
  cfg.mode = tc.mode;
  cfg.comm_workers = tc.comm_sms;
  cfg.compute_workers = tc.compute_workers;
  cfg.comm_tile_rows = tc.comm_tile_rows;
  tlc::AgGemm op(world, rows, std::vector<int64_t>(tc.world, tc.n_r), tc.k, DType::kBF16, cfg);
  if (split_ranks != nullptr) {
    *split_ranks = 0;
    for (int r = 0; r < tc.world; ++r) *split_ranks += op.gemm_work(r).split.tiles > 0;
  }
  if (narrow_ranks != nullptr) {
    *narrow_ranks = 0;
    for (int r = 0; r < tc.world; ++r) {
      EXPECT_EQ(op.gemm_work(r).tile_n, compute::sm90::kTileN);  // the fused GEMM: the plan's tiles
      *narrow_ranks += compute::sm90::gemm_pick_tile_n(M, tc.n_r, tc.k, op.gemm_sms(r)) ==
                       compute::sm90::kTileNNarrow;
    }
  }

  std::mt19937_64 rng(seed);
  std::vector<std::vector<BF16>> ha(tc.world), hb(tc.world);
  std::vector<BF16> a_full;
  std::vector<const void*> da(tc.world), db(tc.world);
  std::vector<void*> dc(tc.world), dc_ref(tc.world);
  for (int r = 0; r < tc.world; ++r) {
    ha[r] = random_bf16(rows.size(r) * tc.k, rng);
    hb[r] = random_bf16(tc.n_r * tc.k, rng);
    a_full.insert(a_full.end(), ha[r].begin(), ha[r].end());
    world.bind(r);
    void *pa = nullptr, *pb = nullptr;
    if (rows.size(r) > 0) {
      TL_CUDA_CHECK(cudaMalloc(&pa, ha[r].size() * 2));
      TL_CUDA_CHECK(cudaMemcpy(pa, ha[r].data(), ha[r].size() * 2, cudaMemcpyHostToDevice));
    }
    TL_CUDA_CHECK(cudaMalloc(&pb, hb[r].size() * 2));
    TL_CUDA_CHECK(cudaMemcpy(pb, hb[r].data(), hb[r].size() * 2, cudaMemcpyHostToDevice));
    TL_CUDA_CHECK(cudaMalloc(&dc[r], M * tc.n_r * 2));
    TL_CUDA_CHECK(cudaMalloc(&dc_ref[r], M * tc.n_r * 2));
    da[r] = pa;
    db[r] = pb;
  }
  // Push on separate GPUs with the own segment on tile rows: the GEMM reads it from A_r, and the
  // gathered buffer's own rows stay as they were (poisoned here: a GEMM that read them would give NaN).
  auto own_direct = [&](int r) {
    const int64_t b = rows.begin(r), e = rows.end(r);
    return tc.transport == tlc::Transport::kPeer && tc.comm_sms == 0 && tc.mode == CommMode::kPush && e > b &&
           b % 128 == 0 && (e % 128 == 0 || e == M);
  };
  for (int call = 0; call < 3; ++call) {
    if (call == 1) {
      // The bench's unlinked call (the GEMM not waiting) between two calls: it must end, and leave
      // the epochs so that the next call waits for its own tiles again (checked below).
      op.run_unlinked(da, db, dc);
      op.run_unlinked(da, db, dc);
      world.sync("ag_gemm(unlinked)");
    }
    for (int r = 0; r < tc.world; ++r) {  // poison: unwritten tiles show as NaN
      world.bind(r);
      TL_CUDA_CHECK(cudaMemset(dc[r], 0xff, M * tc.n_r * 2));
      TL_CUDA_CHECK(cudaMemset(dc_ref[r], 0xff, M * tc.n_r * 2));
      if (tc.world > 1) TL_CUDA_CHECK(cudaMemset(const_cast<void*>(op.gathered(r)), 0xff, M * tc.k * 2));
      TL_CUDA_CHECK(cudaDeviceSynchronize());
    }
    op.run(da, db, dc);
    world.sync("ag_gemm");
    // The communication half: every rank's gathered A is the whole A, bit for bit (world 1 has no
    // communication half: the engine reads A itself).
    for (int r = 0; r < tc.world && tc.world > 1; ++r) {
      std::vector<BF16> g(a_full.size());
      world.bind(r);
      TL_CUDA_CHECK(cudaMemcpy(g.data(), op.gathered(r), g.size() * 2, cudaMemcpyDeviceToHost));
      if (own_direct(r)) {  // the own rows are not gathered: they stay poisoned
        const size_t b = rows.begin(r) * tc.k, e = rows.end(r) * tc.k;
        for (size_t i = b; i < e; ++i) ASSERT_EQ(g[i].bits, 0xffff) << "own row element " << i << " of rank " << r;
        std::copy(a_full.begin() + b, a_full.begin() + e, g.begin() + b);
      }
      ASSERT_EQ(0, std::memcmp(g.data(), a_full.data(), g.size() * 2)) << "gathered A of rank " << r;
    }
    op.run_unfused(da, db, dc_ref);
    world.sync("ag_gemm(unfused)");
    for (int r = 0; r < tc.world; ++r) {
      std::vector<BF16> c(M * tc.n_r), c_ref(M * tc.n_r);
      world.bind(r);
      TL_CUDA_CHECK(cudaMemcpy(c.data(), dc[r], c.size() * 2, cudaMemcpyDeviceToHost));
      TL_CUDA_CHECK(cudaMemcpy(c_ref.data(), dc_ref[r], c.size() * 2, cudaMemcpyDeviceToHost));
      if (call == 0) {
        auto ref = gemm_reference_f64(a_full.data(), hb[r].data(), DType::kBF16, M, tc.n_r, tc.k);
        EXPECT_LT(relative_error(c.data(), DType::kBF16, ref), 1e-2) << "fused, rank " << r;
        EXPECT_LT(relative_error(c_ref.data(), DType::kBF16, ref), 1e-2) << "cuBLAS baseline, rank " << r;
      }
      // Fused vs baseline, every call: same function (bf16 rounding apart).
      std::vector<double> base(c_ref.size());
      for (size_t i = 0; i < base.size(); ++i) base[i] = bf16_to_float(c_ref[i]);
      EXPECT_LT(relative_error(c.data(), DType::kBF16, base), 1e-2) << "fused vs baseline, rank " << r
                                                                   << ", call " << call;
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

TEST(AgGemmCuda, World1) { run_case({1, {300}, 256, 512, CommMode::kPull, 128}, 1); }
TEST(AgGemmCuda, World2RaggedPull) { run_case({2, {333, 667}, 256, 512, CommMode::kPull, 128}, 2); }
TEST(AgGemmCuda, World2RaggedPush) { run_case({2, {1, 999}, 512, 256, CommMode::kPush, 64}, 3); }
TEST(AgGemmCuda, World4EmptySegment) { run_case({4, {250, 0, 517, 233}, 256, 384, CommMode::kPull, 96}, 4); }
TEST(AgGemmCuda, World8Pull) { run_case({8, {128, 128, 128, 128, 128, 128, 128, 129}, 256, 512, CommMode::kPull, 128}, 5); }
TEST(AgGemmCuda, World8Push) { run_case({8, {100, 17, 300, 5, 64, 200, 1, 313}, 256, 256, CommMode::kPush, 256}, 6); }

// The GEMM on all the SMs it is given, with few tiles (8 and 16, 8 k-blocks): its last wave is
// split in two parts of K, with the wait hook in every part.
TEST(AgGemmCuda, World1SplitLastWave) {
  int split = 0;
  run_case({1, {300}, 256, 512, CommMode::kPull, 128, 0, 0}, 11, &split);
  EXPECT_EQ(split, 1);
}
TEST(AgGemmCuda, World2SplitLastWavePull) {
  int split = 0;
  run_case({2, {333, 667}, 256, 512, CommMode::kPull, 128, 0, 0}, 12, &split);
  EXPECT_EQ(split, 2);
}
TEST(AgGemmCuda, World2SplitLastWavePush) {
  int split = 0;
  run_case({2, {1, 999}, 512, 512, CommMode::kPush, 64, 0, 0}, 13, &split);
  EXPECT_EQ(split, 2);
}
// The GEMM on all the SMs it is given (not 1), with many tiles: the comm program must still run.
TEST(AgGemmCuda, World2FullWidthCopyEngine) { run_case({2, {2000, 1500}, 1024, 512, CommMode::kPull, 512, 0, 0}, 7); }
// SM-driven comm co-running with the GEMM (its kernel launched first, so its blocks hold their SMs).
TEST(AgGemmCuda, World2SmCommPull) { run_case({2, {2000, 1500}, 1024, 512, CommMode::kPull, 256, 8, 0}, 8); }
TEST(AgGemmCuda, World4SmCommPush) { run_case({4, {700, 0, 901, 333}, 512, 256, CommMode::kPush, 128, 4, 0}, 9); }
TEST(AgGemmCuda, World8SmCommPull) { run_case({8, {300, 17, 512, 1, 256, 300, 0, 700}, 512, 384, CommMode::kPull, 64, 2, 0}, 10); }

// An unfused call's GEMM maps no signals onto its tiles: it takes the engine's pick of the width.
// 256 x 5120 on a rank's ~60 SMs is 40 tiles of 256 (a wave 2/3 full) or 54 of 192: narrow.
TEST(AgGemmCuda, World2UnfusedTakesNarrowTiles) {
  int narrow = 0;
  run_case({2, {128, 128}, 5120, 512, CommMode::kPull, 128, 0, 0}, 11, nullptr, &narrow);
  EXPECT_EQ(narrow, 2);
}

// Two GPUs (peer transport): the GEMM on every SM, the comm program on the copy engine. Pull copies
// the own segment before the GEMM; push on tile rows reads it from A_r (rank 1's ends at a ragged M);
// push off tile rows falls back to the copy.
TEST(AgGemmCudaPeer, TwoGpus) {
  TL_SKIP_UNLESS_GPUS(2);
  const auto peer = tlc::Transport::kPeer;
  run_case({2, {1536, 1700}, 1024, 512, CommMode::kPull, 512, 0, 0, peer}, 11);
  run_case({2, {1024, 1000}, 1024, 512, CommMode::kPush, 256, 0, 0, peer}, 12);  // own rows from A_r
  run_case({2, {1000, 1100}, 512, 256, CommMode::kPush, 128, 0, 0, peer}, 13);   // off tile rows: copied
}

TEST(AgGemmCuda, RefusesBadInput) {
  tlc::WorldOptions wo;
  wo.transport = tlc::Transport::kVirtual;
  wo.world_size = 2;
  tlc::World world(wo);
  AgGemmConfig cfg;
  cfg.comm_workers = 0;
  using test::expect_refused;
  expect_refused([&] { tlc::AgGemm(world, RowPartition::even(100, 2), {256, 256}, 100, DType::kBF16, cfg); },
                 "K must be a multiple of 8");
  expect_refused([&] { tlc::AgGemm(world, RowPartition::even(100, 3), {256, 256, 256}, 128, DType::kBF16, cfg); },
                 "the row partition has 3 ranks, the world 2");
  expect_refused([&] { tlc::AgGemm(world, RowPartition::even(100, 2), {256, 256}, 128, DType::kF32, cfg); },
                 "takes bf16");
  // Operands that are not device memory of the rank's GPU: refused before anything launches.
  tlc::AgGemm op(world, RowPartition::even(100, 2), {256, 256}, 128, DType::kBF16, cfg);
  std::vector<std::byte> host(1 << 20);
  void* dev = nullptr;
  world.bind(0);
  TL_CUDA_CHECK(cudaMalloc(&dev, 1 << 20));
  const void* h = host.data();
  expect_refused([&] { op.run({h, h}, {dev, dev}, {dev, dev}); }, "A of rank 0 is not device memory");
  expect_refused([&] { op.run({dev, dev}, {dev, h}, {dev, dev}); }, "B of rank 1 is not device memory");
  TL_CUDA_CHECK(cudaFree(dev));
  cfg.comm_workers = 1000;  // more SMs than the rank has
  expect_refused([&] { tlc::AgGemm(world, RowPartition::even(100, 2), {256, 256}, 128, DType::kBF16, cfg); },
                 "SMs");
}
