// MoE routing on the device: the tables of ops/moe_routing.hpp (counts, offsets, pair_of_row,
// row_of_pair, in the same fixed order: by expert, then by pair), and optionally the first-tile table
// of the grouped GEMM's DynamicTileGrid over those offsets, computed by one kernel from topk_ids in
// device memory. No host synchronisation: it enqueues on `stream`, so a MoE op calls it inside a
// captured CUDA graph and the routing may change between replays.
//
//   cuda::MoeRouteTables t{counts, offsets, pair_of_row, row_of_pair, status};
//   cuda::moe_route_async(topk_ids, tokens, topk, experts, t, stream);
//   // later kernels in `stream` read the tables; the host reads *status after its own sync
//
// A bad id (outside [0, experts)) is not placed: its pair's row_of_pair is -1, the counts and
// offsets leave it out, and *status holds 1 + the first bad pair (0 when every id is good). The
// host form (moe_route over a span) refuses bad ids before anything runs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tilelink/core/dynamic_tile_grid.hpp"

namespace tilelink::cuda {

// Experts one launch routes (a [32 warps][experts] table of int in shared memory: 128 KiB at this
// bound).
inline constexpr int kMoeRouteMaxExperts = 1024;

struct MoeRouteTables {
  int64_t* counts = nullptr;       // [experts]
  int64_t* offsets = nullptr;      // [experts + 1]
  int64_t* pair_of_row = nullptr;  // [tokens * topk]
  int64_t* row_of_pair = nullptr;  // [tokens * topk]
  int64_t* status = nullptr;       // 0, or 1 + the first pair whose id is out of range
  // Optional: the grouped GEMM's tile grid over `offsets` (its rows view must be over the same
  // table) and its first-tile table [experts + 1], filled after the offsets. first_tiles[experts]
  // is then the grid's tile count; -1 there when the table would overflow an int.
  DynamicTileGrid grid{};
  int* first_tiles = nullptr;
};

// Checks the arguments on the host (tokens >= 0, 1 <= topk <= experts <= kMoeRouteMaxExperts,
// tokens * topk below 2^31, every table non-null, a grid over the same offsets) and throws
// tilelink::Error before anything is enqueued.
void moe_route_async(const int32_t* topk_ids, int64_t tokens, int topk, int experts,
                     const MoeRouteTables& out, cudaStream_t stream);

}  // namespace tilelink::cuda
