// The MoE plans' constructors (ops/moe_plan.hpp).
#include "tilelink/ops/moe_plan.hpp"

#include <algorithm>

#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink {

MoeLayerShape MoeLayerShape::make(const char* op, int rank, const RowPartition& tokens, int64_t hidden,
                                  int64_t ffn_local, int experts, int topk, DType dtype, int64_t min_tokens,
                                  int comm_workers, int compute_workers) {
  TL_REQUIRE(tokens.world_size >= 1 && rank >= 0 && rank < tokens.world_size,
             op << ": rank " << rank << " outside a world of " << tokens.world_size);
  TL_REQUIRE(hidden >= 1 && hidden <= (int64_t{1} << 30) / dtype_size(dtype),
             op << ": hidden size H = " << hidden << " is out of range");
  TL_REQUIRE(ffn_local >= 1 && ffn_local <= (int64_t{1} << 30) / dtype_size(dtype),
             op << ": rank " << rank << "'s F_r = " << ffn_local << " is out of range");
  TL_REQUIRE(experts >= 1, op << ": experts must be at least 1, got " << experts);
  TL_REQUIRE(topk >= 1 && topk <= experts,
             op << ": top-k must be in [1, experts = " << experts << "], got " << topk);
  TL_REQUIRE(tokens.total() >= min_tokens && tokens.total() <= (int64_t{1} << 40) / topk,
             op << ": " << tokens.total() << " tokens is out of range");
  TL_REQUIRE(comm_workers >= 1 && compute_workers >= 1,
             op << ": the CPU backend needs at least one comm and one compute worker");
  return {rank, tokens.world_size, dtype, hidden, ffn_local, experts, topk};
}

MoeAgGemmPlan MoeAgGemmPlan::make(int rank, const RowPartition& tokens, int64_t hidden,
                                  int64_t ffn_local, int experts, int topk, DType dtype,
                                  const MoeAgGemmConfig& config) {
  MoeAgGemmPlan p;
  static_cast<MoeLayerShape&>(p) = MoeLayerShape::make("moe_ag_gemm", rank, tokens, hidden, ffn_local, experts,
                                                       topk, dtype, 0, config.comm_workers, config.compute_workers);
  for (int v : {config.comm_tile_rows, config.tile_m, config.tile_n})
    TL_REQUIRE(v >= 1, "moe_ag_gemm: tile sizes must be >= 1, got " << v);
  p.config = config;
  p.ids = AllGatherPlan::make(rank, tokens, int64_t{topk} * 4, config.comm_tile_rows, config.mode);
  p.x = AllGatherPlan::make(rank, tokens, hidden * dtype_size(dtype), config.comm_tile_rows, config.mode);
  p.weights = AllGatherPlan::make(rank, tokens, int64_t{topk} * 4, config.comm_tile_rows, config.mode);
  // NOTE: the layout depends on (tokens, H, top-k, world, comm tiling), never on the rank.
  LayoutBuilder b;
  p.ids.make_layout(b);
  p.x.make_layout(b);
  p.weights.make_layout(b);
  p.barrier = b.add<Signal>(tokens.world_size);
  p.routed = b.add<Signal>(1);
  p.ws_bytes = b.num_bytes();
  return p;
}

MoeGemmRsPlan MoeGemmRsPlan::make(int rank, const RowPartition& tokens, int64_t hidden,
                                  int64_t ffn_local, int experts, int topk, DType dtype,
                                  const MoeGemmRsConfig& config) {
  MoeGemmRsPlan p;
  static_cast<MoeLayerShape&>(p) = MoeLayerShape::make("moe_gemm_rs", rank, tokens, hidden, ffn_local, experts,
                                                       topk, dtype, 0, config.comm_workers, config.compute_workers);
  for (int v : {config.tile_m, config.tile_n, config.reduce_tile_m, config.reduce_tile_n,
                config.band_rows, config.band_cols})
    TL_REQUIRE(v >= 1, "moe_gemm_rs: tile and band sizes must be >= 1, got " << v);
  p.config = config;
  if (tokens.total() == 0) {  // a batch of no tokens: nothing to compute or reduce, only the barrier
    p.rs.rank = rank, p.rs.world_size = tokens.world_size, p.rs.rows = tokens, p.rs.dtype = dtype;
    LayoutBuilder b;
    p.barrier = b.add<Signal>(tokens.world_size);
    p.ws_bytes = b.num_bytes();
    return p;
  }
  p.rs = ReduceScatterPlan::make(rank, tokens, hidden, dtype, config.mode, config.reduce_tile_m,
                                 config.reduce_tile_n, 1, config.band_rows, config.band_cols);
  const int next = (rank + 1) % tokens.world_size;
  p.reduce_order = TileOrder{p.rs.producer.tiles_m(), p.rs.producer.tiles_n(),
                             static_cast<int>(tokens.begin(next) / config.reduce_tile_m) %
                                 std::max(1, p.rs.producer.tiles_m()),
                             1};
  const int64_t max_tiles =
      DynamicTileGrid::max_num_tiles(tokens.total() * topk, experts, hidden, config.tile_m, config.tile_n);
  TL_REQUIRE(max_tiles <= (int64_t{1} << 30), "moe_gemm_rs: " << max_tiles << " pair tiles is out of range");
  p.max_pair_tiles = static_cast<int>(max_tiles);
  // NOTE: the layout depends on (tokens, H, experts, top-k, world, tiles), never on the rank.
  LayoutBuilder b;
  p.rs.make_layout(b);
  p.pair_done = b.add<Signal>(std::max(1, p.max_pair_tiles));
  p.barrier = b.add<Signal>(tokens.world_size);
  p.ws_bytes = b.num_bytes();
  return p;
}

}  // namespace tilelink
