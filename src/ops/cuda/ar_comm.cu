// The AllReduce comm plan (comm/allreduce.hpp) on the CUDA backend: its reduce and gather programs,
// the very code the CPU backend runs, executed by warps (reduce_rect.cuh's WarpExec). Each warp
// claims items from the plan's shared counters (claims[0]: reduce, claims[1]: gather), so several
// launches with one epoch share one call's work: GEMM+AR adds the GEMM's SMs once its GEMM is done.
#include "launch.hpp"
#include "reduce_rect.cuh"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/comm/allreduce.hpp"
#include "tilelink/ops/cuda/comm.hpp"

namespace tilelink::cuda {

namespace {

template <Scope S>
__global__ void __launch_bounds__(512)
    allreduce_kernel(__grid_constant__ const AllReducePlan p, __grid_constant__ const SymmetricView heap,
                     __grid_constant__ const DeviceContext ctx, void* c, Epoch call) {
  const uint64_t epoch = call.value();
  const Warp lanes{static_cast<int>(threadIdx.x % 32)};
  const detail::WarpExec<S> x{heap, ctx, lanes};
  uint64_t* claims = heap.local(p.f.claims);
  // Reduce items first, then gather items: a warp that gathers waits only on peers' reduces, which
  // wait only on producers, so no warp can hold up the work it waits for.
  for (int j; (j = detail::claim(&claims[0], epoch, lanes)) < p.reduce_count();) allreduce_reduce_item(x, p, j, epoch, c);
  for (int i; (i = detail::claim(&claims[1], epoch, lanes)) < p.gather_count();) allreduce_gather_item(x, p, i, epoch, c);
}
TL_REGISTER_KERNELS(allreduce_kernel<Scope::kGpu>, allreduce_kernel<Scope::kSystem>);

}  // namespace

void launch_allreduce(World& world, const AllReducePlan& p, const SymmetricView& heap, void* c, Epoch epoch,
                      const CommLaunch& how) {
  TL_REQUIRE(p.world_size == world.size(),
             "allreduce: a plan for " << p.world_size << " ranks in a world of " << world.size());
  TL_REQUIRE(heap.rank == p.rank && heap.world_size == p.world_size,
             "allreduce: the heap view is rank " << heap.rank << "'s, the plan rank " << p.rank << "'s");
  TL_REQUIRE(how.method == CopyMethod::kVector, "allreduce: the SMs reduce; use the vector method");
  TL_REQUIRE(how.threads >= 32 && how.threads <= 512 && how.threads % 32 == 0,
             "allreduce: threads per block must be a multiple of 32 in [32, 512], got " << how.threads);
  TL_REQUIRE(c, "allreduce: null output on rank " << p.rank);
  TL_REQUIRE(reinterpret_cast<uintptr_t>(c) % 16 == 0, "allreduce: the output of rank " << p.rank
                                                                                     << " must be 16-byte aligned");
  TL_REQUIRE(p.f.claims.count >= 2 && p.f.tile_done.count >= p.producer.num_tiles(),
             "allreduce: the plan's fields are not laid out (AllReducePlan::make_layout)");
  TL_REQUIRE(epoch.on_device() || epoch.offset >= 1, "allreduce: epochs start at 1");
  auto* k = world.scope() == Scope::kGpu ? allreduce_kernel<Scope::kGpu> : allreduce_kernel<Scope::kSystem>;
  detail::launch_on_rank_stream(world, p.rank, how.stream, "allreduce", k, how.workers, how.threads, 0, p, heap,
                                world.device_context(p.rank), c, epoch);
}

}  // namespace tilelink::cuda
