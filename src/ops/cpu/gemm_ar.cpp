// GEMM+AR on the CPU backend: the GEMM's tiles produce the AllReduce of comm/allreduce.hpp, whose
// programs run here through the CPU executor (backend/cpu/comm_exec.hpp), the same code the GPU
// warps run.
#include <cstddef>

#include "tilelink/backend/cpu/comm_exec.hpp"
#include "tilelink/backend/cpu/ops.hpp"
#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/backend/cpu/workers.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

namespace {

void gemm_rect(const GemmArPlan& p, const void* a, const void* b, const Rect& r, void* partial) {
  const int64_t eb = p.elem_bytes();
  gemm_tile_cpu(static_cast<const std::byte*>(a) + r.row * p.k * eb, p.k,
                static_cast<const std::byte*>(b) + r.col * p.k * eb, p.k,
                static_cast<std::byte*>(partial) + (r.row * p.n + r.col) * eb, p.n, p.dtype, r.rows,
                r.cols, p.k);
}

// compute program: every gemm tile into this rank's partial, in the compute order, announced.
void compute_worker(RankContext& ctx, const GemmArPlan& p, const SymmetricView& heap, const void* a,
                    const void* b, uint64_t epoch, int worker, int workers) {
  for (int i = worker; i < p.compute_order.count(); i += workers) {
    const TileCoord tile = p.compute_order.at(i);
    gemm_rect(p, a, b, p.gemm.region(tile), heap.local(p.ar.f.partial));
    producer_tile_notify(ctx, heap, p.ar.f.tile_done, p.gemm.linear(tile), epoch);
  }
}

// comm program: this worker's reduce items, then (two-shot) its gather items.
void allreduce_worker(RankContext& ctx, const GemmArPlan& p, const SymmetricView& heap, void* c,
                      uint64_t epoch, int worker, int workers) {
  const CommExec x{ctx, heap};
  for (int j = worker; j < p.ar.reduce_count(); j += workers) allreduce_reduce_item(x, p.ar, j, epoch, c);
  for (int i = worker; i < p.ar.gather_count(); i += workers) allreduce_gather_item(x, p.ar, i, epoch, c);
}

}  // namespace

GemmAr::GemmAr(World& world, const RowPartition& rows, int64_t n, const std::vector<int64_t>& k_per_rank,
               DType dtype, const GemmArConfig& config) {
  TL_REQUIRE(rows.world_size == world.size(), "gemm_ar: the row partition has " << rows.world_size
                                                                                << " ranks, the world "
                                                                                << world.size());
  TL_REQUIRE(static_cast<int>(k_per_rank.size()) == world.size(),
             "gemm_ar: " << k_per_rank.size() << " K_r values for a world of " << world.size());
  TL_REQUIRE(config.comm_workers >= 0 && config.compute_workers >= 0,
             "gemm_ar: worker counts must be >= 0 (0: one thread), got " << config.comm_workers << " and "
                                                                      << config.compute_workers);
  GemmArConfig cfg = config;
  cfg.comm_workers = cfg.comm_workers == 0 ? 1 : cfg.comm_workers;
  cfg.compute_workers = cfg.compute_workers == 0 ? 1 : cfg.compute_workers;
  for (int r = 0; r < world.size(); ++r) plans_.push_back(GemmArPlan::make(r, rows, n, k_per_rank[r], dtype, cfg));
  ws_ = world.allocate(plans_[0].num_bytes);
  epoch_.assign(world.size(), 0);
}

void GemmAr::run(RankContext& ctx, const void* a, const void* b, void* c) {
  const GemmArPlan& p = plans_.at(ctx.rank);
  // NOTE: the epoch advances before any check: a call refused on one rank must not leave that
  // rank's epoch behind its peers', or every later call would wait on signals that never come.
  const uint64_t epoch = ++epoch_[ctx.rank];
  TL_REQUIRE(a && b && c, "gemm_ar: null tensor on rank " << ctx.rank);
  ctx.op = "gemm_ar";
  SymmetricView heap = ws_.view(ctx.rank);
  // Entry barrier: every peer has finished its previous call, so partials may be overwritten.
  rank_barrier(ctx, heap, p.barrier, epoch);
  const int cw = p.config.comm_workers, kw = p.config.compute_workers;
  run_workers(ctx, {
      {kw, [&](int w) { compute_worker(ctx, p, heap, a, b, epoch, w, kw); }},
      {cw, [&](int w) { allreduce_worker(ctx, p, heap, c, epoch, w, cw); }},
  });
}

void GemmAr::run_unfused(RankContext& ctx, const void* a, const void* b, void* c) {
  const GemmArPlan& p = plans_.at(ctx.rank);
  const uint64_t epoch = epoch_[ctx.rank] += 2;  // two barriers: epoch - 1, then epoch
  TL_REQUIRE(a && b && c, "gemm_ar: null tensor on rank " << ctx.rank);
  ctx.op = "gemm_ar(unfused)";
  SymmetricView heap = ws_.view(ctx.rank);
  rank_barrier(ctx, heap, p.barrier, epoch - 1);
  gemm_rect(p, a, b, Rect{0, 0, p.m(), p.n}, heap.local(p.ar.f.partial));
  rank_barrier(ctx, heap, p.barrier, epoch);
  // The AllReduce as one piece: every row, every source, rank order.
  sum_sources(
      ctx, p.world_size, [&](int s) { return heap.peer(s, p.ar.f.partial); }, p.n, c, p.n, p.m(), p.n, p.dtype);
}

}  // namespace tilelink::cpu
