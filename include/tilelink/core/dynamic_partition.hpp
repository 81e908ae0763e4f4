// Dynamic row partitions and segment tilings: the part mapping and the communication-tile mapping
// of a row-split tensor whose segments are known only at run time, read from tables in memory.
//
// RowPartition and SegmentTiling (partition.hpp, segment_tiling.hpp) hold their offsets by value:
// the host knows the segments before the launch. Here the offsets, and the first tile id of every
// part, live in tables in memory (device or host) that an earlier kernel writes at run time, e.g.
// MoE routing: per-expert token counts -> the offsets of each expert's rows in the dispatched
// tensor. The structs are views (a part count, the tile size, pointers): trivially copyable into a
// plan or a kernel argument, with the accessors of the static mappings under the same names, except
// that rank_of is part_of (a part is an expert, a rank, or any other segment). The number of parts
// is a run-time value with no fixed capacity (kMaxWorldSize does not apply).
//
//   DynamicRowPartition   part p owns rows [offsets[p], offsets[p + 1]); empty parts allowed
//   DynamicSegmentTiling  each part cut into chunks of chunk_rows rows (the last clipped), tile ids
//                         part-major, chunk-minor; first[p] = the first tile id of part p
//   (DynamicTileGrid, the grouped GEMM's tiles over the same tables: dynamic_tile_grid.hpp)
//
// Example: the tables in an op's workspace; the host builds the views and never reads the tables.
//
//   // host, at plan time: views over tables that hold no data yet
//   DynamicRowPartition experts = DynamicRowPartition::make(num_experts, offsets);
//   DynamicSegmentTiling tiles = DynamicSegmentTiling::make(experts, 128, first);
//   // device, the routing kernel, one thread once the per-expert counts are final:
//   if (!offsets_from_counts(counts, num_experts, offsets) ||
//       fill_first_tiles(experts, 128, first) < 0)
//     ...  // a negative count or too many tiles: report and trap
//   // device, a later kernel in the same stream: every worker walks the tiles
//   for (int t = worker; t < tiles.num_tiles(); t += num_workers) {
//     RowRange rows = tiles.rows_of(t);  // rows of expert tiles.part_of(t)
//     ...
//   }
//
// On the host (CPU backend, tests) the same two steps are offsets_from_counts(counts, offsets) and
// fill_first_tiles(experts, 128, first) over spans, which check everything and throw
// tilelink::Error.
//
// Contract
// - One writer fills a table: the offsets first, then the first tile ids from them. The views'
//   constructors never read the tables; a view may be built before its tables hold data, and reads
//   whatever they hold when an accessor is called.
// - A reader reads a table only after the writer's writes are visible to it: in a later kernel in
//   the writer's stream (or one ordered after it by an event), or, in the same kernel or on another
//   rank, after it has observed the writer's release (producer_tile_notify, peer_tile_notify) with
//   the matching acquire wait. CPU threads: after the writer's release store or the writer's join.
// - A table does not change while a reader may read it: the next call's routing writes it in stream
//   order after the last reader, or writes a second table.
// - Readers trust the table. One that fails validate() gives meaningless rows and tiles, though
//   accessors given in-range arguments still read only entries 0..num_parts. fill_first_tiles()
//   validates the offsets it reads, so a writer that checks its result has checked the table.
#pragma once

#include <span>

#include "tilelink/core/config.hpp"
#include "tilelink/core/segment_tiling.hpp"  // RowRange, IdRange

namespace tilelink {

struct DynamicRowPartition {
  int num_parts = 0;
  // num_parts + 1 entries: offsets[p] = the first row of part p; offsets[num_parts] = total rows
  const int64_t* offsets = nullptr;

  // Host constructor: checks num_parts >= 1 and a non-null table (it never reads the table); throws
  // tilelink::Error. Device code builds the view as an aggregate: {num_parts, offsets}.
  static DynamicRowPartition make(int num_parts, const int64_t* offsets);

  TL_HD int64_t begin(int p) const { return offsets[p]; }
  TL_HD int64_t end(int p) const { return offsets[p + 1]; }
  TL_HD int64_t size(int p) const { return offsets[p + 1] - offsets[p]; }
  TL_HD int64_t total() const { return offsets[num_parts]; }
  TL_HD int64_t max_size() const {
    int64_t m = 0;
    for (int p = 0; p < num_parts; ++p) m = max64(m, size(p));
    return m;
  }

  // The part whose segment holds `row` (0 <= row < total()); empty parts own nothing.
  TL_HD int owner_of_row(int64_t row) const {
    int lo = 0, hi = num_parts - 1;
    while (lo < hi) {  // last p with offsets[p] <= row, skipping empty parts
      int mid = lo + (hi - lo + 1) / 2;
      if (offsets[mid] <= row)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }

  // The first entry that breaks the table's contract (offsets[0] == 0, offsets non-decreasing), or
  // -1 for a valid table; 0 when there is no table (num_parts < 1 or no pointer).
  TL_HD int first_bad_offset() const {
    if (num_parts < 1 || offsets == nullptr || offsets[0] != 0) return 0;
    for (int p = 1; p <= num_parts; ++p)
      if (offsets[p] < offsets[p - 1]) return p;
    return -1;
  }
  TL_HD bool validate() const { return first_bad_offset() < 0; }
};

// Exclusive scan of `parts` counts into parts + 1 offsets: offsets[0] = 0, offsets[p + 1] =
// offsets[p] + counts[p]. One thread runs it (on a device: after the counts are final). Returns
// false, with the offsets partly written, on parts < 1 or a negative count.
TL_HD inline bool offsets_from_counts(const int64_t* counts, int parts, int64_t* offsets) {
  if (parts < 1) return false;
  offsets[0] = 0;
  for (int p = 0; p < parts; ++p) {
    if (counts[p] < 0) return false;
    offsets[p + 1] = offsets[p] + counts[p];
  }
  return true;
}

// Host: the same over spans (offsets needs counts.size() + 1 entries; more are left alone). Throws
// tilelink::Error on no counts, a negative count (naming the part) or too small an output.
void offsets_from_counts(std::span<const int64_t> counts, std::span<int64_t> offsets);

namespace detail {
// first_out[p] (num_parts + 1 entries) = the first tile id of part p when each part is cut into
// chunks of chunk_rows rows and each chunk holds tiles_per_chunk tiles. Returns the number of
// tiles, or -1 (first_out partly written) on an invalid table, chunk_rows < 1, tiles_per_chunk < 0,
// or more tiles than an int tile id can name.
TL_HD inline int fill_first_chunk_tiles(const DynamicRowPartition& parts, int chunk_rows,
                                        int tiles_per_chunk, int* first_out) {
  constexpr int64_t kMaxTiles = 0x7fffffff;
  if (chunk_rows < 1 || tiles_per_chunk < 0 || !parts.validate()) return -1;
  int64_t at = 0;
  first_out[0] = 0;
  for (int p = 0; p < parts.num_parts; ++p) {
    const int64_t rows = parts.size(p);
    const int64_t chunks = rows / chunk_rows + (rows % chunk_rows != 0 ? 1 : 0);
    // NOTE: compared before multiplying, so a huge table cannot overflow int64 either.
    if (tiles_per_chunk > 0 && chunks > (kMaxTiles - at) / tiles_per_chunk) return -1;
    at += chunks * tiles_per_chunk;
    first_out[p + 1] = static_cast<int>(at);
  }
  return static_cast<int>(at);
}
}  // namespace detail

// Fills the first-tile table of a DynamicSegmentTiling (parts.num_parts + 1 entries) from the
// offsets. One thread runs it, after the offsets are written and visible to it. Returns the number
// of tiles, or -1 (first_out partly written) when the offsets fail validate(), chunk_rows < 1, or
// the tiles overflow an int id.
TL_HD inline int fill_first_tiles(const DynamicRowPartition& parts, int chunk_rows,
                                  int* first_out) {
  return detail::fill_first_chunk_tiles(parts, chunk_rows, 1, first_out);
}

// Host: the same into a span, which needs parts.num_parts + 1 entries (the offsets are read, so
// they must be in host memory). Returns the number of tiles; throws tilelink::Error where the
// device form returns -1, naming the bad entry of an invalid table, and on too small an output.
int fill_first_tiles(const DynamicRowPartition& parts, int chunk_rows, std::span<int> first_out);

// Communication tiles over a DynamicRowPartition: SegmentTiling with its tables in memory.
struct DynamicSegmentTiling {
  DynamicRowPartition parts;
  int chunk_rows = 1;
  // parts.num_parts + 1 entries: first[p] = the first tile id of part p; the last = num_tiles()
  const int* first = nullptr;

  // Host constructor: checks the partition's view, chunk_rows >= 1 and a non-null first-tile table
  // (it reads neither table); throws tilelink::Error.
  static DynamicSegmentTiling make(const DynamicRowPartition& parts, int chunk_rows,
                                   const int* first);

  // At most how many tiles any table of num_parts parts and at most max_total_rows rows gives: the
  // size of per-tile arrays (signal slots) allocated before the tables exist.
  static TL_HD int64_t max_num_tiles(int64_t max_total_rows, int num_parts, int chunk_rows) {
    const int64_t parts = num_parts, chunk = chunk_rows;
    return min64(max_total_rows, (max_total_rows + parts * (chunk - 1)) / chunk);
  }

  TL_HD int num_parts() const { return parts.num_parts; }
  TL_HD int num_tiles() const { return first[parts.num_parts]; }
  TL_HD int tiles_of(int part) const { return first[part + 1] - first[part]; }
  TL_HD int tile_id(int part, int chunk) const { return first[part] + chunk; }

  // The part that owns a tile (0 <= tile < num_tiles()); never an empty part.
  TL_HD int part_of(int tile) const {
    int lo = 0, hi = parts.num_parts - 1;
    while (lo < hi) {  // last part whose first tile is <= tile
      int mid = lo + (hi - lo + 1) / 2;
      if (first[mid] <= tile)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }

  TL_HD RowRange rows_of(int tile) const {
    const int p = part_of(tile);
    const int64_t b = parts.begin(p) + static_cast<int64_t>(tile - first[p]) * chunk_rows;
    return {b, min64(b + chunk_rows, parts.end(p))};
  }

  // The tile holding `row` (0 <= row < parts.total()).
  TL_HD int tile_of_row(int64_t row) const {
    const int p = parts.owner_of_row(row);
    return first[p] + static_cast<int>((row - parts.begin(p)) / chunk_rows);
  }

  // The tiles that cover rows [rows.begin, rows.end): a contiguous id range.
  TL_HD IdRange covering(RowRange rows) const {
    if (rows.end <= rows.begin) return {0, 0};
    return {tile_of_row(rows.begin), tile_of_row(rows.end - 1) + 1};
  }
};

}  // namespace tilelink
