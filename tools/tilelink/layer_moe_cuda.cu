// The GPU side of `tilelink run moe_ag_gemm|moe_gemm_rs|moe_mlp --backend cuda` (layer_ops.hpp,
// MoeGpuRun): one call of the layer over the ranks of a world (virtual ranks of one GPU, or a GPU a
// rank) through the ops of
// ops/moe_ops_cuda.hpp (world 1: cuda::MoeLayer alone), every rank's inputs copied in and its
// output copied back, timed on the host clock to the world's sync.
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "bench_world.hpp"
#include "device_buffer.hpp"
#include "layer_ops.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/ops/moe_ops_cuda.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cli {
namespace {

MoeGpuResult run_moe_on_gpu(const MoeGpuCall& c, bool fused, const std::vector<std::byte*>& out) {
  const int W = c.tokens.world_size;
  const int64_t eb = dtype_size(c.dtype), M = c.tokens.total(), rows = M * c.topk, h = c.hidden;
  const int64_t e = c.experts;
  cuda::World world({.transport = one_process_transport(c.transport, W, "moe (cuda)"), .world_size = W});
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  auto put = [&](int r, const void* host, int64_t bytes) -> const void* {
    if (host == nullptr || bytes == 0) return nullptr;
    world.bind(r);
    keep.push_back(std::make_unique<DeviceBuffer>(bytes, static_cast<const std::byte*>(host)));
    return keep.back()->get();
  };
  std::vector<const void*> x(W), w1(W), w2(W), h1(W);
  std::vector<const int32_t*> ids(W), all_ids(W);
  std::vector<const float*> weights(W), all_weights(W);
  std::vector<void*> d_out(W);
  std::vector<int64_t> out_bytes(W);
  for (int r = 0; r < W; ++r) {
    const int64_t t0 = c.tokens.begin(r), tr = c.tokens.size(r), f = c.ffn[r];
    if (c.x) x[r] = put(r, c.x + t0 * h * eb, tr * h * eb);
    ids[r] = static_cast<const int32_t*>(put(r, c.ids + t0 * c.topk, tr * c.topk * 4));
    weights[r] = static_cast<const float*>(put(r, c.weights + t0 * c.topk, tr * c.topk * 4));
    all_ids[r] = static_cast<const int32_t*>(put(r, c.ids, rows * 4));
    all_weights[r] = static_cast<const float*>(put(r, c.weights, rows * 4));
    if (!c.w1.empty() && c.w1[r]) w1[r] = put(r, c.w1[r], e * (c.op == 2 ? 2 : 1) * f * h * eb);
    if (!c.w2.empty() && c.w2[r]) w2[r] = put(r, c.w2[r], e * h * f * eb);
    if (!c.h1.empty() && c.h1[r]) h1[r] = put(r, c.h1[r], rows * f * eb);
    out_bytes[r] = (c.op == 0 ? rows * f : tr * h) * eb;
    world.bind(r);
    keep.push_back(std::make_unique<DeviceBuffer>(std::max<int64_t>(out_bytes[r], 1)));
    d_out[r] = out_bytes[r] > 0 ? keep.back()->get() : nullptr;
    // poison: what the call leaves shows
    if (out_bytes[r] > 0) TL_CUDA_CHECK(cudaMemset(d_out[r], 0xff, out_bytes[r]));
  }
  std::unique_ptr<cuda::MoeAgGemm> l0;
  std::unique_ptr<cuda::MoeGemmRs> l1;
  std::unique_ptr<cuda::MoeMlp> mlp;
  if (c.op == 0) l0 = std::make_unique<cuda::MoeAgGemm>(world, c.tokens, h, c.ffn, c.experts, c.topk, c.dtype);
  if (c.op == 1) l1 = std::make_unique<cuda::MoeGemmRs>(world, c.tokens, h, c.ffn, c.experts, c.topk, c.dtype);
  if (c.op == 2) mlp = std::make_unique<cuda::MoeMlp>(world, c.tokens, h, c.ffn, c.experts, c.topk, c.dtype);
  world.sync("inputs");
  const double ms = timed_ms(world, c.op == 0 ? "moe_ag_gemm" : c.op == 1 ? "moe_gemm_rs" : "moe_mlp", [&] {
    if (l0) fused ? l0->run(x, ids, weights, w1, d_out) : l0->run_unfused(x, ids, weights, w1, d_out);
    if (l1) fused ? l1->run(h1, all_ids, all_weights, w2, d_out) : l1->run_unfused(h1, all_ids, all_weights, w2, d_out);
    if (mlp) fused ? mlp->run(x, ids, weights, w1, w2, d_out) : mlp->run_unfused(x, ids, weights, w1, w2, d_out);
  });
  for (int r = 0; r < W; ++r) {
    world.bind(r);
    const cuda::MoeLayer* layer = l0 ? &l0->layer(r) : mlp ? &mlp->layer0().layer(r) : &l1->layer(r);
    int64_t status = 0;
    TL_CUDA_CHECK(cudaMemcpy(&status, layer->status(), sizeof(status), cudaMemcpyDeviceToHost));
    TL_REQUIRE(status == 0, "moe (cuda): rank " << r << "'s routing found a bad expert id at pair " << status - 1);
    if (out_bytes[r] > 0) TL_CUDA_CHECK(cudaMemcpy(out[r], d_out[r], out_bytes[r], cudaMemcpyDeviceToHost));
  }
  return {ms, world.transport() != cuda::Transport::kVirtual && W > 1 && c.op != 0};
}

}  // namespace

void attach_moe_layers_cuda() { attach_moe_gpu(run_moe_on_gpu); }

}  // namespace tilelink::cli
