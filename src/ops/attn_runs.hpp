// Internal to the CUDA attention ops: a shard's rows at contiguous positions, the unit the sm90
// engine takes (its causal mask works on a query row's and a key row's positions, each a first
// position plus the row).
//
//   query run   rows of rank r's shard the engine takes in one launch: a contiguous shard is one
//               run; a zigzag shard under the mask two (its chunks, each seeing the keys up to its
//               own end), without the mask one (positions matter to the mask only)
//   key piece   rows of a rank's shard at contiguous positions: its contiguous shard, or each of
//               its zigzag chunks; `part` numbers it among all pieces (the rank under contiguous
//               shards, the chunk under zigzag), in the position order of the parts
#pragma once

#include <algorithm>
#include <vector>

#include "tilelink/ops/attention_plan.hpp"

namespace tilelink::cuda::detail {

struct QueryRun {
  int64_t row0 = 0, rows = 0, pos0 = 0;
  int64_t pos_end() const { return pos0 + rows; }
};

struct KeyPiece {
  int64_t row0 = 0;  // the first row in the owner's shard
  RowRange pos;      // its positions
  int part = 0;      // the rank (contiguous) or the chunk (zigzag)
};

// The partition whose parts are the pieces: the ranks' segments, or the 2W zigzag chunks.
inline const RowPartition& piece_parts(const SeqSharding& sh) {
  return sh.shard == SeqShard::kZigzag ? sh.chunks : sh.rows;
}

inline std::vector<QueryRun> query_runs(const AttnLayout& p) {
  const SeqSharding& sh = p.sharding;
  const int r = p.rank, W = p.world_size;
  std::vector<QueryRun> runs;
  auto add = [&](int64_t row0, int64_t rows, int64_t pos0) {
    if (rows > 0) runs.push_back({row0, rows, pos0});
  };
  if (sh.shard == SeqShard::kContiguous) {
    add(0, p.local_rows(), sh.rows.begin(r));
  } else if (p.shape.causal) {
    add(0, sh.chunks.size(r), sh.chunks.begin(r));
    add(sh.chunks.size(r), sh.chunks.size(2 * W - 1 - r), sh.chunks.begin(2 * W - 1 - r));
  } else {
    add(0, p.local_rows(), 0);
  }
  return runs;
}

// The non-empty pieces of rank `owner`, in its row order.
inline std::vector<KeyPiece> key_pieces(const SeqSharding& sh, int owner) {
  const int W = sh.rows.world_size;
  const RowPartition& parts = piece_parts(sh);
  std::vector<KeyPiece> pieces;
  auto add = [&](int64_t row0, int part) {
    const RowRange pos{parts.begin(part), parts.end(part)};
    if (pos.size() > 0) pieces.push_back({row0, pos, part});
  };
  add(0, owner);
  if (sh.shard == SeqShard::kZigzag) add(sh.chunks.size(owner), 2 * W - 1 - owner);
  return pieces;
}

// The keys rank p.rank's queries read: all of them, or under the mask those up to its last position.
inline int64_t keys_needed(const AttnLayout& p) {
  if (!p.shape.causal) return p.shape.seq;
  int64_t end = 0;
  for (const QueryRun& q : query_runs(p)) end = std::max(end, q.pos_end());
  return end;
}

}  // namespace tilelink::cuda::detail
