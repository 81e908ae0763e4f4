// tilelink run <op>: one op on a backend, checked against the float64 reference and against the
// unfused baseline, with timings. Exit code 0 only when every check passes.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "cli.hpp"
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

struct RankData {
  std::vector<std::byte> a, b, c_fused, c_unfused;
  std::vector<double> ref;
};

void poison(std::vector<std::byte>& v) { std::memset(v.data(), 0xff, v.size()); }  // NaN

template <class Fn>
double time_ms(Fn&& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Outcome {
  double err_fused = 0, err_unfused = 0, t_fused = 0, t_unfused = 0;
  bool identical = true;
};

int report(const OpProblem& p, const Outcome& o) {
  bool ok = o.err_fused <= p.tolerance && o.err_unfused <= p.tolerance && o.identical;
  std::printf("  %-8s rel. error vs float64 (max over ranks) %.3e   time median %.3f ms\n", "fused",
              o.err_fused, o.t_fused);
  std::printf("  %-8s rel. error vs float64 (max over ranks) %.3e   time median %.3f ms\n",
              "unfused", o.err_unfused, o.t_unfused);
  std::printf("  fused == unfused bit for bit: %s\n", o.identical ? "yes" : "NO");
  std::printf("%s (tolerance %.1e, %d iterations)\n", ok ? "check passed" : "CHECK FAILED",
              p.tolerance, p.iters);
  return ok ? 0 : 1;
}

// Calls the fused op and its unfused baseline `iters` times each on every rank, outputs poisoned
// before every call, and records the wall time of each call.
template <class Op>
void time_calls(cpu::World& world, Op& op, std::vector<RankData>& d, int iters,
                std::vector<double>* fused_ms, std::vector<double>* unfused_ms) {
  for (int it = 0; it < iters; ++it) {
    for (auto& x : d) poison(x.c_fused), poison(x.c_unfused);
    fused_ms->push_back(time_ms([&] {
      world.run([&](cpu::RankContext& ctx) {
        auto& x = d[ctx.rank];
        op.run(ctx, x.a.data(), x.b.data(), x.c_fused.data());
      });
    }));
    unfused_ms->push_back(time_ms([&] {
      world.run([&](cpu::RankContext& ctx) {
        auto& x = d[ctx.rank];
        op.run_unfused(ctx, x.a.data(), x.b.data(), x.c_unfused.data());
      });
    }));
  }
}

// Inputs of rank r: A_r, B_r as the spec's split says (op_registry.hpp).
void make_inputs(const OpSpec& spec, const OpProblem& p, std::mt19937_64& rng, std::vector<RankData>& d) {
  for (int r = 0; r < p.world; ++r) {
    if (spec.split_n) {
      d[r].a = random_matrix(p.rows.size(r), p.k, p.dtype, rng);
      d[r].b = random_matrix(p.split[r], p.k, p.dtype, rng);
    } else {
      d[r].a = random_matrix(p.m, p.split[r], p.dtype, rng);
      d[r].b = random_matrix(p.n, p.split[r], p.dtype, rng);
    }
    const size_t c_bytes = static_cast<size_t>(spec.c_rows_of(p, r) * spec.c_cols(p, r) * dtype_size(p.dtype));
    d[r].c_fused.resize(c_bytes);
    d[r].c_unfused.resize(c_bytes);
  }
}

// The float64 reference of every rank's C_r.
void make_reference(const OpSpec& spec, const OpProblem& p, std::vector<RankData>& d) {
  const int64_t eb = dtype_size(p.dtype);
  if (spec.split_n) {  // C_r = AllGather(A) * B_r^T
    std::vector<std::byte> a_full;
    for (int r = 0; r < p.world; ++r) a_full.insert(a_full.end(), d[r].a.begin(), d[r].a.end());
    for (int r = 0; r < p.world; ++r)
      d[r].ref = gemm_reference_f64(a_full.data(), d[r].b.data(), p.dtype, p.m, p.split[r], p.k);
    return;
  }
  // K split: the full sum is [A_0 .. A_W-1] * [B_0 .. B_W-1]^T over the whole K.
  std::vector<std::byte> a_cat(static_cast<size_t>(p.m * p.k * eb)), b_cat(static_cast<size_t>(p.n * p.k * eb));
  int64_t k0 = 0;
  for (int r = 0; r < p.world; ++r) {
    const int64_t kr = p.split[r];
    for (int64_t i = 0; i < p.m; ++i)
      std::memcpy(a_cat.data() + (i * p.k + k0) * eb, d[r].a.data() + i * kr * eb, kr * eb);
    for (int64_t i = 0; i < p.n; ++i)
      std::memcpy(b_cat.data() + (i * p.k + k0) * eb, d[r].b.data() + i * kr * eb, kr * eb);
    k0 += kr;
  }
  const std::vector<double> full = gemm_reference_f64(a_cat.data(), b_cat.data(), p.dtype, p.m, p.n, p.k);
  for (int r = 0; r < p.world; ++r) {
    const int64_t row0 = spec.c_row0_of(p, r), rows = spec.c_rows_of(p, r);
    d[r].ref.assign(full.begin() + row0 * p.n, full.begin() + (row0 + rows) * p.n);
  }
}

int run_cpu(const OpSpec& spec, const OpProblem& p) {
  std::mt19937_64 rng(p.seed);
  cpu::World world(p.world, std::chrono::milliseconds(p.timeout_ms));
  std::vector<RankData> d(p.world);
  std::unique_ptr<CpuOpRun> op = spec.make_cpu(world, p);
  make_inputs(spec, p, rng, d);
  make_reference(spec, p, d);
  Outcome o;
  std::vector<double> tf, tu;
  time_calls(world, *op, d, p.iters, &tf, &tu);
  for (auto& x : d) {
    if (x.ref.empty()) continue;  // an empty output (a rank with no rows)
    o.err_fused = std::max(o.err_fused, relative_error(x.c_fused.data(), p.dtype, x.ref));
    o.err_unfused = std::max(o.err_unfused, relative_error(x.c_unfused.data(), p.dtype, x.ref));
    o.identical = o.identical && x.c_fused == x.c_unfused;
  }
  o.t_fused = median(tf);
  o.t_unfused = median(tu);
  return report(p, o);
}

std::vector<OpSpec>& specs() {
  static std::vector<OpSpec> s;
  return s;
}

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
  return run_cpu(spec, p);
}

#if !defined(TILELINK_HAS_CUDA)
int bench_op_command(Args&, const OpSpec& spec) {
  TL_REQUIRE(false, "bench " << spec.name << " measures the CUDA backend, which this build does not have; use "
                                             "`run` for the CPU");
  return 2;
}
#endif

bool register_op(OpSpec spec) {
  const std::string name = spec.name, summary = spec.summary;
  specs().push_back(std::move(spec));
  register_command(make_command("run " + name, kRunUsage, summary + ", checked",
                                [name](Args& args) { return run_op_command(args, *find_op(name)); },
                                {"--baseline-only"}));
  register_command(make_command(
      "bench " + name,
      "[run's options, --baseline-only: the baseline alone] [--shapes MxNxK,... (instead of -m -n -k; even M "
      "split)] [--comm-sms K] [--transport auto|virtual|peer|ipc] [--warmup W] [--bench-iters I]",
      summary + " on the GPU: baseline (cuBLAS+NCCL on peer/ipc), parts, ideal, fused, speedup",
      [name](Args& args) { return bench_op_command(args, *find_op(name)); }, {"--baseline-only"}));
  return true;
}

const std::vector<OpSpec>& op_specs() { return specs(); }

const OpSpec* find_op(const std::string& name) {
  for (const OpSpec& s : specs())
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace tilelink::cli
