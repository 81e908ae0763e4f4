// `tilelink run <op> --backend cuda` and `tilelink bench <op>` for every registered op
// (op_registry.hpp): the fused op on the CUDA backend, checked, and timed against the unfused
// baseline and the ideal bound in the same run. One world serves every shape of `--shapes`. Nothing
// here is written per op: an op's OpSpec and CudaOpRun adapter (ops_cuda.cu) say everything.
//
// Baselines (ops/baseline_cuda.hpp): cuBLAS+NCCL on the peer and ipc transports, cuBLAS + the op's
// own collective on the virtual one (copy-engine AllGather; SM reduce for the ReduceScatter).
// ipc (mpirun, one process per rank): every rank checks its own output; errors, checks and times
// are combined over ranks (max) through the world's bootstrap, and rank 0 alone prints.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>


#include "cli.hpp"
#include "floor_probe.hpp"
#include "op_check.hpp"
#include "op_check_cuda.hpp"
#include "op_registry.hpp"
#include "problem.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/baseline_cuda.hpp"

namespace tilelink::cli {

int cuda_device_count();

namespace {

namespace tlc = tilelink::cuda;

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

// The max of x over every rank's process (ipc, through the world's bootstrap: bounded); x itself
// where one process drives all ranks.
double max_over_ranks(const tlc::World& world, double x) {
  if (world.transport() != tlc::Transport::kIpc) return x;
  std::vector<double> all(world.size());
  world.bootstrap().allgather(&x, all.data(), sizeof(double), world.options().timeout,
                              "the combination of the ranks' results");
  return *std::max_element(all.begin(), all.end());
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
  double t_comm_floor = NAN;  // the comm's floor (FloorProbe; NAN: none)
};

void print_table(const std::vector<BenchRow>& rows) {
  // "together": both parts launched as the fused call launches them, the GEMM not waiting for the
  // comm: what their contention alone costs (fused minus together is what the waits cost).
  bool floors = false;
  for (const BenchRow& r : rows) floors = floors || !std::isnan(r.t_comm_floor);
  // "comm floor": a signal round trip plus the peers' bytes read at the rate measured on every SM
  // of the rank (FloorProbe); "floor": max(T_gemm, comm floor), the least a fused call can take with
  // its GEMM as measured alone and its communication at the floor, hidden behind it.
  // of the rank (FloorProbe): no fused call can be faster.
  std::printf(
      "\n| op | transport | world | M | N | K | baseline | baseline ms | T_comm ms | T_gemm ms | "
      "ideal ms | together ms | fused ms | speedup | overlap eff. | fused TFLOP/s | auto path | "
      "auto ms |%s\n", floors ? " comm floor ms | floor ms | fused / floor |" : "");
  std::printf(
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | "
      "--- | --- | --- |%s\n", floors ? " --- | --- | --- |" : "");
  for (const BenchRow& r : rows) {
    if (std::isnan(r.t_fused)) {  // --baseline-only
      std::printf(
          "| %s | %s | %d | %lld | %lld | %lld | %s | %.3f | - | - | - | - | - | - | - | - | - | - "
          "|%s\n",
          r.op, r.transport.c_str(), r.world, static_cast<long long>(r.p.m),
          static_cast<long long>(r.p.n), static_cast<long long>(r.p.k), r.baseline.c_str(),
          r.t_base, floors ? " - | - | - |" : "");
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
        "| %s | %.0f | %s | %.3f |",
        r.op, r.transport.c_str(), r.world, static_cast<long long>(r.p.m),
        static_cast<long long>(r.p.n), static_cast<long long>(r.p.k), r.baseline.c_str(), r.t_base,
        r.t_comm, r.t_gemm, ideal, together, r.t_fused, r.t_base / r.t_fused, eff,
        flops / (r.t_fused * 1e9), op_path_name(r.chosen), t_auto);
    if (floors) {
      if (std::isnan(r.t_comm_floor)) {
        std::printf(" - | - | - |");
      } else {
        const double floor = std::max(r.t_gemm, r.t_comm_floor);
        std::printf(" %.4f | %.4f | %.2f |", r.t_comm_floor, floor, r.t_fused / floor);
      }
    }
    std::printf("\n");
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
        std::printf("  --baseline-only: NOT CHECKED (no float64 reference at M*N*K = %.2e > --ref-limit %.2e; the fused op did not run)\n",
                    static_cast<double>(p.m) * p.n * p.k, p.ref_limit);
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
      std::printf("  float64 reference skipped (M*N*K = %.2e > --ref-limit %.2e): fused checked against the baseline only\n",
                  static_cast<double>(p.m) * p.n * p.k, p.ref_limit);
    }
    std::printf("  fused rel. difference vs %s baseline (max over ranks) %.3e\n", baseline.c_str(), err_base);
    std::printf("%s (tolerance %.1e)\n", ok ? "check passed" : "CHECK FAILED", p.tolerance);
    std::fflush(stdout);
  }
  return all_ranks(world, ok);
}

// One shape of any op on `world`: check (fused vs the baseline always; both vs float64 where the
// reference is cheap enough), the path choice, then (bench) one row: the baseline, the two parts
// alone, the fused op, "together" where the op has it, and the floor where the op reads peers'
// bytes. False when the check fails.
bool op_shape(const OpSpec& spec, tlc::World& world, const OpProblem& p, const std::string& baseline, bool bench,
              int warmup, int iters, std::vector<BenchRow>* rows, FloorProbe* floor) {
  std::unique_ptr<CudaOpRun> op = spec.make_cuda(world, p);
  trace(world, "op made");
  const std::unique_ptr<CudaOperands> x = make_cuda_operands(spec, world, p);
  trace(world, "inputs ready");
  const CudaCheck err = check_cuda(spec, *op, world, p, *x);
  trace(world, "fused and unfused calls checked");
  const bool with_ref = x->with_ref;
  const double err_base = err.err_base, err_ref = err.err_ref, err_base_ref = err.err_base_ref;
  const int r0 = world.local_ranks()[0];
  if (printer(world)) {
    std::printf("%s\n  transport=%s, SMs per rank=%d: %s; baseline %s\n", describe(p).c_str(),
                tlc::transport_name(world.transport()), world.sm_count(r0), op->config(r0).c_str(), baseline.c_str());
    std::fflush(stdout);
  }
  const bool ok = report_check(world, p, baseline, with_ref, err_base, err_ref, err_base_ref);
  const PathChoice choice = op->choose(p.path);
  if (printer(world)) {
    std::printf("  path (--path %s): %s, %s\n", op_path_name(p.path), op_path_name(choice.path), choice.why.c_str());
    std::fflush(stdout);
  }
  if (!ok || !bench) return ok;

  // Bench: baseline, the parts alone, fused; all in this run.
  const std::string& n = p.op;
  auto unfused = [&] { op->run_unfused(x->a, x->b, x->c_ref); };
  auto fused = [&] { op->run(x->a, x->b, x->c); };
  const double t_base = time_per_call_ms(world, (n + "(unfused)").c_str(), warmup, iters, unfused);
  BenchRow row{spec.name.c_str(), tlc::transport_name(world.transport()), baseline, world.size(), p, t_base,
               NAN, NAN, NAN, choice.path};
  if (p.baseline_only) {
    if (printer(world)) std::printf("  bench: baseline %.3f ms (baseline only)\n", t_base), std::fflush(stdout);
    rows->push_back(row);
    return true;
  }
  const std::vector<TimedPart> parts = op->parts(x->a, x->b, x->c);
  const int comm = op->comm_part();
  double t_part[2];
  for (int i = 0; i < 2; ++i)
    t_part[i] = time_per_call_ms(world, (n + "(" + parts[i].label + ")").c_str(), warmup, iters, parts[i].enqueue);
  const double t_fused = time_per_call_ms(world, n.c_str(), warmup, iters, fused);
  const std::function<void()> together = op->together(x->a, x->b, x->c);
  const double t_together = together && world.size() > 1
                                ? time_per_call_ms(world, (n + "(together)").c_str(), warmup, iters, together)
                                : NAN;
  print_world1_overhead(world, n.c_str(), iters, parts[1 - comm].enqueue, fused);
  const double peer_bytes = op->peer_bytes(r0);
  if (floor && world.size() > 1 && !std::isnan(peer_bytes))
    row.t_comm_floor = floor->floor_ms(peer_bytes);
  if (printer(world)) {
    std::printf("  bench: baseline %.3f ms, %s %.3f ms, %s %.3f ms, fused %.3f ms", t_base, parts[0].label.c_str(),
                t_part[0], parts[1].label.c_str(), t_part[1], t_fused);
    if (!std::isnan(t_together)) std::printf(", together (unlinked) %.3f ms", t_together);
    if (!std::isnan(row.t_comm_floor)) std::printf(", comm floor %.4f ms", row.t_comm_floor);
    std::printf("\n");
    std::fflush(stdout);
  }
  row.t_comm = t_part[comm];
  row.t_gemm = t_part[1 - comm];
  row.t_fused = t_fused;
  row.t_together = t_together;
  rows->push_back(row);
  return true;
}

int run_shapes(const OpSpec& spec, const std::vector<OpProblem>& ps, const std::string& transport_name, bool bench,
               int warmup, int iters) {
  TL_REQUIRE(!ps.empty(), "no shape to run");
  TL_REQUIRE(spec.make_cuda, spec.name << " has no CUDA implementation in this build");
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
      tlc::baseline_comm(world) == tlc::BaselineComm::kNccl ? "cuBLAS+NCCL" : spec.own_baseline;
  std::unique_ptr<FloorProbe> floor;
  if (bench && world.size() > 1 && !p0.baseline_only) {
    floor = std::make_unique<FloorProbe>(world);
    if (printer(world)) {
      std::printf("floor probe (ranks 0 and 1): signal round trip %.2f us, peer reads %.1f GB/s an SM, %.1f GB/s on "
                  "the rank's %d SMs\n",
                  floor->round_trip_us(), floor->read_gbps_per_sm(), floor->read_gbps_all(), world.sm_count(0));
      std::fflush(stdout);
    }
  }
  std::vector<BenchRow> rows;
  int failed = 0;
  for (const OpProblem& p : ps) {
    try {
      if (!op_shape(spec, world, p, baseline, bench, warmup, iters, &rows, floor.get())) ++failed;
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

int run_op_cuda(const OpSpec& spec, const std::vector<OpProblem>& ps, const std::string& transport, bool bench,
                int warmup, int iters) {
  return run_shapes(spec, ps, transport, bench, warmup, iters);
}

int bench_op_command(Args& args, const OpSpec& spec) {
  OpProblem p = parse_problem(args, spec.name, spec.variants, spec.split_n);
  std::string transport = args.get("--transport", "auto");
  std::string shapes = args.get("--shapes", "");
  int warmup = static_cast<int>(args.get_int("--warmup", 3));
  int iters = static_cast<int>(args.get_int("--bench-iters", 10));
  args.finish();
  TL_REQUIRE(p.backend != "cpu", "bench " << spec.name << " measures the CUDA backend; use `run` for the CPU");
  TL_REQUIRE(!p.cpu_options_given,
             "--tile-m, --tile-n, --comm-workers and --compute-workers apply to the CPU backend only (the CUDA "
             "ops take the engine's tiles and choose their SMs; --comm-sms sets the comm SMs)");
  p.backend = "cuda";
  if (!shapes.empty()) {
    const RowPartition even = RowPartition::even(p.m, p.world);
    for (int r = 0; r < p.world; ++r)
      TL_REQUIRE(even.size(r) == p.rows.size(r), "--m-split does not combine with --shapes (each shape splits M evenly)");
  }
  return run_shapes(spec, expand_shapes(p, shapes), transport, true, warmup, iters);
}

}  // namespace tilelink::cli
