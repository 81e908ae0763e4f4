// AllGatherPlan: the row AllGather as a comm plan of its own, and its program written once over an
// executor: a CPU rank thread (backend/cpu/comm_exec.hpp), a GPU thread block
// (backend/cuda/comm_exec.cuh) or the copy engine's stream operations (backend/cuda/stream_prim.hpp)
// run the same code. AG+GEMM holds one (AgGemmPlan::ag); the collective (comm/collectives_cuda.hpp)
// runs one on its own.
//
// Rank r holds its rows [M_r, row_bytes] (ragged M_r allowed, 0 included); every rank ends with all
// M rows, in rank order, in its symmetric `gathered` field.
//
//   tiles     SegmentTiling over the rows (tile_rows each, a segment's last clipped); tile t is
//             announced on slot t of `tile_ready` once its rows sit in a rank's `gathered`
//   pull      item i brings tile pull_tile_at(i) into this rank's `gathered`: its own tiles first
//             (copied from its rows), then rank+1's, ... (each waited for in the owner's `gathered`,
//             which the owner announces on its own tile_ready); then announced on this rank
//   push      item i writes one of this rank's tiles into one rank's `gathered` (itself first, then
//             rank+1, ...) and announces it on that rank
//   own       in both orders the first own_count() items are this rank's own tiles to itself, so an
//             executor can put them before a consumer starts (allgather_rank_program's parts)
//
// Signals are epoch counters (prim/signal.hpp): every call uses the next epoch; no reset. The
// caller opens each call with an entry barrier (every peer has finished reading the previous call's
// buffers) on a field of its own.
#pragma once

#include <cstddef>

#include "tilelink/core/order.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/segment_tiling.hpp"
#include "tilelink/core/workspace.hpp"
#include "tilelink/prim/data.hpp"
#include "tilelink/prim/signal.hpp"

namespace tilelink {

enum class CommMode : uint8_t {
  kPull,  // each rank reads its peers' rows
  kPush,  // each rank writes its own rows into every rank
};

// The symmetric fields an AllGather reads and writes; AllGatherPlan::make_layout appends them.
struct AllGatherFields {
  Field<Signal> tile_ready;  // one per tile: the tile's rows are in this rank's `gathered`
  ByteField gathered;        // [M, row_bytes]
};

struct AllGatherPlan {
  int rank = 0;
  int world_size = 1;
  CommMode mode = CommMode::kPull;
  int64_t row_bytes = 0;
  SegmentTiling tiles;
  AllGatherFields f;

  // Host constructor: checks its input (tilelink::Error). Call make_layout on one builder (the same
  // layout on every rank), then give the fields to every rank's plan.
  static AllGatherPlan make(int rank, const RowPartition& rows, int64_t row_bytes, int tile_rows, CommMode mode);
  void make_layout(LayoutBuilder& b);

  TL_HD int64_t m() const { return tiles.parts.total(); }
  TL_HD RowRange own_rows() const { return {tiles.parts.begin(rank), tiles.parts.end(rank)}; }
  // The items of this rank's program, and how many of them (the first) are its own tiles to itself.
  TL_HD int count() const { return mode == CommMode::kPull ? tiles.num_tiles() : tiles.tiles_of(rank) * world_size; }
  TL_HD int own_count() const { return tiles.tiles_of(rank); }

  // Pull order: the tile of item i: this rank's first tile, then on around the ring of tile ids.
  TL_HD int pull_tile_at(int i) const { return (tiles.first[rank] + i) % tiles.num_tiles(); }
  // Push order: item i = (peer, tile of this rank): all of them to itself, then to rank+1, ...
  TL_HD void push_at(int i, int* peer, int* tile) const {
    const int per_peer = tiles.tiles_of(rank);
    *peer = peer_at(rank, i / per_peer, world_size);
    *tile = tiles.first[rank] + i % per_peer;
  }
  // Channel mapping: the tiles (= tile_ready slots) that cover rows [rows.begin, rows.end).
  TL_HD IdRange waits_for(RowRange rows) const { return tiles.covering(rows); }

  // The rows `rows` of a [*, row_bytes] matrix whose first row is src_row0, to the same rows of a
  // gathered buffer (first row 0).
  TL_HD Copy2D rows_copy(const void* src, int64_t src_row0, void* dst, RowRange rows) const {
    return Copy2D{static_cast<const std::byte*>(src) + (rows.begin - src_row0) * row_bytes, row_bytes,
                  static_cast<std::byte*>(dst) + rows.begin * row_bytes, row_bytes, rows.size(), row_bytes};
  }
};

// ---- the program, over an executor ----------------------------------------------------------------
// An executor `x` gives the primitives of its context under these names:
//   x.local(field), x.peer(rank, field)        this rank's / a rank's bytes of a ByteField
//   x.barrier(field, epoch)                    the entry barrier (rank_barrier)
//   x.wait(owner, field, slot, target, site)   owner's field[slot] >= target (acquire), ordered
//                                              before the executor's next move
//   x.pull(owner, copy), x.push(peer, copy)    a data move (the executor's whole group)
//   x.notify_local(field, slot, value)         own field[slot] = value (release), after the moves
//   x.notify_peer(peer, field, slot, value)    peer's field[slot] = value (release), after the moves
// Each program handles one item; the executor's loop hands them out (strided over CPU workers or
// thread blocks, in order on the copy engine). `a` is this rank's rows [M_r, row_bytes].

TL_HD_TEMPLATE
template <class Exec>
TL_HD void allgather_pull_item(Exec& x, const AllGatherPlan& p, int i, uint64_t epoch, const void* a) {
  const int t = p.pull_tile_at(i);
  const int owner = p.tiles.rank_of(t);
  const RowRange rows = p.tiles.rows_of(t);
  if (owner == p.rank) {
    x.pull(owner, p.rows_copy(a, p.tiles.parts.begin(owner), x.local(p.f.gathered), rows));
  } else {
    // The owner announces each of its tiles once it sits in its own `gathered`.
    x.wait(owner, p.f.tile_ready, t, epoch, WaitSite{SignalField::kTileReady, t});
    x.pull(owner, p.rows_copy(x.peer(owner, p.f.gathered), 0, x.local(p.f.gathered), rows));
  }
  x.notify_local(p.f.tile_ready, t, epoch);
}

TL_HD_TEMPLATE
template <class Exec>
TL_HD void allgather_push_item(Exec& x, const AllGatherPlan& p, int i, uint64_t epoch, const void* a) {
  int peer = 0, t = 0;
  p.push_at(i, &peer, &t);
  x.push(peer, p.rows_copy(a, p.tiles.parts.begin(p.rank), x.peer(peer, p.f.gathered), p.tiles.rows_of(t)));
  x.notify_peer(peer, p.f.tile_ready, t, epoch);
}

TL_HD_TEMPLATE
template <class Exec>
TL_HD void allgather_item(Exec& x, const AllGatherPlan& p, int i, uint64_t epoch, const void* a) {
  if (p.mode == CommMode::kPull) allgather_pull_item(x, p, i, epoch, a);
  else allgather_push_item(x, p, i, epoch, a);
}

// This rank's own tiles announced to itself (after a move of its own rows).
TL_HD_TEMPLATE
template <class Exec>
TL_HD void allgather_announce_own(Exec& x, const AllGatherPlan& p, uint64_t epoch) {
  for (int t = p.tiles.first[p.rank]; t < p.tiles.first[p.rank + 1]; ++t) {
    if (p.mode == CommMode::kPull) x.notify_local(p.f.tile_ready, t, epoch);
    else x.notify_peer(p.rank, p.f.tile_ready, t, epoch);
  }
}

// This rank's own rows in one move, each own tile announced (no barrier: the caller's).
TL_HD_TEMPLATE
template <class Exec>
TL_HD void allgather_own_rows(Exec& x, const AllGatherPlan& p, uint64_t epoch, const void* a) {
  const RowRange own = p.own_rows();
  if (own.size() > 0) x.pull(p.rank, p.rows_copy(a, own.begin, x.local(p.f.gathered), own));
  allgather_announce_own(x, p, epoch);
}

// The items of `part` (no barrier): every item, or those past the own ones.
TL_HD_TEMPLATE
template <class Exec>
TL_HD void allgather_items(Exec& x, const AllGatherPlan& p, uint64_t epoch, const void* a, bool remote_only) {
  for (int i = remote_only ? p.own_count() : 0; i < p.count(); ++i) allgather_item(x, p, i, epoch, a);
}

// One rank's whole program in sequence (the copy engine, a single CPU worker), in parts, so an op can
// put the own rows before its consumer starts and the rest beside it.
enum class AllGatherPart : uint8_t {
  kAll,      // barrier, then every item in order
  kOwn,      // barrier, the own rows in one move, each own tile announced
  kRemote,   // after kOwn: the items past the own ones
  kInPlace,  // push only: barrier, then the items past the own ones; the own tiles are neither moved
             // nor announced (a consumer that reads them in place, from `a`, waits for none)
};

TL_HD_TEMPLATE
template <class Exec>
TL_HD void allgather_rank_program(Exec& x, const AllGatherPlan& p, Field<Signal> barrier, uint64_t epoch,
                                  const void* a, AllGatherPart part) {
  if (part != AllGatherPart::kRemote) x.barrier(barrier, epoch);
  if (part == AllGatherPart::kOwn) return allgather_own_rows(x, p, epoch, a);
  allgather_items(x, p, epoch, a, part != AllGatherPart::kAll);
}

}  // namespace tilelink
