// The CPU attention tile engine against float64: random shapes, GQA, causal with contiguous and
// scattered query positions, key/value tiles in any order, rows that see no key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "../support/random.hpp"
#include "../support/refused.hpp"
#include "tilelink/backend/cpu/attention_ops.hpp"
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

// The shards' positions: every position of the sequence held by exactly one rank's row; zigzag's
// ranks hold chunks r and 2W - 1 - r; run_from's rows (to the end of the row's chunk) have
// contiguous positions.
TEST(SeqSharding, PositionsCoverTheSequenceOnceAndRunsAreContiguous) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 300; ++trial) {
    const int W = rng.uniform_int(1, 16);
    const int64_t seq = rng.uniform(1, 200);
    const SeqShard shard = rng.coin() ? SeqShard::kContiguous : SeqShard::kZigzag;
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " W " << W << " S " << seq
                                      << (shard == SeqShard::kZigzag ? " zigzag" : " contiguous"));
    const SeqSharding sh = SeqSharding::make(shard, seq, W, rng.uneven_counts(seq, W));
    ASSERT_EQ(sh.rows.total(), seq);
    std::vector<int> seen(seq, 0);
    for (int r = 0; r < W; ++r) {
      for (int64_t i = 0; i < sh.rows.size(r); ++i) {
        const int64_t p = sh.position_of(r, i);
        ASSERT_GE(p, 0);
        ASSERT_LT(p, seq);
        ++seen[p];
        const int64_t run = sh.run_from(r, i);
        ASSERT_GE(run, 1);
        ASSERT_LE(i + run, sh.rows.size(r));
        for (int64_t j = 1; j < run; ++j) ASSERT_EQ(sh.position_of(r, i + j), p + j);
      }
      if (shard == SeqShard::kZigzag && sh.rows.size(r) > 0) {
        EXPECT_EQ(sh.position_of(r, 0), sh.chunks.size(r) > 0 ? sh.chunks.begin(r) : sh.chunks.begin(2 * W - 1 - r));
      }
    }
    for (int64_t p = 0; p < seq; ++p) ASSERT_EQ(seen[p], 1) << "position " << p;
  }
}

// The units a position-masked kernel takes (the GPU ops' launches and moves): every rank's key
// pieces tile the sequence's positions once, each a run of the owner's rows at consecutive
// positions; a rank's query runs cover its rows once, each (where positions matter: contiguous, or
// under the mask) at consecutive positions; keys_needed is one past the rank's last position under
// the mask, S without it.
TEST(SeqSharding, QueryRunsAndKeyPiecesCoverShardsAtTheirPositions) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 300; ++trial) {
    const int W = rng.uniform_int(1, 8);
    const int64_t seq = rng.uniform(1, 200);
    const SeqShard shard = rng.coin() ? SeqShard::kContiguous : SeqShard::kZigzag;
    const bool causal = rng.coin();
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " W " << W << " S " << seq
                                      << (shard == SeqShard::kZigzag ? " zigzag" : " contiguous")
                                      << (causal ? " causal" : ""));
    const SeqSharding sh = SeqSharding::make(shard, seq, W, rng.uneven_counts(seq, W));
    SpAttnShape s;
    s.seq = seq, s.heads_q = 2, s.heads_kv = 1, s.head_dim = 8, s.causal = causal, s.shard = shard;
    std::vector<int> seen(seq, 0);
    for (int r = 0; r < W; ++r) {
      for (const KeyPiece& k : key_pieces(sh, r)) {
        ASSERT_GT(k.pos.size(), 0);
        ASSERT_LE(k.row0 + k.pos.size(), sh.rows.size(r));
        ASSERT_EQ(piece_parts(sh).begin(k.part), k.pos.begin);
        for (int64_t i = 0; i < k.pos.size(); ++i) {
          ASSERT_EQ(sh.position_of(r, k.row0 + i), k.pos.begin + i);
          ++seen[k.pos.begin + i];
        }
      }
      const SpAttnPlan p = SpAttnPlan::make(r, s, sh, DType::kF32, {});
      std::vector<int> row_seen(sh.rows.size(r), 0);
      int64_t last = -1;
      for (const QueryRun& q : query_runs(p)) {
        ASSERT_GT(q.rows, 0);
        for (int64_t i = 0; i < q.rows; ++i) {
          ++row_seen[q.row0 + i];
          if (causal || shard == SeqShard::kContiguous) {
            ASSERT_EQ(sh.position_of(r, q.row0 + i), q.pos0 + i);
          }
        }
      }
      for (int64_t i = 0; i < sh.rows.size(r); ++i) {
        ASSERT_EQ(row_seen[i], 1) << "rank " << r << " row " << i;
        last = std::max(last, sh.position_of(r, i));
      }
      EXPECT_EQ(keys_needed(p), causal ? last + 1 : seq) << "rank " << r;
    }
    for (int64_t i = 0; i < seq; ++i) ASSERT_EQ(seen[i], 1) << "position " << i;
  }
}

// The ring's reach: under the mask with contiguous shards rank r runs r + 1 steps (the blocks of
// ranks r..0) and the last rank forwards nothing; otherwise every rank runs W. Every step past the
// first of every rank is a block its left neighbour ran and forwarded, and a rank forwards only
// blocks it holds.
TEST(RingAttnPlan, StepsAndForwardsCarryEveryBlockARankReads) {
  for (SeqShard shard : {SeqShard::kContiguous, SeqShard::kZigzag}) {
    for (bool causal : {false, true}) {
      for (int W : {1, 2, 3, 8}) {
        SCOPED_TRACE(::testing::Message() << "W " << W << (causal ? " causal" : "")
                                          << (shard == SeqShard::kZigzag ? " zigzag" : " contiguous"));
        const int64_t seq = 40 * W;
        std::vector<int64_t> segs(W, 40);
        const SeqSharding sh = SeqSharding::make(shard, seq, W, shard == SeqShard::kContiguous ? segs : std::vector<int64_t>{});
        SpAttnShape s;
        s.seq = seq, s.heads_q = 2, s.heads_kv = 1, s.head_dim = 8, s.causal = causal, s.shard = shard;
        std::vector<RingAttnPlan> p;
        for (int r = 0; r < W; ++r) p.push_back(RingAttnPlan::make(r, s, sh, DType::kF32, 16, 1));
        for (int r = 0; r < W; ++r) {
          const bool trimmed = causal && shard == SeqShard::kContiguous;
          EXPECT_EQ(p[r].steps(), trimmed ? r + 1 : W);
          // The owners of its steps are every rank whose keys it reads.
          for (int o = 0; o < W; ++o) {
            bool folded = false;
            for (int st = 0; st < p[r].steps(); ++st) folded = folded || p[r].owner_at(st) == o;
            EXPECT_EQ(folded, !trimmed || o <= r) << "rank " << r << ", owner " << o;
          }
          const int left = (r - 1 + W) % W;
          for (int st = 1; st < p[r].steps(); ++st) {
            EXPECT_LT(st - 1, p[left].steps()) << "rank " << r << ", step " << st;
            EXPECT_TRUE(p[left].forwards(st - 1)) << "rank " << r << ", step " << st;
            EXPECT_EQ(p[left].owner_at(st - 1), p[r].owner_at(st));
          }
          for (int st = 0; st < W; ++st) {
            if (p[r].forwards(st)) {
              EXPECT_LT(st, p[r].steps()) << "rank " << r << " forwards a block it never holds";
            }
          }
        }
      }
    }
  }
}

// AllGather attention (even trials) and ring attention (odd) on CPU worlds of 1-8 ranks: contiguous shards (ragged, empty segments) and
// zigzag, causal or not, GQA, batch 1-2, pull and push, random tiles and workers; every rank's
// output and log-sum-exp against float64 over the whole sequence, and bit for bit against the
// unfused baseline, outputs poisoned first.
TEST(SpAttnCpu, GatherAndRingMatchFloat64AndUnfusedOnAnyWorld) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 40; ++trial) {
    const int W = rng.uniform_int(1, 8);
    SpAttnShape s;
    s.batch = rng.uniform_int(1, 2);
    s.heads_kv = rng.uniform_int(1, 2);
    s.heads_q = s.heads_kv * rng.uniform_int(1, 3);
    s.head_dim = 8 * rng.uniform(1, 3);
    s.seq = rng.uniform(1, 90);
    s.causal = rng.coin();
    s.shard = rng.coin() ? SeqShard::kContiguous : SeqShard::kZigzag;
    const DType dtype = rng.pick(std::vector<DType>{DType::kF32, DType::kBF16});
    SpAttnConfig cfg;
    cfg.mode = rng.coin() ? CommMode::kPull : CommMode::kPush;
    cfg.comm_tile_rows = rng.uniform_int(1, 16);
    cfg.q_tile = rng.uniform_int(1, 20);
    cfg.comm_workers = rng.uniform_int(1, 2);
    cfg.compute_workers = rng.uniform_int(1, 3);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << (trial % 2 ? " ring" : " gather") << " W " << W << " B " << s.batch << " S " << s.seq
                                      << " Hq " << s.heads_q << " Hkv " << s.heads_kv << " D " << s.head_dim
                                      << (s.causal ? " causal" : "") << (s.shard == SeqShard::kZigzag ? " zigzag" : " contiguous")
                                      << (cfg.mode == CommMode::kPull ? " pull" : " push") << " comm tile "
                                      << cfg.comm_tile_rows << " q tile " << cfg.q_tile << " " << dtype_name(dtype));
    const SeqSharding sh = SeqSharding::make(s.shard, s.seq, W, rng.uneven_counts(s.seq, W));
    cpu::World world(W);
    cpu::SpAttn op(world, s, sh, dtype, cfg);
    const int64_t eb = dtype_size(dtype), d = s.head_dim, qrow = s.heads_q * d, kvrow = s.heads_kv * d;
    // the whole sequence by position, then each rank's rows in shard order
    const auto q = rng.tensor(dtype, s.batch * s.seq * qrow), k = rng.tensor(dtype, s.batch * s.seq * kvrow),
               v = rng.tensor(dtype, s.batch * s.seq * kvrow);
    auto shard_of = [&](const std::vector<std::byte>& all, int64_t row_elems, int r) {
      const int64_t n = sh.rows.size(r);
      std::vector<std::byte> out(s.batch * n * row_elems * eb);
      for (int b = 0; b < s.batch; ++b)
        for (int64_t i = 0; i < n; ++i)
          std::copy_n(all.data() + (b * s.seq + sh.position_of(r, i)) * row_elems * eb, row_elems * eb,
                      out.data() + (b * n + i) * row_elems * eb);
      return out;
    };
    std::vector<std::vector<std::byte>> qs(W), ks(W), vs(W), o(W), o2(W);
    std::vector<std::vector<float>> lse(W), lse2(W);
    for (int r = 0; r < W; ++r) {
      qs[r] = shard_of(q, qrow, r), ks[r] = shard_of(k, kvrow, r), vs[r] = shard_of(v, kvrow, r);
      o[r].resize(qs[r].size()), o2[r].resize(qs[r].size());
      test::poison(o[r]), test::poison(o2[r]);
      lse[r].assign(s.batch * sh.rows.size(r) * s.heads_q, 7.0f), lse2[r] = lse[r];
    }
    const bool ring = trial % 2 == 1;  // odd trials: ring attention
    cpu::RingAttn ring_op(world, s, sh, dtype, cfg.q_tile, cfg.compute_workers);
    for (int call = 0; call < 2; ++call) {  // the second call on fresh signals' epochs, outputs poisoned again
      for (int r = 0; r < W; ++r) test::poison(o[r]);
      world.run([&](cpu::RankContext& ctx) {
        const int r = ctx.rank;
        if (ring) ring_op.run(ctx, qs[r].data(), ks[r].data(), vs[r].data(), o[r].data(), lse[r].data());
        else op.run(ctx, qs[r].data(), ks[r].data(), vs[r].data(), o[r].data(), lse[r].data());
      });
    }
    world.run([&](cpu::RankContext& ctx) {
      const int r = ctx.rank;
      if (ring) ring_op.run_unfused(ctx, qs[r].data(), ks[r].data(), vs[r].data(), o2[r].data(), lse2[r].data());
      else op.run_unfused(ctx, qs[r].data(), ks[r].data(), vs[r].data(), o2[r].data(), lse2[r].data());
    });
    std::vector<int64_t> pos(s.seq);
    std::iota(pos.begin(), pos.end(), 0);
    for (int b = 0; b < s.batch; ++b) {
      const AttnReference ref =
          attention_reference_f64(q.data() + b * s.seq * qrow * eb, k.data() + b * s.seq * kvrow * eb,
                                  v.data() + b * s.seq * kvrow * eb, dtype, s.seq, s.seq, s.heads_q, s.heads_kv, d,
                                  pos, 1.0f / std::sqrt(static_cast<float>(d)), s.causal);
      for (int r = 0; r < W; ++r) {
        SCOPED_TRACE(::testing::Message() << "batch " << b << " rank " << r);
        const int64_t n = sh.rows.size(r);
        if (n == 0) continue;
        std::vector<double> want(n * qrow), want_lse(n * s.heads_q);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t p = sh.position_of(r, i);
          std::copy_n(ref.out.begin() + p * qrow, qrow, want.begin() + i * qrow);
          std::copy_n(ref.lse.begin() + p * s.heads_q, s.heads_q, want_lse.begin() + i * s.heads_q);
        }
        EXPECT_LT(relative_error(o[r].data() + b * n * qrow * eb, dtype, want), dtype == DType::kF32 ? 1e-5 : 2e-2);
        for (int64_t i = 0; i < n * s.heads_q; ++i)
          ASSERT_NEAR(lse[r][b * n * s.heads_q + i], want_lse[i], 1e-3 * (1 + std::abs(want_lse[i]))) << i;
      }
    }
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(o[r], o2[r]) << "rank " << r << ": fused and unfused differ";
      EXPECT_EQ(lse[r], lse2[r]) << "rank " << r;
    }
  }
}

TEST(SpAttnCpu, RefusesBadShapes) {
  SpAttnShape s;
  s.seq = 16, s.heads_q = 3, s.heads_kv = 2, s.head_dim = 8;
  const SeqSharding sh = SeqSharding::make(SeqShard::kContiguous, 16, 2, {8, 8});
  test::expect_refused([&] { SpAttnPlan::make(0, s, sh, DType::kBF16, {}); }, "3 query heads over 2 key/value heads");
  test::expect_refused([&] { SeqSharding::make(SeqShard::kContiguous, 16, 2, {8, 7}); },
                       "the segments hold 15 positions, the sequence 16");
  test::expect_refused([&] { SeqSharding::make(SeqShard::kZigzag, 16, 33, {}); }, "at most 32 ranks");
  s.heads_q = 2, s.batch = 17;
  test::expect_refused([&] { SpAttnPlan::make(0, s, sh, DType::kBF16, {}); }, "batch 17 is out of range");
}

}  // namespace
}  // namespace tilelink
