// AgGemmPlan: the plan of fused AllGather + GEMM, shared by every backend.
//
// Rank r holds A_r [M_r, K] (rows of A split across ranks, ragged allowed) and B_r [N_r, K]
// (nn.Linear layout). It computes C_r = AllGather(A) * B_r^T, shape [M, N_r].
//
//   comm tiles  SegmentTiling over A's rows, comm_tile_rows rows each (its own size)
//   gemm tiles  TileGrid over C_r [M, N_r], gemm_tile_m x gemm_tile_n
//   channels    comm tile t -> slot t of `tile_ready`; gemm tile (m, n) waits on the comm tiles that
//               cover its rows: one contiguous id range, waits_for()
//   orders      compute: local-first (start at the first tile row inside rank r's segment);
//               comm (pull): comm tiles rotated to start at rank r's first tile, so data arrives in
//               the order the compute walks it; comm (push): own tiles, peers r+1, r+2, ...
//   workspace   tile_ready [num comm tiles] signals, barrier [world] signals, gathered [M, K]
//
// Every call uses the next epoch: notifies store it, waits wait for >= it.
#pragma once

#include "tilelink/core/dtype.hpp"
#include "tilelink/core/order.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/segment_tiling.hpp"
#include "tilelink/core/tile.hpp"
#include "tilelink/core/workspace.hpp"

namespace tilelink {

enum class CommMode : uint8_t {
  kPull,  // each rank reads its peers' segments (comm workers or the copy engine)
  kPush,  // each rank writes its own segment into every peer's gathered buffer
};

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
  Field<Signal> tile_ready;  // one per comm tile: the tile's rows are in this rank's `gathered`
  Field<Signal> barrier;     // one per rank: entry barrier of each call
  ByteField gathered;        // [M, K] in the op's dtype
  uint64_t num_bytes = 0;
};

struct AgGemmPlan {
  int rank = 0;
  int world_size = 1;
  DType dtype = DType::kBF16;  // A, B and C storage
  int64_t n = 0;               // N_r: this rank's output columns
  int64_t k = 0;
  SegmentTiling comm;          // over A's rows: parts = the row partition
  TileGrid gemm;               // over C_r [M, N_r]
  TileOrder compute_order;
  AgGemmConfig config;
  AgGemmWorkspace ws;

  // Host constructor: checks every input and throws tilelink::Error with a clear message.
  static AgGemmPlan make(int rank, const RowPartition& rows, int64_t n_local, int64_t k,
                         DType dtype, const AgGemmConfig& config);

  TL_HD int64_t m() const { return comm.parts.total(); }
  TL_HD int64_t row_bytes() const { return k * dtype_size(dtype); }

  // Channel mapping of a gemm tile: the comm tiles (= tile_ready slots) it must wait on.
  TL_HD IdRange waits_for(TileCoord t) const {
    Rect r = gemm.region(t);
    return comm.covering(RowRange{r.row, r.row + r.rows});
  }

  // Pull order: the i-th comm tile this rank brings into its gathered buffer, 0 <= i < num tiles.
  // Starts with its own tiles (a local copy), then rank+1's, and so on.
  TL_HD int pull_tile_at(int i) const {
    int n_tiles = comm.num_tiles();
    return (comm.first[rank] + i) % n_tiles;
  }

  // Push order: the i-th (peer, comm tile) this rank writes, 0 <= i < push_count(): its own tiles,
  // to itself first, then to rank+1, rank+2, ...
  TL_HD int push_count() const { return comm.tiles_of(rank) * world_size; }
  TL_HD void push_at(int i, int* peer, int* tile) const {
    int per_peer = comm.tiles_of(rank);
    *peer = peer_at(rank, i / per_peer, world_size);
    *tile = comm.first[rank] + i % per_peer;
  }
};

}  // namespace tilelink
