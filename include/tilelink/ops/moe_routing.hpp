// MoE routing: the tables that map a MoE layer's grouped GEMM rows to (token, slot) pairs, the
// dynamic mappings of the MoE ops (docs/mappings.md).
//
// `tokens` tokens are each routed to `topk` experts of `experts`: topk_ids [tokens, topk],
// row-major, expert ids in [0, experts). A pair is p = token * topk + slot. The grouped rows are the
// pairs sorted by expert and, within an expert, by p: a fixed order, so every rank and every backend
// derive the same tables from the same ids, and the top-k reduce sums a token's rows in slot order.
//
//   counts[e]        pairs routed to expert e                                  [experts]
//   offsets[e]       expert e's grouped rows are [offsets[e], offsets[e + 1])  [experts + 1]
//   pair_of_row[i]   the pair grouped row i computes                           [tokens * topk]
//   row_of_pair[p]   the grouped row of pair p                                 [tokens * topk]
//
// The offsets are a DynamicRowPartition's table (`DynamicRowPartition{experts, offsets}`), from
// which fill_first_tiles makes a DynamicTileGrid's (core/dynamic_tile_grid.hpp).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "tilelink/core/config.hpp"
#include "tilelink/core/grouped_walk.hpp"
#include "tilelink/core/partition.hpp"

namespace tilelink {

// One writer (a CPU thread or one device thread) fills the tables, in O(tokens * topk + experts)
// with no scratch memory (counts serves as the placing cursor, then holds the counts again).
// Returns false if an id is outside [0, experts) or a count is negative (tables then unspecified).
TL_HD inline bool moe_route(const int32_t* topk_ids, int64_t tokens, int topk, int experts,
                            int64_t* counts, int64_t* offsets, int64_t* pair_of_row,
                            int64_t* row_of_pair) {
  if (tokens < 0 || topk < 1 || experts < 1) return false;
  const int64_t pairs = tokens * topk;
  for (int e = 0; e < experts; ++e) counts[e] = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = topk_ids[p];
    if (e < 0 || e >= experts) return false;
    ++counts[e];
  }
  offsets[0] = 0;
  for (int e = 0; e < experts; ++e) offsets[e + 1] = offsets[e] + counts[e];
  for (int e = 0; e < experts; ++e) counts[e] = offsets[e];  // the cursor of each expert's rows
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t row = counts[topk_ids[p]]++;
    pair_of_row[row] = p;
    row_of_pair[p] = row;
  }
  for (int e = 0; e < experts; ++e) counts[e] -= offsets[e];
  return true;
}

// The tables on the host.
struct MoeRouting {
  int64_t tokens = 0;
  int topk = 0, experts = 0;
  std::vector<int64_t> counts, offsets, pair_of_row, row_of_pair;

  int64_t rows() const { return tokens * topk; }
  // The token whose hidden state grouped row i reads (layer 0 gathers X by it).
  int64_t token_of_row(int64_t i) const { return pair_of_row[i] / topk; }
};

// Checks everything (ids in range, topk_ids.size() == tokens * topk, topk in [1, experts],
// experts >= 1) and throws tilelink::Error naming the token and slot of a bad id.
MoeRouting moe_route(std::span<const int32_t> topk_ids, int64_t tokens, int topk, int experts);

// Arrival order (layer 0 over ranks: the grouped GEMM on rank `rank` reads the gathered tokens of
// every rank, whose segments arrive in the AllGather's pull order, the rank's own first, then
// rank + 1, ...). A grouped row's arrival is its token's owner's position in that order; a grouped
// tile row's (tile_rows rows of one group, ops over offsets with the first-tile table `first`,
// core/grouped_walk.hpp) the latest of its rows'. The grouped GEMM walks the tile rows stably by
// it (moe_arrival_row_order; cuda::moe_arrival_order_async is the device form), so the tiles of
// the rank's own tokens go first and none waits behind a tile that waits longer.
TL_HD inline int moe_row_arrival(const int64_t* pair_of_row, int topk, const RowPartition& tokens, int rank,
                                 int64_t row) {
  const int owner = tokens.owner_of_row(pair_of_row[row] / topk);
  return (owner - rank + tokens.world_size) % tokens.world_size;
}

// The grouped rows [begin, end) of tile row t (0 <= t < first[groups]).
struct MoeTileRowSpan {
  int64_t begin, end;
};
TL_HD inline MoeTileRowSpan moe_tile_row_span(const int64_t* offsets, const int* first, int groups, int tile_rows,
                                              int t) {
  const int g = grouped_group_of_row(first, groups, t);
  const int64_t begin = offsets[g] + int64_t{t - first[g]} * tile_rows;
  const int64_t end = begin + tile_rows < offsets[g + 1] ? begin + tile_rows : offsets[g + 1];
  return {begin, end};
}

// The host form: the tile rows [0, first[experts]) stably by arrival. offsets and first: the
// routing's tables (MoeRouting::offsets; first[e] = the tile rows before expert e).
std::vector<int> moe_arrival_row_order(std::span<const int64_t> offsets, std::span<const int> first, int tile_rows,
                                       std::span<const int64_t> pair_of_row, int topk, const RowPartition& tokens,
                                       int rank);

// Completion order (layer 1 over ranks: the top-k reduce takes its tiles of `reduce_rows` tokens
// from tile `first_tile` on, around, beside the grouped GEMM, and a reduce tile can start once the
// GEMM has stored every row of its tokens). A token's completion is its reduce tile's place in that
// walk, scaled to `keys` steps (at most kMoeOrderKeys); a grouped tile row's the earliest of its
// rows'. Walked stably by it, the grouped GEMM finishes first the tokens the reduce takes first: a
// reduce tile of place p waits only on tile rows of completion <= p's. (Arrival takes the latest,
// since a tile row can start only when all its tokens are in; completion the earliest, since the
// first reduce tile to need a row is the one it must not hold up.)
inline constexpr int kMoeOrderKeys = 64;
struct MoeCompletion {
  int64_t tokens = 0;    // M
  int reduce_rows = 1;   // tokens a reduce tile
  int first_tile = 0;    // the reduce's first tile
  int keys = 1;          // min(reduce tiles, max_keys)

  // max_keys (1 to kMoeOrderKeys): fewer keys keep more of each expert's tile rows together (the
  // grouped GEMM's bands reuse an expert's weights in L2 only over its own rows), more let the
  // reduce start sooner; 1 is the expert-by-expert walk.
  static MoeCompletion make(int64_t tokens, int reduce_rows, int first_tile, int max_keys = kMoeOrderKeys) {
    MoeCompletion c{tokens, reduce_rows < 1 ? 1 : reduce_rows, first_tile, 1};
    const int64_t tiles = c.tiles(), most = max_keys < 1 ? 1 : (max_keys > kMoeOrderKeys ? kMoeOrderKeys : max_keys);
    c.keys = static_cast<int>(tiles < most ? (tiles < 1 ? 1 : tiles) : most);
    return c;
  }
  TL_HD int64_t tiles() const { return (tokens + reduce_rows - 1) / reduce_rows; }
  // What the orders require (make() gives it for any first_tile in [0, tiles())).
  TL_HD bool valid() const {
    return tokens >= 1 && reduce_rows >= 1 && keys >= 1 && keys <= kMoeOrderKeys && first_tile >= 0 &&
           first_tile < tiles();
  }
  // The key of `token` (0 <= token < tokens): its reduce tile's place, in keys steps.
  TL_HD int of_token(int64_t token) const {
    const int64_t n = tiles();
    const int64_t place = ((token / reduce_rows - first_tile) % n + n) % n;
    return static_cast<int>(place * keys / n);
  }
};
TL_HD inline int moe_row_completion(const int64_t* pair_of_row, int topk, const MoeCompletion& c, int64_t row) {
  return c.of_token(pair_of_row[row] / topk);
}
// The host form: the tile rows [0, first[experts]) stably by completion.
std::vector<int> moe_completion_row_order(std::span<const int64_t> offsets, std::span<const int> first, int tile_rows,
                                          std::span<const int64_t> pair_of_row, int topk, const MoeCompletion& c);

// Routings for tests and benchmarks: topk distinct experts per token, drawn from `gen` by a pattern.
//   uniform        every expert alike
//   skewed         expert e drawn with weight 1 / (1 + e): the low ids take most pairs
//   one-expert     every token's first slot is expert 0 (it takes every token), the others uniform
//   empty-experts  only the first max(topk, experts / 2) experts are drawn; the rest get nothing
enum class MoeRoutingPattern { kUniform, kSkewed, kOneExpert, kEmptyExperts };
const char* moe_routing_name(MoeRoutingPattern pattern);
// The pattern of a name above; throws tilelink::Error listing the names.
MoeRoutingPattern moe_routing_pattern(std::string_view name);
// topk_ids [tokens, topk]; checks topk in [1, experts] (tilelink::Error).
std::vector<int32_t> moe_draw_routing(std::mt19937_64& gen, int64_t tokens, int topk, int experts,
                                      MoeRoutingPattern pattern);

}  // namespace tilelink
