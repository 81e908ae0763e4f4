// GemmRsPlan: the plan of fused GEMM + ReduceScatter, shared by every backend.
//
// Rank r holds A_r [M, K_r] and B_r [N, K_r] (K split across ranks, ragged allowed). It computes
// its row segment of sum_i A_i * B_i^T: C_r, shape [M_r, N], where the M rows are split by `rows`.
//
//   gemm tiles    TileGrid over the partial P_r [M, N], gemm_tile_m x gemm_tile_n
//   reduce tiles  rank r's segment cut by SegmentTiling (comm_tile_rows) x column blocks of
//                 comm_tile_cols: their own size, linked to gemm tiles by covering()
//   channels      gemm tile t -> slot t of `tile_done` (pull), or slot (src * gemm tiles + t) of
//                 `staged` on the owner (push); reduce tile -> the gemm tiles covering it
//   orders        compute: the same on every rank, the tile rows in W bands (one a segment)
//                 visited in turn (TileOrder::bands), so every owner's tiles finish at an even
//                 pace through the whole GEMM on every rank at once;
//                 reduce: the rank's own reduce tiles in the order its GEMM finishes them
//                 (reduce_order: column-major inside groups of rows, as the compute order), so
//                 workers taking every stride-th one keep pace with the GEMM; sources summed in
//                 rank order 0..W-1 (fp32), so every backend and variant gives the same bits
//   workspace     pull: partial [M, N] (this rank's P_r, in the op's dtype), tile_done [gemm tiles]
//                 push: staging [W, max M_r, N] (the owner's slots, one per source rank),
//                       staged [W * gemm tiles]
//                 both: barrier [world]; pull: claims [1] (the CUDA reduce's shared work counter)
#pragma once

#include "tilelink/core/dtype.hpp"
#include "tilelink/core/order.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/segment_tiling.hpp"
#include "tilelink/core/tile.hpp"
#include "tilelink/core/workspace.hpp"
#include "tilelink/ops/ag_gemm_plan.hpp"  // CommMode

namespace tilelink {

struct GemmRsConfig {
  CommMode mode = CommMode::kPull;  // pull: owners read partial tiles; push: producers write them
  int comm_tile_rows = 128;
  int comm_tile_cols = 512;
  int gemm_tile_m = 128;
  int gemm_tile_n = 128;
  int group_m = 1;
  int comm_workers = 1;
  int compute_workers = 1;
};

struct GemmRsWorkspace {
  Field<Signal> tile_done;  // pull: one per gemm tile of this rank's partial
  Field<Signal> staged;     // push: one per (source rank, gemm tile), on the owner
  Field<Signal> barrier;    // one per rank
  Field<uint64_t> claims;   // pull: the reduce's work counter, (call tag << 32) | next band (CUDA)
  ByteField partial;        // pull: [M, N]
  ByteField staging;        // push: [W, max_rows, N]
  uint64_t num_bytes = 0;
};

struct GemmRsPlan {
  int rank = 0;
  int world_size = 1;
  DType dtype = DType::kBF16;  // A, B, partials and C storage; accumulation in fp32
  int64_t n = 0;
  int64_t k = 0;               // K_r, this rank's reduction slice
  RowPartition rows;           // output segments over M
  TileGrid gemm;               // over [M, N]
  SegmentTiling reduce_rows;   // over M, comm_tile_rows
  int reduce_tile_cols = 512;
  TileOrder compute_order;
  TileOrder reduce_order;  // over (chunks of this rank's segment) x (column blocks)
  GemmRsConfig config;
  GemmRsWorkspace ws;

  static GemmRsPlan make(int rank, const RowPartition& rows, int64_t n, int64_t k_local,
                         DType dtype, const GemmRsConfig& config);

  TL_HD int64_t m() const { return rows.total(); }
  TL_HD int64_t elem_bytes() const { return dtype_size(dtype); }
  TL_HD int reduce_col_blocks() const { return static_cast<int>(ceil_div(n, reduce_tile_cols)); }

  // This rank's reduce tiles: (chunk of its segment) x (column block).
  TL_HD int reduce_count() const { return reduce_rows.tiles_of(rank) * reduce_col_blocks(); }
  // The i-th reduce tile of the walk (reduce_order), 0 <= i < reduce_count().
  TL_HD Rect reduce_region(int i) const {
    const TileCoord t = reduce_order.at(i);
    const int chunk = t.m, cb = t.n;
    RowRange rr = reduce_rows.rows_of(reduce_rows.first[rank] + chunk);
    int64_t c0 = static_cast<int64_t>(cb) * reduce_tile_cols;
    return {rr.begin, c0, rr.size(), min64(reduce_tile_cols, n - c0)};
  }
  // Channel mapping of a reduce tile: the gemm tiles (on every source rank) that cover it.
  TL_HD TileSpan waits_for(const Rect& region) const { return gemm.covering(region); }

  // Push: slot of `staged` for (source rank, gemm tile), and the staging row of a global row.
  TL_HD int staged_slot(int src, int gemm_tile) const { return src * gemm.num_tiles() + gemm_tile; }
  TL_HD int64_t staging_offset_elems(int src, int64_t global_row, int owner) const {
    return (static_cast<int64_t>(src) * rows.max_size() + (global_row - rows.begin(owner))) * n;
  }
};

}  // namespace tilelink
