// The decode kernel's wgmma form (gemm.hpp, "Decode sizes"): C[M, N] (+)= A[M, K] * B[N, K]^T for
// M <= kDecodeMaxRows with the operands swapped ("swap AB"): B's rows are wgmma's M side (64 an
// instruction) and A's rows its N side (kCols: M padded up to 16, 32, 64 or 128), so a block's tile
// is 64 rows of B by all of A's rows, and C is written transposed from it. At these M a 128-row
// tile of the engine computes mostly padding, and its few tiles along N leave most SMs idle.
//
// A block: warpgroup 0 (warps 0-3) runs the MMAs, warp 4 issues the TMA loads. The k-blocks of
// 64 elements of K (128 bytes a row, the 128-byte swizzle) of B's rows and of A pass through a
// ring of kStages shared-memory stages (an mbarrier "full" a stage, which TMA completes, and one
// "empty", which each MMA warp arrives on once the stage's MMAs are done). TMA zero-fills rows
// past N and columns past K; A's box is M rounded up to 8 rows, and the rows of the stage past it
// (never written) reach only columns of the MMA tile past M, which are not stored.
//
// The blocks of a thread-block cluster (1-8, wgmma_grid) take the same rows of B and split K.
// Each leaves its fp32 tile in its shared memory, transposed ([A's row][B's row], the layout of
// C), and after a cluster barrier block r adds its share of C's rows from every block's tile in
// rank order (deterministic, no workspace) and stores them (or adds them into C).
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cutlass/arch/barrier.h>

#include <cstdint>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/cuda_host_adapter.hpp>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cluster_launch.hpp"
#include "instances.hpp"
#include "tilelink/compute/sm90/impl/check_cuda.hpp"
#include "tilelink/compute/sm90/impl/gemm_epilogue.cuh"
#include "tilelink/compute/sm90/impl/operand_map.hpp"
#include "tilelink/compute/sm90/impl/smem_desc.cuh"
#include "tilelink/core/error.hpp"

namespace tilelink::compute::sm90::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kBlockK = 64;             // elements of K a stage (128 bytes of a row)
constexpr int kRowBytes = kBlockK * 2;  // 16-bit inputs
constexpr int kThreads = 160;           // the MMA warpgroup + the load warp
constexpr int kLoadWarp = 4;
constexpr int kRowsW = 64;  // rows of B a block (one wgmma's M)
constexpr int kBlocksPerSm = 2;
constexpr int kStagesBytes = 96 * 1024;  // the stages' shared memory (two blocks an SM)
constexpr int kMaxCluster = 8;           // portable cluster size
constexpr int kMinPartKBlocks = 4;       // the least k-blocks a block takes when K is split

// Shared memory of one configuration: kStages stages of B's rows and of A, each 1024-byte aligned
// (the 128-byte swizzle's atom is 8 rows of 128 bytes), the barriers after them; two blocks an SM.
// The fp32 tile of the epilogue reuses the stages.
template <int kCols>
struct WgmmaLayout {
  static constexpr int kWBytes = kRowsW * kRowBytes;
  static constexpr int kABytes = kCols * kRowBytes;
  static constexpr int kStageBytes = kWBytes + kABytes;
  static constexpr int kStages = kStagesBytes / kStageBytes < 8 ? kStagesBytes / kStageBytes : 8;
  // floats a row of the epilogue's fp32 tile (+4: the transposed writes hit no bank twice)
  static constexpr int kTileLd = kRowsW + 4;
  static constexpr int kTileBytes = kCols * kTileLd * 4;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static_assert(kTileBytes <= kRingBytes, "the epilogue's tile reuses the stages");
  static constexpr int kBarrierOffset = kRingBytes;
  static constexpr int kSmemBytes = kRingBytes + 2 * kStages * 8 + 1024;  // + alignment slack
};

template <class Out>
struct WgmmaParams {
  CUtensorMap b_map;  // B [n, k]: boxes of kBlockK x kRowsW
  CUtensorMap a_map;  // A [m, k]: boxes of kBlockK x a_rows
  int a_rows;         // A's rows a stage loads: M rounded up to 8 (at most kCols)
  Out* c;
  int m, n, k;
  int64_t ldc;
  int parts;  // blocks of a cluster (K split in as many parts)
  bool reduce;
};

// The wgmma descriptor of an operand tile in shared memory (K-major, the 128-byte swizzle).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) { return sw128_k_major_desc(addr); }

// The m64 x kCols x k16 wgmma of the input type, both operands K-major in shared memory.
template <class In, int kCols>
struct WgmmaOp;
#define TL_WGMMA_OP(IN, COLS, NAME)                                                            \
  template <>                                                                                  \
  struct WgmmaOp<IN, COLS> {                                                                   \
    using Op = cute::SM90::GMMA::NAME<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>; \
  };
TL_WGMMA_OP(__nv_bfloat16, 16, MMA_64x16x16_F32BF16BF16_SS)
TL_WGMMA_OP(__nv_bfloat16, 32, MMA_64x32x16_F32BF16BF16_SS)
TL_WGMMA_OP(__nv_bfloat16, 64, MMA_64x64x16_F32BF16BF16_SS)
TL_WGMMA_OP(__nv_bfloat16, 128, MMA_64x128x16_F32BF16BF16_SS)
TL_WGMMA_OP(__half, 16, MMA_64x16x16_F32F16F16_SS)
TL_WGMMA_OP(__half, 32, MMA_64x32x16_F32F16F16_SS)
TL_WGMMA_OP(__half, 64, MMA_64x64x16_F32F16F16_SS)
TL_WGMMA_OP(__half, 128, MMA_64x128x16_F32F16F16_SS)
#undef TL_WGMMA_OP

template <class In, int kCols, size_t... I>
__device__ __forceinline__ void wgmma(uint64_t desc_b, uint64_t desc_a, float* acc, bool add,
                                      std::index_sequence<I...>) {
  WgmmaOp<In, kCols>::Op::fma(
      desc_b, desc_a, acc[I]...,
      add ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

template <class In, class Out, int kCols>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    decode_wgmma_kernel(const __grid_constant__ WgmmaParams<Out> p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = WgmmaLayout<kCols>;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kAcc = kCols / 2;  // fp32 values a thread holds of one m64 x kCols MMA tile

  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned in the shared window (the swizzle's atom)
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024 - raw_s % 1024) % 1024);
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto* full = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
  uint64_t* empty = full + L::kStages;
  auto w_stage = [&](int s) { return smem_s + s * L::kStageBytes; };
  auto a_stage = [&](int s) { return smem_s + s * L::kStageBytes + L::kWBytes; };

  cg::cluster_group cluster = cg::this_cluster();
  const int part = static_cast<int>(cluster.block_rank());
  const int tile = static_cast<int>(blockIdx.x) / p.parts;
  const int n0 = tile * kRowsW;
  const int k_blocks = (p.k + kBlockK - 1) / kBlockK;
  const int kb0 = part * k_blocks / p.parts, kb1 = (part + 1) * k_blocks / p.parts;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      TxBarrier::init(&full[s], 1);
      Barrier::init(&empty[s], 4);  // a lane of each MMA warp
    }
    cutlass::arch::fence_barrier_init();
  }
  if (warp == kLoadWarp && lane == 0) {
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p.b_map));
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p.a_map));
  }
  __syncthreads();

  float acc[kAcc];
  if (warp == kLoadWarp) {
    if (lane == 0) {
      // B streams through L2 once; A is read again by every block of the grid. (Without these
      // hints, 39 launches of M 24-128 ran a median 8% slower, from 3% faster to 17% slower:
      // bench/notes/gemm.md, decode kernels.)
      uint64_t b_policy, a_policy;
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(b_policy));
      asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(a_policy));
      for (int kb = kb0; kb < kb1; ++kb) {
        const int i = kb - kb0, s = i % L::kStages;
        if (i >= L::kStages) Barrier::wait(&empty[s], (i / L::kStages - 1) & 1);
        TxBarrier::arrive_and_expect_tx(&full[s], L::kWBytes + p.a_rows * kRowBytes);
        tma_load(smem + s * L::kStageBytes, &p.b_map, kb * kBlockK, n0, &full[s], b_policy);
        tma_load(smem + s * L::kStageBytes + L::kWBytes, &p.a_map, kb * kBlockK, 0, &full[s],
                 a_policy);
      }
    }
  } else {
    // NOTE: the first MMA overwrites (scale-d 0) instead of registers zeroed before the loop: the
    // zeroing made ptxas serialize every wgmma of the one-tile kernels (C7515).
    for (int kb = kb0; kb < kb1; ++kb) {
      const int i = kb - kb0, s = i % L::kStages;
      TxBarrier::wait(&full[s], (i / L::kStages) & 1);
#pragma unroll
      for (int v = 0; v < kAcc; ++v) cute::warpgroup_fence_operand(acc[v]);
      cute::warpgroup_arrive();
#pragma unroll
      for (int k16 = 0; k16 < kBlockK / 16; ++k16) {
        wgmma<In, kCols>(smem_desc(w_stage(s) + 32 * k16), smem_desc(a_stage(s) + 32 * k16), acc,
                         i > 0 || k16 > 0, std::make_index_sequence<kAcc>{});
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<1>();  // the previous stage's MMAs are done: free it
#pragma unroll
      for (int v = 0; v < kAcc; ++v) cute::warpgroup_fence_operand(acc[v]);
      if (i > 0 && lane == 0) Barrier::arrive(&empty[(i - 1) % L::kStages]);
    }
    cute::warpgroup_wait<0>();
    if (kb1 == kb0) {  // no k-block (K = 0): nothing was accumulated
#pragma unroll
      for (int v = 0; v < kAcc; ++v) acc[v] = 0.f;
    }
  }

  // Every stage's TMA writes have landed (each was waited on) and every MMA has read its stage:
  // the MMA warps write the fp32 tile over the stages, transposed. Thread (warp w, lane l) holds
  // rows (of B) 16w + l / 4 (+ 8) and columns (A's rows) 2 (l % 4) + 8j (+ 1).
  auto* tile_f = reinterpret_cast<float*>(smem);  // [kCols][kTileLd]
  if (warp < kLoadWarp) {
    asm volatile("bar.sync 1, 128;" ::: "memory");  // the MMA warps: all done with the stages
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int row = 16 * warp + lane / 4 + 8 * (v / 2);
        const int col = 8 * j + 2 * (lane % 4) + v % 2;
        tile_f[col * L::kTileLd + row] = acc[4 * j + v];
      }
  }
  __syncwarp();
  cluster.sync();  // every block's tile written

  // Block `part` adds its share of C's rows from every block's tile, in rank order.
  const int rows = min(p.m, kCols);
  const int share = (rows + p.parts - 1) / p.parts;
  const int m0 = part * share, m1 = min(rows, m0 + share);
  constexpr int kQuads = kRowsW / 4;
  for (int i = static_cast<int>(threadIdx.x); i < (m1 - m0) * kQuads; i += kThreads) {
    const int m = m0 + i / kQuads, q = i % kQuads;
    const int n = n0 + 4 * q;  // N is a multiple of 8: the quad is all in or all out
    if (n >= p.n) continue;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int r = 0; r < p.parts; ++r) {
      const float* base = cluster.map_shared_rank(tile_f, r);
      const float4 v = *reinterpret_cast<const float4*>(base + m * L::kTileLd + 4 * q);
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    Out* dst = p.c + m * p.ldc + n;
    if (p.reduce) {
      red_add_pair(dst, sum.x, sum.y);
      red_add_pair(dst + 2, sum.z, sum.w);
    } else {
      store_pair(dst, sum.x, sum.y);
      store_pair(dst + 2, sum.z, sum.w);
    }
  }
  cluster.sync();  // the others' shared memory stays until every block has read it
#endif
}

// How the wgmma form spreads a launch: tiles of kRowsW rows of B, each taken by a cluster of
// `parts` blocks that split K.
struct WgmmaGrid {
  int64_t tiles = 0;
  int parts = 1;
};

// Clusters of `parts` blocks of `kernel` that the current device holds at once (0: none), asked
// once per device, kernel and size (a launch needs up to seven answers).
template <class Kernel>
int max_active_clusters(Kernel kernel, int parts, int smem_bytes) {
  int device = 0;
  TL_SM90_CUDA_CHECK(cudaGetDevice(&device));
  const auto key = std::tuple{device, reinterpret_cast<const void*>(kernel), parts};
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int>, int> known;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = known.find(key); it != known.end()) return it->second;
  }
  const int clusters =
      ClusterLaunch(parts, kThreads, static_cast<size_t>(smem_bytes), parts, nullptr)
          .max_active_clusters(kernel);
  const std::lock_guard<std::mutex> lock(mutex);
  known[key] = clusters;
  return clusters;
}

// The most parts (up to kMaxCluster, each keeping kMinPartKBlocks of K) whose clusters all fit
// on the device at once: one wave of blocks, as many streaming B as the wave allows. (A second
// wave of clusters cost 20-25%, and whether one fits depends on how clusters pack into the GPCs,
// not on the SM count alone: bench/notes/gemm.md, decode kernels.)
template <class Kernel>
WgmmaGrid wgmma_grid(Kernel kernel, int smem_bytes, int64_t n, int64_t k) {
  WgmmaGrid g;
  g.tiles = (n + kRowsW - 1) / kRowsW;
  const int64_t k_blocks = (k + kBlockK - 1) / kBlockK;
  for (int parts = kMaxCluster; parts > 1; --parts) {
    if (k_blocks < int64_t{parts} * kMinPartKBlocks) continue;
    if (g.tiles <= max_active_clusters(kernel, parts, smem_bytes)) {
      g.parts = parts;
      break;
    }
  }
  return g;
}

template <class In, class Out, int kCols>
void launch_wgmma(const GemmArgs& args, cudaStream_t stream) {
  using L = WgmmaLayout<kCols>;
  WgmmaParams<Out> p{};
  const int64_t lda = args.lda ? args.lda : args.k, ldb = args.ldb ? args.ldb : args.k;
  encode_operand_map<In>(&p.b_map, args.b, args.n, args.k, ldb, kBlockK, kRowsW,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, "B");
  p.a_rows = static_cast<int>((args.m + 7) / 8 * 8);
  encode_operand_map<In>(&p.a_map, args.a, args.m, args.k, lda, kBlockK, p.a_rows,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_128B, "A");
  p.c = static_cast<Out*>(args.c);
  p.m = static_cast<int>(args.m), p.n = static_cast<int>(args.n), p.k = static_cast<int>(args.k);
  p.ldc = args.ldc ? args.ldc : args.n;
  p.reduce = args.epilogue == EpilogueMode::kReduceAdd;

  auto* kernel = decode_wgmma_kernel<In, Out, kCols>;
  // NOTE: on every launch: the attribute belongs to the kernel as loaded in the current context
  // (a virtual world runs each rank in its own green context).
  TL_SM90_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmemBytes));
  const WgmmaGrid g = wgmma_grid(kernel, L::kSmemBytes, args.n, args.k);
  p.parts = g.parts;
  ClusterLaunch(g.tiles * g.parts, kThreads, L::kSmemBytes, g.parts, stream).launch(kernel, p);
}

}  // namespace

template <class In, class Out>
void gemm_decode_wgmma(const GemmArgs& args, cudaStream_t stream) {
  if (args.m <= 16) {
    launch_wgmma<In, Out, 16>(args, stream);
  } else if (args.m <= 32) {
    launch_wgmma<In, Out, 32>(args, stream);
  } else if (args.m <= 64) {
    launch_wgmma<In, Out, 64>(args, stream);
  } else {
    launch_wgmma<In, Out, 128>(args, stream);
  }
}

template void gemm_decode_wgmma<__nv_bfloat16, __nv_bfloat16>(const GemmArgs&, cudaStream_t);
template void gemm_decode_wgmma<__nv_bfloat16, float>(const GemmArgs&, cudaStream_t);
template void gemm_decode_wgmma<__half, __half>(const GemmArgs&, cudaStream_t);
template void gemm_decode_wgmma<__half, float>(const GemmArgs&, cudaStream_t);

}  // namespace tilelink::compute::sm90::detail
