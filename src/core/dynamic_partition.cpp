// Host constructors and checked table fillers of the dynamic mappings. Every refusal names the
// input it refuses.
#include "tilelink/core/dynamic_partition.hpp"

#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink {

namespace {

void require_view(const DynamicRowPartition& parts, const char* what) {
  TL_REQUIRE(parts.num_parts >= 1,
             what << ": the number of parts must be >= 1, got " << parts.num_parts);
  TL_REQUIRE(parts.offsets != nullptr, what << ": no offsets table");
}

// A host table that fails validate(): name the entry that breaks it.
void require_valid_table(const DynamicRowPartition& parts, const char* what) {
  require_view(parts, what);
  const int bad = parts.first_bad_offset();
  TL_REQUIRE(bad != 0, what << ": offsets[0] must be 0, got " << parts.offsets[0]);
  TL_REQUIRE(bad < 0, what << ": offsets must not decrease, but offsets[" << bad
                           << "] = " << parts.offsets[bad] << " < offsets[" << bad - 1
                           << "] = " << parts.offsets[bad - 1]);
}

int fill_checked(const DynamicRowPartition& parts, int chunk_rows, int tiles_per_chunk,
                 std::span<int> first_out, const char* what) {
  require_valid_table(parts, what);
  TL_REQUIRE(first_out.size() >= static_cast<size_t>(parts.num_parts) + 1,
             what << ": the first-tile table needs " << parts.num_parts + 1
                  << " entries (one per part, plus the total), got " << first_out.size());
  const int tiles =
      detail::fill_first_chunk_tiles(parts, chunk_rows, tiles_per_chunk, first_out.data());
  TL_REQUIRE(tiles >= 0, what << ": " << parts.total() << " rows in " << parts.num_parts
                              << " parts make more tiles than an int tile id can name");
  return tiles;
}

}  // namespace

DynamicRowPartition DynamicRowPartition::make(int num_parts, const int64_t* offsets) {
  DynamicRowPartition p{num_parts, offsets};
  require_view(p, "dynamic row partition");
  return p;
}

void offsets_from_counts(std::span<const int64_t> counts, std::span<int64_t> offsets) {
  TL_REQUIRE(!counts.empty(), "offsets_from_counts: no counts (a partition needs >= 1 part)");
  TL_REQUIRE(offsets.size() >= counts.size() + 1,
             "offsets_from_counts: " << counts.size() << " counts need " << counts.size() + 1
                                     << " offsets, got " << offsets.size());
  for (size_t p = 0; p < counts.size(); ++p)
    TL_REQUIRE(counts[p] >= 0,
               "offsets_from_counts: part " << p << " has a negative row count " << counts[p]);
  offsets_from_counts(counts.data(), static_cast<int>(counts.size()), offsets.data());
}

int fill_first_tiles(const DynamicRowPartition& parts, int chunk_rows, std::span<int> first_out) {
  TL_REQUIRE(chunk_rows >= 1, "fill_first_tiles: chunk rows must be >= 1, got " << chunk_rows);
  return fill_checked(parts, chunk_rows, 1, first_out, "fill_first_tiles");
}

DynamicSegmentTiling DynamicSegmentTiling::make(const DynamicRowPartition& parts, int chunk_rows,
                                                const int* first) {
  require_view(parts, "dynamic segment tiling");
  TL_REQUIRE(chunk_rows >= 1,
             "dynamic segment tiling: chunk rows must be >= 1, got " << chunk_rows);
  TL_REQUIRE(first != nullptr, "dynamic segment tiling: no first-tile table");
  return DynamicSegmentTiling{parts, chunk_rows, first};
}

DynamicTileGrid DynamicTileGrid::make(const DynamicRowPartition& rows, int64_t extent_n, int tile_m,
                                      int tile_n, const int* first) {
  require_view(rows, "dynamic tile grid");
  TL_REQUIRE(extent_n >= 1, "dynamic tile grid: N must be >= 1, got " << extent_n);
  TL_REQUIRE(tile_m >= 1 && tile_n >= 1,
             "dynamic tile grid: tile sizes must be >= 1, got " << tile_m << "x" << tile_n);
  TL_REQUIRE(ceil_div(extent_n, tile_n) <= 0x7fffffff,
             "dynamic tile grid: " << extent_n << " columns in tiles of " << tile_n
                                   << " make more column tiles than an int can count");
  TL_REQUIRE(first != nullptr, "dynamic tile grid: no first-tile table");
  DynamicTileGrid g;
  g.rows = rows;
  g.extent_n = extent_n;
  g.tile_m = tile_m;
  g.tile_n = tile_n;
  g.first = first;
  return g;
}

int fill_first_tiles(const DynamicTileGrid& grid, std::span<int> first_out) {
  TL_REQUIRE(
      grid.tile_m >= 1 && grid.tile_n >= 1,
      "fill_first_tiles: grid tile sizes must be >= 1, got " << grid.tile_m << "x" << grid.tile_n);
  TL_REQUIRE(grid.extent_n >= 0 && ceil_div(grid.extent_n, grid.tile_n) <= 0x7fffffff,
             "fill_first_tiles: grid N must be >= 0 with an int's worth of column tiles, got "
                 << grid.extent_n << " in tiles of " << grid.tile_n);
  return fill_checked(grid.rows, grid.tile_m, grid.tiles_n(), first_out, "fill_first_tiles");
}

}  // namespace tilelink
