// The ReduceScatter half of GEMM+RS on the CUDA backend: the reduce program of
// ops/gemm_rs_plan.hpp, and the compute program's publishing side for a finished partial.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "launch.hpp"
#include "reduce_rect.cuh"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/ops/cuda/comm.hpp"

namespace tilelink::cuda {

namespace {

using detail::claim_band;
using detail::kBandRows;
using detail::reduce_rect;
using detail::Sources;

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

// reduce program: every reduce tile of this rank's segment, after the gemm tiles covering it on
// every source rank (peers first, own last, as on the CPU); sources summed in rank order.
// The unit of work is a band of a reduce tile, and the worker a warp (BandWalk, above). Each
// warp waits for its own band's signals (one signal a lane) and sums it alone, with no barrier:
// while some warps of an SM wait on a signal or a load, the others have theirs in flight. (The
// first version gave each tile to a whole block, waits then loads then stores in lock-step with a
// __syncthreads per tile: on two H200s it reduced ~12 GB/s of output an SM, against ~45 GB/s that
// one SM reads from a peer; bench/notes.)
template <Scope S, bool kPush>
__device__ void reduce_tiles(const GemmRsPlan& p, const SymmetricView& heap,
                             const DeviceContext& ctx, void* c, uint64_t epoch, int warp, int warps,
                             uint64_t* claims) {
  const Warp lanes{static_cast<int>(threadIdx.x % 32)};
  const int64_t eb = p.elem_bytes();
  const int64_t seg0 = p.rows.begin(ctx.rank);
  BandWalk walk{p, claims, epoch, warp, warps, lanes};
  for (Rect r; walk.next(&r);) {
    wait_band<S, kPush>(p, heap, ctx, r, epoch, lanes);
    Sources srcs;
    srcs.ld = p.n;
    for (int s = 0; s < p.world_size; ++s) {
      if constexpr (kPush)
        srcs.base[s] = heap.local(p.ws.staging) + (p.staging_offset_elems(s, r.row, ctx.rank) + r.col) * eb;
      else
        srcs.base[s] = heap.peer(s, p.ws.partial) + (r.row * p.n + r.col) * eb;
    }
    std::byte* out = static_cast<std::byte*>(c) + ((r.row - seg0) * p.n + r.col) * eb;
    switch (p.dtype) {
      case DType::kF32: reduce_rect<DType::kF32>(srcs, p.world_size, out, p.n, r.rows, r.cols, lanes); break;
      case DType::kBF16: reduce_rect<DType::kBF16>(srcs, p.world_size, out, p.n, r.rows, r.cols, lanes); break;
      case DType::kF16: reduce_rect<DType::kF16>(srcs, p.world_size, out, p.n, r.rows, r.cols, lanes); break;
    }
    // NOTE: no barrier before the next band's waits: they only read signals.
  }
}

template <Scope S, bool kPush>
__global__ void __launch_bounds__(512)
    rs_reduce_kernel(__grid_constant__ const GemmRsPlan p, __grid_constant__ const SymmetricView heap,
                     __grid_constant__ const DeviceContext ctx, void* c, Epoch call) {
  const int warps_per_block = static_cast<int>(blockDim.x / 32);
  uint64_t* claims = p.ws.claims.count > 0 ? heap.local(p.ws.claims) : nullptr;  // pull
  reduce_tiles<S, kPush>(p, heap, ctx, c, call.value(),
                         blockIdx.x * warps_per_block + threadIdx.x / 32,
                         gridDim.x * warps_per_block, claims);
}

// Push: gemm tile `tile` of the partial `mine` [M, N] into the staging slot of this rank on every
// owner whose rows it covers, each announced on the owner's staged slot.
template <Scope S>
__device__ void push_tile(const GemmRsPlan& p, const SymmetricView& heap, const DeviceContext& ctx,
                          const std::byte* mine, TileCoord tile, uint64_t epoch, Block block) {
  const int64_t eb = p.elem_bytes();
  const Rect r = p.gemm.region(tile);
  const int t = p.gemm.linear(tile);
  for (int owner = p.rows.owner_of_row(r.row); owner < p.world_size; ++owner) {
    if (p.rows.begin(owner) >= r.row + r.rows) break;
    const int64_t lo = max64(r.row, p.rows.begin(owner));
    const int64_t hi = min64(r.row + r.rows, p.rows.end(owner));
    if (hi <= lo) continue;
    std::byte* dst = heap.peer(owner, p.ws.staging) + (p.staging_offset_elems(ctx.rank, lo, owner) + r.col) * eb;
    tile_push_data(ctx, owner, Copy2D{mine + (lo * p.n + r.col) * eb, p.n * eb, dst, p.n * eb, hi - lo, r.cols * eb},
                   block);
    block.sync();
    if (block.leader()) peer_tile_notify<S>(ctx, heap, owner, p.ws.staged, p.staged_slot(ctx.rank, t), epoch);
  }
}

// Fused GEMM+RS, push: blocks [0, pushers) push each finished gemm tile of this rank's partial
// (after its tile_done, in the compute order) into the owners' staging slots; the other blocks
// reduce this rank's segment from its own staging. `push` is the push-mode plan (staging, staged),
// `partial`/`tile_done` the engine's local output and signals (a pull-mode workspace).
// NOTE: bounded to 512 threads a block (128 registers a thread): both roles in one kernel took more
// registers than a 512-thread launch has (cudaErrorLaunchOutOfResources on the H200).
template <Scope S>
__global__ void __launch_bounds__(512)
    rs_push_reduce_kernel(__grid_constant__ const GemmRsPlan push, __grid_constant__ const SymmetricView push_heap,
                          __grid_constant__ const SymmetricView local_heap, ByteField partial,
                          Field<Signal> tile_done, __grid_constant__ const DeviceContext ctx, void* c, Epoch call,
                          int pushers) {
  const uint64_t epoch = call.value();
  const Block block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  if (static_cast<int>(blockIdx.x) < pushers) {
    const std::byte* mine = local_heap.local(partial);
    for (int i = blockIdx.x; i < push.compute_order.count(); i += pushers) {
      const TileCoord tile = push.compute_order.at(i);
      const int t = push.gemm.linear(tile);
      if (block.leader())
        consumer_tile_wait<S>(ctx, local_heap, tile_done, t, epoch, WaitSite{"tile_done", t});
      block.sync();
      push_tile<S>(push, push_heap, ctx, mine, tile, epoch, block);
    }
  } else {
    const int warps_per_block = static_cast<int>(blockDim.x / 32);
    reduce_tiles<S, true>(push, push_heap, ctx, c, epoch,
                          (blockIdx.x - pushers) * warps_per_block + threadIdx.x / 32,
                          (gridDim.x - pushers) * warps_per_block, nullptr);
  }
}

// The compute program's publishing side, for a finished partial P_r [M, N].
template <Scope S, bool kPush>
__global__ void rs_publish_kernel(__grid_constant__ const GemmRsPlan p, __grid_constant__ const SymmetricView heap,
                                  __grid_constant__ const DeviceContext ctx,
                                  const void* partial, Epoch call) {
  const uint64_t epoch = call.value();
  const Block block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  const int64_t eb = p.elem_bytes();
  const std::byte* mine = static_cast<const std::byte*>(partial);
  if (block.leader()) rank_barrier<S>(ctx, heap, p.ws.barrier, epoch);
  block.sync();
  for (int i = blockIdx.x; i < p.compute_order.count(); i += gridDim.x) {
    const TileCoord tile = p.compute_order.at(i);
    const Rect r = p.gemm.region(tile);
    const int t = p.gemm.linear(tile);
    if constexpr (!kPush) {
      const int64_t off = (r.row * p.n + r.col) * eb;
      tile_push_data(ctx, ctx.rank,
                     Copy2D{mine + off, p.n * eb, heap.local(p.ws.partial) + off, p.n * eb, r.rows,
                            r.cols * eb},
                     block);
      block.sync();
      if (block.leader()) producer_tile_notify<S>(ctx, heap, p.ws.tile_done, t, epoch);
    } else {
      push_tile<S>(p, heap, ctx, mine, tile, epoch, block);
    }
  }
}

TL_REGISTER_KERNELS(rs_reduce_kernel<Scope::kGpu, false>, rs_reduce_kernel<Scope::kGpu, true>,
                    rs_reduce_kernel<Scope::kSystem, false>, rs_reduce_kernel<Scope::kSystem, true>,
                    rs_publish_kernel<Scope::kGpu, false>, rs_publish_kernel<Scope::kGpu, true>,
                    rs_publish_kernel<Scope::kSystem, false>, rs_publish_kernel<Scope::kSystem, true>,
                    rs_push_reduce_kernel<Scope::kGpu>, rs_push_reduce_kernel<Scope::kSystem>);

void check(World& world, const GemmRsPlan& p, const SymmetricView& heap, const CommLaunch& how,
           const char* op) {
  TL_REQUIRE(p.world_size == world.size(), op << ": a plan for " << p.world_size
                                              << " ranks in a world of " << world.size());
  TL_REQUIRE(heap.rank == p.rank && heap.world_size == p.world_size,
             op << ": the heap view is rank " << heap.rank << "'s, the plan rank " << p.rank << "'s");
  TL_REQUIRE(how.method != CopyMethod::kCopyEngine,
             op << ": the copy engine cannot reduce; use the vector method");
  TL_REQUIRE(how.threads >= 32 && how.threads <= 1024 && how.threads % 32 == 0,
             op << ": threads per block must be a multiple of 32 in [32, 1024], got " << how.threads);
}

template <Scope S>
void reduce_at(World& world, const GemmRsPlan& p, const SymmetricView& heap, void* c,
               Epoch epoch, const CommLaunch& how) {
  auto* k = p.config.mode == CommMode::kPush ? rs_reduce_kernel<S, true> : rs_reduce_kernel<S, false>;
  detail::launch_on_rank_stream(world, p.rank, how.stream, "rs_reduce", k, how.workers, how.threads,
                                0, p, heap, world.device_context(p.rank), c, epoch);
}

template <Scope S>
void publish_at(World& world, const GemmRsPlan& p, const SymmetricView& heap, const void* partial,
                Epoch epoch, const CommLaunch& how) {
  auto* k = p.config.mode == CommMode::kPush ? rs_publish_kernel<S, true> : rs_publish_kernel<S, false>;
  detail::launch_on_rank_stream(world, p.rank, how.stream, "rs_publish", k, how.workers,
                                how.threads, 0, p, heap, world.device_context(p.rank), partial,
                                epoch);
}

}  // namespace

void launch_rs_reduce(World& world, const GemmRsPlan& p, const SymmetricView& heap, void* c,
                      Epoch epoch, const CommLaunch& how) {
  check(world, p, heap, how, "rs_reduce");
  TL_REQUIRE(c || p.rows.size(p.rank) == 0, "rs_reduce: null C on rank " << p.rank);
  TL_REQUIRE(epoch.on_device() || epoch.offset >= 1, "rs_reduce: epochs start at 1");
  if (world.scope() == Scope::kGpu) reduce_at<Scope::kGpu>(world, p, heap, c, epoch, how);
  else reduce_at<Scope::kSystem>(world, p, heap, c, epoch, how);
}

void launch_rs_push_reduce(World& world, const GemmRsPlan& push, const SymmetricView& push_heap,
                           const SymmetricView& local_heap, ByteField partial, Field<Signal> tile_done,
                           void* c, Epoch epoch, const CommLaunch& how, int pushers) {
  check(world, push, push_heap, how, "rs_push_reduce");
  TL_REQUIRE(push.config.mode == CommMode::kPush, "rs_push_reduce: needs a push-mode plan");
  TL_REQUIRE(c || push.rows.size(push.rank) == 0, "rs_push_reduce: null C on rank " << push.rank);
  TL_REQUIRE(epoch.on_device() || epoch.offset >= 1, "rs_push_reduce: epochs start at 1");
  TL_REQUIRE(pushers >= 1 && pushers < how.workers,
             "rs_push_reduce: " << how.workers << " workers cannot hold " << pushers
                                << " pushers and at least one reducer");
  TL_REQUIRE(tile_done.count >= push.gemm.num_tiles() &&
                 partial.count >= push.m() * push.n * push.elem_bytes(),
             "rs_push_reduce: the local partial/tile_done are smaller than the plan's gemm grid");
  auto* k = world.scope() == Scope::kGpu ? rs_push_reduce_kernel<Scope::kGpu> : rs_push_reduce_kernel<Scope::kSystem>;
  detail::launch_on_rank_stream(world, push.rank, how.stream, "rs_push_reduce", k, how.workers,
                                how.threads, 0, push, push_heap, local_heap, partial, tile_done,
                                world.device_context(push.rank), c, epoch, pushers);
}

void launch_rs_publish(World& world, const GemmRsPlan& p, const SymmetricView& heap,
                       const void* partial, Epoch epoch, const CommLaunch& how) {
  check(world, p, heap, how, "rs_publish");
  TL_REQUIRE(partial, "rs_publish: null partial on rank " << p.rank);
  TL_REQUIRE(epoch.on_device() || epoch.offset >= 1, "rs_publish: epochs start at 1");
  if (world.scope() == Scope::kGpu) publish_at<Scope::kGpu>(world, p, heap, partial, epoch, how);
  else publish_at<Scope::kSystem>(world, p, heap, partial, epoch, how);
}

}  // namespace tilelink::cuda
