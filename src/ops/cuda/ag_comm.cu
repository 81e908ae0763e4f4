// The AllGather half of AG+GEMM on the CUDA backend: the comm program of ops/ag_gemm_plan.hpp,
// on SMs (vector or bulk copies) or on the copy engine.
#include <cstddef>

#include "launch.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/ops/cuda/comm.hpp"

namespace tilelink::cuda {

namespace {

// Bulk pipeline shape of the comm kernels: 4 stages of 32 KiB.
constexpr int kBulkStages = 4;
constexpr uint32_t kBulkStageBytes = 32 * 1024;
constexpr size_t kBulkSmem = kBulkStages * kBulkStageBytes + kBulkStages * sizeof(uint64_t);

// The rows [rows.begin, rows.end) of a [*, K] matrix whose first row is `row0`.
TL_HD Copy2D rows_copy(const AgGemmPlan& p, const void* src, int64_t src_row0, void* dst,
                       int64_t dst_row0, RowRange rows) {
  const int64_t rb = p.row_bytes();
  return Copy2D{static_cast<const std::byte*>(src) + (rows.begin - src_row0) * rb, rb,
                static_cast<std::byte*>(dst) + (rows.begin - dst_row0) * rb, rb, rows.size(), rb};
}

// Moves one tile: the whole block (vector) or its leader through the pipe (bulk).
template <bool kBulk>
__device__ void move(const DeviceContext& ctx, int peer, const Copy2D& c, Block block,
                     BulkPipe& pipe, bool push) {
  if constexpr (kBulk) {
    if (block.leader()) {
      if (push) tile_push_data(ctx, peer, c, pipe);
      else tile_pull_data(ctx, peer, c, pipe);
    }
  } else {
    if (push) tile_push_data(ctx, peer, c, block);
    else tile_pull_data(ctx, peer, c, block);
  }
}

template <bool kBulk>
__device__ void init_pipe(BulkPipe& pipe, const DeviceContext& ctx, Block block) {
  if constexpr (kBulk) {
    extern __shared__ __align__(128) unsigned char smem[];
    if (block.leader())
      pipe.init(smem, reinterpret_cast<uint64_t*>(smem + kBulkStages * kBulkStageBytes), kBulkStages,
                kBulkStageBytes, ctx);
  }
}

// comm program, pull: bring every comm tile into this rank's gathered buffer, own tiles first.
template <Scope S, bool kBulk>
__global__ void ag_pull_kernel(__grid_constant__ const AgGemmPlan p, __grid_constant__ const SymmetricView heap,
                               __grid_constant__ const DeviceContext ctx, const void* a, Epoch call) {
  const uint64_t epoch = call.value();
  const Block block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  BulkPipe pipe;
  init_pipe<kBulk>(pipe, ctx, block);
  // Entry barrier: every peer has finished the previous call.
  if (block.leader()) rank_barrier<S>(ctx, heap, p.ws.barrier, epoch);
  block.sync();
  std::byte* gathered = heap.local(p.ws.gathered);
  for (int i = blockIdx.x; i < p.comm.num_tiles(); i += gridDim.x) {
    const int t = p.pull_tile_at(i);
    const int owner = p.comm.rank_of(t);
    const RowRange rows = p.comm.rows_of(t);
    Copy2D c;
    if (owner == ctx.rank) {
      c = rows_copy(p, a, p.comm.parts.begin(owner), gathered, 0, rows);
    } else {
      // The owner announces each of its tiles once it sits in its own gathered buffer.
      if (block.leader())
        peer_tile_wait<S>(ctx, heap, owner, p.ws.tile_ready, t, epoch, WaitSite{"tile_ready", t});
      block.sync();
      c = rows_copy(p, heap.peer(owner, p.ws.gathered), 0, gathered, 0, rows);
    }
    move<kBulk>(ctx, owner, c, block, pipe, false);
    block.sync();
    if (block.leader()) producer_tile_notify<S>(ctx, heap, p.ws.tile_ready, t, epoch);
  }
}

// comm program, push: write this rank's tiles into every rank's gathered buffer (itself first).
template <Scope S, bool kBulk>
__global__ void ag_push_kernel(__grid_constant__ const AgGemmPlan p, __grid_constant__ const SymmetricView heap,
                               __grid_constant__ const DeviceContext ctx, const void* a, Epoch call) {
  const uint64_t epoch = call.value();
  const Block block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  BulkPipe pipe;
  init_pipe<kBulk>(pipe, ctx, block);
  if (block.leader()) rank_barrier<S>(ctx, heap, p.ws.barrier, epoch);
  block.sync();
  for (int i = blockIdx.x; i < p.push_count(); i += gridDim.x) {
    int peer = 0, t = 0;
    p.push_at(i, &peer, &t);
    const RowRange rows = p.comm.rows_of(t);
    Copy2D c = rows_copy(p, a, p.comm.parts.begin(ctx.rank), heap.peer(peer, p.ws.gathered), 0, rows);
    move<kBulk>(ctx, peer, c, block, pipe, true);
    block.sync();
    if (block.leader()) peer_tile_notify<S>(ctx, heap, peer, p.ws.tile_ready, t, epoch);
  }
}

TL_REGISTER_KERNELS(ag_pull_kernel<Scope::kGpu, false>, ag_pull_kernel<Scope::kGpu, true>,
                    ag_pull_kernel<Scope::kSystem, false>,
                    ag_pull_kernel<Scope::kSystem, true>,
                    ag_push_kernel<Scope::kGpu, false>, ag_push_kernel<Scope::kGpu, true>,
                    ag_push_kernel<Scope::kSystem, false>,
                    ag_push_kernel<Scope::kSystem, true>);

template <Scope S>
void launch_sm(World& world, const AgGemmPlan& p, const SymmetricView& heap, const void* a,
               Epoch epoch, const CommLaunch& how) {
  const bool bulk = how.method == CopyMethod::kBulk;
  const bool push = p.config.mode == CommMode::kPush;
  const DeviceContext ctx = world.device_context(p.rank);
  const int threads = bulk ? 32 : how.threads;
  const size_t smem = bulk ? kBulkSmem : 0;
  auto* k = push ? (bulk ? ag_push_kernel<S, true> : ag_push_kernel<S, false>)
                 : (bulk ? ag_pull_kernel<S, true> : ag_pull_kernel<S, false>);
  detail::launch_on_rank_stream(world, p.rank, how.stream, "ag_comm", k, how.workers, threads, smem,
                                p, heap, ctx, a, epoch);
}

// comm program on the copy engine: the pull order, each peer tile after the owner's notify.
void launch_ce(World& world, const AgGemmPlan& p, const SymmetricView& heap, const void* a,
               Epoch call) {
  TL_REQUIRE(p.config.mode == CommMode::kPull, "ag_comm: the copy engine runs the pull program only");
  world.bind(p.rank);
  // Graph mode: the stream prims add *call.counter to each value at run time.
  StreamContext sc{&world, p.rank, world.stream(p.rank), "ag_comm", call.counter};
  const uint64_t epoch = call.offset;
  rank_barrier(sc, heap, p.ws.barrier, epoch);
  std::byte* gathered = heap.local(p.ws.gathered);
  for (int i = 0; i < p.comm.num_tiles(); ++i) {
    const int t = p.pull_tile_at(i);
    const int owner = p.comm.rank_of(t);
    const RowRange rows = p.comm.rows_of(t);
    if (owner == p.rank) {
      rank_copy_data(sc, owner, rows_copy(p, a, p.comm.parts.begin(owner), gathered, 0, rows));
    } else {
      peer_tile_wait(sc, heap, owner, p.ws.tile_ready, t, epoch, WaitSite{"tile_ready", t});
      rank_copy_data(sc, owner, rows_copy(p, heap.peer(owner, p.ws.gathered), 0, gathered, 0, rows));
    }
    producer_tile_notify(sc, heap, p.ws.tile_ready, t, epoch);
  }
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

void launch_ag_comm(World& world, const AgGemmPlan& p, const SymmetricView& heap, const void* a,
                    Epoch epoch, const CommLaunch& how) {
  TL_REQUIRE(p.world_size == world.size(), "ag_comm: a plan for " << p.world_size
                                               << " ranks in a world of " << world.size());
  TL_REQUIRE(heap.rank == p.rank && heap.world_size == p.world_size,
             "ag_comm: the heap view is rank " << heap.rank << "'s, the plan rank " << p.rank << "'s");
  TL_REQUIRE(a || p.comm.parts.size(p.rank) == 0, "ag_comm: null A on rank " << p.rank);
  TL_REQUIRE(epoch.on_device() || epoch.offset >= 1, "ag_comm: epochs start at 1");
  if (how.method == CopyMethod::kCopyEngine) {
    TL_REQUIRE(how.stream == nullptr,
               "ag_comm: the copy-engine program runs on the rank's stream; "
               "CommLaunch::stream applies to the SM methods");
    return launch_ce(world, p, heap, a, epoch);
  }
  TL_REQUIRE(how.threads >= 32 && how.threads <= 1024 && how.threads % 32 == 0,
             "ag_comm: threads per block must be a multiple of 32 in [32, 1024], got " << how.threads);
  if (world.scope() == Scope::kGpu) launch_sm<Scope::kGpu>(world, p, heap, a, epoch, how);
  else launch_sm<Scope::kSystem>(world, p, heap, a, epoch, how);
}

}  // namespace tilelink::cuda
