// The CPU tile compute engine and the float64 reference used by every correctness check.
#pragma once

#include <cstdint>
#include <vector>

#include "tilelink/core/dtype.hpp"

namespace tilelink {

// One output tile: C[i, j] = sum_k A[i, k] * B[j, k] for i < rows, j < cols, with fp32 accumulation
// in ascending k and one rounding to `dtype` at the end. a points at the tile's first row of A
// (row-major, leading dimension lda elements), b at its first row of B ([N, K] layout), c at the
// tile's first element of C. Deterministic: the same tile gives the same bits wherever it is computed.
void gemm_tile_cpu(const void* a, int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc,
                   DType dtype, int64_t rows, int64_t cols, int64_t k);

// Reference: C = A * B^T in float64 from storage of type `dtype`. A [m, k], B [n, k], C [m, n].
std::vector<double> gemm_reference_f64(const void* a, const void* b, DType dtype, int64_t m,
                                       int64_t n, int64_t k);

// ||out - ref||_F / ||ref||_F, reading `out` as `dtype`; NaN in out gives +inf.
double relative_error(const void* out, DType dtype, const std::vector<double>& ref);

// |A| * |B|^T in float64: the magnitude of the terms each output element sums.
std::vector<double> gemm_magnitude_f64(const void* a, const void* b, DType dtype, int64_t m,
                                       int64_t n, int64_t k);

// ||out - ref||_F / ||magnitude||_F: the rounding error against the size of the terms summed, which
// cancellation cannot inflate (a sum whose terms cancel has a tiny ref but the same rounding error).
// The check for tiny outputs (M = 1, N = 1), where relative_error is noise. NaN in out gives +inf.
double error_vs_magnitude(const void* out, DType dtype, const std::vector<double>& ref,
                          const std::vector<double>& magnitude);

}  // namespace tilelink
