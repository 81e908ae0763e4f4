// Sequence-parallel attention (AllGather variant) on the CPU backend: the comm program and the
// compute program of ops/attention_plan.hpp.
#include <algorithm>
#include <cstddef>

#include "tilelink/backend/cpu/attention_ops.hpp"
#include "tilelink/backend/cpu/comm_exec.hpp"
#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/backend/cpu/workers.hpp"
#include "query_tiles.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

namespace {

// The compute program: each of this worker's query tiles (detail::QueryTiles) against the
// key/value comm tiles in the pull order (this rank's first, then rank + 1's, ...). `wait(b, tile)`
// is called before a comm tile's rows are read (the fused path waits on its tile_ready; the unfused
// path has them all).
template <class Wait>
void attention_worker(const SpAttnPlan& p, const SymmetricView& heap, const void* q, void* o, float* lse,
                      int worker, int workers, Wait&& wait) {
  const SegmentTiling& kv_tiles = p.k[0].tiles;  // every batch entry's K and V share the tiling
  const int64_t row_bytes = p.kv_row_bytes();
  detail::QueryTiles tiles(p, p.config.q_tile, worker, workers);
  for (detail::QueryTiles::Unit& u : tiles.units) {
    const int64_t last_q = u.last_pos();
    for (int c = 0; c < kv_tiles.num_tiles(); ++c) {
      const int tile = p.k[u.b].pull_tile_at(c);
      const int owner = kv_tiles.rank_of(tile);
      const int64_t seg0 = p.sharding.rows.begin(owner);
      const RowRange g = kv_tiles.rows_of(tile);  // rows of the gathered buffers
      const int64_t begin = g.begin - seg0, end = g.end - seg0;  // rows of the owner's shard
      // causal: skip (and never wait for) a tile whose every position lies past the query tile's
      bool needed = !p.shape.causal;
      for (int64_t r = begin; r < end && !needed; r += p.sharding.run_from(owner, r))
        needed = p.sharding.position_of(owner, r) <= last_q;
      if (!needed) continue;
      wait(u.b, tile);
      tiles.fold(u, q, heap.local(p.k[u.b].f.gathered) + seg0 * row_bytes,
                 heap.local(p.v[u.b].f.gathered) + seg0 * row_bytes, owner, begin, end);
    }
  }
  tiles.finish(o, lse);
}

void check_inputs(const SpAttnPlan& p, int rank, const void* q, const void* k, const void* v, const void* o) {
  TL_REQUIRE(p.local_rows() == 0 || (q && k && v && o), "sp_attn: null tensor on rank " << rank);
}

}  // namespace

SpAttn::SpAttn(World& world, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype,
               const SpAttnConfig& config) {
  TL_REQUIRE(sharding.rows.world_size == world.size(), "sp_attn: the sharding has " << sharding.rows.world_size
                                                                                     << " ranks, the world " << world.size());
  for (int r = 0; r < world.size(); ++r) plans_.push_back(SpAttnPlan::make(r, shape, sharding, dtype, config));
  ws_ = world.allocate(plans_[0].ws_bytes);
  epoch_.assign(world.size(), 0);
}

void SpAttn::run(RankContext& ctx, const void* q, const void* k, const void* v, void* o, float* lse) {
  const SpAttnPlan& p = plans_.at(ctx.rank);
  // NOTE: the epoch advances before any check (see AgGemm::run).
  const uint64_t epoch = ++epoch_[ctx.rank];
  check_inputs(p, ctx.rank, q, k, v, o);
  ctx.op = "sp_attn";
  SymmetricView heap = ws_.view(ctx.rank);
  rank_barrier(ctx, heap, p.barrier, epoch);
  const int64_t batch_bytes = p.local_rows() * p.kv_row_bytes();
  const int cw = p.config.comm_workers, kw = p.config.compute_workers;
  run_workers(ctx, {
      {cw, [&](int w) {  // batch entry by batch entry, K then V of each
         const CommExec x{ctx, heap};
         for (int b = 0; b < p.shape.batch; ++b) {
           const auto* kb = static_cast<const std::byte*>(k) + b * batch_bytes;
           const auto* vb = static_cast<const std::byte*>(v) + b * batch_bytes;
           for (int i = w; i < p.k[b].count(); i += cw) allgather_item(x, p.k[b], i, epoch, kb);
           for (int i = w; i < p.v[b].count(); i += cw) allgather_item(x, p.v[b], i, epoch, vb);
         }
       }},
      {kw, [&](int w) {
         attention_worker(p, heap, q, o, lse, w, kw, [&](int b, int tile) {
           consumer_tile_wait(ctx, heap, p.k[b].f.tile_ready, tile, epoch, WaitSite{SignalField::kTileReady, tile});
           consumer_tile_wait(ctx, heap, p.v[b].f.tile_ready, tile, epoch, WaitSite{SignalField::kTileReady, tile});
         });
       }},
  });
}

void SpAttn::run_unfused(RankContext& ctx, const void* q, const void* k, const void* v, void* o, float* lse) {
  const SpAttnPlan& p = plans_.at(ctx.rank);
  const uint64_t epoch = epoch_[ctx.rank] += 2;  // two barriers: epoch - 1, then epoch
  check_inputs(p, ctx.rank, q, k, v, o);
  ctx.op = "sp_attn(unfused)";
  SymmetricView heap = ws_.view(ctx.rank);
  rank_barrier(ctx, heap, p.barrier, epoch - 1);
  const RowRange own = p.k[0].own_rows();
  const int64_t batch_bytes = p.local_rows() * p.kv_row_bytes();
  for (int s = 0; s < ctx.world_size; ++s) {
    const int peer = peer_at(ctx.rank, s, ctx.world_size);
    for (int b = 0; b < p.shape.batch; ++b) {
      rank_copy_data(ctx, peer, p.k[b].rows_copy(static_cast<const std::byte*>(k) + b * batch_bytes, own.begin,
                                                 heap.peer(peer, p.k[b].f.gathered), own));
      rank_copy_data(ctx, peer, p.v[b].rows_copy(static_cast<const std::byte*>(v) + b * batch_bytes, own.begin,
                                                 heap.peer(peer, p.v[b].f.gathered), own));
    }
  }
  rank_barrier(ctx, heap, p.barrier, epoch);
  attention_worker(p, heap, q, o, lse, 0, 1, [](int, int) {});
}

}  // namespace tilelink::cpu
