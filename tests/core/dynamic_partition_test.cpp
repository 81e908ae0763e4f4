// DynamicRowPartition, DynamicSegmentTiling and DynamicTileGrid: the mappings over run-time tables,
// checked against the static mappings where those exist (up to kMaxWorldSize parts, and TileGrid
// for each group) and against brute force for any number of parts, over many random routings.
#include "tilelink/core/dynamic_partition.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../support/random.hpp"
#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/segment_tiling.hpp"

namespace tilelink {
namespace {

// Views are copied into plans and kernel arguments as bytes.
static_assert(std::is_trivially_copyable_v<DynamicRowPartition>);
static_assert(std::is_trivially_copyable_v<DynamicSegmentTiling>);
static_assert(std::is_trivially_copyable_v<DynamicTileGrid>);

// Random per-part row counts: split at random cuts (empty parts likely), sparse and skewed (most
// parts empty, as in MoE routing), every row in one part, all parts empty, or even.
std::vector<int64_t> random_counts(test::Rng& rng, int parts, int64_t max_rows) {
  const int64_t rows = rng.uniform(0, max_rows);
  std::vector<int64_t> c(static_cast<size_t>(parts), 0);
  switch (rng.uniform_int(0, 9)) {
    case 0:
    case 1:
    case 2:
    case 3:
      return rng.uneven_counts(rows, parts);
    case 4:
    case 5:
      for (auto& x : c)
        if (rng.coin(0.2)) x = rng.uniform(1, max64(1, 2 * max_rows / parts));
      return c;
    case 6:
    case 7:
      c[static_cast<size_t>(rng.uniform_int(0, parts - 1))] = rows;
      return c;
    case 8:
      return c;
    default:
      for (int p = 0; p < parts; ++p) c[p] = rows / parts + (p < rows % parts ? 1 : 0);
      return c;
  }
}

// A routing's host tables, written through the checked host forms; the views point into them.
struct Tables {
  std::vector<int64_t> counts, offsets;
  std::vector<int> first;

  Tables(std::vector<int64_t> c, int chunk_rows)
      : counts(std::move(c)), offsets(counts.size() + 1), first(counts.size() + 1) {
    offsets_from_counts(counts, offsets);
    fill_first_tiles(rows(), chunk_rows, first);
  }
  int parts() const { return static_cast<int>(counts.size()); }
  DynamicRowPartition rows() const { return DynamicRowPartition::make(parts(), offsets.data()); }
  DynamicSegmentTiling tiling(int chunk_rows) const {
    return DynamicSegmentTiling::make(rows(), chunk_rows, first.data());
  }
};

// The owner of a row by brute force: the part whose non-empty [begin, end) holds it.
int brute_owner(const DynamicRowPartition& p, int64_t row) {
  for (int i = 0; i < p.num_parts; ++i)
    if (p.begin(i) <= row && row < p.end(i)) return i;
  return -1;
}

// A chunk size in 1..300, small ones more often (they make the most tiles).
int random_chunk(test::Rng& rng) {
  return rng.coin(0.5) ? rng.uniform_int(1, 16) : rng.uniform_int(1, 300);
}

template <class Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one saying \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---- static and dynamic agree ------------------------------------------------------------------

TEST(DynamicRowPartition, AgreesWithRowPartition) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 1000; ++iter) {
    const int parts = rng.uniform_int(1, kMaxWorldSize);
    Tables t(random_counts(rng, parts, 2000), 1);
    const RowPartition s = RowPartition::from_counts(t.counts);
    const DynamicRowPartition d = t.rows();
    SCOPED_TRACE(::testing::Message()
                 << "iter " << iter << " parts " << parts << " rows " << s.total());
    ASSERT_TRUE(d.validate());
    ASSERT_EQ(d.num_parts, s.world_size);
    ASSERT_EQ(d.total(), s.total());
    ASSERT_EQ(d.max_size(), s.max_size());
    for (int p = 0; p < parts; ++p) {
      ASSERT_EQ(d.begin(p), s.begin(p)) << "part " << p;
      ASSERT_EQ(d.end(p), s.end(p)) << "part " << p;
      ASSERT_EQ(d.size(p), s.size(p)) << "part " << p;
    }
    for (int64_t row = 0; row < s.total(); ++row) {
      ASSERT_EQ(d.owner_of_row(row), s.owner_of_row(row)) << "row " << row;
    }
  }
}

TEST(DynamicSegmentTiling, AgreesWithSegmentTiling) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 1000; ++iter) {
    const int parts = rng.uniform_int(1, kMaxWorldSize);
    const int chunk = random_chunk(rng);
    Tables t(random_counts(rng, parts, 2000), chunk);
    const SegmentTiling s = SegmentTiling::make(RowPartition::from_counts(t.counts), chunk);
    const DynamicSegmentTiling d = t.tiling(chunk);
    const int64_t rows = s.parts.total();
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " parts " << parts << " rows " << rows
                                      << " chunk " << chunk);
    ASSERT_EQ(d.num_parts(), s.world_size());
    ASSERT_EQ(d.num_tiles(), s.num_tiles());
    for (int p = 0; p <= parts; ++p) {
      ASSERT_EQ(d.first[p], s.first[p]) << "part " << p;
    }
    for (int p = 0; p < parts; ++p) {
      ASSERT_EQ(d.tiles_of(p), s.tiles_of(p)) << "part " << p;
      for (int c = 0; c < s.tiles_of(p); ++c) {
        ASSERT_EQ(d.tile_id(p, c), s.tile_id(p, c));
      }
    }
    for (int id = 0; id < s.num_tiles(); ++id) {
      ASSERT_EQ(d.part_of(id), s.rank_of(id)) << "tile " << id;
      const RowRange a = d.rows_of(id), b = s.rows_of(id);
      ASSERT_EQ(a.begin, b.begin) << "tile " << id;
      ASSERT_EQ(a.end, b.end) << "tile " << id;
    }
    for (int64_t row = 0; row < rows; ++row) {
      ASSERT_EQ(d.tile_of_row(row), s.tile_of_row(row)) << "row " << row;
    }
    for (int q = 0; q < 20; ++q) {
      int64_t lo = rng.uniform(0, rows), hi = rng.uniform(0, rows);
      if (lo > hi) std::swap(lo, hi);
      const IdRange a = d.covering({lo, hi}), b = s.covering({lo, hi});
      ASSERT_EQ(a.begin, b.begin) << "rows [" << lo << ", " << hi << ")";
      ASSERT_EQ(a.end, b.end) << "rows [" << lo << ", " << hi << ")";
    }
  }
}

// ---- properties for any number of parts --------------------------------------------------------

TEST(DynamicSegmentTiling, EveryRowInExactlyOneTileForManyParts) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 500; ++iter) {
    const int parts = rng.coin(0.1) ? rng.uniform_int(300, 2048) : rng.uniform_int(1, 300);
    const int chunk = random_chunk(rng);
    Tables t(random_counts(rng, parts, 5000), chunk);
    const DynamicRowPartition p = t.rows();
    const DynamicSegmentTiling d = t.tiling(chunk);
    const int64_t rows = p.total();
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " parts " << parts << " rows " << rows
                                      << " chunk " << chunk);
    ASSERT_LE(d.num_tiles(), DynamicSegmentTiling::max_num_tiles(rows, parts, chunk));
    std::vector<int> cover(static_cast<size_t>(rows), 0);
    int next_tile = 0;
    int64_t next_row = 0;
    for (int part = 0; part < parts; ++part) {
      // The part's tiles: the next contiguous ids, from its first row to its last, every one full
      // but the last.
      ASSERT_EQ(d.first[part], next_tile) << "part " << part;
      ASSERT_EQ(d.tiles_of(part), ceil_div(p.size(part), chunk)) << "part " << part;
      ASSERT_EQ(p.begin(part), next_row);
      for (int c = 0; c < d.tiles_of(part); ++c) {
        const int id = d.tile_id(part, c);
        ASSERT_EQ(id, next_tile++);
        ASSERT_EQ(d.part_of(id), part) << "tile " << id;
        const RowRange rr = d.rows_of(id);
        ASSERT_EQ(rr.begin, next_row) << "tile " << id;
        ASSERT_LE(rr.end, p.end(part)) << "tile " << id;
        ASSERT_EQ(rr.size(), c + 1 < d.tiles_of(part) ? chunk : p.end(part) - rr.begin)
            << "tile " << id;
        next_row = rr.end;
        for (int64_t row = rr.begin; row < rr.end; ++row) {
          ++cover[static_cast<size_t>(row)];
          ASSERT_EQ(d.tile_of_row(row), id) << "row " << row;
        }
      }
      ASSERT_EQ(next_row, p.end(part));
    }
    ASSERT_EQ(next_tile, d.num_tiles());
    for (int64_t row = 0; row < rows; ++row) {
      ASSERT_EQ(cover[static_cast<size_t>(row)], 1) << "row " << row;
    }
  }
}

TEST(DynamicSegmentTiling, CoveringIsExactlyTheIntersectingTiles) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    const int parts = rng.uniform_int(1, 300);
    const int chunk = random_chunk(rng);
    Tables t(random_counts(rng, parts, 3000), chunk);
    const DynamicSegmentTiling d = t.tiling(chunk);
    const int64_t rows = d.parts.total();
    for (int q = 0; q < 20; ++q) {
      int64_t lo = rng.uniform(0, rows), hi = rng.uniform(0, rows);
      if (lo > hi) std::swap(lo, hi);
      SCOPED_TRACE(::testing::Message()
                   << "iter " << iter << " parts " << parts << " chunk " << chunk << " rows [" << lo
                   << ", " << hi << ") of " << rows);
      std::set<int> want;
      for (int id = 0; id < d.num_tiles(); ++id) {
        const RowRange rr = d.rows_of(id);
        if (lo < hi && rr.begin < hi && lo < rr.end) want.insert(id);
      }
      const IdRange got = d.covering({lo, hi});
      if (want.empty()) {
        ASSERT_TRUE(got.empty());
        continue;
      }
      ASSERT_EQ(got.begin, *want.begin());
      ASSERT_EQ(got.end, *want.rbegin() + 1);
      ASSERT_EQ(got.size(), static_cast<int>(want.size())) << "the range must be contiguous";
    }
  }
}

TEST(DynamicRowPartition, OwnerOfRowSkipsEmptyParts) {
  // Empties first, in the middle, last and in runs; then random sparse tables of many parts.
  std::vector<std::vector<int64_t>> layouts = {
      {0, 5}, {5, 0}, {0, 0, 3}, {3, 0, 0}, {0, 3, 0}, {2, 0, 0, 2, 0, 1}, {0, 0, 0, 0, 0, 0, 1}};
  layouts.push_back(std::vector<int64_t>(300, 0));
  layouts.back()[299] = 7;
  layouts.push_back(std::vector<int64_t>(257, 0));
  layouts.back()[0] = 7;
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<int64_t> c(static_cast<size_t>(rng.uniform_int(1, 1000)), 0);
    for (auto& x : c)
      if (rng.coin(0.05)) x = rng.uniform(1, 20);
    layouts.push_back(std::move(c));
  }
  for (size_t i = 0; i < layouts.size(); ++i) {
    Tables t(layouts[i], 1);
    const DynamicRowPartition p = t.rows();
    SCOPED_TRACE(::testing::Message() << "layout " << i << " parts " << p.num_parts);
    for (int64_t row = 0; row < p.total(); ++row) {
      const int o = p.owner_of_row(row);
      ASSERT_EQ(o, brute_owner(p, row)) << "row " << row;
      ASSERT_GT(p.size(o), 0) << "row " << row;
    }
    const DynamicSegmentTiling d = t.tiling(1);
    for (int id = 0; id < d.num_tiles(); ++id) {
      ASSERT_GT(p.size(d.part_of(id)), 0) << "tile " << id;
    }
  }
}

// ---- tables: scan, validation, refusals --------------------------------------------------------

TEST(OffsetsFromCounts, IsAnExclusiveScanInBothForms) {
  TL_SEEDED_RNG(rng);
  constexpr int64_t kUntouched = -12345;
  for (int iter = 0; iter < 500; ++iter) {
    const int parts = rng.uniform_int(1, 1000);
    const std::vector<int64_t> counts = random_counts(rng, parts, 100000);
    std::vector<int64_t> host(counts.size() + 3, kUntouched), dev(counts.size() + 1, kUntouched);
    offsets_from_counts(counts, host);
    ASSERT_TRUE(offsets_from_counts(counts.data(), parts, dev.data()));
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " parts " << parts);
    ASSERT_EQ(host[0], 0);
    for (int p = 0; p < parts; ++p) {
      ASSERT_EQ(host[p + 1] - host[p], counts[p]) << "part " << p;
      ASSERT_EQ(dev[p + 1], host[p + 1]) << "part " << p;
    }
    ASSERT_EQ(host[parts + 1], kUntouched) << "entries past parts + 1 are left alone";
    ASSERT_EQ(host[parts + 2], kUntouched);
    ASSERT_TRUE((DynamicRowPartition{parts, host.data()}.validate()));
  }
}

TEST(DynamicRowPartition, ValidateRejectsBadTables) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 500; ++iter) {
    const int parts = rng.uniform_int(1, 300);
    Tables t(random_counts(rng, parts, 3000), 1);
    DynamicRowPartition p = t.rows();
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " parts " << parts);
    ASSERT_EQ(p.first_bad_offset(), -1);
    ASSERT_TRUE(p.validate());
    std::vector<int> first(static_cast<size_t>(parts) + 1);
    if (rng.coin(0.8)) {
      // One entry below the one before it: the first bad entry is that one.
      const int bad = rng.uniform_int(1, parts);
      t.offsets[bad] = t.offsets[bad - 1] - rng.uniform(1, 50);
      ASSERT_EQ(p.first_bad_offset(), bad);
      ASSERT_FALSE(p.validate());
      ASSERT_EQ(fill_first_tiles(p, 4, first.data()), -1);
      expect_error([&] { fill_first_tiles(p, 4, first); },
                   "offsets[" + std::to_string(bad) + "] = " + std::to_string(t.offsets[bad]));
    } else {
      // A table that does not start at row 0.
      t.offsets[0] = rng.coin() ? rng.uniform(1, 50) : -rng.uniform(1, 50);
      ASSERT_EQ(p.first_bad_offset(), 0);
      ASSERT_FALSE(p.validate());
      ASSERT_EQ(fill_first_tiles(p, 4, first.data()), -1);
      expect_error([&] { fill_first_tiles(p, 4, first); }, "offsets[0] must be 0");
    }
  }
  // No table at all.
  const int64_t zero = 0;
  EXPECT_FALSE((DynamicRowPartition{0, &zero}.validate()));
  EXPECT_FALSE((DynamicRowPartition{3, nullptr}.validate()));
  EXPECT_TRUE((DynamicRowPartition{1, std::vector<int64_t>{0, 0}.data()}.validate()));
}

TEST(DynamicRowPartition, RefusesBadInput) {
  const std::vector<int64_t> offsets{0, 2, 5};
  EXPECT_NO_THROW(DynamicRowPartition::make(2, offsets.data()));
  expect_error([&] { DynamicRowPartition::make(0, offsets.data()); }, "number of parts");
  expect_error([&] { DynamicRowPartition::make(-1, offsets.data()); }, "number of parts");
  expect_error([&] { DynamicRowPartition::make(2, nullptr); }, "no offsets table");

  std::vector<int64_t> out(4);
  expect_error(
      [&] {
        offsets_from_counts(std::vector<int64_t>{3, -1, 2}, out);
      },
      "part 1 has a negative row count -1");
  expect_error([&] { offsets_from_counts(std::vector<int64_t>{}, out); }, "no counts");
  std::vector<int64_t> small(3);
  expect_error(
      [&] {
        offsets_from_counts(std::vector<int64_t>{1, 2, 3}, small);
      },
      "3 counts need 4 offsets, got 3");
  // The device form reports the same refusals by its result.
  const std::vector<int64_t> negative{3, -1, 2};
  EXPECT_FALSE(offsets_from_counts(negative.data(), 3, out.data()));
  EXPECT_FALSE(offsets_from_counts(negative.data(), 0, out.data()));
}

TEST(DynamicSegmentTiling, RefusesBadInput) {
  Tables t({3, 0, 4}, 2);
  const DynamicRowPartition p = t.rows();
  EXPECT_NO_THROW(DynamicSegmentTiling::make(p, 2, t.first.data()));
  expect_error([&] { DynamicSegmentTiling::make(p, 0, t.first.data()); }, "chunk rows");
  expect_error([&] { DynamicSegmentTiling::make(p, -3, t.first.data()); }, "chunk rows");
  expect_error([&] { DynamicSegmentTiling::make(p, 2, nullptr); }, "no first-tile table");
  expect_error(
      [&] {
        DynamicSegmentTiling::make({0, t.offsets.data()}, 2, t.first.data());
      },
      "number of parts");

  std::vector<int> first(4), small(3);
  EXPECT_EQ(fill_first_tiles(p, 2, first), 4);
  expect_error([&] { fill_first_tiles(p, 0, first); }, "chunk rows must be >= 1, got 0");
  expect_error([&] { fill_first_tiles(p, 2, small); }, "needs 4 entries");
  EXPECT_EQ(fill_first_tiles(p, 0, first.data()), -1);

  // More tiles than an int names: refused, without overflowing on the way.
  for (const std::vector<int64_t>& counts :
       {std::vector<int64_t>{0x7fffffff, 1}, std::vector<int64_t>{int64_t{1} << 62, 5}}) {
    std::vector<int64_t> offsets(counts.size() + 1);
    offsets_from_counts(counts, offsets);
    const DynamicRowPartition big = DynamicRowPartition::make(2, offsets.data());
    std::vector<int> out(counts.size() + 1);
    EXPECT_EQ(fill_first_tiles(big, 1, out.data()), -1);
    expect_error([&] { fill_first_tiles(big, 1, out); }, "more tiles than an int");
  }
  // Just at the limit: accepted.
  Tables edge({0x7ffffffe, 1}, 1);
  EXPECT_EQ(edge.first[2], 0x7fffffff);
}

TEST(DynamicSegmentTiling, MaxNumTilesBoundsEveryTable) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 2000; ++iter) {
    const int parts = rng.uniform_int(1, 300);
    const int chunk = random_chunk(rng);
    Tables t(random_counts(rng, parts, 3000), chunk);
    const int64_t bound = DynamicSegmentTiling::max_num_tiles(t.rows().total(), parts, chunk);
    ASSERT_LE(t.tiling(chunk).num_tiles(), bound)
        << "iter " << iter << " parts " << parts << " chunk " << chunk;
  }
  // The bound is reached: every part one row past a multiple of the chunk.
  Tables t(std::vector<int64_t>(10, 5), 4);
  EXPECT_EQ(t.tiling(4).num_tiles(), DynamicSegmentTiling::max_num_tiles(50, 10, 4));
}

// ---- the grouped grid --------------------------------------------------------------------------

TEST(DynamicTileGrid, EachGroupIsItsTileGridAndIdsAreGroupMajor) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    const int groups = rng.uniform_int(1, 300);
    const int64_t n = rng.uniform(1, 150);
    const int tile_m = rng.uniform_int(1, 70), tile_n = rng.uniform_int(1, 70);
    Tables t(random_counts(rng, groups, 600), 1);
    std::vector<int> first(static_cast<size_t>(groups) + 1);
    DynamicTileGrid grid = DynamicTileGrid::make(t.rows(), n, tile_m, tile_n, first.data());
    const int tiles = fill_first_tiles(grid, first);
    const int64_t rows = grid.rows.total();
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " groups " << groups << " " << rows
                                      << "x" << n << " tiles " << tile_m << "x" << tile_n);
    ASSERT_EQ(grid.num_tiles(), tiles);
    ASSERT_LE(tiles, DynamicTileGrid::max_num_tiles(rows, groups, n, tile_m, tile_n));
    std::vector<int> device_first(first.size());
    ASSERT_EQ(fill_first_tiles(grid, device_first.data()), tiles);
    ASSERT_EQ(device_first, first);

    std::vector<int> cover(static_cast<size_t>(rows * n), 0);
    int next = 0;
    for (int g = 0; g < groups; ++g) {
      const TileGrid gg = grid.group_grid(g);
      ASSERT_EQ(grid.first[g], next) << "group " << g;
      ASSERT_EQ(grid.tiles_m(g), gg.tiles_m()) << "group " << g;
      ASSERT_EQ(grid.tiles_n(), gg.tiles_n());
      ASSERT_EQ(grid.tiles_of(g), gg.num_tiles()) << "group " << g;
      for (int i = 0; i < gg.num_tiles(); ++i, ++next) {
        const TileCoord local = gg.coord(i);  // row-major inside the group
        const GroupTileCoord c{g, local.m, local.n};
        ASSERT_EQ(grid.linear(c), next);
        ASSERT_EQ(grid.coord(next), c) << "tile " << next;
        ASSERT_EQ(grid.group_of(next), g) << "tile " << next;
        const Rect want = gg.region(local), got = grid.region(c);
        ASSERT_EQ(got.row, grid.rows.begin(g) + want.row) << "tile " << next;
        ASSERT_EQ(got.col, want.col) << "tile " << next;
        ASSERT_EQ(got.rows, want.rows) << "tile " << next;
        ASSERT_EQ(got.cols, want.cols) << "tile " << next;
        ASSERT_FALSE(got.empty()) << "tile " << next;
        ASSERT_LE(got.row + got.rows, grid.rows.end(g)) << "a tile holds one group's rows";
        for (int64_t r = got.row; r < got.row + got.rows; ++r)
          for (int64_t col = got.col; col < got.col + got.cols; ++col)
            ++cover[static_cast<size_t>(r * n + col)];
      }
    }
    ASSERT_EQ(next, grid.num_tiles());
    for (size_t e = 0; e < cover.size(); ++e) {
      ASSERT_EQ(cover[e], 1) << "element (" << e / n << ", " << e % n << ")";
    }
  }
}

TEST(DynamicTileGrid, RefusesBadInput) {
  Tables t({3, 0, 4}, 1);
  std::vector<int> first(4), small(3);
  const DynamicRowPartition p = t.rows();
  EXPECT_NO_THROW(DynamicTileGrid::make(p, 8, 2, 4, first.data()));
  expect_error([&] { DynamicTileGrid::make(p, 0, 2, 4, first.data()); }, "N must be >= 1");
  expect_error([&] { DynamicTileGrid::make(p, 8, 0, 4, first.data()); }, "tile sizes");
  expect_error([&] { DynamicTileGrid::make(p, 8, 2, -1, first.data()); }, "tile sizes");
  expect_error([&] { DynamicTileGrid::make(p, int64_t{1} << 40, 2, 1, first.data()); },
               "column tiles");
  expect_error([&] { DynamicTileGrid::make(p, 8, 2, 4, nullptr); }, "no first-tile table");
  expect_error(
      [&] {
        DynamicTileGrid::make({3, nullptr}, 8, 2, 4, first.data());
      },
      "no offsets table");

  const DynamicTileGrid grid = DynamicTileGrid::make(p, 8, 2, 4, first.data());
  EXPECT_EQ(fill_first_tiles(grid, first), 8);  // (2 + 0 + 2) tile rows x 2 column tiles
  expect_error([&] { fill_first_tiles(grid, small); }, "needs 4 entries");
  // Tiles beyond an int: refused.
  const DynamicTileGrid wide = DynamicTileGrid::make(p, int64_t{1} << 30, 1, 1, first.data());
  EXPECT_EQ(fill_first_tiles(wide, first.data()), -1);
  expect_error([&] { fill_first_tiles(wide, first); }, "more tiles than an int");
}

// ---- the contract: a view built before its tables, read after the writer's release --------------

// Waits (bounded) until `flag` holds at least `target`, with acquire: the writes released before it
// are then visible.
bool wait_at_least(const std::atomic<int>& flag, int target) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (flag.load(std::memory_order_acquire) < target) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(DynamicSegmentTiling, ReadsTablesTheWriterReleasedAfterTheViewWasBuilt) {
  TL_SEEDED_RNG(rng);
  constexpr int kParts = 256, kChunk = 64, kRounds = 50;
  // Every round's routing, known to the test up front; the writer publishes them one at a time.
  std::vector<std::vector<int64_t>> routing;
  for (int r = 0; r < kRounds; ++r) routing.push_back(random_counts(rng, kParts, 20000));

  // The tables as a device would hold them: plain memory, ordered by the flags only. The counts are
  // the writer's own; readers read the offsets and first tiles.
  std::vector<int64_t> counts(kParts), offsets(kParts + 1, -1);
  std::vector<int> first(kParts + 1, -1);
  const DynamicSegmentTiling view = DynamicSegmentTiling::make(
      DynamicRowPartition::make(kParts, offsets.data()), kChunk, first.data());
  std::atomic<int> published{0}, consumed{0};
  std::atomic<bool> writer_ok{true};

  // The writer (a routing kernel): for each round, once the last reader is done, counts ->
  // offsets -> first tiles through the device forms, then a release.
  std::thread writer([&] {
    for (int r = 1; r <= kRounds; ++r) {
      if (!wait_at_least(consumed, r - 1)) {
        writer_ok.store(false);
        return;
      }
      counts = routing[r - 1];
      if (!offsets_from_counts(counts.data(), kParts, offsets.data()) ||
          fill_first_tiles(view.parts, kChunk, first.data()) < 0) {
        writer_ok.store(false);
        return;
      }
      published.store(r, std::memory_order_release);
    }
  });
  // A failed check returns early: release the writer for good and join it on the way out.
  struct JoinWriter {
    std::thread& t;
    std::atomic<int>& consumed;
    ~JoinWriter() {
      consumed.store(kRounds, std::memory_order_release);
      t.join();
    }
  } join_writer{writer, consumed};
  for (int r = 1; r <= kRounds; ++r) {
    ASSERT_TRUE(wait_at_least(published, r)) << "round " << r << ": the writer never released";
    // The reader (a later kernel): the view it was given at the start sees this round's tables.
    const SegmentTiling want =
        SegmentTiling::make(RowPartition::from_counts(std::vector<int64_t>(
                                routing[r - 1].begin(), routing[r - 1].begin() + kMaxWorldSize)),
                            kChunk);
    std::vector<int64_t> want_offsets(kParts + 1, 0);
    std::partial_sum(routing[r - 1].begin(), routing[r - 1].end(), want_offsets.begin() + 1);
    SCOPED_TRACE(::testing::Message() << "round " << r << " rows " << want_offsets[kParts]);
    ASSERT_TRUE(view.parts.validate());
    ASSERT_EQ(view.parts.total(), want_offsets[kParts]);
    int tiles = 0;
    for (int p = 0; p < kParts; ++p) {
      ASSERT_EQ(view.parts.begin(p), want_offsets[p]) << "part " << p;
      ASSERT_EQ(view.first[p], tiles) << "part " << p;
      tiles += static_cast<int>(ceil_div(routing[r - 1][p], kChunk));
    }
    ASSERT_EQ(view.num_tiles(), tiles);
    // The first kMaxWorldSize parts also agree with the static tiling of those parts.
    for (int id = 0; id < want.num_tiles(); ++id) {
      ASSERT_EQ(view.rows_of(id).begin, want.rows_of(id).begin) << "tile " << id;
      ASSERT_EQ(view.rows_of(id).end, want.rows_of(id).end) << "tile " << id;
    }
    consumed.store(r, std::memory_order_release);
  }
  EXPECT_TRUE(writer_ok.load());
}

}  // namespace
}  // namespace tilelink
