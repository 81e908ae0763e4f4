// MoeAgGemmPlan::make (ops/moe_plan.hpp).
#include "tilelink/ops/moe_plan.hpp"

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
  // NOTE: the layout depends on (tokens, H, top-k, world, comm tiling), never on the rank.
  LayoutBuilder b;
  p.ids.make_layout(b);
  p.x.make_layout(b);
  p.barrier = b.add<Signal>(tokens.world_size);
  p.routed = b.add<Signal>(1);
  p.ws_bytes = b.num_bytes();
  return p;
}

}  // namespace tilelink
