// The dynamic mappings on the device: a routing kernel counts each expert's tokens and one of its
// threads writes the offsets and first-tile tables; a later kernel in the same stream reads them
// through views the host built before any table held data. Every answer is compared with the same
// views over host copies of the tables (themselves checked against the static mappings and brute
// force in tests/core/dynamic_partition_test.cpp).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cuda/atomic>
#include <vector>

#include "../support/random.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/dynamic_partition.hpp"
#include "tilelink/core/dynamic_tile_grid.hpp"

using namespace tilelink;

namespace {

constexpr int kBlock = 256;

// Device memory for n elements of T, freed on scope exit.
template <class T>
struct DeviceArray {
  T* p = nullptr;
  explicit DeviceArray(size_t n) { TL_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T))); }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

template <class T>
std::vector<T> to_host(const DeviceArray<T>& d, size_t n) {
  std::vector<T> h(n);
  TL_CUDA_CHECK(cudaMemcpy(h.data(), d.p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// The routing kernel (one block): tokens' experts -> per-expert counts -> offsets -> first tiles of
// the tiling and of the grid. status[0..2]: the scan's result, the tiling's and the grid's tile
// counts (-1: refused).
__global__ void route(const int* expert_of_token, int tokens, DynamicSegmentTiling tiling,
                      DynamicTileGrid grid, int64_t* counts, int64_t* offsets, int* tiling_first,
                      int* grid_first, int* status) {
  const int experts = tiling.num_parts();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int t = threadIdx.x; t < tokens; t += blockDim.x) {
    ::cuda::atomic_ref<int64_t, ::cuda::thread_scope_block> count(counts[expert_of_token[t]]);
    count.fetch_add(1, ::cuda::memory_order_relaxed);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool scanned = offsets_from_counts(counts, experts, offsets);
    status[0] = scanned ? 1 : 0;
    status[1] = scanned ? fill_first_tiles(tiling.parts, tiling.chunk_rows, tiling_first) : -1;
    status[2] = scanned ? fill_first_tiles(grid, grid_first) : -1;
  }
}

// The reader (a later kernel): every mapping, for every tile, row and grid tile up to the bounds.
struct Answers {
  int* part_of;        // [max tiles]
  int64_t* tile_rows;  // [max tiles][2]
  int* tile_of_row;    // [tokens]
  int* owner_of_row;   // [tokens]
  int* grid_coord;     // [max grid tiles][3]
  int64_t* grid_rect;  // [max grid tiles][4]
  int* totals;         // num_tiles, grid num_tiles, validate
};

__global__ void read_views(DynamicSegmentTiling tiling, DynamicTileGrid grid, int tokens,
                           Answers out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) {
    out.totals[0] = tiling.num_tiles();
    out.totals[1] = grid.num_tiles();
    out.totals[2] = tiling.parts.validate() ? 1 : 0;
  }
  if (i < tiling.num_tiles()) {
    const RowRange rr = tiling.rows_of(i);
    out.part_of[i] = tiling.part_of(i);
    out.tile_rows[2 * i] = rr.begin;
    out.tile_rows[2 * i + 1] = rr.end;
  }
  if (i < tokens) {
    out.tile_of_row[i] = tiling.tile_of_row(i);
    out.owner_of_row[i] = tiling.parts.owner_of_row(i);
  }
  if (i < grid.num_tiles()) {
    const GroupTileCoord c = grid.coord(i);
    const Rect r = grid.region(c);
    out.grid_coord[3 * i] = c.group;
    out.grid_coord[3 * i + 1] = c.m;
    out.grid_coord[3 * i + 2] = c.n;
    out.grid_rect[4 * i] = r.row;
    out.grid_rect[4 * i + 1] = r.col;
    out.grid_rect[4 * i + 2] = r.rows;
    out.grid_rect[4 * i + 3] = r.cols;
  }
}

TEST(DynamicMappingsOnDevice, ReadTablesARoutingKernelWrote) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 20; ++iter) {
    const int experts = rng.uniform_int(1, 300);
    const int tokens = rng.uniform_int(0, 20000);
    const int chunk = rng.uniform_int(1, 300);
    const int64_t n = rng.uniform(1, 2048);
    const int tile_m = 128, tile_n = rng.coin() ? 128 : 256;
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " experts " << experts << " tokens "
                                      << tokens << " chunk " << chunk << " n " << n);
    // Skewed routing: a few hot experts, many cold or empty.
    std::vector<int> expert_of_token(static_cast<size_t>(tokens));
    const int hot = rng.uniform_int(1, experts);
    for (int& e : expert_of_token) e = rng.uniform_int(0, rng.coin(0.8) ? hot - 1 : experts - 1);

    const int64_t max_tiles = DynamicSegmentTiling::max_num_tiles(tokens, experts, chunk);
    const int64_t max_grid = DynamicTileGrid::max_num_tiles(tokens, experts, n, tile_m, tile_n);
    DeviceArray<int> d_experts(expert_of_token.size() + 1), d_status(3), d_totals(3);
    DeviceArray<int64_t> d_counts(experts), d_offsets(experts + 1), d_tile_rows(2 * max_tiles + 2),
        d_grid_rect(4 * max_grid + 4);
    DeviceArray<int> d_tiling_first(experts + 1), d_grid_first(experts + 1);
    DeviceArray<int> d_part_of(max_tiles + 1), d_tile_of_row(tokens + 1),
        d_owner_of_row(tokens + 1), d_grid_coord(3 * max_grid + 3);
    TL_CUDA_CHECK(cudaMemcpy(d_experts.p, expert_of_token.data(), tokens * sizeof(int),
                             cudaMemcpyHostToDevice));

    // The views, before any table holds data.
    const DynamicRowPartition rows = DynamicRowPartition::make(experts, d_offsets.p);
    const DynamicSegmentTiling tiling = DynamicSegmentTiling::make(rows, chunk, d_tiling_first.p);
    const DynamicTileGrid grid = DynamicTileGrid::make(rows, n, tile_m, tile_n, d_grid_first.p);

    route<<<1, kBlock>>>(d_experts.p, tokens, tiling, grid, d_counts.p, d_offsets.p,
                         d_tiling_first.p, d_grid_first.p, d_status.p);
    const int threads = static_cast<int>(std::max<int64_t>({max_tiles, max_grid, tokens, 1}));
    read_views<<<(threads + kBlock - 1) / kBlock, kBlock>>>(
        tiling, grid, tokens,
        Answers{d_part_of.p, d_tile_rows.p, d_tile_of_row.p, d_owner_of_row.p, d_grid_coord.p,
                d_grid_rect.p, d_totals.p});
    TL_CUDA_CHECK(cudaGetLastError());
    TL_CUDA_CHECK(cudaDeviceSynchronize());

    // The same views over host copies of the tables.
    const std::vector<int> status = to_host(d_status, 3), totals = to_host(d_totals, 3);
    ASSERT_EQ(status[0], 1);
    const std::vector<int64_t> offsets = to_host(d_offsets, experts + 1);
    const std::vector<int> tiling_first = to_host(d_tiling_first, experts + 1),
                           grid_first = to_host(d_grid_first, experts + 1);
    std::vector<int64_t> counts(static_cast<size_t>(experts), 0);
    for (int e : expert_of_token) ++counts[e];
    std::vector<int64_t> want_offsets(experts + 1);
    offsets_from_counts(counts, want_offsets);
    ASSERT_EQ(offsets, want_offsets);
    const DynamicRowPartition h_rows = DynamicRowPartition::make(experts, offsets.data());
    std::vector<int> want_first(experts + 1), want_grid_first(experts + 1);
    const DynamicSegmentTiling h_tiling =
        DynamicSegmentTiling::make(h_rows, chunk, want_first.data());
    const DynamicTileGrid h_grid =
        DynamicTileGrid::make(h_rows, n, tile_m, tile_n, want_grid_first.data());
    ASSERT_EQ(status[1], fill_first_tiles(h_rows, chunk, want_first));
    ASSERT_EQ(status[2], fill_first_tiles(h_grid, want_grid_first));
    ASSERT_EQ(tiling_first, want_first);
    ASSERT_EQ(grid_first, want_grid_first);
    ASSERT_EQ(totals[0], h_tiling.num_tiles());
    ASSERT_EQ(totals[1], h_grid.num_tiles());
    ASSERT_EQ(totals[2], 1);

    const int tiles = h_tiling.num_tiles(), grid_tiles = h_grid.num_tiles();
    const std::vector<int> part_of = to_host(d_part_of, tiles);
    const std::vector<int64_t> tile_rows = to_host(d_tile_rows, 2 * static_cast<size_t>(tiles));
    for (int t = 0; t < tiles; ++t) {
      ASSERT_EQ(part_of[t], h_tiling.part_of(t)) << "tile " << t;
      ASSERT_EQ(tile_rows[2 * t], h_tiling.rows_of(t).begin) << "tile " << t;
      ASSERT_EQ(tile_rows[2 * t + 1], h_tiling.rows_of(t).end) << "tile " << t;
    }
    const std::vector<int> tile_of_row = to_host(d_tile_of_row, tokens),
                           owner_of_row = to_host(d_owner_of_row, tokens);
    for (int r = 0; r < tokens; ++r) {
      ASSERT_EQ(tile_of_row[r], h_tiling.tile_of_row(r)) << "row " << r;
      ASSERT_EQ(owner_of_row[r], h_rows.owner_of_row(r)) << "row " << r;
    }
    const std::vector<int> grid_coord = to_host(d_grid_coord, 3 * static_cast<size_t>(grid_tiles));
    const std::vector<int64_t> grid_rect =
        to_host(d_grid_rect, 4 * static_cast<size_t>(grid_tiles));
    for (int t = 0; t < grid_tiles; ++t) {
      const GroupTileCoord c = h_grid.coord(t);
      const Rect r = h_grid.region(c);
      ASSERT_EQ(grid_coord[3 * t], c.group) << "grid tile " << t;
      ASSERT_EQ(grid_coord[3 * t + 1], c.m) << "grid tile " << t;
      ASSERT_EQ(grid_coord[3 * t + 2], c.n) << "grid tile " << t;
      ASSERT_EQ(grid_rect[4 * t], r.row) << "grid tile " << t;
      ASSERT_EQ(grid_rect[4 * t + 1], r.col) << "grid tile " << t;
      ASSERT_EQ(grid_rect[4 * t + 2], r.rows) << "grid tile " << t;
      ASSERT_EQ(grid_rect[4 * t + 3], r.cols) << "grid tile " << t;
    }
  }
}

// A device kernel checks a table before using it: validate() and a refused fill.
__global__ void check_table(DynamicRowPartition rows, int* first, int* out) {
  out[0] = rows.first_bad_offset();
  out[1] = fill_first_tiles(rows, 16, first);
}

TEST(DynamicMappingsOnDevice, ValidateFindsABadTable) {
  const std::vector<int64_t> bad{0, 5, 9, 7, 12};  // offsets[3] < offsets[2]
  DeviceArray<int64_t> d_offsets(bad.size());
  DeviceArray<int> d_first(bad.size()), d_out(2);
  TL_CUDA_CHECK(
      cudaMemcpy(d_offsets.p, bad.data(), bad.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  check_table<<<1, 1>>>(DynamicRowPartition::make(4, d_offsets.p), d_first.p, d_out.p);
  TL_CUDA_CHECK(cudaGetLastError());
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int> out = to_host(d_out, 2);
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[1], -1);
}

}  // namespace
