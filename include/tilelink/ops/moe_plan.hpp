// MoeAgGemmPlan: the plan of a MoE layer's first half, fused AllGather + gather + grouped GEMM,
// shared by every backend.
//
// Rank r holds M_r tokens X_r [M_r, H] and their routing topk_ids_r [M_r, topk] (int32 expert ids,
// from the router), and for every expert e its shard of W1: W1_r[e] [F_r, H] (F split over the
// ranks, ragged allowed; one tensor [experts, F_r, H]). Every rank computes, for every pair
// (token, slot) of every rank's tokens, X[token] · W1_r[e]ᵀ, into the grouped rows of
// ops/moe_routing.hpp: out_r [M * topk, F_r], expert by expert, each expert's pairs by token and
// slot.
//
//   comm      two AllGathers over the token partition (comm/allgather.hpp), comm_tile_rows tokens
//             a tile: `ids` (the routing, topk * 4 bytes a token) and `x` (the hidden states)
//   routing   after every `ids` tile: the tables of moe_route, the same on every rank
//   tiles     a DynamicTileGrid over the grouped rows (groups = experts, rows = counts) and F_r,
//             tile_m x tile_n; a tile reads the X rows of its pairs' tokens, gathered by index
//   channels  a grouped tile waits on the `x` tiles holding its tokens (one per distinct comm tile
//             of its rows' tokens: a dynamic mapping, from the routing)
//   order     the tiles whose tokens all sit in earlier pull positions first: this rank's own
//             tokens, then rank + 1's, ... (the order the pull AllGather brings them)
//   workspace the two AllGathers' fields, the entry barrier [world] and `routed` (the tables are
//             made, for the compute workers that did not make them)
//
// Every call uses the next epoch; the routing may change from call to call.
#pragma once

#include "tilelink/comm/allgather.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/workspace.hpp"

namespace tilelink {

struct MoeAgGemmConfig {
  CommMode mode = CommMode::kPull;
  int comm_tile_rows = 64;  // tokens per communication tile
  int tile_m = 128;         // grouped rows per compute tile
  int tile_n = 128;         // F_r columns per compute tile
  int comm_workers = 1;     // CPU threads moving data
  int compute_workers = 1;  // CPU threads computing tiles
};

struct MoeAgGemmPlan {
  int rank = 0;
  int world_size = 1;
  DType dtype = DType::kBF16;  // X, W1 and out storage
  int64_t hidden = 0;          // H (the GEMM's K)
  int64_t ffn = 0;             // F_r: this rank's output columns
  int experts = 0;
  int topk = 0;
  AllGatherPlan ids;  // routing rows: topk int32 a token
  AllGatherPlan x;    // hidden states: H elements a token
  Field<Signal> barrier;  // the entry barrier of each call
  Field<Signal> routed;   // one: this rank's routing tables are made (compute workers wait on it)
  uint64_t ws_bytes = 0;
  MoeAgGemmConfig config;

  // Host constructor: checks every input and throws tilelink::Error with a clear message.
  static MoeAgGemmPlan make(int rank, const RowPartition& tokens, int64_t hidden, int64_t ffn_local,
                            int experts, int topk, DType dtype, const MoeAgGemmConfig& config);
  TL_HD int64_t tokens() const { return x.m(); }
  TL_HD int64_t rows() const { return tokens() * topk; }  // grouped rows of the output
  // The position of `token`'s comm tile in this rank's pull order (0: its own tokens).
  TL_HD int arrival_of(int64_t token) const {
    const int owner = x.tiles.rank_of(x.tiles.tile_of_row(token));
    return (owner - rank + world_size) % world_size;
  }
};

}  // namespace tilelink
