// SegmentTiling: communication tiles over a row-partitioned (ragged) tensor.
//
// Each rank's segment is cut into chunks of `chunk_rows` rows (the last chunk of a segment clipped).
// Tiles are numbered rank-major, chunk-minor, so ids increase with rows: the tiles that cover any row
// range form one contiguous id range. This gives the three mappings of a communication tile:
//   shape   tile id -> rows it covers          rows_of()
//   rank    tile id -> rank that owns the rows rank_of()
//   channel tile id -> signal slot             the id itself (plans add a base when they need one)
#pragma once

#include "tilelink/core/config.hpp"
#include "tilelink/core/partition.hpp"

namespace tilelink {

struct RowRange {
  int64_t begin = 0, end = 0;
  TL_HD int64_t size() const { return end - begin; }
};

struct IdRange {
  int begin = 0, end = 0;
  TL_HD int size() const { return end - begin; }
  TL_HD bool empty() const { return end <= begin; }
};

struct SegmentTiling {
  RowPartition parts;
  int chunk_rows = 1;
  int first[kMaxWorldSize + 1] = {};  // first tile id of rank r; first[world] = number of tiles

  // Host constructor; refuses chunk_rows < 1.
  static SegmentTiling make(const RowPartition& parts, int chunk_rows);

  TL_HD int world_size() const { return parts.world_size; }
  TL_HD int num_tiles() const { return first[parts.world_size]; }
  TL_HD int tiles_of(int rank) const { return first[rank + 1] - first[rank]; }
  TL_HD int tile_id(int rank, int chunk) const { return first[rank] + chunk; }

  TL_HD int rank_of(int tile) const {
    int lo = 0, hi = parts.world_size - 1;
    while (lo < hi) {  // last rank whose first tile is <= tile
      int mid = (lo + hi + 1) / 2;
      if (first[mid] <= tile) lo = mid; else hi = mid - 1;
    }
    return lo;
  }

  TL_HD RowRange rows_of(int tile) const {
    int r = rank_of(tile);
    int64_t b = parts.begin(r) + static_cast<int64_t>(tile - first[r]) * chunk_rows;
    return {b, min64(b + chunk_rows, parts.end(r))};
  }

  // The tile holding `row` (0 <= row < parts.total()).
  TL_HD int tile_of_row(int64_t row) const {
    int r = parts.owner_of_row(row);
    return first[r] + static_cast<int>((row - parts.begin(r)) / chunk_rows);
  }

  // The tiles that cover rows [rows.begin, rows.end): a contiguous id range.
  TL_HD IdRange covering(RowRange rows) const {
    if (rows.end <= rows.begin) return {0, 0};
    return {tile_of_row(rows.begin), tile_of_row(rows.end - 1) + 1};
  }
};

}  // namespace tilelink
