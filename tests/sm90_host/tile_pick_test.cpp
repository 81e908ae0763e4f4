// The sm90 engine's host-side tile rules (gemm.hpp): the width pick and the plain engine's pick.
// Pure functions of the shape and the SM count: no GPU needed.
#include <gtest/gtest.h>

#include <tuple>

#include "tilelink/compute/sm90/gemm.hpp"

namespace tilelink::compute::sm90 {
namespace {

bool same(GemmTile a, GemmTile b) { return a.m == b.m && a.n == b.n; }

// The plain engine's own tiles where their whole waves cost less than the hooked widths' pick:
// 2048x7168 is 656 tiles of 128x176 (4.97 waves of 132) against 448 of 128x256 (3.4); 3000x5000 is
// 384 of 256x160 (2.9 waves) against 480 of 128x256 (3.6) or 648 of 128x192 (4.9).
TEST(Sm90TilePick, PlainTilesWhereTheyFillTheWaves) {
  const GemmTile fit{kTileM, kTileNFit}, tall{kTileMTall, kTileNTall};
  EXPECT_TRUE(same(gemm_pick_tile(2048, 7168, 2048, 132, true), fit));
  EXPECT_TRUE(same(gemm_pick_tile(2048, 7168, 8192, 132, true), fit));
  EXPECT_TRUE(same(gemm_pick_tile(8192, 1376, 4096, 132, true), fit));
  EXPECT_TRUE(same(gemm_pick_tile(3000, 5000, 7168, 132, true), tall));
  EXPECT_TRUE(same(gemm_pick_tile(3000, 5000, 1024, 132, true), tall));
}

// Never for the hooked launches, never below kPlainTileMinRows rows, and where neither kind fills
// the waves better the hooked pick stands.
TEST(Sm90TilePick, PlainTilesOnlyWhereAllowed) {
  for (auto [m, n, k] : {std::tuple{2048, 7168, 2048}, {3000, 5000, 7168}, {8192, 1376, 4096}}) {
    const GemmTile h = gemm_pick_tile(m, n, k, 132, false);
    EXPECT_FALSE(gemm_plain_only_tile(h.m, h.n)) << m << "x" << n << "x" << k;
    EXPECT_EQ(h.n, gemm_pick_tile_n(m, n, k, 132));
  }
  for (int64_t m : {64, 512, 1000}) {
    const GemmTile t = gemm_pick_tile(m, 7168, 2048, 132, true);
    EXPECT_FALSE(gemm_plain_only_tile(t.m, t.n)) << m;
  }
  for (auto [m, n, k] : {std::tuple{8192, 3584, 8192}, {16384, 1024, 8192}, {8192, 8192, 8192}}) {
    EXPECT_TRUE(same(gemm_pick_tile(m, n, k, 132, true), gemm_pick_tile(m, n, k, 132, false)))
        << m << "x" << n << "x" << k;
  }
}

// A plain tile never splits: where its own last wave is at most half full it is not considered
// (a negative cost), however few its waves.
TEST(Sm90TilePick, PlainTilesNeverTakeAHalfEmptyLastWave) {
  const GemmTile fit{kTileM, kTileNFit};
  // 2048x7168 on 120 blocks: 656 tiles = 5 waves + 56, at most half of 120 -> not considered
  EXPECT_LT(gemm_plain_tile_cost(2048, 7168, 2048, 120, fit, 1.0), 0);
  // on 132: 4 waves + 128 -> 5 whole waves of 176 columns
  EXPECT_DOUBLE_EQ(gemm_plain_tile_cost(2048, 7168, 2048, 132, fit, 1.0), 5.0 * kTileNFit);
  // the tall tile counts twice the rows
  EXPECT_DOUBLE_EQ(gemm_plain_tile_cost(3000, 5000, 2048, 132, {kTileMTall, kTileNTall}, 1.0),
                   3.0 * 2 * kTileNTall);
  // short K (fewer than kSplitMinKTiles k-blocks) never splits anyway: considered
  EXPECT_DOUBLE_EQ(gemm_plain_tile_cost(2048, 7168, 256, 120, fit, 1.0), 6.0 * kTileNFit);
}

// The grid of a plain tile, and which tiles are the plain engine's.
TEST(Sm90TilePick, PlainOnlyTiles) {
  EXPECT_TRUE(gemm_plain_only_tile(kTileMTall, kTileNTall));
  EXPECT_TRUE(gemm_plain_only_tile(kTileM, kTileNFit));
  for (int n : {kTileN, kTileNNarrow, kTileNLean, kTileNSlim}) {
    EXPECT_FALSE(gemm_plain_only_tile(kTileM, n)) << n;
    EXPECT_FALSE(gemm_plain_only_tile(0, n)) << n;
  }
  const TileGrid g = gemm_tile_grid(3000, 5000, kTileNTall, kTileMTall);
  EXPECT_EQ(g.tiles_m(), 12);
  EXPECT_EQ(g.tiles_n(), 32);
  EXPECT_EQ(g.tile_m, kTileMTall);
}

}  // namespace
}  // namespace tilelink::compute::sm90
