// Sequence-parallel attention (AllGather variant) on the CUDA backend: the plan of
// ops/attention_plan.hpp (shared with the CPU), its comm program on the copy engine and the sm90
// attention engine (compute/sm90/attention.hpp) with a wait before each key/value tile.
//
//   comm program     per rank on the rank's stream: the entry barrier, then per batch entry the
//                    AllGather's pull program over pieces: a piece is a run of a rank's rows at
//                    contiguous positions (its contiguous shard, or each of its zigzag chunks) and
//                    lands at those positions, so the gathered K and V are in position order
//                    whatever the sharding; one move and one announcement a piece (a comm tile),
//                    the copy engine's operations being costly and its queue finite. The own pieces
//                    go first, then rank - 1's, - 2's, ...; under `causal` a piece past the rank's
//                    last query position is never needed and never moved.
//   compute program  per batch entry and query run (a contiguous shard is one run; a zigzag shard
//                    under the mask two, each chunk seeing the keys up to its own end), the engine
//                    on the rank's second stream; its queries at their positions, its key/value
//                    walk from its own last position down (its own rows, ready first); the load
//                    thread waits, per key/value tile, for the K and V comm tiles covering its rows
//                    (bounded, SignalField::kTileReady), each once a block. Ranks sharing a GPU
//                    (virtual): persistent on the rank's SMs less the copies' (there a copy is a
//                    driver kernel on the SMs). A GPU per rank (peer, ipc): a block an item on every
//                    SM, the peers' pieces coming by the copy engines, the own pieces moved and
//                    announced before the engine starts (a copy inside one GPU may take SMs).
//   baseline         AllGather of K and V, then the engine on every SM of the rank, a block an
//                    item, the same runs and walks: the same bits as the fused call. The AllGather
//                    is NCCL's on a GPU per rank (one a batch entry and tensor for contiguous
//                    shards, a broadcast a chunk for zigzag ones: they land at their positions),
//                    else the copy engine's (barrier, every rank's pieces into every rank, barrier).
//
//   cuda::World world({.transport = cuda::Transport::kVirtual, .world_size = 4});
//   cuda::SpAttn op(world, shape, SeqSharding::make(SeqShard::kContiguous, S, 4, segments), DType::kBF16);
//   op.run(q, k, v, o, lse);   // per rank: q[r] [B, S_r, Hq, D], k[r] / v[r] [B, S_r, Hkv, D],
//   world.sync("sp_attn");     // o[r] [B, S_r, Hq, D], lse[r] [B, S_r, Hq] fp32 (or every entry null)
//
// Contiguous (ragged allowed) or zigzag shards, rows in shard order; bf16 or fp16; head_dim 64 or
// 128. CUDA graphs: run() and run_unfused() may be captured, as every fused op's (the first
// captured call switches the op to device-side epochs for good).
#pragma once

#include <memory>
#include <vector>

#include "tilelink/core/dtype.hpp"
#include "tilelink/core/segment_tiling.hpp"
#include "tilelink/ops/attention_plan.hpp"
#include "tilelink/runtime/world.hpp"
#include "tilelink/tune/path_model.hpp"

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
  // The path model's choice (tune/path_model.hpp; every rank the same), and the call on it.
  PathChoice choose(OpPath requested = OpPath::kAuto) const;
  void run_auto(const std::vector<const void*>& q, const std::vector<const void*>& k,
                const std::vector<const void*>& v, const std::vector<void*>& o, const std::vector<float*>& lse,
                OpPath requested = OpPath::kAuto);

  // Parts, for the bench's bounds (eager only): the comm program alone, and then the engines alone
  // (their waits find this call's tiles already there: the engine with its hooks, on its SMs).
  void run_comm_only(const std::vector<const void*>& k, const std::vector<const void*>& v);
  void run_attention_only(const std::vector<const void*>& q, const std::vector<void*>& o,
                          const std::vector<float*>& lse);

 private:
  void check_args(const std::vector<const void*>& q, const std::vector<const void*>& k,
                  const std::vector<const void*>& v, const std::vector<void*>& o,
                  const std::vector<float*>& lse) const;
  // The engine on rank r for every batch entry, on the current stream of the rank's lane: hooked
  // (waits for this call's epoch) or plain.
  void enqueue_attention(int r, const void* q, void* o, float* lse, bool hooked, cudaStream_t stream);
  // Rank r's comm program: the entry barrier and its own pieces (kOwn), the peers' (kPeers), or both.
  enum class Pieces : uint8_t { kAll, kOwn, kPeers };
  void enqueue_comm(int r, const void* k, const void* v, Pieces which = Pieces::kAll);

  // The engine's SMs in a fused call on rank r (the rest are left to the copies).
  int attention_sms(int rank) const;

  World& world_;
  std::vector<SpAttnPlan> plans_;
  SegmentTiling kv_tiles_;  // comm tiles over positions: a rank's segment, or a zigzag chunk
  std::unique_ptr<detail::FusedRuntime> rt_;
};

// Ring attention on the CUDA backend: the RingAttnPlan of ops/attention_plan.hpp (shared with the
// CPU), its ring on the copy engine and the sm90 engine folding each step's block by
// log-sum-exp (AttnArgs::merge).
//
//   comm program     per rank on the rank's stream: the entry barrier, then per step s < W - 1:
//                    wait for block s in receive slot s % 2 (filled), wait until the right
//                    neighbour's slot (s + 1) % 2 is free again (its block forwarded there:
//                    consumed; and folded there: done), copy block s (K and V, every batch entry)
//                    into it and announce it there (filled), then announce block s forwarded
//                    (consumed). Two receive slots a rank; one copy a batch entry and tensor a
//                    step; a block moves on as soon as it is in, while the engine folds.
//   compute program  per step on the rank's second stream: wait for block s, then the engine on
//                    every SM of the rank, a block an item, per batch entry, query run and key
//                    piece of the block's owner (a piece wholly past a query run's last position
//                    under the mask is skipped): the first launch writes O and lse, every later one
//                    folds into them; then announce the step folded (done). The engine never waits
//                    inside a kernel, so the copies (a driver kernel on one GPU) always find SMs.
//   baseline         SpAttn's unfused call: copy-engine AllGather of K and V, then the engine once
//                    over all the keys (not the same bits: one softmax instead of W merged ones).
//
// Shards and types as SpAttn. With lse null the op keeps the log-sum-exp of its merges in a
// buffer of its own. CUDA graphs: run() may be captured.
class RingAttn {
 public:
  RingAttn(World& world, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype);
  ~RingAttn();
  RingAttn(const RingAttn&) = delete;
  RingAttn& operator=(const RingAttn&) = delete;

  const RingAttnPlan& plan(int rank) const { return plans_.at(rank); }

  void run(const std::vector<const void*>& q, const std::vector<const void*>& k,
           const std::vector<const void*>& v, const std::vector<void*>& o, const std::vector<float*>& lse);
  void run_unfused(const std::vector<const void*>& q, const std::vector<const void*>& k,
                   const std::vector<const void*>& v, const std::vector<void*>& o,
                   const std::vector<float*>& lse);
  PathChoice choose(OpPath requested = OpPath::kAuto) const;
  void run_auto(const std::vector<const void*>& q, const std::vector<const void*>& k,
                const std::vector<const void*>& v, const std::vector<void*>& o, const std::vector<float*>& lse,
                OpPath requested = OpPath::kAuto);

  // Parts, for the bench's bounds (eager only): the ring alone (each step announced folded as soon
  // as its block is in), and the engine's steps alone (no waits; the slots hold whatever the last
  // call left: the work, not the values, is what is timed).
  void run_comm_only(const std::vector<const void*>& k, const std::vector<const void*>& v);
  void run_attention_only(const std::vector<const void*>& q, const std::vector<const void*>& k,
                          const std::vector<const void*>& v, const std::vector<void*>& o,
                          const std::vector<float*>& lse);

 private:
  enum class Part : uint8_t { kAll, kComm, kCompute };
  void enqueue_steps(int r, const void* q, const void* k, const void* v, void* o, float* lse, Part part);
  void enqueue_ring(int r, const void* k, const void* v);

  World& world_;
  std::vector<RingAttnPlan> plans_;
  std::unique_ptr<detail::FusedRuntime> rt_;
  std::unique_ptr<SpAttn> gathered_;  // the baseline (and world 1)
  std::vector<void*> own_lse_;        // per rank [B, S_r, Hq] fp32, for calls without lse
};

}  // namespace tilelink::cuda
