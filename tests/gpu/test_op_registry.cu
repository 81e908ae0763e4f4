// Every registered op (tools/tilelink/op_registry.hpp) on the CUDA backend, on random problems: the
// ops are found in the registry, not named here, so registering an op is all this test needs.
// Virtual ranks on one GPU, worlds 1-8, ragged and empty row segments, ragged N or K splits, every
// variant, the copy engine or SMs for the comm program; inputs fresh and random, outputs poisoned;
// fused and unfused both checked against float64 (tools/tilelink/op_check_cuda.hpp). Half the
// problems also capture the fused call in CUDA graphs and replay it twice on fresh inputs (the same
// buffers), each replay checked the same way.
//
// TILELINK_TEST_SEED=<seed> reproduces a run (the seed is printed, and with each failure);
// TILELINK_GPU_FUZZ_CASES=<n> sets the number of problems per op and world (default 42: 1,008 in
// all with three ops).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "../support/random.hpp"
#include "op_check_cuda.hpp"
#include "op_registry.hpp"
#include "problem.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink {
namespace {

namespace tlc = tilelink::cuda;

int cases_per_world() {
  const char* v = std::getenv("TILELINK_GPU_FUZZ_CASES");
  return v ? std::atoi(v) : 42;
}

// A problem the CUDA ops take: bf16, 16-byte rows (K, and N or the N_r / K_r, multiples of 8, each
// at least 8); M anything, its segments ragged or empty.
cli::OpProblem draw_problem(const cli::OpSpec& spec, int world, test::Rng& rng) {
  cli::OpProblem p;
  p.op = spec.name;
  p.split_n = spec.split_n;
  p.backend = "cuda";
  p.world = world;
  p.dtype = DType::kBF16;
  const int64_t m = rng.uniform(1, 700);
  const int64_t n = spec.split_n ? 8 * rng.uniform(world, 90) : 8 * rng.uniform(1, 90);
  const int64_t k = spec.split_n ? 8 * rng.uniform(1, 90) : 8 * rng.uniform(world, 90);
  cli::set_shape(p, m, n, k);
  if (rng.coin(0.6)) p.rows = RowPartition::from_counts(rng.uneven_counts(m, world));
  std::vector<int64_t> split(world, 1);  // in units of 8
  for (int64_t left = (spec.split_n ? n : k) / 8 - world; left > 0; --left) ++split[rng.uniform_int(0, world - 1)];
  for (int64_t& s : split) s *= 8;
  p.split = split;
  const int v = rng.uniform_int(0, static_cast<int>(spec.variants.size()));
  p.variant = v == 0 ? "auto" : spec.variants[v - 1];
  p.mode = p.variant == "push" ? CommMode::kPush : CommMode::kPull;
  p.mode_auto = p.variant == "auto";
  p.comm_tile_auto = rng.coin();
  p.comm_tile = 8 * rng.uniform_int(1, 40);
  // The comm program's SMs: 0 is the op's default (the copy engine or its own share).
  p.comm_sms = rng.coin() ? 0 : rng.uniform_int(2, 6);
  p.path = OpPath::kAuto;
  p.seed = rng.uniform(0, int64_t{1} << 62);
  p.timeout_ms = 20000;
  p.tolerance = 1e-2;
  p.ref_limit = 1e12;  // always the float64 reference
  return p;
}

TEST(OpRegistryCuda, EveryRegisteredOpOnRandomProblems) {
  cli::attach_cuda_ops();
  test::Rng rng(test::test_seed());
  SCOPED_TRACE("TILELINK_TEST_SEED=" + std::to_string(test::base_seed()));
  std::map<std::string, int> checked;
  int replays = 0, wrong = 0;
  for (int world = 1; world <= 8; ++world) {
    tlc::World w({.transport = tlc::Transport::kVirtual, .world_size = world});
    for (const cli::OpSpec& spec : cli::op_specs()) {
      if (!spec.make_cuda) continue;
      for (int i = 0; i < cases_per_world(); ++i) {
        const cli::OpProblem p = draw_problem(spec, world, rng);
        SCOPED_TRACE(cli::describe(p) + ", variant " + p.variant + ", comm SMs " + std::to_string(p.comm_sms) +
                     ", comm tile " + (p.comm_tile_auto ? std::string("auto") : std::to_string(p.comm_tile)));
        const bool graph = rng.coin();
        std::unique_ptr<cli::CudaOpRun> op = spec.make_cuda(w, p);
        const std::unique_ptr<cli::CudaOperands> x = cli::make_cuda_operands(spec, w, p);
        const cli::CudaCheck err = cli::check_cuda(spec, *op, w, p, *x);
        EXPECT_LE(err.err_ref, p.tolerance) << "fused vs float64";
        EXPECT_LE(err.err_base_ref, p.tolerance) << "unfused vs float64";
        EXPECT_LE(err.err_base, p.tolerance) << "fused vs unfused";
        bool ok = err.err_ref <= p.tolerance && err.err_base_ref <= p.tolerance && err.err_base <= p.tolerance;
        if (graph) {
          const cli::CudaCheck g = cli::check_cuda_graph(spec, *op, w, p, *x, 2);
          EXPECT_LE(g.err_ref, p.tolerance) << "graph replay vs float64";
          EXPECT_LE(g.err_base_ref, p.tolerance) << "unfused after a replay vs float64";
          EXPECT_LE(g.err_base, p.tolerance) << "graph replay vs unfused";
          ok = ok && g.err_ref <= p.tolerance && g.err_base_ref <= p.tolerance && g.err_base <= p.tolerance;
          replays += 2;
        }
        wrong += !ok;
        ++checked[spec.name];
      }
    }
  }
  // Every op with a CUDA side ran: a registry that lost one fails here.
  for (const cli::OpSpec& spec : cli::op_specs())
    if (spec.make_cuda) EXPECT_EQ(checked[spec.name], 8 * cases_per_world()) << spec.name;
  EXPECT_GE(checked.size(), 3u);
  int total = 0;
  for (const auto& [name, n] : checked) total += n;
  std::printf("checked %d problems (%zu ops x worlds 1-8 x %d; %d graph replays): %d wrong, 0 hangs (a hang "
              "fails the run), base seed TILELINK_TEST_SEED=%llu\n",
              total, checked.size(), cases_per_world(), replays, wrong,
              static_cast<unsigned long long>(test::base_seed()));
}

}  // namespace
}  // namespace tilelink
