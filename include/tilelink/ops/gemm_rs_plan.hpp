// GemmRsPlan: the plan of fused GEMM + ReduceScatter, shared by every backend.
//
// Rank r holds A_r [M, K_r] and B_r [N, K_r] (K split across ranks, ragged allowed). It computes
// its row segment of sum_i A_i * B_i^T: C_r, shape [M_r, N], where the M rows are split by `rows`.
//
//   gemm tiles    TileGrid over the partial P_r [M, N], gemm_tile_m x gemm_tile_n
//   reduce        a ReduceScatter comm plan (comm/reduce_scatter.hpp, `rs`) whose producer grid is
//                 the gemm tiles: its items are bands of comm_tile_rows x comm_tile_cols of rank r's
//                 segment (their own size), linked to gemm tiles by covering(); its fields are the
//                 pull mode's partial [M, N] and tile_done [gemm tiles] or the push mode's staging
//                 [W, max M_r, N] and staged [W * gemm tiles]
//   orders        compute: the same on every rank, the tile rows in W bands (one a segment)
//                 visited in turn (TileOrder::bands), so every owner's tiles finish at an even
//                 pace through the whole GEMM on every rank at once; reduce: the rank's own
//                 bands in the order its GEMM finishes them (column-major inside groups of rows,
//                 as the compute order), so workers taking every stride-th one keep pace with the
//                 GEMM; sources summed in rank order 0..W-1 (fp32), so every backend and variant
//                 gives the same bits
//   workspace     the ReduceScatter's fields, and barrier [world] (the entry barrier of each call)
#pragma once

#include "tilelink/comm/reduce_scatter.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/order.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/tile.hpp"
#include "tilelink/core/workspace.hpp"

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
  Field<Signal> barrier;  // one per rank (the ReduceScatter's fields: rs.f)
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
  TileOrder compute_order;
  ReduceScatterPlan rs;        // producer grid: `gemm`
  GemmRsConfig config;
  GemmRsWorkspace ws;

  static GemmRsPlan make(int rank, const RowPartition& rows, int64_t n, int64_t k_local,
                         DType dtype, const GemmRsConfig& config);

  TL_HD int64_t m() const { return rows.total(); }
  TL_HD int64_t elem_bytes() const { return dtype_size(dtype); }
};

}  // namespace tilelink
