// Tile-centric signal primitives: the contract every backend implements.
//
// Backends: tilelink::cpu (include/tilelink/backend/cpu/prim.hpp; ranks are threads) and
// tilelink::cuda (include/tilelink/backend/cuda/prim.cuh; ranks are GPUs, green contexts or processes).
// Both spell the same functions with the same arguments; only the rank context type differs.
//
// Signals
//   A signal is a 64-bit counter (tilelink::Signal) in the symmetric heap, addressed by a Field of the
//   op's workspace layout and a slot index. Signals are never reset: each call of an op uses the next
//   epoch value (1, 2, 3, ...), notifies store the epoch, and waits compare `observed >= target`. So an
//   op needs no memset between calls and stays CUDA-graph capturable.
//
// Ordering
//   notify = release: every write the notifier made before the notify (its data stores, including
//            stores into a peer's memory) is visible to whoever observes the notified value.
//   wait   = acquire: no load the waiter issues after the wait (plain, vector, bulk/TMA: the GPU backend
//            adds the proxy fence) can observe memory older than the notify it observed.
//   Scope: block / gpu / system (peer). The CPU backend is one process, so every scope is the same
//   there; GPU callers pass the narrowest scope that covers both parties.
//
// Bounded waits
//   Every wait has a deadline (the context's timeout). On expiry it reports op, rank, tile, the signal
//   field and slot, the expected and the observed value, and fails: CPU throws tilelink::TimeoutError;
//   GPU prints once and traps, and the host launcher turns the trap into an error that names the op.
//
// The primitives (ctx is the calling rank's context; `f` a Field<Signal> of the workspace):
//   producer_tile_notify(ctx, f, slot, value)            own rank:  f[slot] = value (release)
//   consumer_tile_wait(ctx, f, slot, target, tile)       own rank:  wait f[slot] >= target (acquire)
//   peer_tile_notify(ctx, peer, f, slot, value)          peer's:    peer.f[slot] = value (release)
//   peer_tile_wait(ctx, peer, f, slot, target, tile)     peer's:    wait peer.f[slot] >= target
//   rank_notify(ctx, peer, f, value)                     peer's:    peer.f[ctx.rank] = value
//   rank_wait(ctx, peer, f, target)                      own rank:  wait f[peer] >= target
// rank_notify/rank_wait to and from every peer form a barrier (see rank_barrier in each backend).
#pragma once

#include "tilelink/core/workspace.hpp"

namespace tilelink {

enum class Scope : uint8_t { kBlock, kGpu, kSystem };

// The signal fields of the library's plans, and a few generic ones for programs of one's own, so a
// timeout on any backend names the field it waited on: "tile_ready[3] of rank 2". One byte on the
// device (the fault record carries it to the host).
enum class SignalField : uint8_t {
  kSignal,       // unnamed
  kRankSignals,  // a barrier's per-rank slots (rank_wait)
  kTileReady,    // AllGather: a comm tile's rows are in the gathered buffer
  kTileDone,     // a producer's (GEMM's) tile of the partial is stored
  kStaged,       // ReduceScatter push: a source's tile is in the owner's staging slot
  kBandReady,    // AllReduce two-shot: an owner's reduced band is ready
  kCountsReady,  // AllToAll: a peer's row counts have landed
  kRowsReady,    // AllToAll: a peer's rows have landed
  kReady,        // generic: a producer's item is ready
  kAck,          // generic: a consumer is done with an item
  kConsumed,     // generic: a slot may be overwritten
  kProbe,        // the microbenchmarks' ping-pong flags
};

TL_HD constexpr const char* signal_field_name(SignalField f) {
  switch (f) {
    case SignalField::kSignal: return "signal";
    case SignalField::kRankSignals: return "rank_signals";
    case SignalField::kTileReady: return "tile_ready";
    case SignalField::kTileDone: return "tile_done";
    case SignalField::kStaged: return "staged";
    case SignalField::kBandReady: return "band_ready";
    case SignalField::kCountsReady: return "counts_ready";
    case SignalField::kRowsReady: return "rows_ready";
    case SignalField::kReady: return "ready";
    case SignalField::kAck: return "ack";
    case SignalField::kConsumed: return "consumed";
    case SignalField::kProbe: return "probe";
  }
  return "signal";
}

// What a wait is for, for the timeout report. `tile` is -1 for rank-level waits.
struct WaitSite {
  SignalField field = SignalField::kSignal;
  int tile = -1;
  TL_HD const char* name() const { return signal_field_name(field); }
};

}  // namespace tilelink
