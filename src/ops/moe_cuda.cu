// MoE layers on one GPU (ops/moe_cuda.hpp): the tables, the grouped GEMMs and the kernels between
// them. The kernels move 16-byte chunks (8 elements; H and F are multiples of 8) and read the
// routed row count from offsets[experts] on the device, so no call synchronizes with the host.
#include "tilelink/ops/moe_cuda.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/compute/sm90/grouped_gemm.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/moe_route_cuda.hpp"
#include "tilelink/runtime/world.hpp"
#include "tilelink/tune/path_model.hpp"

namespace tilelink::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;

int sm_count() {
  int dev = 0, sms = 0;
  TL_CUDA_CHECK(cudaGetDevice(&dev));
  TL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

int grid_for(int64_t items) {
  const int64_t most = int64_t{sm_count()} * kBlocksPerSm;
  return static_cast<int>(items < 1 ? 1 : (items < most ? items : most));
}

// 8 elements of a 16-byte chunk <-> float (T: __nv_bfloat16 or __half; T2 its pair type)
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
template <class T2>
__device__ __forceinline__ T2 from_floats(float x, float y);
template <>
__device__ __forceinline__ __nv_bfloat162 from_floats(float x, float y) {
  return __floats2bfloat162_rn(x, y);
}
template <>
__device__ __forceinline__ __half2 from_floats(float x, float y) { return __floats2half2_rn(x, y); }

template <class T>
struct Chunk8 {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  static __device__ __forceinline__ void load(const uint4& v, float* f) {
    const auto* h = reinterpret_cast<const T2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = to_float2(h[i]);
      f[2 * i] = x.x, f[2 * i + 1] = x.y;
    }
  }
  static __device__ __forceinline__ uint4 store(const float* f) {
    uint4 v;
    auto* h = reinterpret_cast<T2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = from_floats<T2>(f[2 * i], f[2 * i + 1]);
    return v;
  }
};

// xs[i] = x[pair_of_row[i] / topk] for the routed rows; a block a row at a time.
__global__ void gather_rows_kernel(const uint4* __restrict__ x, int64_t chunks,
                                   const int64_t* __restrict__ pair_of_row, int topk,
                                   const int64_t* __restrict__ offsets, int experts,
                                   uint4* __restrict__ xs) {
  const int64_t total = offsets[experts];
  for (int64_t i = blockIdx.x; i < total; i += gridDim.x) {
    const int64_t token = pair_of_row[i] / topk;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) xs[i * chunks + c] = x[token * chunks + c];
  }
}

// act[i, j] = SiLU(h[i, j]) * h[i, f + j] in fp32, one rounding; h [rows, 2f], act [rows, f].
template <class T>
__global__ void silu_mul_kernel(const uint4* __restrict__ h, int64_t chunks,
                                const int64_t* __restrict__ offsets, int experts,
                                uint4* __restrict__ act) {
  const int64_t total = offsets[experts];
  for (int64_t i = blockIdx.x; i < total; i += gridDim.x) {
    const uint4* gate = h + i * 2 * chunks;
    const uint4* up = gate + chunks;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float g[8], u[8], a[8];
      Chunk8<T>::load(gate[c], g);
      Chunk8<T>::load(up[c], u);
#pragma unroll
      for (int e = 0; e < 8; ++e) a[e] = g[e] / (1.0f + __expf(-g[e])) * u[e];
      act[i * chunks + c] = Chunk8<T>::store(a);
    }
  }
}

// The first of grouped rows [lo, hi) (one expert's: its pairs ascending) whose pair is >= pair.
__device__ __forceinline__ int64_t first_row_from(const int64_t* pair_of_row, int64_t lo, int64_t hi, int64_t pair) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pair_of_row[mid] < pair) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The routing's tables a linked reduce reads to find the GEMM tiles of its tokens.
struct ReduceTables {
  const int64_t* offsets = nullptr;
  const int64_t* pair_of_row = nullptr;
  const int* first_tile_rows = nullptr;
  int experts = 0;
};

constexpr int kReduceWaitRows = 1024;  // tile rows a reduce tile lists; past them its threads wait alone

// A linked reduce tile of tokens [t0, t1) (MoeReduceLink): every GEMM tile holding their rows is
// stored. Per expert (a thread each), the rows of those tokens are one run (an expert's rows go by
// pair), so its tile rows [m0, m1]; the block lists them, then waits on each listed row's tiles_n
// tiles, the (row, column) pairs spread over the threads. Ends with a block barrier (every wait's
// acquire before any thread's reads).
__device__ __forceinline__ void wait_for_rows(const MoeReduceLink& link, const ReduceTables& rt, int topk,
                                              int64_t t0, int64_t t1, Epoch epoch, int* listed_rows,
                                              int* listed_count) {
  const uint64_t target = epoch.value();
  auto wait = [&](int slot) {
    signal_wait<Scope::kGpu>(link.ctx, const_cast<Signal*>(link.pair_done) + slot, slot, target,
                             WaitSite{SignalField::kTileDone, slot});
  };
  if (threadIdx.x == 0) *listed_count = 0;
  __syncthreads();
  for (int e = threadIdx.x; e < rt.experts; e += blockDim.x) {
    const int64_t lo = rt.offsets[e], hi = rt.offsets[e + 1];
    const int64_t a = first_row_from(rt.pair_of_row, lo, hi, t0 * topk);
    const int64_t b = first_row_from(rt.pair_of_row, a, hi, t1 * topk);
    if (a == b) continue;
    const int m0 = rt.first_tile_rows[e] + static_cast<int>((a - lo) / compute::sm90::kTileM);
    const int m1 = rt.first_tile_rows[e] + static_cast<int>((b - 1 - lo) / compute::sm90::kTileM);
    const int base = atomicAdd(listed_count, m1 - m0 + 1);
    for (int m = m0; m <= m1; ++m) {
      if (base + (m - m0) < kReduceWaitRows) {
        listed_rows[base + (m - m0)] = m;
      } else {
        for (int n = 0; n < link.tiles_n; ++n) wait(m * link.tiles_n + n);
      }
    }
  }
  __syncthreads();
  const int listed = min(*listed_count, kReduceWaitRows);
  for (int i = threadIdx.x; i < listed * link.tiles_n; i += blockDim.x)
    wait(listed_rows[i / link.tiles_n] * link.tiles_n + i % link.tiles_n);
  __syncthreads();
}

// out[t] = sum over slots s in order of weights[t, s] * y[row_of_pair[t, s]] (fp32, one rounding);
// unrouted pairs (row -1) add nothing. A block a tile of tile_rows tokens at a time, a warp a token
// at a time (its lanes over the token's 16-byte chunks, the slots' rows and weights read by the
// first topk lanes and passed round the warp: no block barrier a token; a block a token, with two
// barriers each, left a tile of 128 tokens latency-bound at ~2 us a token); tiles from first_tile
// on, around: the block's every gridDim.x-th, or, with link.claims, claimed one at a time from the
// shared counter. With tile_done set, each tile is announced once stored (tile_done[t] = epoch,
// release, system scope: a peer's ReduceScatter reads it). With link.pair_done set, a tile first
// waits for the grouped GEMM's tiles of its rows (wait_for_rows).
template <class T>
__global__ void topk_reduce_kernel(const uint4* __restrict__ y, int64_t chunks,
                                   const int64_t* __restrict__ row_of_pair,
                                   const float* __restrict__ weights, int topk, int64_t tokens,
                                   int tile_rows, int first_tile, uint4* __restrict__ out,
                                   Signal* tile_done, Epoch epoch, MoeReduceLink link, ReduceTables tables) {
  __shared__ int64_t claimed;
  __shared__ int listed_count;
  __shared__ int listed_rows[kReduceWaitRows];
  __shared__ int64_t slot_row[kThreads / 32][32];
  __shared__ float slot_w[kThreads / 32][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int64_t tiles = (tokens + tile_rows - 1) / tile_rows;
  for (int64_t next = blockIdx.x;; next += gridDim.x) {
    int64_t j = next;
    if (link.claims != nullptr) {
      if (threadIdx.x == 0) claimed = atomicAdd(link.claims, 1u);
      __syncthreads();
      j = claimed;
      __syncthreads();  // every thread has read it before thread 0 claims again
    }
    if (j >= tiles) break;
    const int64_t tile = (first_tile + j) % tiles;
    const int64_t end = min(tokens, (tile + 1) * tile_rows);
    if (link.pair_done != nullptr)
      wait_for_rows(link, tables, topk, tile * tile_rows, end, epoch, listed_rows, &listed_count);
    for (int64_t t = tile * tile_rows + warp; t < end; t += warps) {
      // lane s < topk reads slot s's row and weight into the warp's row of the tables (topk <= 32;
      // through shared memory, not a shuffle: the chunk loop below leaves lanes out where H < 256)
      if (lane < topk) {
        slot_row[warp][lane] = row_of_pair[t * topk + lane];
        slot_w[warp][lane] = weights[t * topk + lane];
      }
      __syncwarp();
      for (int64_t c = lane; c < chunks; c += 32) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int s = 0; s < topk; ++s) {
          const int64_t row = slot_row[warp][s];
          if (row < 0) continue;
          const float w = slot_w[warp][s];
          float v[8];
          Chunk8<T>::load(y[row * chunks + c], v);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] += w * v[e];
        }
        out[t * chunks + c] = Chunk8<T>::store(acc);
      }
      __syncwarp();  // every lane has read the tables before the next token's are written
    }
    __syncthreads();  // every warp's stores before the notify, and before the next tile's waits
    if (tile_done != nullptr && threadIdx.x == 0) signal_notify<Scope::kSystem>(tile_done + tile, epoch.value());
  }
}

// kOverlap's gather: block b takes grouped tile rows b, b + blocks, ... (in the order the GEMM's
// walk meets them, group by group), copies the tile row's X rows into xs and notifies ready[t].
__global__ void gather_tile_rows_kernel(const uint4* __restrict__ x, int64_t chunks,
                                        const int64_t* __restrict__ pair_of_row, int topk,
                                        const int64_t* __restrict__ offsets,
                                        const int* __restrict__ first_tile_rows, int experts,
                                        uint4* __restrict__ xs, uint64_t* ready) {
  const DynamicSegmentTiling tile_rows{DynamicRowPartition{experts, offsets},
                                       compute::sm90::kTileM, first_tile_rows};
  for (int t = blockIdx.x; t < tile_rows.num_tiles(); t += gridDim.x) {
    const int lo = tile_rows.part_of(t);  // never an empty group
    const int64_t r0 = offsets[lo] + int64_t{t - first_tile_rows[lo]} * compute::sm90::kTileM;
    const int64_t r1 = min(r0 + compute::sm90::kTileM, offsets[lo + 1]);
    // a warp a row, its lanes over the row's chunks: one division a row, none a chunk (a division
    // a chunk measured the gather too slow to keep ahead of the GEMM, bench/notes/moe.md)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int64_t i = r0 + warp; i < r1; i += warps) {
      const uint4* src = x + pair_of_row[i] / topk * chunks;
      uint4* dst = xs + i * chunks;
      for (int64_t c = lane; c < chunks; c += 32) dst[c] = src[c];
    }
    __syncthreads();  // every thread's rows before thread 0's release
    if (threadIdx.x == 0) signal_notify<Scope::kGpu>(ready + t, 1);
  }
}

// kOverlap's hooks: a tile's loads wait for its grouped tile row (lane 0, bounded, quiet).
struct RowsReadyHooks {
  static constexpr bool kWaits = true;
  static constexpr bool kNotifies = false;
  uint64_t* ready = nullptr;
  const int* first_tile_rows = nullptr;
  DeviceContext ctx;
  __device__ __forceinline__ void before_tile_loads(const compute::sm90::TileWork& w) const {
    unsigned lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    if (lane != 0) return;
    const int t = first_tile_rows[w.group] + w.tile.m;
    signal_wait<Scope::kGpu, Report::kQuiet>(ctx, ready + t, t, 1,
                                             WaitSite{SignalField::kRowsReady, t});
  }
};

// kAhead's hooks: X's rows copied into grouped order (xs) by the grouped GEMM's own blocks, claimed
// a row at a time from one counter in the walk's tile-row order: every warp of every block in the
// prologue until the claims pass `prologue_rows` (the first waves' tile rows, at the gather's full
// rate), then the producer warps the loads leave idle, beside the mainloop. Each copied row is
// counted on its tile row's ready[t] (release); a tile's loads wait until that count is the tile
// row's rows (lane 0 of the load warp, bounded, quiet), then A comes by TMA from xs as in the
// unfused path: the same bits. The claims never wait, so every claimed row is copied by a running
// warp and no block waits on a block that cannot run.
struct GatherAheadHooks {
  static constexpr bool kWaits = true;
  static constexpr bool kNotifies = false;
  const uint4* x = nullptr;  // [tokens, chunks]
  int64_t chunks = 0;        // 16-byte chunks a row
  const int64_t* pair_of_row = nullptr;
  int topk = 1;
  const int64_t* offsets = nullptr;
  const int* first_tile_rows = nullptr;
  int experts = 0;
  uint4* xs = nullptr;                   // [rows, chunks], grouped order
  unsigned long long* claims = nullptr;  // zeroed before the launch
  uint64_t* ready = nullptr;             // [tile rows], zeroed before the launch
  int64_t prologue_rows = 0;             // claims the prologue takes (whole tile rows of 128)
  DeviceContext ctx;

  // One warp: claim, copy, count, until the claims run out or pass `until`. In 32-bit arithmetic
  // where it fits (rows and pairs below 2^31, MoeLayer's check; chunks a row below 2^28) and two
  // loads in flight a lane: the side work runs at the producer's 40 registers, where 64-bit
  // divisions and four loads in flight spilled 116-200 bytes (ptxas -v).
  __device__ void copy_rows(int64_t until) const {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const DynamicSegmentTiling tile_rows{DynamicRowPartition{experts, offsets}, compute::sm90::kTileM,
                                         first_tile_rows};
    const int64_t total = int64_t{tile_rows.num_tiles()} * compute::sm90::kTileM;
    const int n = static_cast<int>(chunks);
    for (;;) {
      unsigned long long claim = 0;
      if (lane == 0) claim = atomicAdd(claims, 1ull);
      const int64_t u = static_cast<int64_t>(__shfl_sync(0xffffffffu, claim, 0));
      if (u >= total) return;
      const int t = static_cast<int>(u / compute::sm90::kTileM);  // the walk's order: tile rows in turn
      const int g = tile_rows.part_of(t);
      const int row = static_cast<int>(offsets[g]) + (t - first_tile_rows[g]) * compute::sm90::kTileM +
                      static_cast<int>(u % compute::sm90::kTileM);
      if (row < offsets[g + 1]) {  // a claim past a group's last row copies nothing
        const int token = static_cast<int>(pair_of_row[row]) / topk;
        const uint4* src = x + static_cast<int64_t>(token) * n;
        uint4* dst = xs + static_cast<int64_t>(row) * n;
        for (int c = lane; c < n; c += 2 * 32) {  // two 16-byte loads in flight a lane
          const uint4 v0 = __ldg(src + c);
          const bool second = c + 32 < n;
          uint4 v1;
          if (second) v1 = __ldg(src + c + 32);
          dst[c] = v0;
          if (second) dst[c + 32] = v1;
        }
        __syncwarp();  // every lane's stores before lane 0's release
        if (lane == 0) {
          __threadfence();
          atomicAdd(reinterpret_cast<unsigned long long*>(ready + t), 1ull);
        }
      }
      if (u >= until) return;
    }
  }
  __device__ void prologue() const { copy_rows(prologue_rows); }
  __device__ void side_work() const { copy_rows(INT64_MAX); }
  __device__ __forceinline__ void before_tile_loads(const compute::sm90::TileWork& w) const {
    unsigned lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    if (lane != 0) return;
    const int t = first_tile_rows[w.group] + w.tile.m;
    signal_wait<Scope::kGpu, Report::kQuiet>(ctx, ready + t, t, static_cast<uint64_t>(w.region.rows),
                                             WaitSite{SignalField::kRowsReady, t});
  }
};
static_assert(compute::sm90::detail::const_callable_hooks<GatherAheadHooks>(),
              "GatherAheadHooks must stay const-callable: a per-warp copy lives in local memory");

// Loaded in every context of a world when it starts (runtime/world.hpp): a first launch of a kernel
// never loads a module while a peer's kernel spins on what this one is to produce.
TL_REGISTER_KERNELS(gather_rows_kernel, silu_mul_kernel<__nv_bfloat16>, silu_mul_kernel<__half>,
                    topk_reduce_kernel<__nv_bfloat16>, topk_reduce_kernel<__half>, gather_tile_rows_kernel);

// kAuto's layer 0 on one GPU: the path model's choice.
MoePath one_gpu_layer0_path(int64_t tokens, int64_t hidden, int64_t n, int experts, int topk, DType dtype, int sms) {
  return moe_layer0_one_gpu(tokens, hidden, n, experts, topk, dtype, sms).path == OpPath::kFused ? MoePath::kFused
                                                                                               : MoePath::kUnfused;
}

template <class F>
void by_dtype(DType dtype, F&& f) {
  if (dtype == DType::kBF16) return f(__nv_bfloat16{});
  return f(__half{});
}

template <class T>
void* alloc(int64_t count) {
  void* p = nullptr;
  TL_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(count < 1 ? 1 : count) * sizeof(T)));
  return p;
}

}  // namespace

const char* moe_path_name(MoePath path) {
  return path == MoePath::kFused     ? "fused"
         : path == MoePath::kUnfused ? "unfused"
         : path == MoePath::kOverlap ? "overlap"
         : path == MoePath::kAhead   ? "ahead"
                                     : "auto";
}

MoePath MoeLayer::layer0_path(MoePath path, int64_t n) const {
  if (path != MoePath::kAuto) return path;
  if (n == ffn_) return auto_f_;
  if (n == 2 * ffn_) return auto_2f_;
  return one_gpu_layer0_path(tokens_, hidden_, n, experts_, topk_, dtype_, sms_);
}

MoeLayer::MoeLayer(int64_t tokens, int64_t hidden, int64_t ffn, int experts, int topk, DType dtype)
    : tokens_(tokens), hidden_(hidden), ffn_(ffn), experts_(experts), topk_(topk), dtype_(dtype) {
  TL_REQUIRE(dtype == DType::kBF16 || dtype == DType::kF16,
             "moe (cuda): bf16 or fp16, got " << dtype_name(dtype));
  TL_REQUIRE(tokens >= 1, "moe (cuda): tokens must be >= 1, got " << tokens);
  TL_REQUIRE(hidden >= 8 && hidden % 8 == 0 && ffn >= 8 && ffn % 8 == 0,
             "moe (cuda): hidden and ffn must be positive multiples of 8, got " << hidden << " and "
                                                                               << ffn);
  TL_REQUIRE(experts >= 1 && experts <= compute::sm90::kGroupedMaxGroups && experts <= kMoeRouteMaxExperts,
             "moe (cuda): experts must be in [1, " << compute::sm90::kGroupedMaxGroups << "], got "
                                                   << experts);
  TL_REQUIRE(topk >= 1 && topk <= experts && topk <= 32,
             "moe (cuda): topk must be in [1, min(experts, 32)], got " << topk);
  TL_REQUIRE(tokens * topk < (int64_t{1} << 31),
             "moe (cuda): tokens * topk must be below 2^31, got " << tokens * topk);
  const int64_t rows = tokens * topk, esize = dtype_size(dtype);
  counts_ = static_cast<int64_t*>(alloc<int64_t>(experts));
  offsets_ = static_cast<int64_t*>(alloc<int64_t>(experts + 1));
  pair_of_row_ = static_cast<int64_t*>(alloc<int64_t>(rows));
  row_of_pair_ = static_cast<int64_t*>(alloc<int64_t>(rows));
  status_ = static_cast<int64_t*>(alloc<int64_t>(1));
  first_tile_rows_ = static_cast<int*>(alloc<int>(experts + 1));
  TL_CUDA_CHECK(cudaMalloc(&scratch_, moe_route_scratch_bytes(tokens, topk, experts)));
  TL_CUDA_CHECK(cudaMalloc(&xs_, rows * hidden * esize));
  TL_CUDA_CHECK(cudaMalloc(&h_, rows * 2 * ffn * esize));
  TL_CUDA_CHECK(cudaMalloc(&act_, rows * ffn * esize));
  TL_CUDA_CHECK(cudaMalloc(&y_, rows * hidden * esize));
  // no routing yet: empty tables, so a layer before route() computes nothing
  TL_CUDA_CHECK(cudaMemset(offsets_, 0, (experts + 1) * sizeof(int64_t)));
  TL_CUDA_CHECK(cudaMemset(first_tile_rows_, 0, (experts + 1) * sizeof(int)));
  TL_CUDA_CHECK(cudaMemset(row_of_pair_, 0xff, rows * sizeof(int64_t)));  // -1: unrouted
  max_tile_rows_ = DynamicSegmentTiling::max_num_tiles(rows, experts, compute::sm90::kTileM);
  rows_ready_ = static_cast<uint64_t*>(alloc<uint64_t>(max_tile_rows_ + 1));  // + kAhead's claim counter
  tile_row_order_ = static_cast<int*>(alloc<int>(max_tile_rows_));
  arrival_keys_ = static_cast<uint8_t*>(alloc<uint8_t>(max_tile_rows_));
  sms_ = sm_count();
  auto_f_ = one_gpu_layer0_path(tokens, hidden, ffn, experts, topk, dtype, sms_);
  auto_2f_ = one_gpu_layer0_path(tokens, hidden, 2 * ffn, experts, topk, dtype, sms_);
  TL_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  TL_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  TL_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
}

MoeLayer::~MoeLayer() {
  // NOTE: not checked: a destructor must not throw, and a sticky error has been reported already.
  for (void* p : {static_cast<void*>(counts_), static_cast<void*>(offsets_),
                  static_cast<void*>(pair_of_row_), static_cast<void*>(row_of_pair_),
                  static_cast<void*>(status_), static_cast<void*>(first_tile_rows_), scratch_, xs_,
                  h_, act_, y_, static_cast<void*>(rows_ready_), static_cast<void*>(tile_row_order_),
                  static_cast<void*>(arrival_keys_)}) {
    if (p != nullptr) (void)cudaFree(p);
  }
  if (side_ != nullptr) (void)cudaStreamDestroy(side_);
  if (fork_ != nullptr) (void)cudaEventDestroy(fork_);
  if (join_ != nullptr) (void)cudaEventDestroy(join_);
}

void MoeLayer::route(const int32_t* topk_ids, cudaStream_t stream) {
  TL_REQUIRE(topk_ids != nullptr, "moe (cuda): topk_ids is null");
  MoeRouteTables t;
  t.counts = counts_;
  t.offsets = offsets_;
  t.pair_of_row = pair_of_row_;
  t.row_of_pair = row_of_pair_;
  t.status = status_;
  t.scratch = scratch_;
  t.grid = DynamicTileGrid::make(DynamicRowPartition::make(experts_, offsets_), 1,
                                 compute::sm90::kTileM, 1, first_tile_rows_);
  t.first_tiles = first_tile_rows_;
  moe_route_async(topk_ids, tokens_, topk_, experts_, t, stream);
}

void MoeLayer::order_by_arrival(const RowPartition& tokens, int rank, cudaStream_t stream) {
  TL_REQUIRE(tokens.total() == tokens_, "moe (cuda): the token partition holds " << tokens.total() << " tokens, the layer "
                                                                                 << tokens_);
  moe_arrival_order_async(offsets_, first_tile_rows_, experts_, compute::sm90::kTileM, pair_of_row_, topk_, tokens,
                          rank, tile_row_order_, arrival_keys_, stream);
}

void MoeLayer::order_by_completion(const MoeCompletion& completion, cudaStream_t stream) {
  TL_REQUIRE(completion.tokens == tokens_, "moe (cuda): the completion order is over " << completion.tokens
                                                                                      << " tokens, the layer " << tokens_);
  moe_completion_order_async(offsets_, first_tile_rows_, experts_, compute::sm90::kTileM, pair_of_row_, topk_,
                             completion, tile_row_order_, arrival_keys_, stream);
}

compute::sm90::GroupedGemmArgs MoeLayer::grouped_args(const void* a, const int64_t* a_rows,
                                                      const void* b, void* c, int64_t n,
                                                      int64_t k) const {
  compute::sm90::GroupedGemmArgs g;
  g.a = a;
  g.b = b;
  g.c = c;
  g.max_rows = rows();
  g.n = n;
  g.k = k;
  g.groups = experts_;
  g.offsets = offsets_;
  g.first_tile_rows = first_tile_rows_;
  g.in_type = g.out_type = dtype_;
  g.num_sms = gemm_sms_;
  if (a_rows != nullptr) {
    g.a_row_index = a_rows;
    g.a_rows = tokens_;
    g.a_row_div = topk_;
  }
  return g;
}

void MoeLayer::gather(const void* x, void* xs, cudaStream_t stream) const {
  TL_REQUIRE(x != nullptr && xs != nullptr, "moe (cuda): gather: null pointer");
  gather_rows_kernel<<<grid_for(rows()), kThreads, 0, stream>>>(
      static_cast<const uint4*>(x), hidden_ / 8, pair_of_row_, topk_, offsets_, experts_,
      static_cast<uint4*>(xs));
  TL_CUDA_CHECK(cudaGetLastError());
}

void MoeLayer::activate(const void* h, void* act, cudaStream_t stream) const {
  activate_cols(h, act, ffn_, stream);
}

void MoeLayer::activate_cols(const void* h, void* act, int64_t f, cudaStream_t stream) const {
  TL_REQUIRE(h != nullptr && act != nullptr, "moe (cuda): activate: null pointer");
  TL_REQUIRE(f >= 8 && f % 8 == 0, "moe (cuda): activate: f must be a positive multiple of 8, got " << f);
  by_dtype(dtype_, [&](auto t) {
    silu_mul_kernel<decltype(t)><<<grid_for(rows()), kThreads, 0, stream>>>(
        static_cast<const uint4*>(h), f / 8, offsets_, experts_, static_cast<uint4*>(act));
  });
  TL_CUDA_CHECK(cudaGetLastError());
}

void MoeLayer::topk_reduce(const void* y, const float* weights, void* out, cudaStream_t stream) const {
  TL_REQUIRE(y != nullptr && weights != nullptr && out != nullptr,
             "moe (cuda): topk_reduce: null pointer");
  by_dtype(dtype_, [&](auto t) {
    constexpr int kTokensABlock = kThreads / 32;  // a warp a token
    topk_reduce_kernel<decltype(t)><<<grid_for((tokens_ + kTokensABlock - 1) / kTokensABlock), kThreads, 0, stream>>>(
        static_cast<const uint4*>(y), hidden_ / 8, row_of_pair_, weights, topk_, tokens_, kTokensABlock, 0,
        static_cast<uint4*>(out), nullptr, Epoch{0}, MoeReduceLink{}, ReduceTables{});
  });
  TL_CUDA_CHECK(cudaGetLastError());
}

void MoeLayer::topk_reduce_tiles(const void* y, const float* weights, void* out, int tile_rows,
                                 int first_tile, Signal* tile_done, Epoch epoch, int blocks,
                                 cudaStream_t stream, const MoeReduceLink* link) const {
  TL_REQUIRE(y != nullptr && weights != nullptr && out != nullptr && tile_done != nullptr,
             "moe (cuda): topk_reduce_tiles: null pointer");
  TL_REQUIRE(tile_rows >= 1 && blocks >= 1, "moe (cuda): topk_reduce_tiles: tile_rows (" << tile_rows
                                                << ") and blocks (" << blocks << ") must be >= 1");
  TL_REQUIRE(link == nullptr || (link->pair_done != nullptr && link->tiles_n >= 1 && link->claims != nullptr),
             "moe (cuda): topk_reduce_tiles: a link needs pair_done, tiles_n >= 1 and a claim counter");
  const ReduceTables tables{offsets_, pair_of_row_, first_tile_rows_, experts_};
  by_dtype(dtype_, [&](auto t) {
    topk_reduce_kernel<decltype(t)><<<blocks, kThreads, 0, stream>>>(
        static_cast<const uint4*>(y), hidden_ / 8, row_of_pair_, weights, topk_, tokens_, tile_rows,
        first_tile, static_cast<uint4*>(out), tile_done, epoch, link ? *link : MoeReduceLink{}, tables);
  });
  TL_CUDA_CHECK(cudaGetLastError());
}

void MoeLayer::layer0(const void* x, const void* w1, int64_t n, void* out, MoePath path,
                      cudaStream_t stream) {
  TL_REQUIRE(x != nullptr && w1 != nullptr && out != nullptr, "moe (cuda): layer 0: null pointer");
  TL_REQUIRE(n >= 8 && n % 8 == 0, "moe (cuda): layer 0: n must be a positive multiple of 8, got " << n);
  path = layer0_path(path, n);
  if (path == MoePath::kFused) {
    return compute::sm90::grouped_gemm(grouped_args(x, pair_of_row_, w1, out, n, hidden_), stream);
  }
  if (path == MoePath::kOverlap) return layer0_overlap(x, w1, n, out, stream);
  if (path == MoePath::kAhead) return layer0_ahead(x, w1, n, out, stream);
  gather(x, xs_, stream);
  compute::sm90::grouped_gemm(grouped_args(xs_, nullptr, w1, out, n, hidden_), stream);
}

void MoeLayer::set_gather_sms(int sms) {
  TL_REQUIRE(sms >= 1 && 2 * sms <= sms_,
             "moe (cuda): the overlap path's gather takes 1 to " << sms_ / 2 << " SMs, got " << sms);
  gather_sms_ = sms;
}

void MoeLayer::set_ahead_waves(int waves) {
  TL_REQUIRE(waves >= 0 && waves <= 1000000, "moe (cuda): kAhead's prologue waves must be in [0, 10^6], got " << waves);
  ahead_waves_ = waves;
}

void MoeLayer::set_gemm_sms(int sms) {
  TL_REQUIRE(sms >= 0 && sms <= sms_, "moe (cuda): the grouped GEMM takes 0 (every SM) to " << sms_ << " SMs, got " << sms);
  gemm_sms_ = sms;
}

void MoeLayer::layer0_overlap(const void* x, const void* w1, int64_t n, void* out,
                              cudaStream_t stream) {
  TL_REQUIRE((gemm_sms_ > 0 ? gemm_sms_ : sms_) > 2 * gather_sms_, "moe (cuda): the overlapped layer 0 needs more than "
                                         << 2 * gather_sms_ << " SMs, the device has " << sms_);
  // every call starts from cleared signals: a graph replays the clear with the rest
  TL_CUDA_CHECK(cudaMemsetAsync(rows_ready_, 0, max_tile_rows_ * sizeof(uint64_t), stream));
  TL_CUDA_CHECK(cudaEventRecord(fork_, stream));
  TL_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
  gather_tile_rows_kernel<<<2 * gather_sms_, 512, 0, side_>>>(
      static_cast<const uint4*>(x), hidden_ / 8, pair_of_row_, topk_, offsets_, first_tile_rows_,
      experts_, static_cast<uint4*>(xs_), rows_ready_);
  TL_CUDA_CHECK(cudaGetLastError());
  compute::sm90::GroupedGemmArgs g = grouped_args(xs_, nullptr, w1, out, n, hidden_);
  g.num_sms = (gemm_sms_ > 0 ? gemm_sms_ : sms_) - gather_sms_;
  RowsReadyHooks hooks;
  hooks.ready = rows_ready_;
  hooks.first_tile_rows = first_tile_rows_;
  if (dtype_ == DType::kBF16) {
    compute::sm90::launch_grouped_gemm<cutlass::bfloat16_t, __nv_bfloat16>(g, hooks, stream);
  } else {
    compute::sm90::launch_grouped_gemm<cutlass::half_t, __half>(g, hooks, stream);
  }
  TL_CUDA_CHECK(cudaEventRecord(join_, side_));
  TL_CUDA_CHECK(cudaStreamWaitEvent(stream, join_, 0));
}

void MoeLayer::layer0_ahead(const void* x, const void* w1, int64_t n, void* out, cudaStream_t stream) {
  // every call starts from cleared counts and claims: a graph replays the clear with the rest
  TL_CUDA_CHECK(cudaMemsetAsync(rows_ready_, 0, (max_tile_rows_ + 1) * sizeof(uint64_t), stream));
  const compute::sm90::GroupedGemmArgs g = grouped_args(xs_, nullptr, w1, out, n, hidden_);
  // The prologue's claims: the tile rows of the first ahead_waves_ waves, in whole bands of the walk.
  const int64_t tiles_n = (n + compute::sm90::grouped_gemm_tile_n(g) - 1) / compute::sm90::grouped_gemm_tile_n(g);
  const int64_t blocks = gemm_sms_ > 0 ? gemm_sms_ : sms_;
  const int64_t band = compute::sm90::kGroupedBand;
  const int64_t prologue_tile_rows = band * ((ahead_waves_ * blocks + band * tiles_n - 1) / (band * tiles_n));
  GatherAheadHooks hooks;
  hooks.x = static_cast<const uint4*>(x), hooks.chunks = hidden_ / 8;
  hooks.pair_of_row = pair_of_row_, hooks.topk = topk_;
  hooks.offsets = offsets_, hooks.first_tile_rows = first_tile_rows_, hooks.experts = experts_;
  hooks.xs = static_cast<uint4*>(xs_);
  hooks.ready = rows_ready_;
  hooks.claims = reinterpret_cast<unsigned long long*>(rows_ready_ + max_tile_rows_);
  hooks.prologue_rows = prologue_tile_rows * compute::sm90::kTileM;
  if (dtype_ == DType::kBF16) {
    compute::sm90::launch_grouped_gemm<cutlass::bfloat16_t, __nv_bfloat16>(g, hooks, stream);
  } else {
    compute::sm90::launch_grouped_gemm<cutlass::half_t, __half>(g, hooks, stream);
  }
}

void MoeLayer::layer1(const void* h1, const void* w2, const float* weights, void* out,
                      cudaStream_t stream) {
  TL_REQUIRE(h1 != nullptr && w2 != nullptr && weights != nullptr && out != nullptr,
             "moe (cuda): layer 1: null pointer");
  compute::sm90::grouped_gemm(grouped_args(h1, nullptr, w2, y_, hidden_, ffn_), stream);
  topk_reduce(y_, weights, out, stream);
}

void MoeLayer::mlp(const void* x, const void* w1, const void* w2, const float* weights, void* out,
                   MoePath path, cudaStream_t stream) {
  layer0(x, w1, 2 * ffn_, h_, path, stream);
  activate(h_, act_, stream);
  layer1(act_, w2, weights, out, stream);
}

}  // namespace tilelink::cuda
