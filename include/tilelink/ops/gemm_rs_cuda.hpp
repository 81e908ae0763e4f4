// Fused GEMM+ReduceScatter on the CUDA backend (plan: ops/gemm_rs_plan.hpp, shared with the CPU).
//
//   entry            a stream barrier on every rank's stream (the previous call's reduces are done
//                    everywhere, so partial buffers may be overwritten)
//   compute program  the sm90 engine on a second stream of the rank, on its SMs less comm_workers:
//                    P_r = A_r B_r^T into the rank's symmetric `partial`, tiles in the plan's
//                    banded order (the same on every rank); after each tile's epilogue the notify
//                    warp release-stores tile_done[t] = epoch (system scope)
//   reduce program   config.mode = pull: the SM-driven reduce of ops/cuda/comm.hpp on comm_workers
//                    SMs of the rank's stream: each reduce tile of the rank's segment once the gemm
//                    tiles covering it are done on every source (reading the peers' partials),
//                    summed in rank order in fp32. Once the GEMM is done, the same reduce on the
//                    GEMM's SMs (on its stream) takes the bands still left: the workers of both
//                    launches claim bands from one counter (workspace `claims`).
//                    push: one kernel on comm_workers SMs (>= 2), half of them pushing each
//                    finished gemm tile (after its tile_done) into its owners' staging slots, the
//                    other half reducing the rank's segment from its own staging (local reads only)
//   baseline         barrier, cuBLAS into `partial`, every tile_done set, the reduce on all SMs
//
// bf16 storage, fp32 accumulation. Both modes sum in rank order: the same bits as the baseline.
// (The engine's epilogue always stores the partial locally: a tile may span two owners, whose
// staging slots are not one affine buffer, so pushes are made by the comm SMs, per tile.)
//
// CUDA graphs: run() and run_unfused() may be captured and replayed, mixed with eager calls, as for
// AgGemm (ops/ag_gemm_cuda.hpp): device-side epochs from the first captured call on.
// World 1: nothing to reduce; the call is the engine on all SMs writing C directly.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/ops/gemm_rs_plan.hpp"
#include "tilelink/runtime/world.hpp"
#include "tilelink/tune/path_model.hpp"

namespace tilelink::cuda {

namespace detail {
class FusedRuntime;
}

class GemmRs {
 public:
  // k_per_rank[r] = K_r. config.comm_workers = the reduce's SMs; 0 = chosen per rank: pull, by the
  // cost model (gemm_rs_reduce_sms: the count in 2..SMs/4 with the shortest predicted call, the
  // GEMM counted in whole waves of tiles), push, a quarter of the SMs (2..16);
  // plan(r).config.comm_workers says what was chosen. config.compute_workers = the GEMM's SMs,
  // 0 = the rest.
  GemmRs(World& world, const RowPartition& rows, int64_t n, const std::vector<int64_t>& k_per_rank,
         DType dtype, const GemmRsConfig& config);
  ~GemmRs();
  GemmRs(const GemmRs&) = delete;
  GemmRs& operator=(const GemmRs&) = delete;

  const GemmRsPlan& plan(int rank) const { return plans_.at(rank); }
  int gemm_sms(int rank) const;
  // How rank `rank`'s fused GEMM spreads over its SMs: tiles (the plan's, kTileN wide), blocks,
  // and the split of its last wave (the op gives the engine a workspace, so a last wave at most
  // half full is split). An unfused call's GEMM, which no signal maps onto, takes the width the
  // engine picks (gemm_pick_tile_n).
  compute::sm90::GemmWork gemm_work(int rank) const;

  // Enqueues one call on every local rank: a[r] = A_r [M, K_r], b[r] = B_r [N, K_r],
  // c[r] = C_r [M_r, N]; ordered on world.stream(r).
  void run(const std::vector<const void*>& a, const std::vector<const void*>& b,
           const std::vector<void*>& c);
  void run_unfused(const std::vector<const void*>& a, const std::vector<const void*>& b,
                   const std::vector<void*>& c);
  // The fused-or-unfused choice for this world and shape (tune/path_model.hpp); `requested` other
  // than kAuto is kept. run_auto() runs the chosen path.
  PathChoice choose(OpPath requested = OpPath::kAuto) const;
  void run_auto(const std::vector<const void*>& a, const std::vector<const void*>& b,
                const std::vector<void*>& c, OpPath requested = OpPath::kAuto);
  // Parts, for the bench's ideal bound: the GEMM alone (with its notify hook), the reduce alone
  // (every tile_done already set by the previous call). Eager only (refused once captured).
  void run_gemm_only(const std::vector<const void*>& a, const std::vector<const void*>& b);
  void run_reduce_only(const std::vector<void*>& c);

 private:
  void check_args(const std::vector<const void*>& a, const std::vector<const void*>& b,
                  const std::vector<void*>& c) const;
  void enqueue_gemm(int r, const void* a, const void* b, void* out, bool hooks);
  void enqueue_reduce(int r, void* c);  // the reduce (pull) or push+reduce kernel on the comm SMs

  World& world_;
  std::vector<GemmRsPlan> plans_;       // pull-mode plans: the engine's partial, tile_done, barrier
  std::vector<GemmRsPlan> push_plans_;  // config.mode = push: staging, staged
  SymmetricBuffer ws_push_;
  std::unique_ptr<detail::FusedRuntime> rt_;  // workspace, lanes, epochs, engine (src/ops/fused_runtime.hpp)
};

}  // namespace tilelink::cuda
