// TL_SM90_CUDA_CHECK: throws tilelink::Error naming the failed CUDA call and file:line.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "tilelink/core/error.hpp"

namespace tilelink::compute::sm90::detail {

inline void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    ::tilelink::detail::throw_error(file, line, std::string(what) + ": " + cudaGetErrorString(e));
  }
}

}  // namespace tilelink::compute::sm90::detail

#define TL_SM90_CUDA_CHECK(call) \
  ::tilelink::compute::sm90::detail::check_cuda((call), #call, __FILE__, __LINE__)
