// Device memory for the command line's GPU commands, freed with the object (also when a command
// throws): the benches' and the layer ops' buffers; and the benches' random fill (CUDA sources).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/dtype.hpp"

namespace tilelink::cli {

class DeviceBuffer {
 public:
  // bytes (at least 16 are allocated, so an empty tensor still has a valid, aligned pointer); from:
  // host bytes to copy in, or nullptr.
  explicit DeviceBuffer(size_t bytes, const void* from = nullptr) : bytes_(bytes) {
    TL_CUDA_CHECK(cudaMalloc(&p_, bytes < 16 ? 16 : bytes));
    if (from != nullptr && bytes > 0) TL_CUDA_CHECK(cudaMemcpy(p_, from, bytes, cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { (void)cudaFree(p_); }  // NOTE: unchecked: a destructor must not throw
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// p[i] (count bf16 or fp16 elements) uniform in [-scale, scale) from a hash of (seed, i)
// (splitmix64's finalizer): no state, no host round trip, the same values for any launch shape.
// Enqueued on `s`. Defined in device_buffer.cu.
void fill_uniform(void* p, DType t, int64_t count, uint64_t seed, float scale, cudaStream_t s);

}  // namespace tilelink::cli
