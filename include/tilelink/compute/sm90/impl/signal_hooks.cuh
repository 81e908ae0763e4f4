// SignalHooks: the reference Hooks type for the sm90 GEMM engine. It waits (bounded acquire spin) for
// a per-tile 64-bit signal to reach `epoch` before the tile's loads, and release-stores `epoch` into a
// per-tile notify signal after the tile is stored. Used by `tilelink bench gemm` (hooks-on row, all
// signals already set) and tests/gpu/test_gemm.cu; fused ops write their own, with their plan's slots.
#pragma once

#include <cuda/atomic>

#include <cstdint>
#include <cstdio>

#include "tilelink/compute/sm90/gemm.hpp"

namespace tilelink::compute::sm90 {

template <cuda::thread_scope Scope = cuda::thread_scope_device>
struct SignalHooks {
  static constexpr bool kWaits = true;
  static constexpr bool kNotifies = true;
  static constexpr long long kMaxPolls = 1ll << 26;  // ~seconds with the backoff below

  uint64_t* wait_signals = nullptr;    // [tiles_m * tiles_n], row-major by tile; nullptr: no wait
  uint64_t* notify_signals = nullptr;  // [tiles_m * tiles_n]; nullptr: no notify
  int tiles_n = 0;
  uint64_t epoch = 1;

  __device__ void before_tile_loads(TileCoord tile, Rect) {
    if (wait_signals == nullptr || threadIdx.x % 32 != 0) return;
    cuda::atomic_ref<uint64_t, Scope> sig(wait_signals[tile.m * tiles_n + tile.n]);
    uint64_t seen = sig.load(cuda::memory_order_acquire);
    for (long long polls = 0; seen < epoch; ++polls) {
      if (polls == kMaxPolls) {
        printf("tilelink sm90 gemm: timeout waiting for tile (%d, %d): signal %d expected >= %llu, observed %llu\n",
               tile.m, tile.n, tile.m * tiles_n + tile.n, (unsigned long long)epoch, (unsigned long long)seen);
        __trap();
      }
      __nanosleep(32);
      seen = sig.load(cuda::memory_order_acquire);
    }
  }

  __device__ void after_tile_stored(TileCoord tile, Rect) {
    if (notify_signals == nullptr) return;
    cuda::atomic_ref<uint64_t, Scope> sig(notify_signals[tile.m * tiles_n + tile.n]);
    sig.store(epoch, cuda::memory_order_release);
  }
};

}  // namespace tilelink::compute::sm90
