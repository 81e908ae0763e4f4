// RowPartition: the rank mapping of a row-split tensor. Rank r owns rows [begin(r), end(r)).
// Ragged: segments may differ in size, and may be empty.
#pragma once

#include <span>

#include "tilelink/core/config.hpp"

namespace tilelink {

struct RowPartition {
  int world_size = 0;
  int64_t offsets[kMaxWorldSize + 1] = {};  // offsets[r] = first row of rank r; offsets[world] = total

  // Host constructors; both check their input and throw tilelink::Error.
  // even(): the first (rows % world) ranks get one extra row.
  static RowPartition even(int64_t rows, int world);
  static RowPartition from_counts(std::span<const int64_t> counts);

  TL_HD int64_t begin(int r) const { return offsets[r]; }
  TL_HD int64_t end(int r) const { return offsets[r + 1]; }
  TL_HD int64_t size(int r) const { return offsets[r + 1] - offsets[r]; }
  TL_HD int64_t total() const { return offsets[world_size]; }
  TL_HD int64_t max_size() const {
    int64_t m = 0;
    for (int r = 0; r < world_size; ++r) m = max64(m, size(r));
    return m;
  }

  // The rank whose segment holds `row` (0 <= row < total()); empty segments own nothing.
  TL_HD int owner_of_row(int64_t row) const {
    int lo = 0, hi = world_size - 1;
    while (lo < hi) {  // last r with offsets[r] <= row, skipping empty segments
      int mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= row) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
};

}  // namespace tilelink
