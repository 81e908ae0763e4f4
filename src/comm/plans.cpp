// Host constructors of the comm plans (AllGather, ReduceScatter, AllReduce, AllToAll): every check happens here, before
// anything runs.
#include "tilelink/comm/allreduce.hpp"

#include "tilelink/core/error.hpp"

namespace tilelink {

const char* allreduce_algo_name(AllReduceAlgo a) {
  return a == AllReduceAlgo::kOneShot ? "one-shot" : "two-shot";
}

AllReducePlan AllReducePlan::make(int rank, AllReduceAlgo algo, const RowPartition& owners, int64_t n,
                                  DType dtype, int producer_tile_m, int producer_tile_n, int group_m,
                                  int band_cols) {
  const int W = owners.world_size;
  TL_REQUIRE(W >= 1 && W <= kMaxWorldSize, "allreduce: world size must be in [1, " << kMaxWorldSize
                                                                                   << "], got " << W);
  TL_REQUIRE(rank >= 0 && rank < W, "allreduce: rank " << rank << " outside a world of " << W);
  TL_REQUIRE(owners.total() >= 1 && n >= 1,
             "allreduce: M and N must be >= 1, got " << owners.total() << " and " << n);
  TL_REQUIRE(producer_tile_m >= 1 && producer_tile_n >= 1 && group_m >= 1,
             "allreduce: producer tiles " << producer_tile_m << "x" << producer_tile_n << " and group "
                                          << group_m << " must be >= 1");
  TL_REQUIRE(band_cols >= 8 && band_cols % 8 == 0 && band_cols <= (1 << 20),
             "allreduce: band_cols must be a multiple of 8 in [8, 2^20], got " << band_cols);
  AllReducePlan p;
  p.rank = rank;
  p.world_size = W;
  p.dtype = dtype;
  p.algo = algo;
  p.m = owners.total();
  p.n = n;
  p.owners = owners;
  p.producer = TileGrid{p.m, n, producer_tile_m, producer_tile_n};
  p.band_cols = band_cols;
  p.group_bands = static_cast<int>(ceil_div(static_cast<int64_t>(group_m) * producer_tile_m, p.band_rows));
  for (int r = 0; r < W; ++r) p.max_items = p.items_of(r) > p.max_items ? p.items_of(r) : p.max_items;
  return p;
}

void AllReducePlan::make_layout(LayoutBuilder& b) {
  const int64_t bytes = m * n * dtype_size(dtype);
  const bool two = algo == AllReduceAlgo::kTwoShot;
  f.partial = b.add<std::byte>(bytes);
  f.tile_done = b.add<Signal>(producer.num_tiles());
  f.reduced = b.add<std::byte>(two ? bytes : 0);
  f.band_ready = b.add<Signal>(two ? max_items : 0);
  f.claims = b.add<uint64_t>(2);
}

}  // namespace tilelink

// ---- AllToAll ---------------------------------------------------------------------------------

#include "tilelink/comm/alltoall.hpp"

namespace tilelink {

AllToAllPlan AllToAllPlan::make(int rank, int world_size, int64_t row_bytes, int64_t capacity) {
  TL_REQUIRE(world_size >= 1 && world_size <= kMaxWorldSize,
             "alltoall: world size must be in [1, " << kMaxWorldSize << "], got " << world_size);
  TL_REQUIRE(rank >= 0 && rank < world_size, "alltoall: rank " << rank << " outside a world of " << world_size);
  TL_REQUIRE(row_bytes >= 1 && row_bytes <= (int64_t{1} << 30),
             "alltoall: row_bytes must be in [1, 2^30], got " << row_bytes);
  TL_REQUIRE(capacity >= 0 && capacity <= (int64_t{1} << 40) / row_bytes / world_size,
             "alltoall: a capacity of " << capacity << " rows of " << row_bytes << " bytes from each of "
                                        << world_size << " ranks is out of range");
  AllToAllPlan p;
  p.rank = rank;
  p.world_size = world_size;
  p.row_bytes = row_bytes;
  p.capacity = capacity;
  return p;
}

void AllToAllPlan::make_layout(LayoutBuilder& b) {
  f.counts = b.add<int64_t>(world_size);
  f.counts_ready = b.add<Signal>(world_size);
  f.staging = b.add<std::byte>(static_cast<int64_t>(world_size) * capacity * row_bytes);
  f.rows_ready = b.add<Signal>(world_size);
}

}  // namespace tilelink

// ---- AllGather --------------------------------------------------------------------------------

#include "tilelink/comm/allgather.hpp"

namespace tilelink {

AllGatherPlan AllGatherPlan::make(int rank, const RowPartition& rows, int64_t row_bytes, int tile_rows,
                                  CommMode mode) {
  const int W = rows.world_size;
  TL_REQUIRE(W >= 1 && W <= kMaxWorldSize, "allgather: world size must be in [1, " << kMaxWorldSize
                                                                                   << "], got " << W);
  TL_REQUIRE(rank >= 0 && rank < W, "allgather: rank " << rank << " outside a world of " << W);
  TL_REQUIRE(row_bytes >= 1 && row_bytes <= (int64_t{1} << 30),
             "allgather: row_bytes must be in [1, 2^30], got " << row_bytes);
  TL_REQUIRE(rows.total() <= (int64_t{1} << 40) / row_bytes,
             "allgather: " << rows.total() << " rows of " << row_bytes << " bytes is out of range");
  TL_REQUIRE(tile_rows >= 1 && tile_rows <= (1 << 20), "allgather: tile_rows must be in [1, 2^20], got " << tile_rows);
  TL_REQUIRE(mode == CommMode::kPull || mode == CommMode::kPush, "allgather: unknown comm mode");
  AllGatherPlan p;
  p.rank = rank;
  p.world_size = W;
  p.mode = mode;
  p.row_bytes = row_bytes;
  p.tiles = SegmentTiling::make(rows, tile_rows);
  return p;
}

void AllGatherPlan::make_layout(LayoutBuilder& b) {
  f.tile_ready = b.add<Signal>(tiles.num_tiles());
  f.gathered = b.add<std::byte>(m() * row_bytes);
}

}  // namespace tilelink

// ---- ReduceScatter ----------------------------------------------------------------------------

#include "tilelink/comm/reduce_scatter.hpp"

namespace tilelink {

ReduceScatterPlan ReduceScatterPlan::make(int rank, const RowPartition& rows, int64_t n, DType dtype, CommMode mode,
                                          int producer_tile_m, int producer_tile_n, int group_m, int band_rows,
                                          int band_cols) {
  const int W = rows.world_size;
  TL_REQUIRE(W >= 1 && W <= kMaxWorldSize, "reduce_scatter: world size must be in [1, " << kMaxWorldSize
                                                                                        << "], got " << W);
  TL_REQUIRE(rank >= 0 && rank < W, "reduce_scatter: rank " << rank << " outside a world of " << W);
  TL_REQUIRE(rows.total() >= 1 && n >= 1,
             "reduce_scatter: M and N must be >= 1, got " << rows.total() << " and " << n);
  TL_REQUIRE(rows.total() <= (int64_t{1} << 40) / n / dtype_size(dtype),
             "reduce_scatter: a [" << rows.total() << ", " << n << "] partial is out of range");
  TL_REQUIRE(producer_tile_m >= 1 && producer_tile_n >= 1 && group_m >= 1,
             "reduce_scatter: producer tiles " << producer_tile_m << "x" << producer_tile_n << " and group "
                                               << group_m << " must be >= 1");
  TL_REQUIRE(band_rows >= 1 && band_rows <= (1 << 20) && band_cols >= 1 && band_cols <= (1 << 20),
             "reduce_scatter: bands of " << band_rows << "x" << band_cols << " must be in [1, 2^20] each way");
  TL_REQUIRE(mode == CommMode::kPull || mode == CommMode::kPush, "reduce_scatter: unknown comm mode");
  ReduceScatterPlan p;
  p.rank = rank;
  p.world_size = W;
  p.dtype = dtype;
  p.mode = mode;
  p.n = n;
  p.rows = rows;
  p.producer = TileGrid{rows.total(), n, producer_tile_m, producer_tile_n};
  TL_REQUIRE(static_cast<int64_t>(p.producer.num_tiles()) * W <= (int64_t{1} << 30),
             "reduce_scatter: " << p.producer.num_tiles() << " producer tiles on " << W << " ranks is out of range");
  p.band_rows = band_rows;
  p.band_cols = band_cols;
  p.group_bands = static_cast<int>(ceil_div(static_cast<int64_t>(group_m) * producer_tile_m, band_rows));
  return p;
}

void ReduceScatterPlan::make_layout(LayoutBuilder& b) {
  const int64_t eb = dtype_size(dtype);
  const bool push = mode == CommMode::kPush;
  f.tile_done = b.add<Signal>(push ? 0 : producer.num_tiles());
  f.staged = b.add<Signal>(push ? static_cast<int64_t>(world_size) * producer.num_tiles() : 0);
  f.claims = b.add<uint64_t>(push ? 0 : 1);
  f.partial = b.add<std::byte>(push ? 0 : rows.total() * n * eb);
  f.staging = b.add<std::byte>(push ? world_size * rows.max_size() * n * eb : 0);
}

}  // namespace tilelink
