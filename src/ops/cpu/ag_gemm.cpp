// AG+GEMM on the CPU backend: the comm program and the compute program of ops/ag_gemm_plan.hpp.
#include <cstddef>

#include "tilelink/backend/cpu/ops.hpp"
#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/backend/cpu/workers.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

namespace {

// The rows [rows.begin, rows.end) of a [*, K] matrix whose first row is `row0`, as a copy source or
// destination.
Copy2D rows_copy(const AgGemmPlan& p, const void* src, int64_t src_row0, void* dst,
                 int64_t dst_row0, RowRange rows) {
  const int64_t rb = p.row_bytes();
  return Copy2D{static_cast<const std::byte*>(src) + (rows.begin - src_row0) * rb, rb,
                static_cast<std::byte*>(dst) + (rows.begin - dst_row0) * rb, rb, rows.size(), rb};
}

// comm program, pull: bring every comm tile into this rank's gathered buffer, own tiles first.
void pull_worker(RankContext& ctx, const AgGemmPlan& p, const SymmetricView& heap, const void* a,
                 uint64_t epoch, int worker, int workers) {
  void* gathered = heap.local(p.ws.gathered);
  for (int i = worker; i < p.comm.num_tiles(); i += workers) {
    int t = p.pull_tile_at(i);
    int owner = p.comm.rank_of(t);
    RowRange rows = p.comm.rows_of(t);
    if (owner == ctx.rank) {
      tile_pull_data(ctx, ctx.rank, rows_copy(p, a, p.comm.parts.begin(owner), gathered, 0, rows));
    } else {
      // The owner announces each of its tiles once it sits in its own gathered buffer.
      peer_tile_wait(ctx, heap, owner, p.ws.tile_ready, t, epoch, WaitSite{"tile_ready", t});
      tile_pull_data(ctx, owner,
                     rows_copy(p, heap.peer(owner, p.ws.gathered), 0, gathered, 0, rows));
    }
    producer_tile_notify(ctx, heap, p.ws.tile_ready, t, epoch);
  }
}

// comm program, push: write this rank's tiles into every rank's gathered buffer (itself first).
void push_worker(RankContext& ctx, const AgGemmPlan& p, const SymmetricView& heap, const void* a,
                 uint64_t epoch, int worker, int workers) {
  for (int i = worker; i < p.push_count(); i += workers) {
    int peer = 0, t = 0;
    p.push_at(i, &peer, &t);
    RowRange rows = p.comm.rows_of(t);
    tile_push_data(ctx, peer,
                   rows_copy(p, a, p.comm.parts.begin(ctx.rank), heap.peer(peer, p.ws.gathered), 0, rows));
    peer_tile_notify(ctx, heap, peer, p.ws.tile_ready, t, epoch);
  }
}

// compute program: every gemm tile, in the local-first order, after the comm tiles it covers.
void compute_worker(RankContext& ctx, const AgGemmPlan& p, const SymmetricView& heap,
                    const void* b, void* c, uint64_t epoch, int worker, int workers) {
  const std::byte* gathered = heap.local(p.ws.gathered);
  const int64_t eb = dtype_size(p.dtype);
  for (int i = worker; i < p.compute_order.count(); i += workers) {
    TileCoord tile = p.compute_order.at(i);
    IdRange waits = p.waits_for(tile);
    for (int s = waits.begin; s < waits.end; ++s)
      consumer_tile_wait(ctx, heap, p.ws.tile_ready, s, epoch,
                         WaitSite{"tile_ready", p.gemm.linear(tile)});
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
  TL_REQUIRE((a || p.comm.parts.size(ctx.rank) == 0) && b && c, "ag_gemm: null tensor on rank " << ctx.rank);
  ctx.op = "ag_gemm";
  SymmetricView heap = ws_.view(ctx.rank);
  // Entry barrier: every peer has finished the previous call, so its buffers may be overwritten.
  rank_barrier(ctx, heap, p.ws.barrier, epoch);
  const int cw = p.config.comm_workers, kw = p.config.compute_workers;
  const bool push = p.config.mode == CommMode::kPush;
  run_workers(ctx, {
      {cw, [&](int w) {
         if (push) push_worker(ctx, p, heap, a, epoch, w, cw);
         else pull_worker(ctx, p, heap, a, epoch, w, cw);
       }},
      {kw, [&](int w) { compute_worker(ctx, p, heap, b, c, epoch, w, kw); }},
  });
}

void AgGemm::run_unfused(RankContext& ctx, const void* a, const void* b, void* c) {
  const AgGemmPlan& p = plans_.at(ctx.rank);
  // NOTE: the epoch advances before any check: a call refused on one rank must not leave that
  // rank's epoch behind its peers', or every later call would wait on signals that never come.
  const uint64_t epoch = epoch_[ctx.rank] += 2;  // two barriers: epoch - 1, then epoch
  TL_REQUIRE((a || p.comm.parts.size(ctx.rank) == 0) && b && c, "ag_gemm: null tensor on rank " << ctx.rank);
  ctx.op = "ag_gemm(unfused)";
  SymmetricView heap = ws_.view(ctx.rank);
  const RowPartition& parts = p.comm.parts;
  // AllGather: barrier, each rank copies its segment into every rank's buffer, barrier.
  rank_barrier(ctx, heap, p.ws.barrier, epoch - 1);
  RowRange own{parts.begin(ctx.rank), parts.end(ctx.rank)};
  for (int s = 0; s < ctx.world_size; ++s) {
    int peer = peer_at(ctx.rank, s, ctx.world_size);
    rank_copy_data(ctx, peer, rows_copy(p, a, own.begin, heap.peer(peer, p.ws.gathered), 0, own));
  }
  rank_barrier(ctx, heap, p.ws.barrier, epoch);
  // GEMM: the whole [M, N_r] output at once.
  gemm_tile_cpu(heap.local(p.ws.gathered), p.k, b, p.k, c, p.n, p.dtype, p.m(), p.n, p.k);
}

}  // namespace tilelink::cpu
