// MoE routing on the device (ops/moe_route_cuda.hpp): one block of 1024 threads, 32 warps, warp w
// owning the w-th contiguous chunk of the pairs.
//
// 1. Counts: each warp counts its chunk's pairs per expert (the lanes routing to one expert find
//    each other with match.any; one adds for them) into its own row of a [warps][experts] table; a
//    bad id lowers the shared first-bad-pair word instead.
// 2. Offsets: each expert's count is its column's sum; one warp scans the counts into the offsets;
//    each warp's entry then becomes where its pairs of that expert start (the offset plus the
//    earlier warps' counts).
// 3. Placing: each warp walks its chunk again, 32 pairs a step, in pair order; the lanes of one
//    expert take consecutive rows by lane from the warp's start for that expert, which then moves
//    past them. Within an expert the rows therefore follow the pairs' order, as ops/moe_routing.hpp's
//    one-thread form places them. No block barrier inside the walks: each warp owns its row of
//    the table.
// 4. Optionally one thread fills the grouped GEMM grid's first-tile table from the offsets.
#include <cuda_runtime.h>

#include <climits>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/moe_route_cuda.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 8;  // ids loaded ahead in a walk: independent loads in flight

size_t route_smem_bytes(int experts) {
  return size_t(experts) * kWarps * sizeof(int);  // [kWarps][experts]: counts, then starts (< 2^31)
}

// Warp w's chunk of the pairs: [begin, end), whole steps of 32 from begin.
struct Chunk {
  int64_t begin, end;
};
TL_DEVICE Chunk chunk_of(int64_t pairs, int w) {
  const int64_t per = (pairs + kWarps * 32 - 1) / (kWarps * 32) * 32;
  const int64_t begin = min(pairs, per * w);
  return {begin, min(pairs, begin + per)};
}

// Walks the chunk 32 pairs a step (every lane in every step, past the end with expert -1), calling
// step(p, e, same): p this lane's pair, e its expert or -1, same the lanes of the same e.
template <class Step>
TL_DEVICE void walk(const int32_t* __restrict__ ids, Chunk c, int experts, int lane, Step&& step) {
  for (int64_t base = c.begin; base < c.end; base += 32 * kUnroll) {
    int e[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = base + u * 32 + lane;
      e[u] = p < c.end ? __ldg(&ids[p]) : -1;
    }
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = base + u * 32 + lane;
      const int eu = e[u] >= 0 && e[u] < experts ? e[u] : (p < c.end ? -2 : -1);
      step(p, eu, __match_any_sync(0xffffffffu, eu));
      __syncwarp();
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    moe_route_kernel(const int32_t* __restrict__ ids, int64_t pairs, int experts, MoeRouteTables out) {
  extern __shared__ __align__(16) unsigned char smem[];
  int* table = reinterpret_cast<int*>(smem);  // [kWarps][experts]
  __shared__ unsigned long long first_bad;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  int* mine = table + warp * experts;
  const Chunk chunk = chunk_of(pairs, warp);

  for (int i = tid; i < experts * kWarps; i += kThreads) table[i] = 0;
  if (tid == 0) first_bad = ULLONG_MAX;
  __syncthreads();

  // 1. each warp's counts (-2: a bad id, -1: past the chunk)
  walk(ids, chunk, experts, lane, [&](int64_t p, int e, unsigned same) {
    if (e >= 0 && (same & lanes_below) == 0) mine[e] += __popc(same);
    if (e == -2) atomicMin(&first_bad, static_cast<unsigned long long>(p));
  });
  __syncthreads();

  // 2. the counts (column sums), the offsets (warp 0's scan), then each warp's starts
  for (int e = tid; e < experts; e += kThreads) {
    long long c = 0;
    for (int w = 0; w < kWarps; ++w) c += table[w * experts + e];
    out.counts[e] = c;
  }
  __syncthreads();
  if (warp == 0) {
    long long carry = 0;
    if (lane == 0) out.offsets[0] = 0;
    for (int e0 = 0; e0 < experts; e0 += 32) {
      const int e = e0 + lane;
      const long long c = e < experts ? out.counts[e] : 0;
      long long incl = c;
      for (int d = 1; d < 32; d *= 2) {
        const long long v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += v;
      }
      if (e < experts) out.offsets[e + 1] = carry + incl;
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
  __syncthreads();
  for (int e = tid; e < experts; e += kThreads) {
    int run = static_cast<int>(out.offsets[e]);
    for (int w = 0; w < kWarps; ++w) {
      const int c = table[w * experts + e];
      table[w * experts + e] = run;
      run += c;
    }
  }
  __syncthreads();

  // 3. placing
  walk(ids, chunk, experts, lane, [&](int64_t p, int e, unsigned same) {
    if (e >= 0) {
      const int64_t row = mine[e] + __popc(same & lanes_below);
      out.pair_of_row[row] = p;
      out.row_of_pair[p] = row;
    } else if (e == -2) {
      out.row_of_pair[p] = -1;
    }
    __syncwarp();  // every lane read its start before the leader moves it
    if (e >= 0 && (same & lanes_below) == 0) mine[e] += __popc(same);
  });

  // 4. status, and the grid's first tiles (the offsets were written before the barriers above)
  if (tid == 0) {
    *out.status = first_bad == ULLONG_MAX ? 0 : static_cast<int64_t>(first_bad) + 1;
    if (out.first_tiles != nullptr && fill_first_tiles(out.grid, out.first_tiles) < 0)
      out.first_tiles[experts] = -1;
  }
}
TL_REGISTER_KERNELS(moe_route_kernel);

}  // namespace

void moe_route_async(const int32_t* topk_ids, int64_t tokens, int topk, int experts,
                     const MoeRouteTables& out, cudaStream_t stream) {
  TL_REQUIRE(experts >= 1 && experts <= kMoeRouteMaxExperts,
             "moe_route: experts must be in [1, " << kMoeRouteMaxExperts << "], got " << experts);
  TL_REQUIRE(topk >= 1 && topk <= experts,
             "moe_route: top-k must be in [1, experts = " << experts << "], got " << topk);
  TL_REQUIRE(tokens >= 0, "moe_route: tokens must be >= 0, got " << tokens);
  const int64_t pairs = tokens * topk;
  TL_REQUIRE(pairs < (int64_t{1} << 31),
             "moe_route: " << tokens << " tokens x top-" << topk << " = " << pairs << " pairs; at most 2^31 - 1");
  TL_REQUIRE(out.counts && out.offsets && out.status && (pairs == 0 || (out.pair_of_row && out.row_of_pair)),
             "moe_route: a table pointer is null (counts, offsets, pair_of_row, row_of_pair and status are "
             "required)");
  TL_REQUIRE(pairs == 0 || topk_ids != nullptr, "moe_route: topk_ids is null");
  if (out.first_tiles != nullptr) {
    TL_REQUIRE(out.grid.rows.offsets == out.offsets && out.grid.rows.num_parts == experts,
               "moe_route: the grid's rows must be a view of the routing's offsets over its " << experts
                                                                                              << " experts");
    TL_REQUIRE(out.grid.tile_m >= 1 && out.grid.tile_n >= 1 && out.grid.extent_n >= 1,
               "moe_route: the grid has no tiles' shape (make it with DynamicTileGrid::make)");
  }
  const size_t smem = route_smem_bytes(experts);
  if (smem > 48 * 1024)
    TL_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(&moe_route_kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  moe_route_kernel<<<1, kThreads, smem, stream>>>(topk_ids, pairs, experts, out);
  TL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tilelink::cuda
