// The CUDA backend of the tile-centric primitives (contracts: prim/signal.hpp, prim/data.hpp).
//
// Same names and argument order as tilelink::cpu; the rank context is a DeviceContext, the scope of
// a signal is a template argument, and the participants of a data move are the last argument.
//
//   // one thread of the block notifies, after the block's data stores:
//   block.sync();
//   if (block.leader()) producer_tile_notify<Scope::kGpu>(ctx, heap, ws.tile_ready, t, epoch);
//
//   // one thread waits, then the block reads (bar.sync carries the acquire to every thread):
//   if (block.leader()) peer_tile_wait<Scope::kGpu>(ctx, heap, owner, ws.tile_ready, t, epoch, site);
//   block.sync();
//
// Signals (one calling thread each)
//   producer_tile_notify<S>(ctx, heap, f, slot, value)          own f[slot] = value, release at S
//   consumer_tile_wait<S>(ctx, heap, f, slot, target, site)     own f[slot] >= target, acquire at S
//   peer_tile_notify<S>(ctx, heap, peer, f, slot, value)        peer's f[slot] = value, release
//   peer_tile_wait<S>(ctx, heap, peer, f, slot, target, site)   peer's f[slot] >= target, acquire
//   rank_notify<S>(ctx, heap, peer, f, value)                   peer's f[ctx.rank] = value
//   rank_wait<S>(ctx, heap, peer, f, target)                    own f[peer] >= target
//   rank_barrier<S>(ctx, heap, f, epoch)                        notify all, then wait for all
//   warp_tile_wait<S, R>(ctx, heap, owner, f, begin, end, target, site)
//                       (all 32 lanes, converged) owner's f[s] >= target for every s in
//                       [begin, end), lane i taking slots begin + i, begin + i + 32, ...
//   Raw signals (a signal outside a symmetric heap: an engine's tests and benchmarks)
//   signal_notify<S>(p, value)                                  *p = value, release at S
//   signal_wait<S, R>(ctx, p, slot, target, site)               *p >= target, acquire at S
//   A release is cumulative: writes of other threads ordered before it (by a bar.sync of their
//   group) are released too. Every wait ends with fence.proxy.async.global, so bulk/TMA loads issued
//   after it see what the acquire saw.
//   Bounded: after ctx.timeout_ns (or once a faulted peer has set this rank's stop word) a wait
//   records rank, owner, tile, slot, expected and observed in ctx.fault (the first fault of the
//   world's process wins), prints them once, and traps. World::sync() turns the trap into a
//   tilelink::TimeoutError that names the op. The waits' R (Report) picks the end: kPrint as above,
//   kQuiet records and traps without printing and without a function call, the form for code
//   inside the GEMM engine (a call there makes ptxas serialise every wgmma of the kernel).
//
// Data (SM-driven; ordering as in prim/data.hpp: nothing by itself)
//   tile_push_data(ctx, peer, copy, group)   group-wide 16-byte vector copy (4-byte or byte copy
//   tile_pull_data(ctx, peer, copy, group)   where pointers or pitches are not 16-byte aligned),
//                                            8 vectors in flight per thread
//   tile_push_data(ctx, peer, copy, pipe)    bulk copy through shared memory (cp.async.bulk, TMA
//   tile_pull_data(ctx, peer, copy, pipe)    engine) driven by one thread; complete (stores done,
//                                            proxy-fenced) when it returns, so a notify may follow
//   The copy engine path (rank_copy_data) is host-side: backend/cuda/stream_prim.hpp.
#pragma once

#include <cstdint>

#include "tilelink/core/symmetric.hpp"
#include "tilelink/prim/data.hpp"
#include "tilelink/prim/signal.hpp"

namespace tilelink::cuda {

// The first failed wait of a world's process, in host-mapped memory (readable after the context
// has died).
struct DeviceFault {
  unsigned int claimed;  // 0 until a failed wait has written the fields below (written last)
  int rank, owner, tile, slot, kind;  // kind: 0 signal wait timed out, 1 bulk-copy barrier timed out,
                                      // 2 signal wait stopped because rank `stopped_by` faulted
  int field;                          // kinds 0 and 2: the SignalField waited on
  int stopped_by;                     // kind 2
  unsigned long long expected, observed, waited_ns;
};

// What device code of one rank receives (by value, as a kernel parameter).
// Fault propagation: every rank has a stop word in device memory that its peers can write (a
// symmetric allocation of the world). A rank whose wait times out writes 1 + its rank into every
// rank's stop word (the first writer wins) before it traps; every bounded wait polls its own rank's
// word while it spins and stops (records, traps) once it is set, so the peers of a faulted rank
// stop within a few microseconds of polling instead of at their own deadlines, and each names the
// rank that faulted.
struct DeviceContext {
  int rank = 0;
  int world_size = 1;
  uint64_t timeout_ns = 20'000'000'000ull;
  DeviceFault* fault = nullptr;
  // The fault record's claim word, in device memory (one per process; the first fault takes it):
  // compute-sanitizer's memcheck refuses system-scope atomics on mapped host memory.
  unsigned int* claim = nullptr;
  unsigned int* stop = nullptr;          // this rank's stop word: 0, or 1 + the rank that faulted
  unsigned int* const* stops = nullptr;  // every rank's stop word, as this rank addresses it [world]
};

// How a failed wait ends (both record the fault and trap): kPrint also prints it (a noinline call),
// kQuiet makes no call.
enum class Report : uint8_t { kPrint, kQuiet };

// ---- participants -----------------------------------------------------------------------------
// Who takes part in a data move. The caller passes its own index: components never read threadIdx.
struct Thread {
  TL_DEVICE int index() const { return 0; }
  TL_DEVICE int size() const { return 1; }
  TL_DEVICE bool leader() const { return true; }
  TL_DEVICE void sync() const {}
};
struct Warp {
  int lane = 0;
  TL_DEVICE int index() const { return lane; }
  TL_DEVICE int size() const { return 32; }
  TL_DEVICE bool leader() const { return lane == 0; }
  TL_DEVICE void sync() const;
};
struct Block {
  int thread = 0;
  int threads = 1;
  TL_DEVICE int index() const { return thread; }
  TL_DEVICE int size() const { return threads; }
  TL_DEVICE bool leader() const { return thread == 0; }
  TL_DEVICE void sync() const;
};

// ---- signals ----------------------------------------------------------------------------------
template <Scope S>
TL_DEVICE void producer_tile_notify(const DeviceContext& ctx, const SymmetricView& heap,
                                    Field<Signal> f, int slot, uint64_t value);
template <Scope S, Report R = Report::kPrint>
TL_DEVICE void consumer_tile_wait(const DeviceContext& ctx, const SymmetricView& heap,
                                  Field<Signal> f, int slot, uint64_t target, WaitSite site);
template <Scope S>
TL_DEVICE void peer_tile_notify(const DeviceContext& ctx, const SymmetricView& heap, int peer,
                                Field<Signal> f, int slot, uint64_t value);
template <Scope S, Report R = Report::kPrint>
TL_DEVICE void peer_tile_wait(const DeviceContext& ctx, const SymmetricView& heap, int peer,
                              Field<Signal> f, int slot, uint64_t target, WaitSite site);
template <Scope S>
TL_DEVICE void rank_notify(const DeviceContext& ctx, const SymmetricView& heap, int peer,
                           Field<Signal> f, uint64_t value);
template <Scope S, Report R = Report::kPrint>
TL_DEVICE void rank_wait(const DeviceContext& ctx, const SymmetricView& heap, int peer,
                         Field<Signal> f, uint64_t target);
template <Scope S>
TL_DEVICE void rank_barrier(const DeviceContext& ctx, const SymmetricView& heap, Field<Signal> f,
                            uint64_t epoch);
template <Scope S, Report R = Report::kPrint>
TL_DEVICE void warp_tile_wait(const DeviceContext& ctx, const SymmetricView& heap, int owner,
                              Field<Signal> f, int begin, int end, uint64_t target, WaitSite site);
template <Scope S>
TL_DEVICE void signal_notify(uint64_t* signal, uint64_t value);
template <Scope S, Report R = Report::kPrint>
TL_DEVICE void signal_wait(const DeviceContext& ctx, uint64_t* signal, int slot, uint64_t target,
                           WaitSite site);
// The observed value (acquire), for tests and diagnostics.
template <Scope S>
TL_DEVICE uint64_t signal_load(const SymmetricView& heap, int rank, Field<Signal> f, int slot);

// ---- data: vector copies by a group of threads --------------------------------------------------
template <class Group>
TL_DEVICE void tile_push_data(const DeviceContext& ctx, int peer, const Copy2D& copy, Group g);
template <class Group>
TL_DEVICE void tile_pull_data(const DeviceContext& ctx, int peer, const Copy2D& copy, Group g);

// ---- data: bulk copies through a shared-memory pipeline ------------------------------------------
// A pipeline of `stages` shared-memory buffers of `stage_bytes` each (multiple of 16), with one
// mbarrier per stage. State: the number of chunks loaded so far, which gives each stage's phase.
// Made once per block by one thread (init), then used by that thread alone.
class BulkPipe {
 public:
  // smem: stages * stage_bytes bytes, 128-byte aligned; bars: `stages` mbarriers (8 bytes each).
  TL_DEVICE void init(void* smem, uint64_t* bars, int stages, uint32_t stage_bytes,
                      const DeviceContext& ctx);
  // Copies `bytes` contiguous bytes (src, dst, bytes all multiples of 16); returns once every store
  // has completed and been fenced for the generic proxy.
  TL_DEVICE void copy(const void* src, void* dst, uint64_t bytes);
  // Copy2D: contiguous or per row; unaligned copies fall back to a one-thread vector copy.
  TL_DEVICE void copy(const Copy2D& c);
  // Also prefetch the source into L2 (cp.async.bulk.prefetch.L2) this many chunks ahead of the
  // loads (0 = off).
  TL_DEVICE void set_prefetch(int chunks) { prefetch_ = chunks < 0 ? 0 : chunks; }

 private:
  TL_DEVICE void load(uint64_t chunk, const char* src, uint32_t bytes);
  TL_DEVICE void wait_loaded(uint64_t chunk);
  char* smem_ = nullptr;
  uint64_t* bars_ = nullptr;
  int stages_ = 1;
  uint32_t stage_bytes_ = 0;
  uint64_t loaded_ = 0;  // chunks loaded over the pipe's life: chunk c uses stage c % stages
  int prefetch_ = 0;
  DeviceContext ctx_{};
};

TL_DEVICE void tile_push_data(const DeviceContext& ctx, int peer, const Copy2D& copy,
                              BulkPipe& pipe);
TL_DEVICE void tile_pull_data(const DeviceContext& ctx, int peer, const Copy2D& copy,
                              BulkPipe& pipe);

}  // namespace tilelink::cuda

#include "tilelink/backend/cuda/impl/signal.cuh"
#include "tilelink/backend/cuda/impl/copy.cuh"
#include "tilelink/backend/cuda/impl/bulk.cuh"
