// MoE routing on the device: the tables of ops/moe_routing.hpp (counts, offsets, pair_of_row,
// row_of_pair, in the same fixed order: by expert, then by pair), and optionally the first-tile table
// of the grouped GEMM's DynamicTileGrid over those offsets, computed from topk_ids in device memory by
// three kernels in stream order:
//
//   count  up to kMoeRouteBlocks blocks, each owning a contiguous chunk of the pairs, count their
//          chunk's pairs per expert into a [blocks][experts] scratch table
//   scan   one block: the counts, the offsets, where each block's rows of each expert start, the
//          status and the first-tile table
//   place  the same blocks walk their chunks again and write pair_of_row and row_of_pair
//
// No host synchronisation: it enqueues on `stream`, so a MoE op calls it inside a captured CUDA graph
// and the routing may change between replays.
//
//   void* scratch;  // cudaMalloc'd once: moe_route_scratch_bytes(max_tokens, topk, experts)
//   cuda::MoeRouteTables t{counts, offsets, pair_of_row, row_of_pair, status, scratch};
//   cuda::moe_route_async(topk_ids, tokens, topk, experts, t, stream);
//   // later kernels in `stream` read the tables; the host reads *status after its own sync
//
// A bad id (outside [0, experts)) is not placed: its pair's row_of_pair is -1, the counts and
// offsets leave it out, and *status holds 1 + the first bad pair (0 when every id is good). The
// host form (moe_route over a span) refuses bad ids before anything runs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace tilelink::cuda {

// Experts one call routes (the count and place kernels hold a [16 warps][experts] table of int in
// shared memory: 64 KiB at this bound).
inline constexpr int kMoeRouteMaxExperts = 1024;
// Blocks of the count and place kernels at most; fewer when the pairs are few (each block takes at
// least ~1024 pairs, and there is always one).
inline constexpr int kMoeRouteBlocks = 64;

struct MoeRouteTables {
  int64_t* counts = nullptr;       // [experts]
  int64_t* offsets = nullptr;      // [experts + 1]
  int64_t* pair_of_row = nullptr;  // [tokens * topk]
  int64_t* row_of_pair = nullptr;  // [tokens * topk]
  int64_t* status = nullptr;       // 0, or 1 + the first pair whose id is out of range
  // Device memory of at least moe_route_scratch_bytes(tokens, topk, experts) bytes, 4-byte aligned:
  // the kernels' own tables. It needs no initialisation and carries nothing from one call to the
  // next (each call writes every entry before reading it); calls that may run at once (two streams)
  // need their own.
  void* scratch = nullptr;
  // Optional: the grouped GEMM's tile grid over `offsets` (its rows view must be over the same
  // table) and its first-tile table [experts + 1], filled after the offsets. first_tiles[experts]
  // is then the grid's tile count; -1 there when the table would overflow an int.
  DynamicTileGrid grid{};
  int* first_tiles = nullptr;
};

// Bytes of MoeRouteTables::scratch for a call of tokens x topk pairs over `experts` experts; enough
// for every call with at most as many pairs and experts. Throws tilelink::Error on tokens < 0,
// topk < 1 or experts < 1.
size_t moe_route_scratch_bytes(int64_t tokens, int topk, int experts);

// Checks the arguments on the host (tokens >= 0, 1 <= topk <= experts <= kMoeRouteMaxExperts,
// tokens * topk below 2^31, every table and the scratch non-null, a grid over the same offsets) and
// throws tilelink::Error before anything is enqueued.
void moe_route_async(const int32_t* topk_ids, int64_t tokens, int topk, int experts,
                     const MoeRouteTables& out, cudaStream_t stream);

// The grouped GEMM's tile rows (tile_rows rows each, over the routing's offsets and first-tile
// table) in the order their tokens arrive on rank `rank` of a world whose ranks hold `tokens`: the
// device form of ops/moe_routing.hpp's moe_arrival_row_order, the same permutation. order and keys
// (scratch): at least as many entries as tile rows any routing gives (DynamicSegmentTiling::
// max_num_tiles). One block, after the routing on the same stream; no host synchronisation.
void moe_arrival_order_async(const int64_t* offsets, const int* first_tile_rows, int experts, int tile_rows,
                             const int64_t* pair_of_row, int topk, const RowPartition& tokens, int rank, int* order,
                             uint8_t* keys, cudaStream_t stream);
// The same in completion order (ops/moe_routing.hpp's moe_completion_row_order, the same
// permutation): layer 1's grouped GEMM finishes first the rows the top-k reduce takes first.
void moe_completion_order_async(const int64_t* offsets, const int* first_tile_rows, int experts, int tile_rows,
                                const int64_t* pair_of_row, int topk, const MoeCompletion& completion, int* order,
                                uint8_t* keys, cudaStream_t stream);

}  // namespace tilelink::cuda
