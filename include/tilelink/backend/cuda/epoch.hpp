// A call's epoch as device code reads it, so that a CUDA-graph-captured call advances on replay.
//
//   Epoch e = 7;                      // eager: the host's epoch, baked into the launch
//   Epoch g{0, counter};              // graph: *counter + 0, read when the kernel runs
//   Epoch g1{uint64_t(-1), counter};  // graph: *counter - 1 (wrapping add), a call's first of two
//
// `counter` is a device word of the rank that the call's first stream operation advances (a kernel
// adding the call's number of epochs), so every replay of a captured call waits for and publishes
// new values: signals are never reset, whether a call is eager or replayed. Kernels read the value
// once, when they start; it is written by an earlier operation of the same stream.
#pragma once

#include <cstdint>

#include "tilelink/core/config.hpp"

namespace tilelink::cuda {

struct Epoch {
  uint64_t offset = 0;
  const uint64_t* counter = nullptr;  // null: the epoch is `offset`

  TL_HD Epoch(uint64_t e = 0) : offset(e) {}  // NOLINT: an eager epoch converts implicitly
  TL_HD Epoch(uint64_t off, const uint64_t* c) : offset(off), counter(c) {}

  TL_HD bool on_device() const { return counter != nullptr; }
#if defined(__CUDACC__)
  __device__ uint64_t value() const {
    return counter ? offset + *reinterpret_cast<const volatile uint64_t*>(counter) : offset;
  }
#endif
};

}  // namespace tilelink::cuda
