// Ring attention on the CPU backend (ops/attention_plan.hpp, RingAttnPlan): a comm worker moves
// each block around the ring while the compute workers fold every step's block into their query
// tiles' states.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "tilelink/backend/cpu/attention_ops.hpp"
#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/backend/cpu/workers.hpp"
#include "query_tiles.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

namespace {

// Folds one step's block (the rows of `owner`; batch b's rows at k + b * block_stride bytes) into
// every query tile of the worker.
void fold_block(detail::QueryTiles& tiles, const void* q, const std::byte* k, const std::byte* v,
                int64_t block_stride, int owner) {
  const int64_t rows = tiles.p.sharding.rows.size(owner);
  for (detail::QueryTiles::Unit& u : tiles.units)
    tiles.fold(u, q, k + u.b * block_stride, v + u.b * block_stride, owner, 0, rows);
}

void check_inputs(const RingAttnPlan& p, int rank, const void* q, const void* k, const void* v, const void* o) {
  TL_REQUIRE(p.local_rows() == 0 || (q && k && v && o), "ring_attn: null tensor on rank " << rank);
}

// The block of step s on this rank (of K: slots k_slots, input k; or of V): its own input at step 0,
// else its receive slot s % 2.
const std::byte* block_of(const RingAttnPlan& p, const SymmetricView& heap, int step, ByteField slots,
                          const void* input) {
  return step == 0 ? static_cast<const std::byte*>(input) : heap.local(slots) + (step % 2) * p.slot_bytes();
}

}  // namespace

RingAttn::RingAttn(World& world, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype, int q_tile,
                   int compute_workers) {
  TL_REQUIRE(sharding.rows.world_size == world.size(), "ring_attn: the sharding has " << sharding.rows.world_size
                                                                                       << " ranks, the world " << world.size());
  for (int r = 0; r < world.size(); ++r)
    plans_.push_back(RingAttnPlan::make(r, shape, sharding, dtype, q_tile, compute_workers));
  ws_ = world.allocate(plans_[0].ws_bytes);
  gathered_ = world.allocate(static_cast<uint64_t>(2 * shape.batch * shape.seq * plans_[0].kv_row_bytes()));
  epoch_.assign(world.size(), 0);
}

void RingAttn::run(RankContext& ctx, const void* q, const void* k, const void* v, void* o, float* lse) {
  const RingAttnPlan& p = plans_.at(ctx.rank);
  const uint64_t epoch = ++epoch_[ctx.rank];  // before any check (see AgGemm::run)
  check_inputs(p, ctx.rank, q, k, v, o);
  ctx.op = "ring_attn";
  SymmetricView heap = ws_.view(ctx.rank);
  rank_barrier(ctx, heap, p.barrier, epoch);
  const int W = p.world_size, kw = p.compute_workers, right = (ctx.rank + 1) % W;
  const uint64_t base = p.base(epoch);
  const int64_t rows = p.local_rows(), row_bytes = p.kv_row_bytes();
  // A block's batch entries: dense in an input ([B][S_r] rows), max S_r apart in a slot.
  auto stride_of = [&](int step) { return step == 0 ? rows * row_bytes : p.block_bytes(); };
  run_workers(ctx, {
      {1, [&](int) {  // the ring: receive each step's block, forward it, free its slot
         for (int s = 0; s < p.steps(); ++s) {
           if (s >= 1) consumer_tile_wait(ctx, heap, p.filled, s % 2, base + s, WaitSite{SignalField::kReady, s});
           if (p.forwards(s)) {  // forward block s into the right neighbour's slot (s + 1) % 2
             const int slot = (s + 1) % 2;
             if (s >= 2)  // that slot's block (step s - 1) folded and forwarded by the neighbour
               peer_tile_wait(ctx, heap, right, p.consumed, slot, base + s, WaitSite{SignalField::kConsumed, slot});
             const int owner = p.owner_at(s);
             const int64_t n = p.sharding.rows.size(owner);
             for (int b = 0; b < p.shape.batch; ++b) {
               const int64_t src = b * stride_of(s), dst = slot * p.slot_bytes() + b * p.block_bytes();
               tile_push_data(ctx, right, Copy2D{block_of(p, heap, s, p.k_slots, k) + src, row_bytes,
                                                 heap.peer(right, p.k_slots) + dst, row_bytes, n, row_bytes});
               tile_push_data(ctx, right, Copy2D{block_of(p, heap, s, p.v_slots, v) + src, row_bytes,
                                                 heap.peer(right, p.v_slots) + dst, row_bytes, n, row_bytes});
             }
             peer_tile_notify(ctx, heap, right, p.filled, slot, base + s + 1);
           }
           if (s >= 1) {  // every compute worker has folded step s: its slot may be refilled
             for (int w = 0; w < kw; ++w)
               consumer_tile_wait(ctx, heap, p.done, w, base + s + 1, WaitSite{SignalField::kAck, w});
             producer_tile_notify(ctx, heap, p.consumed, s % 2, base + s + 1);
           }
         }
       }},
      {kw, [&](int w) {
         detail::QueryTiles tiles(p, p.q_tile, w, kw);
         for (int s = 0; s < p.steps(); ++s) {
           if (s >= 1) consumer_tile_wait(ctx, heap, p.filled, s % 2, base + s, WaitSite{SignalField::kReady, s});
           fold_block(tiles, q, block_of(p, heap, s, p.k_slots, k), block_of(p, heap, s, p.v_slots, v), stride_of(s),
                      p.owner_at(s));
           producer_tile_notify(ctx, heap, p.done, w, base + s + 1);
         }
         tiles.finish(o, lse);
       }},
  });
}

void RingAttn::run_unfused(RankContext& ctx, const void* q, const void* k, const void* v, void* o, float* lse) {
  const RingAttnPlan& p = plans_.at(ctx.rank);
  const uint64_t epoch = epoch_[ctx.rank] += 2;
  check_inputs(p, ctx.rank, q, k, v, o);
  ctx.op = "ring_attn(unfused)";
  SymmetricView heap = ws_.view(ctx.rank);
  // AllGather: each rank copies its rows of every batch entry into every rank's [B][S] buffers.
  rank_barrier(ctx, heap, p.barrier, epoch - 1);
  const int64_t rows = p.local_rows(), row_bytes = p.kv_row_bytes(), seq = p.shape.seq;
  const int64_t half = p.shape.batch * seq * row_bytes;  // K, then V
  const int64_t row0 = p.sharding.rows.begin(ctx.rank);
  for (int peer = 0; peer < ctx.world_size; ++peer) {
    auto* g = static_cast<std::byte*>(gathered_.base(peer));
    for (int b = 0; b < p.shape.batch; ++b) {
      rank_copy_data(ctx, peer, Copy2D{static_cast<const std::byte*>(k) + b * rows * row_bytes, row_bytes,
                                       g + (b * seq + row0) * row_bytes, row_bytes, rows, row_bytes});
      rank_copy_data(ctx, peer, Copy2D{static_cast<const std::byte*>(v) + b * rows * row_bytes, row_bytes,
                                       g + half + (b * seq + row0) * row_bytes, row_bytes, rows, row_bytes});
    }
  }
  rank_barrier(ctx, heap, p.barrier, epoch);
  // The same steps' blocks, in the same order, from the gathered buffers.
  const auto* g = static_cast<const std::byte*>(gathered_.base(ctx.rank));
  detail::QueryTiles tiles(p, p.q_tile, 0, 1);
  for (int s = 0; s < p.steps(); ++s) {
    const int owner = p.owner_at(s);
    const int64_t first = p.sharding.rows.begin(owner) * row_bytes;
    fold_block(tiles, q, g + first, g + half + first, seq * row_bytes, owner);
  }
  tiles.finish(o, lse);
}

}  // namespace tilelink::cpu
