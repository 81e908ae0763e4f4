// Any registered op (op_registry.hpp) on the CPU backend, checked: p.iters calls of the fused op and
// of its unfused baseline on fresh random inputs (op_problem.cpp's random_matrix, seeded by
// p.seed), outputs poisoned before every call; the largest relative Frobenius error of any rank
// against the float64 reference, and whether every rank's fused output equals the baseline's bit
// for bit. The one harness of `tilelink run --backend cpu` and of the CPU fuzzer.
#pragma once

#include "op_registry.hpp"

namespace tilelink::cli {

struct CpuOutcome {
  double err_fused = 0, err_unfused = 0;  // max over ranks, relative Frobenius error vs float64
  // The same against the terms' magnitude (compute/cpu_gemm.hpp, error_vs_magnitude): the error
  // cancellation cannot inflate (a tiny sum of large terms keeps their rounding).
  double err_fused_mag = 0, err_unfused_mag = 0;
  double t_fused = 0, t_unfused = 0;      // median wall ms of a call
  bool identical = true;                  // fused == unfused, bit for bit, on every rank
};

CpuOutcome check_cpu(const OpSpec& spec, const OpProblem& p);

}  // namespace tilelink::cli
