// Internal to the CPU attention ops: a compute worker's query tiles, each an online-softmax state
// (compute/cpu_attention.hpp) kept until finish(). Units are (batch, query head, query tile of
// q_tile rows) in that order, strided over the workers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "tilelink/compute/cpu_attention.hpp"
#include "tilelink/ops/attention_plan.hpp"

namespace tilelink::cpu::detail {

struct QueryTiles {
  struct Unit {
    int b, h;
    int64_t i0, n;
    std::vector<int64_t> q_pos;  // the rows' positions in the sequence
    AttnTile state;
    int64_t last_pos() const { return *std::max_element(q_pos.begin(), q_pos.end()); }
  };
  const AttnLayout& p;
  std::vector<Unit> units;

  QueryTiles(const AttnLayout& layout, int q_tile, int worker, int workers) : p(layout) {
    const int64_t rows = p.local_rows(), q_tiles = (rows + q_tile - 1) / q_tile;
    const int64_t count = int64_t{p.shape.batch} * p.shape.heads_q * q_tiles;
    for (int64_t u = worker; u < count; u += workers) {
      const int b = static_cast<int>(u / (int64_t{p.shape.heads_q} * q_tiles));
      const int h = static_cast<int>(u / q_tiles % p.shape.heads_q);
      const int64_t i0 = u % q_tiles * q_tile, n = std::min<int64_t>(q_tile, rows - i0);
      std::vector<int64_t> pos(n);
      for (int64_t i = 0; i < n; ++i) pos[i] = p.sharding.position_of(p.rank, i0 + i);
      units.push_back({b, h, i0, n, std::move(pos), AttnTile(n, p.shape.head_dim)});
    }
  }

  // Folds rows [begin, end) of `owner`'s shard into u's state, in runs of contiguous positions (a
  // zigzag shard's two chunks). k, v: the owner's row 0 of u's batch entry ([rows, Hkv, D]).
  void fold(Unit& u, const void* q, const std::byte* k, const std::byte* v, int owner, int64_t begin,
            int64_t end) const {
    const SpAttnShape& s = p.shape;
    const int64_t eb = dtype_size(p.dtype), d = s.head_dim, ld = int64_t{s.heads_kv} * d;
    const auto* qb = static_cast<const std::byte*>(q) + ((int64_t{u.b} * p.local_rows() + u.i0) * s.heads_q + u.h) * d * eb;
    const int64_t head = int64_t{u.h / (s.heads_q / s.heads_kv)} * d * eb;
    for (int64_t r = begin; r < end;) {
      const int64_t run = std::min(end - r, p.sharding.run_from(owner, r));
      attn_tile_update(u.state, qb, int64_t{s.heads_q} * d, u.q_pos.data(), k + r * ld * eb + head,
                       v + r * ld * eb + head, ld, p.sharding.position_of(owner, r), run, p.dtype, p.scale,
                       s.causal);
      r += run;
    }
  }

  // Every unit's output [B, S_r, Hq, D] and log-sum-exp [B, S_r, Hq] (lse may be null).
  void finish(void* o, float* lse) const {
    const SpAttnShape& s = p.shape;
    const int64_t eb = dtype_size(p.dtype), d = s.head_dim, rows = p.local_rows();
    std::vector<float> tl;
    for (const Unit& u : units) {
      tl.resize(u.n);
      attn_tile_finish(u.state, static_cast<std::byte*>(o) + ((int64_t{u.b} * rows + u.i0) * s.heads_q + u.h) * d * eb,
                       int64_t{s.heads_q} * d, tl.data(), p.dtype);
      if (lse)
        for (int64_t i = 0; i < u.n; ++i) lse[(int64_t{u.b} * rows + u.i0 + i) * s.heads_q + u.h] = tl[i];
    }
  }
};

}  // namespace tilelink::cpu::detail
