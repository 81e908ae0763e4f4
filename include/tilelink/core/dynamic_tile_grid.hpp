// DynamicTileGrid: the shape mapping of a grouped problem whose group sizes are known only at run
// time, e.g. a grouped GEMM over MoE experts, where group g multiplies the rows routed to expert g.
//
// The groups' rows are stacked in one [total, extent_n] tensor: group g holds rows
// [rows.begin(g), rows.end(g)) of a DynamicRowPartition, and every group has the same extent_n
// columns. Each group is its own TileGrid of (tile_m x tile_n) tiles, clipped at the group's last
// row and column, so no tile holds two groups' rows. Tiles are numbered group-major, row-major
// inside a group, through a table of the first tile id of every group:
//
//   linear({g, m, n}) = first[g] + m * tiles_n() + n        first[num_groups()] = num_tiles()
//
// Empty groups own no ids. A persistent scheduler walks ids 0 .. num_tiles() - 1 and maps each one
// with coord() and region(); the work per id is one (clipped) tile whatever the routing was.
//
// The first-tile table is written by fill_first_tiles(grid, first) (device: one thread; host: a
// span, checked) after the offsets, by the same writer and under the same contract as the tables of
// dynamic_partition.hpp: readers read it only after the writer's writes are visible to them (stream
// order, or an observed release), and it does not change while they may read it.
//
//   // host, at plan time (neither table holds data yet)
//   DynamicTileGrid grid = DynamicTileGrid::make(experts, n, 128, 256, first);
//   // device, the routing kernel's last step, one thread:
//   if (fill_first_tiles(grid, first) < 0) ...  // report and trap
//   // device, the grouped GEMM: block b takes ids b, b + blocks, ...
//   GroupTileCoord c = grid.coord(id);  Rect r = grid.region(c);  // rows of the stacked tensor
#pragma once

#include <span>

#include "tilelink/core/config.hpp"
#include "tilelink/core/dynamic_partition.hpp"
#include "tilelink/core/tile.hpp"

namespace tilelink {

// A tile of a grouped grid: tile (m, n) of group `group`'s own grid.
struct GroupTileCoord {
  int group = 0;
  int m = 0;
  int n = 0;
  TL_HD friend bool operator==(GroupTileCoord a, GroupTileCoord b) {
    return a.group == b.group && a.m == b.m && a.n == b.n;
  }
};

struct DynamicTileGrid {
  DynamicRowPartition rows;  // group g: rows [rows.begin(g), rows.end(g)) of the stacked tensor
  int64_t extent_n = 0;      // columns, the same for every group
  int tile_m = 1, tile_n = 1;
  const int* first = nullptr;  // rows.num_parts + 1: first tile id of group g; last = num_tiles()

  // Host constructor: checks the partition's view, extent_n >= 1, tile sizes >= 1, tiles_n() within
  // an int and a non-null first-tile table (it reads neither table); throws tilelink::Error.
  static DynamicTileGrid make(const DynamicRowPartition& rows, int64_t extent_n, int tile_m,
                              int tile_n, const int* first);

  // At most how many tiles any table of num_groups groups and at most max_total_rows rows gives:
  // the size of per-tile arrays (signal slots) allocated before the tables exist.
  static TL_HD int64_t max_num_tiles(int64_t max_total_rows, int num_groups, int64_t extent_n,
                                     int tile_m, int tile_n) {
    return DynamicSegmentTiling::max_num_tiles(max_total_rows, num_groups, tile_m) *
           ceil_div(extent_n, tile_n);
  }

  TL_HD int num_groups() const { return rows.num_parts; }
  TL_HD int tiles_n() const { return static_cast<int>(ceil_div(extent_n, tile_n)); }
  TL_HD int tiles_m(int g) const { return static_cast<int>(ceil_div(rows.size(g), tile_m)); }
  TL_HD int tiles_of(int g) const { return first[g + 1] - first[g]; }
  TL_HD int num_tiles() const { return first[rows.num_parts]; }

  // Group g's own grid, in the group's coordinates (row 0 = the group's first row).
  TL_HD TileGrid group_grid(int g) const {
    return TileGrid{rows.size(g), extent_n, tile_m, tile_n};
  }

  // The group that owns tile `id` (0 <= id < num_tiles()); never an empty group.
  TL_HD int group_of(int id) const {
    int lo = 0, hi = rows.num_parts - 1;
    while (lo < hi) {  // last group whose first tile is <= id
      int mid = lo + (hi - lo + 1) / 2;
      if (first[mid] <= id)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }

  // Linear tile id <-> (group, m, n).
  TL_HD int linear(GroupTileCoord c) const { return first[c.group] + c.m * tiles_n() + c.n; }
  TL_HD GroupTileCoord coord(int id) const {
    const int g = group_of(id), local = id - first[g];
    return {g, local / tiles_n(), local % tiles_n()};
  }

  // Shape mapping: the (clipped) region of the stacked tensor a tile covers.
  TL_HD Rect region(GroupTileCoord c) const {
    Rect r;
    r.row = rows.begin(c.group) + static_cast<int64_t>(c.m) * tile_m;
    r.col = static_cast<int64_t>(c.n) * tile_n;
    r.rows = min64(tile_m, rows.end(c.group) - r.row);
    r.cols = min64(tile_n, extent_n - r.col);
    return r;
  }
};

// Fills a DynamicTileGrid's first-tile table (grid.num_groups() + 1 entries) from its offsets; it
// reads grid.rows, grid.tile_m and grid.tiles_n(), not grid.first. One thread runs it. Returns the
// number of tiles, or -1 (first_out partly written) when the offsets fail validate() or the tiles
// overflow an int id.
TL_HD inline int fill_first_tiles(const DynamicTileGrid& grid, int* first_out) {
  return detail::fill_first_chunk_tiles(grid.rows, grid.tile_m, grid.tiles_n(), first_out);
}

// Host: the same into a span of grid.num_groups() + 1 entries (the offsets must be in host memory).
// Throws tilelink::Error where the device form returns -1, and on too small an output.
int fill_first_tiles(const DynamicTileGrid& grid, std::span<int> first_out);

}  // namespace tilelink
