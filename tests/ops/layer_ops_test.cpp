// The layer ops of the command line (tools/tilelink/layer_ops.hpp: the MoE layers and sequence-
// parallel attention), through their registered specs as `tilelink run` drives them: random worlds
// 1-8, ragged token or position splits, every routing pattern, shard and dtype; each problem's fused
// and unfused calls within tolerance of float64 and bit-identical. Bad options are refused by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../support/random.hpp"
#include "../support/refused.hpp"
#include "layer_ops.hpp"

namespace tilelink {
namespace {

cli::Args args_of(std::vector<std::string> words, std::vector<std::string> flags = {}) {
  return cli::Args(std::move(words), std::move(flags));
}

// One problem of `spec` from its options, as `tilelink run` reads them, checked.
void expect_checked(const cli::LayerOpSpec& spec, const std::vector<std::string>& words) {
  std::string line = spec.name;
  for (const auto& w : words) line += " " + w;
  SCOPED_TRACE(line);
  cli::Args args = args_of(words, spec.flags);
  cli::LayerRun run = cli::parse_layer_run(args);
  const auto problem = spec.parse(args, run);
  args.finish();
  run.tolerance = problem->default_tolerance();
  const cli::CpuOutcome o = problem->check_cpu(run);
  EXPECT_TRUE(o.identical) << "fused and unfused differ";
  EXPECT_LE(o.err_fused, run.tolerance);
  EXPECT_LE(o.err_unfused, run.tolerance);
}

std::string joined(const std::vector<int64_t>& counts) {
  std::string s;
  for (int64_t c : counts) {
    if (!s.empty()) s += ',';
    s += std::to_string(c);
  }
  return s;
}

TEST(LayerOps, EveryMoeLayerOnRandomProblems) {
  TL_SEEDED_RNG(rng);
  const std::vector<std::string> names{"moe_ag_gemm", "moe_gemm_rs", "moe_mlp"};
  const char* routings[] = {"uniform", "skewed", "one-expert", "empty-experts"};
  const char* dtypes[] = {"bf16", "fp16", "fp32"};
  for (const std::string& name : names) {
    const cli::LayerOpSpec* spec = cli::find_layer_op(name);
    ASSERT_NE(spec, nullptr) << name << " is not registered";
    for (int trial = 0; trial < 6; ++trial) {
      const int world = rng.uniform_int(1, 8);
      const int experts = rng.coin(0.3) ? rng.uniform_int(1, 4) : rng.uniform_int(1, 64);
      const int topk = rng.uniform_int(1, std::min(8, experts));
      const int64_t tokens = rng.uniform(0, 40);
      expect_checked(*spec, {"--world", std::to_string(world), "--tokens", std::to_string(tokens), "--hidden",
                             std::to_string(8 * rng.uniform(1, 6)), "--ffn", std::to_string(world * 8 * rng.uniform(1, 3)),
                             "--experts", std::to_string(experts), "--topk", std::to_string(topk), "--routing",
                             routings[rng.uniform_int(0, 3)], "--dtype", dtypes[rng.uniform_int(0, 2)], "--m-split",
                             joined(rng.uneven_counts(tokens, world)), "--iters", "2", "--seed",
                             std::to_string(rng.uniform(0, 1 << 30))});
    }
  }
}

TEST(LayerOps, BothAttentionOpsOnRandomProblems) {
  TL_SEEDED_RNG(rng);
  const char* dtypes[] = {"bf16", "fp16", "fp32"};
  for (const std::string name : {"sp_attn", "ring_attn"}) {
    const cli::LayerOpSpec* spec = cli::find_layer_op(name);
    ASSERT_NE(spec, nullptr) << name << " is not registered";
    for (int trial = 0; trial < 6; ++trial) {
      const int world = rng.uniform_int(1, 8), kv = rng.uniform_int(1, 2);
      const int64_t seq = rng.uniform(1, 80);
      std::vector<std::string> words{"--world", std::to_string(world), "--seq", std::to_string(seq), "--batch",
                                     std::to_string(rng.uniform_int(1, 2)), "--kv-heads", std::to_string(kv),
                                     "--heads", std::to_string(kv * rng.uniform_int(1, 3)), "--head-dim",
                                     std::to_string(8 * rng.uniform(1, 3)), "--dtype", dtypes[rng.uniform_int(0, 2)],
                                     "--iters", "2", "--seed", std::to_string(rng.uniform(0, 1 << 30))};
      if (rng.coin()) words.push_back("--causal");
      if (rng.coin()) {
        words.insert(words.end(), {"--shard", "zigzag"});
      } else {
        words.insert(words.end(), {"--seq-split", joined(rng.uneven_counts(seq, world))});
      }
      expect_checked(*spec, words);
    }
  }
}

TEST(LayerOps, RefusesBadOptions) {
  const cli::LayerOpSpec* spec = cli::find_layer_op("moe_mlp");
  ASSERT_NE(spec, nullptr);
  auto parse = [&](std::vector<std::string> words) {
    cli::Args args = args_of(std::move(words));
    const cli::LayerRun run = cli::parse_layer_run(args);
    spec->parse(args, run);
    args.finish();
  };
  test::expect_refused([&] { parse({"--routing", "zipf"}); }, "unknown routing 'zipf'");
  test::expect_refused([&] { parse({"--experts", "4", "--topk", "5"}); }, "--topk must be at most --experts (4)");
  test::expect_refused([&] { parse({"--world", "3", "--ffn", "2"}); }, "--ffn 2 leaves a rank of the 3 without columns");
  test::expect_refused([&] { parse({"--world", "2", "--tokens", "6", "--m-split", "1,2"}); },
                       "--m-split adds up to 3, --tokens is 6");
  test::expect_refused([&] { parse({"--experts", "0"}); }, "--experts");
  test::expect_refused([&] { parse({"--world", "0"}); }, "--world must be in [1, ");
  test::expect_refused([&] { parse({"--bogus", "1"}); }, "unknown option --bogus");
}

}  // namespace
}  // namespace tilelink
