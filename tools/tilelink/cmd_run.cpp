// tilelink run <op>: one op on a backend, checked against the float64 reference and against the
// unfused baseline, with timings. Exit code 0 only when every check passes.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "cli.hpp"
#include "problem.hpp"
#include "tilelink/backend/cpu/ops.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cli {

int cuda_device_count();  // cuda_probe.cu (0 without CUDA)
#if defined(TILELINK_HAS_CUDA)
// cmd_ops_cuda.cu: the shapes in one world, checked (and timed when bench).
int run_ag_gemm_cuda(const std::vector<OpProblem>& ps, const std::string& transport, bool bench,
                     int warmup, int iters);
int run_gemm_rs_cuda(const std::vector<OpProblem>& ps, const std::string& transport, bool bench,
                     int warmup, int iters);
#endif

namespace {

const char* kRunUsage =
    "[--backend auto|cpu|cuda] [--world W] [-m M] [-n N] [-k K] [--dtype bf16|fp16|fp32] "
    "[--variant auto|pull|push] [--m-split c0,c1,...] [--comm-tile R] [--tile-m TM] [--tile-n TN] "
    "[--comm-workers C] [--compute-workers G] [--iters I] [--seed S] [--timeout-ms T] "
    "[--tolerance E] [--transport auto|virtual|peer|ipc] [--comm-sms K] [--path auto|fused|unfused] "
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

int run_cpu(const OpProblem& p) {
  std::mt19937_64 rng(p.seed);
  cpu::World world(p.world, std::chrono::milliseconds(p.timeout_ms));
  std::vector<RankData> d(p.world);
  const DType dt = p.dtype;
  const int64_t eb = dtype_size(dt);
  Outcome o;
  std::vector<double> tf, tu;

  if (p.op == "ag_gemm") {
    AgGemmConfig cfg;
    cfg.mode = p.mode;
    cfg.comm_tile_rows = p.comm_tile;
    cfg.gemm_tile_m = p.tile_m;
    cfg.gemm_tile_n = p.tile_n;
    cfg.comm_workers = p.comm_workers;
    cfg.compute_workers = p.compute_workers;
    cpu::AgGemm op(world, p.rows, p.split, p.k, dt, cfg);
    std::vector<std::byte> a_full;
    for (int r = 0; r < p.world; ++r) {
      d[r].a = random_matrix(p.rows.size(r), p.k, dt, rng);
      d[r].b = random_matrix(p.split[r], p.k, dt, rng);
      d[r].c_fused.resize(static_cast<size_t>(p.m * p.split[r] * eb));
      d[r].c_unfused.resize(d[r].c_fused.size());
      a_full.insert(a_full.end(), d[r].a.begin(), d[r].a.end());
    }
    for (int r = 0; r < p.world; ++r)
      d[r].ref = gemm_reference_f64(a_full.data(), d[r].b.data(), dt, p.m, p.split[r], p.k);
    time_calls(world, op, d, p.iters, &tf, &tu);
  } else {
    GemmRsConfig cfg;
    cfg.mode = p.mode;
    cfg.comm_tile_rows = p.comm_tile;
    cfg.gemm_tile_m = p.tile_m;
    cfg.gemm_tile_n = p.tile_n;
    cfg.comm_workers = p.comm_workers;
    cfg.compute_workers = p.compute_workers;
    cpu::GemmRs op(world, p.rows, p.n, p.split, dt, cfg);
    // The reference sums the K slices: C = [A_0 .. A_W-1] * [B_0 .. B_W-1]^T over the full K.
    std::vector<std::byte> a_cat(static_cast<size_t>(p.m * p.k * eb)), b_cat(static_cast<size_t>(p.n * p.k * eb));
    int64_t k0 = 0;
    for (int r = 0; r < p.world; ++r) {
      const int64_t kr = p.split[r];
      d[r].a = random_matrix(p.m, kr, dt, rng);
      d[r].b = random_matrix(p.n, kr, dt, rng);
      for (int64_t i = 0; i < p.m; ++i)
        std::memcpy(a_cat.data() + (i * p.k + k0) * eb, d[r].a.data() + i * kr * eb, kr * eb);
      for (int64_t i = 0; i < p.n; ++i)
        std::memcpy(b_cat.data() + (i * p.k + k0) * eb, d[r].b.data() + i * kr * eb, kr * eb);
      k0 += kr;
      d[r].c_fused.resize(static_cast<size_t>(p.rows.size(r) * p.n * eb));
      d[r].c_unfused.resize(d[r].c_fused.size());
    }
    std::vector<double> full = gemm_reference_f64(a_cat.data(), b_cat.data(), dt, p.m, p.n, p.k);
    for (int r = 0; r < p.world; ++r)
      d[r].ref.assign(full.begin() + p.rows.begin(r) * p.n, full.begin() + p.rows.end(r) * p.n);
    time_calls(world, op, d, p.iters, &tf, &tu);
  }
  for (auto& x : d) {
    o.err_fused = std::max(o.err_fused, relative_error(x.c_fused.data(), dt, x.ref));
    o.err_unfused = std::max(o.err_unfused, relative_error(x.c_unfused.data(), dt, x.ref));
    o.identical = o.identical && x.c_fused == x.c_unfused;
  }
  o.t_fused = median(tf);
  o.t_unfused = median(tu);
  return report(p, o);
}

int run_op(Args& args, const std::string& op) {
  OpProblem p = parse_problem(args, op);
  std::string transport = args.get("--transport", "auto");
  args.finish();
#if defined(TILELINK_HAS_CUDA)
  const bool cuda_op = op == "ag_gemm" || op == "gemm_rs";
#else
  const bool cuda_op = false;
#endif
  if (p.backend == "auto") {
    // The CUDA backend when a GPU is present and this build has a verified CUDA implementation of
    // the op; otherwise the CPU backend.
    // NOTE: both verified on the GPU at world 1..8, pull (bench/notes/fused_ops_cuda.md).
    constexpr bool kCudaOpVerified = true;
    int gpus = cuda_device_count();
    p.backend = gpus > 0 && cuda_op && kCudaOpVerified && p.dtype == DType::kBF16 &&
                         p.mode == CommMode::kPull ? "cuda" : "cpu";
    if (gpus > 0 && p.backend == "cpu")
      std::printf("note: %d GPU(s) found, but this build has no verified CUDA %s %s; using the CPU "
                  "backend\n", gpus, std::string(dtype_name(p.dtype)).c_str(), op.c_str());
  }
  TL_REQUIRE(p.backend == "cpu" || cuda_op, op << " has no CUDA implementation in this build yet: use "
                                                  "--backend cpu");
#if defined(TILELINK_HAS_CUDA)
  if (p.backend == "cuda")
    return op == "ag_gemm" ? run_ag_gemm_cuda({p}, transport, false, 0, 0)
                           : run_gemm_rs_cuda({p}, transport, false, 0, 0);
#endif
  TL_REQUIRE(transport == "auto", "--transport applies to the CUDA backend only");
  TL_REQUIRE(p.path == OpPath::kAuto && p.comm_sms == 0 && !p.baseline_only,
             "--path, --comm-sms and --baseline-only apply to the CUDA backend only");
  std::printf("%s\n", describe(p).c_str());
  return run_cpu(p);
}

int run_ag_gemm(Args& args) { return run_op(args, "ag_gemm"); }
int run_gemm_rs(Args& args) { return run_op(args, "gemm_rs"); }

}  // namespace

TILELINK_REGISTER_COMMAND("run ag_gemm", kRunUsage,
                          "fused AllGather+GEMM: C_r = AllGather(A) * B_r^T, checked", &run_ag_gemm,
                          {"--baseline-only"});
TILELINK_REGISTER_COMMAND("run gemm_rs", kRunUsage,
                          "fused GEMM+ReduceScatter: C_r = rows r of sum_i A_i * B_i^T, checked",
                          &run_gemm_rs, {"--baseline-only"});

}  // namespace tilelink::cli
