// MoE layers on one GPU: the routing kernel (ops/moe_route_cuda.hpp), the engine's grouped mode
// (compute/sm90/grouped_gemm.hpp) and the kernels between them, in the tables' fixed order
// (ops/moe_routing.hpp), so every path gives the same bits.
//
//   layer 0   out [rows, n] = X[token of row] · W1_eᵀ per expert (rows = tokens * topk, grouped)
//   layer 1   out [tokens, H] = Σ_slots weight · (H1 · W2_eᵀ)[row of the pair]: the grouped GEMM
//             into Y [rows, H], then the top-k reduce (a token's slots in order, fp32, one rounding)
//   mlp       layer 0 with W1 = [gate; up] ([experts, 2 F, H]), act = SiLU(gate) · up (fp32, one
//             rounding), layer 1 on act
//
// Paths:
//   kFused    layer 0 gathers X's rows in the grouped GEMM's load path (no gathered copy of X)
//   kOverlap  layer 0's gather kernel on kMoeGatherSms SMs writes X's rows in grouped order one
//             tile row (128 rows) at a time and notifies it; the grouped GEMM on the other SMs waits,
//             per tile, for its tile row (bounded wait, SignalField::kRowsReady), so the gather
//             runs beside the GEMM instead of before it (measured at 0.28-0.89 of kUnfused: the
//             gather on 8 SMs does not keep ahead; bench/notes/moe.md)
//   kAhead    layer 0's grouped GEMM copies X's rows into grouped order itself, ahead of its
//             tiles: every warp of its blocks first copies the tile rows of its first waves
//             (set_ahead_waves),
//             then the producer warps its loads leave idle copy the rest beside the mainloop; a
//             tile's TMA loads wait until its tile row is in (bounded, SignalField::kRowsReady).
//             The unfused pipeline's gather, hidden behind the GEMM but for its first waves.
//   kUnfused  a gather kernel writes X in grouped order, then the grouped GEMM reads it (the
//             pipeline of the unfused baseline)
//   kAuto     the path model's choice between kFused and kUnfused (layer0_path below): the
//             gathered load where the gather pass it saves is the larger, as on qwen3-30b-a3b
//             (bench/results/2026-12-06_h100_moe_auto_refit.md), else kUnfused
// Layer 1 is the same two kernels in both (on one GPU there is no ReduceScatter to overlap).
//
//   cuda::MoeLayer moe(tokens, hidden, ffn, experts, topk, DType::kBF16);
//   moe.route(topk_ids, stream);                       // no host sync: graph-capturable
//   moe.mlp(x, w1, w2, topk_weights, out, MoePath::kAuto, stream);
//
// Tokens with an id outside [0, experts) are not routed (the routing kernel's status says so):
// their rows are never computed and the reduce skips their slots.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tilelink/backend/cuda/epoch.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/compute/sm90/grouped_gemm.hpp"
#include "tilelink/prim/signal.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace tilelink::cuda {

enum class MoePath : uint8_t { kFused, kUnfused, kAuto, kOverlap, kAhead };
inline constexpr int kMoeGatherSms = 8;  // the SMs kOverlap's gather kernel keeps
inline constexpr int kMoeAheadWaves = 2;  // kAhead's prologue: the first waves' tile rows
const char* moe_path_name(MoePath path);

// Layer 1 over ranks, the top-k reduce beside the grouped GEMM (MoeLayer::topk_reduce_tiles with a
// link). The GEMM announces each stored tile (m, n) of group g at pair_done[(first_tile_rows[g] + m)
// * tiles_n + n] = the call's epoch (the engine's notify hook); a reduce tile of tokens [t0, t1)
// finds, per expert, the grouped rows of those tokens (a contiguous run: an expert's rows go by
// token) and so the tile rows they lie in, and waits for each of their tiles_n tiles (bounded,
// SignalField::kTileDone) before it reads Y. The tiles are claimed from *claims (zeroed before the
// call's first launch), so a launch on the GEMM's SMs after the GEMM takes what the reduce's own
// SMs have not.
struct MoeReduceLink {
  const Signal* pair_done = nullptr;
  int tiles_n = 0;          // the GEMM's column tiles over H
  unsigned* claims = nullptr;
  DeviceContext ctx;        // the waits' bound and fault record
};

class MoeLayer {
 public:
  // tokens M, hidden H, ffn F (this GPU's shard of each expert's F), experts, topk, bf16 or fp16.
  // Checks them (tilelink::Error) and allocates the tables and the intermediate buffers.
  MoeLayer(int64_t tokens, int64_t hidden, int64_t ffn, int experts, int topk, DType dtype);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // This call's routing: topk_ids [tokens, topk] (int32, device). The layers that follow on the
  // same stream use its tables.
  void route(const int32_t* topk_ids, cudaStream_t stream);

  // x [tokens, H]; w1 [experts, n, H]; out [rows, n] (rows past the routed ones untouched).
  void layer0(const void* x, const void* w1, int64_t n, void* out, MoePath path, cudaStream_t stream);
  // h1 [rows, F]; w2 [experts, H, F]; weights [tokens, topk] fp32; out [tokens, H].
  void layer1(const void* h1, const void* w2, const float* weights, void* out, cudaStream_t stream);
  // x [tokens, H]; w1 [experts, 2F, H] (gate rows, then up rows); w2 [experts, H, F]; out [tokens, H].
  void mlp(const void* x, const void* w1, const void* w2, const float* weights, void* out,
           MoePath path, cudaStream_t stream);
  // The path layer 0 of N n takes for `path`: kAuto resolved by the path model on one GPU
  // (tune/path_model.hpp, moe_layer0_one_gpu: the gathered load, kFused, where the gather pass it
  // saves outweighs its slower load on the real rows by moe_gathered_margin, else kUnfused); the
  // others kept.
  MoePath layer0_path(MoePath path, int64_t n) const;

  // The kernels between the GEMMs, for baselines built from other GEMMs: the gather of X into
  // grouped order (xs [rows, H]), the gated activation (h [rows, 2F] -> act [rows, F]) and the
  // top-k reduce (y [rows, H] -> out [tokens, H]).
  void gather(const void* x, void* xs, cudaStream_t stream) const;
  void activate(const void* h, void* act, cudaStream_t stream) const;
  void topk_reduce(const void* y, const float* weights, void* out, cudaStream_t stream) const;
  // The gated activation of f columns (h [rows, 2 f] -> act [rows, f]) over this layer's tables
  // (a layer whose own F is another, e.g. layer 0 of an MLP, whose F is 2 f).
  void activate_cols(const void* h, void* act, int64_t f, cudaStream_t stream) const;
  // The top-k reduce by tiles of tile_rows tokens on `blocks` blocks, tiles from first_tile on
  // (around), each announced once stored: tile_done[t] = epoch (release, system scope). The same
  // bits as topk_reduce.
  // With a link (MoeReduceLink below), the same beside layer 1's grouped GEMM: each tile first
  // waits for the GEMM tiles holding its tokens' rows, and the tiles are claimed from link.claims
  // (first_tile first, around) by every launch that shares it.
  void topk_reduce_tiles(const void* y, const float* weights, void* out, int tile_rows, int first_tile,
                         Signal* tile_done, Epoch epoch, int blocks, cudaStream_t stream,
                         const MoeReduceLink* link = nullptr) const;

  int64_t tokens() const { return tokens_; }
  int64_t rows() const { return tokens_ * topk_; }
  int64_t hidden() const { return hidden_; }
  int64_t ffn() const { return ffn_; }
  // kOverlap: the SMs its gather kernel keeps from the grouped GEMM (kMoeGatherSms unless set;
  // 1 to half the device's SMs).
  void set_gather_sms(int sms);
  int gather_sms() const { return gather_sms_; }
  // kAhead: the GEMM's waves whose tile rows every warp copies before the roles split
  // (kMoeAheadWaves unless set; 0: none, the producer's idle warps copy every row; a large count:
  // every row first, the gather and the GEMM in one launch).
  void set_ahead_waves(int waves);
  int ahead_waves() const { return ahead_waves_; }
  // The SMs the grouped GEMMs' persistent grids take (0: every SM of the device; a rank of a
  // world passes its own share: on virtual ranks its green context's, less what it leaves free).
  void set_gemm_sms(int sms);
  int gemm_sms() const { return gemm_sms_; }
  int experts() const { return experts_; }
  int topk() const { return topk_; }
  DType dtype() const { return dtype_; }
  // The routing's tables (device): offsets [experts + 1], pair_of_row and row_of_pair [rows],
  // status (0, or 1 + the first bad pair), first_tile_rows [experts + 1].
  const int64_t* offsets() const { return offsets_; }
  const int64_t* pair_of_row() const { return pair_of_row_; }
  const int64_t* row_of_pair() const { return row_of_pair_; }
  const int64_t* status() const { return status_; }
  const int* first_tile_rows() const { return first_tile_rows_; }
  // The intermediate buffers: the gathered X (unfused layer 0), layer 0's output in mlp, the
  // activations, Y.
  void* xs() const { return xs_; }
  void* h() const { return h_; }
  void* act() const { return act_; }
  void* y() const { return y_; }

  // Over ranks (layer 0): this call's grouped tile rows in the order their tokens arrive on rank
  // `rank` of a world whose ranks hold `tokens` (ops/moe_routing.hpp), into tile_row_order(), on
  // `stream` after route(). An op passes the table as GroupedGemmArgs::tile_row_order.
  void order_by_arrival(const RowPartition& tokens, int rank, cudaStream_t stream);
  // Over ranks (layer 1): the same in completion order (ops/moe_routing.hpp), so the grouped GEMM
  // stores first the rows of the tokens the top-k reduce takes first.
  void order_by_completion(const MoeCompletion& completion, cudaStream_t stream);
  const int* tile_row_order() const { return tile_row_order_; }

  // The grouped GEMM's arguments over this call's tables: A (gathered by a_rows / topk where
  // a_rows is set), B [experts, n, k], C [rows, n], on gemm_sms() SMs. For launches with hooks of
  // an op's own (ops/moe_ops_cuda.hpp).
  compute::sm90::GroupedGemmArgs grouped_args(const void* a, const int64_t* a_rows, const void* b,
                                              void* c, int64_t n, int64_t k) const;

 private:
  void layer0_overlap(const void* x, const void* w1, int64_t n, void* out, cudaStream_t stream);
  void layer0_ahead(const void* x, const void* w1, int64_t n, void* out, cudaStream_t stream);

  int64_t tokens_ = 0, hidden_ = 0, ffn_ = 0;
  int experts_ = 0, topk_ = 0;
  DType dtype_ = DType::kBF16;
  int64_t* counts_ = nullptr;
  int64_t* offsets_ = nullptr;
  int64_t* pair_of_row_ = nullptr;
  int64_t* row_of_pair_ = nullptr;
  int64_t* status_ = nullptr;
  int* first_tile_rows_ = nullptr;
  uint64_t* rows_ready_ = nullptr;  // kOverlap: a signal a grouped tile row; kAhead: its count, and the claims
  int* tile_row_order_ = nullptr;   // order_by_arrival: the walk's order of the tile rows
  uint8_t* arrival_keys_ = nullptr;  // its scratch: a tile row's arrival
  int64_t max_tile_rows_ = 0;
  int sms_ = 0;
  int gather_sms_ = kMoeGatherSms;
  int ahead_waves_ = kMoeAheadWaves;
  int gemm_sms_ = 0;
  MoePath auto_f_ = MoePath::kUnfused, auto_2f_ = MoePath::kUnfused;  // kAuto's layer 0 at N = F, 2F
  cudaStream_t side_ = nullptr;  // kOverlap: the gather's stream, forked from and joined to the caller's
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  void* scratch_ = nullptr;
  void* xs_ = nullptr;
  void* h_ = nullptr;
  void* act_ = nullptr;
  void* y_ = nullptr;
};

}  // namespace tilelink::cuda
