// The ops the command line knows, as data: one OpSpec per op says how its operands are shaped on
// each rank (so one harness makes inputs, outputs and the float64 reference of any op) and how to
// make it on each backend. Registering a spec is all `tilelink run|bench <op>` and their checks
// need; no command is written per op.
//
//   A_r, B_r per rank, split along N or K:
//     N split (AG+GEMM):  A_r [M_r, K], B_r [N_r, K], C_r = AllGather(A) B_r^T     [M, N_r]
//     K split (GEMM+RS, GEMM+AR): A_r [M, K_r], B_r [N, K_r], C_r = rows of sum_i A_i B_i^T
//   c_rows(p, r) / c_row0(p, r): the rows of the full product that C_r holds (K split).
#pragma once

#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "problem.hpp"
#include "tilelink/backend/cpu/world.hpp"
#include "tilelink/tune/gemm_ar_model.hpp"
#include "tilelink/tune/path_model.hpp"

#if defined(TILELINK_HAS_CUDA)
namespace tilelink::cuda {
class World;  // runtime/world.hpp (CUDA headers: not for the host compiler's sources)
}
#endif

namespace tilelink::cli {

using ConstPtrs = std::vector<const void*>;
using Ptrs = std::vector<void*>;

// An op made for one problem on a CPU world: called from every rank's thread.
class CpuOpRun {
 public:
  virtual ~CpuOpRun() = default;
  virtual void run(cpu::RankContext& ctx, const void* a, const void* b, void* c) = 0;
  virtual void run_unfused(cpu::RankContext& ctx, const void* a, const void* b, void* c) = 0;
};

#if defined(TILELINK_HAS_CUDA)
// A timed piece of a call (bench): its label and its enqueue on every local rank.
struct TimedPart {
  std::string label;
  std::function<void()> enqueue;
};

// An op made for one problem on a CUDA world: every call enqueues on every local rank.
class CudaOpRun {
 public:
  virtual ~CudaOpRun() = default;
  virtual void run(const ConstPtrs& a, const ConstPtrs& b, const Ptrs& c) = 0;
  virtual void run_unfused(const ConstPtrs& a, const ConstPtrs& b, const Ptrs& c) = 0;
  virtual PathChoice choose(OpPath requested) const = 0;
  // One line: SMs, comm method, tiles, as made for this shape.
  virtual std::string config(int rank) const = 0;
  // The two parts alone (the comm part first or second, see comm_part), for the ideal bound.
  virtual std::vector<TimedPart> parts(const ConstPtrs& a, const ConstPtrs& b, const Ptrs& c) = 0;
  virtual int comm_part() const { return 0; }
  // The fused call's launches without the dependency between them (AG+GEMM's "together"), or none.
  virtual std::function<void()> together(const ConstPtrs&, const ConstPtrs&, const Ptrs&) { return {}; }
  // Bytes rank `rank` reads from its peers in a fused call, for the bench's floor (NAN: no floor).
  virtual double peer_bytes(int /*rank*/) const { return std::numeric_limits<double>::quiet_NaN(); }
};
#endif

struct OpSpec {
  std::string name;
  std::string summary;
  bool split_n = false;                 // N split (else K)
  std::vector<std::string> variants;    // --variant values besides auto
  int64_t (*c_rows)(const OpProblem& p, int r) = nullptr;  // K split: rows of C_r
  int64_t (*c_row0)(const OpProblem& p, int r) = nullptr;  // K split: its first row
  std::function<std::unique_ptr<CpuOpRun>(cpu::World&, const OpProblem&)> make_cpu;
#if defined(TILELINK_HAS_CUDA)
  std::string own_baseline;             // the unfused baseline where NCCL cannot run (virtual)
  std::function<std::unique_ptr<CudaOpRun>(cuda::World&, const OpProblem&)> make_cuda;
#endif
  int64_t c_cols(const OpProblem& p, int r) const { return split_n ? p.split[r] : p.n; }
  int64_t c_rows_of(const OpProblem& p, int r) const { return split_n ? p.m : c_rows(p, r); }
  int64_t c_row0_of(const OpProblem& p, int r) const { return split_n ? 0 : c_row0(p, r); }
};

// Registers `spec` (static initialisation: TILELINK_REGISTER_OP). The CPU side of every op
// (ops.cpp) registers itself; a CUDA build's tools attach the CUDA side (attach_cuda_ops).
bool register_op(OpSpec spec);
const std::vector<OpSpec>& op_specs();
const OpSpec* find_op(const std::string& name);
OpSpec* find_op_mutable(const std::string& name);
#if defined(TILELINK_HAS_CUDA)
void attach_cuda_ops();  // ops_cuda.cu: make_cuda and own_baseline of every op that has them
#endif
// Registers `run <op>` and `bench <op>` for every registered op (cmd_run.cpp; main() calls it).
void register_op_commands();

// GEMM+AR's algorithm for a problem: --variant one-shot|two-shot, or for auto the model's choice
// (tune/gemm_ar_model.hpp).
AllReduceAlgo allreduce_algo_of(const OpProblem& p);

// The commands' bodies (cmd_run.cpp; cmd_ops_cuda.cu, or a refusal without CUDA).
int run_op_command(Args& args, const OpSpec& spec);
int bench_op_command(Args& args, const OpSpec& spec);

}  // namespace tilelink::cli

#define TILELINK_REGISTER_OP(spec_expr)                              \
  static const bool TL_CLI_CAT(tl_registered_op_, __LINE__) = \
      ::tilelink::cli::register_op(spec_expr)
