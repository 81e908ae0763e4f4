// Tile orders: the sequence in which a worker visits the tiles of a grid.
//
// TileOrder visits a (tiles_m x tiles_n) grid in groups of `group_m` tile rows (column-major inside
// a group, for L2 reuse of the B operand; group_m = 1 is plain row-major), with the tile rows
// rotated so that the walk starts at tile row `start_m` and wraps. The rotation is the local-first
// swizzle: a rank starts where its data already is (AG+GEMM).
//
// With `bands` > 1 the walk's tile rows are not the grid's in order: the grid's rows are cut into
// `bands` near-equal bands (the first tiles_m % bands of them one row longer), and the walk takes
// row 0 of every band, then row 1 of every band, ... (grouping and rotation apply to that
// sequence). GEMM+RS walks its partial this way with one band per rank's segment, the same order on
// every rank: every owner's reduce tiles then finish at an even pace through the whole GEMM, on
// every rank at once, instead of all in the last 1/W of it (bench/notes/fused_ops_cuda.md, the
// banded compute order).
#pragma once

#include "tilelink/core/config.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/tile.hpp"

namespace tilelink {

struct TileOrder {
  int tiles_m = 0, tiles_n = 0;
  int start_m = 0;  // first tile row visited
  int group_m = 1;  // tile rows per group
  int bands = 1;    // row bands visited in turn (see above); 1: the rows in order

  TL_HD int count() const { return tiles_m * tiles_n; }

  // The grid row of the walk's row v (after rotation), 0 <= v < tiles_m.
  TL_HD int band_row(int v) const {
    if (bands <= 1) return v;
    const int q = tiles_m / bands, rem = tiles_m % bands;
    const int s = v < q * bands ? v % bands : v - q * bands;  // the band
    const int i = v < q * bands ? v / bands : q;              // the row inside it
    return s * q + (s < rem ? s : rem) + i;
  }

  // The i-th tile visited, 0 <= i < count(). A bijection onto the grid.
  TL_HD TileCoord at(int i) const {
    int per_group = group_m * tiles_n;
    int group = i / per_group;
    int first_m = group * group_m;
    int rows_in_group = tiles_m - first_m < group_m ? tiles_m - first_m : group_m;
    int in_group = i - group * per_group;
    int m = first_m + in_group % rows_in_group;
    int n = in_group / rows_in_group;
    return {band_row((m + start_m) % tiles_m), n};
  }
};

// Peer visiting order: step 0 is the rank itself, then rank+1, rank+2, ... (wrapping).
TL_HD constexpr int peer_at(int rank, int step, int world) { return (rank + step) % world; }

// The first tile row (of height tile_m over partition p) that starts inside rank's segment, so that its
// rows are local from its first row on. Wraps to 0 past the end; 0 for an empty tensor.
TL_HD inline int first_tile_row_of_segment(const RowPartition& p, int rank, int tile_m) {
  int tiles_m = static_cast<int>(ceil_div(p.total(), tile_m));
  if (tiles_m == 0) return 0;
  return static_cast<int>(ceil_div(p.begin(rank), tile_m)) % tiles_m;
}

}  // namespace tilelink
