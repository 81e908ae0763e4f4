#include "tile_done_hooks.cuh"

#include "tilelink/core/config.hpp"

namespace tilelink::cuda::detail {

__global__ void set_signals_kernel(Signal* signals, int count, Epoch epoch) {
  const uint64_t value = epoch.value();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(signals[i]).store(value, ::cuda::memory_order_release);
}
TL_REGISTER_KERNELS(set_signals_kernel);

void launch_set_signals(Signal* signals, int count, Epoch epoch, cudaStream_t stream) {
  set_signals_kernel<<<static_cast<int>(ceil_div(count, 256)), 256, 0, stream>>>(signals, count, epoch);
  TL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tilelink::cuda::detail
