// Internal to the CUDA fused ops: the compute program's side of a producer/reducer link. After a
// tile's epilogue the engine's notify warp release-stores tile_done[t] = the call's epoch (system
// scope: a peer GPU or a copy engine may read it); a baseline publishes a whole partial at once.
#pragma once

#include <cuda/atomic>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/backend/cuda/epoch.hpp"
#include "tilelink/core/tile.hpp"
#include "tilelink/core/workspace.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda::detail {

// NOTE: call-free (a function call in the kernel serialises its wgmma: bench/notes/gemm.md), and
// const, so the store warp calls it on the kernel parameter.
struct TileDoneNotifyHooks {
  static constexpr bool kWaits = false;
  static constexpr bool kNotifies = true;
  Signal* tile_done = nullptr;  // this rank's
  int tiles_n = 0;
  Epoch call;  // read per tile: a graph replay's epoch is on the device

  __device__ void after_tile_stored(const compute::sm90::TileWork& w) const {
    signal_notify<Scope::kSystem>(tile_done + w.tile.m * tiles_n + w.tile.n, call.value());
  }
};

// Every signals[i] = epoch (release, system scope): a whole partial published at once.
__global__ void set_signals_kernel(Signal* signals, int count, Epoch epoch);
void launch_set_signals(Signal* signals, int count, Epoch epoch, cudaStream_t stream);

}  // namespace tilelink::cuda::detail
