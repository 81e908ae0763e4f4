// SpAttnPlan: the plan of sequence-parallel attention, AllGather variant, shared by every backend.
//
// The sequence of S positions is sharded over the ranks: `contiguous` (rank r holds the positions
// of its segment, ragged allowed) or `zigzag` (S cut into 2W chunks, even to one row; rank r holds
// chunks r and 2W - 1 - r, which balances causal work). Rank r holds, for each of B batch entries,
// Q_r [S_r, Hq, D], K_r and V_r [S_r, Hkv, D] (its positions in shard order), and computes
// O_r = softmax(Q_r Kᵀ · scale + mask) V over the whole sequence [S_r, Hq, D], with the
// log-sum-exp of every row [S_r, Hq] (fp32).
//
//   comm      an AllGather of K and one of V per batch entry (comm/allgather.hpp) over the ranks'
//             rows, comm_tile_rows rows a tile; the gathered buffers hold the ranks' rows in rank
//             order, a row's position given by position_of
//   compute   per (batch, query head, query tile of q_tile rows): the key/value comm tiles in the
//             pull order (this rank's own first), each waited for by tile on K's and V's
//             tile_ready; under `causal` a comm tile whose every position lies past the query
//             tile's last position is skipped, and never waited for
//   workspace the 2B AllGathers' fields and the entry barrier [world]
#pragma once

#include <vector>

#include "tilelink/comm/allgather.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/workspace.hpp"

namespace tilelink {

enum class SeqShard : uint8_t { kContiguous, kZigzag };

struct SpAttnConfig {
  CommMode mode = CommMode::kPull;
  int comm_tile_rows = 64;  // sequence rows per communication tile
  int q_tile = 64;          // query rows per compute tile
  int comm_workers = 1;
  int compute_workers = 1;
};

struct SpAttnShape {
  int batch = 1;
  int64_t seq = 0;  // S, the whole sequence
  int heads_q = 1, heads_kv = 1;
  int64_t head_dim = 0;
  bool causal = false;
  SeqShard shard = SeqShard::kContiguous;
};

// Which positions each rank holds (trivially copyable, like every plan): contiguous, its segment of `rows`; zigzag, chunks r and
// 2W - 1 - r of S cut evenly into 2W.
struct SeqSharding {
  SeqShard shard = SeqShard::kContiguous;
  RowPartition rows;    // the ranks' row counts (S_r), in rank order: the gathered buffers' layout
  RowPartition chunks;  // zigzag: S cut into 2W chunks
  // Row i of rank r's shard is position position_of(r, i).
  int64_t position_of(int rank, int64_t i) const {
    if (shard == SeqShard::kContiguous) return rows.begin(rank) + i;
    const int w = rows.world_size;
    const int64_t first = chunks.size(rank);
    return i < first ? chunks.begin(rank) + i : chunks.begin(2 * w - 1 - rank) + (i - first);
  }
  // How many rows of rank r's shard, from row i, have contiguous positions: to the end of row i's
  // chunk (zigzag) or of the shard (>= 1; the middle rank's two zigzag chunks are adjacent, and
  // still two runs).
  int64_t run_from(int rank, int64_t i) const {
    if (shard == SeqShard::kContiguous) return rows.size(rank) - i;
    const int64_t first = chunks.size(rank);
    return i < first ? first - i : rows.size(rank) - i;
  }
  // contiguous: `segments` (S_r per rank); zigzag: S cut into 2W chunks (segments unused).
  static SeqSharding make(SeqShard shard, int64_t seq, int world, const std::vector<int64_t>& segments);
};

// What both attention plans hold: the rank, the world, the storage type, the shape and its sharding.
struct AttnLayout {
  int rank = 0;
  int world_size = 1;
  DType dtype = DType::kBF16;
  SpAttnShape shape;
  SeqSharding sharding;
  float scale = 1.0f;  // 1 / sqrt(D)
  int64_t local_rows() const { return sharding.rows.size(rank); }
  int64_t kv_row_bytes() const { return shape.heads_kv * shape.head_dim * dtype_size(dtype); }
  // Checks them for `op` (tilelink::Error): batch, heads, head dim, the sharding against S, and the
  // CPU's q_tile and worker counts.
  static AttnLayout make(const char* op, int rank, const SpAttnShape& shape, const SeqSharding& sharding,
                         DType dtype, int q_tile, int compute_workers);
};

struct SpAttnPlan : AttnLayout {
  static constexpr int kMaxBatch = 16;
  AllGatherPlan k[kMaxBatch], v[kMaxBatch];  // one per batch entry, over sharding.rows
  Field<Signal> barrier;
  uint64_t ws_bytes = 0;
  SpAttnConfig config;

  static SpAttnPlan make(int rank, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype,
                         const SpAttnConfig& config);
};

// A shard cut into what a position-masked attention kernel takes (its causal mask works on a query
// row's and a key row's positions, each a first position plus the row):
//
//   query run   rows of rank r's shard at contiguous positions, taken together: a contiguous shard
//               is one run; a zigzag shard under the mask two (its chunks, each seeing the keys up
//               to its own end), without the mask one (positions matter to the mask only)
//   key piece   rows of a rank's shard at contiguous positions: its contiguous shard, or each of
//               its zigzag chunks; `part` numbers it among all pieces (the rank under contiguous
//               shards, the chunk under zigzag), in the position order of the parts
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
const RowPartition& piece_parts(const SeqSharding& sh);
// The non-empty query runs of rank p.rank, in its row order.
std::vector<QueryRun> query_runs(const AttnLayout& p);
// The non-empty key pieces of rank `owner`, in its row order.
std::vector<KeyPiece> key_pieces(const SeqSharding& sh, int owner);
// The last position + 1 that rank p.rank's queries read: S, or under the mask its last position's.
int64_t keys_needed(const AttnLayout& p);

// RingAttnPlan: ring attention. The same sharding and output as SpAttnPlan; instead of gathering
// every K/V, each rank's block (all of its rows, every batch entry) travels around the ring: at
// step s rank r folds the block of rank (r - s) mod W into every query tile's state (the online
// softmax is the log-sum-exp merge of the steps' partials) while it forwards that block to rank
// r + 1, as far as a rank reads it (steps(): under the mask with contiguous shards rank r runs
// r + 1 steps, and the last rank forwards nothing). Two receive slots a rank; a block is written
// into a slot only after its owner has both folded and forwarded (or passed on forwarding) the
// block that slot held two steps before.
//
//   fields  slots [2][B][max S_r][Hkv * D] for K and for V; filled[2] (a block is in the slot),
//           consumed[2] (the slot's block is folded and forwarded), done[compute workers] (a
//           worker has folded step s), the entry barrier
//   values  per call, base = epoch * (W + 1): step s's block is filled[s % 2] >= base + s + 1, and
//           consumed / done likewise
struct RingAttnPlan : AttnLayout {
  int q_tile = 64;
  int compute_workers = 1;
  ByteField k_slots, v_slots;  // [2][B][max S_r][Hkv * D]
  Field<Signal> filled, consumed, done, barrier;
  uint64_t ws_bytes = 0;

  static RingAttnPlan make(int rank, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype,
                           int q_tile, int compute_workers);
  // Bytes of one batch entry's block in a slot, and of a slot.
  int64_t block_bytes() const { return sharding.rows.max_size() * kv_row_bytes(); }
  int64_t slot_bytes() const { return shape.batch * block_bytes(); }
  // The owner of the block rank r folds at step s.
  int owner_at(int step) const { return ((rank - step) % world_size + world_size) % world_size; }
  // The steps rank r runs: every rank's block, or under the mask with contiguous shards the blocks
  // of ranks r, r - 1, ..., 0 only (a later rank's keys lie past every query of r), so the ring
  // stops carrying a block at the last rank that reads it.
  int steps_of(int r) const { return shape.causal && sharding.shard == SeqShard::kContiguous ? r + 1 : world_size; }
  int steps() const { return steps_of(rank); }
  // Whether this rank forwards block `step` to its right neighbour (there, step + 1).
  bool forwards(int step) const { return step + 1 < steps_of((rank + 1) % world_size); }
  uint64_t base(uint64_t epoch) const { return epoch * static_cast<uint64_t>(world_size + 1); }
};

}  // namespace tilelink
