// The stream (copy engine) side of the CUDA backend: the same primitives, enqueued on a rank's
// stream by the host. Signals become cuStreamWriteValue64 (a release: the write follows every
// earlier operation of the stream, memory barrier included) and cuStreamWaitValue64 (>=, with a
// flush of remote writes where the device supports it); data moves by cudaMemcpy2DAsync on the
// copy engine. Same names and argument order as tilelink::cpu; the context is a StreamContext.
//
//   StreamContext sc{&world, r, world.stream(r), "ag_gemm"};
//   peer_tile_wait(sc, heap, owner, ws.tile_ready, t, epoch, WaitSite{SignalField::kTileReady, t});
//   rank_copy_data(sc, owner, copy);
//   producer_tile_notify(sc, heap, ws.tile_ready, t, epoch);
//
// Bounded: a stream wait cannot time out on the device; each one is noted in the world, and
// World::sync() reports the first that never completed (op, rank, tile, slot, expected, observed).
//
// Graph mode (epoch_counter set): a stream wait/write-value bakes its value into the stream (and
// into a captured graph), so a replay would see the values of the captured call. With a counter,
// every value and target is an offset added (wrapping) to *epoch_counter when the operation runs,
// and each signal operation is a one-thread kernel on the stream (a bounded device wait: a timeout
// traps and World::sync() reports it). Copies stay on the copy engine.
#pragma once

#include <cuda_runtime_api.h>

#include "tilelink/core/symmetric.hpp"
#include "tilelink/prim/data.hpp"
#include "tilelink/prim/signal.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda {

struct StreamContext {
  World* world = nullptr;
  int rank = 0;
  cudaStream_t stream = nullptr;
  const char* op = "?";
  const uint64_t* epoch_counter = nullptr;  // graph mode: values are offsets from *epoch_counter
};

void producer_tile_notify(const StreamContext& ctx, const SymmetricView& heap, Field<Signal> f,
                          int slot, uint64_t value);
void consumer_tile_wait(const StreamContext& ctx, const SymmetricView& heap, Field<Signal> f,
                        int slot, uint64_t target, WaitSite site);
void peer_tile_notify(const StreamContext& ctx, const SymmetricView& heap, int peer,
                      Field<Signal> f, int slot, uint64_t value);
void peer_tile_wait(const StreamContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
                    int slot, uint64_t target, WaitSite site);
void rank_notify(const StreamContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
                 uint64_t value);
void rank_wait(const StreamContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
               uint64_t target);
void rank_barrier(const StreamContext& ctx, const SymmetricView& heap, Field<Signal> f,
                  uint64_t epoch);

// A rank-level block moved by the copy engine (cudaMemcpy2DAsync on ctx.stream).
void rank_copy_data(const StreamContext& ctx, int peer, const Copy2D& copy);

// The executor of the comm programs written over an executor (comm/allgather.hpp) on the copy
// engine: every operation enqueued in program order on the rank's stream.
struct StreamExec {
  StreamContext sc;
  SymmetricView heap;

  std::byte* local(ByteField f) const { return heap.local(f); }
  std::byte* peer(int rank, ByteField f) const { return heap.peer(rank, f); }
  void barrier(Field<Signal> f, uint64_t epoch) const { rank_barrier(sc, heap, f, epoch); }
  void wait(int owner, Field<Signal> f, int slot, uint64_t target, WaitSite site) const {
    peer_tile_wait(sc, heap, owner, f, slot, target, site);
  }
  void pull(int owner, const Copy2D& c) const { rank_copy_data(sc, owner, c); }
  void push(int peer, const Copy2D& c) const { rank_copy_data(sc, peer, c); }
  void notify_local(Field<Signal> f, int slot, uint64_t value) const { producer_tile_notify(sc, heap, f, slot, value); }
  void notify_peer(int peer, Field<Signal> f, int slot, uint64_t value) const {
    peer_tile_notify(sc, heap, peer, f, slot, value);
  }
};

}  // namespace tilelink::cuda
