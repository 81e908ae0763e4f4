// `tilelink run ag_gemm|gemm_rs --backend cuda` and `tilelink bench ag_gemm|gemm_rs`: the fused op on
// the CUDA backend, checked, and timed against the unfused baseline and the ideal bound in the same
// run. One world serves every shape of `--shapes`.
//
// Baselines (ops/baseline_cuda.hpp): cuBLAS+NCCL on the peer and ipc transports, cuBLAS + the op's
// own collective on the virtual one (copy-engine AllGather; SM reduce for the ReduceScatter).
// ipc (mpirun, one process per rank): every rank checks its own output; errors, checks and times
// are combined over ranks (max) through MPI, and rank 0 alone prints.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>

#if defined(TILELINK_HAS_MPI)
#include <mpi.h>
#endif

#include "cli.hpp"
#include "problem.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/ag_gemm_cuda.hpp"
#include "tilelink/ops/baseline_cuda.hpp"
#include "tilelink/ops/gemm_rs_cuda.hpp"

namespace tilelink::cli {

int cuda_device_count();

namespace {

namespace tlc = tilelink::cuda;

struct Buffers {
  std::vector<const void*> a, b;
  std::vector<void*> c, c_ref;
};

// Device allocations of the local ranks, freed (each in its rank's context) when it goes.
class RankAllocs {
 public:
  explicit RankAllocs(tlc::World& world) : world_(world) {}
  ~RankAllocs() {
    for (auto& [r, p] : allocs_) {
      world_.bind(r);
      cudaFree(p);  // NOTE: unchecked: a destructor must not throw
    }
  }
  RankAllocs(const RankAllocs&) = delete;
  RankAllocs& operator=(const RankAllocs&) = delete;

  void* alloc(int r, size_t bytes) {
    void* p = nullptr;
    world_.bind(r);
    TL_CUDA_CHECK(cudaMalloc(&p, bytes));
    allocs_.emplace_back(r, p);
    return p;
  }
  void* upload(int r, const std::vector<std::byte>& host) {
    if (host.empty()) return nullptr;
    void* p = alloc(r, host.size());
    TL_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice));
    return p;
  }
  void* poisoned(int r, size_t bytes) {
    void* p = alloc(r, bytes);
    TL_CUDA_CHECK(cudaMemset(p, 0xff, bytes));  // NaN in bf16
    return p;
  }

 private:
  tlc::World& world_;
  std::vector<std::pair<int, void*>> allocs_;
};

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

tlc::Transport pick_transport(const std::string& name, int world) {
  if (name == "auto") {
    if (launched_by_mpi()) return tlc::Transport::kIpc;
    return cuda_device_count() >= world ? tlc::Transport::kPeer : tlc::Transport::kVirtual;
  }
  tlc::Transport t;
  TL_REQUIRE(tlc::parse_transport(name, &t), "--transport must be auto, virtual, peer or ipc, got '" << name << "'");
  return t;
}

// The rank that prints: rank 0's process (every process holds rank 0 except under ipc).
bool printer(const tlc::World& world) { return world.local_ranks().front() == 0; }

// The max of x over every rank's process (ipc); x itself where one process drives all ranks.
double max_over_ranks(const tlc::World& world, double x) {
#if defined(TILELINK_HAS_MPI)
  if (world.transport() == tlc::Transport::kIpc) {
    double all = x;
    TL_REQUIRE(MPI_Allreduce(&x, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) == MPI_SUCCESS,
               "MPI_Allreduce failed");
    return all;
  }
#endif
  (void)world;
  return x;
}
bool all_ranks(const tlc::World& world, bool ok) { return max_over_ranks(world, ok ? 0.0 : 1.0) == 0.0; }

// TILELINK_CLI_TRACE=1: each step of a shape (and each timed part of a bench) on stderr, flushed,
// with the wall clock (Unix seconds, to line up with e.g. nvidia-smi's samples): where a hang sits.
void trace(const tlc::World& world, const char* step) {
  static const bool on = std::getenv("TILELINK_CLI_TRACE") != nullptr;
  if (!on) return;
  std::fprintf(stderr, "[trace rank %d %.3f] %s\n", world.local_ranks().front(), unix_seconds(),
               step);
  std::fflush(stderr);
}

// Rank r's inputs come from their own generator, so a process makes only its own ranks' inputs
// (all of them where the float64 reference needs them) and every transport sees the same data.
std::mt19937_64 rank_rng(uint64_t seed, int r) { return std::mt19937_64(seed * 1000003u + 7919u * (r + 1)); }

// Host wall time per call of `enqueue` over `iters` calls, after `warmup` calls: median of 5
// batches; the max over ranks' processes (ipc).
// World 1: the fused call against the bare engine, interleaved so that clock drift between two
// timing loops does not show as overhead: rounds of one batch of each (the order alternating), the
// median over rounds of fused / engine, and the min..max of the per-round ratios.
template <class Engine, class Fused>
void print_world1_overhead(tlc::World& world, const char* op, int iters, Engine&& engine, Fused&& fused) {
  if (world.size() != 1) return;
  auto batch = [&](auto& fn) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    world.sync(op);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
  };
  std::vector<double> ratios;
  for (int round = 0; round < 10; ++round) {
    double te, tf;
    if (round % 2 == 0) { te = batch(engine); tf = batch(fused); }
    else { tf = batch(fused); te = batch(engine); }
    ratios.push_back(tf / te);
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  std::printf("  world-1 overhead, interleaved: fused / bare engine = %.4f (median of %zu rounds of %d calls "
              "each; rounds %.4f..%.4f)\n", median(ratios), ratios.size(), iters, *lo, *hi);
}

template <class Fn>
double time_per_call_ms(tlc::World& world, const char* op, int warmup, int iters, Fn&& enqueue) {
  trace(world, (std::string("timing ") + op).c_str());
  for (int i = 0; i < warmup; ++i) enqueue();
  world.sync(op);
  std::vector<double> batches;
  for (int b = 0; b < 5; ++b) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) enqueue();
    world.sync(op);
    batches.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  trace(world, (std::string("timed ") + op).c_str());
  return max_over_ranks(world, median(batches));
}

struct BenchRow {
  const char* op;
  std::string transport, baseline;
  int world;
  OpProblem p;
  double t_base, t_comm, t_gemm, t_fused;
  OpPath chosen;
  double t_together = NAN;  // the parts side by side, unlinked (AG+GEMM only; NAN: not measured)
};

void print_table(const std::vector<BenchRow>& rows) {
  // "together": both parts launched as the fused call launches them, the GEMM not waiting for the
  // comm: what their contention alone costs (fused minus together is what the waits cost).
  std::printf(
      "\n| op | transport | world | M | N | K | baseline | baseline ms | T_comm ms | T_gemm ms | "
      "ideal ms | together ms | fused ms | speedup | overlap eff. | fused TFLOP/s | auto path | "
      "auto ms |\n");
  std::printf(
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | "
      "--- | --- | --- |\n");
  for (const BenchRow& r : rows) {
    if (std::isnan(r.t_fused)) {  // --baseline-only
      std::printf(
          "| %s | %s | %d | %lld | %lld | %lld | %s | %.3f | - | - | - | - | - | - | - | - | - | - "
          "|\n",
          r.op, r.transport.c_str(), r.world, static_cast<long long>(r.p.m),
          static_cast<long long>(r.p.n), static_cast<long long>(r.p.k), r.baseline.c_str(),
          r.t_base);
      continue;
    }
    const double ideal = std::max(r.t_gemm, r.t_comm);
    const double flops = 2.0 * r.p.m * r.p.n * r.p.k;
    const double t_auto = r.chosen == OpPath::kFused ? r.t_fused : r.t_base;
    // Overlap efficiency = (baseline - fused) / (baseline - ideal); "-" where the baseline is within
    // 2% of the ideal (or below it): nothing to hide, and the ratio is noise.
    char eff[32] = "-";
    if (r.t_base - ideal > 0.02 * r.t_base)
      std::snprintf(eff, sizeof(eff), "%.0f%%", 100.0 * (r.t_base - r.t_fused) / (r.t_base - ideal));
    char together[32] = "-";
    if (!std::isnan(r.t_together)) std::snprintf(together, sizeof(together), "%.3f", r.t_together);
    std::printf(
        "| %s | %s | %d | %lld | %lld | %lld | %s | %.3f | %.3f | %.3f | %.3f | %s | %.3f | %.2fx "
        "| %s | %.0f | %s | %.3f |\n",
        r.op, r.transport.c_str(), r.world, static_cast<long long>(r.p.m),
        static_cast<long long>(r.p.n), static_cast<long long>(r.p.k), r.baseline.c_str(), r.t_base,
        r.t_comm, r.t_gemm, ideal, together, r.t_fused, r.t_base / r.t_fused, eff,
        flops / (r.t_fused * 1e9), op_path_name(r.chosen), t_auto);
  }
  std::fflush(stdout);
}

// The check's verdict on one shape, combined over ranks; printed by rank 0.
bool report_check(const tlc::World& world, const OpProblem& p, const std::string& baseline, bool with_ref,
                  double err_base, double err_ref, double err_base_ref) {
  err_base = max_over_ranks(world, err_base);
  err_ref = max_over_ranks(world, err_ref);
  err_base_ref = max_over_ranks(world, err_base_ref);
  if (p.baseline_only) {
    const bool ok = !with_ref || err_base_ref <= p.tolerance;
    if (printer(world)) {
      if (with_ref)
        std::printf("  %s baseline rel. error vs float64 (max over ranks) %.3e\n", baseline.c_str(), err_base_ref);
      else
        std::printf("  --baseline-only: NOT CHECKED (no float64 reference at M*N*K = %.2e > 2e10; the fused op did not run)\n",
                    static_cast<double>(p.m) * p.n * p.k);
      std::printf("%s (tolerance %.1e, baseline only)\n", ok ? "check passed" : "CHECK FAILED", p.tolerance);
      std::fflush(stdout);
    }
    return all_ranks(world, ok);
  }
  const bool ok = err_base <= p.tolerance && (!with_ref || (err_ref <= p.tolerance && err_base_ref <= p.tolerance));
  if (printer(world)) {
    if (with_ref) {
      std::printf("  fused rel. error vs float64 (max over ranks) %.3e\n", err_ref);
      std::printf("  %s baseline rel. error vs float64 (max over ranks) %.3e\n", baseline.c_str(), err_base_ref);
    } else {
      std::printf("  float64 reference skipped (M*N*K = %.2e > 2e10): fused checked against the baseline only\n",
                  static_cast<double>(p.m) * p.n * p.k);
    }
    std::printf("  fused rel. difference vs %s baseline (max over ranks) %.3e\n", baseline.c_str(), err_base);
    std::printf("%s (tolerance %.1e)\n", ok ? "check passed" : "CHECK FAILED", p.tolerance);
    std::fflush(stdout);
  }
  return all_ranks(world, ok);
}

// A timed piece of a call (bench): its label on the bench line, and its enqueue.
struct TimedPart {
  const char* label;
  std::function<void()> enqueue;
};

// The rest of one shape, the same for both ops: the check's verdict, the path choice, and (bench)
// one row: the baseline, the two parts alone in the order given (`comm` is the index of the
// communication part; the other is the GEMM alone, also the world-1 overhead's bare engine), the
// fused op, and (where given, world > 1) `together`: the fused call with its GEMM not waiting.
// False when the check fails.
template <class Op>
bool finish_shape(tlc::World& world, const char* name, const OpProblem& p, Op& op,
                  const std::string& baseline, bool ok, bool bench, int warmup, int iters,
                  std::vector<BenchRow>* rows, const std::function<void()>& unfused,
                  const TimedPart (&parts)[2], int comm, const std::function<void()>& fused,
                  const std::function<void()>& together = {}) {
  const PathChoice choice = op.choose(p.path);
  if (printer(world)) {
    std::printf("  path (--path %s): %s, %s\n", op_path_name(p.path), op_path_name(choice.path), choice.why.c_str());
    std::fflush(stdout);
  }
  if (!ok || !bench) return ok;

  // Bench: baseline, the parts alone, fused; all in this run.
  const std::string n(name);
  const double t_base = time_per_call_ms(world, (n + "(unfused)").c_str(), warmup, iters, unfused);
  if (p.baseline_only) {
    if (printer(world)) std::printf("  bench: baseline %.3f ms (baseline only)\n", t_base), std::fflush(stdout);
    rows->push_back({name, tlc::transport_name(world.transport()), baseline, world.size(), p, t_base, NAN, NAN, NAN,
                     choice.path});
    return true;
  }
  double t_part[2];
  for (int i = 0; i < 2; ++i)
    t_part[i] = time_per_call_ms(world, (n + "(" + parts[i].label + ")").c_str(), warmup, iters, parts[i].enqueue);
  const double t_fused = time_per_call_ms(world, name, warmup, iters, fused);
  const double t_together =
      together && world.size() > 1
          ? time_per_call_ms(world, (n + "(together)").c_str(), warmup, iters, together)
          : NAN;
  print_world1_overhead(world, name, iters, parts[1 - comm].enqueue, fused);
  if (printer(world)) {
    std::printf("  bench: baseline %.3f ms, %s %.3f ms, %s %.3f ms, fused %.3f ms", t_base,
                parts[0].label, t_part[0], parts[1].label, t_part[1], t_fused);
    if (!std::isnan(t_together)) std::printf(", together (unlinked) %.3f ms", t_together);
    std::printf("\n");
    std::fflush(stdout);
  }
  rows->push_back({name, tlc::transport_name(world.transport()), baseline, world.size(), p, t_base,
                   t_part[comm], t_part[1 - comm], t_fused, choice.path, t_together});
  return true;
}

// One AG+GEMM shape on `world`: check, then (bench) time. False when the check fails.
bool ag_gemm_shape(tlc::World& world, const OpProblem& p, const std::string& baseline, bool bench, int warmup,
                   int iters, std::vector<BenchRow>* rows) {
  const int W = world.size();
  AgGemmConfig cfg;
  cfg.mode = p.mode;
  // --variant auto: push on separate GPUs (peer, ipc) with the copy engine (the GEMM then reads the
  // rank's own rows from A_r and starts at once: 1.02-1.09x vs pull's 0.95-1.04x on peer,
  // bench/notes/fused_ops_cuda.md), pull elsewhere.
  if (p.mode_auto && world.transport() != tlc::Transport::kVirtual && p.comm_sms == 0)
    cfg.mode = CommMode::kPush;
  cfg.comm_workers = p.comm_sms;  // 0: the copy engine
  cfg.compute_workers = 0;  // the GEMM takes the rank's SMs less the copy engine's spare ones
  // Without --comm-tile: about 4 tiles a segment, multiples of 128 rows. Each copy-engine tile costs
  // ~25 us of stream waits and launches (bench/notes/fused_ops_cuda.md): 64-row tiles made the comm
  // program 7x slower than 1024-row ones at 8192x11008x4096 on two H200s.
  cfg.comm_tile_rows = p.comm_tile_auto
                           ? static_cast<int>(std::clamp<int64_t>(round_up(ceil_div(p.rows.max_size(), 4), 128), 128, 4096))
                           : p.comm_tile;
  tlc::AgGemm op(world, p.rows, p.split, p.k, DType::kBF16, cfg);
  trace(world, "op made");
  const int64_t M = p.m;
  const bool with_ref = static_cast<double>(M) * p.n * p.k <= 2e10;

  // Inputs: fresh random bf16 per rank (generated on the host, so a reference can be computed).
  std::vector<std::vector<std::byte>> ha(W), hb(W);
  for (int r = 0; r < W; ++r) {
    if (!with_ref && !world.is_local(r)) continue;
    std::mt19937_64 rng = rank_rng(p.seed, r);
    ha[r] = random_matrix(p.rows.size(r), p.k, DType::kBF16, rng);
    hb[r] = random_matrix(p.split[r], p.k, DType::kBF16, rng);
  }
  RankAllocs mem(world);
  Buffers buf;
  buf.a.assign(W, nullptr);
  buf.b.assign(W, nullptr);
  buf.c.assign(W, nullptr);
  buf.c_ref.assign(W, nullptr);
  for (int r : world.local_ranks()) {
    buf.a[r] = mem.upload(r, ha[r]);
    buf.b[r] = mem.upload(r, hb[r]);
    buf.c[r] = mem.poisoned(r, M * p.split[r] * 2);
    buf.c_ref[r] = mem.poisoned(r, M * p.split[r] * 2);
  }
  for (int r : world.local_ranks()) { world.bind(r); TL_CUDA_CHECK(cudaDeviceSynchronize()); }

  // Check: fused vs the baseline always; both vs float64 where the reference is cheap enough.
  trace(world, "inputs ready");
  if (!p.baseline_only) {
    op.run(buf.a, buf.b, buf.c);
    world.sync("ag_gemm");
    trace(world, "fused call done");
  }
  op.run_unfused(buf.a, buf.b, buf.c_ref);
  world.sync("ag_gemm(unfused)");
  trace(world, "unfused call done");
  std::vector<std::byte> a_full;
  if (with_ref)
    for (int r = 0; r < W; ++r) a_full.insert(a_full.end(), ha[r].begin(), ha[r].end());
  double err_base = 0, err_ref = 0, err_base_ref = 0;
  for (int r : world.local_ranks()) {
    std::vector<std::byte> c(M * p.split[r] * 2), c_ref(c.size());
    world.bind(r);
    TL_CUDA_CHECK(cudaMemcpy(c.data(), buf.c[r], c.size(), cudaMemcpyDeviceToHost));
    TL_CUDA_CHECK(cudaMemcpy(c_ref.data(), buf.c_ref[r], c.size(), cudaMemcpyDeviceToHost));
    if (!p.baseline_only) {
      std::vector<double> base(c.size() / 2);
      for (size_t i = 0; i < base.size(); ++i) base[i] = load_as_float(c_ref.data(), DType::kBF16, i);
      err_base = std::max(err_base, relative_error(c.data(), DType::kBF16, base));
    }
    if (with_ref) {
      auto ref = gemm_reference_f64(a_full.data(), hb[r].data(), DType::kBF16, M, p.split[r], p.k);
      if (!p.baseline_only) err_ref = std::max(err_ref, relative_error(c.data(), DType::kBF16, ref));
      err_base_ref = std::max(err_base_ref, relative_error(c_ref.data(), DType::kBF16, ref));
    }
  }
  const int r0 = world.local_ranks()[0];
  if (printer(world)) {
    std::printf("%s\n  transport=%s, SMs per rank=%d: GEMM on %d, comm %s, comm tiles of %d rows%s; baseline %s\n",
                describe(p).c_str(), tlc::transport_name(world.transport()), world.sm_count(r0), op.gemm_sms(r0),
                p.comm_sms ? ("on " + std::to_string(p.comm_sms) + " SMs (bulk copies)").c_str()
                           : "on the copy engine",
                cfg.comm_tile_rows, p.comm_tile_auto ? " (auto)" : "", baseline.c_str());
  }
  const bool ok = report_check(world, p, baseline, with_ref, err_base, err_ref, err_base_ref);
  return finish_shape(
      world, "ag_gemm", p, op, baseline, ok, bench, warmup, iters, rows,
      [&] { op.run_unfused(buf.a, buf.b, buf.c_ref); },
      {{"comm", [&] { op.run_comm_only(buf.a); }},
       {"gemm", [&] { op.run_gemm_only(buf.a, buf.b, buf.c); }}},
      0, [&] { op.run(buf.a, buf.b, buf.c); }, [&] { op.run_unlinked(buf.a, buf.b, buf.c); });
}

// One GEMM+RS shape on `world`: check, then (bench) time. False when the check fails.
bool gemm_rs_shape(tlc::World& world, const OpProblem& p, const std::string& baseline, bool bench, int warmup,
                   int iters, std::vector<BenchRow>* rows) {
  const int W = world.size();
  GemmRsConfig cfg;
  cfg.mode = p.mode;  // pull: the owners read peers' partials; push: the producers write them
  // The reduce (and push: the pushers) run on SMs: --comm-sms, or 0 = the op's choice (pull: the
  // cost model's, per shape; push: a quarter of the SMs, 2..16).
  cfg.comm_workers = p.comm_sms;
  cfg.compute_workers = 0;
  cfg.comm_tile_rows = p.comm_tile_auto ? 128 : p.comm_tile;  // the reduce tiles' rows
  tlc::GemmRs op(world, p.rows, p.n, p.split, DType::kBF16, cfg);
  trace(world, "op made");
  const int64_t M = p.m, N = p.n;
  const bool with_ref = static_cast<double>(M) * N * p.k <= 2e10;

  std::vector<std::vector<std::byte>> ha(W), hb(W);
  for (int r = 0; r < W; ++r) {
    if (!with_ref && !world.is_local(r)) continue;
    std::mt19937_64 rng = rank_rng(p.seed, r);
    ha[r] = random_matrix(M, p.split[r], DType::kBF16, rng);
    hb[r] = random_matrix(N, p.split[r], DType::kBF16, rng);
  }
  RankAllocs mem(world);
  Buffers buf;
  buf.a.assign(W, nullptr);
  buf.b.assign(W, nullptr);
  buf.c.assign(W, nullptr);
  buf.c_ref.assign(W, nullptr);
  for (int r : world.local_ranks()) {
    buf.a[r] = mem.upload(r, ha[r]);
    buf.b[r] = mem.upload(r, hb[r]);
    const int64_t bytes = p.rows.size(r) * N * 2 + 16;
    buf.c[r] = mem.poisoned(r, bytes);
    buf.c_ref[r] = mem.poisoned(r, bytes);
  }
  for (int r : world.local_ranks()) { world.bind(r); TL_CUDA_CHECK(cudaDeviceSynchronize()); }

  trace(world, "inputs ready");
  if (!p.baseline_only) {
    op.run(buf.a, buf.b, buf.c);
    world.sync("gemm_rs");
    trace(world, "fused call done");
  }
  op.run_unfused(buf.a, buf.b, buf.c_ref);
  world.sync("gemm_rs(unfused)");
  trace(world, "unfused call done");
  double err_base = 0, err_ref = 0, err_base_ref = 0;
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
    if (!p.baseline_only) {
      std::vector<double> base(c.size() / 2);
      for (size_t i = 0; i < base.size(); ++i) base[i] = load_as_float(c_ref.data(), DType::kBF16, i);
      err_base = std::max(err_base, relative_error(c.data(), DType::kBF16, base));
    }
    if (with_ref) {
      std::vector<double> ref(full.begin() + p.rows.begin(r) * N, full.begin() + p.rows.end(r) * N);
      if (!p.baseline_only) err_ref = std::max(err_ref, relative_error(c.data(), DType::kBF16, ref));
      err_base_ref = std::max(err_base_ref, relative_error(c_ref.data(), DType::kBF16, ref));
    }
  }
  const int r0 = world.local_ranks()[0];
  if (printer(world)) {
    std::printf(
        "%s\n  transport=%s, SMs per rank=%d: GEMM on %d, %s on %d, reduce tiles of %d rows; "
        "baseline %s\n",
        describe(p).c_str(), tlc::transport_name(world.transport()), world.sm_count(r0),
        op.gemm_sms(r0), cfg.mode == CommMode::kPush ? "push+reduce" : "reduce",
        op.plan(r0).config.comm_workers, cfg.comm_tile_rows, baseline.c_str());
  }
  const bool ok = report_check(world, p, baseline, with_ref, err_base, err_ref, err_base_ref);
  // NOTE: the GEMM part first: the reduce alone needs the tile_done signals it sets.
  return finish_shape(world, "gemm_rs", p, op, baseline, ok, bench, warmup, iters, rows,
                      [&] { op.run_unfused(buf.a, buf.b, buf.c_ref); },
                      {{"gemm", [&] { op.run_gemm_only(buf.a, buf.b); }}, {"reduce", [&] { op.run_reduce_only(buf.c); }}},
                      1, [&] { op.run(buf.a, buf.b, buf.c); });
}

using ShapeFn = bool (*)(tlc::World&, const OpProblem&, const std::string&, bool, int, int, std::vector<BenchRow>*);

int run_shapes(const std::vector<OpProblem>& ps, const std::string& transport_name, bool bench, int warmup,
               int iters, ShapeFn shape, const char* own_baseline) {
  TL_REQUIRE(!ps.empty(), "no shape to run");
  const OpProblem& p0 = ps.front();
  TL_REQUIRE(p0.dtype == DType::kBF16, p0.op << " on the CUDA backend takes --dtype bf16");
  TL_REQUIRE(!bench || (warmup >= 0 && iters >= 1), "--warmup must be >= 0 and --bench-iters >= 1");
  tlc::WorldOptions wo;
  wo.transport = pick_transport(transport_name, p0.world);
  wo.world_size = p0.world;
  wo.timeout = std::chrono::milliseconds(p0.timeout_ms);
  tlc::World world(wo);
  TL_REQUIRE(world.size() == p0.world, "--world is " << p0.world << " but the " << tlc::transport_name(world.transport())
                                                     << " world has " << world.size()
                                                     << " ranks (under mpirun: -np must equal --world)");
  // NOTE: collective under ipc, like everything below: every rank runs the same shapes in order.
  const std::string baseline =
      tlc::baseline_comm(world) == tlc::BaselineComm::kNccl ? "cuBLAS+NCCL" : own_baseline;
  std::vector<BenchRow> rows;
  int failed = 0;
  for (const OpProblem& p : ps) {
    try {
      if (!shape(world, p, baseline, bench, warmup, iters, &rows)) ++failed;
    } catch (const std::exception& e) {
      // NOTE: device work may be left that never finishes (a stream wait on a signal that will not
      // come; after a timeout the world is unusable), and tearing down would block on it (cudaFree
      // synchronises): say what failed, with the tables so far, and leave without teardown.
      std::fprintf(stderr, "tilelink %s (rank %d): error: %s\n  exiting without teardown (device work may be stuck)\n",
                   p.op.c_str(), world.local_ranks().front(), e.what());
      if (printer(world) && bench && !rows.empty()) print_table(rows);
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(2);
    }
  }
  if (printer(world)) {
    if (bench && !rows.empty()) print_table(rows);
    if (ps.size() > 1)
      std::printf("%d of %zu shapes %s\n", static_cast<int>(ps.size()) - failed, ps.size(),
                  failed ? "passed; SOME CHECKS FAILED" : "passed");
    std::fflush(stdout);
  }
  return failed ? 1 : 0;
}

}  // namespace

int run_ag_gemm_cuda(const std::vector<OpProblem>& ps, const std::string& transport_name, bool bench, int warmup,
                     int iters) {
  return run_shapes(ps, transport_name, bench, warmup, iters, &ag_gemm_shape, "cuBLAS+copy engine");
}

int run_gemm_rs_cuda(const std::vector<OpProblem>& ps, const std::string& transport_name, bool bench, int warmup,
                     int iters) {
  return run_shapes(ps, transport_name, bench, warmup, iters, &gemm_rs_shape, "cuBLAS+SM reduce");
}

namespace {

int bench_op(Args& args, const char* op) {
  OpProblem p = parse_problem(args, op);
  std::string transport = args.get("--transport", "auto");
  std::string shapes = args.get("--shapes", "");
  int warmup = static_cast<int>(args.get_int("--warmup", 3));
  int iters = static_cast<int>(args.get_int("--bench-iters", 10));
  args.finish();
  TL_REQUIRE(p.backend != "cpu", "bench " << op << " measures the CUDA backend; use `run` for the CPU");
  p.backend = "cuda";
  if (!shapes.empty()) {
    const RowPartition even = RowPartition::even(p.m, p.world);
    for (int r = 0; r < p.world; ++r)
      TL_REQUIRE(even.size(r) == p.rows.size(r), "--m-split does not combine with --shapes (each shape splits M evenly)");
  }
  const std::vector<OpProblem> ps = expand_shapes(p, shapes);
  return std::string(op) == "ag_gemm" ? run_ag_gemm_cuda(ps, transport, true, warmup, iters)
                                      : run_gemm_rs_cuda(ps, transport, true, warmup, iters);
}

int bench_ag_gemm(Args& args) { return bench_op(args, "ag_gemm"); }
int bench_gemm_rs(Args& args) { return bench_op(args, "gemm_rs"); }

}  // namespace

TILELINK_REGISTER_COMMAND("bench gemm_rs",
                          "[run's options, --baseline-only: the baseline alone] [--shapes MxNxK,... (instead of -m -n -k; even M split)] [--comm-sms K (reduce SMs; default: pull, the cost model's per shape; push, min(16, SMs/4))] [--transport auto|virtual|peer|ipc] [--warmup W] [--bench-iters I]",
                          "fused GEMM+RS on the GPU: baseline (cuBLAS+NCCL on peer/ipc), parts, ideal, fused, speedup", &bench_gemm_rs,
                          {"--baseline-only"});
TILELINK_REGISTER_COMMAND("bench ag_gemm",
                          "[run's options, --baseline-only: the baseline alone] [--shapes MxNxK,... (instead of -m -n -k; even M split)] [--comm-sms K] [--transport auto|virtual|peer|ipc] [--warmup W] [--bench-iters I]",
                          "fused AG+GEMM on the GPU: baseline (cuBLAS+NCCL on peer/ipc), parts, ideal, fused, speedup", &bench_ag_gemm,
                          {"--baseline-only"});

}  // namespace tilelink::cli
