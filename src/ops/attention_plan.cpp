// SpAttnPlan::make and SeqSharding::make (ops/attention_plan.hpp).
#include "tilelink/ops/attention_plan.hpp"

#include <algorithm>
#include <cmath>

#include "tilelink/core/error.hpp"

namespace tilelink {

SeqSharding SeqSharding::make(SeqShard shard, int64_t seq, int world, const std::vector<int64_t>& segments) {
  TL_REQUIRE(world >= 1 && world <= kMaxWorldSize, "sp_attn: world " << world << " is out of range");
  TL_REQUIRE(seq >= 1, "sp_attn: the sequence must hold at least one position, got " << seq);
  SeqSharding s;
  s.shard = shard;
  if (shard == SeqShard::kContiguous) {
    TL_REQUIRE(static_cast<int>(segments.size()) == world,
               "sp_attn: " << segments.size() << " segments for a world of " << world);
    s.rows = RowPartition::from_counts(segments);  // refuses a negative count
    TL_REQUIRE(s.rows.total() == seq,
               "sp_attn: the segments hold " << s.rows.total() << " positions, the sequence " << seq);
    return s;
  }
  TL_REQUIRE(2 * world <= kMaxWorldSize,
             "sp_attn: zigzag cuts the sequence into 2W chunks; at most " << kMaxWorldSize / 2 << " ranks");
  s.chunks = RowPartition::even(seq, 2 * world);
  std::vector<int64_t> counts(world);
  for (int r = 0; r < world; ++r) counts[r] = s.chunks.size(r) + s.chunks.size(2 * world - 1 - r);
  s.rows = RowPartition::from_counts(counts);
  return s;
}

AttnLayout AttnLayout::make(const char* op, int rank, const SpAttnShape& shape, const SeqSharding& sharding,
                            DType dtype, int q_tile, int compute_workers) {
  const int w = sharding.rows.world_size;
  TL_REQUIRE(rank >= 0 && rank < w, op << ": rank " << rank << " outside a world of " << w);
  TL_REQUIRE(shape.batch >= 1 && shape.batch <= SpAttnPlan::kMaxBatch,
             op << ": batch " << shape.batch << " is out of range [1, " << SpAttnPlan::kMaxBatch << "]");
  TL_REQUIRE(shape.heads_kv >= 1 && shape.heads_q >= shape.heads_kv && shape.heads_q % shape.heads_kv == 0,
             op << ": " << shape.heads_q << " query heads over " << shape.heads_kv
                << " key/value heads (a multiple is needed)");
  TL_REQUIRE(shape.head_dim >= 1 && shape.head_dim <= 1024, op << ": head dim " << shape.head_dim << " is out of range");
  TL_REQUIRE(sharding.rows.total() == shape.seq,
             op << ": the sharding holds " << sharding.rows.total() << " positions, the sequence " << shape.seq);
  TL_REQUIRE(q_tile >= 1, op << ": tile sizes must be >= 1");
  TL_REQUIRE(compute_workers >= 1, op << ": the CPU backend needs at least one compute worker");
  return {rank, w, dtype, shape, sharding, 1.0f / std::sqrt(static_cast<float>(shape.head_dim))};
}

SpAttnPlan SpAttnPlan::make(int rank, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype,
                            const SpAttnConfig& config) {
  SpAttnPlan p;
  static_cast<AttnLayout&>(p) = AttnLayout::make("sp_attn", rank, shape, sharding, dtype, config.q_tile,
                                                 config.compute_workers);
  TL_REQUIRE(config.comm_tile_rows >= 1, "sp_attn: tile sizes must be >= 1");
  TL_REQUIRE(config.comm_workers >= 1, "sp_attn: the CPU backend needs at least one comm and one compute worker");
  p.config = config;
  // NOTE: the layout depends on the shapes and the sharding, never on the rank.
  LayoutBuilder b;
  for (int i = 0; i < shape.batch; ++i) {
    p.k[i] = AllGatherPlan::make(rank, sharding.rows, p.kv_row_bytes(), config.comm_tile_rows, config.mode);
    p.v[i] = AllGatherPlan::make(rank, sharding.rows, p.kv_row_bytes(), config.comm_tile_rows, config.mode);
    p.k[i].make_layout(b);
    p.v[i].make_layout(b);
  }
  p.barrier = b.add<Signal>(p.world_size);
  p.ws_bytes = b.num_bytes();
  return p;
}

RingAttnPlan RingAttnPlan::make(int rank, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype,
                                int q_tile, int compute_workers) {
  RingAttnPlan p;
  static_cast<AttnLayout&>(p) = AttnLayout::make("ring_attn", rank, shape, sharding, dtype, q_tile, compute_workers);
  p.q_tile = q_tile;
  p.compute_workers = compute_workers;
  LayoutBuilder b;
  p.k_slots = b.add<std::byte>(2 * p.slot_bytes());
  p.v_slots = b.add<std::byte>(2 * p.slot_bytes());
  p.filled = b.add<Signal>(2);
  p.consumed = b.add<Signal>(2);
  p.done = b.add<Signal>(compute_workers);
  p.barrier = b.add<Signal>(p.world_size);
  p.ws_bytes = b.num_bytes();
  return p;
}

const RowPartition& piece_parts(const SeqSharding& sh) {
  return sh.shard == SeqShard::kZigzag ? sh.chunks : sh.rows;
}

std::vector<QueryRun> query_runs(const AttnLayout& p) {
  const SeqSharding& sh = p.sharding;
  const int r = p.rank, w = p.world_size;
  std::vector<QueryRun> runs;
  auto add = [&](int64_t row0, int64_t rows, int64_t pos0) {
    if (rows > 0) runs.push_back({row0, rows, pos0});
  };
  if (sh.shard == SeqShard::kContiguous) {
    add(0, p.local_rows(), sh.rows.begin(r));
  } else if (p.shape.causal) {
    add(0, sh.chunks.size(r), sh.chunks.begin(r));
    add(sh.chunks.size(r), sh.chunks.size(2 * w - 1 - r), sh.chunks.begin(2 * w - 1 - r));
  } else {
    add(0, p.local_rows(), 0);
  }
  return runs;
}

std::vector<KeyPiece> key_pieces(const SeqSharding& sh, int owner) {
  const int w = sh.rows.world_size;
  const RowPartition& parts = piece_parts(sh);
  std::vector<KeyPiece> pieces;
  auto add = [&](int64_t row0, int part) {
    const RowRange pos{parts.begin(part), parts.end(part)};
    if (pos.size() > 0) pieces.push_back({row0, pos, part});
  };
  add(0, owner);
  if (sh.shard == SeqShard::kZigzag) add(sh.chunks.size(owner), 2 * w - 1 - owner);
  return pieces;
}

int64_t keys_needed(const AttnLayout& p) {
  if (!p.shape.causal) return p.shape.seq;
  int64_t end = 0;
  for (const QueryRun& q : query_runs(p)) end = std::max(end, q.pos_end());
  return end;
}

}  // namespace tilelink
