// Fused GEMM+AllReduce on the CUDA backend (plan: ops/gemm_ar_plan.hpp, shared with the CPU).
//
//   entry            a stream barrier on every rank's stream (the previous call's reads of the
//                    partials are done everywhere)
//   compute program  the sm90 engine on a second stream of the rank, on its SMs less comm_workers:
//                    P_r = A_r B_r^T into the rank's symmetric `partial`, tiles in the plan's order
//                    (the same on every rank); after each tile's epilogue the notify warp
//                    release-stores tile_done[t] = epoch
//   allreduce        comm/allreduce.hpp's programs on comm_workers SMs of the rank's stream
//                    (launch_allreduce): one-shot, every band of C from every source as announced;
//                    two-shot, the rank's segment reduced and announced, then every owner's bands
//                    copied into C. Once the GEMM is done the same kernel on the GEMM's SMs takes
//                    the items still left (one shared counter).
//   baseline         peer, ipc: cuBLAS into the partial, ncclAllReduce into C. virtual (NCCL refuses
//                    two ranks on one GPU): cuBLAS, every tile_done set, the same AllReduce on every
//                    SM of the rank. Its partials are cuBLAS's, not the engine's, so the two agree
//                    bit for bit only where both GEMMs round alike (exact inputs: the GPU tests);
//                    every rank's C is bit-identical to every other rank's on either path.
//
//   cuda::World world({.transport = cuda::Transport::kVirtual, .world_size = 4});
//   cuda::GemmAr op(world, RowPartition::even(M, 4), N, k_per_rank, DType::kBF16, {});  // SMs: chosen
//   op.run(a, b, c);             // a[r] = A_r [M, K_r], b[r] = B_r [N, K_r], c[r] = C [M, N]
//   world.sync("gemm_ar");
//
// bf16 storage, fp32 accumulation; sources summed in rank order. CUDA graphs: run() and
// run_unfused() may be captured and replayed, as AgGemm's (device-side epochs from the first
// captured call on). World 1: the engine alone, writing C.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/ops/gemm_ar_plan.hpp"
#include "tilelink/runtime/world.hpp"
#include "tilelink/tune/path_model.hpp"

namespace tilelink::cuda {

namespace detail {
class FusedRuntime;
}

class GemmAr {
 public:
  // k_per_rank[r] = K_r (multiples of 8); N a multiple of 8. rows: the two-shot's segments.
  // config.comm_workers = the AllReduce's SMs, 0 = a fixed share (SMs / 8, 2..16);
  // config.compute_workers = the GEMM's SMs, 0 = the rest.
  GemmAr(World& world, const RowPartition& rows, int64_t n, const std::vector<int64_t>& k_per_rank, DType dtype,
         const GemmArConfig& config);
  ~GemmAr();
  GemmAr(const GemmAr&) = delete;
  GemmAr& operator=(const GemmAr&) = delete;

  const GemmArPlan& plan(int rank) const { return plans_.at(rank); }
  int gemm_sms(int rank) const;
  int comm_sms(int rank) const { return plans_.at(rank).config.comm_workers; }

  void run(const std::vector<const void*>& a, const std::vector<const void*>& b, const std::vector<void*>& c);
  void run_unfused(const std::vector<const void*>& a, const std::vector<const void*>& b,
                   const std::vector<void*>& c);
  PathChoice choose(OpPath requested = OpPath::kAuto) const;
  void run_auto(const std::vector<const void*>& a, const std::vector<const void*>& b, const std::vector<void*>& c,
                OpPath requested = OpPath::kAuto);
  // Parts, for the bench's ideal bound (eager only): the GEMM alone (with its notify hook), the
  // AllReduce alone on its SMs (every tile_done already set by the previous call).
  void run_gemm_only(const std::vector<const void*>& a, const std::vector<const void*>& b);
  void run_comm_only(const std::vector<void*>& c);

 private:
  void check_args(const std::vector<const void*>& a, const std::vector<const void*>& b,
                  const std::vector<void*>& c) const;
  void enqueue_gemm(int r, const void* a, const void* b, void* out, bool hooks);

  World& world_;
  std::vector<GemmArPlan> plans_;
  std::unique_ptr<detail::FusedRuntime> rt_;  // workspace, lanes, epochs, engine (src/ops/fused_runtime.hpp)
};

}  // namespace tilelink::cuda
