// The CPU attention tile engine (flash style: online softmax over key/value tiles, fp32 state) and
// its float64 reference: the reference of the sequence-parallel attention ops.
//
// Layouts, one batch entry: Q [Sq, Hq, D], K and V [Skv, Hkv, D] (row-major, a row = one position's
// heads). GQA: query head h reads key/value head h / (Hq / Hkv). Causal: query position p sees key
// positions <= p (positions are global sequence positions, which a rank's shard gives its rows).
//
//   AttnTile t(rows, head_dim);                          // one query head's rows, state reset
//   for each key/value tile, in a fixed order:
//     attn_tile_update(t, q, ldq, q_pos, k, v, ldkv, kv_pos0, kv_rows, dtype, scale, causal);
//   attn_tile_finish(t, out, ldo, lse, dtype);           // out = acc / l, lse = m + log(l)
//
// A tile's result depends on the order of its key/value tiles (the online softmax rescales), so
// fused and unfused paths that must agree bit for bit visit them in the same order.
#pragma once

#include <cstdint>
#include <vector>

#include "tilelink/core/dtype.hpp"

namespace tilelink {

struct AttnTile {
  int64_t rows = 0, head_dim = 0;
  std::vector<float> acc;  // [rows, head_dim]: Σ exp(s - m) · v
  std::vector<float> m;    // [rows]: the running max of the scores (-inf: nothing seen)
  std::vector<float> l;    // [rows]: Σ exp(s - m)
  AttnTile(int64_t rows, int64_t head_dim);
};

// Folds key/value rows [kv_pos0, kv_pos0 + kv_rows) into the state. q: the tile's first query row
// (row stride ldq elements, `rows` rows of head_dim), q_pos[i]: row i's position; k, v: the first
// key/value row of the head (row stride ldkv). Under `causal` a key past a row's position is
// masked; a tile that masks every key changes nothing.
void attn_tile_update(AttnTile& t, const void* q, int64_t ldq, const int64_t* q_pos, const void* k,
                      const void* v, int64_t ldkv, int64_t kv_pos0, int64_t kv_rows, DType dtype,
                      float scale, bool causal);

// out[i, :] = acc / l (rounded once to dtype; row stride ldo), lse[i] = m + log(l) (fp32; -inf for a
// row that saw no key, whose out is 0). lse may be null.
void attn_tile_finish(const AttnTile& t, void* out, int64_t ldo, float* lse, DType dtype);

// Float64 reference for one batch entry: every query head's rows against every key position
// (q_pos[i]: row i's position). Returns out [Sq, Hq, D] and lse [Sq, Hq].
struct AttnReference {
  std::vector<double> out, lse;
};
AttnReference attention_reference_f64(const void* q, const void* k, const void* v, DType dtype,
                                      int64_t sq, int64_t skv, int heads_q, int heads_kv,
                                      int64_t head_dim, const std::vector<int64_t>& q_pos, float scale,
                                      bool causal);

}  // namespace tilelink
