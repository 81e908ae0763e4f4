// The epochs of a fused op's calls (src/ops/call_epochs.hpp).
#include "call_epochs.hpp"

#include <cuda.h>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/driver.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cuda::detail {

namespace {
__global__ void advance_epoch_kernel(uint64_t* counter, uint64_t n) { *counter += n; }
TL_REGISTER_KERNELS(advance_epoch_kernel);
}  // namespace

CallEpochs::CallEpochs(World& world) : world_(world) {
  counters_.assign(world.size(), nullptr);
  for (int r : world.local_ranks()) {
    world.bind(r);
    TL_CUDA_CHECK(cudaMalloc(&counters_[r], sizeof(uint64_t)));
    TL_CUDA_CHECK(cudaMemset(counters_[r], 0, sizeof(uint64_t)));
  }
  for (int r : world.local_ranks()) {
    world.bind(r);
    TL_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

CallEpochs::~CallEpochs() {
  // NOTE: no checks: destructors must not throw, and after a device fault every call fails.
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    if (counters_[r]) cudaFree(counters_[r]);
  }
}

void CallEpochs::begin(int n) {
  TL_REQUIRE(n >= 1, "a call uses at least one epoch, got " << n);
  if (!graph_) {
    for (int r : world_.local_ranks()) {
      cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
      world_.bind(r);
      TL_CUDA_CHECK(cudaStreamIsCapturing(world_.stream(r), &st));
      if (st != cudaStreamCaptureStatusNone) graph_ = true;
    }
  }
  last_n_ = n;
  host_ += n;
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    if (graph_) {
      advance_epoch_kernel<<<1, 1, 0, world_.stream(r)>>>(counters_[r], static_cast<uint64_t>(n));
      TL_CUDA_CHECK(cudaGetLastError());
    } else {
      // NOTE: after the stream's earlier work, like every other write-value (a release).
      TL_CU_CHECK(driver::cuStreamWriteValue64(reinterpret_cast<CUstream>(world_.stream(r)),
                                               reinterpret_cast<CUdeviceptr>(counters_[r]), host_, 0));
    }
  }
}

Epoch CallEpochs::epoch(int r, int i) const {
  TL_REQUIRE(i >= 1 && i <= last_n_, "epoch " << i << " of a call that uses " << last_n_);
  if (graph_) return Epoch{static_cast<uint64_t>(i - last_n_), counters_[r]};  // wraps: counter - (n - i)
  return Epoch{host_ - static_cast<uint64_t>(last_n_ - i)};
}

}  // namespace tilelink::cuda::detail
