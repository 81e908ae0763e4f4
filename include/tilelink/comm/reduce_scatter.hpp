// ReduceScatterPlan: the row ReduceScatter as a comm plan of its own, and its program written once
// over an executor: a CPU rank thread (backend/cpu/comm_exec.hpp) or a GPU warp
// (src/ops/cuda/rs_comm.cu) runs the same code. GEMM+RS holds one (GemmRsPlan::rs).
//
// Every rank s holds a partial P_s [M, N] whose tiles, on a producer TileGrid that every rank
// shares, are announced as they are produced (a GEMM's notify hook, or a whole-buffer publish);
// rank r ends with C_r = sum_s P_s[rows of r] [M_r, N], summed in rank order 0..W-1 in fp32 and
// rounded once, so every backend and variant gives the same bits.
//
//   pull  P_s stays in s's symmetric `partial`; tile t announced on s's tile_done[t]; the owner
//         reads every source's rows of its segment in place
//   push  the producer writes its tile's rows of each owner's segment into that owner's `staging`
//         slot of the source, [W, max M_r, N], announced on the owner's staged[s * tiles + t]
//
// Work items are bands of band_rows x band_cols of the rank's own rows, visited in the producer's
// order (column-major inside groups of group_bands bands: the GEMM's column sweep of a group of
// tile rows), so the reduce keeps pace with a GEMM that produces in that order.
//
//   item j:  wait every source's producer tiles covering band(j) (wait_count / wait_at: peers
//            first, rank+1, ..., own last), then out[band] = sum over s of source s's band
//
// Signals are epoch counters (prim/signal.hpp): every call uses the next epoch; no reset.
#pragma once

#include <cstddef>

#include "tilelink/comm/allgather.hpp"  // CommMode
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/order.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/tile.hpp"
#include "tilelink/core/workspace.hpp"
#include "tilelink/prim/data.hpp"
#include "tilelink/prim/signal.hpp"

namespace tilelink {

// The GPU executors' band height: a warp's item (the CUDA ops give their plans bands of it).
inline constexpr int kReduceBandRows = 32;

// The symmetric fields a ReduceScatter reads and writes; ReduceScatterPlan::make_layout appends
// those of its mode (the others stay empty).
struct ReduceScatterFields {
  ByteField partial;        // pull: [M, N], this rank's source
  Field<Signal> tile_done;  // pull: one per producer tile of this rank's source
  ByteField staging;        // push: [W, max M_r, N], each source's rows of this rank's segment
  Field<Signal> staged;     // push: one per (source, producer tile), on the owner
  Field<uint64_t> claims;   // pull: the work counter of the GPU's claiming warps
};

struct ReduceScatterPlan {
  int rank = 0;
  int world_size = 1;
  DType dtype = DType::kBF16;
  CommMode mode = CommMode::kPull;
  int64_t n = 0;
  RowPartition rows;      // rank r receives rows [rows.begin(r), rows.end(r))
  TileGrid producer;      // over [M, N]: the tiles announced on tile_done / staged
  int band_rows = 32;     // an item: band_rows x band_cols
  int band_cols = 512;
  int group_bands = 4;    // bands of a column-major group
  ReduceScatterFields f;

  // Host constructor: checks its input (tilelink::Error). producer_tile_m/n: the producer's tiles;
  // group_m: its tile rows per group. Call make_layout on one builder (the same layout on every
  // rank), then give the fields to every rank's plan.
  static ReduceScatterPlan make(int rank, const RowPartition& rows, int64_t n, DType dtype, CommMode mode,
                                int producer_tile_m, int producer_tile_n, int group_m, int band_rows,
                                int band_cols);
  void make_layout(LayoutBuilder& b);

  TL_HD int64_t m() const { return rows.total(); }
  TL_HD int64_t elem_bytes() const { return dtype_size(dtype); }
  TL_HD int col_blocks() const { return static_cast<int>(ceil_div(n, band_cols)); }
  TL_HD int count() const {
    return static_cast<int>(ceil_div(rows.size(rank), band_rows)) * col_blocks();
  }
  // Item j's band: column-major inside groups of group_bands bands of this rank's rows.
  TL_HD Rect band(int j) const {
    const int64_t row0 = rows.begin(rank), rows_r = rows.size(rank);
    const TileOrder order{static_cast<int>(ceil_div(rows_r, band_rows)), col_blocks(), 0, group_bands};
    const TileCoord t = order.at(j);
    const int64_t row = row0 + static_cast<int64_t>(t.m) * band_rows;
    const int64_t col = static_cast<int64_t>(t.n) * band_cols;
    return {row, col, min64(band_rows, row0 + rows_r - row), min64(band_cols, n - col)};
  }

  // The signals a band waits for: one per (source, producer tile of span = producer.covering(band)),
  // numbered 0 <= w < wait_count(span), peers first (rank+1, ...), own last. wait_at gives the rank
  // whose field holds it (pull: the source's tile_done; push: this rank's staged) and its slot. The
  // span is computed once a band: recomputed in each GPU lane's wait it cost the reduce spill
  // reloads past L1 and ~1.8x its time (bench/notes/runtime.md).
  TL_HD int wait_count(const TileSpan& span) const { return world_size * span.count(); }
  TL_HD void wait_at(const TileSpan& span, int w, int* holder, int* slot, int* tile) const {
    const int per = span.count(), sn = span.n_end - span.n_begin;
    const int source = peer_at(rank, 1 + w / per, world_size);
    const int i = w % per;
    *tile = producer.linear({span.m_begin + i / sn, span.n_begin + i % sn});
    *holder = mode == CommMode::kPull ? source : rank;
    *slot = mode == CommMode::kPull ? *tile : staged_slot(source, *tile);
  }
  TL_HD Field<Signal> wait_field() const { return mode == CommMode::kPull ? f.tile_done : f.staged; }
  TL_HD SignalField wait_name() const { return mode == CommMode::kPull ? SignalField::kTileDone : SignalField::kStaged; }

  // Push: the `staged` slot of (source, producer tile), and where a source's row of `owner`'s
  // segment sits in the owner's staging (elements).
  TL_HD int staged_slot(int source, int tile) const { return source * producer.num_tiles() + tile; }
  TL_HD int64_t staging_offset_elems(int source, int64_t global_row, int owner) const {
    return (static_cast<int64_t>(source) * rows.max_size() + (global_row - rows.begin(owner))) * n;
  }

  // Source s's copy of the band (its first element; rows n elements apart), through the
  // executor's view of the heap.
  TL_HD_TEMPLATE
  template <class Exec>
  TL_HD const std::byte* source(const Exec& x, int s, const Rect& b) const {
    if (mode == CommMode::kPull) return x.peer(s, f.partial) + (b.row * n + b.col) * elem_bytes();
    return x.local(f.staging) + (staging_offset_elems(s, b.row, rank) + b.col) * elem_bytes();
  }
};

// ---- the programs, over an executor ---------------------------------------------------------------
// An executor `x` gives, beside local/peer (comm/allgather.hpp):
//   x.wait_each(count, fn, field, target, name)   for w < count: fn(w, &holder, &slot, &tile), then
//                                                 wait holder's field[slot] >= target (acquire);
//                                                 ordered before the executor's loads that follow
//   x.sum(count, src, src_ld, out, out_ld, rows, cols, dtype)
//                                                 out[i, j] = sum over s < count, in order, of
//                                                 src(s)[i, j] (fp32, rounded once)
//   x.push(rank, copy), x.notify_local(...), x.notify_peer(...)   as in comm/allgather.hpp
// `c` is this rank's C_r [M_r, N] (row 0 = global row rows.begin(rank)).
TL_HD_TEMPLATE
template <class Exec>
TL_HD void reduce_scatter_item(Exec& x, const ReduceScatterPlan& p, int j, uint64_t epoch, void* c) {
  const Rect b = p.band(j);
  const TileSpan span = p.producer.covering(b);
  x.wait_each(p.wait_count(span),
              [&](int w, int* holder, int* slot, int* tile) { p.wait_at(span, w, holder, slot, tile); },
              p.wait_field(), epoch, p.wait_name());
  std::byte* out = static_cast<std::byte*>(c) + ((b.row - p.rows.begin(p.rank)) * p.n + b.col) * p.elem_bytes();
  x.sum(p.world_size, [&](int s) { return p.source(x, s, b); }, p.n, out, p.n, b.rows, b.cols, p.dtype);
}

// The producer's side, for its finished tile t (on the producer grid) whose values start at `src`,
// rows src_ld elements apart: pull: copied into this rank's `partial` (no move when `src` is that
// tile of `partial` already: a producer that writes in place) and announced on tile_done[t]; push:
// its rows of each owner's segment written into the owner's staging slot of this rank, each owner
// then notified on staged[rank * tiles + t].
TL_HD_TEMPLATE
template <class Exec>
TL_HD void reduce_scatter_publish(Exec& x, const ReduceScatterPlan& p, int t, const std::byte* src, int64_t src_ld,
                                  uint64_t epoch) {
  const Rect r = p.producer.region(p.producer.coord(t));
  const int64_t eb = p.elem_bytes();
  if (p.mode == CommMode::kPull) {
    std::byte* dst = x.local(p.f.partial) + (r.row * p.n + r.col) * eb;
    if (dst != src) x.push(p.rank, Copy2D{src, src_ld * eb, dst, p.n * eb, r.rows, r.cols * eb});
    x.notify_local(p.f.tile_done, t, epoch);
    return;
  }
  for (int owner = p.rows.owner_of_row(r.row); owner < p.world_size; ++owner) {
    if (p.rows.begin(owner) >= r.row + r.rows) break;
    const int64_t lo = max64(r.row, p.rows.begin(owner)), hi = min64(r.row + r.rows, p.rows.end(owner));
    if (hi <= lo) continue;
    std::byte* dst = x.peer(owner, p.f.staging) + (p.staging_offset_elems(p.rank, lo, owner) + r.col) * eb;
    x.push(owner, Copy2D{src + (lo - r.row) * src_ld * eb, src_ld * eb, dst, p.n * eb, hi - lo, r.cols * eb});
    x.notify_peer(owner, p.f.staged, p.staged_slot(p.rank, t), epoch);
  }
}

}  // namespace tilelink
