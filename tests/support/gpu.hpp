// GPU-test helpers shared by tests/gpu/*.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "tilelink/backend/cuda/check.hpp"

namespace tilelink::test {

// The GPUs this process sees (the peer transport needs one per rank).
inline int gpu_count() {
  int n = 0;
  TL_CUDA_CHECK(cudaGetDeviceCount(&n));
  return n;
}

}  // namespace tilelink::test
