// The stream (copy engine) primitives of the CUDA backend.
#include "tilelink/backend/cuda/stream_prim.hpp"

#include <cuda.h>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/epoch.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cuda {

namespace {

// Graph mode's signal operations: one thread, the value read from the epoch counter when it runs.
template <Scope S>
__global__ void graph_notify_kernel(DeviceContext ctx, SymmetricView heap, int peer, Field<Signal> f,
                                    int slot, Epoch value) {
  peer_tile_notify<S>(ctx, heap, peer, f, slot, value.value());
}
template <Scope S>
__global__ void graph_wait_kernel(DeviceContext ctx, SymmetricView heap, int owner, Field<Signal> f,
                                  int slot, WaitSite site, Epoch target) {
  peer_tile_wait<S>(ctx, heap, owner, f, slot, target.value(), site);
}
template <Scope S>
__global__ void graph_barrier_kernel(DeviceContext ctx, SymmetricView heap, Field<Signal> f, Epoch epoch) {
  rank_barrier<S>(ctx, heap, f, epoch.value());
}
TL_REGISTER_KERNELS(graph_notify_kernel<Scope::kGpu>, graph_notify_kernel<Scope::kSystem>,
                    graph_wait_kernel<Scope::kGpu>, graph_wait_kernel<Scope::kSystem>,
                    graph_barrier_kernel<Scope::kGpu>, graph_barrier_kernel<Scope::kSystem>);

void check_launch(const StreamContext& ctx) {
  const cudaError_t e = cudaGetLastError();
  TL_REQUIRE(e == cudaSuccess, "op " << ctx.op << ": graph-mode signal kernel on rank " << ctx.rank
                                     << " failed to launch: " << cudaGetErrorString(e));
}

// Graph mode: owner's f[slot] = *counter + value / wait for owner's f[slot] >= *counter + target.
void graph_notify(const StreamContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
                  int slot, uint64_t value) {
  const DeviceContext dc = ctx.world->device_context(ctx.rank);
  const Epoch e{value, ctx.epoch_counter};
  if (ctx.world->scope() == Scope::kGpu)
    graph_notify_kernel<Scope::kGpu><<<1, 1, 0, ctx.stream>>>(dc, heap, peer, f, slot, e);
  else
    graph_notify_kernel<Scope::kSystem><<<1, 1, 0, ctx.stream>>>(dc, heap, peer, f, slot, e);
  check_launch(ctx);
}
void graph_wait(const StreamContext& ctx, const SymmetricView& heap, int owner, Field<Signal> f,
                int slot, WaitSite site, uint64_t target) {
  const DeviceContext dc = ctx.world->device_context(ctx.rank);
  const Epoch e{target, ctx.epoch_counter};
  if (ctx.world->scope() == Scope::kGpu)
    graph_wait_kernel<Scope::kGpu><<<1, 1, 0, ctx.stream>>>(dc, heap, owner, f, slot, site, e);
  else
    graph_wait_kernel<Scope::kSystem><<<1, 1, 0, ctx.stream>>>(dc, heap, owner, f, slot, site, e);
  check_launch(ctx);
}

void check(const StreamContext& ctx, const SymmetricView& heap, int owner, Field<Signal> f,
           int slot) {
  TL_REQUIRE(ctx.world && ctx.stream, "op " << ctx.op << ": stream context without a world or stream");
  TL_REQUIRE(owner >= 0 && owner < heap.world_size,
             "op " << ctx.op << ": rank " << owner << " outside a world of " << heap.world_size);
  TL_REQUIRE(slot >= 0 && slot < f.count,
             "op " << ctx.op << ": signal slot " << slot << " outside a field of " << f.count);
}

void write_value(const StreamContext& ctx, uint64_t* addr, uint64_t value) {
  // NOTE: flags 0 = the write waits for the stream's earlier work and is preceded by a memory
  // barrier: a release.
  TL_CU_CHECK(::tilelink::cuda::driver::cuStreamWriteValue64(reinterpret_cast<CUstream>(ctx.stream),
                                   reinterpret_cast<CUdeviceptr>(addr), value, 0));
}

void wait_value(const StreamContext& ctx, uint64_t* addr, int owner, int slot, uint64_t target,
                WaitSite site) {
  TL_CU_CHECK(::tilelink::cuda::driver::cuStreamWaitValue64(reinterpret_cast<CUstream>(ctx.stream),
                                  reinterpret_cast<CUdeviceptr>(addr), target,
                                  CU_STREAM_WAIT_VALUE_GEQ));
  ctx.world->note_stream_wait({ctx.rank, owner, slot, site.tile, site.name(), addr, target});
}

}  // namespace

void producer_tile_notify(const StreamContext& ctx, const SymmetricView& heap, Field<Signal> f,
                          int slot, uint64_t value) {
  check(ctx, heap, ctx.rank, f, slot);
  if (ctx.epoch_counter) return graph_notify(ctx, heap, ctx.rank, f, slot, value);
  write_value(ctx, heap.peer(ctx.rank, f) + slot, value);
}

void consumer_tile_wait(const StreamContext& ctx, const SymmetricView& heap, Field<Signal> f,
                        int slot, uint64_t target, WaitSite site) {
  check(ctx, heap, ctx.rank, f, slot);
  if (ctx.epoch_counter) return graph_wait(ctx, heap, ctx.rank, f, slot, site, target);
  wait_value(ctx, heap.peer(ctx.rank, f) + slot, ctx.rank, slot, target, site);
}

void peer_tile_notify(const StreamContext& ctx, const SymmetricView& heap, int peer,
                      Field<Signal> f, int slot, uint64_t value) {
  check(ctx, heap, peer, f, slot);
  if (ctx.epoch_counter) return graph_notify(ctx, heap, peer, f, slot, value);
  write_value(ctx, heap.peer(peer, f) + slot, value);
}

void peer_tile_wait(const StreamContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
                    int slot, uint64_t target, WaitSite site) {
  check(ctx, heap, peer, f, slot);
  if (ctx.epoch_counter) return graph_wait(ctx, heap, peer, f, slot, site, target);
  wait_value(ctx, heap.peer(peer, f) + slot, peer, slot, target, site);
}

void rank_notify(const StreamContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
                 uint64_t value) {
  check(ctx, heap, peer, f, ctx.rank);
  if (ctx.epoch_counter) return graph_notify(ctx, heap, peer, f, ctx.rank, value);
  write_value(ctx, heap.peer(peer, f) + ctx.rank, value);
}

void rank_wait(const StreamContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
               uint64_t target) {
  check(ctx, heap, ctx.rank, f, peer);
  if (ctx.epoch_counter) return graph_wait(ctx, heap, ctx.rank, f, peer, WaitSite{SignalField::kRankSignals, -1}, target);
  wait_value(ctx, heap.peer(ctx.rank, f) + peer, ctx.rank, peer, target,
             WaitSite{SignalField::kRankSignals, -1});
}

void rank_barrier(const StreamContext& ctx, const SymmetricView& heap, Field<Signal> f,
                  uint64_t epoch) {
  if (ctx.epoch_counter) {  // one kernel: every notify, then every wait
    TL_REQUIRE(ctx.world && ctx.stream, "op " << ctx.op << ": stream context without a world or stream");
    const DeviceContext dc = ctx.world->device_context(ctx.rank);
    const Epoch e{epoch, ctx.epoch_counter};
    if (ctx.world->scope() == Scope::kGpu)
      graph_barrier_kernel<Scope::kGpu><<<1, 1, 0, ctx.stream>>>(dc, heap, f, e);
    else
      graph_barrier_kernel<Scope::kSystem><<<1, 1, 0, ctx.stream>>>(dc, heap, f, e);
    return check_launch(ctx);
  }
  for (int p = 0; p < heap.world_size; ++p) rank_notify(ctx, heap, p, f, epoch);
  for (int p = 0; p < heap.world_size; ++p) rank_wait(ctx, heap, p, f, epoch);
}

void rank_copy_data(const StreamContext& ctx, int peer, const Copy2D& c) {
  TL_REQUIRE(ctx.world && ctx.stream, "op " << ctx.op << ": stream context without a world or stream");
  TL_REQUIRE(peer >= 0 && peer < ctx.world->size(),
             "op " << ctx.op << ": copy with rank " << peer << " outside a world of " << ctx.world->size());
  if (c.rows <= 0 || c.row_bytes <= 0) return;
  TL_REQUIRE(c.src && c.dst, "op " << ctx.op << ": copy with a null pointer");
  // NOTE: contiguous rows go as one 1-D copy: measured on the H200 (bench/diag/ce_probe.cu), a
  // cudaMemcpy2DAsync of 8 KiB rows moves ~0.83 TB/s where the same bytes in one cudaMemcpyAsync move
  // ~2.0 TB/s, even with both pitches equal to the row.
  if (c.src_pitch == c.row_bytes && c.dst_pitch == c.row_bytes) {
    TL_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, static_cast<size_t>(c.rows) * static_cast<size_t>(c.row_bytes),
                                  cudaMemcpyDefault, ctx.stream));
    return;
  }
  TL_CUDA_CHECK(cudaMemcpy2DAsync(c.dst, static_cast<size_t>(c.dst_pitch), c.src,
                                  static_cast<size_t>(c.src_pitch), static_cast<size_t>(c.row_bytes),
                                  static_cast<size_t>(c.rows), cudaMemcpyDefault, ctx.stream));
}

}  // namespace tilelink::cuda
