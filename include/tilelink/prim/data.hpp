// Tile-centric data primitives: the contract every backend implements.
//
//   tile_push_data(ctx, peer, copy)  the caller writes a tile into a peer's memory (copy.dst is the
//                                    peer's, copy.src local). SM-driven on the GPU.
//   tile_pull_data(ctx, peer, copy)  the caller reads a tile from a peer's memory (copy.src is the
//                                    peer's, copy.dst local). SM-driven on the GPU.
//   rank_copy_data(ctx, peer, copy)  a whole rank-level block moved by the copy engine on the GPU
//                                    (cudaMemcpyAsync between stream wait/write-value operations), by
//                                    memcpy on the CPU.
// A data primitive orders nothing by itself: follow it with a notify (release) to announce the data,
// and precede the reads of remote data with a wait (acquire).
#pragma once

#include <cstdint>

#include "tilelink/core/config.hpp"

namespace tilelink {

// A 2-D strided copy: `rows` rows of `row_bytes` bytes; row i starts at src + i*src_pitch and
// dst + i*dst_pitch (pitches in bytes).
struct Copy2D {
  const void* src = nullptr;
  int64_t src_pitch = 0;
  void* dst = nullptr;
  int64_t dst_pitch = 0;
  int64_t rows = 0;
  int64_t row_bytes = 0;

  TL_HD int64_t num_bytes() const { return rows * row_bytes; }
};

}  // namespace tilelink
