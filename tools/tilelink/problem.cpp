#include "problem.hpp"

#include <algorithm>
#include <sstream>
#include <thread>

#include "tilelink/core/error.hpp"

namespace tilelink::cli {

OpProblem parse_problem(Args& args, const std::string& op, const std::vector<std::string>& variants, bool split_n) {
  OpProblem p;
  p.op = op;
  p.split_n = split_n;
  p.backend = args.get("--backend", "auto");
  TL_REQUIRE(p.backend == "auto" || p.backend == "cpu" || p.backend == "cuda",
             "--backend must be auto, cpu or cuda, got '" << p.backend << "'");
  const int64_t world = args.get_int("--world", 2);
  TL_REQUIRE(world >= 1 && world <= kMaxWorldSize, "--world must be in [1, " << kMaxWorldSize << "], got " << world);
  p.world = static_cast<int>(world);
  p.m = args.get_int("-m", 1000);
  p.n = args.get_int("-n", 256);
  p.k = args.get_int("-k", 128);
  TL_REQUIRE(p.m >= 1 && p.n >= 1 && p.k >= 1,
             "-m, -n and -k must be >= 1, got " << p.m << ", " << p.n << ", " << p.k);
  constexpr int64_t kMaxExtent = int64_t{1} << 40;  // byte counts of any operand stay far from overflow
  TL_REQUIRE(p.m <= kMaxExtent && p.n <= kMaxExtent && p.k <= kMaxExtent && p.m * p.n <= kMaxExtent &&
                 p.m * p.k <= kMaxExtent && p.n * p.k <= kMaxExtent,
             "-m, -n and -k (" << p.m << ", " << p.n << ", " << p.k << ") make an operand of more than 2^40 elements");
  std::string dt = args.get("--dtype", "bf16");
  TL_REQUIRE(parse_dtype(dt, &p.dtype), "--dtype must be bf16, fp16 or fp32, got '" << dt << "'");
  p.variant = args.get("--variant", "auto");
  bool known = p.variant == "auto";
  std::string allowed = "auto";
  for (size_t i = 0; i < variants.size(); ++i) {
    known = known || p.variant == variants[i];
    allowed += (i + 1 == variants.size() ? " or " : ", ") + variants[i];
  }
  TL_REQUIRE(known, "--variant must be " << allowed << ", got '" << p.variant << "'");
  p.mode = p.variant == "push" ? CommMode::kPush : CommMode::kPull;
  p.mode_auto = p.variant == "auto";

  set_shape(p, p.m, p.n, p.k);
  auto counts = args.get_int_list("--m-split", {});
  if (!counts.empty()) {
    TL_REQUIRE(static_cast<int>(counts.size()) == p.world,
               "--m-split has " << counts.size() << " counts for --world " << p.world);
    p.rows = RowPartition::from_counts(counts);
    TL_REQUIRE(p.rows.total() == p.m, "--m-split adds up to " << p.rows.total() << ", -m is " << p.m);
  }

  p.comm_tile_auto = args.get("--comm-tile", "").empty();
  p.comm_tile = static_cast<int>(args.get_int_in("--comm-tile", 64, 1, 1 << 20));
  p.cpu_options_given = args.has("--tile-m") || args.has("--tile-n") || args.has("--comm-workers") ||
                        args.has("--compute-workers");
  p.tile_m = static_cast<int>(args.get_int_in("--tile-m", 128, 1, 1 << 20));
  p.tile_n = static_cast<int>(args.get_int_in("--tile-n", 128, 1, 1 << 20));
  p.comm_workers = static_cast<int>(args.get_int_in("--comm-workers", 1, 1, 1024));
  p.compute_workers = static_cast<int>(args.get_int_in("--compute-workers", 1, 1, 1024));
  p.cuda_options_given = args.has("--comm-sms") || args.has("--path") || args.has("--baseline-only") ||
                         args.has("--ref-limit");
  p.comm_sms = static_cast<int>(args.get_int_in("--comm-sms", 0, 0, 1024));
  std::string path = args.get("--path", "auto");
  TL_REQUIRE(parse_op_path(path, &p.path), "--path must be auto, fused or unfused, got '" << path << "'");
  p.baseline_only = args.flag("--baseline-only");
  p.iters = static_cast<int>(args.get_int_in("--iters", 5, 1, 1000000));
  p.seed = static_cast<uint64_t>(args.get_int("--seed", 1));
  p.timeout_ms = args.get_int_in("--timeout-ms", 20000, 1, int64_t{24} * 3600 * 1000);
  p.tolerance = args.get_double("--tolerance", p.dtype == DType::kF32 ? 1e-5 : 1e-2);
  p.ref_limit = args.get_double("--ref-limit", 2e10);
  TL_REQUIRE(p.ref_limit >= 0, "--ref-limit must be >= 0");
  return p;
}

std::vector<OpProblem> expand_shapes(const OpProblem& base, const std::string& shapes) {
  if (shapes.empty()) return {base};
  std::vector<OpProblem> out;
  std::stringstream ss(shapes);
  for (std::string item; std::getline(ss, item, ',');) {
    int64_t v[3] = {0, 0, 0};
    size_t pos = 0;
    for (int i = 0; i < 3; ++i) {
      const size_t end = i < 2 ? item.find('x', pos) : item.size();
      TL_REQUIRE(end != std::string::npos && end > pos,
                 "--shapes expects MxNxK[,MxNxK...], got '" << item << "'");
      try {
        size_t used = 0;
        v[i] = std::stoll(item.substr(pos, end - pos), &used);
        TL_REQUIRE(used == end - pos, "");
      } catch (...) {
        TL_REQUIRE(false, "--shapes expects MxNxK[,MxNxK...], got '" << item << "'");
      }
      pos = end + 1;
    }
    OpProblem p = base;
    set_shape(p, v[0], v[1], v[2]);
    out.push_back(p);
  }
  TL_REQUIRE(!out.empty(), "--shapes is empty");
  return out;
}

}  // namespace tilelink::cli
