// Internal to the GEMM+RS reduce kernels (rs_comm.cu): element conversions, and a warp's walk over
// the bands of the reduce walk with the waits that guard each band.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/ops/cuda/comm.hpp"

namespace tilelink::cuda::detail {

// ---- element conversions: the same rounding as core/dtype.hpp on the host ----------------------
template <DType D>
struct Elem;
template <>
struct Elem<DType::kF32> {
  using T = float;
  static TL_DEVICE float load(T x) { return x; }
  static TL_DEVICE T store(float v) { return v; }
};
template <>
struct Elem<DType::kBF16> {
  using T = __nv_bfloat16;
  static TL_DEVICE float load(T x) { return __bfloat162float(x); }
  static TL_DEVICE T store(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Elem<DType::kF16> {
  using T = __half;
  static TL_DEVICE float load(T x) { return __half2float(x); }
  static TL_DEVICE T store(float v) { return __float2half_rn(v); }
};

// Rows of a reduce tile that one warp takes at a time (a "band").
inline constexpr int kBandRows = 32;

// The next band of this call, claimed from the shared counter (one lane): its high half tags the
// call (the epoch's low 32 bits), its low half counts claims; the first claim of a call re-tags it.
TL_DEVICE inline int64_t claim_band(uint64_t* claims, uint64_t epoch) {
  const uint64_t tag = epoch & 0xffffffffu;
  ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_device> counter(*claims);
  uint64_t seen = counter.load(::cuda::memory_order_relaxed);
  while ((seen >> 32) != tag)
    if (counter.compare_exchange_weak(seen, (tag << 32) | 1u, ::cuda::memory_order_relaxed))
      return 0;
  return static_cast<int64_t>(counter.fetch_add(1, ::cuda::memory_order_relaxed) & 0xffffffffu);
}

// One warp's bands of the reduce walk: band j is rows [(j % bands) * kBandRows, +kBandRows) of
// reduce tile j / bands (in reduce_order). Without `claims` warp w takes bands w, w + warps, ...;
// with it (pull) each band goes to the warp that claims it next, so launches on other SMs can join
// the work. Every lane calls next() (warp-uniform).
struct BandWalk {
  const GemmRsPlan& p;
  uint64_t* claims;
  uint64_t epoch;
  int warp, warps;
  Warp lanes;
  int64_t j = -1;

  // The next band's rectangle of C's rows [M] x columns; false when the walk is over.
  TL_DEVICE bool next(Rect* band) {
    // Chunks have at most chunk_rows rows.
    const int bands = static_cast<int>(ceil_div(p.reduce_rows.chunk_rows, kBandRows));
    const int64_t items = static_cast<int64_t>(p.reduce_count()) * bands;
    for (;;) {
      if (claims == nullptr) {
        j = j < 0 ? warp : j + warps;
      } else {
        long long claimed = lanes.index() == 0 ? claim_band(claims, epoch) : 0;
        j = static_cast<int64_t>(__shfl_sync(0xffffffffu, claimed, 0));
      }
      if (j >= items) return false;
      const Rect tile = p.reduce_region(static_cast<int>(j / bands));
      const int64_t row0 = static_cast<int64_t>(j % bands) * kBandRows;
      if (row0 >= tile.rows) continue;  // a short (last) chunk has fewer bands
      *band = Rect{tile.row + row0, tile.col, min64(kBandRows, tile.rows - row0), tile.cols};
      return true;
    }
  }
};

// Waits until every source's gemm tiles covering `band` are done (pull: the source's tile_done;
// push: the staged slot here), one (source, gemm tile) signal a lane: the waits' round trips (a
// peer's signal is an NVLink round trip) overlap instead of adding up. Ends with the warp synced:
// every lane's loads after it come after every lane's acquire.
template <Scope S, bool kPush>
TL_DEVICE void wait_band(const GemmRsPlan& p, const SymmetricView& heap, const DeviceContext& ctx,
                         const Rect& band, uint64_t epoch, Warp lanes) {
  const TileSpan span = p.waits_for(band);
  const int span_m = span.m_end - span.m_begin, span_n = span.n_end - span.n_begin;
  const int waits = p.world_size * span_m * span_n;
  for (int w = lanes.index(); w < waits; w += 32) {
    const int src = peer_at(ctx.rank, 1 + w / (span_m * span_n), p.world_size);
    const int m = span.m_begin + (w % (span_m * span_n)) / span_n, n = span.n_begin + w % span_n;
    const int t = p.gemm.linear({m, n});
    if constexpr (kPush)
      consumer_tile_wait<S>(ctx, heap, p.ws.staged, p.staged_slot(src, t), epoch,
                            WaitSite{"staged", t});
    else
      peer_tile_wait<S>(ctx, heap, src, p.ws.tile_done, t, epoch, WaitSite{"tile_done", t});
  }
  lanes.sync();
}

}  // namespace tilelink::cuda::detail
