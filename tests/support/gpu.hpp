// GPU-test helpers shared by tests/gpu/*.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <vector>

#include "refused.hpp"
#include "tilelink/backend/cuda/check.hpp"

namespace tilelink::test {

// The GPUs this process sees (the peer transport needs one per rank).
inline int gpu_count() {
  int n = 0;
  TL_CUDA_CHECK(cudaGetDeviceCount(&n));
  return n;
}

// What a test's time bounds are multiplied by: TILELINK_TEST_TIME_SCALE (default 1). Under
// compute-sanitizer every kernel and API call runs many times slower, so scripts/sanitize.sh sets it;
// the bounds then still catch a wait that runs on to its own deadline.
inline double time_scale() {
  const char* v = std::getenv("TILELINK_TEST_TIME_SCALE");
  const double s = v ? std::atof(v) : 1.0;
  return s >= 1.0 ? s : 1.0;
}

// Device memory freed with the object (at least 16 bytes, so an empty tensor has a valid pointer),
// with typed views and host copies in and out.
struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) { TL_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  void put(const void* host, size_t n) {
    if (n) TL_CUDA_CHECK(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice));
  }
  void get(void* host, size_t n) const {
    if (n) TL_CUDA_CHECK(cudaMemcpy(host, p, n, cudaMemcpyDeviceToHost));
  }
  template <class T>
  void put(const std::vector<T>& h) {
    put(h.data(), h.size() * sizeof(T));
  }
  template <class T>
  std::vector<T> get(size_t count) const {
    std::vector<T> h(count);
    get(h.data(), count * sizeof(T));
    return h;
  }
  // Every byte 0xFF (NaN in bf16 and fp16): what a run leaves unwritten shows.
  void poison() { TL_CUDA_CHECK(cudaMemset(p, 0xFF, bytes)); }
  std::vector<std::byte> host() const { return get<std::byte>(bytes); }
};

}  // namespace tilelink::test

// Skips the test (gtest lists it as skipped, with the reason) on a machine with fewer than n GPUs.
#define TL_SKIP_UNLESS_GPUS(n)                                                                 \
  do {                                                                                         \
    const int tl_gpus_ = ::tilelink::test::gpu_count();                                        \
    if (tl_gpus_ < (n))                                                                        \
      GTEST_SKIP() << "the peer transport needs " << (n) << " GPUs or more; this machine has " \
                   << tl_gpus_;                                                                \
  } while (0)
