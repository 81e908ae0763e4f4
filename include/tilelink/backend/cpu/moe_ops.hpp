// The MoE ops on the CPU backend (the reference of every backend), each beside its unfused
// baseline.
//
//   cpu::World world(2);
//   cpu::MoeAgGemm op(world, RowPartition::even(M, 2), H, /*ffn_per_rank=*/{f0, f1}, E, topk,
//                     DType::kBF16, cfg);
//   world.run([&](cpu::RankContext& ctx) {
//     op.run(ctx, x[ctx.rank], topk_ids[ctx.rank], topk_weights[ctx.rank], w1[ctx.rank], out[ctx.rank]);
//   });
//   const MoeRouting& routing = op.routing(0);  // the grouped rows' layout of the last call
#pragma once

#include <cstddef>
#include <vector>

#include "tilelink/backend/cpu/world.hpp"
#include "tilelink/ops/moe_plan.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace tilelink::cpu {

// Layer 0 of a tensor-parallel MoE layer: AllGather of the tokens and their routing, then the
// grouped GEMM of every (token, slot) pair with this rank's shard of its expert's W1.
class MoeAgGemm {
 public:
  // ffn_per_rank[r] = F_r, the rows of each expert's W1 shard on rank r.
  MoeAgGemm(World& world, const RowPartition& tokens, int64_t hidden,
            const std::vector<int64_t>& ffn_per_rank, int experts, int topk, DType dtype,
            const MoeAgGemmConfig& config);
  const MoeAgGemmPlan& plan(int rank) const { return plans_.at(rank); }
  // Rank ctx.rank: x = X_r [M_r, H], topk_ids = [M_r, topk] int32, topk_weights = [M_r, topk] fp32
  // (gathered only), w1 = [experts, F_r, H], out = [M * topk, F_r], its rows in the grouped order
  // of routing(rank). An id outside [0, experts) is refused (tilelink::Error naming the token and
  // slot) on every rank alike.
  void run(RankContext& ctx, const void* x, const int32_t* topk_ids, const float* topk_weights,
           const void* w1, void* out);
  // The unfused baseline: the whole AllGathers (barrier, copies, barrier), the routing, then the
  // whole grouped GEMM. Bit-identical to run().
  void run_unfused(RankContext& ctx, const void* x, const int32_t* topk_ids, const float* topk_weights,
                   const void* w1, void* out);
  // The routing of rank `rank`'s last call (the same tables on every rank).
  const MoeRouting& routing(int rank) const { return routing_.at(rank); }
  // Every token's routing as rank `rank` gathered it in its last call, [M, topk] (valid until its
  // next call): what layer 1 takes.
  const int32_t* gathered_ids(int rank) const {
    return reinterpret_cast<const int32_t*>(plans_[rank].ids.f.gathered.in(ws_.base(rank)));
  }
  const float* gathered_weights(int rank) const {
    return reinterpret_cast<const float*>(plans_[rank].weights.f.gathered.in(ws_.base(rank)));
  }

 private:
  std::vector<MoeAgGemmPlan> plans_;
  SymmetricAllocation ws_;
  std::vector<uint64_t> epoch_;        // per rank; each rank thread touches only its own entry
  std::vector<MoeRouting> routing_;    // per rank, likewise
};

// Layer 1: the grouped GEMM of every pair's H1 row with this rank's shard of its expert's W2, the
// top-k reduce per token, and the ReduceScatter of the partials over the ranks.
class MoeGemmRs {
 public:
  // ffn_per_rank[r] = F_r, the columns of each expert's W2 shard on rank r.
  MoeGemmRs(World& world, const RowPartition& tokens, int64_t hidden,
            const std::vector<int64_t>& ffn_per_rank, int experts, int topk, DType dtype,
            const MoeGemmRsConfig& config);
  const MoeGemmRsPlan& plan(int rank) const { return plans_.at(rank); }
  // Rank ctx.rank: h1 = [M * topk, F_r] in the grouped order of the routing of topk_ids,
  // topk_ids = [M, topk] int32 and topk_weights = [M, topk] fp32 (every token's, the same on every
  // rank), w2 = [experts, H, F_r], c = C_r [M_r, H].
  void run(RankContext& ctx, const void* h1, const int32_t* topk_ids, const float* topk_weights,
           const void* w2, void* c);
  // The unfused baseline: the whole grouped GEMM, the whole top-k reduce, a barrier, then each
  // rank's rows summed over the ranks. Bit-identical to run().
  void run_unfused(RankContext& ctx, const void* h1, const int32_t* topk_ids, const float* topk_weights,
                   const void* w2, void* c);

 private:
  std::vector<MoeGemmRsPlan> plans_, baseline_plans_;  // the baseline: pull (whole partials)
  SymmetricAllocation ws_, baseline_ws_;
  std::vector<uint64_t> epoch_;
  std::vector<std::vector<std::byte>> y_;  // per rank: Y [M * topk, H], the grouped GEMM's output
};

// The whole MoE layer: layer 0 into [M * topk, 2 F_r] (each expert's W1 shard holds its gate rows
// then its up rows), the gated activation SiLU(gate) · up (fp32, rounded once) into
// [M * topk, F_r], then layer 1 on the routing layer 0 gathered.
class MoeMlp {
 public:
  MoeMlp(World& world, const RowPartition& tokens, int64_t hidden, const std::vector<int64_t>& ffn_per_rank,
         int experts, int topk, DType dtype, const MoeAgGemmConfig& layer0 = {},
         const MoeGemmRsConfig& layer1 = {});
  // Rank ctx.rank: x = X_r [M_r, H], topk_ids / topk_weights = [M_r, topk] (int32 / fp32),
  // w1 = [experts, 2 F_r, H], w2 = [experts, H, F_r], out = [M_r, H].
  void run(RankContext& ctx, const void* x, const int32_t* topk_ids, const float* topk_weights,
           const void* w1, const void* w2, void* out);
  // Both layers' unfused baselines, the same activation. Bit-identical to run().
  void run_unfused(RankContext& ctx, const void* x, const int32_t* topk_ids, const float* topk_weights,
                   const void* w1, const void* w2, void* out);
  const MoeAgGemm& layer0() const { return layer0_; }

 private:
  void activate(int rank);
  MoeAgGemm layer0_;
  MoeGemmRs layer1_;
  std::vector<int64_t> ffn_;
  DType dtype_;
  std::vector<std::vector<std::byte>> gate_up_, act_;  // per rank: [M * topk, 2 F_r], [M * topk, F_r]
};

// The gated activation of one row set: out[i, j] = SiLU(gate_up[i, j]) · gate_up[i, f + j], fp32,
// rounded once to dtype. gate_up [rows, 2 f], out [rows, f].
void silu_and_mul_cpu(const void* gate_up, int64_t rows, int64_t f, void* out, DType dtype);

}  // namespace tilelink::cpu
