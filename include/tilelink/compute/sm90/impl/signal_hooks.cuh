// SignalHooks: the reference Hooks type for the sm90 GEMM engine, a thin adapter over the quiet
// signal primitives (backend/cuda/prim.cuh). Lane 0 of the load warp waits (bounded acquire spin at
// scope S) for a per-tile 64-bit signal to reach `epoch` before the tile's loads; the store warp
// release-stores `epoch` into a per-tile notify signal after the tile is stored. Used by `tilelink
// bench gemm` (hooks-on row, all signals already set) and tests/gpu/test_gemm.cu; fused ops write
// their own, with their plan's slots. Waits / Notifies switch a side off at compile time (the
// engine then has none of its machinery), as the fused ops' hooks do: AG+GEMM's only wait,
// GEMM+RS's only notify.
#pragma once

#include <cstdint>

#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/compute/sm90/gemm.hpp"

namespace tilelink::compute::sm90 {

// NOTE: a hook must make no function call (no printf, nothing non-inlined): ptxas then serializes
// every wgmma of the kernel (warning C7510), about 7% slower. So the waits are the quiet form: a
// timeout records into ctx.fault (when the context has one, as World::device_context gives) and
// traps.
template <Scope S = Scope::kGpu, bool Waits = true, bool Notifies = true>
struct SignalHooks {
  static constexpr bool kWaits = Waits;
  static constexpr bool kNotifies = Notifies;

  uint64_t* wait_signals = nullptr;    // [tiles_m * tiles_n], row-major by tile; nullptr: no wait
  uint64_t* notify_signals = nullptr;  // [tiles_m * tiles_n]; nullptr: no notify
  int tiles_n = 0;
  uint64_t epoch = 1;
  cuda::DeviceContext ctx;  // the wait's bound (timeout_ns) and fault record

  __device__ __forceinline__ void before_tile_loads(const TileWork& w) const {
    unsigned lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    if (wait_signals == nullptr || lane != 0) return;
    const int slot = w.tile.m * tiles_n + w.tile.n;
    cuda::signal_wait<S, cuda::Report::kQuiet>(ctx, wait_signals + slot, slot, epoch,
                                               WaitSite{SignalField::kSignal, slot});
  }

  __device__ __forceinline__ void after_tile_stored(const TileWork& w) const {
    if (notify_signals == nullptr) return;
    cuda::signal_notify<S>(notify_signals + w.tile.m * tiles_n + w.tile.n, epoch);
  }
};

}  // namespace tilelink::compute::sm90
