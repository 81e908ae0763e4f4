// The CPU attention tile engine and its float64 reference (compute/cpu_attention.hpp).
#include "tilelink/compute/cpu_attention.hpp"

#include <cmath>
#include <limits>

#include "tilelink/core/error.hpp"

namespace tilelink {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}

AttnTile::AttnTile(int64_t rows_, int64_t head_dim_)
    : rows(rows_), head_dim(head_dim_), acc(rows_ * head_dim_, 0.0f), m(rows_, kNegInf), l(rows_, 0.0f) {
  TL_REQUIRE(rows_ >= 0 && head_dim_ >= 1, "attention: a tile of " << rows_ << " rows of " << head_dim_);
}

void attn_tile_update(AttnTile& t, const void* q, int64_t ldq, const int64_t* q_pos, const void* k,
                      const void* v, int64_t ldkv, int64_t kv_pos0, int64_t kv_rows, DType dtype,
                      float scale, bool causal) {
  const int64_t d = t.head_dim;
  std::vector<float> s(kv_rows);
  for (int64_t i = 0; i < t.rows; ++i) {
    // the scores of row i, masked keys at -inf
    float tile_max = kNegInf;
    for (int64_t j = 0; j < kv_rows; ++j) {
      if (causal && kv_pos0 + j > q_pos[i]) {
        s[j] = kNegInf;
        continue;
      }
      float dot = 0.0f;
      for (int64_t c = 0; c < d; ++c)
        dot += load_as_float(q, dtype, i * ldq + c) * load_as_float(k, dtype, j * ldkv + c);
      s[j] = dot * scale;
      tile_max = std::max(tile_max, s[j]);
    }
    if (tile_max == kNegInf) continue;  // every key masked: nothing to fold
    const float m_new = std::max(t.m[i], tile_max);
    const float rescale = t.m[i] == kNegInf ? 0.0f : std::exp(t.m[i] - m_new);
    float* acc = t.acc.data() + i * d;
    for (int64_t c = 0; c < d; ++c) acc[c] *= rescale;
    float l = t.l[i] * rescale;
    for (int64_t j = 0; j < kv_rows; ++j) {
      if (s[j] == kNegInf) continue;
      const float p = std::exp(s[j] - m_new);
      l += p;
      for (int64_t c = 0; c < d; ++c) acc[c] += p * load_as_float(v, dtype, j * ldkv + c);
    }
    t.m[i] = m_new;
    t.l[i] = l;
  }
}

void attn_tile_finish(const AttnTile& t, void* out, int64_t ldo, float* lse, DType dtype) {
  for (int64_t i = 0; i < t.rows; ++i) {
    const bool none = t.l[i] == 0.0f;
    for (int64_t c = 0; c < t.head_dim; ++c)
      store_from_float(out, dtype, i * ldo + c, none ? 0.0f : t.acc[i * t.head_dim + c] / t.l[i]);
    if (lse) lse[i] = none ? kNegInf : t.m[i] + std::log(t.l[i]);
  }
}

AttnReference attention_reference_f64(const void* q, const void* k, const void* v, DType dtype,
                                      int64_t sq, int64_t skv, int heads_q, int heads_kv,
                                      int64_t head_dim, const std::vector<int64_t>& q_pos, float scale,
                                      bool causal) {
  TL_REQUIRE(heads_kv >= 1 && heads_q >= heads_kv && heads_q % heads_kv == 0,
             "attention: " << heads_q << " query heads over " << heads_kv << " key/value heads");
  TL_REQUIRE(static_cast<int64_t>(q_pos.size()) == sq, "attention: " << q_pos.size() << " positions for " << sq << " rows");
  const int64_t d = head_dim, group = heads_q / heads_kv;
  AttnReference r;
  r.out.assign(sq * heads_q * d, 0.0);
  r.lse.assign(sq * heads_q, -std::numeric_limits<double>::infinity());
  std::vector<double> s(skv);
  for (int64_t i = 0; i < sq; ++i)
    for (int h = 0; h < heads_q; ++h) {
      const int64_t hk = h / group;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < skv; ++j) {
        if (causal && j > q_pos[i]) {
          s[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double dot = 0;
        for (int64_t c = 0; c < d; ++c)
          dot += double(load_as_float(q, dtype, (i * heads_q + h) * d + c)) *
                 load_as_float(k, dtype, (j * heads_kv + hk) * d + c);
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      if (mx == -std::numeric_limits<double>::infinity()) continue;
      double l = 0;
      for (int64_t j = 0; j < skv; ++j)
        if (s[j] != -std::numeric_limits<double>::infinity()) {
          const double p = std::exp(s[j] - mx);
          l += p;
          for (int64_t c = 0; c < d; ++c)
            r.out[(i * heads_q + h) * d + c] += p * load_as_float(v, dtype, (j * heads_kv + hk) * d + c);
        }
      for (int64_t c = 0; c < d; ++c) r.out[(i * heads_q + h) * d + c] /= l;
      r.lse[i * heads_q + h] = mx + std::log(l);
    }
  return r;
}

}  // namespace tilelink
