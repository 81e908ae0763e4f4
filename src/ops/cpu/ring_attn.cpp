// Ring attention on the CPU backend (ops/attention_plan.hpp, RingAttnPlan): a comm worker moves
// each block around the ring while the compute workers fold every step's block into their query
// tiles' states.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "tilelink/backend/cpu/attention_ops.hpp"
#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/backend/cpu/workers.hpp"
#include "tilelink/compute/cpu_attention.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

namespace {

// A compute worker's query tiles, their states kept across the steps.
struct Units {
  struct Unit {
    int b, h;
    int64_t i0, n;
    std::vector<int64_t> q_pos;
    AttnTile state;
  };
  std::vector<Unit> units;

  Units(const RingAttnPlan& p, int worker, int workers) {
    const int64_t rows = p.local_rows(), q_tiles = (rows + p.q_tile - 1) / p.q_tile;
    const int64_t count = int64_t{p.shape.batch} * p.shape.heads_q * q_tiles;
    for (int64_t u = worker; u < count; u += workers) {
      const int b = static_cast<int>(u / (int64_t{p.shape.heads_q} * q_tiles));
      const int h = static_cast<int>(u / q_tiles % p.shape.heads_q);
      const int64_t i0 = u % q_tiles * p.q_tile, n = std::min<int64_t>(p.q_tile, rows - i0);
      std::vector<int64_t> pos(n);
      for (int64_t i = 0; i < n; ++i) pos[i] = p.sharding.position_of(p.rank, i0 + i);
      units.push_back({b, h, i0, n, std::move(pos), AttnTile(n, p.shape.head_dim)});
    }
  }

  // Folds one block: the rows of `owner` (every batch entry; batch b's rows at kv + b * block_stride
  // bytes, rows kv_ld elements apart), in runs of contiguous positions.
  void fold(const RingAttnPlan& p, const void* q, const std::byte* k, const std::byte* v, int64_t block_stride,
            int owner) {
    const SpAttnShape& s = p.shape;
    const int64_t eb = dtype_size(p.dtype), d = s.head_dim, ld = int64_t{s.heads_kv} * d;
    const int64_t rows_q = p.local_rows(), rows_kv = p.sharding.rows.size(owner);
    const int group = s.heads_q / s.heads_kv;
    for (Unit& u : units) {
      const auto* qb = static_cast<const std::byte*>(q) + ((int64_t{u.b} * rows_q + u.i0) * s.heads_q + u.h) * d * eb;
      const int64_t off = u.b * block_stride + int64_t{u.h / group} * d * eb;
      for (int64_t r = 0; r < rows_kv;) {
        const int64_t run = p.sharding.run_from(owner, r);
        attn_tile_update(u.state, qb, int64_t{s.heads_q} * d, u.q_pos.data(), k + off + r * ld * eb,
                         v + off + r * ld * eb, ld, p.sharding.position_of(owner, r), run, p.dtype, p.scale,
                         s.causal);
        r += run;
      }
    }
  }

  void finish(const RingAttnPlan& p, void* o, float* lse) {
    const SpAttnShape& s = p.shape;
    const int64_t eb = dtype_size(p.dtype), d = s.head_dim, rows = p.local_rows();
    std::vector<float> tl;
    for (Unit& u : units) {
      tl.resize(u.n);
      attn_tile_finish(u.state, static_cast<std::byte*>(o) + ((int64_t{u.b} * rows + u.i0) * s.heads_q + u.h) * d * eb,
                       int64_t{s.heads_q} * d, tl.data(), p.dtype);
      if (lse)
        for (int64_t i = 0; i < u.n; ++i) lse[(int64_t{u.b} * rows + u.i0 + i) * s.heads_q + u.h] = tl[i];
    }
  }
};

void check_inputs(const RingAttnPlan& p, int rank, const void* q, const void* k, const void* v, const void* o) {
  TL_REQUIRE(p.local_rows() == 0 || (q && k && v && o), "ring_attn: null tensor on rank " << rank);
}

// The block of step s on this rank: its own input at step 0, else its receive slot s % 2.
const std::byte* block_k(const RingAttnPlan& p, const SymmetricView& heap, int step, const void* k) {
  return step == 0 ? static_cast<const std::byte*>(k) : heap.local(p.k_slots) + (step % 2) * p.slot_bytes();
}
const std::byte* block_v(const RingAttnPlan& p, const SymmetricView& heap, int step, const void* v) {
  return step == 0 ? static_cast<const std::byte*>(v) : heap.local(p.v_slots) + (step % 2) * p.slot_bytes();
}

}  // namespace

RingAttn::RingAttn(World& world, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype, int q_tile,
                   int compute_workers) {
  TL_REQUIRE(sharding.rows.world_size == world.size(), "ring_attn: the sharding has " << sharding.rows.world_size
                                                                                       << " ranks, the world " << world.size());
  for (int r = 0; r < world.size(); ++r)
    plans_.push_back(RingAttnPlan::make(r, shape, sharding, dtype, q_tile, compute_workers));
  ws_ = world.allocate(plans_[0].ws_bytes);
  gathered_ = world.allocate(static_cast<uint64_t>(shape.batch * shape.seq * plans_[0].kv_row_bytes() * 2 + 256));
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
         for (int s = 0; s < W; ++s) {
           if (s >= 1) consumer_tile_wait(ctx, heap, p.filled, s % 2, base + s, WaitSite{SignalField::kReady, s});
           if (s + 1 < W) {  // forward block s into the right neighbour's slot (s + 1) % 2
             const int slot = (s + 1) % 2;
             if (s >= 2)  // that slot's block (step s - 1) folded and forwarded by the neighbour
               peer_tile_wait(ctx, heap, right, p.consumed, slot, base + s, WaitSite{SignalField::kConsumed, slot});
             const int owner = p.owner_at(s);
             const int64_t n = p.sharding.rows.size(owner);
             for (int b = 0; b < p.shape.batch; ++b) {
               const int64_t src = b * stride_of(s), dst = slot * p.slot_bytes() + b * p.block_bytes();
               tile_push_data(ctx, right, Copy2D{block_k(p, heap, s, k) + src, row_bytes,
                                                 heap.peer(right, p.k_slots) + dst, row_bytes, n, row_bytes});
               tile_push_data(ctx, right, Copy2D{block_v(p, heap, s, v) + src, row_bytes,
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
         Units units(p, w, kw);
         for (int s = 0; s < W; ++s) {
           if (s >= 1) consumer_tile_wait(ctx, heap, p.filled, s % 2, base + s, WaitSite{SignalField::kReady, s});
           units.fold(p, q, block_k(p, heap, s, k), block_v(p, heap, s, v), stride_of(s), p.owner_at(s));
           producer_tile_notify(ctx, heap, p.done, w, base + s + 1);
         }
         units.finish(p, o, lse);
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
  Units units(p, 0, 1);
  for (int s = 0; s < p.world_size; ++s) {
    const int owner = p.owner_at(s);
    const int64_t first = p.sharding.rows.begin(owner) * row_bytes;
    units.fold(p, q, g + first, g + half + first, seq * row_bytes, owner);
  }
  units.finish(p, o, lse);
}

}  // namespace tilelink::cpu
