// The comm programs on the CUDA backend, from the same plans as the CPU backend (comm/allgather.hpp,
// comm/allreduce.hpp, ops/gemm_rs_plan.hpp): the same orders, mappings, channels and workspace, so
// they produce the same bits as tilelink::cpu's programs.
//
//   cuda::World world({.transport = cuda::Transport::kVirtual, .world_size = W});
//   auto ws = world.allocate(bytes);   // the plan's fields and a barrier [W], laid out alike on every rank
//   for (int r : world.local_ranks())
//     cuda::launch_allgather(world, plan[r], barrier, ws.view(r), a[r], epoch, {cuda::CopyMethod::kBulk, 4});
//   world.sync("allgather");
//
// Each launcher enqueues on world.stream(plan.rank) and returns; each starts with the entry barrier
// of the call on its barrier field with `epoch` (every call uses the next epoch: 1, 2, ...; an Epoch
// with a counter, backend/cuda/epoch.hpp, for a graph-captured call). Inputs are checked and refused
// (tilelink::Error) before anything is launched.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tilelink/backend/cuda/epoch.hpp"
#include "tilelink/comm/allgather.hpp"
#include "tilelink/comm/allreduce.hpp"
#include "tilelink/comm/reduce_scatter.hpp"
#include "tilelink/ops/ag_gemm_plan.hpp"
#include "tilelink/ops/gemm_rs_plan.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda {

enum class CopyMethod : uint8_t {
  kVector,      // SMs, 16-byte vector loads/stores
  kBulk,        // SMs, cp.async.bulk through shared memory (TMA engine)
  kCopyEngine,  // cudaMemcpy2DAsync between stream wait/write-value operations
};
const char* copy_method_name(CopyMethod m);

struct CommLaunch {
  CopyMethod method = CopyMethod::kVector;
  int workers = 1;     // thread blocks, one per SM (SM methods); at most the rank's SM count
  int threads = 512;   // threads per block (vector method)
  cudaStream_t stream = nullptr;  // where to enqueue; null: world.stream(rank)
};

// AllGather (comm/allgather.hpp) on rank p.rank: the entry barrier on `barrier` [W], then every
// tile into this rank's (pull) or every rank's (push) `gathered`, in the plan's order, each
// announced on tile_ready[t] = epoch. a = this rank's rows [M_r, row_bytes] on its device. The
// copy engine runs the pull program; the SM methods either.
void launch_allgather(World& world, const AllGatherPlan& p, Field<Signal> barrier, const SymmetricView& heap,
                      const void* a, Epoch epoch, const CommLaunch& how);

// ReduceScatter (comm/reduce_scatter.hpp) on rank p.rank: each band of its segment, once the
// producer tiles covering it are announced on every source (pull: each source's tile_done; push:
// staged here), summed over sources in rank order 0..W-1 in fp32, rounded once into
// c = C_r [M_r, N]. SM-driven, a warp a band (the vector method; the copy engine cannot reduce).
// Pull: the warps claim bands from the plan's `claims` counter, tagged with the call's epoch, so
// several launches with one epoch share one call's work (GEMM+RS adds the GEMM's SMs once the GEMM
// is done); a second call with the same epoch finds the work taken unless the counter is zeroed
// first.
void launch_reduce_scatter(World& world, const ReduceScatterPlan& p, const SymmetricView& heap, void* c,
                           Epoch epoch, const CommLaunch& how);

// Fused GEMM+RS, push (one kernel on how.workers SMs of rank push.rank): `pushers` blocks push each
// gemm tile of this rank's partial to the owners' staging slots once the engine has announced it
// (local tile_done[t] >= epoch), in the compute order; the other blocks reduce this rank's segment
// from its staging (push.rs on push_heap) into c, as launch_reduce_scatter in push mode. partial and
// tile_done are the engine's output and signals in local_heap (a pull-mode plan's fields).
void launch_rs_push_reduce(World& world, const GemmRsPlan& push, const SymmetricView& push_heap,
                           const SymmetricView& local_heap, ByteField partial, Field<Signal> tile_done,
                           void* c, Epoch epoch, const CommLaunch& how, int pushers);

// The compute program's side of GEMM+RS for a finished partial P_r [M, N] (tests and benches
// of the reduce half): entry barrier, then each gemm tile in the compute order published: pull:
// copied into ws.partial and tile_done[t] = epoch; push: copied into each owner's staging slot of
// this rank and staged[slot] = epoch on the owner.
void launch_rs_publish(World& world, const GemmRsPlan& p, const SymmetricView& heap,
                       const void* partial, Epoch epoch, const CommLaunch& how);

// AllReduce (comm/allreduce.hpp) on rank p.rank: reduce items once the producer tiles covering
// them are announced on every source's tile_done (>= epoch), then (two-shot) the owners' bands as
// they are announced; c = C [M, N]. Warps claim items from the plan's `claims` counters, tagged
// with the epoch, so several launches with one epoch share one call's work; a second call with the
// same epoch finds the work taken unless the counters are zeroed first. The vector method only.
void launch_allreduce(World& world, const AllReducePlan& p, const SymmetricView& heap, void* c, Epoch epoch,
                      const CommLaunch& how);

}  // namespace tilelink::cuda
