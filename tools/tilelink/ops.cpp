// The ops of the command line and the CPU fuzzer: one OpSpec each (op_registry.hpp), with its CPU
// backend adapter. The CUDA adapters live in ops_cuda.cu and attach themselves (attach_cuda_ops).
#include "op_registry.hpp"

#include "tilelink/backend/cpu/ops.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cli {

namespace {

// Adapts a CPU op (run/run_unfused from a rank's thread) to CpuOpRun.
template <class Op>
class CpuAdapter final : public CpuOpRun {
 public:
  template <class... Args>
  explicit CpuAdapter(Args&&... args) : op_(std::forward<Args>(args)...) {}
  void run(cpu::RankContext& ctx, const void* a, const void* b, void* c) override { op_.run(ctx, a, b, c); }
  void run_unfused(cpu::RankContext& ctx, const void* a, const void* b, void* c) override {
    op_.run_unfused(ctx, a, b, c);
  }

 private:
  Op op_;
};

// The tile and worker options every CPU op takes.
template <class Config>
Config cpu_config(const OpProblem& p) {
  Config cfg;
  cfg.gemm_tile_m = p.tile_m;
  cfg.gemm_tile_n = p.tile_n;
  cfg.comm_workers = p.comm_workers;
  cfg.compute_workers = p.compute_workers;
  return cfg;
}

int64_t all_rows(const OpProblem& p, int) { return p.m; }
int64_t first_row(const OpProblem&, int) { return 0; }
int64_t segment_rows(const OpProblem& p, int r) { return p.rows.size(r); }
int64_t segment_row0(const OpProblem& p, int r) { return p.rows.begin(r); }

OpSpec ag_gemm_spec() {
  OpSpec s;
  s.name = "ag_gemm";
  s.summary = "fused AllGather+GEMM: C_r = AllGather(A) * B_r^T";
  s.split_n = true;
  s.variants = {"pull", "push"};
  s.make_cpu = [](cpu::World& world, const OpProblem& p) -> std::unique_ptr<CpuOpRun> {
    AgGemmConfig cfg = cpu_config<AgGemmConfig>(p);
    cfg.mode = p.mode;
    cfg.comm_tile_rows = p.comm_tile;
    return std::make_unique<CpuAdapter<cpu::AgGemm>>(world, p.rows, p.split, p.k, p.dtype, cfg);
  };
  return s;
}

OpSpec gemm_rs_spec() {
  OpSpec s;
  s.name = "gemm_rs";
  s.summary = "fused GEMM+ReduceScatter: C_r = rows r of sum_i A_i * B_i^T";
  s.variants = {"pull", "push"};
  s.c_rows = &segment_rows;
  s.c_row0 = &segment_row0;
  s.make_cpu = [](cpu::World& world, const OpProblem& p) -> std::unique_ptr<CpuOpRun> {
    GemmRsConfig cfg = cpu_config<GemmRsConfig>(p);
    cfg.mode = p.mode;
    cfg.comm_tile_rows = p.comm_tile;
    return std::make_unique<CpuAdapter<cpu::GemmRs>>(world, p.rows, p.n, p.split, p.dtype, cfg);
  };
  return s;
}

OpSpec gemm_ar_spec() {
  OpSpec s;
  s.name = "gemm_ar";
  s.summary = "fused GEMM+AllReduce: every C_r = sum_i A_i * B_i^T";
  s.variants = {"one-shot", "two-shot"};
  s.c_rows = &all_rows;
  s.c_row0 = &first_row;
  s.make_cpu = [](cpu::World& world, const OpProblem& p) -> std::unique_ptr<CpuOpRun> {
    GemmArConfig cfg = cpu_config<GemmArConfig>(p);
    cfg.algo = allreduce_algo_of(p);
    return std::make_unique<CpuAdapter<cpu::GemmAr>>(world, p.rows, p.n, p.split, p.dtype, cfg);
  };
  return s;
}

}  // namespace

AllReduceAlgo allreduce_algo_of(const OpProblem& p) {
  if (p.variant == "two-shot") return AllReduceAlgo::kTwoShot;
  if (p.variant == "one-shot") return AllReduceAlgo::kOneShot;
  return choose_allreduce_algo(p.m, p.n, p.world, p.dtype);
}

TILELINK_REGISTER_OP(ag_gemm_spec());
TILELINK_REGISTER_OP(gemm_rs_spec());
TILELINK_REGISTER_OP(gemm_ar_spec());

}  // namespace tilelink::cli
