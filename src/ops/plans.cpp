// Host constructors of the op plans: every check happens here, before anything runs.
#include "tilelink/core/error.hpp"
#include "tilelink/ops/ag_gemm_plan.hpp"
#include "tilelink/ops/gemm_rs_plan.hpp"
#include "tilelink/ops/gemm_ar_plan.hpp"

namespace tilelink {

namespace {
void check_common(int rank, const RowPartition& rows, int64_t n, int64_t k, const char* op) {
  TL_REQUIRE(rows.world_size >= 1 && rows.world_size <= kMaxWorldSize,
             op << ": world size must be in [1, " << kMaxWorldSize << "], got " << rows.world_size);
  TL_REQUIRE(rank >= 0 && rank < rows.world_size,
             op << ": rank " << rank << " outside a world of " << rows.world_size);
  TL_REQUIRE(rows.total() >= 1, op << ": M must be >= 1, got " << rows.total());
  TL_REQUIRE(n >= 1, op << ": N must be >= 1, got " << n);
  TL_REQUIRE(k >= 1, op << ": K must be >= 1, got " << k);
}
void check_tile(int v, const char* what, const char* op) {
  TL_REQUIRE(v >= 1 && v <= (1 << 20), op << ": " << what << " must be in [1, 2^20], got " << v);
}
}  // namespace

AgGemmPlan AgGemmPlan::make(int rank, const RowPartition& rows, int64_t n_local, int64_t k,
                            DType dtype, const AgGemmConfig& config) {
  check_common(rank, rows, n_local, k, "ag_gemm");
  check_tile(config.comm_tile_rows, "comm_tile_rows", "ag_gemm");
  check_tile(config.gemm_tile_m, "gemm_tile_m", "ag_gemm");
  check_tile(config.gemm_tile_n, "gemm_tile_n", "ag_gemm");
  check_tile(config.group_m, "group_m", "ag_gemm");
  TL_REQUIRE(config.comm_workers >= 0 && config.compute_workers >= 0,
             "ag_gemm: worker counts must be >= 0");

  AgGemmPlan p;
  p.rank = rank;
  p.world_size = rows.world_size;
  p.dtype = dtype;
  p.n = n_local;
  p.k = k;
  p.config = config;
  TL_REQUIRE(k <= (int64_t{1} << 30) / dtype_size(dtype), "ag_gemm: K = " << k << " is out of range");
  p.ag = AllGatherPlan::make(rank, rows, k * dtype_size(dtype), config.comm_tile_rows, config.mode);
  p.gemm = TileGrid{rows.total(), n_local, config.gemm_tile_m, config.gemm_tile_n};
  p.compute_order = TileOrder{p.gemm.tiles_m(), p.gemm.tiles_n(),
                              first_tile_row_of_segment(rows, rank, config.gemm_tile_m),
                              config.group_m};

  // NOTE: the layout depends only on (M, K, world, comm tiling), never on the rank, so it is the
  // same on every rank: a symmetric layout.
  LayoutBuilder b;
  p.ag.make_layout(b);
  p.ws.barrier = b.add<Signal>(rows.world_size);
  p.ws.num_bytes = b.num_bytes();
  return p;
}

GemmRsPlan GemmRsPlan::make(int rank, const RowPartition& rows, int64_t n, int64_t k_local,
                            DType dtype, const GemmRsConfig& config) {
  check_common(rank, rows, n, k_local, "gemm_rs");
  check_tile(config.comm_tile_rows, "comm_tile_rows", "gemm_rs");
  check_tile(config.comm_tile_cols, "comm_tile_cols", "gemm_rs");
  check_tile(config.gemm_tile_m, "gemm_tile_m", "gemm_rs");
  check_tile(config.gemm_tile_n, "gemm_tile_n", "gemm_rs");
  check_tile(config.group_m, "group_m", "gemm_rs");
  TL_REQUIRE(config.comm_workers >= 0 && config.compute_workers >= 0,
             "gemm_rs: worker counts must be >= 0");

  GemmRsPlan p;
  p.rank = rank;
  p.world_size = rows.world_size;
  p.dtype = dtype;
  p.n = n;
  p.k = k_local;
  p.rows = rows;
  p.config = config;
  p.gemm = TileGrid{rows.total(), n, config.gemm_tile_m, config.gemm_tile_n};
  // The same order on every rank, one row band per segment, the bands' rows in turn, groups of
  // whole turns: each owner's tiles finish at an even pace on every rank, so its reduce can run
  // through the whole GEMM. NOTE: the staggered order (rank r from rank r+1's segment on, its own
  // last) left every owner's tiles to the second half of some rank's GEMM at world 2 (the last 1/W
  // at world W): the reduce ran in half the time, and a 1-2-wave GEMM left all of it for after
  // (bench/notes/fused_ops_cuda.md, the banded compute order).
  const int W = rows.world_size;
  const int group = static_cast<int>(ceil_div(config.group_m, W)) * W;
  p.compute_order = TileOrder{p.gemm.tiles_m(), p.gemm.tiles_n(), 0, group, W};
  // NOTE: row-major, with workers taking every stride-th reduce tile, each worker kept one column
  // block: the GEMM sweeps a group of rows column by column, so the workers of the last columns
  // waited for the end of every group and about half the reduce ran after the GEMM (H200, 2 GPUs:
  // bench/notes/fused_ops_cuda.md, the reduce walks the GEMM's order). In the GEMM's own order the
  // reduce keeps pace: a group holds group / W of the rank's own tile rows.
  p.rs = ReduceScatterPlan::make(rank, rows, n, dtype, config.mode, config.gemm_tile_m, config.gemm_tile_n,
                                 group / W, config.comm_tile_rows, config.comm_tile_cols);
  LayoutBuilder b;
  p.rs.make_layout(b);
  p.ws.barrier = b.add<Signal>(W);
  p.ws.num_bytes = b.num_bytes();
  return p;
}

}  // namespace tilelink

namespace tilelink {

GemmArPlan GemmArPlan::make(int rank, const RowPartition& rows, int64_t n, int64_t k_local, DType dtype,
                            const GemmArConfig& config) {
  check_common(rank, rows, n, k_local, "gemm_ar");
  check_tile(config.gemm_tile_m, "gemm_tile_m", "gemm_ar");
  check_tile(config.gemm_tile_n, "gemm_tile_n", "gemm_ar");
  check_tile(config.group_m, "group_m", "gemm_ar");
  TL_REQUIRE(config.comm_workers >= 0 && config.compute_workers >= 0,
             "gemm_ar: worker counts must be >= 0");
  GemmArPlan p;
  p.rank = rank;
  p.world_size = rows.world_size;
  p.dtype = dtype;
  p.n = n;
  p.k = k_local;
  p.config = config;
  p.gemm = TileGrid{rows.total(), n, config.gemm_tile_m, config.gemm_tile_n};
  const int W = rows.world_size;
  if (config.algo == AllReduceAlgo::kTwoShot) {
    // As GEMM+RS: one row band per owner's segment, visited in turn, the same on every rank.
    const int group = static_cast<int>(ceil_div(config.group_m, W)) * W;
    p.compute_order = TileOrder{p.gemm.tiles_m(), p.gemm.tiles_n(), 0, group, W};
  } else {
    p.compute_order = TileOrder{p.gemm.tiles_m(), p.gemm.tiles_n(), 0, config.group_m};
  }
  p.ar = AllReducePlan::make(rank, config.algo, rows, n, dtype, config.gemm_tile_m, config.gemm_tile_n,
                             config.algo == AllReduceAlgo::kTwoShot ? 1 : config.group_m, config.band_cols);
  LayoutBuilder b;
  p.ar.make_layout(b);
  p.barrier = b.add<Signal>(W);
  p.num_bytes = b.num_bytes();
  return p;
}

}  // namespace tilelink
