// RowPartition and SegmentTiling: the rank mapping and the communication-tile mapping of a ragged,
// row-split tensor, checked against brute force over many random shapes.
#include "tilelink/core/partition.hpp"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "../support/random.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/core/segment_tiling.hpp"

namespace tilelink {
namespace {

// Random partition of a random shape: even, uneven with empties, or all rows on one rank.
RowPartition random_partition(test::Rng& rng, int world, int64_t rows) {
  switch (rng.uniform_int(0, 2)) {
    case 0:
      return RowPartition::even(rows, world);
    case 1: {
      auto c = rng.uneven_counts(rows, world);
      return RowPartition::from_counts(c);
    }
    default: {
      std::vector<int64_t> c(world, 0);
      c[rng.uniform_int(0, world - 1)] = rows;
      return RowPartition::from_counts(c);
    }
  }
}

// The owner of a row by brute force: the rank whose non-empty [begin, end) holds it.
int brute_owner(const RowPartition& p, int64_t row) {
  for (int r = 0; r < p.world_size; ++r)
    if (p.begin(r) <= row && row < p.end(r)) return r;
  return -1;
}

TEST(RowPartition, EvenSplitsRemainderOverTheFirstRanks) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 500; ++iter) {
    int world = rng.uniform_int(1, 8);
    int64_t rows = rng.uniform(0, 300);
    RowPartition p = RowPartition::even(rows, world);
    ASSERT_EQ(p.world_size, world);
    ASSERT_EQ(p.total(), rows);
    ASSERT_EQ(p.begin(0), 0);
    int64_t lo = rows / world;
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(p.end(r), r + 1 < world ? p.begin(r + 1) : rows);
      ASSERT_EQ(p.size(r), lo + (r < rows % world ? 1 : 0))
          << "rows " << rows << " world " << world;
    }
    ASSERT_EQ(p.max_size(), rows == 0 ? 0 : lo + (rows % world ? 1 : 0));
  }
}

TEST(RowPartition, FromCountsAndOwnerOfRowAgreeWithBruteForce) {
  TL_SEEDED_RNG(rng);
  int empty_seen = 0;
  for (int iter = 0; iter < 1000; ++iter) {
    int world = rng.uniform_int(1, 8);
    int64_t rows = rng.uniform(0, 300);
    std::vector<int64_t> counts = rng.uneven_counts(rows, world);
    RowPartition p = RowPartition::from_counts(counts);
    ASSERT_EQ(p.world_size, world);
    ASSERT_EQ(p.total(), rows);
    int64_t max = 0, at = 0;
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(p.begin(r), at);
      ASSERT_EQ(p.size(r), counts[r]);
      at += counts[r];
      ASSERT_EQ(p.end(r), at);
      max = std::max(max, counts[r]);
      empty_seen += counts[r] == 0;
    }
    ASSERT_EQ(p.max_size(), max);
    for (int64_t row = 0; row < rows; ++row) {
      int o = p.owner_of_row(row);
      ASSERT_EQ(o, brute_owner(p, row)) << "row " << row << " world " << world;
      ASSERT_GT(p.size(o), 0);
    }
  }
  EXPECT_GT(empty_seen, 100) << "the generator must produce empty segments";
}

TEST(RowPartition, OwnerOfRowSkipsEmptySegmentsAtEveryPosition) {
  // Fixed layouts with empties first, in the middle, last, and consecutive.
  std::vector<std::vector<int64_t>> layouts = {{0, 5},
                                               {5, 0},
                                               {0, 0, 3},
                                               {3, 0, 0},
                                               {0, 3, 0},
                                               {2, 0, 0, 2, 0, 1},
                                               {0, 0, 0, 0, 0, 0, 0, 1},
                                               {1, 0, 0, 0, 0, 0, 0, 0}};
  for (const auto& c : layouts) {
    RowPartition p = RowPartition::from_counts(c);
    for (int64_t row = 0; row < p.total(); ++row) {
      EXPECT_EQ(p.owner_of_row(row), brute_owner(p, row));
    }
  }
}

TEST(RowPartition, RefusesBadInput) {
  EXPECT_THROW(RowPartition::even(10, 0), Error);
  EXPECT_THROW(RowPartition::even(10, -1), Error);
  EXPECT_THROW(RowPartition::even(10, kMaxWorldSize + 1), Error);
  EXPECT_THROW(RowPartition::even(-1, 2), Error);
  EXPECT_NO_THROW(RowPartition::even(0, 2));
  std::vector<int64_t> none;
  EXPECT_THROW(RowPartition::from_counts(none), Error);
  std::vector<int64_t> neg{3, -1, 2};
  try {
    RowPartition::from_counts(neg);
    FAIL() << "a negative count was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("negative"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  std::vector<int64_t> too_many(kMaxWorldSize + 1, 1);
  EXPECT_THROW(RowPartition::from_counts(too_many), Error);
}

TEST(SegmentTiling, EveryRowInExactlyOneTileAndMappingsAgree) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 1000; ++iter) {
    int world = rng.uniform_int(1, 8);
    int64_t rows = rng.uniform(0, 300);
    RowPartition p = random_partition(rng, world, rows);
    int chunk = rng.coin(0.2) ? rng.uniform_int(200, 400) : rng.uniform_int(1, 40);
    SegmentTiling t = SegmentTiling::make(p, chunk);
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " world " << world << " rows " << rows
                                      << " chunk " << chunk);
    ASSERT_EQ(t.world_size(), world);
    // Tiles per rank, and ids rank-major.
    int expected_total = 0;
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(t.tiles_of(r), (p.size(r) + chunk - 1) / chunk);
      ASSERT_EQ(t.tile_id(r, 0), expected_total);
      expected_total += t.tiles_of(r);
    }
    ASSERT_EQ(t.num_tiles(), expected_total);
    // Each row covered by exactly one tile; tiles are non-empty, within one rank's segment, <=
    // chunk.
    std::vector<int> cover(static_cast<size_t>(rows), 0);
    int64_t prev_end = 0;
    for (int id = 0; id < t.num_tiles(); ++id) {
      int r = t.rank_of(id);
      ASSERT_GE(r, 0);
      ASSERT_LT(r, world);
      ASSERT_GE(id, t.first[r]);
      ASSERT_LT(id, t.first[r + 1]);
      RowRange rr = t.rows_of(id);
      ASSERT_GT(rr.size(), 0) << "tile " << id;
      ASSERT_LE(rr.size(), chunk);
      ASSERT_GE(rr.begin, p.begin(r));
      ASSERT_LE(rr.end, p.end(r));
      ASSERT_EQ(rr.begin, prev_end) << "ids must increase with rows";
      prev_end = rr.end;
      for (int64_t row = rr.begin; row < rr.end; ++row) {
        ++cover[row];
        ASSERT_EQ(t.tile_of_row(row), id);
      }
      // Only the last tile of a segment is clipped.
      if (id + 1 < t.first[r + 1]) {
        ASSERT_EQ(rr.size(), chunk);
      }
    }
    ASSERT_EQ(prev_end, rows);
    for (int64_t row = 0; row < rows; ++row) {
      ASSERT_EQ(cover[row], 1) << "row " << row;
    }
  }
}

TEST(SegmentTiling, CoveringIsExactlyTheIntersectingTiles) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 1000; ++iter) {
    int world = rng.uniform_int(1, 8);
    int64_t rows = rng.uniform(1, 300);
    RowPartition p = random_partition(rng, world, rows);
    SegmentTiling t = SegmentTiling::make(p, rng.uniform_int(1, 64));
    for (int q = 0; q < 20; ++q) {
      int64_t b = rng.uniform(0, rows), e = rng.uniform(0, rows);
      if (b > e) std::swap(b, e);
      IdRange got = t.covering(RowRange{b, e});
      std::set<int> want;
      for (int id = 0; id < t.num_tiles(); ++id) {
        RowRange rr = t.rows_of(id);
        if (b < e && rr.begin < e && b < rr.end) want.insert(id);
      }
      SCOPED_TRACE(::testing::Message() << "rows [" << b << ", " << e << ") of " << rows);
      if (want.empty()) {
        ASSERT_TRUE(got.empty());
        continue;
      }
      ASSERT_EQ(got.begin, *want.begin());
      ASSERT_EQ(got.end, *want.rbegin() + 1);
      ASSERT_EQ(got.size(), static_cast<int>(want.size()))
          << "the covering range must be contiguous";
    }
  }
}

TEST(SegmentTiling, RefusesBadChunk) {
  RowPartition p = RowPartition::even(10, 2);
  EXPECT_THROW(SegmentTiling::make(p, 0), Error);
  EXPECT_THROW(SegmentTiling::make(p, -3), Error);
}

}  // namespace
}  // namespace tilelink
