// How many CUDA devices this machine has (0 when the driver or a device is missing).
#include <cuda_runtime.h>

namespace tilelink::cli {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a machine without a driver
    return 0;
  }
  return n;
}

}  // namespace tilelink::cli
