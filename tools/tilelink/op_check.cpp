// Any registered op on the CPU backend, checked: fresh random inputs per the spec's operand shapes,
// the fused op and its unfused baseline, outputs poisoned before every call (op_check.hpp).
#include "op_check.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "tilelink/compute/cpu_gemm.hpp"

namespace tilelink::cli {

namespace {

struct RankData {
  std::vector<std::byte> a, b, c_fused, c_unfused;
  std::vector<double> ref, mag;  // float64 reference and its terms' magnitude (sum of |a_i b_i|)
};

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

}  // namespace

Reference reference_f64(const OpSpec& spec, const OpProblem& p, const std::vector<const std::byte*>& a,
                        const std::vector<const std::byte*>& b, const std::vector<int>& ranks, bool magnitude) {
  Reference out;
  out.ref.resize(p.world);
  out.mag.resize(p.world);
  const int64_t eb = dtype_size(p.dtype);
  if (spec.split_n) {  // C_r = AllGather(A) * B_r^T
    std::vector<std::byte> a_full(static_cast<size_t>(p.m * p.k * eb));
    for (int r = 0; r < p.world; ++r)
      if (p.rows.size(r) > 0)
        std::memcpy(a_full.data() + p.rows.begin(r) * p.k * eb, a[r], static_cast<size_t>(p.rows.size(r) * p.k * eb));
    for (int r : ranks) {
      out.ref[r] = gemm_reference_f64(a_full.data(), b[r], p.dtype, p.m, p.split[r], p.k);
      if (magnitude) out.mag[r] = gemm_magnitude_f64(a_full.data(), b[r], p.dtype, p.m, p.split[r], p.k);
    }
    return out;
  }
  // K split: the full sum is [A_0 .. A_W-1] * [B_0 .. B_W-1]^T over the whole K.
  std::vector<std::byte> a_cat(static_cast<size_t>(p.m * p.k * eb)), b_cat(static_cast<size_t>(p.n * p.k * eb));
  int64_t k0 = 0;
  for (int r = 0; r < p.world; ++r) {
    const int64_t kr = p.split[r];
    for (int64_t i = 0; i < p.m; ++i) std::memcpy(a_cat.data() + (i * p.k + k0) * eb, a[r] + i * kr * eb, kr * eb);
    for (int64_t i = 0; i < p.n; ++i) std::memcpy(b_cat.data() + (i * p.k + k0) * eb, b[r] + i * kr * eb, kr * eb);
    k0 += kr;
  }
  const std::vector<double> full = gemm_reference_f64(a_cat.data(), b_cat.data(), p.dtype, p.m, p.n, p.k);
  std::vector<double> mag;
  if (magnitude) mag = gemm_magnitude_f64(a_cat.data(), b_cat.data(), p.dtype, p.m, p.n, p.k);
  for (int r : ranks) {
    const int64_t row0 = spec.c_row0_of(p, r), rows = spec.c_rows_of(p, r);
    out.ref[r].assign(full.begin() + row0 * p.n, full.begin() + (row0 + rows) * p.n);
    if (magnitude) out.mag[r].assign(mag.begin() + row0 * p.n, mag.begin() + (row0 + rows) * p.n);
  }
  return out;
}

CpuOutcome check_cpu(const OpSpec& spec, const OpProblem& p) {
  std::mt19937_64 rng(p.seed);
  cpu::World world(p.world, std::chrono::milliseconds(p.timeout_ms));
  std::vector<RankData> d(p.world);
  std::unique_ptr<CpuOpRun> op = spec.make_cpu(world, p);
  make_inputs(spec, p, rng, d);
  std::vector<const std::byte*> a(p.world), b(p.world);
  for (int r = 0; r < p.world; ++r) a[r] = d[r].a.data(), b[r] = d[r].b.data();
  std::vector<int> ranks(p.world);
  for (int r = 0; r < p.world; ++r) ranks[r] = r;
  Reference want = reference_f64(spec, p, a, b, ranks, true);
  for (int r = 0; r < p.world; ++r) d[r].ref = std::move(want.ref[r]), d[r].mag = std::move(want.mag[r]);
  CpuOutcome o;
  std::vector<double> tf, tu;
  time_calls(world, *op, d, p.iters, &tf, &tu);
  for (auto& x : d) {
    if (x.ref.empty()) continue;  // an empty output (a rank with no rows)
    o.err_fused = std::max(o.err_fused, relative_error(x.c_fused.data(), p.dtype, x.ref));
    o.err_unfused = std::max(o.err_unfused, relative_error(x.c_unfused.data(), p.dtype, x.ref));
    o.err_fused_mag = std::max(o.err_fused_mag, error_vs_magnitude(x.c_fused.data(), p.dtype, x.ref, x.mag));
    o.err_unfused_mag = std::max(o.err_unfused_mag, error_vs_magnitude(x.c_unfused.data(), p.dtype, x.ref, x.mag));
    o.identical = o.identical && x.c_fused == x.c_unfused;
  }
  o.t_fused = median(tf);
  o.t_unfused = median(tu);
  return o;
}


int report_cpu_outcome(const CpuOutcome& o, double tolerance, int calls) {
  const bool ok = o.err_fused <= tolerance && o.err_unfused <= tolerance && (o.identical || !o.identical_required);
  std::printf("  %-8s rel. error vs float64 (max over ranks and calls) %.3e   time median %.3f ms\n", "fused",
              o.err_fused, o.t_fused);
  std::printf("  %-8s rel. error vs float64 (max over ranks and calls) %.3e   time median %.3f ms\n", "unfused",
              o.err_unfused, o.t_unfused);
  std::printf("  fused == unfused bit for bit: %s\n",
              o.identical ? "yes" : o.identical_required ? "NO" : "no (not required: the two paths sum in different orders)");
  std::printf("%s (tolerance %.1e, %d calls)\n", ok ? "check passed" : "CHECK FAILED", tolerance, calls);
  return ok ? 0 : 1;
}

}  // namespace tilelink::cli
