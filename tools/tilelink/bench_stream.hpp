// What the GPU benches that time against cuBLAS share (`bench gemm`, `bench grouped_gemm`,
// `bench moe_*`): cuBLAS's status check, and one stream with its cuBLAS handle (a 64 MiB
// workspace), an L2 flush buffer (twice the L2) and a pair of timing events, freed together.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cli {

inline void check_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    ::tilelink::detail::throw_error(file, line, std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
  }
}
#define TL_CUBLAS_CHECK(call) ::tilelink::cli::check_cublas((call), #call, __FILE__, __LINE__)

struct BenchStream {
  static constexpr size_t kCublasWorkspaceBytes = size_t(64) << 20;
  cudaStream_t stream = nullptr;  // non-blocking
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  void* flush = nullptr;  // written before a timed call to evict its operands from L2
  size_t flush_bytes = 0;
  cudaEvent_t ev[2] = {};

  explicit BenchStream(size_t l2_bytes) : flush_bytes(2 * l2_bytes) {
    TL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    TL_CUBLAS_CHECK(cublasCreate(&handle));
    TL_CUBLAS_CHECK(cublasSetStream(handle, stream));
    TL_CUDA_CHECK(cudaMalloc(&workspace, kCublasWorkspaceBytes));
    TL_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace, kCublasWorkspaceBytes));
    TL_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
    TL_CUDA_CHECK(cudaEventCreate(&ev[0]));
    TL_CUDA_CHECK(cudaEventCreate(&ev[1]));
  }
  // NOTE: unchecked: a destructor must not throw (a bench that fails leaves through here).
  ~BenchStream() {
    (void)cudaEventDestroy(ev[0]);
    (void)cudaEventDestroy(ev[1]);
    (void)cublasDestroy(handle);
    (void)cudaStreamDestroy(stream);
    (void)cudaFree(workspace);
    (void)cudaFree(flush);
  }
  BenchStream(const BenchStream&) = delete;
  BenchStream& operator=(const BenchStream&) = delete;
};

}  // namespace tilelink::cli
