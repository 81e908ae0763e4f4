// The whole MoE layer on the CPU backend (backend/cpu/moe_ops.hpp): layer 0, the gated activation,
// layer 1.
#include <cmath>
#include <cstddef>

#include "tilelink/backend/cpu/moe_ops.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

void silu_and_mul_cpu(const void* gate_up, int64_t rows, int64_t f, void* out, DType dtype) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < f; ++j) {
      const float g = load_as_float(gate_up, dtype, i * 2 * f + j);
      const float u = load_as_float(gate_up, dtype, i * 2 * f + f + j);
      store_from_float(out, dtype, i * f + j, g / (1.0f + std::exp(-g)) * u);
    }
}

namespace {

std::vector<int64_t> doubled(const std::vector<int64_t>& f) {
  std::vector<int64_t> d(f);
  for (auto& v : d) {
    TL_REQUIRE(v >= 1 && v <= (int64_t{1} << 29), "moe_mlp: F_r = " << v << " is out of range");
    v *= 2;
  }
  return d;
}

}  // namespace

MoeMlp::MoeMlp(World& world, const RowPartition& tokens, int64_t hidden, const std::vector<int64_t>& ffn_per_rank,
               int experts, int topk, DType dtype, const MoeAgGemmConfig& layer0, const MoeGemmRsConfig& layer1)
    : layer0_(world, tokens, hidden, doubled(ffn_per_rank), experts, topk, dtype, layer0),
      layer1_(world, tokens, hidden, ffn_per_rank, experts, topk, dtype, layer1),
      ffn_(ffn_per_rank),
      dtype_(dtype) {
  const int64_t rows = tokens.total() * topk, eb = dtype_size(dtype);
  gate_up_.resize(world.size());
  act_.resize(world.size());
  for (int r = 0; r < world.size(); ++r) {
    gate_up_[r].resize(static_cast<size_t>(rows * 2 * ffn_[r] * eb));
    act_[r].resize(static_cast<size_t>(rows * ffn_[r] * eb));
  }
}

void MoeMlp::activate(int rank) {
  const int64_t rows = layer0_.plan(rank).rows();
  silu_and_mul_cpu(gate_up_[rank].data(), rows, ffn_[rank], act_[rank].data(), dtype_);
}

void MoeMlp::run(RankContext& ctx, const void* x, const int32_t* topk_ids, const float* topk_weights,
                 const void* w1, const void* w2, void* out) {
  const int r = ctx.rank;
  layer0_.run(ctx, x, topk_ids, topk_weights, w1, gate_up_[r].data());
  activate(r);
  layer1_.run(ctx, act_[r].data(), layer0_.gathered_ids(r), layer0_.gathered_weights(r), w2, out);
}

void MoeMlp::run_unfused(RankContext& ctx, const void* x, const int32_t* topk_ids, const float* topk_weights,
                         const void* w1, const void* w2, void* out) {
  const int r = ctx.rank;
  layer0_.run_unfused(ctx, x, topk_ids, topk_weights, w1, gate_up_[r].data());
  activate(r);
  layer1_.run_unfused(ctx, act_[r].data(), layer0_.gathered_ids(r), layer0_.gathered_weights(r), w2, out);
}

}  // namespace tilelink::cpu
