// The CUDA backend adapters of the command line's ops (op_registry.hpp): each makes its op for one
// problem, with the op's CLI defaults, and exposes its calls and parts to the generic driver
// (cmd_ops_cuda.cu).
#include <algorithm>
#include <string>

#include "op_registry.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/ag_gemm_cuda.hpp"
#include "tilelink/ops/gemm_ar_cuda.hpp"
#include "tilelink/ops/gemm_rs_cuda.hpp"

namespace tilelink::cli {

namespace {

namespace tlc = tilelink::cuda;

template <class Op>
class CudaAdapterBase : public CudaOpRun {
 public:
  void run(const ConstPtrs& a, const ConstPtrs& b, const Ptrs& c) override { op_->run(a, b, c); }
  void run_unfused(const ConstPtrs& a, const ConstPtrs& b, const Ptrs& c) override { op_->run_unfused(a, b, c); }
  PathChoice choose(OpPath requested) const override { return op_->choose(requested); }

 protected:
  std::unique_ptr<Op> op_;
};

class AgGemmCuda final : public CudaAdapterBase<tlc::AgGemm> {
 public:
  AgGemmCuda(tlc::World& world, const OpProblem& p) : world_(world) {
    cfg_.mode = p.mode;
    // --variant auto: push on separate GPUs (peer, ipc) with the copy engine (the GEMM then reads the
    // rank's own rows from A_r and starts at once: 1.02-1.09x vs pull's 0.95-1.04x on peer,
    // bench/notes/fused_ops_cuda.md), pull elsewhere.
    if (p.mode_auto && world.transport() != tlc::Transport::kVirtual && p.comm_sms == 0) cfg_.mode = CommMode::kPush;
    cfg_.comm_workers = p.comm_sms;  // 0: the copy engine
    cfg_.compute_workers = 0;        // the GEMM takes the rank's SMs less the copy engine's spare ones
    // Without --comm-tile: about 4 tiles a segment, multiples of 128 rows. Each copy-engine tile costs
    // ~25 us of stream waits and launches (bench/notes/fused_ops_cuda.md): 64-row tiles made the comm
    // program 7x slower than 1024-row ones at 8192x11008x4096 on two H200s.
    cfg_.comm_tile_rows =
        p.comm_tile_auto
            ? static_cast<int>(std::clamp<int64_t>(round_up(ceil_div(p.rows.max_size(), 4), 128), 128, 4096))
            : p.comm_tile;
    auto_tile_ = p.comm_tile_auto;
    op_ = std::make_unique<tlc::AgGemm>(world, p.rows, p.split, p.k, DType::kBF16, cfg_);
  }
  std::string config(int r) const override {
    return "GEMM on " + std::to_string(op_->gemm_sms(r)) + " SMs, comm " +
           (cfg_.comm_workers ? "on " + std::to_string(cfg_.comm_workers) + " SMs (bulk copies)"
                              : std::string("on the copy engine")) +
           ", " + (cfg_.mode == CommMode::kPush ? "push" : "pull") + ", comm tiles of " +
           std::to_string(cfg_.comm_tile_rows) + " rows" + (auto_tile_ ? " (auto)" : "");
  }
  std::vector<TimedPart> parts(const ConstPtrs& a, const ConstPtrs& b, const Ptrs& c) override {
    return {{"comm", [this, a] { op_->run_comm_only(a); }},
            {"gemm", [this, a, b, c] { op_->run_gemm_only(a, b, c); }}};
  }
  std::function<void()> together(const ConstPtrs& a, const ConstPtrs& b, const Ptrs& c) override {
    return [this, a, b, c] { op_->run_unlinked(a, b, c); };
  }

 private:
  tlc::World& world_;
  AgGemmConfig cfg_;
  bool auto_tile_ = false;
};

class GemmRsCuda final : public CudaAdapterBase<tlc::GemmRs> {
 public:
  GemmRsCuda(tlc::World& world, const OpProblem& p) {
    cfg_.mode = p.mode;  // pull: the owners read peers' partials; push: the producers write them
    // The reduce (and push: the pushers) run on SMs: --comm-sms, or 0 = the op's choice (pull: the
    // cost model's, per shape; push: a quarter of the SMs, 2..16).
    cfg_.comm_workers = p.comm_sms;
    cfg_.compute_workers = 0;
    cfg_.comm_tile_rows = p.comm_tile_auto ? 128 : p.comm_tile;  // the reduce tiles' rows
    op_ = std::make_unique<tlc::GemmRs>(world, p.rows, p.n, p.split, DType::kBF16, cfg_);
  }
  std::string config(int r) const override {
    return "GEMM on " + std::to_string(op_->gemm_sms(r)) + " SMs, " +
           (cfg_.mode == CommMode::kPush ? "push+reduce" : "reduce") + " on " +
           std::to_string(op_->plan(r).config.comm_workers) + ", reduce bands of " +
           std::to_string(op_->plan(r).rs.band_rows) + "x" + std::to_string(op_->plan(r).rs.band_cols);
  }
  // NOTE: the GEMM part first: the reduce alone needs the tile_done signals it sets.
  std::vector<TimedPart> parts(const ConstPtrs& a, const ConstPtrs& b, const Ptrs& c) override {
    return {{"gemm", [this, a, b] { op_->run_gemm_only(a, b); }}, {"reduce", [this, c] { op_->run_reduce_only(c); }}};
  }
  int comm_part() const override { return 1; }

 private:
  GemmRsConfig cfg_;
};

class GemmArCuda final : public CudaAdapterBase<tlc::GemmAr> {
 public:
  GemmArCuda(tlc::World& world, const OpProblem& p) {
    cfg_.algo = allreduce_algo_of(p);
    cfg_.comm_workers = p.comm_sms;  // 0: the op's share
    cfg_.compute_workers = 0;
    op_ = std::make_unique<tlc::GemmAr>(world, p.rows, p.n, p.split, DType::kBF16, cfg_);
  }
  std::string config(int r) const override {
    return "GEMM on " + std::to_string(op_->gemm_sms(r)) + " SMs, " + allreduce_algo_name(cfg_.algo) +
           " allreduce on " + std::to_string(op_->comm_sms(r)) + " (and the GEMM's once it is done), bands of 32x" +
           std::to_string(op_->plan(r).ar.band_cols);
  }
  // NOTE: the GEMM part first: the AllReduce alone needs the tile_done signals it sets.
  std::vector<TimedPart> parts(const ConstPtrs& a, const ConstPtrs& b, const Ptrs& c) override {
    return {{"gemm", [this, a, b] { op_->run_gemm_only(a, b); }},
            {"allreduce", [this, c] { op_->run_comm_only(c); }}};
  }
  int comm_part() const override { return 1; }
  double peer_bytes(int r) const override { return gemm_ar_comm_bytes(op_->plan(r)); }

 private:
  GemmArConfig cfg_;
};

}  // namespace

void attach_cuda_ops() {
  struct Entry {
    const char* name;
    const char* own_baseline;  // the unfused baseline where NCCL cannot run (virtual ranks)
    std::function<std::unique_ptr<CudaOpRun>(tlc::World&, const OpProblem&)> make;
  };
  const Entry entries[] = {
      {"ag_gemm", "cuBLAS+copy engine", [](tlc::World& w, const OpProblem& p) { return std::make_unique<AgGemmCuda>(w, p); }},
      {"gemm_rs", "cuBLAS+SM reduce", [](tlc::World& w, const OpProblem& p) { return std::make_unique<GemmRsCuda>(w, p); }},
      {"gemm_ar", "cuBLAS+SM allreduce", [](tlc::World& w, const OpProblem& p) { return std::make_unique<GemmArCuda>(w, p); }},
  };
  for (const Entry& e : entries) {
    OpSpec* spec = find_op_mutable(e.name);
    TL_REQUIRE(spec, "the CUDA side of op " << e.name << " has no registered op");
    spec->own_baseline = e.own_baseline;
    spec->make_cuda = e.make;
  }
}

}  // namespace tilelink::cli
