// The benches' random fill (device_buffer.hpp).
#include "device_buffer.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tilelink::cli {
namespace {

__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }

template <class T>
__global__ void fill_uniform_kernel(T* p, int64_t count, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    store(p + i, scale * (static_cast<float>(x >> 40) * 0x1p-23f - 1.0f));
  }
}

}  // namespace

void fill_uniform(void* p, DType t, int64_t count, uint64_t seed, float scale, cudaStream_t s) {
  if (t == DType::kBF16)
    fill_uniform_kernel<<<1024, 256, 0, s>>>(static_cast<__nv_bfloat16*>(p), count, seed, scale);
  else
    fill_uniform_kernel<<<1024, 256, 0, s>>>(static_cast<__half*>(p), count, seed, scale);
  TL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tilelink::cli
