// The MoE layers as layer ops (layer_ops.hpp): moe_ag_gemm, moe_gemm_rs and moe_mlp on the CPU
// backend, checked against the float64 references of compute/cpu_moe.hpp with a fresh routing of the
// chosen pattern every call (the routing tables are dynamic).
#include <algorithm>
#include <random>
#include <sstream>

#include "layer_ops.hpp"
#include "problem.hpp"
#include "tilelink/backend/cpu/moe_ops.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/compute/cpu_moe.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace tilelink::cli {

namespace {

enum class MoeOp { kAgGemm, kGemmRs, kMlp };  // MoeGpuCall::op's values

MoeGpuRun& moe_gpu() {
  static MoeGpuRun run;
  return run;
}

const char* kMoeUsage =
    "[--tokens M] [--hidden H] [--ffn F (total; split evenly over the ranks)] [--experts E] [--topk K] "
    "[--routing uniform|skewed|one-expert|empty-experts] [--m-split c0,c1,...] [--world W] [--dtype bf16|fp16|fp32] "
    "[--seed S] [--iters I] [--tolerance E] [--backend auto|cpu|cuda] "
    "[--transport auto|virtual|peer (cuda: virtual ranks on one GPU, or a GPU a rank; auto: peer where there is a GPU a rank)]";

class MoeProblem final : public LayerProblem {
 public:
  MoeProblem(MoeOp op, const std::string& name, Args& args, const LayerRun& run) : op_(op), name_(name) {
    world_ = run.world;
    dtype_ = run.dtype;
    tokens_ = args.get_int_in("--tokens", 256, 0, int64_t{1} << 24);
    hidden_ = args.get_int_in("--hidden", 256, 1, int64_t{1} << 16);
    ffn_ = args.get_int_in("--ffn", 512, 1, int64_t{1} << 18);
    experts_ = static_cast<int>(args.get_int_in("--experts", 8, 1, 1024));
    topk_ = static_cast<int>(args.get_int_in("--topk", 2, 1, 8));
    TL_REQUIRE(topk_ <= experts_, "--topk must be at most --experts (" << experts_ << "), got " << topk_);
    routing_ = moe_routing_pattern(args.get("--routing", "uniform"));
    TL_REQUIRE(ffn_ >= world_, "--ffn " << ffn_ << " leaves a rank of the " << world_ << " without columns");
    const std::vector<int64_t> split = args.get_int_list("--m-split", {});
    if (split.empty()) {
      tokens_part_ = RowPartition::even(tokens_, world_);
    } else {
      TL_REQUIRE(static_cast<int>(split.size()) == world_,
                 "--m-split has " << split.size() << " counts for --world " << world_);
      tokens_part_ = RowPartition::from_counts(split);
      TL_REQUIRE(tokens_part_.total() == tokens_, "--m-split adds up to " << tokens_part_.total() << ", --tokens is "
                                                                          << tokens_);
    }
    const RowPartition f = RowPartition::even(ffn_, world_);
    for (int r = 0; r < world_; ++r) ffn_r_.push_back(f.size(r));
    TL_REQUIRE(tokens_ * topk_ * std::max(ffn_, hidden_) * world_ <= (int64_t{1} << 34),
               "the layer holds more than 2^34 elements over the ranks; the CPU backend's check is for smaller "
               "layers");
  }

  std::string describe() const override {
    std::ostringstream os;
    os << name_ << ": world " << world_ << ", " << tokens_ << " tokens (";
    for (int r = 0; r < world_; ++r) os << (r ? "," : "") << tokens_part_.size(r);
    os << "), H " << hidden_ << ", F " << ffn_ << " (";
    for (int r = 0; r < world_; ++r) os << (r ? "," : "") << ffn_r_[r];
    os << " a rank), " << experts_ << " experts, top-" << topk_ << ", " << moe_routing_name(routing_)
       << " routing, " << dtype_name(dtype_);
    return os.str();
  }

  double default_tolerance() const override {
    if (dtype_ == DType::kF32) return op_ == MoeOp::kMlp ? 1e-4 : 1e-5;
    return op_ == MoeOp::kAgGemm ? 1e-2 : op_ == MoeOp::kGemmRs ? 2e-2 : 3e-2;
  }

  CpuOutcome check_cpu(const LayerRun& run) const override { return check(run, false); }

  std::string cuda_refusal() const override {
    if (!moe_gpu()) return "this build has no CUDA";
    if (world_ > 32) return "the GPU layers take at most 32 ranks";
    if (dtype_ == DType::kF32) return "the GPU layers are bf16 or fp16";
    if (tokens_ == 0) return "the GPU layers take at least one token";
    if (hidden_ % 8 != 0) return "the GPU layers take --hidden in multiples of 8";
    for (int64_t f : ffn_r_)
      if (f % 8 != 0) return "the GPU layers take each rank's F in multiples of 8 (--ffn a multiple of 8 x --world)";
    return "";
  }
  CpuOutcome check_cuda(const LayerRun& run) const override {
    const std::string why = cuda_refusal();
    TL_REQUIRE(why.empty(), name_ << ": " << why);
    return check(run, true);
  }

 private:
  // run.iters calls of the fused layer and of its unfused baseline, on the CPU backend's world or
  // (gpu) over the ranks of a world on the GPU(s), each against float64 and bit for bit against each
  // other (not required where the GPU's unfused path sums in NCCL's order).
  CpuOutcome check(const LayerRun& run, bool gpu) const {
    std::mt19937_64 rng(run.seed);
    cpu::World world(world_);
    const int W = world_;
    const int64_t h = hidden_, eb = dtype_size(dtype_), rows = tokens_ * topk_;
    // The weights, once: W1_r [E, F_r (x2 for the MLP: gate then up), H], W2_r [E, H, F_r].
    const int64_t w1_rows = op_ == MoeOp::kMlp ? 2 : 1;
    std::vector<std::vector<std::byte>> w1(W), w2(W);
    for (int r = 0; r < W; ++r) {
      if (op_ != MoeOp::kGemmRs) w1[r] = random_matrix(experts_ * w1_rows * ffn_r_[r], h, dtype_, rng);
      if (op_ != MoeOp::kAgGemm) w2[r] = random_matrix(experts_ * h, ffn_r_[r], dtype_, rng);
    }
    std::unique_ptr<cpu::MoeAgGemm> l0;
    std::unique_ptr<cpu::MoeGemmRs> l1;
    std::unique_ptr<cpu::MoeMlp> mlp;
    if (!gpu && op_ == MoeOp::kAgGemm) l0 = std::make_unique<cpu::MoeAgGemm>(world, tokens_part_, h, ffn_r_, experts_, topk_, dtype_, MoeAgGemmConfig{});
    if (!gpu && op_ == MoeOp::kGemmRs) l1 = std::make_unique<cpu::MoeGemmRs>(world, tokens_part_, h, ffn_r_, experts_, topk_, dtype_, MoeGemmRsConfig{});
    if (!gpu && op_ == MoeOp::kMlp) mlp = std::make_unique<cpu::MoeMlp>(world, tokens_part_, h, ffn_r_, experts_, topk_, dtype_);

    CpuOutcome o;
    bool nccl_sums = false;  // the GPU's unfused path summed over ranks in NCCL's order
    std::vector<double> t_fused, t_unfused;
    for (int call = 0; call < run.iters; ++call) {
      // Fresh inputs and routing every call.
      const std::vector<int32_t> ids = moe_draw_routing(rng, tokens_, topk_, experts_, routing_);
      const MoeRouting rt = moe_route(ids, tokens_, topk_, experts_);
      std::vector<float> weights(rows);
      std::uniform_real_distribution<float> unit(0.f, 1.f);
      for (float& v : weights) v = unit(rng);
      std::vector<std::byte> x;
      std::vector<std::vector<std::byte>> h1(W);
      if (op_ == MoeOp::kGemmRs) {
        for (int r = 0; r < W; ++r) h1[r] = random_matrix(rows, ffn_r_[r], dtype_, rng);
      } else {
        x = random_matrix(tokens_, h, dtype_, rng);
      }
      // Outputs: layer 0 [M * topk, F_r] on every rank; the others [M_r, H].
      std::vector<std::vector<std::byte>> fused(W), unfused(W);
      for (int r = 0; r < W; ++r) {
        const int64_t bytes = (op_ == MoeOp::kAgGemm ? rows * ffn_r_[r] : tokens_part_.size(r) * h) * eb;
        fused[r].resize(std::max<int64_t>(bytes, 1)), unfused[r].resize(fused[r].size());
        poison(fused[r]), poison(unfused[r]);
      }
      auto call_op = [&](bool fused_path, std::vector<std::vector<std::byte>>& out) {
        if (gpu) {  // the layer over the ranks of a world on the GPU(s)
          MoeGpuCall c;
          c.op = static_cast<int>(op_);
          c.transport = run.transport;
          c.tokens = tokens_part_, c.hidden = h, c.ffn = ffn_r_, c.experts = experts_, c.topk = topk_;
          c.dtype = dtype_, c.ids = ids.data(), c.weights = weights.data();
          c.x = x.empty() ? nullptr : x.data();
          for (int r = 0; r < W; ++r) {
            c.h1.push_back(h1[r].empty() ? nullptr : h1[r].data());
            c.w1.push_back(w1[r].empty() ? nullptr : w1[r].data());
            c.w2.push_back(w2[r].empty() ? nullptr : w2[r].data());
          }
          std::vector<std::byte*> outs;
          for (auto& o : out) outs.push_back(o.data());
          const MoeGpuResult res = moe_gpu()(c, fused_path, outs);
          nccl_sums = nccl_sums || res.nccl_sums;
          return res.ms;
        }
        auto on_rank = [&](cpu::RankContext& ctx) {
          const int r = ctx.rank;
          const int64_t t0r = tokens_part_.begin(r);
          const int32_t* my_ids = ids.data() + t0r * topk_;
          const float* my_w = weights.data() + t0r * topk_;
          const void* my_x = x.empty() ? nullptr : x.data() + t0r * h * eb;
          if (op_ == MoeOp::kAgGemm) {
            if (fused_path) l0->run(ctx, my_x, my_ids, my_w, w1[r].data(), out[r].data());
            else l0->run_unfused(ctx, my_x, my_ids, my_w, w1[r].data(), out[r].data());
          } else if (op_ == MoeOp::kGemmRs) {  // every rank holds the whole routing
            if (fused_path) l1->run(ctx, h1[r].data(), ids.data(), weights.data(), w2[r].data(), out[r].data());
            else l1->run_unfused(ctx, h1[r].data(), ids.data(), weights.data(), w2[r].data(), out[r].data());
          } else {
            if (fused_path) mlp->run(ctx, my_x, my_ids, my_w, w1[r].data(), w2[r].data(), out[r].data());
            else mlp->run_unfused(ctx, my_x, my_ids, my_w, w1[r].data(), w2[r].data(), out[r].data());
          }
        };
        return time_ms([&] { world.run(on_rank); });
      };
      t_fused.push_back(call_op(true, fused));
      t_unfused.push_back(call_op(false, unfused));
      // float64: layer 0 per rank; the others the ranks' partials summed, each rank its rows.
      std::vector<double> sum;
      if (op_ != MoeOp::kAgGemm) {
        sum.assign(tokens_ * h, 0.0);
        for (int r = 0; r < W; ++r) {
          const std::vector<double> pr =
              op_ == MoeOp::kGemmRs
                  ? moe_layer1_partial_f64(h1[r].data(), rt, w2[r].data(), weights, h, ffn_r_[r], dtype_)
                  : moe_mlp_partial_f64(x.data(), rt, w1[r].data(), w2[r].data(), weights, h, ffn_r_[r], dtype_);
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += pr[i];
        }
      }
      for (int r = 0; r < W; ++r) {
        o.identical = o.identical && fused[r] == unfused[r];
        std::vector<double> ref;
        if (op_ == MoeOp::kAgGemm) {
          if (rows == 0) continue;
          ref = moe_layer0_f64(x.data(), rt, w1[r].data(), h, ffn_r_[r], dtype_);
        } else {
          if (tokens_part_.size(r) == 0) continue;
          ref.assign(sum.begin() + tokens_part_.begin(r) * h, sum.begin() + tokens_part_.end(r) * h);
        }
        o.err_fused = std::max(o.err_fused, relative_error(fused[r].data(), dtype_, ref));
        o.err_unfused = std::max(o.err_unfused, relative_error(unfused[r].data(), dtype_, ref));
      }
    }
    o.t_fused = median(t_fused);
    o.t_unfused = median(t_unfused);
    if (nccl_sums) o.identical_required = false;
    return o;
  }

  MoeOp op_;
  std::string name_;
  int world_ = 1, experts_ = 1, topk_ = 1;
  int64_t tokens_ = 0, hidden_ = 0, ffn_ = 0;
  DType dtype_ = DType::kBF16;
  MoeRoutingPattern routing_ = MoeRoutingPattern::kUniform;
  RowPartition tokens_part_;
  std::vector<int64_t> ffn_r_;
};

LayerOpSpec moe_spec(MoeOp op, const char* name, const char* summary) {
  LayerOpSpec s;
  s.name = name;
  s.summary = summary;
  s.usage = kMoeUsage;
  s.parse = [op, name](Args& args, const LayerRun& run) -> std::unique_ptr<LayerProblem> {
    return std::make_unique<MoeProblem>(op, name, args, run);
  };
  return s;
}

}  // namespace

void attach_moe_gpu(MoeGpuRun run) { moe_gpu() = std::move(run); }

TILELINK_REGISTER_LAYER_OP(moe_spec(MoeOp::kAgGemm, "moe_ag_gemm",
                                    "MoE layer 0: AllGather of tokens and routing + grouped GEMM by expert"));
TILELINK_REGISTER_LAYER_OP(moe_spec(MoeOp::kGemmRs, "moe_gemm_rs",
                                    "MoE layer 1: grouped GEMM + top-k reduce + ReduceScatter"));
TILELINK_REGISTER_LAYER_OP(moe_spec(MoeOp::kMlp, "moe_mlp",
                                    "the whole MoE layer: layer 0, SiLU(gate) * up, layer 1"));

}  // namespace tilelink::cli
