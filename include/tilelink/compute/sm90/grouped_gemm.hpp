// Grouped GEMM on the sm90 tile engine: for every group g (an MoE expert),
//
//   C[rows of g] (+)= A[rows of g] * B_g^T
//
// where the rows of A and C are stacked by group: group g owns rows [offsets[g], offsets[g + 1]) of
// A [max_rows, K] and C [max_rows, N], and B holds every group's own weights B_g [N, K] one after
// another ([groups, N, K], nn.Linear layout). The group sizes live in a device table written by an
// earlier kernel (the MoE routing kernel, ops/moe_route_cuda.hpp), so a call never synchronizes with
// the host and a captured CUDA graph follows new sizes on every replay.
//
// The engine's tile walk runs over the groups' tiles (core/grouped_walk.hpp): kTileM x tile_n tiles
// over the same offsets, numbered group by group. Their table is the groups' first tile rows (groups + 1 entries: a
// DynamicTileGrid of one column over the offsets, grouped_gemm_row_grid, whose first-tile table
// does not depend on N or the tile width, so one table serves both GEMMs of an MoE layer); the
// routing kernel writes it beside the offsets, grouped_gemm_first_tile_rows_async from any offsets
// table. Group g's tiles are ids [first_tile_rows[g] * tiles_n, first_tile_rows[g + 1] * tiles_n),
// tile (m, n) of the group at (first_tile_rows[g] + m) * tiles_n + n. Each persistent block takes
// every num_blocks-th id; an id maps to its group by a binary search of the table (copied into
// shared memory when a block starts), and
// inside a group the tiles go down bands of kGroupedBand tile rows, column after column, so a band's
// rows of A stay in L2 while each column of B_g streams once per band; with a tile-row order table
// (tile_row_order) the bands go over the tile rows in the table's order instead. A tile's loads read a whole
// 128-row box of A from the group's row (rows past the group are read and multiplied but never
// stored); B_g is the TMA batch coordinate g. Stores are clipped to the group's rows. Empty groups
// own no tiles; a table of no rows at all launches blocks that find nothing to do.
//
// Gathered A (a_row_index): the grouped rows need not be stored at all. Grouped row i then reads
// A's row a_row_index[i] / a_row_div (an MoE layer's pair -> its token: pair / topk), A being the
// tokens [a_rows, K]. The producer warpgroup's four warps load instead of the TMA warp alone: each
// copies 32 of a tile's 128 rows with cp.async, 16 bytes a lane at a time, into the places the
// 128-row TMA box would have put them (the 128-byte swizzle), and one lane loads B with TMA. Rows of
// a tile past its group's end read the group's last row again. No pass over the tokens writes them
// in grouped order first. A gathered launch takes no notify hook (its store warp loads). (A TMA box
// a row, 128 boxes a stage from one warp, ran 4-6x slower than the contiguous load; two warps of
// cp.async 0.84 of the gather kernel plus the contiguous GEMM: bench/notes/moe.md.)
//
// Hooks (as gemm.hpp's): TileWork.group is the group, TileWork.tile its tile in the group's own grid,
// TileWork.region the rows of the stacked C it covers. No split of the last wave. Two optional hook
// points give an op's work to the kernel's own warps (impl/gemm_kernel.cuh): prologue(), every
// warp once before the roles split, and side_work(), the producer warps that load and store
// nothing, beside the mainloop (MoE layer 0's gather ahead, ops/moe_cuda.hpp: MoePath::kAhead).
//
//   GroupedGemmArgs g;
//   g.a = x_sorted; g.b = w1; g.c = h; g.max_rows = tokens * topk; g.n = ffn; g.k = hidden;
//   g.groups = experts; g.offsets = route.offsets; g.first_tile_rows = route.first_tiles;
//   grouped_gemm(g, stream);  // route.grid = grouped_gemm_row_grid(g) when the routing ran
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/core/dynamic_tile_grid.hpp"

namespace tilelink::compute::sm90 {

// Tile rows a band of the walk inside a group holds (see above).
inline constexpr int kGroupedBand = 8;
// Groups one launch takes (the first-tile table is copied into shared memory).
inline constexpr int kGroupedMaxGroups = 1024;

struct GroupedGemmArgs {
  const void* a = nullptr;  // [max_rows, k], row stride lda; group g's rows from offsets[g]
  const void* b = nullptr;  // [groups, n, k]: B_g [n, k] (row stride ldb) at b + g * n * ldb
  void* c = nullptr;        // [max_rows, n], row stride ldc
  int64_t max_rows = 0;     // rows of A and C (offsets[groups] <= max_rows)
  int64_t n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // 0: packed (k, k, n)
  int groups = 0;
  const int64_t* offsets = nullptr;  // device, [groups + 1]: offsets[0] = 0, non-decreasing
  const int* first_tile_rows = nullptr;  // device, [groups + 1]: the groups' first tile rows
  // Optional, device [first_tile_rows[groups]]: the order the walk visits the tile rows in (a
  // permutation, core/grouped_walk.hpp), e.g. by when their rows' inputs arrive. Written by an
  // earlier kernel, like the tables. nullptr: group by group.
  const int* tile_row_order = nullptr;
  // Gathered A (see above): device [max_rows] (rows past offsets[groups] are never read), A's
  // rows, the divisor. nullptr: A is [max_rows, k], grouped row i is A's row i.
  const int64_t* a_row_index = nullptr;
  int64_t a_rows = 0;
  int a_row_div = 1;
  DType in_type = DType::kBF16;      // A and B
  DType out_type = DType::kBF16;     // the same as in_type (bf16 -> bf16, fp16 -> fp16)
  EpilogueMode epilogue = EpilogueMode::kStore;
  int tile_n = 0;   // kTileN or kTileNSlim; 0: grouped_gemm_pick_tile_n
  int num_sms = 0;  // blocks of the persistent grid; 0: every SM
};

// The tile width a launch takes: args.tile_n, or kTileNSlim where N has at most 4 tiles of
// kTileN (their last column would be mostly padding or the groups' tiles too few for the SMs),
// else kTileN.
TL_HD inline int grouped_gemm_pick_tile_n(int64_t n) {
  return n <= 4 * kTileN && (n % kTileN != 0 || n < 2 * kTileN) ? kTileNSlim : kTileN;
}
int grouped_gemm_tile_n(const GroupedGemmArgs& args);

// The grid of tile rows over args.offsets (one column; first-tile table args.first_tile_rows):
// what the routing kernel fills (MoeRouteTables::grid).
DynamicTileGrid grouped_gemm_row_grid(const GroupedGemmArgs& args);

// At most how many tiles any table gives (the size of per-tile signal arrays; below 2^31, checked).
int64_t grouped_gemm_max_tiles(const GroupedGemmArgs& args);

// Fills args.first_tile_rows from args.offsets on `stream` (one small kernel; no host sync), for
// offsets that did not come from the routing kernel. A bad table (offsets[0] != 0, decreasing, or
// more tile rows than an int) writes -1 at first_tile_rows[groups], and a launch on it computes
// nothing.
void grouped_gemm_first_tile_rows_async(const GroupedGemmArgs& args, cudaStream_t stream);

// Checks every argument and throws tilelink::Error before anything is launched: null pointers,
// groups out of [1, kGroupedMaxGroups], N or K not a multiple of 8, bad strides or alignment, a
// gathered A without rows or with a divisor < 1,
// dtypes other than bf16 -> bf16 and fp16 -> fp16, tile_n, num_sms, an sm_90 device.
void grouped_gemm_check(const GroupedGemmArgs& args);

// Runs the plain engine in grouped mode (no hooks) on `stream`. Asynchronous.
void grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream);

}  // namespace tilelink::compute::sm90
