// The ipc transport (mpirun -np 2): processes given different arguments are refused on every rank,
// within seconds, before anything launches, with a message naming what differs and where; then
// the same world runs the op with agreeing arguments. Cases: another N, another M split, another
// K_r, another config, and another symmetric allocation size.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "../support/mpi_main.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/gemm_ar_cuda.hpp"
#include "tilelink/ops/gemm_rs_cuda.hpp"

using namespace tilelink;
namespace tlc = tilelink::cuda;

namespace {

// Runs `make` on this rank; expects an Error whose message holds `want`, within 10 s.
template <class Make>
int expect_refused(int me, const char* what, const std::string& want, Make&& make) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    make();
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string m = e.what();
    const bool ok = m.find(want) != std::string::npos && s < 10;
    std::printf("ipc_agreement rank %d, %s: %s in %.2f s: %s\n", me, what, ok ? "refused" : "WRONG REFUSAL", s,
                m.c_str());
    return ok ? 0 : 1;
  }
  std::printf("ipc_agreement rank %d, %s: NOT REFUSED\n", me, what);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  return tilelink::test::mpi_main(argc, argv, "ipc_agreement", [] {
    int failures = 0;
#if defined(TILELINK_HAS_MPI)
    tlc::World w({.transport = tlc::Transport::kIpc, .timeout = std::chrono::seconds(5)});
    const int me = w.local_ranks().at(0);
    if (w.size() != 2) {
      std::printf("ipc_agreement: needs 2 ranks, got %d\n", w.size());
      return 1;
    }
    const int64_t M = 256, K = 64;
    failures += expect_refused(me, "N differs", "disagree on N: 256 on rank 0, 128 on rank 1", [&] {
      tlc::GemmAr op(w, RowPartition::even(M, 2), me == 0 ? 256 : 128, {K, K}, DType::kBF16, GemmArConfig{});
    });
    failures += expect_refused(me, "M split differs", "disagree on M rows[0]: 128 on rank 0, 100 on rank 1", [&] {
      tlc::GemmAr op(w, me == 0 ? RowPartition::even(M, 2) : RowPartition::from_counts(std::vector<int64_t>{100, 156}), 256, {K, K},
                     DType::kBF16, GemmArConfig{});
    });
    failures += expect_refused(me, "K_r differs", "disagree on K[1]: 64 on rank 0, 128 on rank 1", [&] {
      tlc::GemmRs op(w, RowPartition::even(M, 2), 256, {K, me == 0 ? K : 2 * K}, DType::kBF16, GemmRsConfig{});
    });
    failures += expect_refused(me, "config differs", "disagree on comm_workers: 4 on rank 0, 6 on rank 1", [&] {
      GemmArConfig cfg;
      cfg.comm_workers = me == 0 ? 4 : 6;
      tlc::GemmAr op(w, RowPartition::even(M, 2), 256, {K, K}, DType::kBF16, cfg);
    });
    failures += expect_refused(me, "allocation size differs", "symmetric allocation of", [&] {
      tlc::SymmetricBuffer b = w.allocate(me == 0 ? 4096 : 8192);
    });
    // The same world, agreeing arguments: the op is made and runs.
    try {
      tlc::GemmAr op(w, RowPartition::even(M, 2), 256, {K, K}, DType::kBF16, GemmArConfig{});
      void* p = nullptr;
      TL_CUDA_CHECK(cudaMalloc(&p, (M * K + 256 * K + M * 256) * 2));
      TL_CUDA_CHECK(cudaMemset(p, 0, (M * K + 256 * K) * 2));
      std::vector<const void*> a(2), b(2);
      std::vector<void*> c(2);
      a[me] = p, b[me] = static_cast<char*>(p) + M * K * 2, c[me] = static_cast<char*>(p) + (M + 256) * K * 2;
      op.run(a, b, c);
      w.barrier("gemm_ar");
      TL_CUDA_CHECK(cudaFree(p));
      std::printf("ipc_agreement rank %d: agreeing op ran\n", me);
    } catch (const std::exception& e) {
      std::printf("ipc_agreement rank %d: agreeing op FAILED: %s\n", me, e.what());
      ++failures;
    }
#endif
    return failures;
  });
}
