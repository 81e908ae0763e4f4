// MoeAgGemmPlan::make (ops/moe_plan.hpp).
#include "tilelink/ops/moe_plan.hpp"

#include <algorithm>

#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink {

MoeAgGemmPlan MoeAgGemmPlan::make(int rank, const RowPartition& tokens, int64_t hidden,
                                  int64_t ffn_local, int experts, int topk, DType dtype,
                                  const MoeAgGemmConfig& config) {
  const char* op = "moe_ag_gemm";
  TL_REQUIRE(tokens.world_size >= 1 && rank >= 0 && rank < tokens.world_size,
             op << ": rank " << rank << " outside a world of " << tokens.world_size);
  TL_REQUIRE(hidden >= 1 && hidden <= (int64_t{1} << 30) / dtype_size(dtype),
             op << ": hidden size H = " << hidden << " is out of range");
  TL_REQUIRE(ffn_local >= 1, op << ": rank " << rank << "'s F_r = " << ffn_local << " must be >= 1");
  TL_REQUIRE(experts >= 1, op << ": experts must be at least 1, got " << experts);
  TL_REQUIRE(topk >= 1 && topk <= experts,
             op << ": top-k must be in [1, experts = " << experts << "], got " << topk);
  TL_REQUIRE(tokens.total() <= (int64_t{1} << 40) / topk, op << ": " << tokens.total() << " tokens is out of range");
  for (int v : {config.comm_tile_rows, config.tile_m, config.tile_n})
    TL_REQUIRE(v >= 1, op << ": tile sizes must be >= 1, got " << v);
  TL_REQUIRE(config.comm_workers >= 1 && config.compute_workers >= 1,
             op << ": the CPU backend needs at least one comm and one compute worker");
  MoeAgGemmPlan p;
  p.rank = rank;
  p.world_size = tokens.world_size;
  p.dtype = dtype;
  p.hidden = hidden;
  p.ffn = ffn_local;
  p.experts = experts;
  p.topk = topk;
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
  const char* op = "moe_gemm_rs";
  TL_REQUIRE(tokens.world_size >= 1 && rank >= 0 && rank < tokens.world_size,
             op << ": rank " << rank << " outside a world of " << tokens.world_size);
  TL_REQUIRE(hidden >= 1 && hidden <= (int64_t{1} << 30) / dtype_size(dtype),
             op << ": hidden size H = " << hidden << " is out of range");
  TL_REQUIRE(ffn_local >= 1 && ffn_local <= (int64_t{1} << 30) / dtype_size(dtype),
             op << ": rank " << rank << "'s F_r = " << ffn_local << " is out of range");
  TL_REQUIRE(experts >= 1, op << ": experts must be at least 1, got " << experts);
  TL_REQUIRE(topk >= 1 && topk <= experts,
             op << ": top-k must be in [1, experts = " << experts << "], got " << topk);
  TL_REQUIRE(tokens.total() >= 1 && tokens.total() <= (int64_t{1} << 40) / topk,
             op << ": " << tokens.total() << " tokens is out of range (at least one token: the "
                << "ReduceScatter's rows)");
  for (int v : {config.tile_m, config.tile_n, config.reduce_tile_m, config.reduce_tile_n,
                config.band_rows, config.band_cols})
    TL_REQUIRE(v >= 1, op << ": tile and band sizes must be >= 1, got " << v);
  TL_REQUIRE(config.comm_workers >= 1 && config.compute_workers >= 1,
             op << ": the CPU backend needs at least one comm and one compute worker");
  MoeGemmRsPlan p;
  p.rank = rank;
  p.world_size = tokens.world_size;
  p.dtype = dtype;
  p.hidden = hidden;
  p.ffn = ffn_local;
  p.experts = experts;
  p.topk = topk;
  p.config = config;
  p.rs = ReduceScatterPlan::make(rank, tokens, hidden, dtype, config.mode, config.reduce_tile_m,
                                 config.reduce_tile_n, 1, config.band_rows, config.band_cols);
  const int next = (rank + 1) % tokens.world_size;
  p.reduce_order = TileOrder{p.rs.producer.tiles_m(), p.rs.producer.tiles_n(),
                             static_cast<int>(tokens.begin(next) / config.reduce_tile_m) %
                                 std::max(1, p.rs.producer.tiles_m()),
                             1};
  const int64_t max_tiles =
      DynamicTileGrid::max_num_tiles(tokens.total() * topk, experts, hidden, config.tile_m, config.tile_n);
  TL_REQUIRE(max_tiles <= (int64_t{1} << 30), op << ": " << max_tiles << " pair tiles is out of range");
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
