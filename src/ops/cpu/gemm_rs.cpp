// GEMM+RS on the CPU backend: the compute program of ops/gemm_rs_plan.hpp and the ReduceScatter's
// program (comm/reduce_scatter.hpp) beside it.
#include <cstddef>
#include <vector>

#include "tilelink/backend/cpu/comm_exec.hpp"
#include "tilelink/backend/cpu/ops.hpp"
#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/backend/cpu/workers.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

namespace {

void compute_tile(const GemmRsPlan& p, const void* a, const void* b, const Rect& r, void* dst,
                  int64_t ld) {
  const int64_t eb = p.elem_bytes();
  gemm_tile_cpu(static_cast<const std::byte*>(a) + r.row * p.k * eb, p.k,
                static_cast<const std::byte*>(b) + r.col * p.k * eb, p.k, dst, ld, p.dtype, r.rows,
                r.cols, p.k);
}

// compute program: each gemm tile of the partial, in the compute order, handed to the
// ReduceScatter's producer side (comm/reduce_scatter.hpp): pull: computed in place into this rank's
// partial and announced; push: computed into a local tile, then written into each owner's staging.
void compute_worker(RankContext& ctx, const GemmRsPlan& p, const SymmetricView& heap, const void* a,
                    const void* b, uint64_t epoch, int worker, int workers) {
  const CommExec x{ctx, heap};
  const int64_t eb = p.elem_bytes();
  const bool push = p.config.mode == CommMode::kPush;
  std::vector<std::byte> tile_buf(push ? static_cast<size_t>(p.gemm.tile_m) * p.gemm.tile_n * eb : 0);
  for (int i = worker; i < p.compute_order.count(); i += workers) {
    const TileCoord tile = p.compute_order.at(i);
    const Rect r = p.gemm.region(tile);
    std::byte* dst = push ? tile_buf.data() : heap.local(p.rs.f.partial) + (r.row * p.n + r.col) * eb;
    const int64_t ld = push ? r.cols : p.n;
    compute_tile(p, a, b, r, dst, ld);
    reduce_scatter_publish(x, p.rs, p.gemm.linear(tile), dst, ld, epoch);
  }
}

}  // namespace

GemmRs::GemmRs(World& world, const RowPartition& rows, int64_t n,
               const std::vector<int64_t>& k_per_rank, DType dtype, const GemmRsConfig& config) {
  TL_REQUIRE(rows.world_size == world.size(), "gemm_rs: the row partition has "
                                                  << rows.world_size << " ranks, the world "
                                                  << world.size());
  TL_REQUIRE(static_cast<int>(k_per_rank.size()) == world.size(),
             "gemm_rs: " << k_per_rank.size() << " K_r values for a world of " << world.size());
  TL_REQUIRE(config.comm_workers >= 1 && config.compute_workers >= 1,
             "gemm_rs: the CPU backend needs at least one comm and one compute worker");
  GemmRsConfig base = config;
  base.mode = CommMode::kPull;
  for (int r = 0; r < world.size(); ++r) {
    plans_.push_back(GemmRsPlan::make(r, rows, n, k_per_rank[r], dtype, config));
    baseline_plans_.push_back(GemmRsPlan::make(r, rows, n, k_per_rank[r], dtype, base));
  }
  ws_ = world.allocate(plans_[0].ws.num_bytes);
  // NOTE: the baseline's workspace is allocated here, not on first use: ranks call concurrently.
  baseline_ws_ = world.allocate(baseline_plans_[0].ws.num_bytes);
  epoch_.assign(world.size(), 0);
}

void GemmRs::run(RankContext& ctx, const void* a, const void* b, void* c) {
  const GemmRsPlan& p = plans_.at(ctx.rank);
  // NOTE: the epoch advances before any check: a call refused on one rank must not leave that
  // rank's epoch behind its peers', or every later call would wait on signals that never come.
  const uint64_t epoch = ++epoch_[ctx.rank];
  TL_REQUIRE(a && b && (c || p.rows.size(ctx.rank) == 0), "gemm_rs: null tensor on rank " << ctx.rank);
  ctx.op = "gemm_rs";
  SymmetricView heap = ws_.view(ctx.rank);
  rank_barrier(ctx, heap, p.ws.barrier, epoch);
  const int cw = p.config.comm_workers, kw = p.config.compute_workers;
  run_workers(ctx, {
      {kw, [&](int w) { compute_worker(ctx, p, heap, a, b, epoch, w, kw); }},
      {cw, [&](int w) {  // the ReduceScatter's program, items strided over the workers
         const CommExec x{ctx, heap};
         for (int j = w; j < p.rs.count(); j += cw) reduce_scatter_item(x, p.rs, j, epoch, c);
       }},
  });
}

void GemmRs::run_unfused(RankContext& ctx, const void* a, const void* b, void* c) {
  const GemmRsPlan& p = baseline_plans_.at(ctx.rank);
  // NOTE: the epoch advances before any check: a call refused on one rank must not leave that
  // rank's epoch behind its peers', or every later call would wait on signals that never come.
  const uint64_t epoch = epoch_[ctx.rank] += 2;  // two barriers: epoch - 1, then epoch
  TL_REQUIRE(a && b && (c || p.rows.size(ctx.rank) == 0), "gemm_rs: null tensor on rank " << ctx.rank);
  ctx.op = "gemm_rs(unfused)";
  SymmetricView heap = baseline_ws_.view(ctx.rank);
  // GEMM: the whole partial [M, N] into this rank's buffer.
  rank_barrier(ctx, heap, p.ws.barrier, epoch - 1);
  compute_tile(p, a, b, Rect{0, 0, p.m(), p.n}, heap.local(p.rs.f.partial), p.n);
  rank_barrier(ctx, heap, p.ws.barrier, epoch);
  // ReduceScatter: every source's rows of this rank's segment, summed in rank order.
  const int64_t eb = p.elem_bytes(), seg0 = p.rows.begin(ctx.rank);
  sum_sources(
      ctx, p.world_size, [&](int s) { return heap.peer(s, p.rs.f.partial) + seg0 * p.n * eb; }, p.n, c, p.n,
      p.rows.size(ctx.rank), p.n, p.dtype);
}

}  // namespace tilelink::cpu
