// The ops whose operands are not one GEMM's A and B (the MoE layers, sequence-parallel attention):
// one LayerOpSpec each, as op_registry.hpp has one OpSpec for each GEMM-shaped op. `tilelink run
// <op>` reads the options every layer op shares (LayerRun), the spec reads its own shape options
// into a LayerProblem, and the problem's checked run on the CPU backend reports what the GEMM ops'
// does (op_check.hpp's CpuOutcome): fused and unfused against float64, bit for bit against each
// other, outputs poisoned before every call, fresh random inputs (and routing) every call.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli.hpp"
#include "op_check.hpp"
#include "tilelink/core/dtype.hpp"

namespace tilelink::cli {

// The options every layer op takes.
struct LayerRun {
  std::string backend = "auto";
  int world = 2;
  DType dtype = DType::kBF16;
  uint64_t seed = 1;
  int iters = 3;
  double tolerance = 0;  // 0: the problem's default
};

class LayerProblem {
 public:
  virtual ~LayerProblem() = default;
  virtual std::string describe() const = 0;
  // The relative float64 error a correct run stays under (dtype-dependent).
  virtual double default_tolerance() const = 0;
  // run.iters calls of the fused op and of its unfused baseline on the CPU backend, checked.
  virtual CpuOutcome check_cpu(const LayerRun& run) const = 0;
};

struct LayerOpSpec {
  std::string name;
  std::string summary;
  std::string usage;  // the op's own options
  std::vector<std::string> flags;  // its options that take no value
  // Reads the op's own options (tilelink::Error on bad values); the caller then finishes args.
  std::function<std::unique_ptr<LayerProblem>(Args& args, const LayerRun& run)> parse;
};

bool register_layer_op(LayerOpSpec spec);
const std::vector<LayerOpSpec>& layer_op_specs();
const LayerOpSpec* find_layer_op(const std::string& name);

// Reads LayerRun's options (--backend, --world, --dtype, --seed, --iters, --tolerance).
LayerRun parse_layer_run(Args& args);
// `tilelink run <layer op>`: parse, describe, check on the CPU, report; exit code 0 only if every
// check passes.
int run_layer_command(Args& args, const LayerOpSpec& spec);

}  // namespace tilelink::cli

#define TILELINK_REGISTER_LAYER_OP(spec_expr)                          \
  static const bool TL_CLI_CAT(tl_registered_layer_op_, __LINE__) = \
      ::tilelink::cli::register_layer_op(spec_expr)
