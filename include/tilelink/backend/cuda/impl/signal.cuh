// Bodies of the CUDA signal primitives (contracts: backend/cuda/prim.cuh).
#pragma once

#include <cuda/atomic>
#include <cuda/ptx>

#include <cstdio>

namespace tilelink::cuda {

namespace detail {

template <Scope S>
struct ThreadScopeOf;
template <>
struct ThreadScopeOf<Scope::kBlock> {
  static constexpr ::cuda::thread_scope value = ::cuda::thread_scope_block;
};
template <>
struct ThreadScopeOf<Scope::kGpu> {
  static constexpr ::cuda::thread_scope value = ::cuda::thread_scope_device;
};
template <>
struct ThreadScopeOf<Scope::kSystem> {
  static constexpr ::cuda::thread_scope value = ::cuda::thread_scope_system;
};

template <Scope S>
TL_DEVICE TL_INLINE void store_release(uint64_t* p, uint64_t v) {
  ::cuda::atomic_ref<uint64_t, ThreadScopeOf<S>::value>(*p).store(v, ::cuda::memory_order_release);
}
template <Scope S>
TL_DEVICE TL_INLINE uint64_t load_acquire(uint64_t* p) {
  return ::cuda::atomic_ref<uint64_t, ThreadScopeOf<S>::value>(*p).load(::cuda::memory_order_acquire);
}

TL_DEVICE TL_INLINE uint64_t now_ns() { return ::cuda::ptx::get_sreg_globaltimer(); }

// Every rank's stop word gets 1 + this rank (unless another rank's fault got there first).
TL_DEVICE TL_INLINE void raise_stop(const DeviceContext& ctx) {
  if (ctx.stops == nullptr) return;
  for (int r = 0; r < ctx.world_size; ++r) atomicCAS_system(ctx.stops[r], 0u, static_cast<unsigned>(ctx.rank) + 1u);
  __threadfence_system();
}

// This rank's stop word: 0, or 1 + the rank that faulted.
TL_DEVICE TL_INLINE unsigned stop_word(const DeviceContext& ctx) {
  if (ctx.stop == nullptr) return 0;
  return ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_system>(*ctx.stop).load(::cuda::memory_order_relaxed);
}

// Records a failed wait if it is the first fault of the world's process (on virtual ranks the
// faulting rank's, not a peer's that it stopped), and stops every rank unless this wait was itself
// stopped (kind 2: by rank stop - 1). The record is claimed with an atomic on ctx.claim (device
// memory), then filled with plain stores into host-mapped memory, `claimed` last, so the host reads
// a whole record even after the trap has ended the context. Call-free: returns whether it recorded.
TL_DEVICE TL_INLINE bool record_fault(const DeviceContext& ctx, int owner, int tile, int slot,
                                      SignalField field, uint64_t expected, uint64_t observed,
                                      uint64_t waited_ns, int kind, unsigned stop) {
  if (kind != 2) raise_stop(ctx);
  if (ctx.fault == nullptr || ctx.claim == nullptr || atomicCAS_system(ctx.claim, 0u, 1u) != 0u)
    return false;
  volatile DeviceFault* f = ctx.fault;
  f->rank = ctx.rank;
  f->owner = owner;
  f->tile = tile;
  f->slot = slot;
  f->kind = kind;
  f->field = static_cast<int>(field);
  f->stopped_by = static_cast<int>(stop) - 1;
  f->expected = expected;
  f->observed = observed;
  f->waited_ns = waited_ns;
  __threadfence_system();
  f->claimed = 1u;
  __threadfence_system();
  return true;
}

// The quiet end of a failed wait: records (record_fault) and traps, without a function call, so
// code inside the GEMM engine may use it (a call there serialises every wgmma of the kernel).
// World::sync reports the record.
TL_DEVICE TL_INLINE void fail_wait_quiet(const DeviceContext& ctx, int owner, int tile, int slot,
                                         SignalField field, uint64_t expected, uint64_t observed,
                                         uint64_t waited_ns, int kind, unsigned stop = 0) {
  record_fault(ctx, owner, tile, slot, field, expected, observed, waited_ns, kind, stop);
  __trap();
}

// The printing end of a failed wait: as fail_wait_quiet, and the recording thread prints what it
// recorded. NOTE: noinline keeps the printf and its stack out of the spin loops.
static __device__ __noinline__ void fail_wait(const DeviceContext& ctx, int owner, int tile, int slot,
                                       SignalField field, uint64_t expected, uint64_t observed,
                                       uint64_t waited_ns, int kind, unsigned stop = 0) {
  if (record_fault(ctx, owner, tile, slot, field, expected, observed, waited_ns, kind, stop)) {
    if (kind == 2)
      printf("tilelink: rank %d stopped waiting on %s[%d] of rank %d: rank %d faulted (block %d, thread %d)\n",
             ctx.rank, signal_field_name(field), slot, owner, static_cast<int>(stop) - 1, (int)blockIdx.x,
             (int)threadIdx.x);
    else
      printf("tilelink: rank %d timed out waiting on %s[%d] of rank %d: expected >= %llu, observed %llu "
             "(tile %d, after %.3f s, block %d, thread %d)\n",
             ctx.rank, signal_field_name(field), slot, owner, (unsigned long long)expected,
             (unsigned long long)observed, tile, waited_ns * 1e-9, (int)blockIdx.x, (int)threadIdx.x);
  }
  __trap();
}

// Spins until *p >= target (acquire at S, relaxed polls between), bounded by ctx.timeout_ns and
// stopped by the rank's stop word; no proxy fence. R: how a failed wait ends (Report).
template <Scope S, Report R>
TL_DEVICE TL_INLINE uint64_t spin_until(const DeviceContext& ctx, uint64_t* p, int owner, int slot,
                                        uint64_t target, WaitSite site) {
  uint64_t v = load_acquire<S>(p);
  if (v >= target) return v;
  const uint64_t t0 = now_ns();
  for (uint32_t spins = 1;; ++spins) {
    v = load_acquire<S>(p);
    if (v >= target) return v;
    if ((spins & 255u) != 0) continue;
    const uint64_t waited = now_ns() - t0;
    const unsigned stop = stop_word(ctx);
    if (waited <= ctx.timeout_ns && stop == 0) continue;
    if constexpr (R == Report::kQuiet)
      fail_wait_quiet(ctx, owner, site.tile, slot, site.field, target, v, waited, stop ? 2 : 0, stop);
    else
      fail_wait(ctx, owner, site.tile, slot, site.field, target, v, waited, stop ? 2 : 0, stop);
  }
}

// Spins until *p >= target (acquire at S), bounded by ctx.timeout_ns.
template <Scope S, Report R = Report::kPrint>
TL_DEVICE TL_INLINE void bounded_wait(const DeviceContext& ctx, uint64_t* p, int owner, int slot,
                                      uint64_t target, WaitSite site) {
  spin_until<S, R>(ctx, p, owner, slot, target, site);
  // NOTE: bulk/TMA loads run in the async proxy; this orders them after the acquire.
  ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_global);
}

}  // namespace detail

template <Scope S>
TL_DEVICE TL_INLINE void producer_tile_notify(const DeviceContext& ctx, const SymmetricView& heap,
                                              Field<Signal> f, int slot, uint64_t value) {
  detail::store_release<S>(heap.peer(ctx.rank, f) + slot, value);
}

template <Scope S, Report R>
TL_DEVICE TL_INLINE void consumer_tile_wait(const DeviceContext& ctx, const SymmetricView& heap,
                                            Field<Signal> f, int slot, uint64_t target,
                                            WaitSite site) {
  detail::bounded_wait<S, R>(ctx, heap.peer(ctx.rank, f) + slot, ctx.rank, slot, target, site);
}

template <Scope S>
TL_DEVICE TL_INLINE void peer_tile_notify(const DeviceContext&, const SymmetricView& heap, int peer,
                                          Field<Signal> f, int slot, uint64_t value) {
  detail::store_release<S>(heap.peer(peer, f) + slot, value);
}

template <Scope S, Report R>
TL_DEVICE TL_INLINE void peer_tile_wait(const DeviceContext& ctx, const SymmetricView& heap,
                                        int peer, Field<Signal> f, int slot, uint64_t target,
                                        WaitSite site) {
  detail::bounded_wait<S, R>(ctx, heap.peer(peer, f) + slot, peer, slot, target, site);
}

template <Scope S>
TL_DEVICE TL_INLINE void rank_notify(const DeviceContext& ctx, const SymmetricView& heap, int peer,
                                     Field<Signal> f, uint64_t value) {
  detail::store_release<S>(heap.peer(peer, f) + ctx.rank, value);
}

template <Scope S, Report R>
TL_DEVICE TL_INLINE void rank_wait(const DeviceContext& ctx, const SymmetricView& heap, int peer,
                                   Field<Signal> f, uint64_t target) {
  detail::bounded_wait<S, R>(ctx, heap.peer(ctx.rank, f) + peer, ctx.rank, peer, target,
                          WaitSite{SignalField::kRankSignals, -1});
}

template <Scope S>
TL_DEVICE TL_INLINE void rank_barrier(const DeviceContext& ctx, const SymmetricView& heap,
                                      Field<Signal> f, uint64_t epoch) {
  for (int p = 0; p < ctx.world_size; ++p) rank_notify<S>(ctx, heap, p, f, epoch);
  for (int p = 0; p < ctx.world_size; ++p) rank_wait<S, Report::kPrint>(ctx, heap, p, f, epoch);
}

template <Scope S, Report R>
TL_DEVICE TL_INLINE void warp_tile_wait(const DeviceContext& ctx, const SymmetricView& heap,
                                        int owner, Field<Signal> f, int begin, int end,
                                        uint64_t target, WaitSite site) {
  unsigned lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  uint64_t* slots = heap.peer(owner, f);
  for (int s = begin + static_cast<int>(lane); s < end; s += 32)
    detail::spin_until<S, R>(ctx, slots + s, owner, s, target, site);
  __syncwarp();
  ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_global);
}

template <Scope S>
TL_DEVICE TL_INLINE void signal_notify(uint64_t* signal, uint64_t value) {
  detail::store_release<S>(signal, value);
}

template <Scope S, Report R>
TL_DEVICE TL_INLINE void signal_wait(const DeviceContext& ctx, uint64_t* signal, int slot,
                                     uint64_t target, WaitSite site) {
  detail::bounded_wait<S, R>(ctx, signal, ctx.rank, slot, target, site);
}

template <Scope S>
TL_DEVICE TL_INLINE uint64_t signal_load(const SymmetricView& heap, int rank, Field<Signal> f,
                                         int slot) {
  return detail::load_acquire<S>(heap.peer(rank, f) + slot);
}

TL_DEVICE inline void Warp::sync() const { __syncwarp(); }
TL_DEVICE inline void Block::sync() const { __syncthreads(); }

}  // namespace tilelink::cuda
