// The sm_90a attention engine's kernel template (compute/sm90/attention.hpp for the contract).
//
// Include this from a .cu file to instantiate it with your own Hooks type (attention.hpp's
// NoAttnHooks is the plain engine's):
//   tilelink::compute::sm90::attn_detail::launch_attention<__nv_bfloat16, 128>(args, hooks, stream);
//
// A block: 384 threads. Warpgroup 0 is the producer (its first warp's lane 0 issues every TMA load;
// the rest of the warpgroup only gives its registers away), warpgroups 1 and 2 the consumers, each
// owning 64 of the block's 128 query rows.
//
// Shared memory, every tile in the 128-byte swizzle (rows of 64 elements = 128 bytes, 1024-byte
// atoms of 8 rows), a tile of D columns stored as D / 64 boxes of 64 columns one after another:
//   Q    [128 rows][D]                   loaded once; each consumer later writes its 64 rows of O
//                                        over its own rows of Q for the TMA store
//   K, V kStages x [kAttnBlockN rows][D] the ring of key/value tiles
//   barriers: q_full; per stage k_full, v_full (TMA completes them) and k_empty, v_empty (a lane of
//   each consumer warp arrives once the tile's S, or its P·V, is done): K and V are separate
//   pipelines, since a tile's K is done with an iteration before its V
//   warp arrives once the tile's P·V is done) per stage
//
// wgmma operands: S = Q·Kᵀ takes Q (A) and K (B) K-major from shared memory (a k16 step moves the
// start address 32 bytes inside the atom, a box every 4 steps); O += P·V takes P from registers (the
// S accumulator's fragment is the A fragment of the next MMA, converted to 16 bits) and V as an
// MN-major B: 8-row groups of keys 1024 bytes apart (SBO), 64-column boxes of D kAttnBlockN x 128
// bytes apart (LBO), a k16 step 16 key rows = 2048 bytes.
//
// Accumulator fragment (m64nN, thread t of the warpgroup, warp w = t / 32, lane l): rows
// 16w + l / 4 and 16w + l / 4 + 8, columns 8j + 2 (l % 4) + {0, 1}: acc[4j + {0, 1}] on the first
// row, acc[4j + {2, 3}] on the second.
#pragma once

#if !defined(TILELINK_HAS_CUTE)
#error "the sm90 attention engine needs the CuTe/CUTLASS headers (scripts/setup.sh)"
#endif

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cuda_host_adapter.hpp>
#include <type_traits>
#include <utility>

#include "tilelink/compute/sm90/attention.hpp"
#include "tilelink/compute/sm90/impl/check_cuda.hpp"
#include "tilelink/compute/sm90/impl/smem_desc.cuh"
#include "tilelink/core/error.hpp"

namespace tilelink::compute::sm90::attn_detail {

namespace gmma = cute::SM90::GMMA;

constexpr int kThreads = 384;
constexpr int kBoxCols = 64;    // elements of a box row (128 bytes)
constexpr int kRowBytes = 128;  // bytes of a box row
constexpr int kWgRows = 64;     // query rows a consumer warpgroup owns

// Stages: 3 for both head dims (D 128: 224 KiB of the 227; 3 stages ran 1.00-1.07x of 2 on the
// bench's shapes).
template <int D, int Stages = 3>
struct AttnLayout {
  static constexpr int kBoxes = D / kBoxCols;
  static constexpr int kStages = Stages;
  static constexpr int kQBoxBytes = kAttnBlockM * kRowBytes;
  static constexpr int kKvBoxBytes = kAttnBlockN * kRowBytes;
  static constexpr int kQBytes = kBoxes * kQBoxBytes;
  static constexpr int kKvBytes = kBoxes * kKvBoxBytes;  // one K or V tile
  static constexpr int kKOffset = kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKvBytes;
  static constexpr int kBarrierOffset = kVOffset + kStages * kKvBytes;
  static constexpr int kBarriers = 2 + 4 * kStages;
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8 + 1024;  // + alignment slack
  static constexpr int kO = D / 2;  // fp32 values of O a consumer thread holds
};

// The MMAs of one element type: S (64 x kAttnBlockN x 16, both operands in shared memory) and P·V
// (64 x D x 16, P in registers).
template <class In, int D>
struct AttnMma;
template <int D>
struct AttnMma<__nv_bfloat16, D> {
  using S = gmma::MMA_64x128x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
  using PV = std::conditional_t<D == 128, gmma::MMA_64x128x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>,
                                gmma::MMA_64x64x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>>;
};
template <int D>
struct AttnMma<__half, D> {
  using S = gmma::MMA_64x128x16_F32F16F16_SS<gmma::Major::K, gmma::Major::K>;
  using PV = std::conditional_t<D == 128, gmma::MMA_64x128x16_F32F16F16_RS<gmma::Major::K, gmma::Major::MN>,
                                gmma::MMA_64x64x16_F32F16F16_RS<gmma::Major::K, gmma::Major::MN>>;
};
static_assert(kAttnBlockN == 128, "the S MMA is 64 x 128");

struct AttnParams {
  CUtensorMap q_map, k_map, v_map, o_map;
  float* lse;
  int64_t lse_stride_b, lse_stride_h, lse_stride_s;
  int64_t seq_q, seq_k, q_pos0, kv_pos0;
  int heads_q, group;  // group: query heads a key/value head serves
  int m_blocks;
  int items;             // m_blocks x heads_q x batch
  int64_t kv_walk_from;  // AttnArgs::kv_walk_from
  float scale_log2;  // scale · log2(e)
  bool causal;
  bool merge;  // AttnArgs::merge: O (o, o_stride_*) and lse hold a partial to fold this call's into
  const void* o;
  int64_t o_stride_b, o_stride_s, o_stride_h;
};

// The key/value tiles a block of queries visits: tiles [0, n), taken down from `start` (the tile
// of kv_walk_from, or the last) and on from n - 1.
struct KvRange {
  int n = 0, start = -1;
  int64_t m0 = 0;
  __device__ KvRange(const AttnParams& p, int m_block) {
    m0 = int64_t{m_block} * kAttnBlockM;
    int64_t end = p.seq_k;
    if (p.causal) {
      const int64_t last_q = p.q_pos0 + min(m0 + kAttnBlockM, p.seq_q) - 1;
      end = min(end, last_q - p.kv_pos0 + 1);
    }
    n = end <= 0 ? 0 : static_cast<int>((end + kAttnBlockN - 1) / kAttnBlockN);
    start = p.kv_walk_from >= 0 && p.kv_walk_from < int64_t{n} * kAttnBlockN
                ? static_cast<int>(p.kv_walk_from / kAttnBlockN)
                : n - 1;
  }
  // The tile visited at step `it` (0 <= it < n): down from `start`, past tile 0 to tile n - 1.
  __device__ int tile(int it) const { return start - it >= 0 ? start - it : start - it + n; }
  // Whether some key of tile `tile` is masked from some query of the block (past seq_k, or later
  // than the block's first query).
  __device__ bool masked(const AttnParams& p, int tile) const {
    const int64_t end = int64_t{tile + 1} * kAttnBlockN;
    return end > p.seq_k || (p.causal && p.kv_pos0 + end - 1 > p.q_pos0 + m0);
  }
};

// A block's unit of work: query block m_block of (batch, head). Items are numbered with the query
// blocks fastest (under `causal` the heaviest, last, first), then the heads, then the batch: the
// blocks running at once share one head's keys and values in L2, and the next head of a GQA group
// reads the same ones. (With the heads fastest, 2 x 32768 x 32 heads ran at 0.77 of this order's
// speed: every wave read 64 heads' K and V from HBM.)
struct AttnItem {
  int m_block, head, batch, kv_head;
};
__device__ __forceinline__ AttnItem item_of(const AttnParams& p, int i) {
  const int mb = i % p.m_blocks, bh = i / p.m_blocks, head = bh % p.heads_q;
  return {p.causal ? p.m_blocks - 1 - mb : mb, head, bh / p.heads_q, head / p.group};
}

__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) { return detail::sw128_k_major_desc(addr); }
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t addr) {
  return detail::sw128_mn_major_desc(addr, kAttnBlockN * kRowBytes);  // the next 64 columns of D
}

template <class Op, size_t... I>
__device__ __forceinline__ void mma_ss(uint64_t a, uint64_t b, float* acc, bool add, std::index_sequence<I...>) {
  Op::fma(a, b, acc[I]..., add ? gmma::ScaleOut::One : gmma::ScaleOut::Zero);
}
template <class Op, size_t... I>
__device__ __forceinline__ void mma_rs(const uint32_t* a, uint64_t b, float* acc, bool add,
                                       std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], b, acc[I]..., add ? gmma::ScaleOut::One : gmma::ScaleOut::Zero);
}

template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(r[i]);
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(r[i]);
}

__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
      : "memory");
}
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <class In>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Two consecutive elements of a partial O in global memory, as floats.
template <class In>
__device__ __forceinline__ float2 unpack2(const In* at) {
  const uint32_t u = *reinterpret_cast<const uint32_t*>(at);
  if constexpr (std::is_same_v<In, __nv_bfloat16>) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
  else return __half22float2(*reinterpret_cast<const __half2*>(&u));
}

// One consumer thread's share of the online softmax: its two rows' running max (raw scores) and
// partial sums (its own columns; the quad's four partial sums add up at the end).
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};

  // s: this tile's raw scores, replaced by exp2(s · scale_log2 - max); returns in c the factors
  // that bring the older O and sums to the new max.
  __device__ __forceinline__ void update(float (&s)[64], float scale_log2, float (&c)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base = mx == -INFINITY ? 0.f : mx * scale_log2;
      c[r] = fast_exp2(m[r] * scale_log2 - base);  // 0 when m was -inf
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        s[4 * j + 2 * r] = fast_exp2(fmaf(s[4 * j + 2 * r], scale_log2, -base));
        s[4 * j + 2 * r + 1] = fast_exp2(fmaf(s[4 * j + 2 * r + 1], scale_log2, -base));
        sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
      }
      l[r] = l[r] * c[r] + sum;
      m[r] = mx;
    }
  }
};

// kPersistent: a block walks items blockIdx.x, + gridDim.x, ...; otherwise a block takes the one
// item blockIdx.x, and the code is straight-line: compiled as a loop, the consumers' values
// hoisted out of it spilled (80 bytes) and a block an item ran 9% slower (measured 2026-12-04).
template <class In, int D, class Hooks, int Stages, bool kPersistent>
__global__ void __launch_bounds__(kThreads, 1)
    attention_kernel(const __grid_constant__ AttnParams p, const __grid_constant__ Hooks hooks) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = AttnLayout<D, Stages>;
  using Mma = AttnMma<In, D>;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  // Registers a thread of the producer / consumer warpgroups keeps (setmaxnreg; 128 x producer +
  // 256 x consumer must stay within the block's 384 x 168 = 64512): a waiting load thread's hooks
  // need more than the plain engine's (at 40 / 232 the hooked instances spilled 12-40 bytes, at
  // 56 / 224 none but the persistent D 128 one's 16).
  constexpr int kProducerRegs = Hooks::kWaits ? 56 : 40;
  constexpr int kConsumerRegs = Hooks::kWaits ? 224 : 232;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * 168);

  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024 - raw_s % 1024) % 1024);
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto* bars = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = k_full + L::kStages;
  uint64_t* k_empty = v_full + L::kStages;
  uint64_t* v_empty = k_empty + L::kStages;
  uint64_t* q_empty = v_empty + L::kStages;
  const uint32_t q_s = smem_s;
  auto k_s = [&](int st) { return smem_s + L::kKOffset + st * L::kKvBytes; };
  auto v_s = [&](int st) { return smem_s + L::kVOffset + st * L::kKvBytes; };

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const int tid = static_cast<int>(threadIdx.x) % 128;

  if (threadIdx.x == 0) {
    TxBarrier::init(q_full, 1);
    Barrier::init(q_empty, 2);  // a thread of each consumer warpgroup, its rows of O read out
    for (int st = 0; st < L::kStages; ++st) {
      TxBarrier::init(&k_full[st], 1);
      TxBarrier::init(&v_full[st], 1);
      Barrier::init(&k_empty[st], 8);  // a lane of each consumer warp
      Barrier::init(&v_empty[st], 8);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  // Persistent: block b takes items b, b + gridDim.x, ... (AttnItem: the query blocks fastest). The
  // key/value ring runs on across items: g counts the block's tiles.
  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    if (tid == 0) {
      int g = 0;
      typename Hooks::State hook_state{};  // the load thread's, across the block's items
      for (int i = static_cast<int>(blockIdx.x), local = 0; i < p.items; i += static_cast<int>(gridDim.x), ++local) {
        const AttnItem w = item_of(p, i);
        const KvRange range(p, w.m_block);
        if (local > 0) Barrier::wait(q_empty, (local - 1) & 1);  // the last item's O is out of Q's buffer
        TxBarrier::arrive_and_expect_tx(q_full, L::kQBytes);
        for (int b = 0; b < L::kBoxes; ++b)
          tma_load_4d(q_s + b * L::kQBoxBytes, &p.q_map, b * kBoxCols, w.head, static_cast<int>(range.m0), w.batch,
                      q_full);
        // K of tile it, then V of tile it - 1: the order the consumers take them in (S of a tile is
        // issued with P·V of the one before).
        auto load_k = [&](int it) {
          const int gi = g + it, st = gi % L::kStages, tile = range.tile(it);
          if constexpr (Hooks::kWaits)
            hooks.before_kv_tile(AttnTileWork{w.batch, w.head, w.kv_head, w.m_block, tile}, hook_state);
          if (gi >= L::kStages) Barrier::wait(&k_empty[st], ((gi / L::kStages) - 1) & 1);
          TxBarrier::arrive_and_expect_tx(&k_full[st], L::kKvBytes);
          for (int b = 0; b < L::kBoxes; ++b)
            tma_load_4d(k_s(st) + b * L::kKvBoxBytes, &p.k_map, b * kBoxCols, w.kv_head, tile * kAttnBlockN, w.batch,
                        &k_full[st]);
        };
        auto load_v = [&](int it) {
          const int gi = g + it, st = gi % L::kStages, tile = range.tile(it);
          if (gi >= L::kStages) Barrier::wait(&v_empty[st], ((gi / L::kStages) - 1) & 1);
          TxBarrier::arrive_and_expect_tx(&v_full[st], L::kKvBytes);
          for (int b = 0; b < L::kBoxes; ++b)
            tma_load_4d(v_s(st) + b * L::kKvBoxBytes, &p.v_map, b * kBoxCols, w.kv_head, tile * kAttnBlockN, w.batch,
                        &v_full[st]);
        };
        for (int it = 0; it < range.n; ++it) {
          load_k(it);
          if (it > 0) load_v(it - 1);
        }
        if (range.n > 0) load_v(range.n - 1);
        g += range.n;
        if constexpr (!kPersistent) break;
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
  const int wg = warpgroup - 1;  // 0 or 1: rows [64 wg, 64 wg + 64) of the block
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t q_wg = q_s + wg * kWgRows * kRowBytes;

  float o[L::kO];
  float s[64];
  uint32_t pf[32];  // P, the A fragments of the 8 k16 steps of P·V
  int row0 = 0;  // this thread's first row of the item (and row0 + 8)

  // NOTE: the operands' addresses pass through an empty asm, so their descriptors are formed at
  // each issue: hoisted out of the item loop, the descriptors of every stage held ~90 registers and
  // the consumers spilled.
  auto issue_s = [&](int st) {
    uint32_t qa = q_wg, ka = k_s(st);
    asm volatile("" : "+r"(qa), "+r"(ka));
    fence_regs(s);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t off = (kk % 4) * 32;
      mma_ss<typename Mma::S>(desc_k_major(qa + (kk / 4) * L::kQBoxBytes + off),
                              desc_k_major(ka + (kk / 4) * L::kKvBoxBytes + off), s, kk > 0,
                              std::make_index_sequence<64>{});
    }
    cute::warpgroup_commit_batch();
  };
  auto issue_pv = [&](int st, bool accumulate) {
    uint32_t va = v_s(st);
    asm volatile("" : "+r"(va));
    fence_regs(o);
    fence_regs(pf);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < kAttnBlockN / 16; ++kk)
      mma_rs<typename Mma::PV>(&pf[4 * kk], desc_mn_major(va + kk * 16 * kRowBytes), o, accumulate || kk > 0,
                               std::make_index_sequence<L::kO>{});
    cute::warpgroup_commit_batch();
  };
  // Masks tile `tile`'s scores: keys past seq_k, and (causal) keys later than the row's query.
  auto mask = [&](int tile) {
    const int64_t first = int64_t{tile} * kAttnBlockN;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int64_t lim = p.seq_k - first - 1;  // the last column kept
      if (p.causal) lim = min(lim, p.q_pos0 + row0 + 8 * r - p.kv_pos0 - first);
      // NOTE: column 8j + 2 (lane % 4) + e is compared as 8j + e (an immediate) against the limit
      // less this lane's offset: with the lane's 32 columns formed as values, the persistent form
      // kept them in registers across its items and spilled.
      const int last = (lim < -1 ? -1 : lim > kAttnBlockN ? kAttnBlockN : static_cast<int>(lim)) - 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (8 * j + e > last) s[4 * j + 2 * r + e] = -INFINITY;
    }
  };
  auto pack_p = [&]() {
#pragma unroll
    for (int i = 0; i < 32; ++i) pf[i] = pack2<In>(s[2 * i], s[2 * i + 1]);
  };
  auto rescale_o = [&](const float (&c)[2]) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[4 * j + 0] *= c[0];
      o[4 * j + 1] *= c[0];
      o[4 * j + 2] *= c[1];
      o[4 * j + 3] *= c[1];
    }
  };
  auto release_k = [&](int st) {
    if (lane == 0) Barrier::arrive(&k_empty[st]);
  };
  auto release_v = [&](int st) {
    if (lane == 0) Barrier::arrive(&v_empty[st]);
  };

  // The two consumer warpgroups take turns issuing their MMAs (named barriers 3 and 4: "warpgroup
  // 0's turn", "warpgroup 1's"), so one's softmax runs while the other's MMAs hold the tensor cores.
  // Warpgroup 1 gives warpgroup 0 the first turn; each issue point waits for its own turn and passes
  // it on (both take the same number of turns an item; warpgroup 1's last pass is never taken up).
  auto my_turn = [&]() { asm volatile("bar.sync %0, 256;" ::"r"(3 + wg) : "memory"); };
  auto pass_turn = [&]() { asm volatile("bar.arrive %0, 256;" ::"r"(4 - wg) : "memory"); };
  if (wg == 1) pass_turn();

  int g = 0;
  for (int i = static_cast<int>(blockIdx.x), local = 0; i < p.items; i += static_cast<int>(gridDim.x), ++local) {
    const AttnItem w = item_of(p, i);
    const KvRange range(p, w.m_block);
    row0 = static_cast<int>(range.m0) + wg * kWgRows + warp * 16 + lane / 4;
    RowState state;
    TxBarrier::wait(q_full, local & 1);
    if (range.n == 0) {
#pragma unroll
      for (int v = 0; v < L::kO; ++v) o[v] = 0.f;
    } else {
      float c[2];
      const int st0 = g % L::kStages;
      TxBarrier::wait(&k_full[st0], (g / L::kStages) & 1);
      my_turn();
      issue_s(st0);
      pass_turn();
      cute::warpgroup_wait<0>();
      fence_regs(s);
      release_k(st0);
      if (range.masked(p, range.tile(0))) mask(range.tile(0));
      state.update(s, p.scale_log2, c);
      pack_p();
      for (int it = 1; it < range.n; ++it) {
        const int gi = g + it, st = gi % L::kStages, prev = (gi - 1) % L::kStages, tile = range.tile(it);
        TxBarrier::wait(&k_full[st], (gi / L::kStages) & 1);
        TxBarrier::wait(&v_full[prev], ((gi - 1) / L::kStages) & 1);
        my_turn();
        issue_s(st);
        issue_pv(prev, it > 1);
        pass_turn();
        cute::warpgroup_wait<1>();  // S is in
        fence_regs(s);
        release_k(st);
        if (range.masked(p, tile)) mask(tile);
        state.update(s, p.scale_log2, c);
        cute::warpgroup_wait<0>();  // P·V of the previous tile is done
        fence_regs(o);
        fence_regs(pf);
        release_v(prev);
        rescale_o(c);
        pack_p();
      }
      const int gl = g + range.n - 1, last = gl % L::kStages;
      TxBarrier::wait(&v_full[last], (gl / L::kStages) & 1);
      my_turn();
      issue_pv(last, range.n > 1);
      pass_turn();
      cute::warpgroup_wait<0>();
      fence_regs(o);
      release_v(last);
    }
    g += range.n;

    // The epilogue: the quad's partial sums, O / l into this warpgroup's rows of Q's buffer (the
    // swizzled box layout the O map stores from; every MMA reading them is done), lse from
    // registers.
    // Merging: this call's (O_c, lse_c) and the partial (O_p, lse_p) already in O and lse weigh
    // exp(lse_c - lse) and exp(lse_p - lse), lse = log(exp(lse_c) + exp(lse_p)); a side with
    // lse -inf (no key seen) weighs 0, and its O is never read.
    float inv[2], keep[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = state.l[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv[r] = l > 0.f ? 1.f / l : 0.f;
      const int row = row0 + 8 * r;
      float lse = l > 0.f ? (state.m[r] * p.scale_log2 + __log2f(l)) * 0.69314718055994530942f : -INFINITY;
      float* lse_at = p.lse + (w.batch * p.lse_stride_b + w.head * p.lse_stride_h + row * p.lse_stride_s);
      if (p.merge && row < p.seq_q) {
        const float prev = *lse_at;
        const float hi = fmaxf(prev, lse);
        if (hi != -INFINITY) {
          const float wp = __expf(prev - hi), wc = __expf(lse - hi), sum = wp + wc;
          keep[r] = wp / sum;
          inv[r] *= wc / sum;
          lse = hi + __logf(sum);
        }
      }
      __syncwarp();  // the quad has read the partial's lse
      if (p.lse != nullptr && lane % 4 == 0 && row < p.seq_q) *lse_at = lse;
    }
    uint8_t* q_wg_ptr = smem + wg * kWgRows * kRowBytes;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = 8 * j + 2 * (lane % 4);
      const int box = col / kBoxCols, byte = (col % kBoxCols) * 2;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp * 16 + lane / 4 + 8 * r;  // in the warpgroup's 64 rows
        const int chunk = (byte / 16) ^ (row % 8);
        float2 prev = make_float2(0.f, 0.f);
        if (keep[r] != 0.f) prev = unpack2<In>(static_cast<const In*>(p.o) + w.batch * p.o_stride_b +
                                               (row0 + 8 * r) * p.o_stride_s + w.head * p.o_stride_h + col);
        *reinterpret_cast<uint32_t*>(q_wg_ptr + box * L::kQBoxBytes + row * kRowBytes + chunk * 16 + byte % 16) =
            pack2<In>(fmaf(prev.x, keep[r], o[4 * j + 2 * r] * inv[r]), fmaf(prev.y, keep[r], o[4 * j + 2 * r + 1] * inv[r]));
      }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
    if (tid == 0) {
      for (int b = 0; b < L::kBoxes; ++b)
        tma_store_4d(&p.o_map, q_wg + b * L::kQBoxBytes, b * kBoxCols, w.head,
                     static_cast<int>(range.m0) + wg * kWgRows, w.batch);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      if constexpr (Hooks::kNotifies) {
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the rows are in O ...
        asm volatile("fence.proxy.async.global;" ::: "memory");    // ... before the hook's release
        hooks.after_o_rows(AttnTileWork{w.batch, w.head, w.kv_head, w.m_block, -1, wg});
      } else {
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // shared memory read out
      }
      Barrier::arrive(q_empty);  // the producer may load the next item's Q
    }
    if constexpr (!kPersistent) break;
  }
#endif
}

// Strides of a [batch, seq, heads, head_dim] tensor: the given ones, or packed.
struct Strides {
  int64_t b, s, h;
};
inline Strides strides_of(int64_t sb, int64_t ss, int64_t sh, int64_t seq, int heads, int d) {
  if (sb == 0 && ss == 0 && sh == 0) return {seq * heads * d, int64_t{heads} * d, d};
  return {sb, ss, sh};
}

inline void encode_4d(CUtensorMap* map, DType dtype, const void* base, int d, int heads, int64_t seq, int batch,
               const Strides& st, int box_rows, const char* what) {
  const CUtensorMapDataType type =
      dtype == DType::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(seq), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(st.h) * 2, static_cast<cuuint64_t>(st.s) * 2,
                                 static_cast<cuuint64_t>(st.b) * 2};
  const cuuint32_t box[4] = {kBoxCols, 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = cutlass::call_cuTensorMapEncodeTiled(
      map, type, 4, const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TL_REQUIRE(r == CUDA_SUCCESS,
             "sm90 attention: cuTensorMapEncodeTiled for " << what << " failed (CUresult " << static_cast<int>(r) << ")");
}

// num_sms: blocks of the persistent grid (one an SM), at most one an item; 0: a block an item,
// the fastest on a whole GPU (measured 2026-12-04 on the H200, the persistent form on 132 SMs:
// 9% slower without the mask, 10-17% with it; bench/results/2026-12-04_h200_attention.md).
template <class In, int D, class Hooks>
void launch_attention(const AttnArgs& a, const Hooks& hooks, int num_sms, cudaStream_t stream) {
  using L = AttnLayout<D>;
  AttnParams p{};
  const Strides qs = strides_of(a.q_stride_b, a.q_stride_s, a.q_stride_h, a.seq_q, a.heads_q, D);
  const Strides ks = strides_of(a.k_stride_b, a.k_stride_s, a.k_stride_h, a.seq_k, a.heads_kv, D);
  const Strides vs = strides_of(a.v_stride_b, a.v_stride_s, a.v_stride_h, a.seq_k, a.heads_kv, D);
  const Strides os = strides_of(a.o_stride_b, a.o_stride_s, a.o_stride_h, a.seq_q, a.heads_q, D);
  encode_4d(&p.q_map, a.dtype, a.q, D, a.heads_q, a.seq_q, a.batch, qs, kAttnBlockM, "Q");
  encode_4d(&p.k_map, a.dtype, a.k, D, a.heads_kv, a.seq_k, a.batch, ks, kAttnBlockN, "K");
  encode_4d(&p.v_map, a.dtype, a.v, D, a.heads_kv, a.seq_k, a.batch, vs, kAttnBlockN, "V");
  encode_4d(&p.o_map, a.dtype, a.o, D, a.heads_q, a.seq_q, a.batch, os, kWgRows, "O");
  p.lse = a.lse;
  if (a.lse_stride_b == 0 && a.lse_stride_h == 0 && a.lse_stride_s == 0) {
    p.lse_stride_s = 1;
    p.lse_stride_h = a.seq_q;
    p.lse_stride_b = a.seq_q * a.heads_q;
  } else {
    p.lse_stride_b = a.lse_stride_b;
    p.lse_stride_h = a.lse_stride_h;
    p.lse_stride_s = a.lse_stride_s;
  }
  p.seq_q = a.seq_q;
  p.seq_k = a.seq_k;
  p.q_pos0 = a.q_pos0;
  p.kv_pos0 = a.kv_pos0;
  p.heads_q = a.heads_q;
  p.group = a.heads_q / a.heads_kv;
  p.m_blocks = static_cast<int>((a.seq_q + kAttnBlockM - 1) / kAttnBlockM);
  const float scale = a.scale != 0.f ? a.scale : 1.f / std::sqrt(static_cast<float>(D));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.causal = a.causal;
  p.merge = a.merge;
  p.o = a.o;
  p.o_stride_b = os.b, p.o_stride_s = os.s, p.o_stride_h = os.h;

  p.kv_walk_from = a.kv_walk_from;

  p.items = static_cast<int>(int64_t{p.m_blocks} * a.heads_q * a.batch);
  const dim3 grid(num_sms > 0 ? std::min(p.items, num_sms) : p.items);
  auto* kernel = num_sms > 0 ? attention_kernel<In, D, Hooks, L::kStages, true>
                             : attention_kernel<In, D, Hooks, L::kStages, false>;
  TL_SM90_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmemBytes));
  kernel<<<grid, kThreads, L::kSmemBytes, stream>>>(p, hooks);
  TL_SM90_CUDA_CHECK(cudaGetLastError());
}

// attention_check, then the instance for a's dtype and head dim with `hooks`, on a.num_sms blocks
// (0: a block an item): the one dispatch the plain engine and the fused ops launch through.
template <class Hooks>
void launch_checked(const AttnArgs& a, const Hooks& hooks, cudaStream_t stream) {
  attention_check(a);
  if (a.dtype == DType::kBF16) {
    if (a.head_dim == 128) launch_attention<__nv_bfloat16, 128>(a, hooks, a.num_sms, stream);
    else launch_attention<__nv_bfloat16, 64>(a, hooks, a.num_sms, stream);
  } else {
    if (a.head_dim == 128) launch_attention<__half, 128>(a, hooks, a.num_sms, stream);
    else launch_attention<__half, 64>(a, hooks, a.num_sms, stream);
  }
}

}  // namespace tilelink::compute::sm90::attn_detail
