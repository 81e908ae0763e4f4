// Shared pieces of the commands that run an op: the problem description parsed from the command
// line, random inputs and the check against the float64 reference.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cli.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/ops/ag_gemm_plan.hpp"
#include "tilelink/ops/gemm_rs_plan.hpp"
#include "tilelink/ops/gemm_ar_plan.hpp"
#include "tilelink/tune/path_model.hpp"

namespace tilelink::cli {

struct OpProblem {
  std::string op;       // the op's registered name
  bool split_n = false; // N split over ranks (AG+GEMM), else K split
  std::string backend;  // "cpu" | "cuda"
  int world = 2;
  int64_t m = 0, n = 0, k = 0;  // totals: AG+GEMM splits M and N, GEMM+RS splits M and K
  RowPartition rows;            // M split (even, or --m-split)
  std::vector<int64_t> split;   // AG+GEMM: N_r; GEMM+RS: K_r
  DType dtype = DType::kBF16;
  std::string variant = "auto";  // --variant: auto (the op's choice) or one of the op's variants
  CommMode mode = CommMode::kPull;  // --variant pull|push (ops with those variants)
  bool mode_auto = true;
  int comm_tile = 128, tile_m = 128, tile_n = 128, comm_workers = 1, compute_workers = 1;
  bool comm_tile_auto = false;  // --comm-tile not given: the CPU takes comm_tile, CUDA ops pick their own
  int comm_sms = 0;  // CUDA: SMs of each rank running the comm program (0 = the copy engine)
  OpPath path = OpPath::kAuto;  // CUDA: fused, unfused, or the cost model's choice
  bool baseline_only = false;   // CUDA: check (and time) the unfused baseline alone
  bool cpu_options_given = false;   // --tile-m/n, --comm-workers, --compute-workers: the CPU backend's
  bool cuda_options_given = false;  // --comm-sms, --path, --baseline-only, --ref-limit: the CUDA backend's
  int iters = 5;
  uint64_t seed = 1;
  int64_t timeout_ms = 20000;
  double tolerance = 0;  // relative Frobenius error bound
  double ref_limit = 2e10;  // CUDA: the float64 reference (one host thread) only up to this M*N*K
};

// Reads the options shared by `run` and `bench`; refuses bad values with tilelink::Error.
// `variants`: the op's --variant values besides auto; split_n: the op splits N (else K).
OpProblem parse_problem(Args& args, const std::string& op, const std::vector<std::string>& variants, bool split_n);
std::string describe(const OpProblem& p);
// Sets M, N, K and the even splits (M over ranks; N or K, as p.split_n says) of p.world ranks.
void set_shape(OpProblem& p, int64_t m, int64_t n, int64_t k);
// `--shapes MxNxK[,MxNxK...]`: one problem per shape, like `base` but for its M, N, K (even M
// split). Empty: {base}.
std::vector<OpProblem> expand_shapes(const OpProblem& base, const std::string& shapes);

// The problem of operands a caller already holds (the Python module): every rank's A_r and B_r
// extents ({rows, cols}), shaped as the op's split says (op_registry.hpp); m_split: the row segments
// of a K-split op's output (empty: even). Refuses, naming the operand (a[1], b[0]) and what it
// disagrees with, by ArgumentError.
struct Extent2 {
  int64_t rows = 0, cols = 0;
};
OpProblem problem_of_operands(const std::string& op, bool split_n, const std::string& backend,
                              const std::vector<Extent2>& a, const std::vector<Extent2>& b, DType dtype,
                              const std::vector<int64_t>& m_split);

// Uniform [-1, 1) values stored in `dtype`, from one draw of `rng` (filled by several threads).
std::vector<std::byte> random_matrix(int64_t rows, int64_t cols, DType dtype, std::mt19937_64& rng);

// Median of a sample.
double median(std::vector<double> v);

}  // namespace tilelink::cli
