// The CPU compute of a MoE layer (compute/cpu_moe.hpp).
#include "tilelink/compute/cpu_moe.hpp"

#include <cmath>
#include <utility>

#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink {

namespace {

void check_grouped(std::span<const int64_t> a_rows, std::span<const int64_t> offsets,
                   std::span<const ExpertWeight> weights, int64_t n, int64_t k) {
  TL_REQUIRE(!offsets.empty() && offsets.size() == weights.size() + 1,
             "moe grouped gemm: " << offsets.size() << " offsets for " << weights.size()
                                  << " experts (experts + 1 needed)");
  TL_REQUIRE(offsets.front() == 0, "moe grouped gemm: offsets must start at 0");
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    TL_REQUIRE(offsets[e + 1] >= offsets[e], "moe grouped gemm: offsets decrease at expert " << e);
  TL_REQUIRE(a_rows.empty() || static_cast<int64_t>(a_rows.size()) == offsets.back(),
             "moe grouped gemm: " << a_rows.size() << " row indices for " << offsets.back()
                                  << " grouped rows");
  TL_REQUIRE(n >= 1 && k >= 1, "moe grouped gemm: n and k must be positive, got " << n << ", " << k);
  for (size_t e = 0; e < weights.size(); ++e) {
    TL_REQUIRE(weights[e].w != nullptr || offsets[e + 1] == offsets[e],
               "moe grouped gemm: expert " << e << " has rows but no weight");
    TL_REQUIRE(weights[e].ld == 0 || weights[e].ld >= k,
               "moe grouped gemm: expert " << e << "'s row stride " << weights[e].ld << " < k " << k);
  }
}

void check_reduce(const MoeRouting& r, std::span<const float> weights) {
  TL_REQUIRE(static_cast<int64_t>(weights.size()) == r.tokens * r.topk,
             "moe top-k reduce: " << weights.size() << " weights for " << r.tokens << " tokens x top-k "
                                  << r.topk);
  TL_REQUIRE(static_cast<int64_t>(r.row_of_pair.size()) == r.tokens * r.topk,
             "moe top-k reduce: the routing's tables do not match its tokens");
}

}  // namespace

void moe_grouped_gemm_rect_cpu(const void* a, int64_t lda, std::span<const int64_t> a_rows,
                               const ExpertWeight& w, const Rect& r, void* out, int64_t ldo, int64_t k,
                               DType dtype) {
  const int64_t es = dtype_size(dtype), ldw = w.ld ? w.ld : k;
  const auto* abytes = static_cast<const char*>(a);
  const auto* wbytes = static_cast<const char*>(w.w) + r.col * ldw * es;
  auto* obytes = static_cast<char*>(out);
  for (int64_t i = r.row; i < r.row + r.rows; ++i) {
    const int64_t src = a_rows.empty() ? i : a_rows[i];
    // one row at a time: a gathered row has no neighbour in A to share a tile with
    gemm_tile_cpu(abytes + src * lda * es, lda, wbytes, ldw, obytes + (i * ldo + r.col) * es, ldo, dtype, 1,
                  r.cols, k);
  }
}

void moe_grouped_gemm_cpu(const void* a, int64_t lda, std::span<const int64_t> a_rows,
                          std::span<const int64_t> offsets, std::span<const ExpertWeight> weights,
                          void* out, int64_t ldo, int64_t n, int64_t k, DType dtype) {
  check_grouped(a_rows, offsets, weights, n, k);
  for (size_t e = 0; e < weights.size(); ++e)
    moe_grouped_gemm_rect_cpu(a, lda, a_rows, weights[e], Rect{offsets[e], 0, offsets[e + 1] - offsets[e], n},
                              out, ldo, k, dtype);
}

MoeGroupedTiles::MoeGroupedTiles(MoeRouting r, int64_t extent_n, int tile_m, int tile_n)
    : routing(std::move(r)), first(routing.experts + 1), tokens(routing.rows()) {
  for (int64_t i = 0; i < routing.rows(); ++i) tokens[i] = routing.token_of_row(i);
  grid = DynamicTileGrid::make(DynamicRowPartition{routing.experts, routing.offsets.data()}, extent_n, tile_m,
                               tile_n, first.data());
  fill_first_tiles(grid, std::span<int>(first));
}

int MoeGroupedTiles::tile_of(int64_t i, int n) const {
  const int e = grid.rows.owner_of_row(i);
  return grid.linear(GroupTileCoord{e, static_cast<int>((i - grid.rows.begin(e)) / grid.tile_m), n});
}

std::vector<int> MoeGroupedTiles::first_rows() const {
  std::vector<int> rows(first.size());
  for (size_t g = 0; g < rows.size(); ++g) rows[g] = first[g] / grid.tiles_n();
  return rows;
}

std::vector<int> MoeGroupedTiles::tiles_by_rows(std::span<const int> rows) const {
  const int tiles_n = grid.tiles_n();
  std::vector<int> order;
  order.reserve(rows.size() * tiles_n);
  for (int row : rows)
    for (int n = 0; n < tiles_n; ++n) order.push_back(row * tiles_n + n);
  return order;
}

void moe_topk_reduce_rect_cpu(const void* y, int64_t ldy, const MoeRouting& rt, const float* weights,
                              const Rect& r, void* out, int64_t ldo, DType dtype) {
  for (int64_t t = r.row; t < r.row + r.rows; ++t)
    for (int64_t j = 0; j < r.cols; ++j) {
      float acc = 0.0f;
      for (int s = 0; s < rt.topk; ++s) {
        const int64_t p = t * rt.topk + s;
        acc += weights[p] * load_as_float(y, dtype, rt.row_of_pair[p] * ldy + r.col + j);
      }
      store_from_float(out, dtype, (t - r.row) * ldo + j, acc);
    }
}

void moe_topk_reduce_cpu(const void* y, int64_t ldy, const MoeRouting& r,
                         std::span<const float> weights, void* out, int64_t ldo, int64_t n,
                         DType dtype) {
  check_reduce(r, weights);
  moe_topk_reduce_rect_cpu(y, ldy, r, weights.data(), Rect{0, 0, r.tokens, n}, out, ldo, dtype);
}

std::vector<double> moe_grouped_gemm_f64(const void* a, int64_t lda, std::span<const int64_t> a_rows,
                                         std::span<const int64_t> offsets,
                                         std::span<const ExpertWeight> weights, int64_t n, int64_t k,
                                         DType dtype) {
  check_grouped(a_rows, offsets, weights, n, k);
  std::vector<double> c(offsets.back() * n, 0.0);
  for (size_t e = 0; e < weights.size(); ++e) {
    const int64_t ldw = weights[e].ld ? weights[e].ld : k;
    for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i) {
      const int64_t src = a_rows.empty() ? i : a_rows[i];
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t q = 0; q < k; ++q)
          acc += static_cast<double>(load_as_float(a, dtype, src * lda + q)) *
                 load_as_float(weights[e].w, dtype, j * ldw + q);
        c[i * n + j] = acc;
      }
    }
  }
  return c;
}

std::vector<double> moe_topk_reduce_f64(std::span<const double> y, const MoeRouting& r,
                                        std::span<const float> weights, int64_t n) {
  check_reduce(r, weights);
  TL_REQUIRE(static_cast<int64_t>(y.size()) == r.rows() * n,
             "moe top-k reduce: y holds " << y.size() << " values, rows x n = " << r.rows() * n);
  std::vector<double> out(r.tokens * n, 0.0);
  for (int64_t t = 0; t < r.tokens; ++t)
    for (int s = 0; s < r.topk; ++s) {
      const int64_t p = t * r.topk + s;
      for (int64_t j = 0; j < n; ++j) out[t * n + j] += weights[p] * y[r.row_of_pair[p] * n + j];
    }
  return out;
}

namespace {

// Expert e's [n, k] block of a stacked [experts, n, k] weight tensor.
std::vector<ExpertWeight> stacked_experts(const void* w, int experts, int64_t n, int64_t k, DType dtype) {
  std::vector<ExpertWeight> ws(experts);
  for (int e = 0; e < experts; ++e) ws[e] = {static_cast<const std::byte*>(w) + e * n * k * dtype_size(dtype), 0};
  return ws;
}

// Layer 1 in double on double inputs: y[i, c] = Σ_j act[i, j] · W2_e[c, j], then the top-k reduce.
std::vector<double> layer1_f64(std::span<const double> act, const MoeRouting& rt, const void* w2,
                               std::span<const float> weights, int64_t h, int64_t f, DType dtype) {
  const std::vector<ExpertWeight> ws = stacked_experts(w2, rt.experts, h, f, dtype);
  std::vector<double> y(rt.rows() * h, 0.0);
  for (int e = 0; e < rt.experts; ++e)
    for (int64_t i = rt.offsets[e]; i < rt.offsets[e + 1]; ++i)
      for (int64_t c = 0; c < h; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < f; ++j) acc += act[i * f + j] * load_as_float(ws[e].w, dtype, c * f + j);
        y[i * h + c] = acc;
      }
  return moe_topk_reduce_f64(y, rt, weights, h);
}

}  // namespace

std::vector<double> moe_layer1_partial_f64(const void* h1, const MoeRouting& rt, const void* w2,
                                           std::span<const float> weights, int64_t h, int64_t f, DType dtype) {
  if (rt.rows() == 0) return std::vector<double>(rt.tokens * h, 0.0);
  const std::vector<double> y =
      moe_grouped_gemm_f64(h1, f, {}, rt.offsets, stacked_experts(w2, rt.experts, h, f, dtype), h, f, dtype);
  return moe_topk_reduce_f64(y, rt, weights, h);
}

std::vector<double> moe_layer0_f64(const void* x, const MoeRouting& rt, const void* w1, int64_t h, int64_t n,
                                   DType dtype) {
  if (rt.rows() == 0) return {};
  std::vector<int64_t> a_rows(rt.rows());
  for (int64_t i = 0; i < rt.rows(); ++i) a_rows[i] = rt.token_of_row(i);
  return moe_grouped_gemm_f64(x, h, a_rows, rt.offsets, stacked_experts(w1, rt.experts, n, h, dtype), n, h, dtype);
}

std::vector<double> moe_mlp_partial_f64(const void* x, const MoeRouting& rt, const void* w1, const void* w2,
                                        std::span<const float> weights, int64_t h, int64_t f, DType dtype) {
  if (rt.rows() == 0) return std::vector<double>(rt.tokens * h, 0.0);
  const std::vector<double> gu = moe_layer0_f64(x, rt, w1, h, 2 * f, dtype);
  std::vector<double> act(rt.rows() * f);
  for (int64_t i = 0; i < rt.rows(); ++i)
    for (int64_t j = 0; j < f; ++j) {
      const double g = gu[i * 2 * f + j], u = gu[i * 2 * f + f + j];
      act[i * f + j] = g / (1.0 + std::exp(-g)) * u;
    }
  return layer1_f64(act, rt, w2, weights, h, f, dtype);
}

}  // namespace tilelink
