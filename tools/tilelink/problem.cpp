#include "problem.hpp"

#include <algorithm>
#include <sstream>

#include "tilelink/core/error.hpp"

namespace tilelink::cli {

OpProblem parse_problem(Args& args, const std::string& op) {
  OpProblem p;
  p.op = op;
  p.backend = args.get("--backend", "auto");
  TL_REQUIRE(p.backend == "auto" || p.backend == "cpu" || p.backend == "cuda",
             "--backend must be auto, cpu or cuda, got '" << p.backend << "'");
  p.world = static_cast<int>(args.get_int("--world", 2));
  TL_REQUIRE(p.world >= 1 && p.world <= kMaxWorldSize,
             "--world must be in [1, " << kMaxWorldSize << "], got " << p.world);
  p.m = args.get_int("-m", 1000);
  p.n = args.get_int("-n", 256);
  p.k = args.get_int("-k", 128);
  TL_REQUIRE(p.m >= 1 && p.n >= 1 && p.k >= 1,
             "-m, -n and -k must be >= 1, got " << p.m << ", " << p.n << ", " << p.k);
  std::string dt = args.get("--dtype", "bf16");
  TL_REQUIRE(parse_dtype(dt, &p.dtype), "--dtype must be bf16, fp16 or fp32, got '" << dt << "'");
  std::string variant = args.get("--variant", "pull");
  TL_REQUIRE(variant == "pull" || variant == "push",
             "--variant must be pull or push, got '" << variant << "'");
  p.mode = variant == "push" ? CommMode::kPush : CommMode::kPull;

  auto counts = args.get_int_list("--m-split", {});
  if (counts.empty()) {
    p.rows = RowPartition::even(p.m, p.world);
  } else {
    TL_REQUIRE(static_cast<int>(counts.size()) == p.world,
               "--m-split has " << counts.size() << " counts for --world " << p.world);
    p.rows = RowPartition::from_counts(counts);
    TL_REQUIRE(p.rows.total() == p.m, "--m-split adds up to " << p.rows.total() << ", -m is " << p.m);
  }
  int64_t split_total = op == "ag_gemm" ? p.n : p.k;
  RowPartition cols = RowPartition::even(split_total, p.world);
  for (int r = 0; r < p.world; ++r) p.split.push_back(cols.size(r));
  for (int r = 0; r < p.world; ++r)
    TL_REQUIRE(p.split[r] >= 1, (op == "ag_gemm" ? "-n" : "-k")
                                    << " = " << split_total << " leaves rank " << r
                                    << " with nothing; it must be >= --world");

  p.comm_tile = static_cast<int>(args.get_int("--comm-tile", 64));
  p.tile_m = static_cast<int>(args.get_int("--tile-m", 128));
  p.tile_n = static_cast<int>(args.get_int("--tile-n", 128));
  p.comm_workers = static_cast<int>(args.get_int("--comm-workers", 1));
  p.compute_workers = static_cast<int>(args.get_int("--compute-workers", 1));
  p.comm_sms = static_cast<int>(args.get_int("--comm-sms", 0));
  TL_REQUIRE(p.comm_sms >= 0, "--comm-sms must be >= 0");
  std::string path = args.get("--path", "auto");
  TL_REQUIRE(parse_op_path(path, &p.path), "--path must be auto, fused or unfused, got '" << path << "'");
  p.iters = static_cast<int>(args.get_int("--iters", 5));
  TL_REQUIRE(p.iters >= 1, "--iters must be >= 1");
  p.seed = static_cast<uint64_t>(args.get_int("--seed", 1));
  p.timeout_ms = args.get_int("--timeout-ms", 20000);
  TL_REQUIRE(p.timeout_ms >= 1, "--timeout-ms must be >= 1");
  p.tolerance = args.get_double("--tolerance", p.dtype == DType::kF32 ? 1e-5 : 1e-2);
  return p;
}

std::string describe(const OpProblem& p) {
  std::ostringstream os;
  os << p.op << " backend=" << p.backend << " world=" << p.world << " M=" << p.m << " N=" << p.n
     << " K=" << p.k << " dtype=" << dtype_name(p.dtype)
     << " variant=" << (p.mode == CommMode::kPush ? "push" : "pull") << "\n  M split:";
  for (int r = 0; r < p.world; ++r) os << " " << p.rows.size(r);
  os << (p.op == "ag_gemm" ? "\n  N split:" : "\n  K split:");
  for (int64_t s : p.split) os << " " << s;
  os << "\n  comm tile rows=" << p.comm_tile << " gemm tile=" << p.tile_m << "x" << p.tile_n
     << " comm workers=" << p.comm_workers << " compute workers=" << p.compute_workers;
  return os.str();
}

std::vector<std::byte> random_matrix(int64_t rows, int64_t cols, DType dtype, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<std::byte> out(static_cast<size_t>(rows * cols * dtype_size(dtype)));
  for (int64_t i = 0; i < rows * cols; ++i) store_from_float(out.data(), dtype, i, dist(rng));
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace tilelink::cli
