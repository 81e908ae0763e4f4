// Internal to the CUDA fused ops: the runtime every fused op runs on. An op is its plans, its
// compute launch (the engine with the op's hooks), its comm program, its unfused baseline and its
// cost; everything else is here, once:
//
//   agreement                what every rank must agree on, checked across processes (ipc)
//   the symmetric workspace  one allocation of the plans' layout (the same on every rank)
//   lanes                    per rank, the GEMM's stream, fork/join, cuBLAS, NCCL (rank_lanes.hpp)
//   call epochs              eager or captured in a CUDA graph (call_epochs.hpp)
//   the engine               its split-wave workspaces and its warm-up launches in every context
//                            (engine_prep.cuh), launched on the GEMM stream
//   a fused call             fused_call(): begin the epochs, the pre-fork step on every rank's
//                            stream (entry barrier, a copy), fork, the compute and the comm program
//                            in the launch order the op needs, join: a call ends on world.stream(r)
//   world 1                  world1(): the engine alone on the GEMM stream, joined
//   the unfused baseline     nccl_call() (the entry-barrier rule of cuBLAS+NCCL) and own_call()
//                            (barrier, then the op's own collective on all SMs)
//   the parts                each_on_gemm_stream() and require_eager() for the bench's parts
//   the path                 choose(): the op's per-rank cost, agreed over ranks
//   SMs                      split(): tune/sm_split.hpp's policy for a rank
//
//   FusedRuntime rt(world, "gemm_ar", Agreement("gemm_ar").add("N", n), plans[0].num_bytes);
//   rt.init_engine(plans);                      // workspaces + plain warm-up
//   rt.prepare_engine<MyHooks>(hooks_of);       // the hooked engine warmed up too
//   rt.begin(1);
//   rt.fused_call(LaunchOrder::kComputeFirst,
//                 [&](int r) { rt.entry_barrier(r, plans[r].barrier); },
//                 [&](int r) { rt.launch_engine(r, args_of(r), hooks_of(r)); },
//                 [&](int r) { launch_my_comm(..., rt.epoch(r)); });
#pragma once

#include <array>

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "call_epochs.hpp"
#include "engine_prep.cuh"
#include "rank_lanes.hpp"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/runtime/agreement.hpp"
#include "tilelink/runtime/world.hpp"
#include "tilelink/tune/path_model.hpp"
#include "tilelink/tune/sm_split.hpp"

namespace tilelink::cuda::detail {

// A fused call's step that does nothing (fused_call's pre, for ops with no pre-fork step).
struct NoStep {
  void operator()(int) const {}
};

// How a fused call orders its launches.
enum class LaunchOrder : uint8_t {
  // Every rank's compute (GEMM stream), then every rank's comm program (rank's stream). A launch that
  // fails then leaves nothing behind but GEMMs whose device waits time out (bounded); enqueued the
  // other way, a failure left peers' stream waits blocked for good.
  kComputeFirst,
  // Per rank, the comm kernel (rank's stream) before the compute: an SM-driven comm kernel takes its
  // SMs before the persistent GEMM fills the rest (launched after it, its blocks found no free SM
  // while the GEMM spun on the tiles they were to bring).
  kCommFirst,
};

class FusedRuntime {
 public:
  // heap_bytes: the plans' workspace (the same on every rank). agreement: what every rank must
  // agree on (shape, split, dtype, config); with the heap's size it is checked across processes
  // (ipc) before anything is allocated, so mismatched ranks are refused on every rank.
  FusedRuntime(World& world, const char* op, Agreement agreement, int64_t heap_bytes)
      : world_(world), op_(op), unfused_name_(std::string(op) + "(unfused)") {
    agreement.add("workspace bytes", heap_bytes).check(world);
    heap_ = world.allocate(heap_bytes);
    lanes_ = std::make_unique<RankLanes>(world);
    epochs_ = std::make_unique<CallEpochs>(world);
  }
  FusedRuntime(const FusedRuntime&) = delete;
  FusedRuntime& operator=(const FusedRuntime&) = delete;

  World& world() const { return world_; }
  const char* op() const { return op_; }
  SymmetricView view(int r) const { return heap_.view(r); }
  const SymmetricBuffer& heap() const { return heap_; }
  RankLanes& lanes() { return *lanes_; }
  cudaStream_t gemm_stream(int r) const { return lanes_->gemm_stream(r); }
  int first_rank() const { return world_.local_ranks().front(); }

  // ---- SMs ---------------------------------------------------------------------------------
  // Rank r's split (tune/sm_split.hpp) with comm_sms SMs for the comm program (0: copy engine).
  // Ranks share a GPU on virtual ranks and where ipc processes sit on one GPU (the GPUs' UUIDs,
  // compared once by the lanes): a copy between them may run on the SMs, which the split leaves.
  SmSplit split(int r, int compute_workers, int comm_sms) const {
    return split_sms({.sms = world_.sm_count(r),
                      .world_size = world_.size(),
                      .compute_workers = compute_workers,
                      .comm_sms = comm_sms,
                      .ranks_share_gpu = !lanes_->gpu_per_rank(),
                      .graph_mode = epochs_->graph_mode()});
  }

  // ---- the engine --------------------------------------------------------------------------
  // Its split-wave workspaces, sized for every plan's GEMM, and the plain engine warmed up.
  template <class Plan>
  void init_engine(const std::vector<Plan>& plans) {
    engine_ws_ = std::make_unique<EngineWorkspaces>(
        world_, [&](int r) { return engine_args(plans[r], nullptr, nullptr, nullptr, 0); });
    detail::prepare_engine<compute::sm90::NoHooks>(world_, [](int) { return compute::sm90::NoHooks{}; });
  }
  // The hooked engine's first launches in every context, while nothing spins (engine_prep.cuh).
  template <class Hooks, bool kAltA = false, class HooksOf>
  void prepare_engine(HooksOf&& hooks_of) {
    detail::prepare_engine<Hooks, kAltA>(world_, hooks_of);
  }
  // The engine on rank r's GEMM stream, with its workspace.
  template <class Hooks, bool kAltA = false>
  void launch_engine(int r, compute::sm90::GemmArgs args, const Hooks& hooks) {
    engine_ws_->attach(args, r);
    detail::launch_engine<Hooks, kAltA>(args, hooks, gemm_stream(r));
  }
  // The engine without hooks: no signal maps onto its tiles, so it picks its tile width.
  void launch_plain_engine(int r, compute::sm90::GemmArgs args) {
    args.tile_n = 0;
    launch_engine(r, args, compute::sm90::NoHooks{});
  }
  compute::sm90::GemmWork work(const compute::sm90::GemmArgs& args, int r) const {
    return engine_ws_->work(args, r);
  }

  // ---- calls -------------------------------------------------------------------------------
  void begin(int n) { epochs_->begin(n); }
  Epoch epoch(int r, int i = 1) const { return epochs_->epoch(r, i); }
  uint64_t value(int r, int i = 1) const { return epochs_->value(r, i); }
  bool graph_mode() const { return epochs_->graph_mode(); }
  bool started() const { return epochs_->started(); }
  StreamContext stream_context(int r, bool unfused = false) const {
    return StreamContext{&world_, r, world_.stream(r), unfused ? unfused_name_.c_str() : op_, epochs_->counter(r)};
  }
  // The entry barrier on rank r's stream with the call's i-th epoch: every rank has finished with
  // the buffers the previous call shared.
  void entry_barrier(int r, Field<Signal> barrier, int i = 1, bool unfused = false) {
    rank_barrier(stream_context(r, unfused), view(r), barrier, value(r, i));
  }

  // One fused call, begun (begin(n)) by the op: pre(r) on every rank's stream, then fork, and
  // compute(r) (on the GEMM stream: launch_engine, and what follows the GEMM there) and comm(r) (on
  // the rank's stream) in `order`, then join. The current device is rank r's in each callback.
  // NOTE: begun by the op, not here: the first call begun while capturing switches the op to graph
  // mode, and what the op decides from graph_mode() (its SMs, its comm engine) must follow that.
  template <class Pre, class Compute, class Comm>
  void fused_call(LaunchOrder order, Pre&& pre, Compute&& compute, Comm&& comm) {
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      pre(r);
    }
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      lanes_->fork(r);
      if (order == LaunchOrder::kCommFirst) comm(r);
      compute(r);
      lanes_->join_record(r);
    }
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      if (order == LaunchOrder::kComputeFirst) comm(r);
      lanes_->join_wait(r);
    }
  }

  // World 1: nothing to communicate; enqueue(r) (the engine alone) on the GEMM stream, joined.
  template <class Enqueue>
  void world1(Enqueue&& enqueue) {
    const int r = first_rank();
    world_.bind(r);
    lanes_->on_gemm_stream(r, [&] { enqueue(r); });
  }
  // enqueue(r) on every rank's GEMM stream, each joined (the bench's GEMM part).
  template <class Enqueue>
  void each_on_gemm_stream(Enqueue&& enqueue) {
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      lanes_->on_gemm_stream(r, [&] { enqueue(r); });
    }
  }
  // The bench's parts reuse epochs and claim counters as an eager call left them.
  void require_eager(const char* part) const {
    TL_REQUIRE(!graph_mode(), op_ << ": " << part << " is for eager benches, not after a capture");
  }
  void require_started(const char* part, const char* first) const {
    TL_REQUIRE(started(), op_ << ": " << part << " needs " << first << " first");
  }

  // Refuses a call's operand before anything launches: one entry per rank; on every local rank
  // non-null (unless may_be_null(r): an empty segment) and, where `aligned`, 16-byte aligned.
  template <class P, class NullOk>
  void check_operand(const char* name, const std::vector<P>& v, bool aligned, NullOk&& may_be_null) const {
    TL_REQUIRE(static_cast<int>(v.size()) == world_.size(),
               op_ << ": pass one " << name << " entry per rank (" << world_.size() << "), got " << v.size());
    for (int r : world_.local_ranks()) {
      TL_REQUIRE(v[r] || may_be_null(r), op_ << ": null tensor on rank " << r << " (" << name << ")");
      TL_REQUIRE(!aligned || reinterpret_cast<uintptr_t>(v[r]) % 16 == 0,
                 op_ << ": " << name << " of rank " << r << " must be 16-byte aligned");
      if (v[r]) require_device_memory(name, v[r], r);
    }
  }
  template <class P>
  void check_operand(const char* name, const std::vector<P>& v, bool aligned = true) const {
    check_operand(name, v, aligned, [](int) { return false; });
  }

  // `p` is device memory of rank r's GPU (cudaPointerGetAttributes; remembered once verified, so a
  // caller that passes the same buffers call after call pays the query once).
  void require_device_memory(const char* name, const void* p, int r) const {
    for (const auto& [q, rank] : verified_)
      if (q == p && rank == r) return;
    cudaPointerAttributes at{};
    const cudaError_t e = cudaPointerGetAttributes(&at, p);
    if (e != cudaSuccess) (void)cudaGetLastError();  // not sticky: clear it
    const bool device = e == cudaSuccess && (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged);
    TL_REQUIRE(device, op_ << ": " << name << " of rank " << r << " is not device memory ("
                           << (e != cudaSuccess                    ? cudaGetErrorString(e)
                               : at.type == cudaMemoryTypeHost ? "pinned host memory"
                                                               : "not a CUDA allocation")
                           << ")");
    TL_REQUIRE(at.type == cudaMemoryTypeManaged || at.device == world_.device(r),
               op_ << ": " << name << " of rank " << r << " is memory of GPU " << at.device << "; the rank runs on GPU "
                   << world_.device(r));
    verified_[verified_next_++ % verified_.size()] = {p, r};
  }

  // ---- the unfused baseline ----------------------------------------------------------------
  bool nccl() const { return lanes_->nccl(); }
  bool gpu_per_rank() const { return lanes_->gpu_per_rank(); }
  // cuBLAS+NCCL (peer, ipc): body() enqueues the GEMMs and NCCL's collective; first, the op's
  // entry barrier where an earlier fused call (or part) may still read this rank's buffers
  // (RankLanes::nccl_entry_barrier).
  template <class Body>
  void nccl_call(Field<Signal> barrier, Body&& body) {
    const int r0 = first_rank();
    const uint64_t mark = started() && !graph_mode() ? value(r0, 1) : 0;
    if (lanes_->nccl_entry_barrier(graph_mode(), mark)) {
      begin(1);
      for (int r : world_.local_ranks()) {
        world_.bind(r);
        entry_barrier(r, barrier, 1, true);
      }
    }
    body();
    lanes_->nccl_done(started() && !graph_mode() ? value(r0, 1) : 0);
  }
  // The op's own baseline (virtual ranks, where NCCL refuses two ranks on one GPU): two epochs, the
  // entry barrier on the first, then body() (the second epoch is the body's: epoch(r, 2)).
  template <class Body>
  void own_call(Field<Signal> barrier, Body&& body) {
    begin(2);
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      entry_barrier(r, barrier, 1, true);
    }
    body();
  }

  // ---- the path ----------------------------------------------------------------------------
  // The fused-or-unfused choice: choose_of(r, model) is rank r's cost-model choice on this GPU's
  // model (the GEMM on gemm_sms of the first local rank's SMs); every rank takes the same path.
  template <class ChooseOf>
  PathChoice choose(OpPath requested, int gemm_sms, ChooseOf&& choose_of) const {
    const int r0 = first_rank();
    MachineModel m = machine_model(world_, r0, gemm_sms);
    return agreed_choice(world_.size(), r0, requested, [&](int r) { return choose_of(r, m); });
  }

 private:
  World& world_;
  const char* op_;
  std::string unfused_name_;
  SymmetricBuffer heap_;
  std::unique_ptr<RankLanes> lanes_;
  std::unique_ptr<CallEpochs> epochs_;
  std::unique_ptr<EngineWorkspaces> engine_ws_;
  mutable std::array<std::pair<const void*, int>, 64> verified_{};  // device pointers checked
  mutable size_t verified_next_ = 0;
};

// run_auto of any op: the chosen path.
template <class Op, class... Args>
void run_chosen(Op& op, OpPath requested, Args&&... args) {
  if (op.choose(requested).path == OpPath::kFused) op.run(args...);
  else op.run_unfused(args...);
}

}  // namespace tilelink::cuda::detail
