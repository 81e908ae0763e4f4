// Example 3: fused GEMM+AllReduce on the CUDA backend, two virtual ranks on one GPU (each a green
// context with its share of the SMs). Rank r holds A_r [M, K_r] and B_r [N, K_r]; every rank ends
// with C = A_0 B_0^T + A_1 B_1^T [M, N]. Needs an sm_90a (Hopper) GPU.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/ops/gemm_ar_cuda.hpp"

using namespace tilelink;
namespace tlc = tilelink::cuda;  // NOTE: plain `cuda::` would be ambiguous with CCCL's ::cuda

int main() {
  const int W = 2;
  const int64_t M = 512, N = 1024;
  const std::vector<int64_t> k = {768, 256};  // K split over the ranks (multiples of 8)
  tlc::World world({.transport = tlc::Transport::kVirtual, .world_size = W});
  GemmArConfig cfg;         // one-shot
  cfg.comm_workers = 0;     // the AllReduce's SMs: the op's share
  cfg.compute_workers = 0;  // the GEMM: the rest of the rank's SMs
  tlc::GemmAr op(world, RowPartition::even(M, W), N, k, DType::kBF16, cfg);

  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto device_bf16 = [&](int64_t count, bool random) {  // in the current rank's context
    std::vector<BF16> host(count);
    for (BF16& x : host) x = float_to_bf16(random ? u(rng) : 0.f);
    void* p = nullptr;
    TL_CUDA_CHECK(cudaMalloc(&p, count * sizeof(BF16)));
    TL_CUDA_CHECK(cudaMemcpy(p, host.data(), count * sizeof(BF16), cudaMemcpyHostToDevice));
    return p;
  };
  std::vector<const void*> a(W), b(W);
  std::vector<void*> c(W), c_unfused(W);
  for (int r = 0; r < W; ++r) {
    world.bind(r);  // rank r's context: its buffers live there
    a[r] = device_bf16(M * k[r], true), b[r] = device_bf16(N * k[r], true);
    c[r] = device_bf16(M * N, false), c_unfused[r] = device_bf16(M * N, false);
  }

  op.run(a, b, c);                  // fused: each GEMM tile reduced as soon as every rank has it
  world.sync("gemm_ar");            // bounded: a wait that never completes becomes a TimeoutError
  op.run_unfused(a, b, c_unfused);  // cuBLAS, then the whole AllReduce (NCCL on peer and ipc)
  world.sync("gemm_ar(unfused)");

  bool ok = true;
  std::vector<BF16> c0;
  for (int r = 0; r < W; ++r) {
    std::vector<BF16> hc(M * N), hu(M * N);
    world.bind(r);
    TL_CUDA_CHECK(cudaMemcpy(hc.data(), c[r], hc.size() * sizeof(BF16), cudaMemcpyDeviceToHost));
    TL_CUDA_CHECK(cudaMemcpy(hu.data(), c_unfused[r], hu.size() * sizeof(BF16), cudaMemcpyDeviceToHost));
    double checksum = 0;
    std::vector<double> unfused(hu.size());
    for (size_t i = 0; i < hc.size(); ++i) checksum += bf16_to_float(hc[i]), unfused[i] = bf16_to_float(hu[i]);
    const double diff = relative_error(hc.data(), DType::kBF16, unfused);
    if (r == 0) c0 = hc;
    const bool same = std::memcmp(hc.data(), c0.data(), hc.size() * sizeof(BF16)) == 0;
    std::printf("rank %d: checksum %.4f, fused vs unfused rel. difference %.2e, same C as rank 0: %s\n", r,
                checksum, diff, same ? "yes" : "NO");
    ok = ok && diff <= 1e-2 && same;
    for (const void* p : {a[r], b[r], static_cast<const void*>(c[r]), static_cast<const void*>(c_unfused[r])})
      TL_CUDA_CHECK(cudaFree(const_cast<void*>(p)));
  }
  std::printf("GEMM+AR on %d virtual ranks: %s\n", W, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
