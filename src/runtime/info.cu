#include "tilelink/runtime/info.hpp"

#include <cuda.h>

#include "tilelink/backend/cuda/driver.hpp"
#include <cuda_runtime_api.h>

#include <sstream>

namespace tilelink {

std::string cuda_info() {
  std::ostringstream os;
  int runtime = 0, driver = 0, count = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  os << "cuda: runtime " << runtime / 1000 << "." << (runtime % 1000) / 10 << ", driver "
     << driver / 1000 << "." << (driver % 1000) / 10 << "\n";
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    os << "cuda: no usable GPU (" << cudaGetErrorName(e) << ")\n";
    return os.str();
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    os << "gpu " << d << ": " << p.name << ", sm_" << p.major << p.minor << ", "
       << p.multiProcessorCount << " SMs, " << (p.l2CacheSize >> 20) << " MiB L2, "
       << (p.totalGlobalMem >> 30) << " GiB, " << p.sharedMemPerBlockOptin / 1024
       << " KiB shared memory per block (opt-in)\n";
    CUdevice dev;
    CUdevResource sm;
    if (::tilelink::cuda::driver::cuInit(0) == CUDA_SUCCESS && ::tilelink::cuda::driver::cuDeviceGet(&dev, d) == CUDA_SUCCESS &&
        ::tilelink::cuda::driver::cuDeviceGetDevResource(dev, &sm, CU_DEV_RESOURCE_TYPE_SM) == CUDA_SUCCESS)
      os << "  green contexts: " << sm.sm.smCount << " SMs, partitions of >= "
         << sm.sm.minSmPartitionSize << " SMs in steps of " << sm.sm.smCoscheduledAlignment << "\n";
    int mem64 = 0;
    ::tilelink::cuda::driver::cuDeviceGetAttribute(&mem64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev);
    os << "  64-bit stream wait/write value: " << (mem64 ? "yes" : "no") << "\n";
    for (int q = 0; q < count; ++q) {
      if (q == d) continue;
      int ok = 0;
      cudaDeviceCanAccessPeer(&ok, d, q);
      os << "  peer access to gpu " << q << ": " << (ok ? "yes" : "no") << "\n";
    }
  }
#if defined(TILELINK_HAS_MPI)
  os << "transports: virtual, peer, ipc (MPI)\n";
#else
  os << "transports: virtual, peer (no MPI in this build: no ipc)\n";
#endif
  return os.str();
}

}  // namespace tilelink
