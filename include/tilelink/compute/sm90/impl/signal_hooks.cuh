// SignalHooks: the reference Hooks type for the sm90 GEMM engine. It waits (bounded acquire spin)
// for a per-tile 64-bit signal to reach `epoch` before the tile's loads, and release-stores `epoch`
// into a per-tile notify signal after the tile is stored. Used by `tilelink bench gemm` (hooks-on
// row, all signals already set) and tests/gpu/test_gemm.cu; fused ops write their own, with their
// plan's slots. Waits / Notifies switch a side off at compile time (the engine then has none of its
// machinery), as the fused ops' hooks do: AG+GEMM's only wait, GEMM+RS's only notify.
#pragma once

#include <cuda/atomic>

#include <cstdint>

#include "tilelink/compute/sm90/gemm.hpp"

namespace tilelink::compute::sm90 {

// Where a timed-out wait reports itself: host-mapped (pinned) memory, readable after the trap.
struct WaitTimeout {
  int tile_m, tile_n, slot;
  unsigned long long expected, observed;
  int flag;  // 1 once written
};

// NOTE: a hook must make no function call (no printf, nothing non-inlined): ptxas then serializes
// every wgmma of the kernel (warning C7510), about 7% slower. So a timeout is reported through
// `timeout` (if set) and a trap, not printf.
template <cuda::thread_scope Scope = cuda::thread_scope_device, bool Waits = true,
          bool Notifies = true>
struct SignalHooks {
  static constexpr bool kWaits = Waits;
  static constexpr bool kNotifies = Notifies;
  static constexpr long long kMaxPolls = 1ll << 26;  // ~seconds with the backoff below

  uint64_t* wait_signals = nullptr;    // [tiles_m * tiles_n], row-major by tile; nullptr: no wait
  uint64_t* notify_signals = nullptr;  // [tiles_m * tiles_n]; nullptr: no notify
  int tiles_n = 0;
  uint64_t epoch = 1;
  WaitTimeout* timeout = nullptr;  // host-mapped; optional

  __device__ __forceinline__ void before_tile_loads(TileCoord tile, Rect) {
    unsigned lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    if (wait_signals == nullptr || lane != 0) return;
    const int slot = tile.m * tiles_n + tile.n;
    cuda::atomic_ref<uint64_t, Scope> sig(wait_signals[slot]);
    uint64_t seen = sig.load(cuda::memory_order_acquire);
    for (long long polls = 0; seen < epoch; ++polls) {
      if (polls == kMaxPolls) {
        if (timeout != nullptr) {
          volatile WaitTimeout* t = timeout;
          t->tile_m = tile.m, t->tile_n = tile.n, t->slot = slot, t->expected = epoch, t->observed = seen;
          __threadfence_system();
          t->flag = 1;
          __threadfence_system();
        }
        __trap();
      }
      __nanosleep(32);
      seen = sig.load(cuda::memory_order_acquire);
    }
  }

  __device__ __forceinline__ void after_tile_stored(TileCoord tile, Rect) {
    if (notify_signals == nullptr) return;
    cuda::atomic_ref<uint64_t, Scope> sig(notify_signals[tile.m * tiles_n + tile.n]);
    sig.store(epoch, cuda::memory_order_release);
  }
};

}  // namespace tilelink::compute::sm90
