// `tilelink run ag_gemm --backend cuda` and `tilelink bench ag_gemm`: the fused op on the CUDA
// backend, checked, and timed against the unfused baseline and the ideal bound in the same run.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "cli.hpp"
#include "problem.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/ag_gemm_cuda.hpp"
#include "tilelink/ops/gemm_rs_cuda.hpp"

namespace tilelink::cli {

int cuda_device_count();

namespace {

namespace tlc = tilelink::cuda;

struct Buffers {
  std::vector<const void*> a, b;
  std::vector<void*> c, c_ref;
};

tlc::Transport pick_transport(const std::string& name, int world) {
  if (name == "auto") return cuda_device_count() >= world ? tlc::Transport::kPeer : tlc::Transport::kVirtual;
  tlc::Transport t;
  TL_REQUIRE(tlc::parse_transport(name, &t), "--transport must be auto, virtual, peer or ipc, got '" << name << "'");
  return t;
}

// Host wall time per call of `enqueue` over `iters` calls, after `warmup` calls: median of 5 batches.
template <class Fn>
double time_per_call_ms(tlc::World& world, const char* op, int warmup, int iters, Fn&& enqueue) {
  for (int i = 0; i < warmup; ++i) enqueue();
  world.sync(op);
  std::vector<double> batches;
  for (int b = 0; b < 5; ++b) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) enqueue();
    world.sync(op);
    batches.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  return median(batches);
}

void print_bench_row(const char* op, int world, const OpProblem& p, double t_base, double t_comm,
                     double t_gemm, double t_fused, OpPath chosen) {
  const double ideal = std::max(t_gemm, t_comm);
  const double flops = 2.0 * p.m * p.n * p.k;
  const double t_auto = chosen == OpPath::kFused ? t_fused : t_base;
  std::printf("\n| op | world | M | N | K | baseline ms | T_comm ms | T_gemm ms | ideal ms | fused ms | speedup | overlap eff. | fused TFLOP/s | auto path | auto ms |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::printf("| %s | %d | %lld | %lld | %lld | %.3f | %.3f | %.3f | %.3f | %.3f | %.2fx | %.0f%% | %.0f | %s | %.3f |\n", op,
              world, static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k), t_base,
              t_comm, t_gemm, ideal, t_fused, t_base / t_fused,
              t_base > ideal ? 100.0 * (t_base - t_fused) / (t_base - ideal) : 0.0, flops / (t_fused * 1e9),
              op_path_name(chosen), t_auto);
}

}  // namespace

int run_ag_gemm_cuda(const OpProblem& p, const std::string& transport_name, bool bench, int warmup,
                     int iters) {
  TL_REQUIRE(p.dtype == DType::kBF16, "ag_gemm on the CUDA backend takes --dtype bf16");
  tlc::WorldOptions wo;
  wo.transport = pick_transport(transport_name, p.world);
  wo.world_size = p.world;
  wo.timeout = std::chrono::milliseconds(p.timeout_ms);
  tlc::World world(wo);
  const int W = world.size();
  AgGemmConfig cfg;
  cfg.mode = p.mode;
  cfg.comm_workers = p.comm_sms;  // 0: the copy engine
  cfg.compute_workers = 0;  // the GEMM takes the rank's SMs less the copy engine's spare ones
  cfg.comm_tile_rows = p.comm_tile;
  tlc::AgGemm op(world, p.rows, p.split, p.k, DType::kBF16, cfg);
  const int64_t M = p.m;

  // Inputs: fresh random bf16 per rank (generated on the host, so a reference can be computed).
  std::mt19937_64 rng(p.seed);
  Buffers buf;
  buf.a.assign(W, nullptr);
  buf.b.assign(W, nullptr);
  buf.c.assign(W, nullptr);
  buf.c_ref.assign(W, nullptr);
  std::vector<std::vector<std::byte>> ha(W), hb(W);
  for (int r = 0; r < W; ++r) {
    ha[r] = random_matrix(p.rows.size(r), p.k, DType::kBF16, rng);
    hb[r] = random_matrix(p.split[r], p.k, DType::kBF16, rng);
    if (!world.is_local(r)) continue;
    world.bind(r);
    void *pa = nullptr, *pb = nullptr;
    if (!ha[r].empty()) {
      TL_CUDA_CHECK(cudaMalloc(&pa, ha[r].size()));
      TL_CUDA_CHECK(cudaMemcpy(pa, ha[r].data(), ha[r].size(), cudaMemcpyHostToDevice));
    }
    TL_CUDA_CHECK(cudaMalloc(&pb, hb[r].size()));
    TL_CUDA_CHECK(cudaMemcpy(pb, hb[r].data(), hb[r].size(), cudaMemcpyHostToDevice));
    TL_CUDA_CHECK(cudaMalloc(&buf.c[r], M * p.split[r] * 2));
    TL_CUDA_CHECK(cudaMalloc(&buf.c_ref[r], M * p.split[r] * 2));
    TL_CUDA_CHECK(cudaMemset(buf.c[r], 0xff, M * p.split[r] * 2));      // poison
    TL_CUDA_CHECK(cudaMemset(buf.c_ref[r], 0xff, M * p.split[r] * 2));
    buf.a[r] = pa;
    buf.b[r] = pb;
  }
  for (int r : world.local_ranks()) { world.bind(r); TL_CUDA_CHECK(cudaDeviceSynchronize()); }

  // Check: fused vs the cuBLAS baseline always; vs float64 where the reference is cheap enough.
  op.run(buf.a, buf.b, buf.c);
  world.sync("ag_gemm");
  op.run_unfused(buf.a, buf.b, buf.c_ref);
  world.sync("ag_gemm(unfused)");
  std::vector<std::byte> a_full;
  for (int r = 0; r < W; ++r) a_full.insert(a_full.end(), ha[r].begin(), ha[r].end());
  double err_base = 0, err_ref = -1;
  const bool with_ref = static_cast<double>(M) * p.n * p.k <= 2e10;
  for (int r : world.local_ranks()) {
    std::vector<std::byte> c(M * p.split[r] * 2), c_ref(c.size());
    world.bind(r);
    TL_CUDA_CHECK(cudaMemcpy(c.data(), buf.c[r], c.size(), cudaMemcpyDeviceToHost));
    TL_CUDA_CHECK(cudaMemcpy(c_ref.data(), buf.c_ref[r], c.size(), cudaMemcpyDeviceToHost));
    std::vector<double> base(c.size() / 2);
    for (size_t i = 0; i < base.size(); ++i) base[i] = load_as_float(c_ref.data(), DType::kBF16, i);
    err_base = std::max(err_base, relative_error(c.data(), DType::kBF16, base));
    if (with_ref) {
      auto ref = gemm_reference_f64(a_full.data(), hb[r].data(), DType::kBF16, M, p.split[r], p.k);
      err_ref = std::max(err_ref, relative_error(c.data(), DType::kBF16, ref));
    }
  }
  const int r0 = world.local_ranks()[0];
  std::printf("%s\n  transport=%s, SMs per rank=%d: GEMM on %d, comm %s\n", describe(p).c_str(),
              tlc::transport_name(world.transport()), world.sm_count(r0), op.gemm_sms(r0),
              p.comm_sms ? ("on " + std::to_string(p.comm_sms) + " SMs (bulk copies)").c_str()
                         : "on the copy engine");
  if (with_ref) std::printf("  fused rel. error vs float64 (max over ranks) %.3e\n", err_ref);
  std::printf("  fused rel. difference vs cuBLAS+copy-engine baseline %.3e\n", err_base);
  const bool ok = err_base <= p.tolerance && (!with_ref || err_ref <= p.tolerance);
  std::printf("%s (tolerance %.1e)\n", ok ? "check passed" : "CHECK FAILED", p.tolerance);
  const PathChoice choice = op.choose(p.path);
  std::printf("  path (--path %s): %s, %s\n", op_path_name(p.path), op_path_name(choice.path),
              choice.why.c_str());
  if (!ok || !bench) return ok ? 0 : 1;

  // Bench: baseline, the parts alone, fused; all in this run.
  const double t_base = time_per_call_ms(world, "ag_gemm(unfused)", warmup, iters, [&] { op.run_unfused(buf.a, buf.b, buf.c_ref); });
  const double t_comm = time_per_call_ms(world, "ag_gemm(comm)", warmup, iters, [&] { op.run_comm_only(buf.a); });
  const double t_gemm = time_per_call_ms(world, "ag_gemm(gemm)", warmup, iters, [&] { op.run_gemm_only(buf.b, buf.c); });
  const double t_fused = time_per_call_ms(world, "ag_gemm", warmup, iters, [&] { op.run(buf.a, buf.b, buf.c); });
  print_bench_row("ag_gemm", W, p, t_base, t_comm, t_gemm, t_fused, choice.path);
  for (int r : world.local_ranks()) {
    world.bind(r);
    cudaFree(const_cast<void*>(buf.a[r]));
    cudaFree(const_cast<void*>(buf.b[r]));
    cudaFree(buf.c[r]);
    cudaFree(buf.c_ref[r]);
  }
  return 0;
}


int run_gemm_rs_cuda(const OpProblem& p, const std::string& transport_name, bool bench, int warmup,
                     int iters) {
  TL_REQUIRE(p.dtype == DType::kBF16, "gemm_rs on the CUDA backend takes --dtype bf16");
  TL_REQUIRE(p.mode == CommMode::kPull, "gemm_rs on the CUDA backend takes --variant pull");
  tlc::WorldOptions wo;
  wo.transport = pick_transport(transport_name, p.world);
  wo.world_size = p.world;
  wo.timeout = std::chrono::milliseconds(p.timeout_ms);
  tlc::World world(wo);
  const int W = world.size();
  GemmRsConfig cfg;
  cfg.comm_workers = p.comm_sms ? p.comm_sms : 8;  // the reduce runs on SMs
  cfg.compute_workers = 0;
  cfg.comm_tile_rows = p.comm_tile;
  tlc::GemmRs op(world, p.rows, p.n, p.split, DType::kBF16, cfg);
  const int64_t M = p.m, N = p.n;

  std::mt19937_64 rng(p.seed);
  Buffers buf;
  buf.a.assign(W, nullptr);
  buf.b.assign(W, nullptr);
  buf.c.assign(W, nullptr);
  buf.c_ref.assign(W, nullptr);
  std::vector<std::vector<std::byte>> ha(W), hb(W);
  for (int r = 0; r < W; ++r) {
    ha[r] = random_matrix(M, p.split[r], DType::kBF16, rng);
    hb[r] = random_matrix(N, p.split[r], DType::kBF16, rng);
    if (!world.is_local(r)) continue;
    world.bind(r);
    void *pa = nullptr, *pb = nullptr;
    TL_CUDA_CHECK(cudaMalloc(&pa, ha[r].size()));
    TL_CUDA_CHECK(cudaMemcpy(pa, ha[r].data(), ha[r].size(), cudaMemcpyHostToDevice));
    TL_CUDA_CHECK(cudaMalloc(&pb, hb[r].size()));
    TL_CUDA_CHECK(cudaMemcpy(pb, hb[r].data(), hb[r].size(), cudaMemcpyHostToDevice));
    const int64_t bytes = p.rows.size(r) * N * 2 + 16;
    TL_CUDA_CHECK(cudaMalloc(&buf.c[r], bytes));
    TL_CUDA_CHECK(cudaMalloc(&buf.c_ref[r], bytes));
    TL_CUDA_CHECK(cudaMemset(buf.c[r], 0xff, bytes));  // poison
    TL_CUDA_CHECK(cudaMemset(buf.c_ref[r], 0xff, bytes));
    buf.a[r] = pa;
    buf.b[r] = pb;
  }
  for (int r : world.local_ranks()) { world.bind(r); TL_CUDA_CHECK(cudaDeviceSynchronize()); }

  op.run(buf.a, buf.b, buf.c);
  world.sync("gemm_rs");
  op.run_unfused(buf.a, buf.b, buf.c_ref);
  world.sync("gemm_rs(unfused)");
  double err_base = 0, err_ref = -1;
  const bool with_ref = static_cast<double>(M) * N * p.k <= 2e10;
  std::vector<double> full;
  if (with_ref) {  // C = [A_0 .. A_W-1] [B_0 .. B_W-1]^T over the whole K
    std::vector<std::byte> a_cat(M * p.k * 2), b_cat(N * p.k * 2);
    int64_t k0 = 0;
    for (int r = 0; r < W; ++r) {
      const int64_t kr = p.split[r];
      for (int64_t i = 0; i < M; ++i) std::memcpy(&a_cat[(i * p.k + k0) * 2], &ha[r][i * kr * 2], kr * 2);
      for (int64_t i = 0; i < N; ++i) std::memcpy(&b_cat[(i * p.k + k0) * 2], &hb[r][i * kr * 2], kr * 2);
      k0 += kr;
    }
    full = gemm_reference_f64(a_cat.data(), b_cat.data(), DType::kBF16, M, N, p.k);
  }
  for (int r : world.local_ranks()) {
    const int64_t mr = p.rows.size(r);
    if (mr == 0) continue;
    std::vector<std::byte> c(mr * N * 2), c_ref(c.size());
    world.bind(r);
    TL_CUDA_CHECK(cudaMemcpy(c.data(), buf.c[r], c.size(), cudaMemcpyDeviceToHost));
    TL_CUDA_CHECK(cudaMemcpy(c_ref.data(), buf.c_ref[r], c.size(), cudaMemcpyDeviceToHost));
    std::vector<double> base(c.size() / 2);
    for (size_t i = 0; i < base.size(); ++i) base[i] = load_as_float(c_ref.data(), DType::kBF16, i);
    err_base = std::max(err_base, relative_error(c.data(), DType::kBF16, base));
    if (with_ref) {
      std::vector<double> ref(full.begin() + p.rows.begin(r) * N, full.begin() + p.rows.end(r) * N);
      err_ref = std::max(err_ref, relative_error(c.data(), DType::kBF16, ref));
    }
  }
  const int r0 = world.local_ranks()[0];
  std::printf("%s\n  transport=%s, SMs per rank=%d: GEMM on %d, reduce on %d\n", describe(p).c_str(),
              tlc::transport_name(world.transport()), world.sm_count(r0), op.gemm_sms(r0), cfg.comm_workers);
  if (with_ref) std::printf("  fused rel. error vs float64 (max over ranks) %.3e\n", err_ref);
  std::printf("  fused rel. difference vs cuBLAS+reduce baseline %.3e\n", err_base);
  const bool ok = err_base <= p.tolerance && (!with_ref || err_ref <= p.tolerance);
  std::printf("%s (tolerance %.1e)\n", ok ? "check passed" : "CHECK FAILED", p.tolerance);
  const PathChoice choice = op.choose(p.path);
  std::printf("  path (--path %s): %s, %s\n", op_path_name(p.path), op_path_name(choice.path),
              choice.why.c_str());
  if (!ok || !bench) return ok ? 0 : 1;

  const double t_base = time_per_call_ms(world, "gemm_rs(unfused)", warmup, iters, [&] { op.run_unfused(buf.a, buf.b, buf.c_ref); });
  const double t_gemm = time_per_call_ms(world, "gemm_rs(gemm)", warmup, iters, [&] { op.run_gemm_only(buf.a, buf.b); });
  const double t_comm = time_per_call_ms(world, "gemm_rs(reduce)", warmup, iters, [&] { op.run_reduce_only(buf.c); });
  const double t_fused = time_per_call_ms(world, "gemm_rs", warmup, iters, [&] { op.run(buf.a, buf.b, buf.c); });
  print_bench_row("gemm_rs", W, p, t_base, t_comm, t_gemm, t_fused, choice.path);
  for (int r : world.local_ranks()) {
    world.bind(r);
    cudaFree(const_cast<void*>(buf.a[r]));
    cudaFree(const_cast<void*>(buf.b[r]));
    cudaFree(buf.c[r]);
    cudaFree(buf.c_ref[r]);
  }
  return 0;
}

namespace {

int bench_ag_gemm(Args& args) {
  OpProblem p = parse_problem(args, "ag_gemm");
  std::string transport = args.get("--transport", "auto");
  int warmup = static_cast<int>(args.get_int("--warmup", 3));
  int iters = static_cast<int>(args.get_int("--bench-iters", 10));
  args.finish();
  TL_REQUIRE(p.backend != "cpu", "bench ag_gemm measures the CUDA backend; use `run` for the CPU");
  return run_ag_gemm_cuda(p, transport, true, warmup, iters);
}

int bench_gemm_rs(Args& args) {
  OpProblem p = parse_problem(args, "gemm_rs");
  std::string transport = args.get("--transport", "auto");
  int warmup = static_cast<int>(args.get_int("--warmup", 3));
  int iters = static_cast<int>(args.get_int("--bench-iters", 10));
  args.finish();
  TL_REQUIRE(p.backend != "cpu", "bench gemm_rs measures the CUDA backend; use `run` for the CPU");
  return run_gemm_rs_cuda(p, transport, true, warmup, iters);
}

}  // namespace

TILELINK_REGISTER_COMMAND("bench gemm_rs",
                          "[run's options] [--comm-sms K (reduce SMs, default 8)] [--transport auto|virtual|peer|ipc] [--warmup W] [--bench-iters I]",
                          "fused GEMM+RS on the GPU: baseline, parts, ideal, fused, speedup", &bench_gemm_rs);
TILELINK_REGISTER_COMMAND("bench ag_gemm",
                          "[run's options] [--comm-sms K] [--transport auto|virtual|peer|ipc] [--warmup W] [--bench-iters I]",
                          "fused AG+GEMM on the GPU: baseline, parts, ideal, fused, speedup", &bench_ag_gemm);

}  // namespace tilelink::cli
