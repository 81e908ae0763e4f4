// The Python module's CUDA backend (backend.hpp): virtual ranks on one GPU, or this process's rank
// of an ipc world (tilelink.init); each op made once per problem by the registry's CUDA adapter,
// ordered into the caller's stream by events.
//
// The ranks run on their own streams (virtual: in their green contexts). A call records an event on the
// caller's stream, every rank's stream waits for it, the op is enqueued, and the caller's stream
// waits for an event recorded on every rank's stream: to the caller the op is one more operation
// on its stream, capturable with it, and memory the caller's allocator hands out for that stream is
// safe to reuse after it.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/driver.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/attention_cuda.hpp"
#include "tilelink/ops/moe_ops_cuda.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::python {

namespace {

namespace tlc = tilelink::cuda;

// Restores the calling thread's current context on scope exit (binding a rank makes its green
// context current; the caller's framework expects its own back).
class ContextGuard {
 public:
  ContextGuard() { tlc::driver::cuCtxGetCurrent(&saved_); }
  ~ContextGuard() {
    if (saved_) tlc::driver::cuCtxSetCurrent(saved_);
  }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  CUcontext saved_ = nullptr;
};

class CudaWorld final : public CudaBackend {
 public:
  // options.device: the GPU of every rank here (virtual) or of this process (ipc).
  explicit CudaWorld(const tlc::WorldOptions& options) : device_(options.device) {
    const int device = options.device;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      throw Error("backend 'cuda': no GPU is visible to this process");
    }
    TL_REQUIRE(device < count, "backend 'cuda': device " << device << " does not exist (" << count << " visible)");
    ContextGuard keep;
    TL_CUDA_CHECK(cudaSetDevice(device));
    TL_CUDA_CHECK(cudaFree(nullptr));  // the primary context, where the caller's streams live
    world_ = std::make_unique<tlc::World>(options);
    // The caller's event lives in the primary context; each rank's in its green context (an event
    // is recorded only on a stream of its own context; a stream may wait for any context's event).
    TL_CUDA_CHECK(cudaSetDevice(device));
    TL_CUDA_CHECK(cudaEventCreateWithFlags(&called_, cudaEventDisableTiming));
    done_.assign(world_->size(), nullptr);
    for (int r : world_->local_ranks()) {
      world_->bind(r);
      TL_CUDA_CHECK(cudaEventCreateWithFlags(&done_[r], cudaEventDisableTiming));
    }
  }

  ~CudaWorld() override {
    ContextGuard keep;
    ops_.clear();
    attn_.clear();
    moe_.clear();
    for (int r : world_->local_ranks()) {
      world_->bind(r);
      cudaEventDestroy(done_[r]);
    }
    cudaSetDevice(device_);
    cudaEventDestroy(called_);
  }

  int size() const override { return world_->size(); }
  int device() const override { return device_; }

  PathChoice run(const cli::OpSpec& spec, const cli::OpProblem& p, const cli::ConstPtrs& a, const cli::ConstPtrs& b,
                 const cli::Ptrs& c, uintptr_t stream) override {
    ContextGuard keep;
    cli::CudaOpRun& op = made(spec, p);
    const PathChoice choice = op.choose(p.path);
    in_caller_order(stream, [&] {
      if (choice.path == OpPath::kUnfused) op.run_unfused(a, b, c);
      else op.run(a, b, c);
    });
    return choice;
  }

  PathChoice attention(const AttnCall& call, const std::vector<const void*>& q, const std::vector<const void*>& k,
                       const std::vector<const void*>& v, const std::vector<void*>& o, const std::vector<float*>& lse,
                       uintptr_t stream) override {
    ContextGuard keep;
    MadeAttn& op = made_attn(call);
    const PathChoice choice = op.sp ? op.sp->choose(call.path) : op.ring->choose(call.path);
    in_caller_order(stream, [&] {
      const bool unfused = choice.path == OpPath::kUnfused;
      if (op.sp) unfused ? op.sp->run_unfused(q, k, v, o, lse) : op.sp->run(q, k, v, o, lse);
      else unfused ? op.ring->run_unfused(q, k, v, o, lse) : op.ring->run(q, k, v, o, lse);
    });
    return choice;
  }

  PathChoice moe(const MoeCall& call, const MoeOperands& x, uintptr_t stream) override {
    ContextGuard keep;
    MadeMoe& op = made_moe(call);
    const PathChoice choice = op.ag ? op.ag->choose(call.path) : op.rs ? op.rs->choose(call.path) : op.mlp->choose(call.path);
    if (std::find(routed_.begin(), routed_.end(), &op) == routed_.end())
      routed_.push_back(&op);  // its routing checked at the next sync()
    in_caller_order(stream, [&] {
      const bool unfused = choice.path == OpPath::kUnfused;
      if (op.ag) unfused ? op.ag->run_unfused(x.a, x.ids, x.weights, x.w1, x.out)
                         : op.ag->run(x.a, x.ids, x.weights, x.w1, x.out);
      else if (op.rs) unfused ? op.rs->run_unfused(x.a, x.ids, x.weights, x.w2, x.out)
                              : op.rs->run(x.a, x.ids, x.weights, x.w2, x.out);
      else unfused ? op.mlp->run_unfused(x.a, x.ids, x.weights, x.w1, x.w2, x.out)
                   : op.mlp->run(x.a, x.ids, x.weights, x.w1, x.w2, x.out);
    });
    return choice;
  }

  // Also reports a MoE call's bad expert id (the routing kernel's status, read once the work is
  // done: the ids live on the device, and a call does not synchronize).
  void sync() override {
    ContextGuard keep;
    world_->sync("python call");
    std::vector<MadeMoe*> routed;
    routed.swap(routed_);
    for (MadeMoe* op : routed) {
      for (int r : world_->local_ranks()) {
        const tlc::MoeLayer& layer = op->ag ? op->ag->layer(r) : op->rs ? op->rs->layer(r) : op->mlp->layer0().layer(r);
        int64_t status = 0;
        world_->bind(r);
        TL_CUDA_CHECK(cudaMemcpy(&status, layer.status(), sizeof(status), cudaMemcpyDeviceToHost));
        if (status != 0) {
          const int64_t pair = status - 1;
          throw Error(std::string(op->ag ? "moe_ag_gemm" : op->rs ? "moe_gemm_rs" : "moe_mlp") + ": rank " +
                      std::to_string(r) + "'s routing: token " + std::to_string(pair / layer.topk()) + ", slot " +
                      std::to_string(pair % layer.topk()) + " names an expert outside [0, " +
                      std::to_string(layer.experts()) + "); the call's output is not valid");
        }
      }
    }
  }

  void stop_peers() override {
    ContextGuard keep;
    world_->stop_peers();
  }

  std::string config(const cli::OpSpec& spec, const cli::OpProblem& p) override {
    ContextGuard keep;
    cli::CudaOpRun& op = made(spec, p);
    std::string out;
    for (int r : world_->local_ranks())
      out += "rank " + std::to_string(r) + ": " + std::to_string(world_->sm_count(r)) + " SMs, " + op.config(r) + "\n";
    return out;
  }

 private:
  // enqueue() after the work on the caller's stream, and the caller's stream after it.
  template <class Enqueue>
  void in_caller_order(uintptr_t stream, Enqueue&& enqueue) {
    const auto caller = reinterpret_cast<cudaStream_t>(stream);
    TL_CUDA_CHECK(cudaSetDevice(device_));
    TL_CUDA_CHECK(cudaEventRecord(called_, caller));
    for (int r : world_->local_ranks()) {
      world_->bind(r);
      TL_CUDA_CHECK(cudaStreamWaitEvent(world_->stream(r), called_, 0));
    }
    enqueue();
    for (int r : world_->local_ranks()) {
      world_->bind(r);
      TL_CUDA_CHECK(cudaEventRecord(done_[r], world_->stream(r)));
      TL_CUDA_CHECK(cudaStreamWaitEvent(caller, done_[r], 0));
    }
  }

  struct MadeAttn {
    std::unique_ptr<tlc::SpAttn> sp;
    std::unique_ptr<tlc::RingAttn> ring;
  };
  MadeAttn& made_attn(const AttnCall& c) {
    const SpAttnShape& s = c.shape;
    const std::string key = attn_key(c.ring, s, c.sharding, c.dtype);
    auto it = attn_.find(key);
    if (it != attn_.end()) return it->second;
    if (attn_.size() >= kMaxMadeOps) {
      TL_CUDA_CHECK(cudaDeviceSynchronize());  // the made ops' workspaces may still be in use
      attn_.clear();
    }
    MadeAttn made;
    if (c.ring) made.ring = std::make_unique<tlc::RingAttn>(*world_, s, c.sharding, c.dtype);
    else made.sp = std::make_unique<tlc::SpAttn>(*world_, s, c.sharding, c.dtype);
    return attn_.emplace(key, std::move(made)).first->second;
  }

  struct MadeMoe {
    std::unique_ptr<tlc::MoeAgGemm> ag;
    std::unique_ptr<tlc::MoeGemmRs> rs;
    std::unique_ptr<tlc::MoeMlp> mlp;
  };
  MadeMoe& made_moe(const MoeCall& c) {
    const std::string key = moe_key(c);
    auto it = moe_.find(key);
    if (it != moe_.end()) return it->second;
    if (moe_.size() >= kMaxMadeOps) {
      sync();  // the made ops' workspaces may still be in use, and their routing is checked
      moe_.clear();
    }
    MadeMoe made;
    if (c.op == MoeOp::kAgGemm)
      made.ag = std::make_unique<tlc::MoeAgGemm>(*world_, c.tokens, c.hidden, c.ffn, c.experts, c.topk, c.dtype);
    else if (c.op == MoeOp::kGemmRs)
      made.rs = std::make_unique<tlc::MoeGemmRs>(*world_, c.tokens, c.hidden, c.ffn, c.experts, c.topk, c.dtype);
    else made.mlp = std::make_unique<tlc::MoeMlp>(*world_, c.tokens, c.hidden, c.ffn, c.experts, c.topk, c.dtype);
    return moe_.emplace(key, std::move(made)).first->second;
  }

  cli::CudaOpRun& made(const cli::OpSpec& spec, const cli::OpProblem& p) {
    TL_REQUIRE(spec.make_cuda, "op " << spec.name << " has no CUDA backend");
    TL_REQUIRE(p.dtype == DType::kBF16, "op " << spec.name << ": the CUDA backend's ops take bfloat16");
    const std::string key = cli::describe(p) + " comm_tile=" + std::to_string(p.comm_tile_auto ? 0 : p.comm_tile) +
                            " comm_sms=" + std::to_string(p.comm_sms);
    auto it = ops_.find(key);
    if (it != ops_.end()) return *it->second;
    if (ops_.size() >= kMaxMadeOps) {
      TL_CUDA_CHECK(cudaDeviceSynchronize());  // the made ops' workspaces may still be in use
      ops_.clear();
    }
    return *ops_.emplace(key, spec.make_cuda(*world_, p)).first->second;
  }

  static constexpr size_t kMaxMadeOps = 16;
  int device_ = 0;
  std::unique_ptr<tlc::World> world_;
  cudaEvent_t called_ = nullptr;
  std::vector<cudaEvent_t> done_;
  std::map<std::string, std::unique_ptr<cli::CudaOpRun>> ops_;
  std::map<std::string, MadeAttn> attn_;
  std::map<std::string, MadeMoe> moe_;
  std::vector<MadeMoe*> routed_;  // the MoE ops called since the last sync()
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::unique_ptr<CudaBackend> make_cuda_virtual(int world, int device, std::chrono::milliseconds timeout) {
  return std::make_unique<CudaWorld>(tlc::WorldOptions{
      .transport = tlc::Transport::kVirtual, .world_size = world, .device = device, .timeout = timeout});
}

std::unique_ptr<CudaBackend> make_cuda_process(std::shared_ptr<tlc::Bootstrap> boot, std::chrono::milliseconds timeout) {
  const int device = boot->device();
  return std::make_unique<CudaWorld>(tlc::WorldOptions{.transport = tlc::Transport::kIpc,
                                                       .world_size = boot->size(),
                                                       .device = device,
                                                       .timeout = timeout,
                                                       .bootstrap = std::move(boot)});
}

}  // namespace tilelink::python
