// AllToAllPlan: the counts-then-rows exchange of an AllToAll whose sizes are known only at run time
// (MoE dispatch: how many tokens each rank sends each expert's owner is the router's output), as a
// comm plan of its own with its programs written once over an executor (CPU rank thread:
// backend/cpu/comm_exec.hpp).
//
// Every rank r sends rows to every rank d (itself too): n(r, d) rows of row_bytes each, at most
// `capacity` per (r, d) pair. The exchange has two phases, each announced by its own signal, so a
// receiver can size its output from the counts before any row lands:
//   counts  r writes n(r, d) into d's counts[r], then release-notifies d's counts_ready[r]
//   rows    r copies its rows for d into d's staging slot r, then release-notifies d's rows_ready[r]
// A receiver waits for every counts_ready, computes where each source's rows go (rank order:
// source 0's rows first), then, source by source as rows_ready arrives, copies the slot into its
// output. Signals are epoch counters: every call uses the next epoch, nothing is reset; a caller
// opens each call with a barrier so that no rank overwrites a slot a peer still reads.
#pragma once

#include "tilelink/core/config.hpp"
#include "tilelink/core/order.hpp"
#include "tilelink/core/workspace.hpp"

namespace tilelink {

struct AllToAllFields {
  Field<int64_t> counts;       // [W]: counts[s] = rows source s sends this rank
  Field<Signal> counts_ready;  // [W]
  ByteField staging;           // [W, capacity, row_bytes]: slot s holds source s's rows
  Field<Signal> rows_ready;    // [W]
};

struct AllToAllPlan {
  int rank = 0;
  int world_size = 1;
  int64_t row_bytes = 0;
  int64_t capacity = 0;  // the most rows one source may send one destination
  AllToAllFields f;

  // Host constructor: checks its input (tilelink::Error). make_layout appends the fields (the same
  // layout on every rank).
  static AllToAllPlan make(int rank, int world_size, int64_t row_bytes, int64_t capacity);
  void make_layout(LayoutBuilder& b);

  // Byte offset of source s's slot in `staging`.
  TL_HD int64_t slot_offset(int s) const { return static_cast<int64_t>(s) * capacity * row_bytes; }
  // The destination of this rank's step-th send: itself first, then rank+1, ... (local first).
  TL_HD int send_peer(int step) const { return peer_at(rank, step, world_size); }
};

// ---- the programs, over an executor ---------------------------------------------------------------
// The executor `x` gives (CPU: backend/cpu/comm_exec.hpp):
//   x.put_count(peer, slot, n)             peer's counts[slot] = n (plain store)
//   x.notify_peer(peer, field, slot, v)    peer's field[slot] = v (release, after the stores above)
//   x.wait_local(field, slot, target)      own field[slot] >= target (acquire)
//   x.local_count(slot)                    own counts[slot]
//   x.push_rows(peer, offset, src, bytes)  bytes from src into peer's staging at offset
//   x.copy_local(offset, dst, bytes)       own staging at offset into dst
//   x.fail_capacity(peer, n)               n > capacity: the executor's error (never returns)

// Sends this rank's count for destination `peer` (phase 1).
template <class Exec>
TL_HD void alltoall_send_count(Exec& x, const AllToAllPlan& p, int peer, int64_t n, uint64_t epoch) {
  if (n > p.capacity || n < 0) x.fail_capacity(peer, n);
  x.put_count(peer, p.rank, n);
  x.notify_peer(peer, p.f.counts_ready, p.rank, epoch);
}

// Sends this rank's n rows for destination `peer` (phase 2): into the peer's slot of this rank.
template <class Exec>
TL_HD void alltoall_send_rows(Exec& x, const AllToAllPlan& p, int peer, const void* rows, int64_t n,
                              uint64_t epoch) {
  if (n > p.capacity || n < 0) x.fail_capacity(peer, n);
  if (n > 0) x.push_rows(peer, p.slot_offset(p.rank), rows, n * p.row_bytes);
  x.notify_peer(peer, p.f.rows_ready, p.rank, epoch);
}

// Waits for every source's count; offsets[s] = the first output row of source s's rows (rank
// order), offsets[W] = the total. offsets: world_size + 1 entries.
template <class Exec>
TL_HD int64_t alltoall_recv_counts(Exec& x, const AllToAllPlan& p, uint64_t epoch, int64_t* offsets) {
  offsets[0] = 0;
  for (int s = 0; s < p.world_size; ++s) {
    x.wait_local(p.f.counts_ready, s, epoch);
    offsets[s + 1] = offsets[s] + x.local_count(s);
  }
  return offsets[p.world_size];
}

// Waits for source s's rows and copies them to out at its offset (rows of row_bytes).
template <class Exec>
TL_HD void alltoall_recv_rows(Exec& x, const AllToAllPlan& p, int s, uint64_t epoch, const int64_t* offsets,
                              void* out) {
  x.wait_local(p.f.rows_ready, s, epoch);
  const int64_t n = offsets[s + 1] - offsets[s];
  if (n > 0) x.copy_local(p.slot_offset(s), static_cast<char*>(out) + offsets[s] * p.row_bytes, n * p.row_bytes);
}

}  // namespace tilelink
