// GemmArPlan: the plan of fused GEMM + AllReduce, shared by every backend.
//
// Rank r holds A_r [M, K_r] and B_r [N, K_r] (K split across ranks, ragged allowed). Every rank
// computes C = sum_i A_i * B_i^T, shape [M, N]. It is a composition: the GEMM's tiles are the
// producer of comm/allreduce.hpp's AllReduce, linked tile by tile:
//
//   gemm tiles   TileGrid over the partial P_r [M, N], gemm_tile_m x gemm_tile_n; after its
//                epilogue a tile is announced on tile_done[t] (the AllReduce's producer grid)
//   allreduce    one-shot: every rank reduces every band from every source as it is announced;
//                two-shot: ReduceScatter of the owners' segments, then AllGather of the bands
//   orders       compute: the same on every rank; two-shot in W row bands (TileOrder::bands, one a
//                segment) so every owner's bands finish at an even pace; one-shot in plain groups
//                (every rank needs every tile)
//   workspace    the AllReduce's fields (partial, tile_done, reduced, band_ready, claims) and an
//                entry barrier [W]
//
// Sources are summed in rank order in fp32 and rounded once: every algorithm, backend and the
// unfused baseline (GEMM, then the same AllReduce) give the same bits.
#pragma once

#include "tilelink/comm/allreduce.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/order.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/tile.hpp"
#include "tilelink/core/workspace.hpp"

namespace tilelink {

struct GemmArConfig {
  AllReduceAlgo algo = AllReduceAlgo::kOneShot;
  int band_cols = 512;       // columns of an AllReduce work item (bands are 32 rows)
  int gemm_tile_m = 128;
  int gemm_tile_n = 128;
  int group_m = 1;           // tile rows per L2 group of the compute order
  // 0: the backend's choice (CPU: one thread each; GPU: the AllReduce on a share of the SMs, the
  // GEMM on the rest).
  int comm_workers = 0;      // CPU threads or GPU SMs running the AllReduce
  int compute_workers = 0;   // CPU threads or GPU SMs computing tiles
};

struct GemmArPlan {
  int rank = 0;
  int world_size = 1;
  DType dtype = DType::kBF16;
  int64_t n = 0;
  int64_t k = 0;              // K_r
  TileGrid gemm;              // over [M, N]
  TileOrder compute_order;
  AllReducePlan ar;           // its producer grid is `gemm`
  Field<Signal> barrier;      // [world]: the entry barrier of each call
  uint64_t num_bytes = 0;     // the symmetric workspace
  GemmArConfig config;

  // Host constructor: checks every input (tilelink::Error). `rows`: the two-shot's segments (an
  // even split of M by default); every rank's plan has the same layout.
  static GemmArPlan make(int rank, const RowPartition& rows, int64_t n, int64_t k_local, DType dtype,
                         const GemmArConfig& config);

  TL_HD int64_t m() const { return ar.m; }
  TL_HD int64_t elem_bytes() const { return dtype_size(dtype); }
};

}  // namespace tilelink
