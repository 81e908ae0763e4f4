// The ReduceScatter comm plan (comm/reduce_scatter.hpp) on the CUDA backend: its reduce program on
// warps (reduce_rect.cuh's WarpExec), and the producer's side on thread blocks (comm_exec.cuh), the
// very code the CPU backend runs; GEMM+RS's push kernel runs both.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "launch.hpp"
#include "reduce_rect.cuh"
#include "tilelink/backend/cuda/comm_exec.cuh"
#include "tilelink/ops/cuda/comm.hpp"

namespace tilelink::cuda {

namespace {

// The reduce program on every warp of the launch. The unit of work is a band (a warp's item) and
// the worker a warp: each warp waits for its own band's signals (one signal a lane) and sums it
// alone, with no barrier, so while some warps of an SM wait on a signal or a load, the others have
// theirs in flight. (The first version gave each tile to a whole block, waits then loads then stores
// in lock-step with a __syncthreads per tile: on two H200s it reduced ~12 GB/s of output an SM,
// against ~45 GB/s that one SM reads from a peer; bench/notes.) With `claims` (pull) each band goes
// to the warp that claims it next, so launches on other SMs can join the work; without, warp w
// takes bands w, w + warps, ...
template <Scope S>
__device__ void reduce_items(const ReduceScatterPlan& p, const SymmetricView& heap, const DeviceContext& ctx,
                             void* c, uint64_t epoch, int warp, int warps, uint64_t* claims) {
  const Warp lanes{static_cast<int>(threadIdx.x % 32)};
  const detail::WarpExec<S> x{heap, ctx, lanes};
  for (int j = claims ? detail::claim(claims, epoch, lanes) : warp; j < p.count();
       j = claims ? detail::claim(claims, epoch, lanes) : j + warps)
    reduce_scatter_item(x, p, j, epoch, c);  // NOTE: no barrier before the next band's waits
}

template <Scope S>
__global__ void __launch_bounds__(512)
    rs_reduce_kernel(__grid_constant__ const ReduceScatterPlan p, __grid_constant__ const SymmetricView heap,
                     __grid_constant__ const DeviceContext ctx, void* c, Epoch call) {
  const int warps_per_block = static_cast<int>(blockDim.x / 32);
  uint64_t* claims = p.f.claims.count > 0 ? heap.local(p.f.claims) : nullptr;  // pull
  reduce_items<S>(p, heap, ctx, c, call.value(), blockIdx.x * warps_per_block + threadIdx.x / 32,
                  gridDim.x * warps_per_block, claims);
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
  if (static_cast<int>(blockIdx.x) < pushers) {
    const BlockExec<S, false> x{ctx, push_heap, Block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)}};
    const BlockExec<S, false> local{ctx, local_heap, x.block};
    const std::byte* mine = local_heap.local(partial);
    const int64_t eb = push.elem_bytes();
    for (int i = blockIdx.x; i < push.compute_order.count(); i += pushers) {
      const TileCoord tile = push.compute_order.at(i);
      const int t = push.gemm.linear(tile);
      local.wait(ctx.rank, tile_done, t, epoch, WaitSite{SignalField::kTileDone, t});
      const Rect r = push.gemm.region(tile);
      reduce_scatter_publish(x, push.rs, t, mine + (r.row * push.n + r.col) * eb, push.n, epoch);
    }
  } else {
    const int warps_per_block = static_cast<int>(blockDim.x / 32);
    reduce_items<S>(push.rs, push_heap, ctx, c, epoch, (blockIdx.x - pushers) * warps_per_block + threadIdx.x / 32,
                    (gridDim.x - pushers) * warps_per_block, nullptr);
  }
}

// The compute program's publishing side, for a finished partial P_r [M, N]: the entry barrier,
// then each gemm tile in the compute order handed to the ReduceScatter's producer side.
template <Scope S>
__global__ void rs_publish_kernel(__grid_constant__ const GemmRsPlan p, __grid_constant__ const SymmetricView heap,
                                  __grid_constant__ const DeviceContext ctx, const void* partial, Epoch call) {
  const uint64_t epoch = call.value();
  const BlockExec<S, false> x{ctx, heap, Block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)}};
  const int64_t eb = p.elem_bytes();
  const std::byte* mine = static_cast<const std::byte*>(partial);
  x.barrier(p.ws.barrier, epoch);
  for (int i = blockIdx.x; i < p.compute_order.count(); i += gridDim.x) {
    const TileCoord tile = p.compute_order.at(i);
    const Rect r = p.gemm.region(tile);
    reduce_scatter_publish(x, p.rs, p.gemm.linear(tile), mine + (r.row * p.n + r.col) * eb, p.n, epoch);
  }
}

TL_REGISTER_KERNELS(rs_reduce_kernel<Scope::kGpu>, rs_reduce_kernel<Scope::kSystem>,
                    rs_publish_kernel<Scope::kGpu>, rs_publish_kernel<Scope::kSystem>,
                    rs_push_reduce_kernel<Scope::kGpu>, rs_push_reduce_kernel<Scope::kSystem>);

void check(World& world, int rank, int world_size, const SymmetricView& heap, const CommLaunch& how, const char* op) {
  TL_REQUIRE(world_size == world.size(), op << ": a plan for " << world_size << " ranks in a world of "
                                             << world.size());
  TL_REQUIRE(heap.rank == rank && heap.world_size == world_size,
             op << ": the heap view is rank " << heap.rank << "'s, the plan rank " << rank << "'s");
  TL_REQUIRE(how.method != CopyMethod::kCopyEngine,
             op << ": the copy engine cannot reduce; use the vector method");
  TL_REQUIRE(how.threads >= 32 && how.threads <= 512 && how.threads % 32 == 0,
             op << ": threads per block must be a multiple of 32 in [32, 512], got " << how.threads);
}

template <Scope S>
void publish_at(World& world, const GemmRsPlan& p, const SymmetricView& heap, const void* partial,
                Epoch epoch, const CommLaunch& how) {
  detail::launch_on_rank_stream(world, p.rank, how.stream, "rs_publish", rs_publish_kernel<S>, how.workers,
                                how.threads, 0, p, heap, world.device_context(p.rank), partial, epoch);
}

}  // namespace

void launch_reduce_scatter(World& world, const ReduceScatterPlan& p, const SymmetricView& heap, void* c,
                           Epoch epoch, const CommLaunch& how) {
  check(world, p.rank, p.world_size, heap, how, "reduce_scatter");
  TL_REQUIRE(c || p.rows.size(p.rank) == 0, "reduce_scatter: null output on rank " << p.rank);
  TL_REQUIRE(epoch.on_device() || epoch.offset >= 1, "reduce_scatter: epochs start at 1");
  TL_REQUIRE(p.mode == CommMode::kPull ? p.f.tile_done.count >= p.producer.num_tiles()
                                       : p.f.staged.count >= p.world_size * p.producer.num_tiles(),
             "reduce_scatter: the plan's fields are not laid out (ReduceScatterPlan::make_layout)");
  auto* k = world.scope() == Scope::kGpu ? rs_reduce_kernel<Scope::kGpu> : rs_reduce_kernel<Scope::kSystem>;
  detail::launch_on_rank_stream(world, p.rank, how.stream, "reduce_scatter", k, how.workers, how.threads, 0, p,
                                heap, world.device_context(p.rank), c, epoch);
}

void launch_rs_push_reduce(World& world, const GemmRsPlan& push, const SymmetricView& push_heap,
                           const SymmetricView& local_heap, ByteField partial, Field<Signal> tile_done,
                           void* c, Epoch epoch, const CommLaunch& how, int pushers) {
  check(world, push.rank, push.world_size, push_heap, how, "rs_push_reduce");
  TL_REQUIRE(push.rs.mode == CommMode::kPush, "rs_push_reduce: needs a push-mode plan");
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
  check(world, p.rank, p.world_size, heap, how, "rs_publish");
  TL_REQUIRE(partial, "rs_publish: null partial on rank " << p.rank);
  TL_REQUIRE(epoch.on_device() || epoch.offset >= 1, "rs_publish: epochs start at 1");
  if (world.scope() == Scope::kGpu) publish_at<Scope::kGpu>(world, p, heap, partial, epoch, how);
  else publish_at<Scope::kSystem>(world, p, heap, partial, epoch, how);
}

}  // namespace tilelink::cuda
