// AllReducePlan: a row AllReduce of W producers' [M, N] partials, as a comm plan of its own, and its
// two programs (reduce, gather) written once over an executor: a CPU rank thread
// (backend/cpu/comm_exec.hpp) or a GPU warp (src/ops/cuda/reduce_rect.cuh) runs the same code.
//
// Every rank r holds a partial P_r [M, N] in its symmetric `partial` field; the tiles of P_r are
// announced, each on its own slot of r's `tile_done` field, by whoever produces them (a GEMM's
// notify hook, or a whole-buffer publish), on a producer TileGrid that every rank shares. Every
// rank ends with C = sum_r P_r [M, N], summed in rank order 0..W-1 in fp32 and rounded once, so
// every algorithm and backend gives the same bits.
//
//   one-shot  every rank reduces every row from every source as the producers announce the tiles
//             (reads W * M * N elements a rank; the fewest steps: for decode sizes)
//   two-shot  the ReduceScatter then the AllGather, composed: rank r reduces its row segment
//             (owners) into its symmetric `reduced` field and announces each band on band_ready;
//             then every rank copies every owner's bands into its C as they are announced (reads
//             2 * M * N elements a rank, whatever W)
//
// Work items are bands of band_rows x band_cols of the rows a rank reduces, visited in the
// producer's order (column-major inside groups of `group_bands` bands), so the reduce keeps pace
// with a GEMM that produces in that order. The gather's items are (owner, band) pairs, the owners
// interleaved (rank+1, rank+2, ..., itself last) so that every owner's first bands come first.
//
//   reduce item j:  wait every source's producer tiles covering reduce_rect(j) (reduce_waits),
//                   sum the W sources' rect into out (C for one-shot, `reduced` for two-shot),
//                   two-shot: notify band_ready[j] (release)
//   gather item i:  wait owner's band_ready[j], copy the owner's `reduced` rect into C
//
// Signals are epoch counters (prim/signal.hpp): every call uses the next epoch; no reset.
#pragma once

#include "tilelink/core/dtype.hpp"
#include "tilelink/core/order.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/segment_tiling.hpp"
#include "tilelink/core/tile.hpp"
#include "tilelink/core/workspace.hpp"
#include "tilelink/prim/data.hpp"
#include "tilelink/prim/signal.hpp"

namespace tilelink {

enum class AllReduceAlgo : uint8_t { kOneShot, kTwoShot };
const char* allreduce_algo_name(AllReduceAlgo a);

// The symmetric fields an AllReduce reads and writes. The caller's layout owns them (an op adds
// its own fields beside them); AllReducePlan::make_layout appends them to a LayoutBuilder.
struct AllReduceFields {
  ByteField partial;         // [M, N] in dtype: this rank's source
  Field<Signal> tile_done;   // one per producer tile: the source's tile is in `partial`
  ByteField reduced;         // two-shot: [M, N], this rank's segment reduced (other rows unused)
  Field<Signal> band_ready;  // two-shot: one per reduce item of this rank
  Field<uint64_t> claims;    // two work counters (reduce, gather) for the GPU's claiming warps
};

struct AllReducePlan {
  int rank = 0;
  int world_size = 1;
  DType dtype = DType::kBF16;
  AllReduceAlgo algo = AllReduceAlgo::kOneShot;
  int64_t m = 0, n = 0;
  RowPartition owners;   // two-shot: the segments each rank reduces (one-shot: unused)
  TileGrid producer;     // over [M, N]: the tiles announced on tile_done
  int band_rows = 32;    // a work item: band_rows x band_cols
  int band_cols = 512;
  int group_bands = 4;   // bands of a column-major group (the producer's group of tile rows)
  int max_items = 0;     // the most reduce items of any rank (band_ready's size)
  AllReduceFields f;

  // Host constructor: checks its input (tilelink::Error). producer_tile_m/n: the producer's tiles;
  // group_m: its tile rows per group. Call make_layout on one builder for every rank (the same
  // layout everywhere), then pass the fields to each rank's plan.
  static AllReducePlan make(int rank, AllReduceAlgo algo, const RowPartition& owners, int64_t n,
                            DType dtype, int producer_tile_m, int producer_tile_n, int group_m,
                            int band_cols = 512);
  void make_layout(LayoutBuilder& b);

  // ---- the reduce: rows this rank (or `owner`) reduces, and their items -------------------------
  TL_HD RowRange rows_of(int owner) const {
    if (algo == AllReduceAlgo::kOneShot) return {0, m};
    return {owners.begin(owner), owners.end(owner)};
  }
  TL_HD int col_blocks() const { return static_cast<int>(ceil_div(n, band_cols)); }
  TL_HD int items_of(int owner) const {
    return static_cast<int>(ceil_div(rows_of(owner).size(), band_rows)) * col_blocks();
  }
  TL_HD int reduce_count() const { return items_of(rank); }
  // Item j of `owner`'s reduce walk: column-major inside groups of group_bands bands.
  TL_HD Rect item_rect(int owner, int j) const {
    const RowRange rr = rows_of(owner);
    const TileOrder order{static_cast<int>(ceil_div(rr.size(), band_rows)), col_blocks(), 0, group_bands};
    const TileCoord t = order.at(j);
    const int64_t row = rr.begin + static_cast<int64_t>(t.m) * band_rows;
    const int64_t col = static_cast<int64_t>(t.n) * band_cols;
    return {row, col, min64(band_rows, rr.end - row), min64(band_cols, n - col)};
  }
  TL_HD Rect reduce_rect(int j) const { return item_rect(rank, j); }
  // The producer tiles a reduce item waits for, on every source: waits (source, tile) numbered
  // 0 <= w < world_size * span.count(), peers first (rank+1, ...), own last.
  TL_HD int reduce_waits(int j) const { return world_size * producer.covering(reduce_rect(j)).count(); }
  TL_HD void reduce_wait(int j, int w, int* source, int* slot) const {
    const TileSpan span = producer.covering(reduce_rect(j));
    const int per = span.count(), sn = span.n_end - span.n_begin;
    *source = peer_at(rank, 1 + w / per, world_size);
    const int i = w % per;
    *slot = producer.linear({span.m_begin + i / sn, span.n_begin + i % sn});
  }

  // ---- the gather (two-shot) ----------------------------------------------------------------------
  // Items i in [0, gather_count()): owner peer_at(rank, 1 + i % W), its band i / W; an index past
  // the owner's bands is empty (gather_item returns false).
  TL_HD int gather_count() const { return algo == AllReduceAlgo::kTwoShot ? world_size * max_items : 0; }
  TL_HD bool gather_item(int i, int* owner, int* band) const {
    *owner = peer_at(rank, 1 + i % world_size, world_size);
    *band = i / world_size;
    return *band < items_of(*owner);
  }
};

// ---- the programs, over an executor --------------------------------------------------------------
// The executor is the one of the other comm programs (comm/allgather.hpp, comm/reduce_scatter.hpp):
// local/peer, wait, wait_each, sum, pull, notify_local; a CPU rank thread (cpu::CommExec) or a GPU
// warp (src/ops/cuda/reduce_rect.cuh, WarpExec). Each program handles one item; the executor's loop
// hands out the items (strided on the CPU, claimed from a shared counter on the GPU).

TL_HD_TEMPLATE
template <class Exec>
TL_HD void allreduce_reduce_item(Exec& x, const AllReducePlan& p, int j, uint64_t epoch, void* c) {
  x.wait_each(
      p.reduce_waits(j),
      [&](int w, int* source, int* slot, int* tile) {
        p.reduce_wait(j, w, source, slot);
        *tile = *slot;
      },
      p.f.tile_done, epoch, SignalField::kTileDone);
  const Rect r = p.reduce_rect(j);
  const int64_t eb = dtype_size(p.dtype), at = (r.row * p.n + r.col) * eb;
  // One-shot: straight into C (every rank reduces every row); two-shot: into the rank's `reduced`.
  std::byte* out = p.algo == AllReduceAlgo::kOneShot ? static_cast<std::byte*>(c) : x.local(p.f.reduced);
  x.sum(p.world_size, [&](int s) { return x.peer(s, p.f.partial) + at; }, p.n, out + at, p.n, r.rows, r.cols,
        p.dtype);
  if (p.algo == AllReduceAlgo::kTwoShot) x.notify_local(p.f.band_ready, j, epoch);
}

TL_HD_TEMPLATE
template <class Exec>
TL_HD void allreduce_gather_item(Exec& x, const AllReducePlan& p, int i, uint64_t epoch, void* c) {
  int owner = 0, band = 0;
  if (!p.gather_item(i, &owner, &band)) return;
  x.wait(owner, p.f.band_ready, band, epoch, WaitSite{SignalField::kBandReady, band});
  const Rect r = p.item_rect(owner, band);
  const int64_t eb = dtype_size(p.dtype), at = (r.row * p.n + r.col) * eb;
  x.pull(owner, Copy2D{x.peer(owner, p.f.reduced) + at, p.n * eb, static_cast<std::byte*>(c) + at, p.n * eb, r.rows,
                       r.cols * eb});
}

}  // namespace tilelink
