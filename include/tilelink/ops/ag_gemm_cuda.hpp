// Fused AllGather+GEMM on the CUDA backend (plan: ops/ag_gemm_plan.hpp, shared with the CPU).
//
//   comm program     on the copy engine (comm_workers = 0) or on k SMs (bulk copies), per rank on
//                    the rank's stream, the GEMM on a second stream of the rank: the entry barrier,
//                    then per comm tile in the plan's pull order: wait for the owner's tile_ready
//                    (stream wait-value), cudaMemcpy2DAsync into the gathered buffer, notify own
//                    tile_ready (stream write-value, a release). Push mode: own tiles into every
//                    peer.
//   compute program  the sm90 GEMM engine on the rank's stream and SMs; its load warp waits, per
//                    output tile, on the tile_ready slots of the comm tiles covering the tile's
//                    rows (plan.waits_for), before the tile's first TMA load. Local-first tile
//                    order.
//   baseline         copy-engine AllGather (barrier, copies, barrier), then cuBLAS.
//
//   cuda::World world({.transport = cuda::Transport::kVirtual, .world_size = 4});
//   cuda::AgGemm op(world, RowPartition::even(M, 4), n_per_rank, K, DType::kBF16, {});
//   op.run(a, b, c);            // a[r], b[r], c[r]: device pointers of every local rank
//   world.sync("ag_gemm");
//
// CUDA graphs: run() and run_unfused() may be captured (begin a capture on world.stream(r) of
// every local rank, cudaStreamCaptureModeRelaxed or ThreadLocal; call; end each capture) and the
// graphs replayed any number of times, mixed with eager calls. The first captured call switches the
// op to device-side epochs for good (src/ops/call_epochs.hpp): signals are never reset.
// Separate GPUs: from the first capture on, the GEMM leaves kGraphSignalSms to the graph's
// one-thread signal kernels, and a pull on the copy engine runs on kGraphPullSms SMs instead (see
// comm_sms; tests/gpu/test_graph.cu, GraphCudaPeer, replays on two GPUs in both launch orders).
// World 1: nothing to gather; the call is the engine on all SMs reading A directly (gathered() is
// not written).
// Separate GPUs (peer, ipc) with the copy engine: pull mode copies the rank's own segment into its
// gathered buffer before the GEMM starts (a same-GPU copy needs SMs, and the GEMM takes them all);
// push mode skips that copy where the own segment starts and ends on
// engine tile rows (multiples of 128, or M): the GEMM reads those rows from A_r itself
// (GemmArgs::a_alt) without waiting, starts at once, and the entry barrier and the pushes run
// beside it. gathered() then lacks the own rows.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/ops/ag_gemm_plan.hpp"
#include "tilelink/runtime/world.hpp"
#include "tilelink/tune/path_model.hpp"
#include "tilelink/tune/sm_split.hpp"

namespace tilelink::cuda {

namespace detail {
class FusedRuntime;
}

class AgGemm {
 public:
  // n_per_rank[r] = N_r. dtype: bf16 (A, B, C). config.gemm_tile_m/n are replaced by the engine's
  // tile. config.comm_workers = 0: the comm program on the copy engine (stream operations);
  // k > 0: on k SMs of the rank (bulk copies, ops/cuda/comm.hpp), co-running with the GEMM.
  // config.compute_workers = the GEMM's SMs; 0 = the rest (less kCopySpareSms with the copy engine).
  AgGemm(World& world, const RowPartition& rows, const std::vector<int64_t>& n_per_rank, int64_t k,
         DType dtype, const AgGemmConfig& config);
  ~AgGemm();
  AgGemm(const AgGemm&) = delete;
  AgGemm& operator=(const AgGemm&) = delete;

  const AgGemmPlan& plan(int rank) const { return plans_.at(rank); }

  // Enqueues one call on every local rank (indexed by rank; entries of non-local ranks ignored):
  // a[r] = A_r [M_r, K], b[r] = B_r [N_r, K], c[r] = C_r [M, N_r], dense row-major device memory.
  // Ordered on world.stream(r): work enqueued there later sees C_r.
  void run(const std::vector<const void*>& a, const std::vector<const void*>& b,
           const std::vector<void*>& c);
  void run_unfused(const std::vector<const void*>& a, const std::vector<const void*>& b,
                   const std::vector<void*>& c);
  // The fused-or-unfused choice for this world and shape (tune/path_model.hpp); `requested` other
  // than kAuto is kept. run_auto() runs the chosen path.
  PathChoice choose(OpPath requested = OpPath::kAuto) const;
  void run_auto(const std::vector<const void*>& a, const std::vector<const void*>& b,
                const std::vector<void*>& c, OpPath requested = OpPath::kAuto);

  // Parts, for the bench's ideal bound: the comm program alone / the GEMM alone (all signals set).
  // Eager only (refused once the op has been captured).
  void run_comm_only(const std::vector<const void*>& a);
  void run_gemm_only(const std::vector<const void*>& a, const std::vector<const void*>& b,
                     const std::vector<void*>& c);
  // The fused call's launches, streams and comm program, but the GEMM's waits pass at once: the two
  // parts run side by side without the dependency between them (their contention for the GPU, not
  // the waits). For the bench's "together" bound only: the GEMM may read rows of the previous call,
  // so C is not the product. Eager only.
  void run_unlinked(const std::vector<const void*>& a, const std::vector<const void*>& b,
                    const std::vector<void*>& c);

  const void* gathered(int rank) const;
  // SMs the GEMM of `rank` runs on, and the comm program's SMs (0: the copy engine). Both follow
  // the config, except on separate GPUs once a call has been captured in a CUDA graph: the GEMM
  // leaves kGraphSignalSms to the graph's one-thread signal kernels, and a pull runs on
  // kGraphPullSms SMs (ag_gemm_cuda.cu, comm_sms, says why).
  int gemm_sms(int rank) const;
  // How rank `rank`'s fused GEMM spreads over its SMs: tiles (the plan's, kTileN wide), blocks,
  // and the split of its last wave (the op gives the engine a workspace, so a last wave at most
  // half full is split). An unfused call's GEMM, which no signal maps onto, takes the width the
  // engine picks (gemm_pick_tile_n).
  compute::sm90::GemmWork gemm_work(int rank) const;
  int comm_sms(int rank) const;

  // The SMs the GEMM leaves to the driver's same-GPU copies (virtual ranks) and, on separate GPUs
  // in graph mode, to the signal kernels (tune/sm_split.hpp); a captured pull's comm kernel's SMs.
  static constexpr int kCopySpareSms = tilelink::kCopySpareSms;
  static constexpr int kGraphSignalSms = tilelink::kGraphSignalSms;
  static constexpr int kGraphPullSms = 4;

 private:
  void check_args(const std::vector<const void*>& a, const std::vector<const void*>& b,
                  const std::vector<void*>& c) const;
  // The AllGather's program on rank r, or a part of it (comm/allgather.hpp; the copy engine runs
  // parts, the SM kernel runs the whole program for any part but kRemote).
  void enqueue_comm(int r, const void* a, AllGatherPart part);
  bool local_before_gemm() const;
  bool own_direct(int r) const;  // push on separate GPUs, own segment on tile rows
  // hooks: the engine with the wait hooks; linked: they wait for this call's epoch (else they
  // pass).
  void enqueue_gemm(int r, const void* a_gathered, const void* a_own, const void* b, void* c,
                    bool hooks, bool linked = true);
  void run_call(const std::vector<const void*>& a, const std::vector<const void*>& b,
                const std::vector<void*>& c, bool linked);

  World& world_;
  std::vector<AgGemmPlan> plans_;
  std::unique_ptr<detail::FusedRuntime> rt_;  // workspace, lanes, epochs, engine (src/ops/fused_runtime.hpp)
};

}  // namespace tilelink::cuda
