// The layer ops' registry and `tilelink run <layer op>` (layer_ops.hpp).
#include "layer_ops.hpp"

#include <cstdint>
#include <cstdio>

#include "tilelink/core/error.hpp"

namespace tilelink::cli {

namespace {
std::vector<LayerOpSpec>& specs() {
  static std::vector<LayerOpSpec> s;
  return s;
}
}  // namespace

bool register_layer_op(LayerOpSpec spec) {
  specs().push_back(std::move(spec));
  return true;
}

const std::vector<LayerOpSpec>& layer_op_specs() { return specs(); }

const LayerOpSpec* find_layer_op(const std::string& name) {
  for (const LayerOpSpec& s : specs())
    if (s.name == name) return &s;
  return nullptr;
}

LayerRun parse_layer_run(Args& args) {
  LayerRun run;
  run.backend = args.get("--backend", "auto");
  TL_REQUIRE(run.backend == "auto" || run.backend == "cpu" || run.backend == "cuda",
             "--backend must be auto, cpu or cuda, got '" << run.backend << "'");
  run.world = static_cast<int>(args.get_int_in("--world", 2, 1, kMaxWorldSize));
  const std::string dt = args.get("--dtype", "bf16");
  TL_REQUIRE(parse_dtype(dt, &run.dtype), "--dtype must be bf16, fp16 or fp32, got '" << dt << "'");
  run.seed = static_cast<uint64_t>(args.get_int_in("--seed", 1, 0, INT64_MAX));
  run.iters = static_cast<int>(args.get_int_in("--iters", 3, 1, 1000000));
  run.tolerance = args.get_double("--tolerance", 0);
  TL_REQUIRE(run.tolerance >= 0, "--tolerance must be >= 0, got " << run.tolerance);
  run.transport = args.get("--transport", "auto");
  TL_REQUIRE(run.transport == "auto" || run.transport == "virtual" || run.transport == "peer",
             "--transport must be auto, virtual or peer (the layer ops drive every rank from one process), got '"
                 << run.transport << "'");
  return run;
}

CpuOutcome LayerProblem::check_cuda(const LayerRun&) const {
  TL_REQUIRE(false, "no CUDA form: " << cuda_refusal());
  return {};
}

int run_layer_command(Args& args, const LayerOpSpec& spec) {
  LayerRun run = parse_layer_run(args);
  const std::unique_ptr<LayerProblem> problem = spec.parse(args, run);
  args.finish();
  // auto means cpu for the layer ops; cuda runs where the op has a CUDA form and is refused, with
  // the reason, where it has none.
  if (run.backend == "cuda") {
    const std::string why = problem->cuda_refusal();
    TL_REQUIRE(why.empty(), spec.name << " cannot run on --backend cuda: " << why << " (use --backend cpu)");
  } else {
    TL_REQUIRE(run.transport == "auto", "--transport applies to the CUDA backend only (--backend cuda)");
    run.backend = "cpu";
  }
  if (run.tolerance == 0) run.tolerance = problem->default_tolerance();
  std::printf("%s (backend %s)\n", problem->describe().c_str(), run.backend.c_str());
  return report_cpu_outcome(run.backend == "cuda" ? problem->check_cuda(run) : problem->check_cpu(run),
                            run.tolerance, run.iters);
}

}  // namespace tilelink::cli
