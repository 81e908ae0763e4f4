// The communication halves of AG+GEMM and GEMM+RS on the CUDA backend give the same bits as the CPU
// backend's programs: over the virtual transport (one GPU) for world sizes 1..8 and ragged shapes,
// and over the peer transport (one process, one GPU per rank) for world sizes 2..GPUs (skipped, with
// the GPU count in the message, on a machine of one GPU).
//   AG: the gathered A of every rank after the CUDA comm program == cpu::AgGemm::gathered().
//   RS: given fixed partials P_r, the CUDA reduce output == cpu::GemmRs with A_r = P_r and
//       B_r = I (so the CPU's "GEMM" reproduces P_r exactly and its reduce program does the rest).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "../support/gpu.hpp"
#include "tilelink/backend/cpu/ops.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/ops/cuda/comm.hpp"

using namespace tilelink;
using tilelink::test::gpu_count;
namespace tlc = tilelink::cuda;

namespace {

std::vector<std::byte> random_matrix(std::mt19937& rng, DType dt, int64_t rows, int64_t cols) {
  std::vector<std::byte> m(static_cast<size_t>(rows * cols * dtype_size(dt)));
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (int64_t i = 0; i < rows * cols; ++i) store_from_float(m.data(), dt, i, u(rng));
  return m;
}

struct DeviceBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuf(size_t n) : bytes(n) { TL_CUDA_CHECK(cudaMalloc(&p, n ? n : 16)); }
  ~DeviceBuf() { cudaFree(p); }
  void upload(const std::vector<std::byte>& h) { TL_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice)); }
  std::vector<std::byte> download(size_t n) const {
    std::vector<std::byte> h(n);
    TL_CUDA_CHECK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
    return h;
  }
};

// Rank r's device current (allocations, memsets); a virtual world's ranks all share one GPU.
void on_rank(const tlc::World& w, int r) { TL_CUDA_CHECK(cudaSetDevice(w.device(r))); }

// Every GPU of the world idle.
void sync_devices(const tlc::World& w) {
  for (int r : w.local_ranks()) {
    on_rank(w, r);
    TL_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

RowPartition ragged(std::mt19937& rng, int world, int64_t max_rows) {
  std::vector<int64_t> counts(world);
  std::uniform_int_distribution<int64_t> u(0, max_rows);
  int64_t total = 0;
  for (auto& c : counts) total += (c = u(rng));
  if (total == 0) counts[world - 1] = 1;
  return RowPartition::from_counts(counts);
}

struct AgCase {
  int world;
  DType dtype;
  int64_t k;
  CommMode mode;
  tlc::CopyMethod method;
  tlc::Transport transport = tlc::Transport::kVirtual;
};

void run_ag_case(const AgCase& tc, uint32_t seed) {
  std::mt19937 rng(seed);
  const RowPartition rows = ragged(rng, tc.world, 300);
  AgGemmConfig cfg;
  cfg.mode = tc.mode;
  cfg.comm_tile_rows = 48;
  cfg.gemm_tile_m = 64;
  cfg.gemm_tile_n = 16;
  const std::vector<int64_t> n_per_rank(tc.world, 8);

  // CPU backend.
  cpu::World cw(tc.world);
  cpu::AgGemm cop(cw, rows, n_per_rank, tc.k, tc.dtype, cfg);
  // GPU backend, same plans.
  tlc::World gw({.transport = tc.transport, .world_size = tc.world});
  std::vector<AgGemmPlan> plans;
  for (int r = 0; r < tc.world; ++r) plans.push_back(AgGemmPlan::make(r, rows, 8, tc.k, tc.dtype, cfg));
  tlc::SymmetricBuffer ws = gw.allocate(plans[0].ws.num_bytes);
  const size_t gathered_bytes = static_cast<size_t>(rows.total() * tc.k * dtype_size(tc.dtype));

  for (uint64_t epoch = 1; epoch <= 2; ++epoch) {  // fresh data each call; signals never reset
    std::vector<std::vector<std::byte>> a, b;
    std::vector<std::vector<std::byte>> c(tc.world);
    std::vector<std::unique_ptr<DeviceBuf>> a_dev;
    for (int r = 0; r < tc.world; ++r) {
      a.push_back(random_matrix(rng, tc.dtype, rows.size(r), tc.k));
      b.push_back(random_matrix(rng, tc.dtype, 8, tc.k));
      c[r].resize(static_cast<size_t>(rows.total() * 8 * dtype_size(tc.dtype)));
      on_rank(gw, r);
      a_dev.push_back(std::make_unique<DeviceBuf>(a[r].size()));
      a_dev[r]->upload(a[r]);
      // Poison the gathered buffer.
      TL_CUDA_CHECK(cudaMemset(plans[r].ag.f.gathered.in(ws.base(r)), 0xff, gathered_bytes));
    }
    sync_devices(gw);
    cw.run([&](cpu::RankContext& ctx) {
      cop.run(ctx, a[ctx.rank].data(), b[ctx.rank].data(), c[ctx.rank].data());
    });
    for (int r = 0; r < tc.world; ++r)
      tlc::launch_allgather(gw, plans[r].ag, plans[r].ws.barrier, ws.view(r), a_dev[r]->p, epoch, {tc.method, 3, 256});
    gw.sync("allgather");
    for (int r = 0; r < tc.world; ++r) {
      std::vector<std::byte> got(gathered_bytes);
      TL_CUDA_CHECK(cudaMemcpy(got.data(), plans[r].ag.f.gathered.in(ws.base(r)), gathered_bytes,
                               cudaMemcpyDeviceToHost));
      ASSERT_EQ(0, std::memcmp(got.data(), cop.gathered(r), gathered_bytes))
          << "rank " << r << " epoch " << epoch << " world " << tc.world << " k " << tc.k
          << " method " << tlc::copy_method_name(tc.method) << " transport "
          << tlc::transport_name(tc.transport);
    }
  }
}

struct RsCase {
  int world;
  DType dtype;
  int64_t n;
  CommMode mode;
  tlc::Transport transport = tlc::Transport::kVirtual;
};

void run_rs_case(const RsCase& tc, uint32_t seed) {
  std::mt19937 rng(seed);
  const RowPartition rows = ragged(rng, tc.world, 200);
  GemmRsConfig cfg;
  cfg.mode = tc.mode;
  cfg.comm_tile_rows = 40;
  cfg.comm_tile_cols = 64;
  cfg.gemm_tile_m = 64;
  cfg.gemm_tile_n = 32;
  const int64_t m = rows.total(), n = tc.n;
  const std::vector<int64_t> k_per_rank(tc.world, n);  // A_r = P_r [M, N], B_r = I [N, N]

  std::vector<std::byte> eye(static_cast<size_t>(n * n * dtype_size(tc.dtype)));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) store_from_float(eye.data(), tc.dtype, i * n + j, i == j ? 1.f : 0.f);

  cpu::World cw(tc.world);
  cpu::GemmRs cop(cw, rows, n, k_per_rank, tc.dtype, cfg);
  tlc::World gw({.transport = tc.transport, .world_size = tc.world});
  std::vector<GemmRsPlan> plans;
  for (int r = 0; r < tc.world; ++r) plans.push_back(GemmRsPlan::make(r, rows, n, n, tc.dtype, cfg));
  tlc::SymmetricBuffer ws = gw.allocate(plans[0].ws.num_bytes);

  for (uint64_t epoch = 1; epoch <= 2; ++epoch) {
    std::vector<std::vector<std::byte>> partial, c_cpu(tc.world);
    std::vector<std::unique_ptr<DeviceBuf>> p_dev, c_dev;
    for (int r = 0; r < tc.world; ++r) {
      partial.push_back(random_matrix(rng, tc.dtype, m, n));
      const size_t cb = static_cast<size_t>(rows.size(r) * n * dtype_size(tc.dtype));
      c_cpu[r].resize(cb);
      on_rank(gw, r);
      p_dev.push_back(std::make_unique<DeviceBuf>(partial[r].size()));
      p_dev[r]->upload(partial[r]);
      c_dev.push_back(std::make_unique<DeviceBuf>(cb));
      TL_CUDA_CHECK(cudaMemset(c_dev[r]->p, 0xff, cb ? cb : 16));  // poison
    }
    sync_devices(gw);
    cw.run([&](cpu::RankContext& ctx) {
      cop.run(ctx, partial[ctx.rank].data(), eye.data(), c_cpu[ctx.rank].data());
    });
    for (int r = 0; r < tc.world; ++r) {
      tlc::launch_rs_publish(gw, plans[r], ws.view(r), p_dev[r]->p, epoch, {tlc::CopyMethod::kVector, 2, 256});
      tlc::launch_reduce_scatter(gw, plans[r].rs, ws.view(r), c_dev[r]->p, epoch, {tlc::CopyMethod::kVector, 3, 256});
    }
    gw.sync("rs_comm");
    for (int r = 0; r < tc.world; ++r) {
      std::vector<std::byte> got = c_dev[r]->download(c_cpu[r].size());
      ASSERT_EQ(0, std::memcmp(got.data(), c_cpu[r].data(), got.size()))
          << "rank " << r << " epoch " << epoch << " world " << tc.world << " n " << n << " transport "
          << tlc::transport_name(tc.transport);
    }
  }
}

}  // namespace

TEST(CommAg, MatchesCpuEveryWorldSizeAndMethod) {
  uint32_t seed = 1;
  for (int world = 1; world <= 8; ++world)
    for (auto method : {tlc::CopyMethod::kVector, tlc::CopyMethod::kBulk, tlc::CopyMethod::kCopyEngine}) {
      SCOPED_TRACE(testing::Message() << "world " << world << " " << tlc::copy_method_name(method));
      run_ag_case({world, DType::kBF16, 136, CommMode::kPull, method}, seed++);
      if (method != tlc::CopyMethod::kCopyEngine)
        run_ag_case({world, DType::kBF16, 136, CommMode::kPush, method}, seed++);
    }
}

TEST(CommAg, UnalignedRowsAndFp32) {
  // 67 bf16 = 134-byte rows: no 16-byte vectors, the bulk path falls back too.
  for (int world : {2, 3, 5})
    for (auto method : {tlc::CopyMethod::kVector, tlc::CopyMethod::kBulk}) {
      run_ag_case({world, DType::kBF16, 67, CommMode::kPull, method}, 100 + world);
      run_ag_case({world, DType::kF32, 100, CommMode::kPush, method}, 200 + world);
    }
}

TEST(CommRs, MatchesCpuEveryWorldSize) {
  uint32_t seed = 1000;
  for (int world = 1; world <= 8; ++world)
    for (CommMode mode : {CommMode::kPull, CommMode::kPush}) {
      SCOPED_TRACE(testing::Message() << "world " << world << (mode == CommMode::kPush ? " push" : " pull"));
      run_rs_case({world, DType::kBF16, 200, mode}, seed++);
    }
}

TEST(CommRs, UnalignedColumnsAndOtherDtypes) {
  for (int world : {2, 3, 7}) {
    run_rs_case({world, DType::kBF16, 77, CommMode::kPull}, 300 + world);
    run_rs_case({world, DType::kF32, 96, CommMode::kPush}, 400 + world);
    run_rs_case({world, DType::kF16, 130, CommMode::kPull}, 500 + world);
  }
}

// ---- peer transport: one process, one GPU per rank (NVLink / PCIe peer access) ----------------------

TEST(CommPeer, AgMatchesCpuOnSeveralGpus) {
  TL_SKIP_UNLESS_GPUS(2);
  const int gpus = gpu_count();
  const auto peer = tlc::Transport::kPeer;
  uint32_t seed = 2000;
  for (int world = 2; world <= std::min(gpus, 8); ++world) {
    for (auto method : {tlc::CopyMethod::kVector, tlc::CopyMethod::kBulk, tlc::CopyMethod::kCopyEngine}) {
      SCOPED_TRACE(testing::Message() << "peer world " << world << " " << tlc::copy_method_name(method));
      run_ag_case({world, DType::kBF16, 136, CommMode::kPull, method, peer}, seed++);
      if (method != tlc::CopyMethod::kCopyEngine) {
        run_ag_case({world, DType::kBF16, 136, CommMode::kPush, method, peer}, seed++);
        run_ag_case({world, DType::kBF16, 67, CommMode::kPull, method, peer}, seed++);  // unaligned rows
        run_ag_case({world, DType::kF32, 100, CommMode::kPush, method, peer}, seed++);
      }
    }
  }
}

TEST(CommPeer, RsMatchesCpuOnSeveralGpus) {
  TL_SKIP_UNLESS_GPUS(2);
  const int gpus = gpu_count();
  const auto peer = tlc::Transport::kPeer;
  uint32_t seed = 3000;
  for (int world = 2; world <= std::min(gpus, 8); ++world) {
    SCOPED_TRACE(testing::Message() << "peer world " << world);
    for (CommMode mode : {CommMode::kPull, CommMode::kPush}) {
      run_rs_case({world, DType::kBF16, 200, mode, peer}, seed++);
      run_rs_case({world, DType::kBF16, 77, mode, peer}, seed++);
    }
    run_rs_case({world, DType::kF32, 96, CommMode::kPush, peer}, seed++);
    run_rs_case({world, DType::kF16, 130, CommMode::kPull, peer}, seed++);
  }
}

TEST(CommAg, RefusesTooManyWorkers) {
  tlc::World gw({.transport = tlc::Transport::kVirtual, .world_size = 2});
  RowPartition rows = RowPartition::even(64, 2);
  AgGemmPlan p = AgGemmPlan::make(0, rows, 8, 64, DType::kBF16, AgGemmConfig{});
  tlc::SymmetricBuffer ws = gw.allocate(p.ws.num_bytes);
  test::expect_refused([&] { tlc::launch_allgather(gw, p.ag, p.ws.barrier, ws.view(0), ws.base(0), 1,
                                              {tlc::CopyMethod::kVector, gw.sm_count(0) + 1, 256}); },
                 "a spinning kernel must fit in its SMs");
  test::expect_refused([&] { tlc::launch_allgather(gw, p.ag, p.ws.barrier, ws.view(0), ws.base(0), 0,
                                              {tlc::CopyMethod::kVector, 2, 256}); },
                 "epochs start at 1");
  AgGemmPlan push = AgGemmPlan::make(0, rows, 8, 64, DType::kBF16, AgGemmConfig{.mode = CommMode::kPush});
  test::expect_refused([&] { tlc::launch_allgather(gw, push.ag, push.ws.barrier, ws.view(0), ws.base(0), 1,
                                              {tlc::CopyMethod::kCopyEngine, 0}); },
                 "the copy engine runs the pull program only");
}
