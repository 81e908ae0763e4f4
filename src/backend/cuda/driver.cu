#include "tilelink/backend/cuda/driver.hpp"

#include <cuda_runtime_api.h>

namespace tilelink::cuda::driver {

void* lookup(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, CUDA_VERSION, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();  // clear the error of a machine without a driver
    return nullptr;
  }
  return fn;
}

}  // namespace tilelink::cuda::driver
