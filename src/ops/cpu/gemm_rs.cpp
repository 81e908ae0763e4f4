// GEMM+RS on the CPU backend: the compute program and the reduce (comm) program of
// ops/gemm_rs_plan.hpp.
#include <cstddef>
#include <vector>

#include "tilelink/backend/cpu/ops.hpp"
#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/backend/cpu/workers.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

namespace {

// Sums `sources` row-major [rows, cols] tiles in rank order 0..W-1 in fp32, rounds once to dtype.
// src(s, i, j) gives element (i, j) of source s. The one reduction every variant uses.
template <class SourceFn>
void reduce_tile(const GemmRsPlan& p, const Rect& r, void* out, int64_t out_ld, SourceFn src) {
  for (int64_t i = 0; i < r.rows; ++i)
    for (int64_t j = 0; j < r.cols; ++j) {
      float acc = 0.f;
      for (int s = 0; s < p.world_size; ++s) acc += src(s, i, j);
      store_from_float(out, p.dtype, i * out_ld + j, acc);
    }
}

void compute_tile(const GemmRsPlan& p, const void* a, const void* b, const Rect& r, void* dst,
                  int64_t ld) {
  const int64_t eb = p.elem_bytes();
  gemm_tile_cpu(static_cast<const std::byte*>(a) + r.row * p.k * eb, p.k,
                static_cast<const std::byte*>(b) + r.col * p.k * eb, p.k, dst, ld, p.dtype, r.rows,
                r.cols, p.k);
}

// compute program, pull variant: partial tile into this rank's own partial buffer, then notify.
void compute_pull(RankContext& ctx, const GemmRsPlan& p, const SymmetricView& heap, const void* a,
                  const void* b, uint64_t epoch, int worker, int workers) {
  std::byte* partial = heap.local(p.ws.partial);
  const int64_t eb = p.elem_bytes();
  for (int i = worker; i < p.compute_order.count(); i += workers) {
    TileCoord tile = p.compute_order.at(i);
    Rect r = p.gemm.region(tile);
    compute_tile(p, a, b, r, partial + (r.row * p.n + r.col) * eb, p.n);
    producer_tile_notify(ctx, heap, p.ws.tile_done, p.gemm.linear(tile), epoch);
  }
}

// compute program, push variant: partial tile into a local buffer, then pushed (per owner whose
// rows it covers) into the owner's staging slot of this rank, and the owner notified.
void compute_push(RankContext& ctx, const GemmRsPlan& p, const SymmetricView& heap, const void* a,
                  const void* b, uint64_t epoch, int worker, int workers) {
  const int64_t eb = p.elem_bytes();
  std::vector<std::byte> tile_buf(static_cast<size_t>(p.gemm.tile_m) * p.gemm.tile_n * eb);
  for (int i = worker; i < p.compute_order.count(); i += workers) {
    TileCoord tile = p.compute_order.at(i);
    Rect r = p.gemm.region(tile);
    compute_tile(p, a, b, r, tile_buf.data(), r.cols);
    const int t = p.gemm.linear(tile);
    for (int owner = p.rows.owner_of_row(r.row); owner < p.world_size; ++owner) {
      int64_t lo = max64(r.row, p.rows.begin(owner)), hi = min64(r.row + r.rows, p.rows.end(owner));
      if (p.rows.begin(owner) >= r.row + r.rows) break;
      if (hi <= lo) continue;
      std::byte* dst = heap.peer(owner, p.ws.staging) +
                       (p.staging_offset_elems(ctx.rank, lo, owner) + r.col) * eb;
      tile_push_data(ctx, owner,
                     Copy2D{tile_buf.data() + (lo - r.row) * r.cols * eb, r.cols * eb, dst, p.n * eb,
                            hi - lo, r.cols * eb});
      peer_tile_notify(ctx, heap, owner, p.ws.staged, p.staged_slot(ctx.rank, t), epoch);
    }
  }
}

// reduce program: every reduce tile of this rank's segment, after the gemm tiles covering it on
// every source rank; sources summed in rank order.
void reduce_worker(RankContext& ctx, const GemmRsPlan& p, const SymmetricView& heap, void* c,
                   uint64_t epoch, int worker, int workers) {
  const int64_t eb = p.elem_bytes();
  const bool push = p.config.mode == CommMode::kPush;
  const int64_t seg0 = p.rows.begin(ctx.rank);
  std::vector<std::byte> pulled;
  for (int i = worker; i < p.reduce_count(); i += workers) {
    Rect r = p.reduce_region(i);
    TileSpan span = p.waits_for(r);
    for (int step = 1; step <= p.world_size; ++step) {  // peers first, own last
      int src = peer_at(ctx.rank, step, p.world_size);
      for (int m = span.m_begin; m < span.m_end; ++m)
        for (int n = span.n_begin; n < span.n_end; ++n) {
          int t = p.gemm.linear({m, n});
          if (push)
            consumer_tile_wait(ctx, heap, p.ws.staged, p.staged_slot(src, t), epoch,
                               WaitSite{"staged", t});
          else
            peer_tile_wait(ctx, heap, src, p.ws.tile_done, t, epoch, WaitSite{"tile_done", t});
        }
    }
    void* out = static_cast<std::byte*>(c) + ((r.row - seg0) * p.n + r.col) * eb;
    if (push) {
      const std::byte* staging = heap.local(p.ws.staging);
      reduce_tile(p, r, out, p.n, [&](int s, int64_t i2, int64_t j) {
        return load_as_float(staging, p.dtype, p.staging_offset_elems(s, r.row + i2, ctx.rank) + r.col + j);
      });
    } else {
      // Pull each source's partial tile, then reduce locally.
      const int64_t tile_elems = r.rows * r.cols;
      pulled.resize(static_cast<size_t>(tile_elems * eb * p.world_size));
      for (int s = 0; s < p.world_size; ++s)
        tile_pull_data(ctx, s,
                       Copy2D{heap.peer(s, p.ws.partial) + (r.row * p.n + r.col) * eb, p.n * eb,
                              pulled.data() + s * tile_elems * eb, r.cols * eb, r.rows, r.cols * eb});
      reduce_tile(p, r, out, p.n, [&](int s, int64_t i2, int64_t j) {
        return load_as_float(pulled.data(), p.dtype, s * tile_elems + i2 * r.cols + j);
      });
    }
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
  const bool push = p.config.mode == CommMode::kPush;
  run_workers(ctx, {
      {kw, [&](int w) {
         if (push) compute_push(ctx, p, heap, a, b, epoch, w, kw);
         else compute_pull(ctx, p, heap, a, b, epoch, w, kw);
       }},
      {cw, [&](int w) { reduce_worker(ctx, p, heap, c, epoch, w, cw); }},
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
  const int64_t eb = p.elem_bytes();
  // GEMM: the whole partial [M, N] into this rank's buffer.
  rank_barrier(ctx, heap, p.ws.barrier, epoch - 1);
  compute_tile(p, a, b, Rect{0, 0, p.m(), p.n}, heap.local(p.ws.partial), p.n);
  rank_barrier(ctx, heap, p.ws.barrier, epoch);
  // ReduceScatter: pull every source's rows of this rank's segment, sum in rank order.
  Rect seg{p.rows.begin(ctx.rank), 0, p.rows.size(ctx.rank), p.n};
  std::vector<std::byte> pulled(static_cast<size_t>(seg.rows * p.n * eb * p.world_size));
  for (int s = 0; s < p.world_size; ++s)
    rank_copy_data(ctx, s, Copy2D{heap.peer(s, p.ws.partial) + seg.row * p.n * eb, p.n * eb,
                                  pulled.data() + s * seg.rows * p.n * eb, p.n * eb, seg.rows,
                                  p.n * eb});
  reduce_tile(p, seg, c, p.n, [&](int s, int64_t i, int64_t j) {
    return load_as_float(pulled.data(), p.dtype, (s * seg.rows + i) * p.n + j);
  });
}

}  // namespace tilelink::cpu
