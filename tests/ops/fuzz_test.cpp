// The CPU fuzzer: random problems for every registered op (tools/tilelink/op_registry.hpp), run
// through the same harness as `tilelink run --backend cpu` (op_check.hpp): worlds 1..8, ragged and
// empty row segments, ragged N or K splits, every dtype and variant, random tiles and worker
// counts. Every case must give fused == unfused bit for bit on every rank, both within tolerance of
// the float64 reference, and finish (every wait is bounded: a hang fails as a timeout).
//   TILELINK_FUZZ_CASES=N      cases (default 10000; 1000 under ThreadSanitizer)
//   TILELINK_TEST_SEED=S       the run's base seed (printed on failure), reproduces every case
//   TILELINK_FUZZ_CASE=I       run case I alone (its seed is the base seed's I-th draw)
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "../support/random.hpp"
#include "op_check.hpp"
#include "op_registry.hpp"

namespace tilelink {
namespace {

#if defined(__SANITIZE_THREAD__)
constexpr int64_t kDefaultCases = 1000;
#else
constexpr int64_t kDefaultCases = 10000;
#endif

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoll(v, nullptr, 0) : fallback;
}

// Case `index`: a problem drawn from its own generator (so one case reproduces alone).
cli::OpProblem draw_case(uint64_t base, int64_t index, const cli::OpSpec** spec_out) {
  test::Rng rng(base ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(index + 1)));
  const auto& specs = cli::op_specs();
  const cli::OpSpec& spec = specs[static_cast<size_t>(rng.uniform(0, static_cast<int64_t>(specs.size()) - 1))];
  *spec_out = &spec;
  cli::OpProblem p;
  p.op = spec.name;
  p.split_n = spec.split_n;
  p.backend = "cpu";
  p.world = rng.uniform_int(1, 8);
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  p.dtype = dtypes[rng.uniform_int(0, 2)];
  const int64_t m = rng.uniform(1, 160), n = rng.uniform(p.split_n ? p.world : 1, 80);
  const int64_t k = rng.uniform(p.split_n ? 1 : p.world, 80);
  cli::set_shape(p, m, n, k);
  if (rng.uniform_int(0, 2) > 0) p.rows = RowPartition::from_counts(rng.uneven_counts(m, p.world));  // ragged, empties
  // A ragged split of N or K, every rank at least one.
  std::vector<int64_t> split(p.world, 1);
  for (int64_t left = (p.split_n ? n : k) - p.world; left > 0; --left) ++split[rng.uniform_int(0, p.world - 1)];
  p.split = split;
  const int v = rng.uniform_int(0, static_cast<int>(spec.variants.size()));
  p.variant = v == 0 ? "auto" : spec.variants[v - 1];
  p.mode = p.variant == "push" ? CommMode::kPush : CommMode::kPull;
  p.mode_auto = p.variant == "auto";
  p.comm_tile = rng.uniform_int(1, 48);
  p.tile_m = rng.uniform_int(1, 48);
  p.tile_n = rng.uniform_int(1, 48);
  p.comm_workers = rng.uniform_int(1, 3);
  p.compute_workers = rng.uniform_int(1, 3);
  p.iters = 1;
  p.seed = rng.uniform(0, int64_t{1} << 62);
  p.timeout_ms = 20000;
  p.tolerance = p.dtype == DType::kF32 ? 1e-5 : 1e-2;
  return p;
}

TEST(CpuFuzz, EveryRegisteredOpOnRandomProblems) {
  const uint64_t base = test::test_seed();
  const int64_t one = env_int("TILELINK_FUZZ_CASE", -1);
  const int64_t cases = one >= 0 ? 1 : env_int("TILELINK_FUZZ_CASES", kDefaultCases);
  ASSERT_FALSE(cli::op_specs().empty()) << "no op registered";
  std::map<std::string, int64_t> per_op;
  int64_t failed = 0;
  for (int64_t i = 0; i < cases; ++i) {
    const int64_t index = one >= 0 ? one : i;
    const cli::OpSpec* spec = nullptr;
    const cli::OpProblem p = draw_case(base, index, &spec);
    SCOPED_TRACE(::testing::Message() << "case " << index << " (TILELINK_TEST_SEED=" << test::base_seed()
                                      << " TILELINK_FUZZ_CASE=" << index << "): " << cli::describe(p));
    ++per_op[p.op];
    cli::CpuOutcome o;
    try {
      o = cli::check_cpu(*spec, p);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw: " << e.what();
      if (++failed >= 5) break;
      continue;
    }
    // NOTE: against the terms' magnitude: a cancelling sum of W rounded bf16 partials can be 1e-2
    // off its own tiny value (seen: gemm_rs, world 8, N = 4, 1.16e-2 vs |ref|).
    const bool ok = o.identical && o.err_fused_mag <= p.tolerance && o.err_unfused_mag <= p.tolerance;
    EXPECT_TRUE(ok) << "fused == unfused: " << (o.identical ? "yes" : "NO") << ", errors vs magnitude "
                    << o.err_fused_mag << " / " << o.err_unfused_mag;
    if (!ok && ++failed >= 5) break;  // enough to reproduce
  }
  std::string counts;
  for (const auto& [op, c] : per_op) counts += " " + op + "=" + std::to_string(c);
  std::printf("cpu fuzzer: %lld cases (%s ), %lld failed, base seed %llu\n", static_cast<long long>(cases),
              counts.c_str(), static_cast<long long>(failed), static_cast<unsigned long long>(test::base_seed()));
  EXPECT_EQ(failed, 0);
}

}  // namespace
}  // namespace tilelink
