// The CPU attention tile engine against float64: random shapes, GQA, causal with contiguous and
// scattered query positions, key/value tiles in any order, rows that see no key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "../support/random.hpp"
#include "tilelink/compute/cpu_attention.hpp"
#include "tilelink/compute/cpu_gemm.hpp"

namespace tilelink {
namespace {

TEST(AttentionCpu, TilesInAnyOrderMatchFloat64) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 40; ++trial) {
    const int heads_kv = rng.uniform_int(1, 3), heads_q = heads_kv * rng.uniform_int(1, 3);
    const int64_t d = 8 * rng.uniform(1, 4), skv = rng.uniform(1, 70), sq = rng.uniform(1, 40);
    const bool causal = rng.coin();
    const DType dtype = rng.pick(std::vector<DType>{DType::kF32, DType::kBF16, DType::kF16});
    const int64_t tile_q = rng.uniform(1, 16), tile_kv = rng.uniform(1, 24);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " Sq " << sq << " Skv " << skv << " Hq " << heads_q
                                      << " Hkv " << heads_kv << " D " << d << (causal ? " causal " : " ")
                                      << dtype_name(dtype) << " tiles " << tile_q << "x" << tile_kv);
    const auto q = rng.tensor(dtype, sq * heads_q * d), k = rng.tensor(dtype, skv * heads_kv * d),
               v = rng.tensor(dtype, skv * heads_kv * d);
    // query positions: sorted, distinct, anywhere in [0, Skv) (a shard's rows: contiguous or not)
    std::vector<int64_t> all(skv);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng.gen());
    std::vector<int64_t> pos(sq);
    for (int64_t i = 0; i < sq; ++i) pos[i] = i < skv ? all[i] : rng.uniform(0, skv - 1);
    std::sort(pos.begin(), pos.end());
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const AttnReference ref = attention_reference_f64(q.data(), k.data(), v.data(), dtype, sq, skv, heads_q,
                                                      heads_kv, d, pos, scale, causal);
    // the engine: per head, per query tile, the key/value tiles in a shuffled order
    const int64_t eb = dtype_size(dtype);
    std::vector<std::byte> out(sq * heads_q * d * eb);
    test::poison(out);
    std::vector<float> lse(sq * heads_q, 0.0f);
    std::vector<int64_t> kv_tiles((skv + tile_kv - 1) / tile_kv);
    std::iota(kv_tiles.begin(), kv_tiles.end(), 0);
    std::shuffle(kv_tiles.begin(), kv_tiles.end(), rng.gen());
    for (int h = 0; h < heads_q; ++h) {
      const int hk = h / (heads_q / heads_kv);
      for (int64_t i0 = 0; i0 < sq; i0 += tile_q) {
        const int64_t rows = std::min(tile_q, sq - i0);
        AttnTile t(rows, d);
        for (int64_t kt : kv_tiles) {
          const int64_t j0 = kt * tile_kv, kv_rows = std::min(tile_kv, skv - j0);
          attn_tile_update(t, q.data() + ((i0 * heads_q + h) * d) * eb, heads_q * d, pos.data() + i0,
                           k.data() + ((j0 * heads_kv + hk) * d) * eb, v.data() + ((j0 * heads_kv + hk) * d) * eb,
                           heads_kv * d, j0, kv_rows, dtype, scale, causal);
        }
        std::vector<float> tl(rows);
        attn_tile_finish(t, out.data() + ((i0 * heads_q + h) * d) * eb, heads_q * d, tl.data(), dtype);
        for (int64_t i = 0; i < rows; ++i) lse[(i0 + i) * heads_q + h] = tl[i];
      }
    }
    EXPECT_LT(relative_error(out.data(), dtype, ref.out), dtype == DType::kF32 ? 1e-5 : 2e-2);
    for (int64_t i = 0; i < sq * heads_q; ++i) EXPECT_NEAR(lse[i], ref.lse[i], 1e-3 * (1 + std::abs(ref.lse[i]))) << i;
  }
}

// A row whose keys are all masked (its position before every key it is shown) gets 0 and lse -inf;
// a tile of masked keys leaves the state as it was.
TEST(AttentionCpu, RowsThatSeeNoKey) {
  const int64_t d = 8;
  std::vector<float> q(2 * d, 0.5f), k(4 * d, 0.25f), v(4 * d, 1.0f), out(2 * d, -7.0f);
  const std::vector<int64_t> pos{1, 5};
  AttnTile t(2, d);
  // keys at positions 2..5: row 0 (position 1) sees none, row 1 (position 5) sees all four
  attn_tile_update(t, q.data(), d, pos.data(), k.data(), v.data(), d, 2, 4, DType::kF32, 1.0f, true);
  std::vector<float> lse(2);
  attn_tile_finish(t, out.data(), d, lse.data(), DType::kF32);
  for (int c = 0; c < d; ++c) EXPECT_EQ(out[c], 0.0f);
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
  for (int c = 0; c < d; ++c) EXPECT_NEAR(out[d + c], 1.0f, 1e-6);
  EXPECT_NEAR(lse[1], 0.5f * 0.25f * d + std::log(4.0f), 1e-5);
}

}  // namespace
}  // namespace tilelink
