// Fused GEMM+AR on the CUDA backend over virtual ranks (one GPU, green contexts), worlds 1..8,
// one-shot and two-shot, ragged K_r, uneven and empty two-shot segments, M from 1 (decode) up;
// outputs poisoned before every call; repeated calls and CUDA-graph replays. Two kinds of inputs,
// alternating:
//   exact   entries in {-1, 0, 1} with every K_r <= 256: every partial is an integer of at most 256,
//           exact in bf16 whatever the GEMM's summation order, so every rank's C (fused and the
//           baseline's) must be bit for bit the rank-ordered fp32 sum rounded once, computed here
//   random  uniform [-1, 1): every rank's C bit-identical to rank 0's (each rank sums the same
//           partials in the same order), fused and baseline near the float64 reference
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstring>
#include <random>
#include <vector>

#include "../support/refused.hpp"
#include "../support/random.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/ops/gemm_ar_cuda.hpp"
#include "tilelink/runtime/graph.hpp"

using namespace tilelink;
namespace tlc = tilelink::cuda;  // NOTE: plain `cuda::` would be ambiguous with CCCL's ::cuda

namespace {

using test::random_bf16;

struct Case {
  int world;
  std::vector<int64_t> m_split;  // the two-shot's segments; M = their sum
  std::vector<int64_t> k_split;
  int64_t n;
  AllReduceAlgo algo;
  int comm_sms = 0;              // 0: the op's share
  int band_cols = 512;
  bool graph = false;            // also capture one call per rank and replay it
};

class Harness {
 public:
  Harness(const Case& tc, uint64_t seed)
      : tc_(tc), world_(tlc::WorldOptions{.transport = tlc::Transport::kVirtual, .world_size = tc.world,
                                           .timeout = std::chrono::milliseconds(10000)}),
        rows_(RowPartition::from_counts(tc.m_split)), rng_(seed) {
    M_ = rows_.total();
    GemmArConfig cfg;
    cfg.algo = tc.algo;
    cfg.comm_workers = tc.comm_sms;
    cfg.compute_workers = 0;
    cfg.band_cols = tc.band_cols;
    op_ = std::make_unique<tlc::GemmAr>(world_, rows_, tc.n, tc.k_split, DType::kBF16, cfg);
    da_.resize(tc.world), db_.resize(tc.world), dc_.resize(tc.world), dc_ref_.resize(tc.world);
    for (int r = 0; r < tc.world; ++r) {
      world_.bind(r);
      void *pa, *pb;
      TL_CUDA_CHECK(cudaMalloc(&pa, M_ * tc.k_split[r] * 2));
      TL_CUDA_CHECK(cudaMalloc(&pb, tc.n * tc.k_split[r] * 2));
      TL_CUDA_CHECK(cudaMalloc(&dc_[r], M_ * tc.n * 2));
      TL_CUDA_CHECK(cudaMalloc(&dc_ref_[r], M_ * tc.n * 2));
      da_[r] = pa, db_[r] = pb;
    }
  }
  ~Harness() {
    for (int r = 0; r < tc_.world; ++r) {
      world_.bind(r);
      cudaFree(const_cast<void*>(da_[r]));
      cudaFree(const_cast<void*>(db_[r]));
      cudaFree(dc_[r]);
      cudaFree(dc_ref_[r]);
    }
  }

  bool can_be_exact() const {
    for (int64_t k : tc_.k_split)
      if (k > 256) return false;
    return true;
  }
  // Fresh inputs; the expected bits (rank-ordered fp32 sum of the rounded partials) and float64.
  void fresh_inputs(bool exact) {
    exact_ = exact;
    const int64_t N = tc_.n;
    std::vector<float> sum(M_ * N, 0.f);
    std::vector<double> ref(M_ * N, 0.0);
    for (int r = 0; r < tc_.world; ++r) {
      const int64_t kr = tc_.k_split[r];
      std::vector<BF16> a = exact ? ternary(M_ * kr) : random_bf16(M_ * kr, rng_);
      std::vector<BF16> b = exact ? ternary(N * kr) : random_bf16(N * kr, rng_);
      std::vector<BF16> part(M_ * N);
      gemm_tile_cpu(a.data(), kr, b.data(), kr, part.data(), N, DType::kBF16, M_, N, kr);
      const std::vector<double> exact = gemm_reference_f64(a.data(), b.data(), DType::kBF16, M_, N, kr);
      for (int64_t i = 0; i < M_ * N; ++i) {
        sum[i] += load_as_float(part.data(), DType::kBF16, i);
        ref[i] += exact[i];
      }
      world_.bind(r);
      TL_CUDA_CHECK(cudaMemcpy(const_cast<void*>(da_[r]), a.data(), a.size() * 2, cudaMemcpyHostToDevice));
      TL_CUDA_CHECK(cudaMemcpy(const_cast<void*>(db_[r]), b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    }
    want_.assign(M_ * N, BF16{});
    for (int64_t i = 0; i < M_ * N; ++i) store_from_float(want_.data(), DType::kBF16, i, sum[i]);
    ref_ = std::move(ref);
  }
  void poison() {
    for (int r = 0; r < tc_.world; ++r) {
      world_.bind(r);
      TL_CUDA_CHECK(cudaMemset(dc_[r], 0xff, M_ * tc_.n * 2));  // NaN in bf16
      TL_CUDA_CHECK(cudaMemset(dc_ref_[r], 0xff, M_ * tc_.n * 2));
      TL_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
  // exact: every rank's C (and the baseline's, when checked) is the expected bits; random: every
  // rank's C is rank 0's bits. Both near float64.
  void expect_exact(const char* what, bool baseline) {
    std::vector<BF16> first;
    for (int r = 0; r < tc_.world; ++r) {
      for (int which = 0; which < (baseline ? 2 : 1); ++which) {
        std::vector<BF16> c(M_ * tc_.n);
        world_.bind(r);
        TL_CUDA_CHECK(cudaMemcpy(c.data(), which ? dc_ref_[r] : dc_[r], c.size() * 2, cudaMemcpyDeviceToHost));
        if (exact_ || which == 0) {
          const std::vector<BF16>& want = exact_ ? want_ : (r == 0 ? c : first);
          int64_t bad = -1;
          for (int64_t i = 0; i < M_ * tc_.n && bad < 0; ++i)
            if (std::memcmp(&c[i], &want[i], 2) != 0) bad = i;
          EXPECT_EQ(bad, -1) << what << (which ? " (baseline)" : " (fused)") << ", rank " << r
                             << (exact_ ? ": not the exact sum" : ": differs from rank 0") << "; first at row "
                             << bad / tc_.n << ", col " << bad % tc_.n;
        }
        if (r == 0 && which == 0) first = c;
        EXPECT_LT(relative_error(c.data(), DType::kBF16, ref_), 1e-2) << what << ", rank " << r;
      }
    }
  }
  void run_eager(int calls) {
    for (int call = 0; call < calls; ++call) {
      fresh_inputs(call % 2 == 0 && can_be_exact());
      poison();
      op_->run(da_, db_, dc_);
      world_.sync("gemm_ar");
      op_->run_unfused(da_, db_, dc_ref_);
      world_.sync("gemm_ar(unfused)");
      expect_exact(("call " + std::to_string(call)).c_str(), true);
    }
  }
  // One fused call captured on every rank's stream, replayed with fresh inputs each time.
  void run_graph(int replays) {
    tlc::WorldGraph graph(world_, [&] { op_->run(da_, db_, dc_); });
    for (int rep = 0; rep < replays; ++rep) {
      fresh_inputs(rep % 2 == 0 && can_be_exact());
      poison();
      graph.replay();
      world_.sync("gemm_ar(graph)");
      expect_exact(("replay " + std::to_string(rep)).c_str(), false);
      op_->run(da_, db_, dc_);  // an eager call between replays
      world_.sync("gemm_ar");
      expect_exact(("eager after replay " + std::to_string(rep)).c_str(), false);
    }
  }
 private:
  std::vector<BF16> ternary(int64_t count) {
    std::vector<BF16> v(static_cast<size_t>(count));
    std::uniform_int_distribution<int> d(-1, 1);
    for (auto& x : v) x = float_to_bf16(static_cast<float>(d(rng_)));
    return v;
  }

  Case tc_;
  bool exact_ = false;
  tlc::World world_;
  RowPartition rows_;
  std::mt19937_64 rng_;
  int64_t M_ = 0;
  std::unique_ptr<tlc::GemmAr> op_;
  std::vector<const void*> da_, db_;
  std::vector<void*> dc_, dc_ref_;
  std::vector<BF16> want_;
  std::vector<double> ref_;
};

void run_case(const Case& tc, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "world " << tc.world << " n " << tc.n << " "
                                    << allreduce_algo_name(tc.algo) << " seed " << seed);
  Harness h(tc, seed);
  h.run_eager(3);
  if (tc.graph) h.run_graph(3);
}

const AllReduceAlgo kOne = AllReduceAlgo::kOneShot, kTwo = AllReduceAlgo::kTwoShot;

}  // namespace

TEST(GemmArCuda, World1) { run_case({1, {300}, {512}, 512, kOne}, 1); }
TEST(GemmArCuda, World2OneShotRagged) { run_case({2, {500, 277}, {256, 512}, 1024, kOne}, 2); }
TEST(GemmArCuda, World2TwoShotRagged) { run_case({2, {500, 277}, {256, 512}, 1024, kTwo}, 3); }
TEST(GemmArCuda, World3Decode) { run_case({3, {1, 0, 0}, {128, 64, 192}, 4096, kOne}, 4); }
TEST(GemmArCuda, World4TwoShotEmptySegment) { run_case({4, {500, 0, 1, 620}, {128, 256, 64, 192}, 768, kTwo, 4, 256}, 5); }
TEST(GemmArCuda, World4OneShotM16) { run_case({4, {4, 4, 4, 4}, {1024, 1024, 1024, 1024}, 2048, kOne}, 6); }
TEST(GemmArCuda, World5TwoShotOddBands) { run_case({5, {100, 3, 64, 0, 90}, {64, 64, 128, 8, 72}, 200, kTwo, 2, 40}, 7); }
TEST(GemmArCuda, World8OneShot) { run_case({8, {8, 8, 8, 8, 8, 8, 8, 8}, {64, 128, 64, 64, 128, 64, 64, 128}, 512, kOne}, 8); }
TEST(GemmArCuda, World8TwoShot) { run_case({8, {300, 17, 512, 1, 256, 300, 9, 700}, {64, 128, 64, 64, 128, 64, 64, 128}, 512, kTwo}, 9); }
TEST(GemmArCuda, World2OneShotGraph) { run_case({2, {256, 256}, {512, 256}, 768, kOne, 0, 512, true}, 10); }
TEST(GemmArCuda, World4TwoShotGraph) { run_case({4, {200, 100, 50, 162}, {128, 128, 256, 64}, 512, kTwo, 0, 512, true}, 11); }

TEST(GemmArCuda, ManyCallsStayExact) {
  Harness h({4, {64, 64, 64, 64}, {128, 128, 128, 128}, 256, kTwo}, 12);
  h.run_eager(40);
}

TEST(GemmArCuda, RefusesBadInput) {
  tlc::World world({.transport = tlc::Transport::kVirtual, .world_size = 2});
  GemmArConfig cfg;
  test::expect_refused([&] { tlc::GemmAr(world, RowPartition::even(100, 2), 100, {128, 128}, DType::kBF16, cfg); },
                 "N must be a multiple of 8");
  test::expect_refused([&] { tlc::GemmAr(world, RowPartition::even(100, 2), 128, {128, 100}, DType::kBF16, cfg); },
                 "K_1 must be a positive multiple of 8");
  test::expect_refused([&] { tlc::GemmAr(world, RowPartition::even(100, 2), 128, {128, 128}, DType::kF32, cfg); },
                 "takes bf16");
  test::expect_refused([&] { tlc::GemmAr(world, RowPartition::even(100, 3), 128, {128, 128, 128}, DType::kBF16, cfg); },
                 "the row partition has 3 ranks");
  cfg.compute_workers = world.sm_count(0);
  test::expect_refused([&] { tlc::GemmAr(world, RowPartition::even(100, 2), 128, {128, 128}, DType::kBF16, cfg); },
                 "must leave the GEMM at least one");
  tlc::GemmAr op(world, RowPartition::even(64, 2), 64, {64, 64}, DType::kBF16, GemmArConfig{});
  void* c = nullptr;
  test::expect_refused([&] { op.run({nullptr, nullptr}, {nullptr, nullptr}, {c, c}); }, "null tensor on rank 0");
}
