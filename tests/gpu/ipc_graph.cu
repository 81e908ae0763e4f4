// The fused ops in CUDA graphs on the ipc transport: one process per rank (mpirun -np 2), each
// capturing its own call on its own stream and replaying it. Per case: an eager call, a capture,
// then four rounds of (fresh inputs, outputs and AG's gathered buffer poisoned, a replay, a check,
// an eager call, a check), every check against a float64 reference of all ranks' inputs (generated
// from seeds every rank knows). Cases: AG+GEMM pull and push on the copy engine (push with the own
// rows on tile rows and off them), GEMM+RS pull and push. Without MPI in the build it reports a
// skip.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../support/mpi_main.hpp"
#include "../support/random.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/ops/ag_gemm_cuda.hpp"
#include "tilelink/ops/gemm_rs_cuda.hpp"

#if defined(TILELINK_HAS_MPI)
#include <mpi.h>
#endif

using namespace tilelink;
namespace tlc = tilelink::cuda;

#if defined(TILELINK_HAS_MPI)
namespace {

constexpr double kTolerance = 1e-2;

std::vector<BF16> seeded_bf16(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return test::random_bf16(n, rng);
}

void* upload(const std::vector<BF16>& h) {
  void* d = nullptr;
  TL_CUDA_CHECK(cudaMalloc(&d, h.size() * 2));
  if (!h.empty()) TL_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

// One process's graph of `call` on `stream`: eager first, then capture, then rounds of `refresh`,
// replay, `check`, eager call, `check`. Returns the failed checks.
int graph_rounds(tlc::World& w, const std::string& name, const std::function<void()>& call,
                 const std::function<void(int)>& refresh,
                 const std::function<bool(const char*)>& check) {
  const int me = w.local_ranks().front();
  cudaStream_t s = w.stream(me);
  int failures = 0;
  auto settle = [&] {  // this rank's work done, then every rank's
    TL_CUDA_CHECK(cudaStreamSynchronize(s));
    MPI_Barrier(MPI_COMM_WORLD);
  };
  refresh(1);
  MPI_Barrier(MPI_COMM_WORLD);
  call();
  settle();
  failures += !check("eager before capture");
  TL_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  call();
  cudaGraph_t g = nullptr;
  cudaGraphExec_t e = nullptr;
  TL_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  TL_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  for (int i = 0; i < 4; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);  // no peer still reads what refresh rewrites
    refresh(10 + i);
    MPI_Barrier(MPI_COMM_WORLD);
    TL_CUDA_CHECK(cudaGraphLaunch(e, s));
    settle();
    failures += !check("replay");
    refresh(20 + i);
    MPI_Barrier(MPI_COMM_WORLD);
    call();
    settle();
    failures += !check("eager between replays");
  }
  TL_CUDA_CHECK(cudaGraphExecDestroy(e));
  TL_CUDA_CHECK(cudaGraphDestroy(g));
  std::printf("ipc_graph rank %d/%d %s: %s\n", me, w.size(), name.c_str(),
              failures ? "FAILED" : "OK");
  return failures;
}

int ag_case(tlc::World& w, std::vector<int64_t> split, CommMode mode) {
  const int me = w.local_ranks().front(), W = w.size();
  const RowPartition rows = RowPartition::from_counts(split);
  const int64_t n_r = 256, k = 512, M = rows.total();
  AgGemmConfig cfg;
  cfg.comm_workers = 0;  // the copy engine
  cfg.compute_workers = 0;
  cfg.comm_tile_rows = 128;
  cfg.mode = mode;
  tlc::AgGemm op(w, rows, std::vector<int64_t>(W, n_r), k, DType::kBF16, cfg);
  const std::vector<BF16> hb = seeded_bf16(n_r * k, 500 + me);
  std::vector<void*> a(W, nullptr), b(W, nullptr), c(W, nullptr);
  b[me] = upload(hb);
  TL_CUDA_CHECK(
      cudaMalloc(&a[me], rows.size(me) * k * 2 + 16));  // a graph bakes the pointers: in place
  TL_CUDA_CHECK(cudaMalloc(&c[me], M * n_r * 2));
  std::vector<BF16> a_full;
  auto refresh = [&](int round) {
    TL_CUDA_CHECK(cudaDeviceSynchronize());
    a_full.clear();
    for (int r = 0; r < W; ++r) {
      auto ha = seeded_bf16(rows.size(r) * k, 1000 * round + r);
      a_full.insert(a_full.end(), ha.begin(), ha.end());
      if (r == me && !ha.empty())
        TL_CUDA_CHECK(cudaMemcpy(a[me], ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    }
    TL_CUDA_CHECK(cudaMemset(c[me], 0xff, M * n_r * 2));
    TL_CUDA_CHECK(cudaMemset(const_cast<void*>(op.gathered(me)), 0xff, M * k * 2));
    TL_CUDA_CHECK(cudaDeviceSynchronize());
  };
  auto check = [&](const char* what) {
    std::vector<BF16> out(M * n_r);
    TL_CUDA_CHECK(cudaMemcpy(out.data(), c[me], out.size() * 2, cudaMemcpyDeviceToHost));
    const double err =
        relative_error(out.data(), DType::kBF16,
                       gemm_reference_f64(a_full.data(), hb.data(), DType::kBF16, M, n_r, k));
    if (err < kTolerance) return true;
    std::fprintf(stderr, "ipc_graph rank %d: ag_gemm %s: relative error %.3e\n", me, what, err);
    return false;
  };
  std::string name =
      std::string("ag_gemm ") + (mode == CommMode::kPush ? "push" : "pull") + " split";
  for (int64_t s : split) name += " " + std::to_string(s);
  const std::vector<const void*> cb(b.begin(), b.end());
  const int failures = graph_rounds(
      w, name, [&] { op.run(std::vector<const void*>(a.begin(), a.end()), cb, c); }, refresh,
      check);
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  cudaFree(a[me]);
  cudaFree(b[me]);
  cudaFree(c[me]);
  return failures;
}

int rs_case(tlc::World& w, std::vector<int64_t> split, std::vector<int64_t> ks, CommMode mode) {
  const int me = w.local_ranks().front(), W = w.size();
  const RowPartition rows = RowPartition::from_counts(split);
  const int64_t n = 512, M = rows.total();
  GemmRsConfig cfg;
  cfg.comm_workers = 2;
  cfg.compute_workers = 0;
  cfg.comm_tile_rows = 64;
  cfg.comm_tile_cols = 256;
  cfg.mode = mode;
  tlc::GemmRs op(w, rows, n, ks, DType::kBF16, cfg);
  std::vector<void*> a(W, nullptr), b(W, nullptr), c(W, nullptr);
  TL_CUDA_CHECK(cudaMalloc(&c[me], rows.size(me) * n * 2 + 16));
  TL_CUDA_CHECK(cudaMalloc(&a[me], M * ks[me] * 2));  // a graph bakes the pointers: in place
  TL_CUDA_CHECK(cudaMalloc(&b[me], n * ks[me] * 2));
  std::vector<double> want;  // this rank's rows of sum_r A_r B_r^T
  auto refresh = [&](int round) {
    TL_CUDA_CHECK(cudaDeviceSynchronize());
    want.assign(rows.size(me) * n, 0.0);
    for (int r = 0; r < W; ++r) {
      auto ha = seeded_bf16(M * ks[r], 2000 * round + r),
           hb = seeded_bf16(n * ks[r], 3000 * round + r);
      const auto full = gemm_reference_f64(ha.data(), hb.data(), DType::kBF16, M, n, ks[r]);
      for (size_t i = 0; i < want.size(); ++i) want[i] += full[rows.begin(me) * n + i];
      if (r == me) {
        TL_CUDA_CHECK(cudaMemcpy(a[me], ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
        TL_CUDA_CHECK(cudaMemcpy(b[me], hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
      }
    }
    TL_CUDA_CHECK(cudaMemset(c[me], 0xff, rows.size(me) * n * 2));
    TL_CUDA_CHECK(cudaDeviceSynchronize());
  };
  auto check = [&](const char* what) {
    std::vector<BF16> out(rows.size(me) * n);
    TL_CUDA_CHECK(cudaMemcpy(out.data(), c[me], out.size() * 2, cudaMemcpyDeviceToHost));
    const double err = relative_error(out.data(), DType::kBF16, want);
    if (err < kTolerance) return true;
    std::fprintf(stderr, "ipc_graph rank %d: gemm_rs %s: relative error %.3e\n", me, what, err);
    return false;
  };
  const std::string name = std::string("gemm_rs ") + (mode == CommMode::kPush ? "push" : "pull");
  const int failures = graph_rounds(
      w, name,
      [&] {
        op.run(std::vector<const void*>(a.begin(), a.end()),
               std::vector<const void*>(b.begin(), b.end()), c);
      },
      refresh, check);
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  cudaFree(a[me]);
  cudaFree(b[me]);
  cudaFree(c[me]);
  return failures;
}

}  // namespace
#endif

int main(int argc, char** argv) {
  return tilelink::test::mpi_main(argc, argv, "ipc_graph", [] {
#if defined(TILELINK_HAS_MPI)
    tlc::WorldOptions wo;
    wo.transport = tlc::Transport::kIpc;
    wo.timeout = std::chrono::milliseconds(10000);
    tlc::World w(wo);
    TL_REQUIRE(w.size() == 2, "ipc_graph runs with 2 ranks (mpirun -np 2), got " << w.size());
    int failures = ag_case(w, {333, 667}, CommMode::kPull);
    failures += ag_case(w, {512, 300}, CommMode::kPush);  // own rows on tile rows: read from A_r
    failures += ag_case(w, {333, 667}, CommMode::kPush);  // off tile rows: copied first
    failures += rs_case(w, {300, 212}, {256, 128}, CommMode::kPull);
    failures += rs_case(w, {256, 256}, {128, 192}, CommMode::kPush);
    return failures;
#else
    return 0;
#endif
  });
}
