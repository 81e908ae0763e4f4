// Sequence-parallel attention (AllGather variant) on the CUDA backend: the plan of
// ops/attention_plan.hpp (shared with the CPU), its comm program on the copy engine and the sm90
// attention engine (compute/sm90/attention.hpp) with a wait before each key/value tile.
//
//   comm program     per rank on the rank's stream: the entry barrier, then per batch entry each
//                    rank's segment of K and of V by the AllGather plan's pull program
//                    (comm/allgather.hpp; a comm tile is a whole segment: one move and one
//                    announcement, the copy engine's operations being costly and its queue finite),
//                    in the order the attention walks them: this rank's rows first, then rank -
//                    1's, - 2's, ... Under `causal` the rows of later ranks are never needed and
//                    never moved.
//   compute program  per batch entry, the engine on the rank's second stream, persistent on the
//                    rank's SMs less the copies' spare ones: its queries at their positions
//                    (q_pos0 = the shard's first), the gathered K and V at theirs, its key/value
//                    walk from the shard's last row down (the own rows, ready first); the load
//                    thread waits, per key/value tile, for the K and V comm tiles covering its rows
//                    (bounded, SignalField::kTileReady), each about once a block.
//   baseline         copy-engine AllGather of K and V (barrier, copies, barrier), then the engine
//                    on every SM of the rank, the same walk: the same bits as the fused call.
//
//   cuda::World world({.transport = cuda::Transport::kVirtual, .world_size = 4});
//   cuda::SpAttn op(world, shape, SeqSharding::make(SeqShard::kContiguous, S, 4, segments), DType::kBF16);
//   op.run(q, k, v, o, lse);   // per rank: q[r] [B, S_r, Hq, D], k[r] / v[r] [B, S_r, Hkv, D],
//   world.sync("sp_attn");     // o[r] [B, S_r, Hq, D], lse[r] [B, S_r, Hq] fp32 (or every entry null)
//
// Contiguous shards (ragged allowed); bf16 or fp16; head_dim 64 or 128. Zigzag shards run on the
// CPU backend only (their gathered rows are not in position order, which the engine's mask
// assumes). CUDA graphs: run() and run_unfused() may be captured, as every fused op's (the first
// captured call switches the op to device-side epochs for good).
#pragma once

#include <memory>
#include <vector>

#include "tilelink/core/dtype.hpp"
#include "tilelink/ops/attention_plan.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda {

namespace detail {
class FusedRuntime;
}

class SpAttn {
 public:
  // Checks the shape and sharding (tilelink::Error): contiguous shards, head_dim 64 or 128, bf16 or
  // fp16, the engine's limits.
  SpAttn(World& world, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype);
  ~SpAttn();
  SpAttn(const SpAttn&) = delete;
  SpAttn& operator=(const SpAttn&) = delete;

  const SpAttnPlan& plan(int rank) const { return plans_.at(rank); }

  // One call on every local rank (vectors indexed by rank; non-local entries ignored). lse: every
  // local entry null (not written) or every one given. Ordered on world.stream(r).
  void run(const std::vector<const void*>& q, const std::vector<const void*>& k,
           const std::vector<const void*>& v, const std::vector<void*>& o, const std::vector<float*>& lse);
  void run_unfused(const std::vector<const void*>& q, const std::vector<const void*>& k,
                   const std::vector<const void*>& v, const std::vector<void*>& o,
                   const std::vector<float*>& lse);

  // Parts, for the bench's bounds (eager only): the comm program alone, and then the engines alone
  // (their waits find this call's tiles already there: the engine with its hooks, on its SMs).
  void run_comm_only(const std::vector<const void*>& k, const std::vector<const void*>& v);
  void run_attention_only(const std::vector<const void*>& q, const std::vector<void*>& o,
                          const std::vector<float*>& lse);

  // The engine's SMs in a fused call on `rank` (the rest are left to the copy engine's copies).
  int attention_sms(int rank) const;

 private:
  void check_args(const std::vector<const void*>& q, const std::vector<const void*>& k,
                  const std::vector<const void*>& v, const std::vector<void*>& o,
                  const std::vector<float*>& lse) const;
  // The engine on rank r for every batch entry, on the current stream of the rank's lane: hooked
  // (waits for this call's epoch) or plain.
  void enqueue_attention(int r, const void* q, void* o, float* lse, bool hooked, int sms, cudaStream_t stream);
  void enqueue_comm(int r, const void* k, const void* v);

  World& world_;
  std::vector<SpAttnPlan> plans_;
  std::unique_ptr<detail::FusedRuntime> rt_;
};

}  // namespace tilelink::cuda
