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
#include "tilelink/core/partition.hpp"
#include "tilelink/ops/attention_plan.hpp"

namespace tilelink::cli {

// The options every layer op takes.
struct LayerRun {
  std::string backend = "auto";
  int world = 2;
  DType dtype = DType::kBF16;
  uint64_t seed = 1;
  int iters = 3;
  double tolerance = 0;  // 0: the problem's default
  std::string transport = "auto";  // cuda: auto|virtual|peer (bench_world.hpp's one_process_transport)
};

class LayerProblem {
 public:
  virtual ~LayerProblem() = default;
  virtual std::string describe() const = 0;
  // The relative float64 error a correct run stays under (dtype-dependent).
  virtual double default_tolerance() const = 0;
  // run.iters calls of the fused op and of its unfused baseline on the CPU backend, checked.
  virtual CpuOutcome check_cpu(const LayerRun& run) const = 0;
  // The same on the GPU (--backend cuda), where this build and the problem have a CUDA form;
  // cuda_refusal() says why not (empty: it has).
  virtual std::string cuda_refusal() const { return "it has no CUDA implementation in this build"; }
  virtual CpuOutcome check_cuda(const LayerRun& run) const;
};

// The GPU side of the MoE layer ops (layer_moe_cuda.cu; a CUDA build's attach_cuda_ops attaches
// it): one layer's call on one GPU, its output copied back.
struct MoeGpuCall {
  int op = 0;  // 0: moe_ag_gemm, 1: moe_gemm_rs, 2: moe_mlp
  std::string transport = "auto";    // virtual ranks on one GPU, or peer (a GPU a rank)
  RowPartition tokens;               // M over the ranks
  int64_t hidden = 0;
  std::vector<int64_t> ffn;          // F_r per rank
  int experts = 0, topk = 0;
  DType dtype = DType::kBF16;
  const int32_t* ids = nullptr;      // [M, topk], every token's
  const float* weights = nullptr;    // [M, topk]
  const std::byte* x = nullptr;      // [M, H] (layer 0, mlp)
  std::vector<const std::byte*> h1;  // per rank [M * topk, F_r] (layer 1)
  std::vector<const std::byte*> w1;  // per rank [E, F_r (2 F_r: mlp), H]
  std::vector<const std::byte*> w2;  // per rank [E, H, F_r]
};
// Runs the call (fused or the unfused pipeline) into out[r] (host; layer 0 [M * topk, F_r], the
// others [M_r, H]) and returns the call's milliseconds (host clock, to the world's sync) and
// whether its unfused path sums over ranks in NCCL's order (layer 1 and the MLP on a GPU a rank:
// then fused and unfused are not bit for bit the same).
struct MoeGpuResult {
  double ms = 0;
  bool nccl_sums = false;
};
using MoeGpuRun =
    std::function<MoeGpuResult(const MoeGpuCall& call, bool fused, const std::vector<std::byte*>& out)>;
void attach_moe_gpu(MoeGpuRun run);
void attach_moe_layers_cuda();  // layer_moe_cuda.cu (CUDA builds): attach_moe_gpu(the GPU's run)

// The GPU side of the attention layer ops (layer_attention_cuda.cu): a world of `world` ranks
// (virtual ranks on one GPU, or a GPU a rank: `transport`) and the op, made once per check; run() copies every rank's shards in, runs the
// fused call or its unfused baseline, copies o and lse ([B, S_r, Hq]) back, and returns the call's
// GPU milliseconds. cuda_refusal(): empty where the build and the problem have a CUDA form.
struct AttnGpuProblem {
  bool ring = false;
  int world = 1;
  std::string transport = "auto";
  SpAttnShape shape;
  SeqSharding sharding;
  DType dtype = DType::kBF16;
};
class AttnGpuRunner {
 public:
  virtual ~AttnGpuRunner() = default;
  virtual double run(bool fused, const std::vector<std::vector<std::byte>>& q,
                     const std::vector<std::vector<std::byte>>& k, const std::vector<std::vector<std::byte>>& v,
                     std::vector<std::vector<std::byte>>& o, std::vector<std::vector<float>>& lse) = 0;
};
struct AttnGpu {
  std::function<std::string(const AttnGpuProblem&)> refusal;
  std::function<std::unique_ptr<AttnGpuRunner>(const AttnGpuProblem&)> make;
};
void attach_attn_gpu(AttnGpu gpu);
void attach_attention_layers_cuda();  // layer_attention_cuda.cu (CUDA builds)

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

// Reads LayerRun's options (--backend, --world, --dtype, --seed, --iters, --tolerance, --transport).
LayerRun parse_layer_run(Args& args);
// `tilelink run <layer op>`: parse, describe, check on the CPU, report; exit code 0 only if every
// check passes.
int run_layer_command(Args& args, const LayerOpSpec& spec);

}  // namespace tilelink::cli

#define TILELINK_REGISTER_LAYER_OP(spec_expr)                          \
  static const bool TL_CLI_CAT(tl_registered_layer_op_, __LINE__) = \
      ::tilelink::cli::register_layer_op(spec_expr)
