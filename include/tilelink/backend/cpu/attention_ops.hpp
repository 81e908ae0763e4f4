// Sequence-parallel attention on the CPU backend (the reference of every backend), beside its
// unfused baseline.
//
//   cpu::World world(4);
//   const SeqSharding sh = SeqSharding::make(SeqShard::kZigzag, S, 4, {});
//   cpu::SpAttn op(world, shape, sh, DType::kBF16, cfg);
//   world.run([&](cpu::RankContext& ctx) {
//     op.run(ctx, q[ctx.rank], k[ctx.rank], v[ctx.rank], o[ctx.rank], lse[ctx.rank]);
//   });
#pragma once

#include <vector>

#include "tilelink/backend/cpu/world.hpp"
#include "tilelink/ops/attention_plan.hpp"

namespace tilelink::cpu {

class SpAttn {
 public:
  SpAttn(World& world, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype,
         const SpAttnConfig& config);
  const SpAttnPlan& plan(int rank) const { return plans_.at(rank); }
  // Rank ctx.rank, its S_r positions in shard order: q = [B, S_r, Hq, D], k and v = [B, S_r, Hkv, D],
  // o = [B, S_r, Hq, D] (dtype), lse = [B, S_r, Hq] fp32 (may be null).
  void run(RankContext& ctx, const void* q, const void* k, const void* v, void* o, float* lse);
  // The unfused baseline: whole AllGathers of K and V (barrier, copies, barrier), then the same
  // attention over the gathered K and V, key/value tiles in the same order. Bit-identical to run().
  void run_unfused(RankContext& ctx, const void* q, const void* k, const void* v, void* o, float* lse);

 private:
  std::vector<SpAttnPlan> plans_;
  SymmetricAllocation ws_;
  std::vector<uint64_t> epoch_;
};

// Ring attention: the blocks of K and V go once around the ring while each step is folded into the
// queries' state (ops/attention_plan.hpp, RingAttnPlan).
class RingAttn {
 public:
  RingAttn(World& world, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype, int q_tile = 64,
           int compute_workers = 1);
  const RingAttnPlan& plan(int rank) const { return plans_.at(rank); }
  // As SpAttn::run.
  void run(RankContext& ctx, const void* q, const void* k, const void* v, void* o, float* lse);
  // The unfused baseline: whole AllGathers of K and V, then the same steps' blocks folded in the
  // same order. Bit-identical to run().
  void run_unfused(RankContext& ctx, const void* q, const void* k, const void* v, void* o, float* lse);

 private:
  std::vector<RingAttnPlan> plans_;
  SymmetricAllocation ws_;
  std::vector<uint64_t> epoch_;
  // The baseline's gathered K and V: [B][S][Hkv * D] per rank, in rank order (as SpAttn's).
  SymmetricAllocation gathered_;
};

}  // namespace tilelink::cpu
