#include "tilelink/core/partition.hpp"

#include "tilelink/core/error.hpp"
#include "tilelink/core/segment_tiling.hpp"

namespace tilelink {

RowPartition RowPartition::even(int64_t rows, int world) {
  TL_REQUIRE(world >= 1 && world <= kMaxWorldSize,
             "world size must be in [1, " << kMaxWorldSize << "], got " << world);
  TL_REQUIRE(rows >= 0, "row count must be >= 0, got " << rows);
  RowPartition p;
  p.world_size = world;
  int64_t base = rows / world, extra = rows % world;
  for (int r = 0; r < world; ++r) p.offsets[r + 1] = p.offsets[r] + base + (r < extra ? 1 : 0);
  return p;
}

RowPartition RowPartition::from_counts(std::span<const int64_t> counts) {
  int world = static_cast<int>(counts.size());
  TL_REQUIRE(world >= 1 && world <= kMaxWorldSize,
             "world size must be in [1, " << kMaxWorldSize << "], got " << world);
  RowPartition p;
  p.world_size = world;
  for (int r = 0; r < world; ++r) {
    TL_REQUIRE(counts[r] >= 0, "rank " << r << " has a negative row count " << counts[r]);
    p.offsets[r + 1] = p.offsets[r] + counts[r];
  }
  return p;
}

SegmentTiling SegmentTiling::make(const RowPartition& parts, int chunk_rows) {
  TL_REQUIRE(chunk_rows >= 1, "communication tile rows must be >= 1, got " << chunk_rows);
  SegmentTiling t;
  t.parts = parts;
  t.chunk_rows = chunk_rows;
  for (int r = 0; r < parts.world_size; ++r)
    t.first[r + 1] = t.first[r] + static_cast<int>(ceil_div(parts.size(r), chunk_rows));
  return t;
}

}  // namespace tilelink
