// Checked CUDA calls. Every runtime and driver call in tilelink goes through one of these; a failure
// throws tilelink::Error naming the call, the CUDA error and file:line.
//
//   TL_CUDA_CHECK(cudaMalloc(&p, bytes));          // runtime API (cudaError_t)
//   TL_CU_CHECK(::tilelink::cuda::driver::cuStreamWaitValue64(s, a, v, 0));  // driver API (CUresult)
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <sstream>
#include <string>

#include "tilelink/backend/cuda/driver.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file,
                                          int line) {
  std::ostringstream os;
  os << call << " failed: " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")";
  throw_error(file, line, os.str());
}

[[noreturn]] inline void throw_cu_error(CUresult e, const char* call, const char* file, int line) {
  const char* name = nullptr;
  const char* what = nullptr;
  ::tilelink::cuda::driver::cuGetErrorName(e, &name);
  ::tilelink::cuda::driver::cuGetErrorString(e, &what);
  std::ostringstream os;
  os << call << " failed: " << (name ? name : "CUDA_ERROR_?") << " (" << (what ? what : "?") << ")";
  throw_error(file, line, os.str());
}

}  // namespace tilelink::detail

#define TL_CUDA_CHECK(call)                                                        \
  do {                                                                             \
    cudaError_t tl_err_ = (call);                                                  \
    if (tl_err_ != cudaSuccess)                                                    \
      ::tilelink::detail::throw_cuda_error(tl_err_, #call, __FILE__, __LINE__);    \
  } while (0)

#define TL_CU_CHECK(call)                                                          \
  do {                                                                             \
    CUresult tl_res_ = (call);                                                     \
    if (tl_res_ != CUDA_SUCCESS)                                                   \
      ::tilelink::detail::throw_cu_error(tl_res_, #call, __FILE__, __LINE__);      \
  } while (0)
