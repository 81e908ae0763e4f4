// Sequence-parallel attention as layer ops (layer_ops.hpp): sp_attn (K and V gathered by the
// AllGather plan, each key/value tile waited for) and ring_attn (each rank's block once around the
// ring) on the CPU backend, checked against the float64 attention of the whole sequence
// (compute/cpu_attention.hpp), output and log-sum-exp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "layer_ops.hpp"
#include "problem.hpp"
#include "tilelink/backend/cpu/attention_ops.hpp"
#include "tilelink/compute/cpu_attention.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cli {

namespace {

AttnGpu& attn_gpu() {
  static AttnGpu gpu;
  return gpu;
}

const char* kAttnUsage =
    "[--batch B] [--seq S] [--heads Hq] [--kv-heads Hkv] [--head-dim D] [--causal] "
    "[--shard contiguous|zigzag] [--seq-split|--s-split c0,c1,... (contiguous: each rank's positions)] [--world W] "
    "[--dtype bf16|fp16|fp32] [--seed S] [--iters I] [--tolerance E] [--backend auto|cpu|cuda] "
    "[--transport auto|virtual|peer (cuda: virtual ranks on one GPU, or a GPU a rank; auto: peer where there is a GPU a rank)]";

class AttnProblem final : public LayerProblem {
 public:
  AttnProblem(bool ring, const std::string& name, Args& args, const LayerRun& run) : ring_(ring), name_(name) {
    world_ = run.world;
    dtype_ = run.dtype;
    shape_.batch = static_cast<int>(args.get_int_in("--batch", 1, 1, SpAttnPlan::kMaxBatch));
    shape_.seq = args.get_int_in("--seq", 256, 1, int64_t{1} << 20);
    shape_.heads_q = static_cast<int>(args.get_int_in("--heads", 4, 1, 256));
    shape_.heads_kv = static_cast<int>(args.get_int_in("--kv-heads", 2, 1, 256));
    shape_.head_dim = args.get_int_in("--head-dim", 64, 1, 512);
    shape_.causal = args.flag("--causal");
    const std::string shard = args.get("--shard", "contiguous");
    TL_REQUIRE(shard == "contiguous" || shard == "zigzag", "--shard must be contiguous or zigzag, got '" << shard << "'");
    shape_.shard = shard == "zigzag" ? SeqShard::kZigzag : SeqShard::kContiguous;
    std::vector<int64_t> split = args.get_int_list("--seq-split", {});
    const std::vector<int64_t> s_split = args.get_int_list("--s-split", {});  // the same option, by its other name
    TL_REQUIRE(split.empty() || s_split.empty(), "give --seq-split or --s-split (one option), not both");
    if (split.empty()) split = s_split;
    TL_REQUIRE(split.empty() || shape_.shard == SeqShard::kContiguous,
               "--seq-split applies to contiguous shards (zigzag cuts the sequence in 2W even chunks)");
    if (split.empty() && shape_.shard == SeqShard::kContiguous) {
      const RowPartition even = RowPartition::even(shape_.seq, world_);
      for (int r = 0; r < world_; ++r) split.push_back(even.size(r));
    }
    TL_REQUIRE(split.empty() || static_cast<int>(split.size()) == world_,
               "--seq-split has " << split.size() << " counts for --world " << world_);
    sharding_ = SeqSharding::make(shape_.shard, shape_.seq, world_, split);
    TL_REQUIRE(shape_.batch * shape_.seq * shape_.heads_q * shape_.head_dim <= (int64_t{1} << 28),
               "the queries hold more than 2^28 elements; the CPU backend's check is for smaller problems");
    SpAttnPlan::make(0, shape_, sharding_, dtype_, {});  // checks the heads and batch now, by name
  }

  std::string describe() const override {
    std::ostringstream os;
    os << name_ << ": world " << world_ << ", batch " << shape_.batch << ", S " << shape_.seq
       << " (" << (shape_.shard == SeqShard::kZigzag ? "zigzag" : "contiguous") << ":";
    for (int r = 0; r < world_; ++r) os << (r ? "," : " ") << sharding_.rows.size(r);
    os << "), " << shape_.heads_q << " query heads, " << shape_.heads_kv << " key/value heads, D "
       << shape_.head_dim << (shape_.causal ? ", causal" : "") << ", " << dtype_name(dtype_);
    return os.str();
  }

  double default_tolerance() const override { return dtype_ == DType::kF32 ? 1e-5 : 2e-2; }

  CpuOutcome check_cpu(const LayerRun& run) const override {
    cpu::World world(world_);
    std::unique_ptr<cpu::SpAttn> gather;
    std::unique_ptr<cpu::RingAttn> ring;
    if (ring_) ring = std::make_unique<cpu::RingAttn>(world, shape_, sharding_, dtype_);
    else gather = std::make_unique<cpu::SpAttn>(world, shape_, sharding_, dtype_, SpAttnConfig{});
    return check(run, [&](bool fused, const Shards& qs, const Shards& ks, const Shards& vs, Shards& o_,
                          std::vector<std::vector<float>>& l_) {
      auto on_rank = [&](cpu::RankContext& ctx) {
        const int r = ctx.rank;
        if (ring_ && fused) ring->run(ctx, qs[r].data(), ks[r].data(), vs[r].data(), o_[r].data(), l_[r].data());
        if (ring_ && !fused) ring->run_unfused(ctx, qs[r].data(), ks[r].data(), vs[r].data(), o_[r].data(), l_[r].data());
        if (!ring_ && fused) gather->run(ctx, qs[r].data(), ks[r].data(), vs[r].data(), o_[r].data(), l_[r].data());
        if (!ring_ && !fused) gather->run_unfused(ctx, qs[r].data(), ks[r].data(), vs[r].data(), o_[r].data(), l_[r].data());
      };
      return time_ms([&] { world.run(on_rank); });
    });
  }

  std::string cuda_refusal() const override {
    if (!attn_gpu().refusal) return "it has no CUDA implementation in this build";
    return attn_gpu().refusal(gpu_problem());
  }

  CpuOutcome check_cuda(const LayerRun& run) const override {
    const std::string why = cuda_refusal();
    TL_REQUIRE(why.empty(), name_ << " --backend cuda: " << why);
    AttnGpuProblem problem = gpu_problem();
    problem.transport = run.transport;
    std::unique_ptr<AttnGpuRunner> gpu = attn_gpu().make(problem);
    CpuOutcome o = check(run, [&](bool fused, const Shards& qs, const Shards& ks, const Shards& vs, Shards& o_,
                                  std::vector<std::vector<float>>& l_) { return gpu->run(fused, qs, ks, vs, o_, l_); });
    o.identical_required = !ring_;  // the GPU ring merges W softmaxes; its baseline takes one
    return o;
  }

 private:
  using Shards = std::vector<std::vector<std::byte>>;
  using CallOp = std::function<double(bool fused, const Shards& q, const Shards& k, const Shards& v, Shards& o,
                                      std::vector<std::vector<float>>& lse)>;

  AttnGpuProblem gpu_problem() const { return {ring_, world_, "auto", shape_, sharding_, dtype_}; }

  // run.iters calls of the fused op and of its unfused baseline through call_op, on fresh random
  // inputs, outputs poisoned: fused against unfused bit for bit, both against float64.
  CpuOutcome check(const LayerRun& run, const CallOp& call_op) const {
    std::mt19937_64 rng(run.seed);
    const int W = world_;
    const SpAttnShape& s = shape_;
    const int64_t eb = dtype_size(dtype_), d = s.head_dim, qrow = s.heads_q * d, kvrow = s.heads_kv * d;
    std::vector<int64_t> pos(s.seq);
    std::iota(pos.begin(), pos.end(), 0);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));

    CpuOutcome o;
    std::vector<double> t_fused, t_unfused;
    for (int call = 0; call < run.iters; ++call) {
      // The whole sequence by position, then each rank's rows in shard order.
      const auto q = random_matrix(s.batch * s.seq, qrow, dtype_, rng);
      const auto k = random_matrix(s.batch * s.seq, kvrow, dtype_, rng);
      const auto v = random_matrix(s.batch * s.seq, kvrow, dtype_, rng);
      auto shard_of = [&](const std::vector<std::byte>& all, int64_t row_elems, int r) {
        const int64_t n = sharding_.rows.size(r);
        std::vector<std::byte> out(std::max<int64_t>(s.batch * n * row_elems * eb, 1));
        for (int b = 0; b < s.batch; ++b)
          for (int64_t i = 0; i < n; ++i)
            std::memcpy(out.data() + (b * n + i) * row_elems * eb,
                        all.data() + (b * s.seq + sharding_.position_of(r, i)) * row_elems * eb, row_elems * eb);
        return out;
      };
      std::vector<std::vector<std::byte>> qs(W), ks(W), vs(W), out(W), out2(W);
      std::vector<std::vector<float>> lse(W), lse2(W);
      for (int r = 0; r < W; ++r) {
        qs[r] = shard_of(q, qrow, r), ks[r] = shard_of(k, kvrow, r), vs[r] = shard_of(v, kvrow, r);
        out[r].resize(qs[r].size()), out2[r].resize(qs[r].size());
        poison(out[r]), poison(out2[r]);
        lse[r].assign(std::max<int64_t>(s.batch * sharding_.rows.size(r) * s.heads_q, 1), NAN), lse2[r] = lse[r];
      }
      t_fused.push_back(call_op(true, qs, ks, vs, out, lse));
      t_unfused.push_back(call_op(false, qs, ks, vs, out2, lse2));
      for (int r = 0; r < W; ++r) {
        o.identical = o.identical && out[r] == out2[r] &&
                      std::memcmp(lse[r].data(), lse2[r].data(), lse[r].size() * sizeof(float)) == 0;
      }
      // float64 over the whole sequence, each batch entry; the output's relative error and the
      // log-sum-exp's error relative to 1 + |lse|, the larger of the two.
      for (int b = 0; b < s.batch; ++b) {
        const AttnReference ref = attention_reference_f64(q.data() + b * s.seq * qrow * eb, k.data() + b * s.seq * kvrow * eb,
                                                          v.data() + b * s.seq * kvrow * eb, dtype_, s.seq, s.seq,
                                                          s.heads_q, s.heads_kv, d, pos, scale, s.causal);
        for (int r = 0; r < W; ++r) {
          const int64_t n = sharding_.rows.size(r);
          if (n == 0) continue;
          std::vector<double> want(n * qrow);
          for (int64_t i = 0; i < n; ++i)
            std::copy_n(ref.out.begin() + sharding_.position_of(r, i) * qrow, qrow, want.begin() + i * qrow);
          auto err = [&](const std::vector<std::byte>& o_, const std::vector<float>& l_) {
            double e = relative_error(o_.data() + b * n * qrow * eb, dtype_, want);
            for (int64_t i = 0; i < n; ++i)
              for (int h = 0; h < s.heads_q; ++h) {
                const double w = ref.lse[sharding_.position_of(r, i) * s.heads_q + h];
                const double got = l_[(b * n + i) * s.heads_q + h];
                e = std::max(e, std::isnan(got) ? INFINITY : std::abs(got - w) / (1 + std::abs(w)));
              }
            return e;
          };
          o.err_fused = std::max(o.err_fused, err(out[r], lse[r]));
          o.err_unfused = std::max(o.err_unfused, err(out2[r], lse2[r]));
        }
      }
    }
    o.t_fused = median(t_fused);
    o.t_unfused = median(t_unfused);
    return o;
  }

  bool ring_;
  std::string name_;
  int world_ = 1;
  DType dtype_ = DType::kBF16;
  SpAttnShape shape_;
  SeqSharding sharding_;
};

LayerOpSpec attn_spec(bool ring, const char* name, const char* summary) {
  LayerOpSpec s;
  s.name = name;
  s.summary = summary;
  s.usage = kAttnUsage;
  s.flags = {"--causal"};
  s.parse = [ring, name](Args& args, const LayerRun& run) -> std::unique_ptr<LayerProblem> {
    return std::make_unique<AttnProblem>(ring, name, args, run);
  };
  return s;
}

}  // namespace

void attach_attn_gpu(AttnGpu gpu) { attn_gpu() = std::move(gpu); }

TILELINK_REGISTER_LAYER_OP(attn_spec(false, "sp_attn",
                                     "sequence-parallel attention: AllGather of K and V + attention, tile by tile"));
TILELINK_REGISTER_LAYER_OP(attn_spec(true, "ring_attn",
                                     "ring attention: each rank's K and V block once around the ring, folded as it arrives"));

}  // namespace tilelink::cli
