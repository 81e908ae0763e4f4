// The CUDA driver API, reached through the runtime's entry-point query instead of linking libcuda.
//
// NOTE: linking libcuda.so.1 directly makes every tilelink binary fail to start on a machine without
// an NVIDIA driver (CI, a laptop), even for the CPU backend. The runtime (cudart, linked statically)
// loads the driver itself when one exists, and hands out the driver's functions by name; without a
// driver each call below returns CUDA_ERROR_NO_DEVICE instead.
//
// Use: driver::cuStreamWaitValue64(...), with the same arguments as the driver function. Names are
// the <cuda.h> ones (the header's versioned macros apply, so the signatures are this toolkit's).
#pragma once

#include <cuda.h>

namespace tilelink::cuda::driver {

// The driver function `name` at this toolkit's ABI version, or nullptr without a driver.
void* lookup(const char* name);

#define TL_DRIVER_FUNCTION(name)                                                      \
  template <class... Args>                                                            \
  inline CUresult name(Args... args) {                                                \
    using Fn = decltype(&::name);                                                     \
    static Fn fn = reinterpret_cast<Fn>(lookup(#name));                              \
    return fn ? fn(args...) : CUDA_ERROR_NO_DEVICE;                                   \
  }

TL_DRIVER_FUNCTION(cuInit)
TL_DRIVER_FUNCTION(cuDeviceGet)
TL_DRIVER_FUNCTION(cuDeviceGetAttribute)
TL_DRIVER_FUNCTION(cuDeviceGetDevResource)
TL_DRIVER_FUNCTION(cuDevSmResourceSplitByCount)
TL_DRIVER_FUNCTION(cuDevResourceGenerateDesc)
TL_DRIVER_FUNCTION(cuGreenCtxCreate)
TL_DRIVER_FUNCTION(cuGreenCtxStreamCreate)
TL_DRIVER_FUNCTION(cuCtxFromGreenCtx)
TL_DRIVER_FUNCTION(cuCtxSetCurrent)
TL_DRIVER_FUNCTION(cuCtxGetCurrent)
TL_DRIVER_FUNCTION(cuStreamWaitValue64)
TL_DRIVER_FUNCTION(cuStreamWriteValue64)
TL_DRIVER_FUNCTION(cuFuncLoad)
TL_DRIVER_FUNCTION(cuFuncIsLoaded)
TL_DRIVER_FUNCTION(cuGetErrorName)
TL_DRIVER_FUNCTION(cuGetErrorString)

#undef TL_DRIVER_FUNCTION

}  // namespace tilelink::cuda::driver
