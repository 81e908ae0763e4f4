// The sm_90a attention engine (forward): for every batch entry b and query head h,
//
//   O[b, :, h] = softmax(Q[b, :, h] K[b, :, h / G]ᵀ · scale + mask) V[b, :, h / G]
//   lse[b, h, i] = log Σ_j exp(Q[b, i, h] · K[b, j, h / G] · scale)   (over the unmasked j)
//
// with G = heads_q / heads_kv query heads sharing a key/value head (GQA; G = 1 is multi-head).
// Q and O are [batch, seq_q, heads_q, head_dim], K and V [batch, seq_k, heads_kv, head_dim], each
// with its own element strides (head_dim contiguous), bf16 or fp16 in and out, fp32 inside.
//
// The causal mask works on positions: query row i is at position q_pos0 + i and key row j at
// kv_pos0 + j; key j is masked from query i where its position is greater. So a shard of queries
// attends to a gathered or partial sequence by saying where both start (q_pos0 = kv_pos0 = 0 is the
// usual square mask). A row that sees no key at all gets O = 0 and lse = -inf. With `merge` the
// call folds its keys into the partial result already in O and lse (the keys' order does not
// matter to softmax): ring attention's steps, or a key range split over calls.
//
// The kernel: a block an item of kAttnBlockM = 128 query rows of one (b, h), or (num_sms) a
// persistent block an SM walking the items in turn; the query blocks fastest (a head's blocks run
// side by side and share its keys and values in L2): warpgroup 0's first warp
// loads Q once and then streams the key/value tiles (kAttnBlockN rows each) by TMA through a ring of
// shared-memory stages, K and V on separate barriers; warpgroups 1 and 2 each own 64 of the query
// rows: S = Q·Kᵀ by wgmma from shared memory, the online softmax in registers, O += P·V by wgmma with
// P from registers, the next tile's S issued before this tile's P·V is waited for. Causal blocks
// visit only the key tiles at or before their last query's position, the masked ones first, and the
// heaviest query blocks launch first. O goes out through shared memory by a TMA store (clipped to
// seq_q), lse from registers.
//
//   AttnArgs a;
//   a.q = q; a.k = k; a.v = v; a.o = o; a.lse = lse;
//   a.batch = 1; a.seq_q = a.seq_k = 8192; a.heads_q = 32; a.heads_kv = 8; a.head_dim = 128;
//   a.causal = true;                       // strides 0: packed [b, s, h, d]
//   attention_forward(a, stream);
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "tilelink/core/dtype.hpp"

namespace tilelink::compute::sm90 {

inline constexpr int kAttnBlockM = 128;  // query rows a block
inline constexpr int kAttnBlockN = 128;  // key/value rows a tile

struct AttnArgs {
  const void* q = nullptr;  // [batch, seq_q, heads_q, head_dim]
  const void* k = nullptr;  // [batch, seq_k, heads_kv, head_dim]
  const void* v = nullptr;  // [batch, seq_k, heads_kv, head_dim]
  void* o = nullptr;        // [batch, seq_q, heads_q, head_dim]
  float* lse = nullptr;     // optional: lse[b * lse_stride_b + h * lse_stride_h + i * lse_stride_s]
  int batch = 1;
  int64_t seq_q = 0, seq_k = 0;
  int heads_q = 1, heads_kv = 1;
  int head_dim = 128;  // 64 or 128
  // Element strides of batch, sequence and head (0: packed). head_dim is contiguous; every stride
  // a multiple of 8 elements (TMA's 16 bytes).
  int64_t q_stride_b = 0, q_stride_s = 0, q_stride_h = 0;
  int64_t k_stride_b = 0, k_stride_s = 0, k_stride_h = 0;
  int64_t v_stride_b = 0, v_stride_s = 0, v_stride_h = 0;
  int64_t o_stride_b = 0, o_stride_s = 0, o_stride_h = 0;
  int64_t lse_stride_b = 0, lse_stride_h = 0, lse_stride_s = 0;  // 0 (all three): [batch, heads_q, seq_q]
  float scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  bool causal = false;
  int64_t q_pos0 = 0, kv_pos0 = 0;  // positions of query row 0 and key row 0 (the causal mask)
  // The walk over a block's key/value tiles starts at the tile holding this key row and goes down,
  // on past tile 0 to the last tile it visits; -1: from the last (the masked tiles first). A fused
  // op starts at its own rank's rows, whose tiles are ready first.
  int64_t kv_walk_from = -1;
  DType dtype = DType::kBF16;      // kBF16 or kF16, every tensor but lse
  // O and lse (required) already hold the attention of these queries over other keys: this call's
  // is folded in by log-sum-exp (a ring step, a split key range). A row with lse -inf there has
  // seen no key yet (its O is not read).
  bool merge = false;
  // Blocks of a persistent grid (one an SM, each walking items in turn), for a caller that keeps
  // SMs for other work (a comm program's copies); 0: a block an item, the fastest on a whole GPU.
  int num_sms = 0;
};

// What a hook sees. before_kv_tile: the block of query rows [m_block * kAttnBlockM, +kAttnBlockM)
// of (batch, head) is about to load key/value tile kv_tile (rows [kv_tile * kAttnBlockN,
// +kAttnBlockN) of kv_head); called by the one thread that issues the loads. after_o_rows: the
// warpgroup `half` has stored rows [m_block * kAttnBlockM + half * 64, +64) of O (and their lse):
// they are in global memory, ordered before the hook's release.
struct AttnTileWork {
  int batch = 0, head = 0, kv_head = 0;
  int m_block = 0;
  int kv_tile = -1;
  int half = 0;
};

// The plain engine's hooks (none). A Hooks type has kWaits and kNotifies, a State type (the load
// thread's own, made once a block and kept across its items: what its waits have already seen) and,
// for those set, `__device__ void before_kv_tile(const AttnTileWork&, State&) const` /
// `after_o_rows(const AttnTileWork&) const`; like the GEMM engine's, a hook must make no function
// call (quiet waits: backend/cuda/prim.cuh).
struct NoAttnHooks {
  static constexpr bool kWaits = false;
  static constexpr bool kNotifies = false;
  struct State {};
#if defined(__CUDACC__)
  __device__ void before_kv_tile(const AttnTileWork&, State&) const {}
  __device__ void after_o_rows(const AttnTileWork&) const {}
#endif
};

// Throws tilelink::Error, naming the field, for arguments the engine does not take: null tensors,
// non-positive sizes, heads_q not a multiple of heads_kv, head_dim other than 64 and 128, strides
// not multiples of 8 elements, an unsupported dtype, a device that is not sm_90.
void attention_check(const AttnArgs& args);

// attention_check, then the launch on `stream` (no synchronisation; graph-capturable).
void attention_forward(const AttnArgs& args, cudaStream_t stream);

// The FLOPs of the call (4 · B · Hq · D per visible (query, key) pair: the two GEMMs), counting
// under `causal` only the pairs the mask keeps.
double attention_flops(const AttnArgs& args);

}  // namespace tilelink::compute::sm90
