// Epilogue of the sm90 GEMM engine: fp32 accumulators (wgmma C fragments) -> C, clipped to the tile's
// region, as plain stores (kStore; C may be a peer's memory) or vector reductions (kReduceAdd).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda/ptx>
#include <cute/tensor.hpp>

#include "tilelink/compute/sm90/gemm.hpp"

namespace tilelink::compute::sm90::detail {

// Two adjacent columns (c, c + 1) of one row: the unit of the wgmma accumulator layout.
TL_DEVICE TL_INLINE void store_pair(__nv_bfloat16* dst, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(x, y);
}
TL_DEVICE TL_INLINE void store_pair(__half* dst, float x, float y) {
  *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(x, y);
}
TL_DEVICE TL_INLINE void store_pair(float* dst, float x, float y) { *reinterpret_cast<float2*>(dst) = make_float2(x, y); }

TL_DEVICE TL_INLINE void red_add_pair(__nv_bfloat16* dst, float x, float y) {
  __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  asm volatile("red.relaxed.gpu.global.add.noftz.bf16x2 [%0], %1;\n" ::"l"(dst),
               "r"(*reinterpret_cast<uint32_t*>(&v))
               : "memory");
}
TL_DEVICE TL_INLINE void red_add_pair(__half* dst, float x, float y) {
  __half2 v = __floats2half2_rn(x, y);
  asm volatile("red.relaxed.gpu.global.add.noftz.f16x2 [%0], %1;\n" ::"l"(dst), "r"(*reinterpret_cast<uint32_t*>(&v))
               : "memory");
}
TL_DEVICE TL_INLINE void red_add_pair(float* dst, float x, float y) {
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(x), "f"(y) : "memory");
}

// Writes (or adds) this thread's part of the (TileM x TileN) accumulator tile `tile` into C[m, n]
// (row stride ldc), skipping rows >= m and columns >= n. mma_thread_idx is the thread's index among
// the consumer threads of tiled_mma.
template <int TileM, int TileN, class ElementOut, class TiledMma, class Accum>
TL_DEVICE void store_tile(EpilogueMode mode, void* c_ptr, int64_t ldc, int m, int n, TileCoord tile,
                          TiledMma const& tiled_mma, int mma_thread_idx, Accum const& accum) {
  using namespace cute;
  auto thr_mma = tiled_mma.get_thread_slice(mma_thread_idx);
  Tensor cC = make_identity_tensor(
      make_shape(Int<TileM>{}, Int<TileN>{}));  // (BLK_M, BLK_N) -> (row, col)
  Tensor tCcC = thr_mma.partition_C(cC);                                        // (MMA, MMA_M, MMA_N)
  static_assert(decltype(size(tCcC))::value == decltype(size(accum))::value);

  const int row0 = tile.m * TileM;
  const int col0 = tile.n * TileN;
  const int rows = m - row0 < TileM ? m - row0 : TileM;
  const int cols = n - col0 < TileN ? n - col0 : TileN;
  ElementOut* c = static_cast<ElementOut*>(c_ptr) + static_cast<int64_t>(row0) * ldc + col0;

  // NOTE: accumulator elements 2i and 2i+1 are columns c and c+1 of one row (wgmma C layout); c is
  // even and n is a multiple of 8, so a pair is either wholly inside or wholly outside the tile.
  if (mode == EpilogueMode::kStore) {
    CUTE_UNROLL
    for (int i = 0; i < size(accum); i += 2) {
      const int r = get<0>(tCcC(i));
      const int col = get<1>(tCcC(i));
      if (r < rows && col < cols) store_pair(c + static_cast<int64_t>(r) * ldc + col, accum(i), accum(i + 1));
    }
  } else {
    CUTE_UNROLL
    for (int i = 0; i < size(accum); i += 2) {
      const int r = get<0>(tCcC(i));
      const int col = get<1>(tCcC(i));
      if (r < rows && col < cols) red_add_pair(c + static_cast<int64_t>(r) * ldc + col, accum(i), accum(i + 1));
    }
  }
}

// Per-warp staging buffer of the fast store path: 16 rows x 128 bytes (+16 bytes of padding per row,
// so the 4-byte fragment writes and the 16-byte row reads are bank-conflict free).
inline constexpr int kStageRows = 16;
inline constexpr int kStagePitch = 128 + 16;
inline constexpr int kStageBytesPerWarp = kStageRows * kStagePitch;

// kStore through shared memory: each warp owns 16-row slabs of the tile (one a wgmma row slab: one
// in a 128-row tile, two in a 256-row one, 128 rows apart); per slab and 128-byte column chunk it
// writes its fragment pairs into its staging buffer, then stores whole 16-byte row segments (4 full
// 128-byte rows per warp instruction) instead of 4-byte pairs. Needs C and ldc such that every row
// segment is 16-byte aligned (the host checks and otherwise uses store_tile).
template <int TileM, int TileN, class ElementOut, class TiledMma, class Accum>
TL_DEVICE void store_tile_staged(void* c_ptr, int64_t ldc, int m, int n, TileCoord tile,
                                 TiledMma const& tiled_mma, int mma_thread_idx, Accum const& accum,
                                 uint8_t* warp_stage) {
  using namespace cute;
  constexpr int kChunkCols = 128 / static_cast<int>(sizeof(ElementOut));  // columns per 128-byte chunk
  constexpr int kSegCols = 16 / static_cast<int>(sizeof(ElementOut));     // columns per 16-byte segment
  constexpr int kPairsPerChunk = kChunkCols / 8;                           // 8-column groups per chunk
  // the last chunk of a tile whose width is not a multiple of kChunkCols (160 of 16-bit C) is
  // narrower
  constexpr int kChunks = (TileN + kChunkCols - 1) / kChunkCols;
  // accumulator values of one 16-row slab: 2 rows x 2 columns per 8-column group
  constexpr int kSlabValues = 2 * 2 * (TileN / 8);
  constexpr int kSlabs = decltype(size(accum))::value / kSlabValues;
  static_assert(TileN % 8 == 0 && kChunkCols % 8 == 0);
  static_assert(kSlabs * kSlabValues == decltype(size(accum))::value && kSlabs * 128 == TileM,
                "a 16-row slab per warp and 128 rows of the tile");
  auto thr_mma = tiled_mma.get_thread_slice(mma_thread_idx);
  Tensor cC = make_identity_tensor(make_shape(Int<TileM>{}, Int<TileN>{}));
  Tensor tCcC = thr_mma.partition_C(cC);  // (MMA, MMA_M, MMA_N) -> (row, col) in the tile

  const int lane = mma_thread_idx % 32;
  const int row0 = tile.m * TileM, col0 = tile.n * TileN;
  ElementOut* c = static_cast<ElementOut*>(c_ptr);

  CUTE_UNROLL
  for (int slab = 0; slab < kSlabs; ++slab) {
    const int base = slab * kSlabValues;  // the slab's first value (MMA_M is the slower mode)
    const int warp_row0 = get<0>(tCcC(base)) & ~(kStageRows - 1);  // first tile row of the slab
    CUTE_UNROLL
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      const int chunk_cols =
          TileN - chunk * kChunkCols < kChunkCols ? TileN - chunk * kChunkCols : kChunkCols;
      // 1. fragment pairs of this chunk -> staging rows (value 4*jn + 2*v1 of the slab is row
      // +8*v1, cols 8*jn + 2q)
      CUTE_UNROLL
      for (int jj = 0; jj < kPairsPerChunk; ++jj) {
        if (8 * jj >= chunk_cols) break;
        CUTE_UNROLL
        for (int v1 = 0; v1 < 2; ++v1) {
          const int i = base + 4 * (chunk * kPairsPerChunk + jj) + 2 * v1;
          const int r = get<0>(tCcC(i)) - warp_row0;
          const int col = get<1>(tCcC(i)) - chunk * kChunkCols;
          store_pair(reinterpret_cast<ElementOut*>(warp_stage + r * kStagePitch) + col, accum(i),
                     accum(i + 1));
        }
      }
      __syncwarp();
      // 2. staging rows -> C, 16 bytes per lane, 8 lanes per 128-byte row
      CUTE_UNROLL
      for (int t = 0; t < kStageRows * 8 / 32; ++t) {
        const int s = lane + 32 * t;
        const int r = s / 8, seg = s % 8;
        const int grow = row0 + warp_row0 + r;
        const int gcol = col0 + chunk * kChunkCols + seg * kSegCols;
        const uint4 v = *reinterpret_cast<const uint4*>(warp_stage + r * kStagePitch + seg * 16);
        if (seg * kSegCols < chunk_cols && grow < m && gcol < n) {
          *reinterpret_cast<uint4*>(c + static_cast<int64_t>(grow) * ldc + gcol) = v;
        }
      }
      __syncwarp();
    }
  }
}

// The TMA store path (16-bit C, local memory, 16-byte aligned rows): the consumers write the whole
// tile into shared memory and go on to the next tile's MMAs; one thread of the store warp copies it
// to C with TMA (the SM's write path drains it beside the next tile's math). The tile is laid out
// as 64-column chunks (four in a 256-wide tile) of TileM rows x 128 bytes, each in the 128-byte
// swizzle that C's tensor map names (16-byte unit u of row r at unit u ^ (r % 8)), so a warp's
// 4-byte fragment writes (8 rows x 16 bytes) hit 32 different banks. A width that is not a multiple
// of 64 (160, 176) ends in a tail chunk of its last TileN % 64 columns, TileM rows unswizzled, that
// its own tensor map stores (its writes meet several rows a bank line: bank conflicts in that part
// of the tile).
inline constexpr int kTmaChunkCols = 64;  // 128 bytes of 16-bit C
TL_HD constexpr int tma_chunk_bytes(int tile_m) { return tile_m * 128; }
TL_HD constexpr int tma_full_chunks(int tile_n) { return tile_n / kTmaChunkCols; }
TL_HD constexpr int tma_tail_cols(int tile_n) { return tile_n % kTmaChunkCols; }
TL_HD constexpr bool tma_has_tail(int tile_n) { return tma_tail_cols(tile_n) != 0; }
TL_HD constexpr int tma_tile_bytes(int tile_n, int tile_m = kTileM) {
  return tma_full_chunks(tile_n) * tma_chunk_bytes(tile_m) + tma_tail_cols(tile_n) * 2 * tile_m;
}
static_assert(tma_tile_bytes(256) == 4 * tma_chunk_bytes(kTileM) && tma_tile_bytes(160) == 40 * 1024);

template <int TileM, int TileN, class ElementOut, class TiledMma, class Accum>
TL_DEVICE void stage_tile_for_tma(TiledMma const& tiled_mma, int mma_thread_idx, Accum const& accum,
                                  uint8_t* c_tile) {
  using namespace cute;
  static_assert(sizeof(ElementOut) == 2, "the TMA store path is for 16-bit outputs");
  static_assert(TileN % 8 == 0, "a tail's rows are whole 16-byte units");
  constexpr int kFullCols = tma_full_chunks(TileN) * kTmaChunkCols;
  constexpr int kTailRowBytes = tma_tail_cols(TileN) * 2;
  auto thr_mma = tiled_mma.get_thread_slice(mma_thread_idx);
  Tensor cC = make_identity_tensor(make_shape(Int<TileM>{}, Int<TileN>{}));
  Tensor tCcC = thr_mma.partition_C(cC);  // (MMA, MMA_M, MMA_N) -> (row, col) in the tile
  CUTE_UNROLL
  for (int i = 0; i < size(accum); i += 2) {
    const int r = get<0>(tCcC(i));
    const int col = get<1>(tCcC(i));
    int off;
    if (col < kFullCols) {
      const int byte = (col % kTmaChunkCols) * 2;  // in the chunk's row
      off = (col / kTmaChunkCols) * tma_chunk_bytes(TileM) + r * 128 +
            ((((byte >> 4) ^ r) & 7) << 4) + (byte & 15);
    } else {
      off = tma_full_chunks(TileN) * tma_chunk_bytes(TileM) + r * kTailRowBytes +
            (col - kFullCols) * 2;
    }
    store_pair(reinterpret_cast<ElementOut*>(c_tile + off), accum(i), accum(i + 1));
  }
}

}  // namespace tilelink::compute::sm90::detail
