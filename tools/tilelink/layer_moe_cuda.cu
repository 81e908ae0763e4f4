// The GPU side of `tilelink run moe_ag_gemm|moe_gemm_rs|moe_mlp --backend cuda` (layer_ops.hpp,
// MoeGpuRun): one call of the layer on one GPU through cuda::MoeLayer (ops/moe_cuda.hpp), its
// inputs copied in and its output copied back, timed with CUDA events around the routing and the
// layer.
#include <cuda_runtime.h>

#include <vector>

#include "device_buffer.hpp"
#include "layer_ops.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/ops/moe_cuda.hpp"

namespace tilelink::cli {
namespace {


double run_moe_on_gpu(const MoeGpuCall& c, bool fused, std::byte* out) {
  const int64_t eb = dtype_size(c.dtype), rows = c.tokens * c.topk, h = c.hidden, f = c.ffn;
  const int64_t e = c.experts;
  cuda::MoeLayer moe(c.tokens, h, f, c.experts, c.topk, c.dtype);
  DeviceBuffer ids(rows * sizeof(int32_t), c.ids), weights(rows * sizeof(float), c.weights);
  const int64_t out_bytes = (c.op == 0 ? rows * f : c.tokens * h) * eb;
  DeviceBuffer d_out(out_bytes);
  TL_CUDA_CHECK(cudaMemset(d_out.get(), 0xff, out_bytes));  // poison: what the call leaves shows
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  auto put = [&](const std::byte* host, int64_t bytes) -> const void* {
    if (host == nullptr) return nullptr;
    keep.push_back(std::make_unique<DeviceBuffer>(bytes, host));
    return keep.back()->get();
  };
  const void* x = put(c.x, c.tokens * h * eb);
  const void* h1 = put(c.h1, rows * f * eb);
  const void* w1 = put(c.w1, e * (c.op == 2 ? 2 : 1) * f * h * eb);
  const void* w2 = put(c.w2, e * h * f * eb);
  const cuda::MoePath path = fused ? cuda::MoePath::kFused : cuda::MoePath::kUnfused;
  cudaEvent_t ev[2];
  TL_CUDA_CHECK(cudaEventCreate(&ev[0]));
  TL_CUDA_CHECK(cudaEventCreate(&ev[1]));
  TL_CUDA_CHECK(cudaEventRecord(ev[0], nullptr));
  moe.route(static_cast<const int32_t*>(ids.get()), nullptr);
  if (c.op == 0) moe.layer0(x, w1, f, d_out.get(), path, nullptr);
  if (c.op == 1) moe.layer1(h1, w2, static_cast<const float*>(weights.get()), d_out.get(), nullptr);
  if (c.op == 2) moe.mlp(x, w1, w2, static_cast<const float*>(weights.get()), d_out.get(), path, nullptr);
  TL_CUDA_CHECK(cudaEventRecord(ev[1], nullptr));
  TL_CUDA_CHECK(cudaEventSynchronize(ev[1]));
  float ms = 0;
  TL_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
  TL_CUDA_CHECK(cudaEventDestroy(ev[0]));
  TL_CUDA_CHECK(cudaEventDestroy(ev[1]));
  int64_t status = 0;
  TL_CUDA_CHECK(cudaMemcpy(&status, moe.status(), sizeof(status), cudaMemcpyDeviceToHost));
  TL_REQUIRE(status == 0, "moe (cuda): the routing found a bad expert id at pair " << status - 1);
  TL_CUDA_CHECK(cudaMemcpy(out, d_out.get(), out_bytes, cudaMemcpyDeviceToHost));
  return ms;
}

}  // namespace

void attach_moe_layers_cuda() { attach_moe_gpu(run_moe_on_gpu); }

}  // namespace tilelink::cli
