// MoeAgGemmPlan: the plan of a MoE layer's first half, fused AllGather + gather + grouped GEMM,
// shared by every backend.
//
// Rank r holds M_r tokens X_r [M_r, H] and their routing topk_ids_r [M_r, topk] (int32 expert ids,
// from the router) and topk_weights_r [M_r, topk] (fp32, gathered for the layer 1 that follows), and for every expert e its shard of W1: W1_r[e] [F_r, H] (F split over the
// ranks, ragged allowed; one tensor [experts, F_r, H]). Every rank computes, for every pair
// (token, slot) of every rank's tokens, X[token] · W1_r[e]ᵀ, into the grouped rows of
// ops/moe_routing.hpp: out_r [M * topk, F_r], expert by expert, each expert's pairs by token and
// slot.
//
//   comm      three AllGathers over the token partition (comm/allgather.hpp), comm_tile_rows
//             tokens a tile: `ids` (topk * 4 bytes a token), `x` (the hidden states), `weights`
//             (topk * 4 bytes a token; last: the compute does not read them)
//   routing   after every `ids` tile: the tables of moe_route, the same on every rank
//   tiles     a DynamicTileGrid over the grouped rows (groups = experts, rows = counts) and F_r,
//             tile_m x tile_n; a tile reads the X rows of its pairs' tokens, gathered by index
//   channels  a grouped tile waits on the `x` tiles holding its tokens (one per distinct comm tile
//             of its rows' tokens: a dynamic mapping, from the routing)
//   order     the tiles whose tokens all sit in earlier pull positions first: this rank's own
//             tokens, then rank + 1's, ... (the order the pull AllGather brings them)
//   workspace the three AllGathers' fields, the entry barrier [world] and `routed` (the tables are
//             made, for the compute workers that did not make them)
//
// Every call uses the next epoch; the routing may change from call to call.
#pragma once

#include "tilelink/comm/allgather.hpp"
#include "tilelink/comm/reduce_scatter.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/core/workspace.hpp"

namespace tilelink {

// What both layers' plans share: the rank, the world, the storage type and the layer's shape.
struct MoeLayerShape {
  int rank = 0;
  int world_size = 1;
  DType dtype = DType::kBF16;
  int64_t hidden = 0;  // H
  int64_t ffn = 0;     // F_r: this rank's shard of each expert's F
  int experts = 0;
  int topk = 0;
  // Checks them for `op` (tilelink::Error); min_tokens: the fewest tokens the layer takes.
  static MoeLayerShape make(const char* op, int rank, const RowPartition& tokens, int64_t hidden,
                            int64_t ffn_local, int experts, int topk, DType dtype, int64_t min_tokens,
                            int comm_workers, int compute_workers);
};

struct MoeAgGemmConfig {
  CommMode mode = CommMode::kPull;
  int comm_tile_rows = 64;  // tokens per communication tile
  int tile_m = 128;         // grouped rows per compute tile
  int tile_n = 128;         // F_r columns per compute tile
  int comm_workers = 1;     // CPU threads moving data
  int compute_workers = 1;  // CPU threads computing tiles
};

// hidden: the GEMM's K; ffn: this rank's output columns; dtype: X, W1 and out.
struct MoeAgGemmPlan : MoeLayerShape {
  AllGatherPlan ids;  // routing rows: topk int32 a token
  AllGatherPlan x;    // hidden states: H elements a token
  AllGatherPlan weights;  // routing weights: topk fp32 a token
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

// MoeGemmRsPlan: the plan of a MoE layer's second half, fused grouped GEMM + top-k reduce +
// ReduceScatter, shared by every backend.
//
// Rank r holds the grouped rows of its F shard, H1_r [M * topk, F_r] (layer 0's output after the
// activation, in the grouped order of ops/moe_routing.hpp), for every expert its shard of W2:
// W2_r[e] [H, F_r] (one tensor [experts, H, F_r]), and the routing of every token: topk_ids and
// topk_weights [M, topk] (the same on every rank). Each rank computes Y_r = H1_r · W2_r[e]ᵀ per
// expert [M * topk, H], combines each token's topk rows with its weights in slot order (the top-k
// reduce) into a partial P_r [M, H], and a ReduceScatter returns to rank r its M_r rows of
// Σ_s P_s, ranks summed in rank order in fp32: C_r [M_r, H].
//
//   pair tiles   a DynamicTileGrid over the grouped rows (groups = experts) and H, tile_m x tile_n;
//                tile t announced on `pair_done[t]` (this rank's) once its Y rows are stored
//   reduce tiles the ReduceScatter's producer grid over P [M, H], reduce_tile_m tokens x
//                reduce_tile_n columns; a tile waits on the pair tiles holding its tokens' rows
//                (a dynamic mapping, from the routing), sums them, and is published to the
//                ReduceScatter (comm/reduce_scatter.hpp)
//   order        reduce tiles from the segment of rank + 1 on (the owner the ReduceScatter serves
//                first); pair tiles by tile rows in completion order (moe_completion_row_order:
//                first the rows of the tokens the reduce takes first), each row's in column order
//   workspace    the ReduceScatter's fields, `pair_done` [max pair tiles], the entry barrier
struct MoeGemmRsConfig {
  CommMode mode = CommMode::kPull;
  int tile_m = 128;         // grouped rows per pair tile
  int tile_n = 128;         // H columns per pair tile
  int reduce_tile_m = 64;   // tokens per reduce tile (the ReduceScatter's producer tile)
  int reduce_tile_n = 128;  // H columns per reduce tile
  int band_rows = 32;       // the ReduceScatter's items
  int band_cols = 512;
  int comm_workers = 1;
  int compute_workers = 1;
};

// hidden: the output's columns; ffn: the GEMM's K on this rank.
struct MoeGemmRsPlan : MoeLayerShape {
  ReduceScatterPlan rs;     // over the tokens' rows of P [M, H]
  TileOrder reduce_order;   // over rs.producer
  Field<Signal> pair_done;  // [max_pair_tiles]
  int max_pair_tiles = 0;
  Field<Signal> barrier;
  uint64_t ws_bytes = 0;
  MoeGemmRsConfig config;

  static MoeGemmRsPlan make(int rank, const RowPartition& tokens, int64_t hidden, int64_t ffn_local,
                            int experts, int topk, DType dtype, const MoeGemmRsConfig& config);
  TL_HD int64_t tokens() const { return rs.m(); }
  TL_HD int64_t rows() const { return tokens() * topk; }
};

}  // namespace tilelink
