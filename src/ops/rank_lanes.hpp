// Internal to the CUDA fused ops: the per-rank lanes an op runs on besides the rank's own stream.
//
//   the rank's stream   (world.stream(r)) the comm program, and the whole call's end
//   gemm stream         a second stream of the rank (in its green context when virtual): the GEMM
//   fork / join         the gemm stream waits for what the rank's stream had so far (fork); the
//                       rank's stream waits for the GEMM (join), so a call ends on the rank's stream
//   cuBLAS handle       on the rank's stream, for the unfused baseline
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/runtime/world.hpp"
#include "tilelink/tune/path_model.hpp"

namespace tilelink::cuda::detail {

inline void check_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    ::tilelink::detail::throw_error(file, line, std::string(what) + ": cuBLAS status " +
                                                    std::to_string(static_cast<int>(s)));
}
#define TL_CUBLAS_CHECK(call) ::tilelink::cuda::detail::check_cublas((call), #call, __FILE__, __LINE__)

// The baseline's GEMM: C[m, n] (row-major) = A[m, k] B[n, k]^T in bf16 with fp32 accumulation, i.e.
// C^T = B A^T in cuBLAS's column-major terms. Dense rows (ld = k, k, n).
inline void cublas_gemm_bf16_tn(cublasHandle_t h, const void* a, const void* b, void* c, int64_t m,
                                int64_t n, int64_t k) {
  const float alpha = 1.f, beta = 0.f;
  TL_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                               static_cast<int>(k), &alpha, b, CUDA_R_16BF, static_cast<int>(k), a,
                               CUDA_R_16BF, static_cast<int>(k), &beta, c, CUDA_R_16BF,
                               static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The cost model's view of a world whose GEMM runs on gemm_sms of each rank's SMs.
inline MachineModel machine_model(const World& world, int rank, int gemm_sms) {
  MachineModel m;
  m.ranks_share_gpu = world.transport() == Transport::kVirtual;
  m.sms = world.sm_count(rank);
  m.gemm_sms = gemm_sms;
  return m;
}

class RankLanes {
 public:
  explicit RankLanes(World& world) : world_(world) {
    const int W = world.size();
    gemm_.assign(W, nullptr);
    fork_.assign(W, nullptr);
    join_.assign(W, nullptr);
    cublas_.assign(W, nullptr);
    for (int r : world.local_ranks()) {
      world.bind(r);
      gemm_[r] = world.create_stream(r);
      TL_CUDA_CHECK(cudaEventCreateWithFlags(&fork_[r], cudaEventDisableTiming));
      TL_CUDA_CHECK(cudaEventCreateWithFlags(&join_[r], cudaEventDisableTiming));
      TL_CUBLAS_CHECK(cublasCreate(&cublas_[r]));
      TL_CUBLAS_CHECK(cublasSetStream(cublas_[r], world.stream(r)));
    }
  }
  ~RankLanes() {
    // NOTE: no checks: destructors must not throw, and after a device fault every call fails.
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      if (cublas_[r]) cublasDestroy(cublas_[r]);
      if (fork_[r]) cudaEventDestroy(fork_[r]);
      if (join_[r]) cudaEventDestroy(join_[r]);
      if (gemm_[r]) cudaStreamDestroy(gemm_[r]);
    }
  }
  RankLanes(const RankLanes&) = delete;
  RankLanes& operator=(const RankLanes&) = delete;

  cudaStream_t gemm_stream(int r) const { return gemm_[r]; }
  cublasHandle_t cublas(int r) const { return cublas_[r]; }
  void fork(int r) {
    TL_CUDA_CHECK(cudaEventRecord(fork_[r], world_.stream(r)));
    TL_CUDA_CHECK(cudaStreamWaitEvent(gemm_[r], fork_[r]));
  }
  void join_record(int r) { TL_CUDA_CHECK(cudaEventRecord(join_[r], gemm_[r])); }
  void join_wait(int r) { TL_CUDA_CHECK(cudaStreamWaitEvent(world_.stream(r), join_[r])); }

 private:
  World& world_;
  std::vector<cudaStream_t> gemm_;
  std::vector<cudaEvent_t> fork_, join_;
  std::vector<cublasHandle_t> cublas_;
};

}  // namespace tilelink::cuda::detail
