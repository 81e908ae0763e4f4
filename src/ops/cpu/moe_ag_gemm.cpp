// MoE layer 0 (AllGather + gather + grouped GEMM) on the CPU backend: the comm program and the
// compute program of ops/moe_plan.hpp.
#include <algorithm>
#include <cstddef>
#include <span>

#include "tilelink/backend/cpu/comm_exec.hpp"
#include "tilelink/backend/cpu/moe_ops.hpp"
#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/backend/cpu/workers.hpp"
#include "tilelink/compute/cpu_moe.hpp"
#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

namespace {

std::span<const int32_t> ids_of_call(const MoeAgGemmPlan& p, const SymmetricView& heap) {
  return {reinterpret_cast<const int32_t*>(heap.local(p.ids.f.gathered)),
          static_cast<size_t>(p.rows())};
}

// The routing of a call, its grouped tiles, and the order the compute program walks them in: the
// tile rows by when their tokens arrive (moe_arrival_row_order, the GPU's order too), each row's
// tiles in column order.
struct Routed {
  MoeGroupedTiles tiles;
  std::vector<int> order;  // tile ids, the compute order

  Routed(const MoeAgGemmPlan& p, std::span<const int32_t> ids)
      : tiles(moe_route(ids, p.tokens(), p.topk, p.experts), p.ffn, p.config.tile_m, p.config.tile_n) {
    const MoeRouting& r = tiles.routing;
    order = tiles.tiles_by_rows(moe_arrival_row_order(r.offsets, tiles.first_rows(), p.config.tile_m, r.pair_of_row,
                                                      p.topk, p.x.tiles.parts, p.rank));
  }
};

// Expert e's W1 shard [F_r, H] in w1 [experts, F_r, H].
ExpertWeight w1_of(const MoeAgGemmPlan& p, const void* w1, int e) {
  return {static_cast<const std::byte*>(w1) + int64_t{e} * p.ffn * p.hidden * dtype_size(p.dtype), 0};
}

}  // namespace

MoeAgGemm::MoeAgGemm(World& world, const RowPartition& tokens, int64_t hidden,
                     const std::vector<int64_t>& ffn_per_rank, int experts, int topk, DType dtype,
                     const MoeAgGemmConfig& config) {
  TL_REQUIRE(tokens.world_size == world.size(), "moe_ag_gemm: the token partition has "
                                                    << tokens.world_size << " ranks, the world "
                                                    << world.size());
  TL_REQUIRE(static_cast<int>(ffn_per_rank.size()) == world.size(),
             "moe_ag_gemm: " << ffn_per_rank.size() << " F_r values for a world of " << world.size());
  for (int r = 0; r < world.size(); ++r)
    plans_.push_back(MoeAgGemmPlan::make(r, tokens, hidden, ffn_per_rank[r], experts, topk, dtype, config));
  ws_ = world.allocate(plans_[0].ws_bytes);
  epoch_.assign(world.size(), 0);
  routing_.resize(world.size());
}

void MoeAgGemm::run(RankContext& ctx, const void* x, const int32_t* topk_ids, const float* topk_weights,
                    const void* w1, void* out) {
  const MoeAgGemmPlan& p = plans_.at(ctx.rank);
  // NOTE: the epoch advances before any check: a call refused on one rank must not leave that
  // rank's epoch behind its peers', or every later call would wait on signals that never come.
  const uint64_t epoch = ++epoch_[ctx.rank];
  const bool own_tokens = p.x.own_rows().size() > 0;
  TL_REQUIRE((!own_tokens || (x && topk_ids && topk_weights)) && w1 && (out || p.rows() == 0),
             "moe_ag_gemm: null tensor on rank " << ctx.rank);
  ctx.op = "moe_ag_gemm";
  SymmetricView heap = ws_.view(ctx.rank);
  rank_barrier(ctx, heap, p.barrier, epoch);
  std::unique_ptr<Routed> routed;  // made by compute worker 0, read by the others after `routed`
  const int cw = p.config.comm_workers, kw = p.config.compute_workers;
  run_workers(ctx, {
      {cw, [&](int w) {  // the routing first (every tile of it is needed before any compute)
         const CommExec ex{ctx, heap};
         for (int i = w; i < p.ids.count(); i += cw) allgather_item(ex, p.ids, i, epoch, topk_ids);
         for (int i = w; i < p.x.count(); i += cw) allgather_item(ex, p.x, i, epoch, x);
         for (int i = w; i < p.weights.count(); i += cw) allgather_item(ex, p.weights, i, epoch, topk_weights);
       }},
      {kw, [&](int w) {
         if (w == 0) {
           for (int s = 0; s < p.ids.tiles.num_tiles(); ++s)
             consumer_tile_wait(ctx, heap, p.ids.f.tile_ready, s, epoch, WaitSite{SignalField::kTileReady, s});
           routed = std::make_unique<Routed>(p, ids_of_call(p, heap));
           producer_tile_notify(ctx, heap, p.routed, 0, epoch);
         } else {
           consumer_tile_wait(ctx, heap, p.routed, 0, epoch, WaitSite{SignalField::kReady, 0});
         }
         const MoeGroupedTiles& rt = routed->tiles;
         std::vector<char> arrived(p.x.tiles.num_tiles(), 0);
         for (int j = w; j < static_cast<int>(routed->order.size()); j += kw) {
           const int t = routed->order[j];
           const GroupTileCoord c = rt.grid.coord(t);
           const Rect r = rt.grid.region(c);
           for (int64_t i = r.row; i < r.row + r.rows; ++i) {  // the comm tiles of its tokens
             const int s = p.x.tiles.tile_of_row(rt.tokens[i]);
             if (arrived[s]) continue;
             consumer_tile_wait(ctx, heap, p.x.f.tile_ready, s, epoch, WaitSite{SignalField::kTileReady, t});
             arrived[s] = 1;
           }
           // each row: its token's gathered X times its expert's W1 shard
           moe_grouped_gemm_rect_cpu(heap.local(p.x.f.gathered), p.hidden, rt.tokens, w1_of(p, w1, c.group), r,
                                     out, p.ffn, p.hidden, p.dtype);
         }
       }},
  });
  routing_[ctx.rank] = std::move(routed->tiles.routing);
}

void MoeAgGemm::run_unfused(RankContext& ctx, const void* x, const int32_t* topk_ids,
                            const float* topk_weights, const void* w1, void* out) {
  const MoeAgGemmPlan& p = plans_.at(ctx.rank);
  const uint64_t epoch = epoch_[ctx.rank] += 2;  // two barriers: epoch - 1, then epoch
  const bool own_tokens = p.x.own_rows().size() > 0;
  TL_REQUIRE((!own_tokens || (x && topk_ids && topk_weights)) && w1 && (out || p.rows() == 0),
             "moe_ag_gemm: null tensor on rank " << ctx.rank);
  ctx.op = "moe_ag_gemm(unfused)";
  SymmetricView heap = ws_.view(ctx.rank);
  // The AllGathers: barrier, each rank copies its rows into every rank's buffers, barrier.
  rank_barrier(ctx, heap, p.barrier, epoch - 1);
  const RowRange own = p.x.own_rows();
  for (int s = 0; s < ctx.world_size; ++s) {
    const int peer = peer_at(ctx.rank, s, ctx.world_size);
    rank_copy_data(ctx, peer, p.ids.rows_copy(topk_ids, own.begin, heap.peer(peer, p.ids.f.gathered), own));
    rank_copy_data(ctx, peer, p.x.rows_copy(x, own.begin, heap.peer(peer, p.x.f.gathered), own));
    rank_copy_data(ctx, peer, p.weights.rows_copy(topk_weights, own.begin, heap.peer(peer, p.weights.f.gathered), own));
  }
  rank_barrier(ctx, heap, p.barrier, epoch);
  // The routing, then the whole grouped GEMM.
  MoeGroupedTiles rt(moe_route(ids_of_call(p, heap), p.tokens(), p.topk, p.experts), p.ffn, p.config.tile_m,
                     p.config.tile_n);
  std::vector<ExpertWeight> weights(p.experts);
  for (int e = 0; e < p.experts; ++e) weights[e] = w1_of(p, w1, e);
  moe_grouped_gemm_cpu(heap.local(p.x.f.gathered), p.hidden, rt.tokens, rt.routing.offsets, weights, out, p.ffn,
                       p.ffn, p.hidden, p.dtype);
  routing_[ctx.rank] = std::move(rt.routing);
}

}  // namespace tilelink::cpu
