// AgGemmPlan: the plan of fused AllGather + GEMM, shared by every backend.
//
// Rank r holds A_r [M_r, K] (rows of A split across ranks, ragged allowed) and B_r [N_r, K]
// (nn.Linear layout). It computes C_r = AllGather(A) * B_r^T, shape [M, N_r].
//
//   comm        an AllGather comm plan (comm/allgather.hpp, `ag`) over A's rows, comm_tile_rows
//               rows a tile (its own size): its orders, its program, its fields (tile_ready,
//               gathered [M, K])
//   gemm tiles  TileGrid over C_r [M, N_r], gemm_tile_m x gemm_tile_n
//   channels    comm tile t -> slot t of `tile_ready`; gemm tile (m, n) waits on the comm tiles that
//               cover its rows: one contiguous id range, waits_for()
//   orders      compute: local-first (start at the first tile row inside rank r's segment); the
//               AllGather's pull order starts at rank r's first tile too, so data arrives in the
//               order the compute walks it
//   workspace   the AllGather's fields, and barrier [world] signals (the entry barrier of each call)
//
// Every call uses the next epoch: notifies store it, waits wait for >= it.
#pragma once

#include "tilelink/comm/allgather.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/order.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/segment_tiling.hpp"
#include "tilelink/core/tile.hpp"
#include "tilelink/core/workspace.hpp"

namespace tilelink {

struct AgGemmConfig {
  CommMode mode = CommMode::kPull;
  int comm_tile_rows = 128;  // rows per communication tile
  int gemm_tile_m = 128;
  int gemm_tile_n = 128;
  int group_m = 1;           // tile rows per L2 group of the compute order
  int comm_workers = 1;      // CPU threads or GPU SMs moving data (0 on GPU = copy engine)
  int compute_workers = 1;   // CPU threads or GPU SMs computing tiles (0 on GPU = all the rest)
};

struct AgGemmWorkspace {
  Field<Signal> barrier;  // one per rank: entry barrier of each call (the AllGather's fields: ag.f)
  uint64_t num_bytes = 0;
};

struct AgGemmPlan {
  int rank = 0;
  int world_size = 1;
  DType dtype = DType::kBF16;  // A, B and C storage
  int64_t n = 0;               // N_r: this rank's output columns
  int64_t k = 0;
  AllGatherPlan ag;            // over A's rows: ag.tiles.parts = the row partition
  TileGrid gemm;               // over C_r [M, N_r]
  TileOrder compute_order;
  AgGemmConfig config;
  AgGemmWorkspace ws;

  // Host constructor: checks every input and throws tilelink::Error with a clear message.
  static AgGemmPlan make(int rank, const RowPartition& rows, int64_t n_local, int64_t k,
                         DType dtype, const AgGemmConfig& config);

  TL_HD int64_t m() const { return ag.m(); }
  TL_HD int64_t row_bytes() const { return k * dtype_size(dtype); }

  // Channel mapping of a gemm tile: the comm tiles (= tile_ready slots) it must wait on.
  TL_HD IdRange waits_for(TileCoord t) const {
    Rect r = gemm.region(t);
    return ag.waits_for(RowRange{r.row, r.row + r.rows});
  }
};

}  // namespace tilelink
