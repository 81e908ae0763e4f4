// The fused ops under CUDA graphs and long runs, on virtual ranks (one GPU): a call captured once and
// replayed must wait for and publish new epochs on every replay (inputs change and outputs are
// poisoned between replays; for AG+GEMM the gathered buffer too, so a GEMM that did not wait reads
// NaN), eager calls and replays mix, and 10,000 calls in a row (eager, and graph replays) end with a
// correct result and no hang.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../support/gpu.hpp"
#include "../support/random.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/ops/ag_gemm_cuda.hpp"
#include "tilelink/ops/gemm_rs_cuda.hpp"
#include "tilelink/runtime/graph.hpp"

using namespace tilelink;
namespace tlc = tilelink::cuda;  // NOTE: plain `cuda::` would be ambiguous with CCCL's ::cuda

namespace {

constexpr int kLongRun = 10000;
constexpr int kSyncEvery = 500;  // bounds the world's notes of stream waits; not a reset

using test::random_bf16;

tlc::World make_world(int w, tlc::Transport transport = tlc::Transport::kVirtual) {
  tlc::WorldOptions wo;
  wo.transport = transport;
  wo.world_size = w;
  wo.timeout = std::chrono::milliseconds(10000);
  return tlc::World(wo);
}

// ---- AG+GEMM ------------------------------------------------------------------------------------
struct AgFixture {
  tlc::World& world;
  RowPartition rows;
  int64_t n_r, k;
  std::vector<void*> a, b, c;
  std::vector<std::vector<BF16>> hb;
  std::vector<BF16> a_full;

  AgFixture(tlc::World& w, std::vector<int64_t> split, int64_t n_r_, int64_t k_)
      : world(w), rows(RowPartition::from_counts(split)), n_r(n_r_), k(k_) {
    const int W = world.size();
    a.assign(W, nullptr);
    b.assign(W, nullptr);
    c.assign(W, nullptr);
    hb.resize(W);
    std::mt19937_64 rng(99);
    for (int r = 0; r < W; ++r) {
      world.bind(r);
      TL_CUDA_CHECK(cudaMalloc(&a[r], rows.size(r) * k * 2 + 16));
      TL_CUDA_CHECK(cudaMalloc(&b[r], n_r * k * 2));
      TL_CUDA_CHECK(cudaMalloc(&c[r], rows.total() * n_r * 2));
      hb[r] = random_bf16(n_r * k, rng);
      TL_CUDA_CHECK(cudaMemcpy(b[r], hb[r].data(), hb[r].size() * 2, cudaMemcpyHostToDevice));
    }
  }
  ~AgFixture() {
    for (int r = 0; r < world.size(); ++r) {
      world.bind(r);
      cudaFree(a[r]);
      cudaFree(b[r]);
      cudaFree(c[r]);
    }
  }
  std::vector<const void*> ca() const { return {a.begin(), a.end()}; }
  std::vector<const void*> cb() const { return {b.begin(), b.end()}; }

  // New random A everywhere; C (and the gathered buffers, when given) poisoned.
  void refresh(uint64_t seed, const tlc::AgGemm* op) {
    std::mt19937_64 rng(seed);
    a_full.clear();
    for (int r = 0; r < world.size(); ++r) {
      world.bind(r);
      TL_CUDA_CHECK(cudaDeviceSynchronize());
      auto ha = random_bf16(rows.size(r) * k, rng);
      a_full.insert(a_full.end(), ha.begin(), ha.end());
      if (!ha.empty()) TL_CUDA_CHECK(cudaMemcpy(a[r], ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
      TL_CUDA_CHECK(cudaMemset(c[r], 0xff, rows.total() * n_r * 2));
      if (op && world.size() > 1)
        TL_CUDA_CHECK(cudaMemset(const_cast<void*>(op->gathered(r)), 0xff, rows.total() * k * 2));
      TL_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
  void check(const char* what) {
    for (int r = 0; r < world.size(); ++r) {
      std::vector<BF16> out(rows.total() * n_r);
      world.bind(r);
      TL_CUDA_CHECK(cudaMemcpy(out.data(), c[r], out.size() * 2, cudaMemcpyDeviceToHost));
      auto ref = gemm_reference_f64(a_full.data(), hb[r].data(), DType::kBF16, rows.total(), n_r, k);
      EXPECT_LT(relative_error(out.data(), DType::kBF16, ref), 1e-2) << what << ", rank " << r;
    }
  }
};

void ag_graph_case(int W, std::vector<int64_t> split, bool unfused, int comm_sms = 0,
                   tlc::Transport transport = tlc::Transport::kVirtual, CommMode mode = CommMode::kPull) {
  SCOPED_TRACE(::testing::Message() << "world " << W << (unfused ? " unfused" : " fused") << " comm SMs " << comm_sms
                                    << " " << tlc::transport_name(transport)
                                    << (mode == CommMode::kPush ? " push" : " pull"));
  tlc::World world = make_world(W, transport);
  AgFixture f(world, split, 256, 256);
  AgGemmConfig cfg;
  cfg.comm_workers = comm_sms;  // 0: the copy engine
  cfg.compute_workers = 0;
  cfg.comm_tile_rows = 64;
  cfg.mode = mode;
  tlc::AgGemm op(world, f.rows, std::vector<int64_t>(W, f.n_r), f.k, DType::kBF16, cfg);
  auto call = [&] { unfused ? op.run_unfused(f.ca(), f.cb(), f.c) : op.run(f.ca(), f.cb(), f.c); };
  // Eager first (host epochs), then a capture: the switch to device epochs mid-life.
  f.refresh(1, &op);
  call();
  world.sync("ag_gemm");
  f.check("eager before capture");
  tlc::WorldGraph graphs(world, call);
  if (transport != tlc::Transport::kVirtual && comm_sms == 0 && !unfused) {
    const int r = world.local_ranks().front();
    EXPECT_EQ(op.comm_sms(r), mode == CommMode::kPull ? tlc::AgGemm::kGraphPullSms : 0);
    EXPECT_EQ(op.gemm_sms(r),
              world.sm_count(r) - (mode == CommMode::kPull ? tlc::AgGemm::kGraphPullSms
                                                           : tlc::AgGemm::kGraphSignalSms));
  }
  for (int i = 0; i < 4; ++i) {
    f.refresh(10 + i, &op);
    graphs.replay(i % 2 == 1);  // both launch orders; the first replay in rank order
    world.sync("ag_gemm (graph)");
    f.check("replay");
    f.refresh(20 + i, &op);
    call();  // eager after replays: same counter
    world.sync("ag_gemm");
    f.check("eager between replays");
  }
}

TEST(GraphCuda, AgGemmWorld2Fused) { ag_graph_case(2, {333, 667}, false); }
TEST(GraphCuda, AgGemmWorld4Fused) { ag_graph_case(4, {100, 0, 300, 129}, false); }
TEST(GraphCuda, AgGemmWorld2Unfused) { ag_graph_case(2, {256, 300}, true); }
TEST(GraphCuda, AgGemmWorld1) { ag_graph_case(1, {300}, false); }
// Two GPUs, one process, every replay's graphs launched from one thread (rank order, then the other
// way round). The copy engine's comm program: in graph mode the GEMM leaves kGraphSignalSms to the
// one-thread signal kernels beside it, and a pull moves its tiles on kGraphPullSms SMs (a captured
// copy-engine pull hung on its first replay in rank order: ag_gemm_cuda.cu, AgGemm::comm_sms).
TEST(GraphCudaPeer, AgGemmPull) {
  TL_SKIP_UNLESS_GPUS(2);
  ag_graph_case(2, {333, 667}, false, 0, tlc::Transport::kPeer, CommMode::kPull);
}
TEST(GraphCudaPeer, AgGemmPush) {
  TL_SKIP_UNLESS_GPUS(2);
  ag_graph_case(2, {512, 300}, false, 0, tlc::Transport::kPeer, CommMode::kPush);
  ag_graph_case(2, {333, 667}, false, 0, tlc::Transport::kPeer, CommMode::kPush);
}
TEST(GraphCudaPeer, AgGemmUnfused) {
  TL_SKIP_UNLESS_GPUS(2);
  ag_graph_case(2, {256, 256}, true, 0, tlc::Transport::kPeer);
}

TEST(GraphCudaPeer, AgGemmSmComm) {
  TL_SKIP_UNLESS_GPUS(2);
  ag_graph_case(2, {333, 667}, false, 4, tlc::Transport::kPeer, CommMode::kPull);
}

TEST(GraphCuda, AgGemm10kCallsEagerThenGraph) {
  tlc::World world = make_world(2);
  AgFixture f(world, {200, 312}, 256, 128);
  AgGemmConfig cfg;
  cfg.comm_workers = 0;
  cfg.compute_workers = 0;
  cfg.comm_tile_rows = 128;
  tlc::AgGemm op(world, f.rows, std::vector<int64_t>(2, f.n_r), f.k, DType::kBF16, cfg);
  f.refresh(5, &op);
  for (int i = 0; i < kLongRun; ++i) {
    op.run(f.ca(), f.cb(), f.c);
    if ((i + 1) % kSyncEvery == 0) world.sync("ag_gemm (eager long run)");
  }
  world.sync("ag_gemm (eager long run)");
  f.check("after 10000 eager calls");
  f.refresh(6, &op);
  op.run(f.ca(), f.cb(), f.c);
  world.sync("ag_gemm");
  f.check("eager call 10001 on fresh inputs");

  tlc::WorldGraph graphs(world, [&] { op.run(f.ca(), f.cb(), f.c); });
  f.refresh(7, &op);
  for (int i = 0; i < kLongRun; ++i) {
    graphs.replay();
    if ((i + 1) % kSyncEvery == 0) world.sync("ag_gemm (graph long run)");
  }
  world.sync("ag_gemm (graph long run)");
  f.check("after 10000 replays");
  f.refresh(8, &op);
  graphs.replay();
  world.sync("ag_gemm (graph)");
  f.check("replay 10001 on fresh inputs");
}

// ---- GEMM+RS ------------------------------------------------------------------------------------
struct RsFixture {
  tlc::World& world;
  RowPartition rows;
  int64_t n;
  std::vector<int64_t> ks;
  std::vector<void*> a, b, c;
  std::vector<double> full;

  RsFixture(tlc::World& w, std::vector<int64_t> split, int64_t n_, std::vector<int64_t> k_split)
      : world(w), rows(RowPartition::from_counts(split)), n(n_), ks(std::move(k_split)) {
    const int W = world.size();
    a.assign(W, nullptr);
    b.assign(W, nullptr);
    c.assign(W, nullptr);
    for (int r = 0; r < W; ++r) {
      world.bind(r);
      TL_CUDA_CHECK(cudaMalloc(&a[r], rows.total() * ks[r] * 2));
      TL_CUDA_CHECK(cudaMalloc(&b[r], n * ks[r] * 2));
      TL_CUDA_CHECK(cudaMalloc(&c[r], rows.size(r) * n * 2 + 16));
    }
  }
  ~RsFixture() {
    for (int r = 0; r < world.size(); ++r) {
      world.bind(r);
      cudaFree(a[r]);
      cudaFree(b[r]);
      cudaFree(c[r]);
    }
  }
  std::vector<const void*> ca() const { return {a.begin(), a.end()}; }
  std::vector<const void*> cb() const { return {b.begin(), b.end()}; }

  void refresh(uint64_t seed) {
    std::mt19937_64 rng(seed);
    const int64_t M = rows.total();
    int64_t K = 0;
    for (int64_t k : ks) K += k;
    std::vector<BF16> a_cat(M * K), b_cat(n * K);
    int64_t k0 = 0;
    for (int r = 0; r < world.size(); ++r) {
      const int64_t kr = ks[r];
      auto ha = random_bf16(M * kr, rng), hb = random_bf16(n * kr, rng);
      for (int64_t i = 0; i < M; ++i) std::memcpy(&a_cat[i * K + k0], &ha[i * kr], kr * 2);
      for (int64_t i = 0; i < n; ++i) std::memcpy(&b_cat[i * K + k0], &hb[i * kr], kr * 2);
      k0 += kr;
      world.bind(r);
      TL_CUDA_CHECK(cudaDeviceSynchronize());
      TL_CUDA_CHECK(cudaMemcpy(a[r], ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
      TL_CUDA_CHECK(cudaMemcpy(b[r], hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
      TL_CUDA_CHECK(cudaMemset(c[r], 0xff, rows.size(r) * n * 2));
      TL_CUDA_CHECK(cudaDeviceSynchronize());
    }
    full = gemm_reference_f64(a_cat.data(), b_cat.data(), DType::kBF16, M, n, K);
  }
  void check(const char* what) {
    for (int r = 0; r < world.size(); ++r) {
      const int64_t mr = rows.size(r);
      if (mr == 0) continue;
      std::vector<BF16> out(mr * n);
      world.bind(r);
      TL_CUDA_CHECK(cudaMemcpy(out.data(), c[r], out.size() * 2, cudaMemcpyDeviceToHost));
      std::vector<double> ref(full.begin() + rows.begin(r) * n, full.begin() + rows.end(r) * n);
      EXPECT_LT(relative_error(out.data(), DType::kBF16, ref), 1e-2) << what << ", rank " << r;
    }
  }
};

void rs_graph_case(int W, std::vector<int64_t> split, std::vector<int64_t> ks, bool unfused,
                   CommMode mode = CommMode::kPull,
                   tlc::Transport transport = tlc::Transport::kVirtual) {
  SCOPED_TRACE(::testing::Message() << "world " << W << (unfused ? " unfused" : " fused")
                                    << (mode == CommMode::kPush ? " push" : " pull") << " "
                                    << tlc::transport_name(transport));
  tlc::World world = make_world(W, transport);
  RsFixture f(world, split, 512, ks);
  GemmRsConfig cfg;
  cfg.comm_workers = 2;
  cfg.compute_workers = 0;
  cfg.comm_tile_rows = 64;
  cfg.comm_tile_cols = 256;
  cfg.mode = mode;
  tlc::GemmRs op(world, f.rows, f.n, f.ks, DType::kBF16, cfg);
  auto call = [&] { unfused ? op.run_unfused(f.ca(), f.cb(), f.c) : op.run(f.ca(), f.cb(), f.c); };
  f.refresh(1);
  call();
  world.sync("gemm_rs");
  f.check("eager before capture");
  tlc::WorldGraph graphs(world, call);
  for (int i = 0; i < 4; ++i) {
    f.refresh(10 + i);
    graphs.replay(i % 2 == 1);
    world.sync("gemm_rs (graph)");
    f.check("replay");
    f.refresh(20 + i);
    call();
    world.sync("gemm_rs");
    f.check("eager between replays");
  }
}

TEST(GraphCuda, GemmRsWorld2Fused) { rs_graph_case(2, {300, 212}, {256, 128}, false); }
TEST(GraphCuda, GemmRsWorld4Fused) { rs_graph_case(4, {200, 0, 1, 300}, {128, 64, 192, 128}, false); }
TEST(GraphCuda, GemmRsWorld2Unfused) { rs_graph_case(2, {256, 256}, {128, 128}, true); }
TEST(GraphCuda, GemmRsWorld4Push) { rs_graph_case(4, {200, 0, 1, 300}, {128, 64, 192, 128}, false, CommMode::kPush); }
TEST(GraphCuda, GemmRsWorld1) { rs_graph_case(1, {300}, {256}, false); }
TEST(GraphCudaPeer, GemmRsTwoGpus) {
  TL_SKIP_UNLESS_GPUS(2);
  rs_graph_case(2, {300, 212}, {256, 128}, false, CommMode::kPull, tlc::Transport::kPeer);
  rs_graph_case(2, {256, 256}, {128, 192}, false, CommMode::kPush, tlc::Transport::kPeer);
  rs_graph_case(2, {256, 256}, {128, 128}, true, CommMode::kPull, tlc::Transport::kPeer);
}

TEST(GraphCuda, GemmRs10kCallsEagerThenGraph) {
  tlc::World world = make_world(2);
  RsFixture f(world, {256, 200}, 256, {128, 128});
  GemmRsConfig cfg;
  cfg.comm_workers = 2;
  cfg.compute_workers = 0;
  cfg.comm_tile_rows = 128;
  cfg.comm_tile_cols = 256;
  tlc::GemmRs op(world, f.rows, f.n, f.ks, DType::kBF16, cfg);
  f.refresh(5);
  for (int i = 0; i < kLongRun; ++i) {
    op.run(f.ca(), f.cb(), f.c);
    if ((i + 1) % kSyncEvery == 0) world.sync("gemm_rs (eager long run)");
  }
  world.sync("gemm_rs (eager long run)");
  f.check("after 10000 eager calls");
  tlc::WorldGraph graphs(world, [&] { op.run(f.ca(), f.cb(), f.c); });
  f.refresh(7);
  for (int i = 0; i < kLongRun; ++i) {
    graphs.replay();
    if ((i + 1) % kSyncEvery == 0) world.sync("gemm_rs (graph long run)");
  }
  world.sync("gemm_rs (graph long run)");
  f.check("after 10000 replays");
  f.refresh(8);
  graphs.replay();
  world.sync("gemm_rs (graph)");
  f.check("replay 10001 on fresh inputs");
}

// Last: the SM-driven comm kernel (launched before the engine) under capture.
TEST(GraphCuda, AgGemmWorld4SmComm) { ag_graph_case(4, {100, 0, 300, 129}, false, 4); }

}  // namespace
