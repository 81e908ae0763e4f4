// Tile grids: the shape mapping from a tile coordinate to the tensor region it covers.
#pragma once

#include "tilelink/core/config.hpp"

namespace tilelink {

struct TileCoord {
  int m = 0;
  int n = 0;
  TL_HD friend bool operator==(TileCoord a, TileCoord b) { return a.m == b.m && a.n == b.n; }
};

// A half-open rectangle of a 2-D tensor: rows [row, row + rows), cols [col, col + cols).
struct Rect {
  int64_t row = 0, col = 0, rows = 0, cols = 0;
  TL_HD bool empty() const { return rows <= 0 || cols <= 0; }
};

// Inclusive-exclusive range of tile indices along both axes.
struct TileSpan {
  int m_begin = 0, m_end = 0, n_begin = 0, n_end = 0;
  TL_HD int count() const { return (m_end - m_begin) * (n_end - n_begin); }
};

// A 2-D grid of tiles of (tile_m x tile_n) over an (extent_m x extent_n) tensor. Edge tiles are
// clipped: extents need not divide by the tile size.
struct TileGrid {
  int64_t extent_m = 0, extent_n = 0;
  int tile_m = 1, tile_n = 1;

  TL_HD int tiles_m() const { return static_cast<int>(ceil_div(extent_m, tile_m)); }
  TL_HD int tiles_n() const { return static_cast<int>(ceil_div(extent_n, tile_n)); }
  TL_HD int num_tiles() const { return tiles_m() * tiles_n(); }

  // Row-major linear tile id <-> coordinate.
  TL_HD int linear(TileCoord c) const { return c.m * tiles_n() + c.n; }
  TL_HD TileCoord coord(int id) const { return {id / tiles_n(), id % tiles_n()}; }

  // Shape mapping: the (clipped) region a tile covers.
  TL_HD Rect region(TileCoord c) const {
    Rect r;
    r.row = static_cast<int64_t>(c.m) * tile_m;
    r.col = static_cast<int64_t>(c.n) * tile_n;
    r.rows = min64(tile_m, extent_m - r.row);
    r.cols = min64(tile_n, extent_n - r.col);
    return r;
  }

  // The tiles that intersect a region (empty span for an empty region).
  TL_HD TileSpan covering(Rect r) const {
    if (r.empty()) return {};
    return {static_cast<int>(r.row / tile_m), static_cast<int>(ceil_div(r.row + r.rows, tile_m)),
            static_cast<int>(r.col / tile_n), static_cast<int>(ceil_div(r.col + r.cols, tile_n))};
  }
};

}  // namespace tilelink
