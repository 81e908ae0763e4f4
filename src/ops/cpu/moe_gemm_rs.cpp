// MoE layer 1 (grouped GEMM + top-k reduce + ReduceScatter) on the CPU backend: the programs of
// ops/moe_plan.hpp's MoeGemmRsPlan.
#include <algorithm>
#include <cstddef>
#include <memory>
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

// The routing of a call and the pair tiles over it.
std::unique_ptr<MoeGroupedTiles> pair_tiles(const MoeGemmRsPlan& p, const int32_t* ids) {
  auto pt = std::make_unique<MoeGroupedTiles>(
      moe_route(std::span<const int32_t>(ids, static_cast<size_t>(p.rows())), p.tokens(), p.topk, p.experts),
      p.hidden, p.config.tile_m, p.config.tile_n);
  TL_REQUIRE(pt->grid.num_tiles() <= p.max_pair_tiles,
             "moe_gemm_rs: the routing gives more pair tiles than the plan holds");
  return pt;
}

// Expert e's W2 shard [H, F_r] in w2 [experts, H, F_r].
ExpertWeight w2_of(const MoeGemmRsPlan& p, const void* w2, int e) {
  return {static_cast<const std::byte*>(w2) + int64_t{e} * p.hidden * p.ffn * dtype_size(p.dtype), 0};
}

void check_inputs(const MoeGemmRsPlan& p, int rank, const void* h1, const int32_t* ids, const float* weights,
                  const void* w2, const void* c) {
  TL_REQUIRE((h1 && ids && weights) || p.rows() == 0, "moe_gemm_rs: null tensor on rank " << rank);
  TL_REQUIRE(w2 && (c || p.rs.rows.size(rank) == 0), "moe_gemm_rs: null tensor on rank " << rank);
}

}  // namespace

MoeGemmRs::MoeGemmRs(World& world, const RowPartition& tokens, int64_t hidden,
                     const std::vector<int64_t>& ffn_per_rank, int experts, int topk, DType dtype,
                     const MoeGemmRsConfig& config) {
  TL_REQUIRE(tokens.world_size == world.size(), "moe_gemm_rs: the token partition has "
                                                    << tokens.world_size << " ranks, the world "
                                                    << world.size());
  TL_REQUIRE(static_cast<int>(ffn_per_rank.size()) == world.size(),
             "moe_gemm_rs: " << ffn_per_rank.size() << " F_r values for a world of " << world.size());
  MoeGemmRsConfig base = config;
  base.mode = CommMode::kPull;
  for (int r = 0; r < world.size(); ++r) {
    plans_.push_back(MoeGemmRsPlan::make(r, tokens, hidden, ffn_per_rank[r], experts, topk, dtype, config));
    baseline_plans_.push_back(MoeGemmRsPlan::make(r, tokens, hidden, ffn_per_rank[r], experts, topk, dtype, base));
  }
  ws_ = world.allocate(plans_[0].ws_bytes);
  // NOTE: allocated here, not on first use: ranks call concurrently.
  baseline_ws_ = world.allocate(baseline_plans_[0].ws_bytes);
  epoch_.assign(world.size(), 0);
  y_.resize(world.size());
  for (int r = 0; r < world.size(); ++r)
    y_[r].resize(static_cast<size_t>(plans_[r].rows() * hidden * dtype_size(dtype)));
}

void MoeGemmRs::run(RankContext& ctx, const void* h1, const int32_t* topk_ids, const float* topk_weights,
                    const void* w2, void* c) {
  const MoeGemmRsPlan& p = plans_.at(ctx.rank);
  // NOTE: the epoch advances before any check (see AgGemm::run).
  const uint64_t epoch = ++epoch_[ctx.rank];
  check_inputs(p, ctx.rank, h1, topk_ids, topk_weights, w2, c);
  ctx.op = "moe_gemm_rs";
  SymmetricView heap = ws_.view(ctx.rank);
  if (p.tokens() == 0) {  // no tokens: every C_r is empty
    rank_barrier(ctx, heap, p.barrier, epoch);
    return;
  }
  // Every rank routes the same ids alike, so a bad id is refused on every rank before any wait.
  const std::unique_ptr<MoeGroupedTiles> pairs = pair_tiles(p, topk_ids);
  const MoeGroupedTiles& pg = *pairs;
  rank_barrier(ctx, heap, p.barrier, epoch);
  std::byte* y = y_[ctx.rank].data();
  // The pair tiles by tile rows in completion order (ops/moe_routing.hpp, the GPU's order too): first
  // the rows of the tokens the reduce takes first.
  const std::vector<int> order = pg.tiles_by_rows(moe_completion_row_order(
      pg.routing.offsets, pg.first_rows(), p.config.tile_m, pg.routing.pair_of_row, p.topk,
      MoeCompletion::make(p.tokens(), p.config.reduce_tile_m, p.reduce_order.start_m)));
  const int cw = p.config.comm_workers, kw = p.config.compute_workers;
  const bool push = p.config.mode == CommMode::kPush;
  const int64_t eb = dtype_size(p.dtype);
  run_workers(ctx, {
      {kw, [&](int w) {
         // the pair tiles (nothing to wait for: H1 is this rank's) in completion order, each announced
         for (int j = w; j < pg.grid.num_tiles(); j += kw) {
           const int t = order[j];
           const GroupTileCoord c = pg.grid.coord(t);  // Y rows: H1 rows times the expert's W2 shard
           moe_grouped_gemm_rect_cpu(h1, p.ffn, {}, w2_of(p, w2, c.group), pg.grid.region(c), y, p.hidden, p.ffn,
                                     p.dtype);
           producer_tile_notify(ctx, heap, p.pair_done, t, epoch);
         }
         // the reduce tiles: after the pair tiles of their tokens' rows, published to the RS
         const CommExec x{ctx, heap};
         std::vector<char> done(pg.grid.num_tiles(), 0);
         std::vector<std::byte> buf(push ? static_cast<size_t>(p.rs.producer.tile_m) * p.rs.producer.tile_n * eb : 0);
         for (int j = w; j < p.reduce_order.count(); j += kw) {
           const TileCoord tc = p.reduce_order.at(j);
           const Rect r = p.rs.producer.region(tc);
           const int n0 = static_cast<int>(r.col / pg.grid.tile_n),
                     n1 = static_cast<int>((r.col + r.cols - 1) / pg.grid.tile_n);
           for (int64_t tok = r.row; tok < r.row + r.rows; ++tok)
             for (int s = 0; s < p.topk; ++s)
               for (int n = n0; n <= n1; ++n) {
                 const int pt = pg.tile_of(pg.routing.row_of_pair[tok * p.topk + s], n);
                 if (done[pt]) continue;
                 consumer_tile_wait(ctx, heap, p.pair_done, pt, epoch, WaitSite{SignalField::kTileDone, pt});
                 done[pt] = 1;
               }
           std::byte* dst = push ? buf.data() : heap.local(p.rs.f.partial) + (r.row * p.hidden + r.col) * eb;
           const int64_t ld = push ? r.cols : p.hidden;
           moe_topk_reduce_rect_cpu(y, p.hidden, pg.routing, topk_weights, r, dst, ld, p.dtype);
           reduce_scatter_publish(x, p.rs, p.rs.producer.linear(tc), dst, ld, epoch);
         }
       }},
      {cw, [&](int w) {  // the ReduceScatter's program
         const CommExec x{ctx, heap};
         for (int j = w; j < p.rs.count(); j += cw) reduce_scatter_item(x, p.rs, j, epoch, c);
       }},
  });
}

void MoeGemmRs::run_unfused(RankContext& ctx, const void* h1, const int32_t* topk_ids,
                            const float* topk_weights, const void* w2, void* c) {
  const MoeGemmRsPlan& p = baseline_plans_.at(ctx.rank);
  const uint64_t epoch = epoch_[ctx.rank] += 2;  // two barriers: epoch - 1, then epoch
  check_inputs(p, ctx.rank, h1, topk_ids, topk_weights, w2, c);
  ctx.op = "moe_gemm_rs(unfused)";
  if (p.tokens() == 0) {  // no tokens: every C_r is empty
    SymmetricView heap = baseline_ws_.view(ctx.rank);
    rank_barrier(ctx, heap, p.barrier, epoch - 1);
    rank_barrier(ctx, heap, p.barrier, epoch);
    return;
  }
  const MoeRouting routing =
      moe_route(std::span<const int32_t>(topk_ids, static_cast<size_t>(p.rows())), p.tokens(), p.topk, p.experts);
  SymmetricView heap = baseline_ws_.view(ctx.rank);
  rank_barrier(ctx, heap, p.barrier, epoch - 1);
  // The whole grouped GEMM, then the whole top-k reduce into this rank's partial.
  const int64_t eb = dtype_size(p.dtype);
  std::vector<ExpertWeight> weights(p.experts);
  for (int e = 0; e < p.experts; ++e) weights[e] = w2_of(p, w2, e);
  std::byte* y = y_[ctx.rank].data();
  moe_grouped_gemm_cpu(h1, p.ffn, {}, routing.offsets, weights, y, p.hidden, p.hidden, p.ffn, p.dtype);
  moe_topk_reduce_cpu(y, p.hidden, routing, std::span<const float>(topk_weights, static_cast<size_t>(p.rows())),
                      heap.local(p.rs.f.partial), p.hidden, p.hidden, p.dtype);
  rank_barrier(ctx, heap, p.barrier, epoch);
  // The ReduceScatter: every source's rows of this rank's segment, summed in rank order.
  const int64_t seg0 = p.rs.rows.begin(ctx.rank);
  sum_sources(
      ctx, p.world_size, [&](int s) { return heap.peer(s, p.rs.f.partial) + seg0 * p.hidden * eb; }, p.hidden, c,
      p.hidden, p.rs.rows.size(ctx.rank), p.hidden, p.dtype);
}

}  // namespace tilelink::cpu
