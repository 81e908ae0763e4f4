#include "tilelink/compute/cpu_gemm.hpp"

#include <cmath>
#include <limits>

namespace tilelink {

void gemm_tile_cpu(const void* a, int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc,
                   DType dtype, int64_t rows, int64_t cols, int64_t k) {
  if (rows <= 0 || cols <= 0) return;
  // Widen the operand tiles once, then plain fp32 dot products in ascending k.
  std::vector<float> fa(static_cast<size_t>(rows * k)), fb(static_cast<size_t>(cols * k));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t kk = 0; kk < k; ++kk) fa[i * k + kk] = load_as_float(a, dtype, i * lda + kk);
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t kk = 0; kk < k; ++kk) fb[j * k + kk] = load_as_float(b, dtype, j * ldb + kk);
  for (int64_t i = 0; i < rows; ++i) {
    const float* ra = &fa[i * k];
    for (int64_t j = 0; j < cols; ++j) {
      const float* rb = &fb[j * k];
      float acc = 0.f;
      for (int64_t kk = 0; kk < k; ++kk) acc = std::fma(ra[kk], rb[kk], acc);
      store_from_float(c, dtype, i * ldc + j, acc);
    }
  }
}

std::vector<double> gemm_reference_f64(const void* a, const void* b, DType dtype, int64_t m,
                                       int64_t n, int64_t k) {
  std::vector<double> fa(static_cast<size_t>(m * k)), fb(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < m * k; ++i) fa[i] = load_as_float(a, dtype, i);
  for (int64_t i = 0; i < n * k; ++i) fb[i] = load_as_float(b, dtype, i);
  std::vector<double> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < k; ++kk) acc += fa[i * k + kk] * fb[j * k + kk];
      c[i * n + j] = acc;
    }
  return c;
}

double relative_error(const void* out, DType dtype, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double o = load_as_float(out, dtype, static_cast<int64_t>(i));
    if (!std::isfinite(o)) return std::numeric_limits<double>::infinity();
    num += (o - ref[i]) * (o - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::vector<double> gemm_magnitude_f64(const void* a, const void* b, DType dtype, int64_t m,
                                       int64_t n, int64_t k) {
  std::vector<double> fa(static_cast<size_t>(m * k)), fb(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < m * k; ++i) fa[i] = std::fabs(load_as_float(a, dtype, i));
  for (int64_t i = 0; i < n * k; ++i) fb[i] = std::fabs(load_as_float(b, dtype, i));
  std::vector<double> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < k; ++kk) acc += fa[i * k + kk] * fb[j * k + kk];
      c[i * n + j] = acc;
    }
  return c;
}

double error_vs_magnitude(const void* out, DType dtype, const std::vector<double>& ref,
                          const std::vector<double>& magnitude) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double o = load_as_float(out, dtype, static_cast<int64_t>(i));
    if (!std::isfinite(o)) return std::numeric_limits<double>::infinity();
    num += (o - ref[i]) * (o - ref[i]);
    den += magnitude[i] * magnitude[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace tilelink
