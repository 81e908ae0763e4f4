// TileGrid (shape mapping), TileOrder (bijection, local-first start) and LayoutBuilder.
#include <gtest/gtest.h>

#include <vector>

#include "../support/random.hpp"
#include "tilelink/core/order.hpp"
#include "tilelink/core/tile.hpp"
#include "tilelink/core/workspace.hpp"

namespace tilelink {
namespace {

TEST(TileGrid, RegionsTileTheTensorExactly) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    TileGrid g{rng.uniform(1, 200), rng.uniform(1, 200), rng.uniform_int(1, 70),
               rng.uniform_int(1, 70)};
    SCOPED_TRACE(::testing::Message()
                 << g.extent_m << "x" << g.extent_n << " tiles " << g.tile_m << "x" << g.tile_n);
    ASSERT_EQ(g.tiles_m(), (g.extent_m + g.tile_m - 1) / g.tile_m);
    ASSERT_EQ(g.tiles_n(), (g.extent_n + g.tile_n - 1) / g.tile_n);
    std::vector<int> cover(static_cast<size_t>(g.extent_m * g.extent_n), 0);
    for (int id = 0; id < g.num_tiles(); ++id) {
      TileCoord c = g.coord(id);
      ASSERT_EQ(g.linear(c), id);
      Rect r = g.region(c);
      ASSERT_FALSE(r.empty());
      ASSERT_LE(r.rows, g.tile_m);
      ASSERT_LE(r.cols, g.tile_n);
      for (int64_t i = r.row; i < r.row + r.rows; ++i)
        for (int64_t j = r.col; j < r.col + r.cols; ++j) ++cover[i * g.extent_n + j];
    }
    for (int v : cover) {
      ASSERT_EQ(v, 1);
    }
  }
}

TEST(TileGrid, CoveringIsExactlyTheIntersectingTiles) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    TileGrid g{rng.uniform(1, 150), rng.uniform(1, 150), rng.uniform_int(1, 40),
               rng.uniform_int(1, 40)};
    for (int q = 0; q < 10; ++q) {
      Rect r;
      r.row = rng.uniform(0, g.extent_m - 1);
      r.col = rng.uniform(0, g.extent_n - 1);
      r.rows = rng.uniform(0, g.extent_m - r.row);
      r.cols = rng.uniform(0, g.extent_n - r.col);
      TileSpan s = g.covering(r);
      int want = 0;
      for (int id = 0; id < g.num_tiles(); ++id) {
        TileCoord c = g.coord(id);
        Rect t = g.region(c);
        bool hit = !r.empty() && t.row < r.row + r.rows && r.row < t.row + t.rows &&
                   t.col < r.col + r.cols && r.col < t.col + t.cols;
        bool in = c.m >= s.m_begin && c.m < s.m_end && c.n >= s.n_begin && c.n < s.n_end;
        ASSERT_EQ(hit, in) << "tile (" << c.m << ", " << c.n << ") rect " << r.row << "+" << r.rows
                           << ", " << r.col << "+" << r.cols;
        want += hit;
      }
      ASSERT_EQ(r.empty() ? 0 : s.count(), want);
    }
  }
}

// Every tile of the grid visited exactly once.
void expect_bijection(const TileOrder& o) {
  std::vector<int> seen(static_cast<size_t>(o.count()), 0);
  for (int i = 0; i < o.count(); ++i) {
    const TileCoord c = o.at(i);
    ASSERT_GE(c.m, 0);
    ASSERT_LT(c.m, o.tiles_m);
    ASSERT_GE(c.n, 0);
    ASSERT_LT(c.n, o.tiles_n);
    ++seen[c.m * o.tiles_n + c.n];
  }
  for (int v : seen) {
    ASSERT_EQ(v, 1);
  }
}

TEST(TileOrder, IsABijectionStartingAtStartM) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 2000; ++iter) {
    TileOrder o;
    o.tiles_m = rng.uniform_int(1, 40);
    o.tiles_n = rng.uniform_int(1, 12);
    o.start_m = rng.uniform_int(0, o.tiles_m - 1);
    o.group_m = rng.coin(0.2) ? rng.uniform_int(o.tiles_m, o.tiles_m + 10) : rng.uniform_int(1, 8);
    SCOPED_TRACE(::testing::Message() << "tiles " << o.tiles_m << "x" << o.tiles_n << " start "
                                      << o.start_m << " group " << o.group_m);
    ASSERT_EQ(o.count(), o.tiles_m * o.tiles_n);
    ASSERT_NO_FATAL_FAILURE(expect_bijection(o));
    ASSERT_EQ(o.at(0).m, o.start_m);
    ASSERT_EQ(o.at(0).n, 0);
    if (o.group_m == 1)  // plain row-major from start_m: the first tiles_n tiles are row start_m
      for (int j = 0; j < o.tiles_n; ++j) {
        ASSERT_EQ(o.at(j), (TileCoord{o.start_m, j}));
      }
  }
}

TEST(TileOrder, BandsAreABijectionVisitingTheBandsInTurn) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 2000; ++iter) {
    TileOrder o;
    o.tiles_m = rng.uniform_int(1, 40);
    o.tiles_n = rng.uniform_int(1, 12);
    o.bands = rng.uniform_int(1, 9);
    o.start_m = rng.coin(0.3) ? rng.uniform_int(0, o.tiles_m - 1) : 0;
    o.group_m = rng.uniform_int(1, 10);
    SCOPED_TRACE(::testing::Message()
                 << "tiles " << o.tiles_m << "x" << o.tiles_n << " bands " << o.bands << " start "
                 << o.start_m << " group " << o.group_m);
    // band_row is a bijection of the rows, and row i of band s comes before row i + 1 of any band.
    std::vector<int> row_seen(static_cast<size_t>(o.tiles_m), 0);
    const int q = o.tiles_m / o.bands, rem = o.tiles_m % o.bands;
    std::vector<int> band_of(static_cast<size_t>(o.tiles_m)),
        index_in_band(static_cast<size_t>(o.tiles_m));
    for (int s = 0, row = 0; s < o.bands; ++s)
      for (int i = 0; i < q + (s < rem ? 1 : 0); ++i, ++row)
        band_of[row] = s, index_in_band[row] = i;
    int last_index = 0;
    for (int v = 0; v < o.tiles_m; ++v) {
      const int row = o.band_row(v);
      ASSERT_GE(row, 0);
      ASSERT_LT(row, o.tiles_m);
      ++row_seen[row];
      ASSERT_GE(index_in_band[row], last_index) << "walk row " << v;
      last_index = index_in_band[row];
      if (v < q * o.bands) {
        ASSERT_EQ(band_of[row], v % o.bands) << "walk row " << v;
      }
    }
    for (int n : row_seen) {
      ASSERT_EQ(n, 1);
    }
    // The whole order is still a bijection of the grid, starting at the walk's row start_m.
    ASSERT_NO_FATAL_FAILURE(expect_bijection(o));
    ASSERT_EQ(o.at(0), (TileCoord{o.band_row(o.start_m), 0}));
  }
  // 8 rows in 3 bands (3, 3, 2 rows): rows 0, 3, 6, 1, 4, 7, 2, 5.
  const TileOrder o{8, 1, 0, 1, 3};
  const int want[] = {0, 3, 6, 1, 4, 7, 2, 5};
  for (int v = 0; v < 8; ++v) EXPECT_EQ(o.at(v).m, want[v]) << v;
}

TEST(TileOrder, FirstTileRowOfSegmentStartsInsideTheSegment) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 1000; ++iter) {
    int world = rng.uniform_int(1, 8);
    int64_t rows = rng.uniform(1, 300);
    auto counts = rng.uneven_counts(rows, world);
    RowPartition p = RowPartition::from_counts(counts);
    int tile_m = rng.uniform_int(1, 64);
    int tiles_m = static_cast<int>((rows + tile_m - 1) / tile_m);
    for (int r = 0; r < world; ++r) {
      int m = first_tile_row_of_segment(p, r, tile_m);
      ASSERT_GE(m, 0);
      ASSERT_LT(m, tiles_m);
      // If some tile row starts inside the segment, the chosen one is the first such.
      int64_t want = -1;
      for (int t = 0; t < tiles_m; ++t)
        if (static_cast<int64_t>(t) * tile_m >= p.begin(r) &&
            static_cast<int64_t>(t) * tile_m < p.end(r)) {
          want = t;
          break;
        }
      if (want >= 0) {
        ASSERT_EQ(m, want) << "rank " << r << " tile_m " << tile_m;
      }
    }
  }
  EXPECT_EQ(peer_at(2, 0, 5), 2);
  EXPECT_EQ(peer_at(2, 3, 5), 0);
  EXPECT_EQ(peer_at(4, 4, 5), 3);
}

TEST(LayoutBuilder, FieldsAreAlignedAndDisjoint) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 200; ++iter) {
    LayoutBuilder b;
    struct Span {
      uint64_t begin, end;
    };
    std::vector<Span> spans;
    for (int f = 0; f < 6; ++f) {
      int64_t count = rng.uniform(0, 1000);
      uint64_t align = uint64_t{1} << rng.uniform_int(3, 9);
      if (rng.coin()) {
        Field<Signal> s = b.add<Signal>(count, align);
        ASSERT_EQ(s.offset % align, 0u);
        ASSERT_EQ(s.num_bytes(), static_cast<uint64_t>(count) * 8);
        spans.push_back({s.offset, s.offset + s.num_bytes()});
      } else {
        ByteField s = b.add<std::byte>(count, align);
        ASSERT_EQ(s.offset % align, 0u);
        spans.push_back({s.offset, s.offset + s.num_bytes()});
      }
    }
    ASSERT_EQ(b.num_bytes() % 256, 0u);
    for (size_t i = 0; i < spans.size(); ++i) {
      ASSERT_LE(spans[i].end, b.num_bytes());
      if (i) {
        ASSERT_GE(spans[i].begin, spans[i - 1].end);
      }
    }
  }
  // Field::in reaches the same bytes on any base.
  alignas(256) std::byte buf[1024];
  LayoutBuilder b;
  b.add<std::byte>(3);
  Field<Signal> s = b.add<Signal>(4);
  EXPECT_EQ(reinterpret_cast<std::byte*>(s.in(static_cast<void*>(buf))), buf + 256);
}

}  // namespace
}  // namespace tilelink
