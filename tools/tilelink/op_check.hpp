// Any registered op (op_registry.hpp) on the CPU backend, checked: p.iters calls of the fused op and
// of its unfused baseline on fresh random inputs (op_problem.cpp's random_matrix, seeded by
// p.seed), outputs poisoned before every call; the largest relative Frobenius error of any rank
// against the float64 reference, and whether every rank's fused output equals the baseline's bit
// for bit. The one harness of `tilelink run --backend cpu` and of the CPU fuzzer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include "op_registry.hpp"

namespace tilelink::cli {

// Fills an output with NaN bytes before a call, so what the call leaves unwritten shows.
inline void poison(std::vector<std::byte>& v) { std::memset(v.data(), 0xff, v.size()); }

// Wall milliseconds of fn().
template <class Fn>
double time_ms(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct CpuOutcome {
  double err_fused = 0, err_unfused = 0;  // max over ranks, relative Frobenius error vs float64
  // The same against the terms' magnitude (compute/cpu_gemm.hpp, error_vs_magnitude): the error
  // cancellation cannot inflate (a tiny sum of large terms keeps their rounding).
  double err_fused_mag = 0, err_unfused_mag = 0;
  double t_fused = 0, t_unfused = 0;      // median wall ms of a call
  bool identical = true;                  // fused == unfused, bit for bit, on every rank
  // Whether identical is required: not where the fused call sums in another order than its
  // baseline (a ring's merged softmaxes on the GPU).
  bool identical_required = true;
};

CpuOutcome check_cpu(const OpSpec& spec, const OpProblem& p);

// Prints the outcome (errors, times, bit-identity) and the verdict against `tolerance`; returns the
// exit code (0: every check passed). `calls`: how many calls each side made.
int report_cpu_outcome(const CpuOutcome& o, double tolerance, int calls);

// The float64 reference of C_r for each rank of `ranks` (and, with `magnitude`, the terms'
// magnitude), indexed by rank (empty for ranks not asked): N split, AllGather(A) * B_r^T; K split,
// the rows C_r holds of [A_0 .. A_W-1] * [B_0 .. B_W-1]^T. a[r], b[r]: every rank's inputs, host
// memory in p.dtype, shaped as the spec says. Shared by the CPU check and the CUDA runs.
struct Reference {
  std::vector<std::vector<double>> ref, mag;
};
Reference reference_f64(const OpSpec& spec, const OpProblem& p, const std::vector<const std::byte*>& a,
                        const std::vector<const std::byte*>& b, const std::vector<int>& ranks, bool magnitude);

}  // namespace tilelink::cli
