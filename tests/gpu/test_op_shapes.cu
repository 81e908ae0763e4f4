// The fused ops on the GEMM-engine issue's nine shapes split across virtual ranks (world 2, 4, 8):
// fused against the cuBLAS baseline of the same binary on every element, and against float64 dot
// products on 512 sampled elements per rank. Inputs are fresh random bf16 made on the device (a
// hash of seed and index), outputs poisoned before each run.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <random>
#include <vector>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/ops/ag_gemm_cuda.hpp"
#include "tilelink/ops/gemm_rs_cuda.hpp"

using namespace tilelink;
namespace tlc = tilelink::cuda;  // NOTE: plain `cuda::` would be ambiguous with CCCL's ::cuda

namespace {

__global__ void fill_random_bf16(__nv_bfloat16* out, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 29; x *= 0x94D049BB133111EBull; x ^= x >> 32;
    out[i] = __float2bfloat16(static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

void* device_random(int64_t count, uint64_t seed) {
  void* p = nullptr;
  TL_CUDA_CHECK(cudaMalloc(&p, count * 2 + 16));
  if (count > 0) {
    fill_random_bf16<<<264, 256>>>(static_cast<__nv_bfloat16*>(p), count, seed);
    TL_CUDA_CHECK(cudaGetLastError());
  }
  return p;
}

std::vector<BF16> to_host(const void* p, int64_t count) {
  std::vector<BF16> h(count);
  if (count > 0) TL_CUDA_CHECK(cudaMemcpy(h.data(), p, count * 2, cudaMemcpyDeviceToHost));
  return h;
}

struct Shape { int64_t m, n, k; };
const Shape kShapes[] = {{8192, 8192, 8192}, {8192, 3584, 8192}, {8192, 8192, 3584},
                         {8192, 1536, 4096}, {8192, 4096, 1536}, {4096, 3072, 8192},
                         {16384, 1024, 8192}, {2048, 28672, 8192}, {512, 8192, 8192}};

// Every element of `out` against `base` (relative Frobenius), and sampled elements against float64.
template <class RefAt>
void check_output(const std::vector<BF16>& out, const std::vector<BF16>& base, int64_t rows, int64_t cols,
                  RefAt&& ref_at, const std::string& what) {
  std::vector<double> b(base.size());
  for (size_t i = 0; i < b.size(); ++i) b[i] = bf16_to_float(base[i]);
  EXPECT_LT(relative_error(out.data(), DType::kBF16, b), 1e-2) << what << ": fused vs cuBLAS baseline";
  std::mt19937_64 rng(rows * 31 + cols);
  double num = 0, den = 0;
  for (int s = 0; s < 512; ++s) {
    const int64_t i = static_cast<int64_t>(rng() % rows), j = static_cast<int64_t>(rng() % cols);
    const double ref = ref_at(i, j), got = bf16_to_float(out[i * cols + j]);
    ASSERT_TRUE(std::isfinite(got)) << what << ": element (" << i << ", " << j << ") not written";
    num += (got - ref) * (got - ref);
    den += ref * ref;
  }
  EXPECT_LT(std::sqrt(num / den), 1e-2) << what << ": fused vs float64 on 512 sampled elements";
}

double dot(const BF16* x, const BF16* y, int64_t k) {
  double s = 0;
  for (int64_t i = 0; i < k; ++i) s += static_cast<double>(bf16_to_float(x[i])) * bf16_to_float(y[i]);
  return s;
}

tlc::World make_world(int w) {
  tlc::WorldOptions wo;
  wo.transport = tlc::Transport::kVirtual;
  wo.world_size = w;
  wo.timeout = std::chrono::milliseconds(20000);
  return tlc::World(wo);
}

void ag_shape(int W, const Shape& s) {
  SCOPED_TRACE(::testing::Message() << "ag_gemm world " << W << " " << s.m << "x" << s.n << "x" << s.k);
  tlc::World world = make_world(W);
  const RowPartition rows = RowPartition::even(s.m, W);
  const int64_t n_r = s.n / W;
  AgGemmConfig cfg;  // the CLI's defaults: comm on the copy engine, the GEMM on the rest
  cfg.comm_workers = 0;
  cfg.compute_workers = 0;
  cfg.comm_tile_rows = 512;
  tlc::AgGemm op(world, rows, std::vector<int64_t>(W, n_r), s.k, DType::kBF16, cfg);
  std::vector<const void*> a(W), b(W);
  std::vector<void*> c(W), c_ref(W);
  for (int r = 0; r < W; ++r) {
    world.bind(r);
    a[r] = device_random(rows.size(r) * s.k, 1000 + r);
    b[r] = device_random(n_r * s.k, 2000 + r);
    TL_CUDA_CHECK(cudaMalloc(&c[r], s.m * n_r * 2));
    TL_CUDA_CHECK(cudaMalloc(&c_ref[r], s.m * n_r * 2));
    TL_CUDA_CHECK(cudaMemset(c[r], 0xff, s.m * n_r * 2));
    TL_CUDA_CHECK(cudaMemset(c_ref[r], 0xff, s.m * n_r * 2));
    TL_CUDA_CHECK(cudaDeviceSynchronize());
  }
  op.run(a, b, c);
  world.sync("ag_gemm");
  op.run_unfused(a, b, c_ref);
  world.sync("ag_gemm(unfused)");
  std::vector<BF16> a_full;
  for (int r = 0; r < W; ++r) {
    world.bind(r);
    auto h = to_host(a[r], rows.size(r) * s.k);
    a_full.insert(a_full.end(), h.begin(), h.end());
  }
  for (int r = 0; r < W; ++r) {
    world.bind(r);
    const auto out = to_host(c[r], s.m * n_r), base = to_host(c_ref[r], s.m * n_r), hb = to_host(b[r], n_r * s.k);
    check_output(out, base, s.m, n_r,
                 [&](int64_t i, int64_t j) { return dot(&a_full[i * s.k], &hb[j * s.k], s.k); },
                 "rank " + std::to_string(r));
    cudaFree(const_cast<void*>(a[r]));
    cudaFree(const_cast<void*>(b[r]));
    cudaFree(c[r]);
    cudaFree(c_ref[r]);
  }
}

void rs_shape(int W, const Shape& s) {
  SCOPED_TRACE(::testing::Message() << "gemm_rs world " << W << " " << s.m << "x" << s.n << "x" << s.k);
  tlc::World world = make_world(W);
  const RowPartition rows = RowPartition::even(s.m, W);
  const int64_t k_r = s.k / W;
  GemmRsConfig cfg;  // the CLI's defaults: the reduce on 8 SMs, the GEMM on the rest
  cfg.comm_workers = 8;
  cfg.compute_workers = 0;
  cfg.comm_tile_rows = 128;
  tlc::GemmRs op(world, rows, s.n, std::vector<int64_t>(W, k_r), DType::kBF16, cfg);
  std::vector<const void*> a(W), b(W);
  std::vector<void*> c(W), c_ref(W);
  for (int r = 0; r < W; ++r) {
    world.bind(r);
    a[r] = device_random(s.m * k_r, 3000 + r);
    b[r] = device_random(s.n * k_r, 4000 + r);
    TL_CUDA_CHECK(cudaMalloc(&c[r], rows.size(r) * s.n * 2 + 16));
    TL_CUDA_CHECK(cudaMalloc(&c_ref[r], rows.size(r) * s.n * 2 + 16));
    TL_CUDA_CHECK(cudaMemset(c[r], 0xff, rows.size(r) * s.n * 2));
    TL_CUDA_CHECK(cudaMemset(c_ref[r], 0xff, rows.size(r) * s.n * 2));
    TL_CUDA_CHECK(cudaDeviceSynchronize());
  }
  op.run(a, b, c);
  world.sync("gemm_rs");
  op.run_unfused(a, b, c_ref);
  world.sync("gemm_rs(unfused)");
  std::vector<std::vector<BF16>> ha(W), hb(W);
  for (int r = 0; r < W; ++r) {
    world.bind(r);
    ha[r] = to_host(a[r], s.m * k_r);
    hb[r] = to_host(b[r], s.n * k_r);
  }
  for (int r = 0; r < W; ++r) {
    world.bind(r);
    const int64_t mr = rows.size(r), row0 = rows.begin(r);
    const auto out = to_host(c[r], mr * s.n), base = to_host(c_ref[r], mr * s.n);
    check_output(out, base, mr, s.n,
                 [&](int64_t i, int64_t j) {
                   double acc = 0;
                   for (int q = 0; q < W; ++q) acc += dot(&ha[q][(row0 + i) * k_r], &hb[q][j * k_r], k_r);
                   return acc;
                 },
                 "rank " + std::to_string(r));
  }
  for (int r = 0; r < W; ++r) {
    world.bind(r);
    cudaFree(const_cast<void*>(a[r]));
    cudaFree(const_cast<void*>(b[r]));
    cudaFree(c[r]);
    cudaFree(c_ref[r]);
  }
}

class OpShapes : public ::testing::TestWithParam<int> {};

TEST_P(OpShapes, AgGemmEngineShapes) {
  for (const Shape& s : kShapes) ag_shape(GetParam(), s);
}
TEST_P(OpShapes, GemmRsEngineShapes) {
  for (const Shape& s : kShapes) rs_shape(GetParam(), s);
}
INSTANTIATE_TEST_SUITE_P(Worlds, OpShapes, ::testing::Values(2, 4, 8));

}  // namespace
