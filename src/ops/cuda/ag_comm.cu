// The AllGather comm plan (comm/allgather.hpp) on the CUDA backend: its program on thread blocks
// (vector or bulk copies, backend/cuda/comm_exec.cuh) or on the copy engine (stream operations).
#include <cstddef>

#include "launch.hpp"
#include "tilelink/backend/cuda/comm_exec.cuh"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/ops/cuda/comm.hpp"

namespace tilelink::cuda {

namespace {

// Bulk pipeline shape of the comm kernels: 4 stages of 32 KiB.
constexpr int kBulkStages = 4;
constexpr uint32_t kBulkStageBytes = 32 * 1024;
constexpr size_t kBulkSmem = kBulkStages * kBulkStageBytes + kBulkStages * sizeof(uint64_t);

// The program on every block of the grid: the entry barrier, then items strided over the blocks.
template <Scope S, bool kBulk, bool kPush>
__global__ void allgather_kernel(__grid_constant__ const AllGatherPlan p, Field<Signal> barrier,
                                 __grid_constant__ const SymmetricView heap,
                                 __grid_constant__ const DeviceContext ctx, const void* a, Epoch call) {
  const uint64_t epoch = call.value();
  BulkPipe pipe;
  const BlockExec<S, kBulk> x{ctx, heap, Block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)}, &pipe};
  if constexpr (kBulk) {
    extern __shared__ __align__(128) unsigned char smem[];
    if (x.block.leader())
      pipe.init(smem, reinterpret_cast<uint64_t*>(smem + kBulkStages * kBulkStageBytes), kBulkStages,
                kBulkStageBytes, ctx);
  }
  x.barrier(barrier, epoch);  // every peer has finished the previous call
  for (int i = blockIdx.x; i < p.count(); i += gridDim.x) {
    if constexpr (kPush) allgather_push_item(x, p, i, epoch, a);
    else allgather_pull_item(x, p, i, epoch, a);
  }
}

TL_REGISTER_KERNELS(allgather_kernel<Scope::kGpu, false, false>, allgather_kernel<Scope::kGpu, true, false>,
                    allgather_kernel<Scope::kSystem, false, false>, allgather_kernel<Scope::kSystem, true, false>,
                    allgather_kernel<Scope::kGpu, false, true>, allgather_kernel<Scope::kGpu, true, true>,
                    allgather_kernel<Scope::kSystem, false, true>, allgather_kernel<Scope::kSystem, true, true>);

template <Scope S>
void launch_sm(World& world, const AllGatherPlan& p, Field<Signal> barrier, const SymmetricView& heap,
               const void* a, Epoch epoch, const CommLaunch& how) {
  const bool bulk = how.method == CopyMethod::kBulk;
  const bool push = p.mode == CommMode::kPush;
  const DeviceContext ctx = world.device_context(p.rank);
  const int threads = bulk ? 32 : how.threads;
  const size_t smem = bulk ? kBulkSmem : 0;
  auto* k = push ? (bulk ? allgather_kernel<S, true, true> : allgather_kernel<S, false, true>)
                 : (bulk ? allgather_kernel<S, true, false> : allgather_kernel<S, false, false>);
  detail::launch_on_rank_stream(world, p.rank, how.stream, "allgather", k, how.workers, threads, smem, p,
                                barrier, heap, ctx, a, epoch);
}

}  // namespace

const char* copy_method_name(CopyMethod m) {
  switch (m) {
    case CopyMethod::kVector: return "vector";
    case CopyMethod::kBulk: return "bulk";
    case CopyMethod::kCopyEngine: return "copy-engine";
  }
  return "?";
}

void launch_allgather(World& world, const AllGatherPlan& p, Field<Signal> barrier, const SymmetricView& heap,
                      const void* a, Epoch epoch, const CommLaunch& how) {
  TL_REQUIRE(p.world_size == world.size(), "allgather: a plan for " << p.world_size
                                               << " ranks in a world of " << world.size());
  TL_REQUIRE(heap.rank == p.rank && heap.world_size == p.world_size,
             "allgather: the heap view is rank " << heap.rank << "'s, the plan rank " << p.rank << "'s");
  TL_REQUIRE(a || p.own_rows().size() == 0, "allgather: null input rows on rank " << p.rank);
  TL_REQUIRE(barrier.count >= p.world_size, "allgather: the barrier field has " << barrier.count
                                                << " slots for " << p.world_size << " ranks");
  TL_REQUIRE(epoch.on_device() || epoch.offset >= 1, "allgather: epochs start at 1");
  if (how.method == CopyMethod::kCopyEngine) {
    TL_REQUIRE(how.stream == nullptr,
               "allgather: the copy-engine program runs on the rank's stream; "
               "CommLaunch::stream applies to the SM methods");
    TL_REQUIRE(p.mode == CommMode::kPull, "allgather: the copy engine runs the pull program only");
    world.bind(p.rank);
    // Graph mode: the stream prims add *epoch.counter to each value at run time.
    const StreamExec x{StreamContext{&world, p.rank, world.stream(p.rank), "allgather", epoch.counter}, heap};
    allgather_rank_program(x, p, barrier, epoch.offset, a, AllGatherPart::kAll);
    return;
  }
  TL_REQUIRE(how.threads >= 32 && how.threads <= 1024 && how.threads % 32 == 0,
             "allgather: threads per block must be a multiple of 32 in [32, 1024], got " << how.threads);
  if (world.scope() == Scope::kGpu) launch_sm<Scope::kGpu>(world, p, barrier, heap, a, epoch, how);
  else launch_sm<Scope::kSystem>(world, p, barrier, heap, a, epoch, how);
}

}  // namespace tilelink::cuda
