// The CPU compute of a MoE layer: the grouped GEMM over routed rows and the top-k reduce, the
// reference of the MoE ops (ops/moe_routing.hpp gives the tables).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tilelink/core/dtype.hpp"
#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/tile.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace tilelink {

// One expert's weights: [n, k] row-major (row stride ld elements; 0: k), an nn.Linear weight.
struct ExpertWeight {
  const void* w = nullptr;
  int64_t ld = 0;
};

// The grouped GEMM: for every expert e and grouped row i in [offsets[e], offsets[e + 1]),
// out[i, :] = A[a_row(i), :] · W_eᵀ, where a_row(i) = a_rows[i] (or i where a_rows is empty).
// A [*, k] (row stride lda), out [rows, n] (row stride ldo), all of `dtype`; fp32 accumulation in
// ascending k, one rounding (gemm_tile_cpu's bits). Layer 0 passes the token of each row
// (MoeRouting::token_of_row) to gather X; layer 1 passes none.
void moe_grouped_gemm_cpu(const void* a, int64_t lda, std::span<const int64_t> a_rows,
                          std::span<const int64_t> offsets, std::span<const ExpertWeight> weights,
                          void* out, int64_t ldo, int64_t n, int64_t k, DType dtype);

// One rect of the grouped GEMM, every row of it in expert `w`'s group: out[i, c] for i in
// [r.row, r.row + r.rows), c in [r.col, r.col + r.cols) (out: the whole [rows, *] output, row stride
// ldo), the same bits as moe_grouped_gemm_cpu.
void moe_grouped_gemm_rect_cpu(const void* a, int64_t lda, std::span<const int64_t> a_rows,
                               const ExpertWeight& w, const Rect& r, void* out, int64_t ldo, int64_t k,
                               DType dtype);

// A routing and the grouped GEMM's tiles over it: a DynamicTileGrid whose groups are the experts'
// grouped rows (tile_m x tile_n over [rows, extent_n]), and the token of every grouped row.
// Not copyable: the grid points into the tables.
struct MoeGroupedTiles {
  MoeRouting routing;
  std::vector<int> first;       // the grid's first-tile table
  std::vector<int64_t> tokens;  // tokens[i]: the token grouped row i reads (layer 0's gather)
  DynamicTileGrid grid;

  MoeGroupedTiles(MoeRouting routing, int64_t extent_n, int tile_m, int tile_n);
  MoeGroupedTiles(const MoeGroupedTiles&) = delete;
  MoeGroupedTiles& operator=(const MoeGroupedTiles&) = delete;
  // The tile holding grouped row i in column tile n.
  int tile_of(int64_t i, int n) const;
  // The grid's first-tile table in tile rows (what the tile-row orders of ops/moe_routing.hpp take).
  std::vector<int> first_rows() const;
  // The tile ids walked by tile rows in `rows` order, each row's tiles in column order.
  std::vector<int> tiles_by_rows(std::span<const int> rows) const;
};

// The top-k reduce: out[t, j] = Σ_s weights[t * topk + s] · y[row_of_pair[t * topk + s], j], the
// slots in order, fp32 accumulation, one rounding to `dtype`. y [rows, n] (row stride ldy), out
// [tokens, n] (row stride ldo), weights fp32 [tokens, topk].
void moe_topk_reduce_cpu(const void* y, int64_t ldy, const MoeRouting& routing,
                         std::span<const float> weights, void* out, int64_t ldo, int64_t n,
                         DType dtype);
// One rect of it: tokens [r.row, r.row + r.rows), columns [r.col, r.col + r.cols), into out (the
// rect's first element, row stride ldo); the same bits as the whole reduce.
void moe_topk_reduce_rect_cpu(const void* y, int64_t ldy, const MoeRouting& routing, const float* weights,
                              const Rect& r, void* out, int64_t ldo, DType dtype);

// Float64 references (the checks' side): the grouped GEMM's rows and the reduce, from the same
// storage, every product and sum in double.
std::vector<double> moe_grouped_gemm_f64(const void* a, int64_t lda, std::span<const int64_t> a_rows,
                                         std::span<const int64_t> offsets,
                                         std::span<const ExpertWeight> weights, int64_t n, int64_t k,
                                         DType dtype);
std::vector<double> moe_topk_reduce_f64(std::span<const double> y, const MoeRouting& routing,
                                        std::span<const float> weights, int64_t n);

// Layer 0 of one rank in float64: every grouped row's token of X [tokens, H] times its expert's
// W1 shard (w1: [experts, n, H]), [rows, n] in the routing's grouped order (empty without rows).
std::vector<double> moe_layer0_f64(const void* x, const MoeRouting& routing, const void* w1, int64_t hidden,
                                   int64_t n, DType dtype);

// One rank's share of the layers in float64 (tensor parallel over F, F_r = ffn_local), its
// partial [tokens, H] before the ReduceScatter sums the ranks:
//   layer 1:  the top-k reduce of h1 [rows, F_r] · W2_eᵀ (w2: [experts, H, F_r])
//   the MLP:  X · W1_eᵀ (w1: [experts, 2 F_r, H], gate rows then up rows), SiLU(gate) · up, then
//             layer 1 on those activations in double (not rounded to dtype)
std::vector<double> moe_layer1_partial_f64(const void* h1, const MoeRouting& routing, const void* w2,
                                           std::span<const float> weights, int64_t hidden, int64_t ffn_local,
                                           DType dtype);
std::vector<double> moe_mlp_partial_f64(const void* x, const MoeRouting& routing, const void* w1, const void* w2,
                                        std::span<const float> weights, int64_t hidden, int64_t ffn_local,
                                        DType dtype);

}  // namespace tilelink
