// The walk of a grouped GEMM's tiles (compute/sm90/grouped_gemm.hpp): which tile the id-th unit of
// the persistent walk computes, on the host (tests) and in the engine's scheduler alike.
//
// The tiles are kTileM x tile_n over groups of ragged rows; group g owns the tile rows
// [first[g], first[g + 1]) (a DynamicTileGrid's first-tile table of one column), tiles_n columns
// each, first[groups] tile rows in all. The walk goes down bands of `band` tile rows, column after
// column, so a band's rows of A stay in L2 while each column of B streams once a band:
//
//   order == nullptr  bands inside each group, group after group (tile ids group by group)
//   order != nullptr  bands over the tile rows in the table's order (a permutation of
//                     [0, first[groups])): order[i] is the i-th tile row visited. An op puts the
//                     rows whose inputs arrive first in front (ops/moe_routing.hpp,
//                     moe_arrival_row_order); a band may then hold rows of several groups.
//
// Both visit every tile exactly once for ids 0 .. first[groups] * tiles_n - 1.
#pragma once

#include "tilelink/core/config.hpp"

namespace tilelink {

struct GroupedWalkTile {
  int group;  // the tile's group
  int m, n;   // its tile row in the group's own grid, its column
};

// The last group whose first tile row is <= row: never an empty group (an empty group's first row
// is the next group's).
TL_HD inline int grouped_group_of_row(const int* first, int groups, int row) {
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (first[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The tile of unit `id` (0 <= id < first[groups] * tiles_n) of the walk above.
TL_HD inline GroupedWalkTile grouped_walk_tile(const int* first, int groups, int tiles_n, int band,
                                               const int* order, int id) {
  // the band walk over `count` tile rows from `row_base`: position in the band's rows, column
  auto in_bands = [&](int local, int count, int* pos, int* col) {
    const int row0 = local / (band * tiles_n) * band;
    const int rows = count - row0 < band ? count - row0 : band;
    const int in_band = local - row0 * tiles_n;
    *pos = row0 + in_band % rows;
    *col = in_band / rows;
  };
  int pos = 0, col = 0;
  if (order == nullptr) {
    const int g = grouped_group_of_row(first, groups, id / tiles_n);
    in_bands(id - first[g] * tiles_n, first[g + 1] - first[g], &pos, &col);
    return {g, pos, col};
  }
  in_bands(id, first[groups], &pos, &col);
  const int row = order[pos];
  const int g = grouped_group_of_row(first, groups, row);
  return {g, row - first[g], col};
}

}  // namespace tilelink
