// MoE routing on the device (ops/moe_route_cuda.hpp): one block of 1024 threads.
//
// 1. Counts: each thread adds its pairs' experts into a shared histogram; a bad id lowers the
//    shared first-bad-pair word instead.
// 2. Offsets: one warp scans the counts (32 experts a step, carried across steps) into the offsets,
//    which also start each expert's placing cursor.
// 3. Placing, in rounds of 1024 pairs in pair order: the lanes of a warp that route to the same
//    expert find each other (match.any) and take consecutive rows by lane; the warps of the round
//    take them in warp order (each warp's count per expert in shared memory, summed over the warps
//    before it); the cursors then move past the round. Within an expert the rows therefore follow
//    the pairs' order, as ops/moe_routing.hpp's one-thread form places them.
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

size_t route_smem_bytes(int experts) {
  // cursors [experts] int64, histogram [experts] int, per-warp counts [kWarps][experts] int
  return size_t(experts) * (8 + 4 + 4 * kWarps);
}

__global__ void __launch_bounds__(kThreads, 1)
    moe_route_kernel(const int32_t* __restrict__ ids, int64_t pairs, int experts, MoeRouteTables out) {
  extern __shared__ __align__(16) unsigned char smem[];
  long long* cursor = reinterpret_cast<long long*>(smem);
  int* count = reinterpret_cast<int*>(cursor + experts);
  int* warp_count = count + experts;  // [kWarps][experts]
  __shared__ unsigned long long first_bad;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  for (int i = tid; i < experts * (kWarps + 1); i += kThreads) count[i] = 0;  // and warp_count
  if (tid == 0) first_bad = ULLONG_MAX;
  __syncthreads();

  // 1. counts
  for (int64_t p = tid; p < pairs; p += kThreads) {
    const int32_t e = ids[p];
    if (e < 0 || e >= experts)
      atomicMin(&first_bad, static_cast<unsigned long long>(p));
    else
      atomicAdd(&count[e], 1);
  }
  __syncthreads();

  // 2. offsets (warp 0), the cursors, the counts out
  if (warp == 0) {
    long long carry = 0;
    if (lane == 0) out.offsets[0] = 0;
    for (int e0 = 0; e0 < experts; e0 += 32) {
      const int e = e0 + lane;
      const long long c = e < experts ? count[e] : 0;
      long long incl = c;
      for (int d = 1; d < 32; d *= 2) {
        const long long v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += v;
      }
      if (e < experts) {
        cursor[e] = carry + incl - c;
        out.counts[e] = c;
        out.offsets[e + 1] = carry + incl;
      }
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
  __syncthreads();

  // 3. placing, 1024 pairs a round
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int64_t base = 0; base < pairs; base += kThreads) {
    const int64_t p = base + tid;
    int e = p < pairs ? ids[p] : -1;
    if (e >= experts) e = -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank_in_warp = __popc(same & lanes_below);
    const bool leader = rank_in_warp == 0;
    if (e >= 0 && leader) warp_count[warp * experts + e] = __popc(same);
    __syncthreads();
    if (e >= 0) {
      long long row = cursor[e] + rank_in_warp;
      for (int w = 0; w < warp; ++w) row += warp_count[w * experts + e];
      out.pair_of_row[row] = p;
      out.row_of_pair[p] = row;
    } else if (p < pairs) {
      out.row_of_pair[p] = -1;
    }
    __syncthreads();  // every thread read the cursors and the warps' counts
    if (e >= 0 && leader) {
      atomicAdd(reinterpret_cast<unsigned long long*>(&cursor[e]), static_cast<unsigned long long>(__popc(same)));
      warp_count[warp * experts + e] = 0;
    }
    __syncthreads();
  }

  // 4. status, and the grid's first tiles (after every thread's offsets: the barrier above, or the
  // one after step 2 when there are no pairs)
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
