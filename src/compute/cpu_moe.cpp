// The CPU compute of a MoE layer (compute/cpu_moe.hpp).
#include "tilelink/compute/cpu_moe.hpp"

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

void moe_grouped_gemm_cpu(const void* a, int64_t lda, std::span<const int64_t> a_rows,
                          std::span<const int64_t> offsets, std::span<const ExpertWeight> weights,
                          void* out, int64_t ldo, int64_t n, int64_t k, DType dtype) {
  check_grouped(a_rows, offsets, weights, n, k);
  const int64_t es = dtype_size(dtype);
  const auto* abytes = static_cast<const char*>(a);
  auto* obytes = static_cast<char*>(out);
  for (size_t e = 0; e < weights.size(); ++e) {
    const int64_t ldw = weights[e].ld ? weights[e].ld : k;
    for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i) {
      const int64_t src = a_rows.empty() ? i : a_rows[i];
      // one row at a time: a gathered row has no neighbour in A to share a tile with
      gemm_tile_cpu(abytes + src * lda * es, lda, weights[e].w, ldw, obytes + i * ldo * es, ldo,
                    dtype, 1, n, k);
    }
  }
}

void moe_topk_reduce_cpu(const void* y, int64_t ldy, const MoeRouting& r,
                         std::span<const float> weights, void* out, int64_t ldo, int64_t n,
                         DType dtype) {
  check_reduce(r, weights);
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int s = 0; s < r.topk; ++s) {
        const int64_t p = t * r.topk + s;
        acc += weights[p] * load_as_float(y, dtype, r.row_of_pair[p] * ldy + j);
      }
      store_from_float(out, dtype, t * ldo + j, acc);
    }
  }
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

}  // namespace tilelink
