// AG+GEMM on the CPU backend: the comm program and the compute program of ops/ag_gemm_plan.hpp.
#include <cstddef>

#include "tilelink/backend/cpu/comm_exec.hpp"
#include "tilelink/backend/cpu/ops.hpp"
#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/backend/cpu/workers.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

namespace {

// compute program: every gemm tile, in the local-first order, after the comm tiles it covers.
void compute_worker(RankContext& ctx, const AgGemmPlan& p, const SymmetricView& heap,
                    const void* b, void* c, uint64_t epoch, int worker, int workers) {
  const std::byte* gathered = heap.local(p.ag.f.gathered);
  const int64_t eb = dtype_size(p.dtype);
  for (int i = worker; i < p.compute_order.count(); i += workers) {
    TileCoord tile = p.compute_order.at(i);
    IdRange waits = p.waits_for(tile);
    for (int s = waits.begin; s < waits.end; ++s)
      consumer_tile_wait(ctx, heap, p.ag.f.tile_ready, s, epoch,
                         WaitSite{SignalField::kTileReady, p.gemm.linear(tile)});
    Rect r = p.gemm.region(tile);
    gemm_tile_cpu(gathered + r.row * p.k * eb, p.k, static_cast<const std::byte*>(b) + r.col * p.k * eb,
                  p.k, static_cast<std::byte*>(c) + (r.row * p.n + r.col) * eb, p.n, p.dtype, r.rows,
                  r.cols, p.k);
  }
}

}  // namespace

AgGemm::AgGemm(World& world, const RowPartition& rows, const std::vector<int64_t>& n_per_rank,
               int64_t k, DType dtype, const AgGemmConfig& config) {
  TL_REQUIRE(rows.world_size == world.size(), "ag_gemm: the row partition has "
                                                  << rows.world_size << " ranks, the world "
                                                  << world.size());
  TL_REQUIRE(static_cast<int>(n_per_rank.size()) == world.size(),
             "ag_gemm: " << n_per_rank.size() << " N_r values for a world of " << world.size());
  TL_REQUIRE(config.comm_workers >= 1 && config.compute_workers >= 1,
             "ag_gemm: the CPU backend needs at least one comm and one compute worker");
  for (int r = 0; r < world.size(); ++r)
    plans_.push_back(AgGemmPlan::make(r, rows, n_per_rank[r], k, dtype, config));
  ws_ = world.allocate(plans_[0].ws.num_bytes);
  epoch_.assign(world.size(), 0);
}

void AgGemm::run(RankContext& ctx, const void* a, const void* b, void* c) {
  const AgGemmPlan& p = plans_.at(ctx.rank);
  // NOTE: the epoch advances before any check: a call refused on one rank must not leave that
  // rank's epoch behind its peers', or every later call would wait on signals that never come.
  const uint64_t epoch = ++epoch_[ctx.rank];
  TL_REQUIRE((a || p.ag.own_rows().size() == 0) && b && c, "ag_gemm: null tensor on rank " << ctx.rank);
  ctx.op = "ag_gemm";
  SymmetricView heap = ws_.view(ctx.rank);
  // Entry barrier: every peer has finished the previous call, so its buffers may be overwritten.
  rank_barrier(ctx, heap, p.ws.barrier, epoch);
  const int cw = p.config.comm_workers, kw = p.config.compute_workers;
  run_workers(ctx, {
      {cw, [&](int w) {  // the AllGather's program (comm/allgather.hpp), items strided over the workers
         const CommExec x{ctx, heap};
         for (int i = w; i < p.ag.count(); i += cw) allgather_item(x, p.ag, i, epoch, a);
       }},
      {kw, [&](int w) { compute_worker(ctx, p, heap, b, c, epoch, w, kw); }},
  });
}

void AgGemm::run_unfused(RankContext& ctx, const void* a, const void* b, void* c) {
  const AgGemmPlan& p = plans_.at(ctx.rank);
  // NOTE: the epoch advances before any check: a call refused on one rank must not leave that
  // rank's epoch behind its peers', or every later call would wait on signals that never come.
  const uint64_t epoch = epoch_[ctx.rank] += 2;  // two barriers: epoch - 1, then epoch
  TL_REQUIRE((a || p.ag.own_rows().size() == 0) && b && c, "ag_gemm: null tensor on rank " << ctx.rank);
  ctx.op = "ag_gemm(unfused)";
  SymmetricView heap = ws_.view(ctx.rank);
  // AllGather: barrier, each rank copies its segment into every rank's buffer, barrier.
  rank_barrier(ctx, heap, p.ws.barrier, epoch - 1);
  const RowRange own = p.ag.own_rows();
  for (int s = 0; s < ctx.world_size; ++s) {
    int peer = peer_at(ctx.rank, s, ctx.world_size);
    rank_copy_data(ctx, peer, p.ag.rows_copy(a, own.begin, heap.peer(peer, p.ag.f.gathered), own));
  }
  rank_barrier(ctx, heap, p.ws.barrier, epoch);
  // GEMM: the whole [M, N_r] output at once.
  gemm_tile_cpu(heap.local(p.ag.f.gathered), p.k, b, p.k, c, p.n, p.dtype, p.m(), p.n, p.k);
}

}  // namespace tilelink::cpu
