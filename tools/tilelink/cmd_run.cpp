// tilelink run <op>: one op on a backend, checked against the float64 reference and against the
// unfused baseline, with timings. Exit code 0 only when every check passes.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "cli.hpp"
#include "layer_ops.hpp"
#include "op_check.hpp"
#include "op_registry.hpp"
#include "problem.hpp"
#include "tilelink/backend/cpu/ops.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cli {

int cuda_device_count();  // cuda_probe.cu (0 without CUDA)
#if defined(TILELINK_HAS_CUDA)
// cmd_ops_cuda.cu: the shapes in one world, checked (and timed when bench).
int run_op_cuda(const OpSpec& spec, const std::vector<OpProblem>& ps, const std::string& transport, bool bench,
                int warmup, int iters);
#endif

namespace {

const char* kRunUsage =
    "[--backend auto|cpu|cuda] [--world W] [-m M] [-n N] [-k K] [--dtype bf16|fp16|fp32] "
    "[--variant auto|pull|push (ag_gemm, gemm_rs)|one-shot|two-shot (gemm_ar)] [--m-split c0,c1,...] [--comm-tile R] [--tile-m TM] [--tile-n TN] "
    "[--comm-workers C] [--compute-workers G] [--iters I] [--seed S] [--timeout-ms T] "
    "[--tolerance E] [--ref-limit MNK (cuda: float64 reference up to this M*N*K, 2e10)] [--transport auto|virtual|peer|ipc] [--comm-sms K] [--path auto|fused|unfused] "
    "[--baseline-only (check the unfused baseline alone)] (the last four: cuda)";

}  // namespace

int run_op_command(Args& args, const OpSpec& spec) {
  OpProblem p = parse_problem(args, spec.name, spec.variants, spec.split_n);
  std::string transport = args.get("--transport", "auto");
  args.finish();
#if defined(TILELINK_HAS_CUDA)
  const bool cuda_op = static_cast<bool>(spec.make_cuda);
#else
  const bool cuda_op = false;
#endif
  if (p.backend == "auto") {
    // The CUDA backend when a GPU is present, this build has a CUDA implementation of the op, the
    // dtype is bf16, the variant is not push and no CPU-only option is given; otherwise the CPU.
    int gpus = cuda_device_count();
    p.backend = gpus > 0 && cuda_op && p.dtype == DType::kBF16 && p.mode == CommMode::kPull && !p.cpu_options_given
                    ? "cuda"
                    : "cpu";
    if (gpus > 0 && p.backend == "cpu")
      std::printf("note: %d GPU(s) found, but this build has no CUDA %s %s for these options; using the CPU "
                  "backend\n", gpus, std::string(dtype_name(p.dtype)).c_str(), spec.name.c_str());
  }
  TL_REQUIRE(p.backend == "cpu" || !p.cpu_options_given,
             "--tile-m, --tile-n, --comm-workers and --compute-workers apply to the CPU backend only (the CUDA "
             "ops take the engine's tiles and choose their SMs; --comm-sms sets the comm SMs)");
  TL_REQUIRE(p.backend == "cpu" || cuda_op, spec.name << " has no CUDA implementation in this build: use "
                                                         "--backend cpu");
#if defined(TILELINK_HAS_CUDA)
  if (p.backend == "cuda") return run_op_cuda(spec, {p}, transport, false, 0, 0);
#endif
  TL_REQUIRE(transport == "auto", "--transport applies to the CUDA backend only");
  TL_REQUIRE(!p.cuda_options_given,
             "--path, --comm-sms, --baseline-only and --ref-limit apply to the CUDA backend only");
  std::printf("%s\n", describe(p).c_str());
  return report_cpu_outcome(check_cpu(spec, p), p.tolerance, p.iters);
}

#if !defined(TILELINK_HAS_CUDA)
int bench_op_command(Args&, const OpSpec& spec) {
  TL_REQUIRE(false, "bench " << spec.name << " measures the CUDA backend, which this build does not have; use "
                                             "`run` for the CPU");
  return 2;
}
#endif

void register_op_commands() {
  for (const OpSpec& spec : op_specs()) {
    const std::string name = spec.name;
    register_command(make_command("run " + name, kRunUsage, spec.summary + ", checked",
                                  [name](Args& args) { return run_op_command(args, *find_op(name)); },
                                  {"--baseline-only"}));
    register_command(make_command(
        "bench " + name,
        "[run's options, --baseline-only: the baseline alone] [--shapes MxNxK,... (instead of -m -n -k; even M "
        "split)] [--comm-sms K] [--transport auto|virtual|peer|ipc] [--warmup W] [--bench-iters I]",
        spec.summary + " on the GPU: baseline (cuBLAS+NCCL on peer/ipc), parts, ideal, fused, speedup",
        [name](Args& args) { return bench_op_command(args, *find_op(name)); }, {"--baseline-only"}));
  }
  // The layer ops: run only (the CPU backend; no CUDA implementation to bench yet).
  for (const LayerOpSpec& spec : layer_op_specs()) {
    const std::string name = spec.name;
    register_command(make_command("run " + name, spec.usage, spec.summary + ", checked (CPU backend)",
                                  [name](Args& args) { return run_layer_command(args, *find_layer_op(name)); },
                                  spec.flags));
  }
}

}  // namespace tilelink::cli
