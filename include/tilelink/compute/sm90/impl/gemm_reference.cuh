// Device-side checking helpers for the sm90 GEMM engine (tests, `tilelink bench gemm`): random fill,
// a float32 reference GEMM (C_ref = A * B^T (+ C0)), and the relative Frobenius error with a count of
// non-finite outputs (outputs are poisoned with NaN before a run, so unwritten elements show).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/core/dtype.hpp"

namespace tilelink::compute::sm90::reference {

TL_DEVICE TL_INLINE float load_f(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
TL_DEVICE TL_INLINE void store_f(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case DType::kF16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

__global__ inline void fill_uniform_kernel(void* p, DType t, int64_t count, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;  // splitmix64
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    store_f(p, t, i, scale * (static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f));
  }
}

// Fills count elements of type t with uniform values in [-scale, scale).
inline void fill_uniform(void* p, DType t, int64_t count, uint64_t seed, float scale, cudaStream_t s = 0) {
  fill_uniform_kernel<<<1024, 256, 0, s>>>(p, t, count, seed, scale);
  TL_SM90_CUDA_CHECK(cudaGetLastError());
}

// ref[m, n] (fp32, packed) = sum_k A[m, k] B[n, k] (+ c0[m, n], row stride ldc0, when c0 != nullptr).
// 64x64 block tile, 4x4 per thread, fp32 accumulation.
__global__ inline void reference_gemm_kernel(const void* a, const void* b, DType in, int64_t m, int64_t n, int64_t k,
                                             int64_t lda, int64_t ldb, const void* c0, DType c0_type, int64_t ldc0,
                                             float* ref) {
  __shared__ float sa[16][65];
  __shared__ float sb[16][65];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t row0 = blockIdx.y * 64, col0 = blockIdx.x * 64;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < k; k0 += 16) {
    for (int i = threadIdx.x; i < 64 * 16; i += 256) {
      const int r = i / 16, kk = i % 16;
      const int64_t gk = k0 + kk;
      sa[kk][r] = (row0 + r < m && gk < k) ? load_f(a, in, (row0 + r) * lda + gk) : 0.f;
      sb[kk][r] = (col0 + r < n && gk < k) ? load_f(b, in, (col0 + r) * ldb + gk) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = sa[kk][ty + 16 * i], bv[i] = sb[kk][tx + 16 * i];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t r = row0 + ty + 16 * i, c = col0 + tx + 16 * j;
      if (r < m && c < n) ref[r * n + c] = acc[i][j] + (c0 ? load_f(c0, c0_type, r * ldc0 + c) : 0.f);
    }
}

inline void reference_gemm(const void* a, const void* b, DType in, int64_t m, int64_t n, int64_t k, int64_t lda,
                           int64_t ldb, const void* c0, DType c0_type, int64_t ldc0, float* ref, cudaStream_t s = 0) {
  if (m == 0) return;
  dim3 grid(static_cast<unsigned>(ceil_div(n, 64)), static_cast<unsigned>(ceil_div(m, 64)));
  reference_gemm_kernel<<<grid, 256, 0, s>>>(a, b, in, m, n, k, lda, ldb, c0, c0_type, ldc0, ref);
  TL_SM90_CUDA_CHECK(cudaGetLastError());
}

// sums[0] += sum (out - ref)^2, sums[1] += sum ref^2, sums[2] += #non-finite outputs.
__global__ inline void compare_kernel(const void* out, DType t, int64_t ldc, const float* ref, int64_t m, int64_t n,
                                      double* sums) {
  double d2 = 0, r2 = 0, bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    const float o = load_f(out, t, r * ldc + c), e = ref[i];
    if (!isfinite(o)) {
      bad += 1;
    } else {
      d2 += double(o - e) * double(o - e);
    }
    r2 += double(e) * double(e);
  }
  for (int off = 16; off > 0; off /= 2) {
    d2 += __shfl_down_sync(0xffffffffu, d2, off);
    r2 += __shfl_down_sync(0xffffffffu, r2, off);
    bad += __shfl_down_sync(0xffffffffu, bad, off);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&sums[0], d2);
    atomicAdd(&sums[1], r2);
    atomicAdd(&sums[2], bad);
  }
}

struct Comparison {
  double rel_err = 0;      // ||out - ref||_F / ||ref||_F over the finite outputs
  int64_t non_finite = 0;  // outputs still poisoned (NaN) or overflowed
};

// Compares out[m, n] (type t, row stride ldc) with ref (fp32, packed). Synchronizes the device.
inline Comparison compare(const void* out, DType t, int64_t ldc, const float* ref, int64_t m, int64_t n) {
  double* sums = nullptr;
  TL_SM90_CUDA_CHECK(cudaMalloc(&sums, 3 * sizeof(double)));
  TL_SM90_CUDA_CHECK(cudaMemset(sums, 0, 3 * sizeof(double)));
  if (m > 0) {
    compare_kernel<<<1024, 256>>>(out, t, ldc, ref, m, n, sums);
    TL_SM90_CUDA_CHECK(cudaGetLastError());
  }
  double h[3];
  TL_SM90_CUDA_CHECK(cudaMemcpy(h, sums, sizeof(h), cudaMemcpyDeviceToHost));
  TL_SM90_CUDA_CHECK(cudaFree(sums));
  Comparison c;
  c.rel_err = h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
  c.non_finite = static_cast<int64_t>(h[2]);
  return c;
}

// Tolerance on the relative Frobenius error, by output type (inputs are exact in bf16/fp16).
inline double tolerance(DType out) { return out == DType::kBF16 ? 1e-2 : out == DType::kF16 ? 5e-3 : 1e-4; }

}  // namespace tilelink::compute::sm90::reference
