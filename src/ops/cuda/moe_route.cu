// MoE routing on the device (ops/moe_route_cuda.hpp): three kernels in stream order.
//
// The pairs are cut into B contiguous chunks in pair order (B = kMoeRouteBlocks, or fewer so that
// each chunk holds at least ~kMinPairsPerBlock pairs), block b of the count and place kernels owning
// chunk b; each block's chunk is cut the same way into kWarps warp chunks, warp w owning the w-th. A
// warp walks its chunk 32 pairs a step; the lanes routing to one expert find each other with
// match.any, and the lowest of them acts for them.
//
// 1. count (B blocks): each warp counts its chunk's pairs per expert into its own row of a
//    [kWarps][experts] table in shared memory (no atomics: a warp owns its row). The block writes
//    the column sums, its counts per expert, to its row of the scratch table [B][experts], and its
//    first bad pair (a shared atomicMin over its warps) to its scratch slot.
// 2. scan (one block, a thread per expert): counts[e] is the column's sum over the blocks; the
//    offsets are a block-wide exclusive scan of the counts; each scratch entry [b][e] becomes where
//    block b's rows of expert e start (offsets[e] plus the earlier blocks' counts of e). The status
//    is 1 + the least of the blocks' first bad pairs; the grid's first-tile table is a second
//    block-wide scan, of the experts' tiles.
// 3. place (B blocks): each block counts its chunk per warp again, as in 1 (the per-warp counts are
//    not kept in scratch: reading the chunk's ids again from L2 is cheaper than writing and reading
//    [B][kWarps][experts] counts), and turns them into each warp's starts: the block's start from 2
//    plus the earlier warps' counts. Each warp then walks its chunk again; the lanes of one expert
//    take consecutive rows by lane from the warp's start for that expert, which then moves past
//    them. Blocks, warps and lanes all follow pair order, so within an expert the rows follow the
//    pairs' order, as ops/moe_routing.hpp's one-thread form places them.
//
// NOTE: nothing carries from one call to the next. Every scratch entry a kernel reads was written
// earlier in the same call: each count block writes its whole row and its first-bad slot whatever
// its chunk holds, and the scan rewrites the rows the place kernel reads. So the scratch needs no
// initialisation (no memset at setup, no reset at the end), and a captured graph replays with any
// routing, bad ids included.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/core/workspace.hpp"
#include "tilelink/ops/moe_route_cuda.hpp"
#include "tilelink/ops/moe_routing.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda {
namespace {

constexpr int kThreads = 512;  // count and place kernels
constexpr int kWarps = kThreads / 32;
constexpr int kScanThreads = 1024;  // scan kernel: a thread per expert
constexpr int kUnroll = 8;          // ids loaded ahead in a walk: independent loads in flight
constexpr int64_t kMinPairsPerBlock = 1024;
constexpr int kNoBadPair = INT_MAX;  // a first-bad slot with no bad pair (pairs < 2^31 - 1)

static_assert(kMoeRouteMaxExperts <= kScanThreads, "the scan kernel takes one expert a thread");
static_assert(kScanThreads / 32 <= 32, "the scan's warp totals are scanned by one warp");
static_assert(size_t(kMoeRouteMaxExperts) * kWarps * sizeof(int) <= 200 * 1024,
              "the per-warp table must fit in an SM's shared memory");

// The [kWarps][experts] table of the count and place kernels (< 2^31 bytes).
size_t table_smem_bytes(int experts) { return size_t(experts) * kWarps * sizeof(int); }

int route_blocks(int64_t pairs) {
  return static_cast<int>(std::clamp<int64_t>(pairs / kMinPairsPerBlock, 1, kMoeRouteBlocks));
}

// The scratch tables of one call (MoeRouteTables::scratch) for `blocks` blocks over `experts`.
struct RouteScratch {
  int blocks = 0, experts = 0;
  Field<int> rows;       // (blocks, experts): block b's count of expert e (count), then where its
                         // rows of e start (scan)
  Field<int> first_bad;  // (blocks): block b's first pair with a bad id, or kNoBadPair (count)
  uint64_t bytes = 0;
  void* base = nullptr;

  static RouteScratch make(int blocks, int experts, void* base) {
    LayoutBuilder layout;
    RouteScratch s;
    s.blocks = blocks;
    s.experts = experts;
    s.rows = layout.add<int>(int64_t{blocks} * experts);
    s.first_bad = layout.add<int>(blocks);
    s.bytes = layout.num_bytes();
    s.base = base;
    return s;
  }
  uint64_t num_bytes() const { return bytes; }
  TL_HD int* row(int b) const { return rows.in(base) + int64_t{b} * experts; }
  TL_HD int* first_bad_of(int b) const { return first_bad.in(base) + b; }
};

// Pairs [begin, end).
struct Chunk {
  int64_t begin, end;
};
// The i-th of `parts` contiguous pieces of `whole`, in order, each a whole number of 32-pair steps
// but the last non-empty one (trailing pieces may be empty). Blocks take the pieces of all pairs,
// warps the pieces of their block's.
TL_DEVICE Chunk piece_of(Chunk whole, int parts, int i) {
  const int64_t per = round_up(ceil_div(whole.end - whole.begin, parts), 32);
  const int64_t begin = min64(whole.end, whole.begin + per * i);
  return {begin, min64(whole.end, begin + per)};
}
TL_DEVICE Chunk warp_chunk(int64_t pairs, int blocks, int block, int warp) {
  return piece_of(piece_of(Chunk{0, pairs}, blocks, block), kWarps, warp);
}

// Walks the chunk 32 pairs a step (every lane in every step, past the end with expert -1), calling
// step(p, e, same): p this lane's pair, e its expert (-2: a bad id, -1: past the chunk), same the
// lanes of the same e.
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

// One warp counts its chunk's good pairs per expert into its row sRow of the block's table (zeroed
// before); on_bad(p) for each bad pair.
template <class OnBad>
TL_DEVICE void count_chunk(const int32_t* __restrict__ ids, Chunk c, int experts, int lane, int* sRow,
                           OnBad&& on_bad) {
  const unsigned lanes_below = (1u << lane) - 1u;
  walk(ids, c, experts, lane, [&](int64_t p, int e, unsigned same) {
    if (e >= 0 && (same & lanes_below) == 0) sRow[e] += __popc(same);
    if (e == -2) on_bad(p);
  });
}

// Exclusive scan of one value a thread over a block of kScanThreads threads, in thread order; total
// is the sum of all. Every thread of the block calls it; sWarp holds kScanThreads / 32 values.
TL_DEVICE long long block_exclusive_scan(long long v, int tid, long long* sWarp, long long& total) {
  constexpr int kScanWarps = kScanThreads / 32;
  const int lane = tid % 32, warp = tid / 32;
  long long incl = v;
  for (int d = 1; d < 32; d *= 2) {
    const long long u = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += u;
  }
  if (lane == 31) sWarp[warp] = incl;
  __syncthreads();
  if (warp == 0) {  // the warps' totals, scanned in place (inclusive)
    long long w = lane < kScanWarps ? sWarp[lane] : 0;
    for (int d = 1; d < 32; d *= 2) {
      const long long u = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += u;
    }
    if (lane < kScanWarps) sWarp[lane] = w;
  }
  __syncthreads();
  const long long before = warp > 0 ? sWarp[warp - 1] : 0;
  total = sWarp[kScanWarps - 1];
  __syncthreads();  // sWarp is free for the next scan
  return before + incl - v;
}

// 1. count: block b's counts per expert and its first bad pair, into its scratch row and slot.
__global__ void __launch_bounds__(kThreads, 1)
    moe_route_count_kernel(const int32_t* __restrict__ ids, int64_t pairs, int experts, RouteScratch scratch) {
  extern __shared__ __align__(16) unsigned char smem[];
  int* sTable = reinterpret_cast<int*>(smem);  // (kWarps, experts)
  __shared__ int sFirstBad;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, block = blockIdx.x;

  for (int i = tid; i < experts * kWarps; i += kThreads) sTable[i] = 0;
  if (tid == 0) sFirstBad = kNoBadPair;
  __syncthreads();

  count_chunk(ids, warp_chunk(pairs, scratch.blocks, block, warp), experts, lane, sTable + warp * experts,
              [&](int64_t p) { atomicMin(&sFirstBad, static_cast<int>(p)); });
  __syncthreads();

  // every entry of the block's row and its slot, whatever the chunk held (the scratch is not
  // initialised: see the top of the file)
  int* gRow = scratch.row(block);  // (experts)
  for (int e = tid; e < experts; e += kThreads) {
    int c = 0;
    for (int w = 0; w < kWarps; ++w) c += sTable[w * experts + e];
    gRow[e] = c;
  }
  if (tid == 0) *scratch.first_bad_of(block) = sFirstBad;
}

// 2. scan: the counts, the offsets, the blocks' starts, the status and the first-tile table.
__global__ void __launch_bounds__(kScanThreads, 1)
    moe_route_scan_kernel(int experts, RouteScratch scratch, MoeRouteTables out) {
  __shared__ long long sWarp[kScanThreads / 32];
  const int tid = threadIdx.x, e = tid;
  const bool mine = e < experts;  // this thread's expert

  // the counts: the columns' sums over the blocks
  long long count = 0;
  if (mine) {
#pragma unroll 8
    for (int b = 0; b < scratch.blocks; ++b) count += scratch.row(b)[e];
  }
  long long total = 0;
  const long long offset = block_exclusive_scan(count, tid, sWarp, total);
  if (mine) {
    out.counts[e] = count;
    out.offsets[e] = offset;
  }
  if (tid == 0) out.offsets[experts] = total;

  // where block b's rows of e start: the offset plus the earlier blocks' counts (rows < 2^31)
  if (mine) {
    int run = static_cast<int>(offset);
    for (int b = 0; b < scratch.blocks; ++b) {
      int* gEntry = scratch.row(b) + e;
      const int c = *gEntry;
      *gEntry = run;
      run += c;
    }
  }

  // the status: the least first bad pair over the blocks (their chunks are in pair order)
  if (tid < 32) {
    int first = kNoBadPair;
    for (int b = tid; b < scratch.blocks; b += 32) first = min(first, *scratch.first_bad_of(b));
    first = __reduce_min_sync(0xffffffffu, first);
    if (tid == 0) *out.status = first == kNoBadPair ? 0 : static_cast<int64_t>(first) + 1;
  }

  // the grid's first tiles: a scan of the experts' tiles, as fill_first_tiles makes them (the
  // offsets are this kernel's, so they pass its validation by construction)
  if (out.first_tiles != nullptr) {  // the same for the whole block
    __syncthreads();                 // the offsets written above are visible to the block
    const long long tiles = mine ? static_cast<long long>(out.grid.tiles_m(e)) * out.grid.tiles_n() : 0;
    long long all = 0;
    const long long first = block_exclusive_scan(tiles, tid, sWarp, all);
    if (mine) out.first_tiles[e] = static_cast<int>(min(first, static_cast<long long>(INT_MAX)));
    if (tid == 0) out.first_tiles[experts] = all <= INT_MAX ? static_cast<int>(all) : -1;
  }
}

// 3. place: block b's pairs into their rows, from its starts in scratch.
__global__ void __launch_bounds__(kThreads, 1)
    moe_route_place_kernel(const int32_t* __restrict__ ids, int64_t pairs, int experts, RouteScratch scratch,
                           int64_t* __restrict__ pair_of_row, int64_t* __restrict__ row_of_pair) {
  extern __shared__ __align__(16) unsigned char smem[];
  int* sTable = reinterpret_cast<int*>(smem);  // (kWarps, experts): counts, then starts
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, block = blockIdx.x;
  const unsigned lanes_below = (1u << lane) - 1u;
  int* sMine = sTable + warp * experts;
  const Chunk chunk = warp_chunk(pairs, scratch.blocks, block, warp);

  // each warp's counts again (the bad pairs were reported by the count kernel)
  for (int i = tid; i < experts * kWarps; i += kThreads) sTable[i] = 0;
  __syncthreads();
  count_chunk(ids, chunk, experts, lane, sMine, [](int64_t) {});
  __syncthreads();

  // each warp's starts: the block's start (the scan) plus the earlier warps' counts
  const int* gStarts = scratch.row(block);  // (experts)
  for (int e = tid; e < experts; e += kThreads) {
    int run = gStarts[e];
    for (int w = 0; w < kWarps; ++w) {
      const int c = sTable[w * experts + e];
      sTable[w * experts + e] = run;
      run += c;
    }
  }
  __syncthreads();

  // placing; no block barrier inside the walk: each warp owns its row of the table
  walk(ids, chunk, experts, lane, [&](int64_t p, int e, unsigned same) {
    if (e >= 0) {
      const int64_t row = sMine[e] + __popc(same & lanes_below);
      pair_of_row[row] = p;
      row_of_pair[p] = row;
    } else if (e == -2) {
      row_of_pair[p] = -1;
    }
    __syncwarp();  // every lane read its start before the leader moves it
    if (e >= 0 && (same & lanes_below) == 0) sMine[e] += __popc(same);
  });
}
// The tile-row orders (ops/moe_routing.hpp: arrival and completion), one block: a warp per tile
// row finds its key (the latest or the earliest of its rows'), then a stable counting sort over the
// `num_keys` keys (at most kMaxOrderKeys). The sort goes kOrderThreads tile rows a round: each
// warp's lanes of one key find each other with match.any and the lowest writes their count to the
// warp's row of `warp_count`; a tile row's place is the key's cursor, plus the earlier warps'
// counts of its key, plus its lanes before it; the cursors then move past the round. A bad table
// (first[experts] < 0) or no rows: nothing written, and the grouped GEMM computes nothing or walks
// no tile.
constexpr int kOrderThreads = 1024;
constexpr int kOrderWarps = kOrderThreads / 32;
constexpr int kMaxOrderKeys = 64;
static_assert(kMaxWorldSize <= kMaxOrderKeys && kMoeOrderKeys <= kMaxOrderKeys,
              "the order's tables hold one entry a key");

// A row's arrival on `rank` (the latest of a tile row's counts).
struct ArrivalKey {
  static constexpr bool kLatest = true;
  RowPartition tokens;
  int rank = 0;
  __device__ int of_row(const int64_t* pair_of_row, int topk, int64_t i) const {
    return moe_row_arrival(pair_of_row, topk, tokens, rank, i);
  }
  __device__ int count() const { return tokens.world_size; }
};
// A row's completion (the earliest of a tile row's counts).
struct CompletionKey {
  static constexpr bool kLatest = false;
  MoeCompletion c;
  __device__ int of_row(const int64_t* pair_of_row, int topk, int64_t i) const {
    return moe_row_completion(pair_of_row, topk, c, i);
  }
  __device__ int count() const { return c.keys; }
};

template <class Key>
__global__ void __launch_bounds__(kOrderThreads, 1)
    moe_tile_row_order_kernel(const int64_t* offsets, const int* first, int experts, int tile_rows,
                              const int64_t* pair_of_row, int topk, Key order_key, int* order, uint8_t* keys) {
  __shared__ int cursor[kMaxOrderKeys];
  __shared__ int warp_count[kOrderWarps][kMaxOrderKeys];
  const int count = first[experts];
  if (count <= 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, K = order_key.count();
  for (int t = warp; t < count; t += kOrderWarps) {
    const MoeTileRowSpan span = moe_tile_row_span(offsets, first, experts, tile_rows, t);
    int key = Key::kLatest ? 0 : K - 1;
    for (int64_t i = span.begin + lane; i < span.end; i += 32) {
      const int k = order_key.of_row(pair_of_row, topk, i);
      key = Key::kLatest ? max(key, k) : min(key, k);
    }
    key = Key::kLatest ? __reduce_max_sync(0xffffffffu, key) : __reduce_min_sync(0xffffffffu, key);
    if (lane == 0) keys[t] = static_cast<uint8_t>(key);
  }
  for (int a = threadIdx.x; a < K; a += kOrderThreads) cursor[a] = 0;
  __syncthreads();
  for (int t = threadIdx.x; t < count; t += kOrderThreads) atomicAdd(&cursor[keys[t]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {  // the cursors: an exclusive scan of the counts
    int sum = 0;
    for (int a = 0; a < K; ++a) {
      const int n = cursor[a];
      cursor[a] = sum;
      sum += n;
    }
  }
  __syncthreads();
  for (int base = 0; base < count; base += kOrderThreads) {
    const int t = base + threadIdx.x;
    const int key = t < count ? keys[t] : K;  // K: past the table (no place)
    for (int a = lane; a < K; a += 32) warp_count[warp][a] = 0;
    __syncwarp();
    const unsigned same = __match_any_sync(0xffffffffu, key);
    const int before = __popc(same & ((1u << lane) - 1));
    if (key < K && before == 0) warp_count[warp][key] = __popc(same);
    __syncthreads();
    if (key < K) {
      int place = cursor[key] + before;
      for (int w = 0; w < warp; ++w) place += warp_count[w][key];
      order[place] = t;
    }
    __syncthreads();
    for (int a = threadIdx.x; a < K; a += kOrderThreads)
      for (int w = 0; w < kOrderWarps; ++w) cursor[a] += warp_count[w][a];
    __syncthreads();
  }
}
TL_REGISTER_KERNELS(moe_route_count_kernel, moe_route_scan_kernel, moe_route_place_kernel,
                    moe_tile_row_order_kernel<ArrivalKey>, moe_tile_row_order_kernel<CompletionKey>);

}  // namespace

size_t moe_route_scratch_bytes(int64_t tokens, int topk, int experts) {
  TL_REQUIRE(tokens >= 0 && topk >= 1 && experts >= 1,
             "moe_route_scratch_bytes: needs tokens >= 0, topk >= 1 and experts >= 1; got "
                 << tokens << ", " << topk << ", " << experts);
  const int64_t pairs = tokens > INT64_MAX / topk ? INT64_MAX : tokens * topk;
  return RouteScratch::make(route_blocks(pairs), experts, nullptr).num_bytes();
}

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
  TL_REQUIRE(out.scratch != nullptr && reinterpret_cast<uintptr_t>(out.scratch) % alignof(int) == 0,
             "moe_route: the scratch is null or not 4-byte aligned (it needs moe_route_scratch_bytes("
                 << tokens << ", " << topk << ", " << experts << ") bytes of device memory)");
  TL_REQUIRE(pairs == 0 || topk_ids != nullptr, "moe_route: topk_ids is null");
  if (out.first_tiles != nullptr) {
    TL_REQUIRE(out.grid.rows.offsets == out.offsets && out.grid.rows.num_parts == experts,
               "moe_route: the grid's rows must be a view of the routing's offsets over its " << experts
                                                                                              << " experts");
    TL_REQUIRE(out.grid.tile_m >= 1 && out.grid.tile_n >= 1 && out.grid.extent_n >= 1,
               "moe_route: the grid has no tiles' shape (make it with DynamicTileGrid::make)");
  }
  const int blocks = route_blocks(pairs);
  const RouteScratch scratch = RouteScratch::make(blocks, experts, out.scratch);
  const size_t smem = table_smem_bytes(experts);
  if (smem > 48 * 1024) {
    for (const void* kernel : {reinterpret_cast<const void*>(&moe_route_count_kernel),
                               reinterpret_cast<const void*>(&moe_route_place_kernel)})
      TL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  moe_route_count_kernel<<<blocks, kThreads, smem, stream>>>(topk_ids, pairs, experts, scratch);
  TL_CUDA_CHECK(cudaGetLastError());
  moe_route_scan_kernel<<<1, kScanThreads, 0, stream>>>(experts, scratch, out);
  TL_CUDA_CHECK(cudaGetLastError());
  moe_route_place_kernel<<<blocks, kThreads, smem, stream>>>(topk_ids, pairs, experts, scratch, out.pair_of_row,
                                                             out.row_of_pair);
  TL_CUDA_CHECK(cudaGetLastError());
}

void moe_arrival_order_async(const int64_t* offsets, const int* first_tile_rows, int experts, int tile_rows,
                             const int64_t* pair_of_row, int topk, const RowPartition& tokens, int rank, int* order,
                             uint8_t* keys, cudaStream_t stream) {
  TL_REQUIRE(experts >= 1 && experts <= kMoeRouteMaxExperts,
             "moe_arrival_order: experts must be in [1, " << kMoeRouteMaxExperts << "], got " << experts);
  TL_REQUIRE(tokens.world_size >= 1 && tokens.world_size <= kMaxWorldSize && rank >= 0 && rank < tokens.world_size,
             "moe_arrival_order: rank " << rank << " of a world of " << tokens.world_size);
  TL_REQUIRE(tile_rows >= 1 && topk >= 1, "moe_arrival_order: tile_rows and topk must be >= 1");
  TL_REQUIRE(offsets && first_tile_rows && pair_of_row && order && keys, "moe_arrival_order: a table pointer is null");
  moe_tile_row_order_kernel<<<1, kOrderThreads, 0, stream>>>(offsets, first_tile_rows, experts, tile_rows,
                                                             pair_of_row, topk, ArrivalKey{tokens, rank}, order, keys);
  TL_CUDA_CHECK(cudaGetLastError());
}

void moe_completion_order_async(const int64_t* offsets, const int* first_tile_rows, int experts, int tile_rows,
                                const int64_t* pair_of_row, int topk, const MoeCompletion& completion, int* order,
                                uint8_t* keys, cudaStream_t stream) {
  TL_REQUIRE(experts >= 1 && experts <= kMoeRouteMaxExperts,
             "moe_completion_order: experts must be in [1, " << kMoeRouteMaxExperts << "], got " << experts);
  TL_REQUIRE(completion.valid(),
             "moe_completion_order: bad completion (tokens " << completion.tokens << ", reduce rows "
                                                             << completion.reduce_rows << ", first tile "
                                                             << completion.first_tile << ", keys " << completion.keys
                                                             << ")");
  TL_REQUIRE(tile_rows >= 1 && topk >= 1, "moe_completion_order: tile_rows and topk must be >= 1");
  TL_REQUIRE(offsets && first_tile_rows && pair_of_row && order && keys, "moe_completion_order: a table pointer is null");
  moe_tile_row_order_kernel<<<1, kOrderThreads, 0, stream>>>(offsets, first_tile_rows, experts, tile_rows,
                                                             pair_of_row, topk, CompletionKey{completion}, order, keys);
  TL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tilelink::cuda
