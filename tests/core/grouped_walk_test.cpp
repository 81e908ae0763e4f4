// The grouped GEMM's walk (core/grouped_walk.hpp), as the engine's scheduler takes it: every tile
// exactly once, group by group or in a tile-row order table's order, over random ragged groups.
#include "tilelink/core/grouped_walk.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "../support/random.hpp"

namespace tilelink {
namespace {

// Random groups' tile-row counts (empty groups likely, one group holding most rows sometimes); the
// first-tile-row table.
std::vector<int> random_first(test::Rng& rng, int groups) {
  std::vector<int> first(groups + 1, 0);
  const bool skewed = rng.coin(0.3);
  for (int g = 0; g < groups; ++g) {
    const int rows = rng.coin(0.3) ? 0 : (skewed && g == 0 ? rng.uniform_int(10, 60) : rng.uniform_int(1, 12));
    first[g + 1] = first[g] + rows;
  }
  return first;
}

// A random walk's shape: groups, columns, band height and the first-tile-row table.
struct WalkShape {
  int groups, tiles_n, band;
  std::vector<int> first;
  int rows() const { return first[groups]; }
  static WalkShape draw(test::Rng& rng) {
    WalkShape w;
    w.groups = rng.uniform_int(1, 40), w.tiles_n = rng.uniform_int(1, 9), w.band = rng.pick(std::vector<int>{1, 3, 8});
    w.first = random_first(rng, w.groups);
    return w;
  }
};

TEST(GroupedWalk, GroupByGroupVisitsEveryTileOnceInItsGroupsIdRange) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 300; ++trial) {
    const WalkShape ws = WalkShape::draw(rng);
    const int groups = ws.groups, tiles_n = ws.tiles_n, band = ws.band, rows = ws.rows();
    const std::vector<int>& first = ws.first;
    std::vector<int> seen(static_cast<size_t>(rows) * tiles_n, 0);
    for (int id = 0; id < rows * tiles_n; ++id) {
      const GroupedWalkTile t = grouped_walk_tile(first.data(), groups, tiles_n, band, nullptr, id);
      ASSERT_GE(t.group, 0);
      ASSERT_LT(t.group, groups);
      ASSERT_GT(first[t.group + 1], first[t.group]) << "an empty group got a tile";
      ASSERT_GE(t.m, 0);
      ASSERT_LT(t.m, first[t.group + 1] - first[t.group]);
      ASSERT_GE(t.n, 0);
      ASSERT_LT(t.n, tiles_n);
      // ids group by group: the group's tiles take its id range
      ASSERT_GE(id, first[t.group] * tiles_n);
      ASSERT_LT(id, first[t.group + 1] * tiles_n);
      ++seen[static_cast<size_t>(first[t.group] + t.m) * tiles_n + t.n];
    }
    for (int v : seen) ASSERT_EQ(v, 1);
  }
}

TEST(GroupedWalk, BandsGoColumnAfterColumnInsideAGroup) {
  // one group of 10 tile rows, 3 columns, bands of 4: rows 0-3 by column, then 4-7, then 8-9
  const std::vector<int> first{0, 10};
  std::vector<std::pair<int, int>> walk;
  for (int id = 0; id < 30; ++id) {
    const GroupedWalkTile t = grouped_walk_tile(first.data(), 1, 3, 4, nullptr, id);
    walk.emplace_back(t.m, t.n);
  }
  const std::vector<std::pair<int, int>> want{
      {0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 1}, {0, 2}, {1, 2}, {2, 2}, {3, 2},
      {4, 0}, {5, 0}, {6, 0}, {7, 0}, {4, 1}, {5, 1}, {6, 1}, {7, 1}, {4, 2}, {5, 2}, {6, 2}, {7, 2},
      {8, 0}, {9, 0}, {8, 1}, {9, 1}, {8, 2}, {9, 2}};
  EXPECT_EQ(walk, want);
}

TEST(GroupedWalk, AnOrderTableVisitsEveryTileOnceBandByBandInItsOrder) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 300; ++trial) {
    const WalkShape ws = WalkShape::draw(rng);
    const int groups = ws.groups, tiles_n = ws.tiles_n, band = ws.band, rows = ws.rows();
    const std::vector<int>& first = ws.first;
    std::vector<int> order(rows);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng.gen());
    std::vector<int> seen(static_cast<size_t>(rows) * tiles_n, 0);
    for (int id = 0; id < rows * tiles_n; ++id) {
      const GroupedWalkTile t = grouped_walk_tile(first.data(), groups, tiles_n, band, order.data(), id);
      ASSERT_GT(first[t.group + 1], first[t.group]);
      ASSERT_GE(t.m, 0);
      ASSERT_LT(t.m, first[t.group + 1] - first[t.group]);
      ASSERT_LT(t.n, tiles_n);
      const int row = first[t.group] + t.m;
      ++seen[static_cast<size_t>(row) * tiles_n + t.n];
      // the band of this id holds the tile rows order[b * band, (b + 1) * band)
      const int b = id / (band * tiles_n);
      const int pos = static_cast<int>(std::find(order.begin(), order.end(), row) - order.begin());
      ASSERT_EQ(pos / band, b) << "id " << id << " visits tile row " << row << " outside its band";
    }
    for (int v : seen) ASSERT_EQ(v, 1);
  }
}

TEST(GroupedWalk, TheIdentityOrderWalksBandsAcrossGroups) {
  // groups of 3 and 2 tile rows, 2 columns, bands of 4: with the identity order the first band
  // holds rows 0-3 (three of group 0, one of group 1); without a table bands stay in their group
  const std::vector<int> first{0, 3, 5};
  const std::vector<int> identity{0, 1, 2, 3, 4};
  const GroupedWalkTile a = grouped_walk_tile(first.data(), 2, 2, 4, identity.data(), 3);
  EXPECT_EQ(a.group, 1);
  EXPECT_EQ(a.m, 0);
  EXPECT_EQ(a.n, 0);
  const GroupedWalkTile b = grouped_walk_tile(first.data(), 2, 2, 4, nullptr, 3);
  EXPECT_EQ(b.group, 0);
  EXPECT_EQ(b.m, 0);
  EXPECT_EQ(b.n, 1);
}

}  // namespace
}  // namespace tilelink
