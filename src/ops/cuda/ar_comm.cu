// The AllReduce comm plan (comm/allreduce.hpp) on the CUDA backend: its reduce and gather programs,
// the very code the CPU backend runs, executed by warps. Each warp claims items from the plan's
// shared counters (claims[0]: reduce, claims[1]: gather), so several launches with one epoch share
// one call's work: GEMM+AR adds the GEMM's SMs once its GEMM is done.
#include "launch.hpp"
#include "reduce_rect.cuh"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/comm/allreduce.hpp"
#include "tilelink/ops/cuda/comm.hpp"

namespace tilelink::cuda {

namespace {

// The executor of the AllReduce programs on one warp (the contract: comm/allreduce.hpp).
template <Scope S>
struct WarpAllReduceExec {
  const AllReducePlan& p;
  const SymmetricView& heap;
  const DeviceContext& ctx;
  Warp lanes;

  // One wait a lane, so the waits' round trips overlap; then the warp syncs, ordering every lane's
  // loads after every lane's acquire.
  template <class Fn>
  TL_DEVICE void wait_each(int count, Fn&& wait_at, uint64_t target) {
    for (int w = lanes.index(); w < count; w += 32) {
      int source = 0, slot = 0;
      wait_at(w, &source, &slot);
      peer_tile_wait<S>(ctx, heap, source, p.f.tile_done, slot, target, WaitSite{SignalField::kTileDone, slot});
    }
    lanes.sync();
  }

  TL_DEVICE void sum(const AllReducePlan& plan, const Rect& r, void* out, int64_t out_ld) {
    const int64_t eb = dtype_size(plan.dtype);
    detail::Sources srcs;
    srcs.ld = plan.n;
    for (int s = 0; s < plan.world_size; ++s)
      srcs.base[s] = heap.peer(s, plan.f.partial) + (r.row * plan.n + r.col) * eb;
    std::byte* o = static_cast<std::byte*>(out) + (r.row * out_ld + r.col) * eb;
    switch (plan.dtype) {
      case DType::kF32: detail::reduce_rect<DType::kF32>(srcs, plan.world_size, o, out_ld, r.rows, r.cols, lanes); break;
      case DType::kBF16: detail::reduce_rect<DType::kBF16>(srcs, plan.world_size, o, out_ld, r.rows, r.cols, lanes); break;
      case DType::kF16: detail::reduce_rect<DType::kF16>(srcs, plan.world_size, o, out_ld, r.rows, r.cols, lanes); break;
    }
  }

  TL_DEVICE void* local_reduced() const { return heap.local(p.f.reduced); }

  // After the warp's stores: __syncwarp orders them before lane 0's release (cumulative).
  TL_DEVICE void notify_local(Field<Signal> f, int slot, uint64_t value) {
    lanes.sync();
    if (lanes.leader()) producer_tile_notify<S>(ctx, heap, f, slot, value);
  }

  // Every lane acquires the owner's band signal itself: its own loads follow its own acquire.
  TL_DEVICE void wait_band(int owner, int slot, uint64_t target) {
    peer_tile_wait<S>(ctx, heap, owner, p.f.band_ready, slot, target, WaitSite{SignalField::kBandReady, slot});
  }

  TL_DEVICE void copy_rows(int owner, const Rect& r, void* dst, int64_t dst_ld) {
    const int64_t eb = dtype_size(p.dtype);
    tile_pull_data(ctx, owner,
                   Copy2D{heap.peer(owner, p.f.reduced) + (r.row * p.n + r.col) * eb, p.n * eb,
                          static_cast<std::byte*>(dst) + (r.row * dst_ld + r.col) * eb, dst_ld * eb, r.rows,
                          r.cols * eb},
                   lanes);
  }
};

template <Scope S>
__global__ void __launch_bounds__(512)
    allreduce_kernel(__grid_constant__ const AllReducePlan p, __grid_constant__ const SymmetricView heap,
                     __grid_constant__ const DeviceContext ctx, void* c, Epoch call) {
  const uint64_t epoch = call.value();
  const Warp lanes{static_cast<int>(threadIdx.x % 32)};
  WarpAllReduceExec<S> x{p, heap, ctx, lanes};
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
