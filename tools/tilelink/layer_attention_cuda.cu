// The GPU side of `tilelink run sp_attn|ring_attn --backend cuda` (layer_ops.hpp, AttnGpuRunner): a
// world (virtual ranks on one GPU, or a GPU a rank) and cuda::SpAttn or cuda::RingAttn (ops/attention_cuda.hpp),
// every rank's shards copied in and its outputs copied back, the call timed with CUDA events on
// every rank's stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <vector>

#include "bench_world.hpp"
#include "device_buffer.hpp"
#include "layer_ops.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/ops/attention_cuda.hpp"

namespace tilelink::cli {
namespace {

namespace tlc = tilelink::cuda;


std::string refusal(const AttnGpuProblem& p) {
  if (p.dtype == DType::kF32) return "the CUDA form takes bf16 or fp16";
  if (p.shape.head_dim != 64 && p.shape.head_dim != 128) return "the CUDA form takes head dim 64 or 128";
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    return "no CUDA GPU";
  }
  return {};
}

// Op: tlc::SpAttn or tlc::RingAttn.
template <class Op>
class OpRunner final : public AttnGpuRunner {
 public:
  explicit OpRunner(const AttnGpuProblem& p) : p_(p) {
    tlc::WorldOptions wo;
    wo.transport = one_process_transport(p.transport, p.world, p.ring ? "ring_attn (cuda)" : "sp_attn (cuda)");
    wo.world_size = p.world;
    world_ = std::make_unique<tlc::World>(wo);
    op_ = std::make_unique<Op>(*world_, p.shape, p.sharding, p.dtype);
  }
  ~OpRunner() override {
    bufs_.clear();
    op_.reset();
  }

  double run(bool fused, const std::vector<std::vector<std::byte>>& q, const std::vector<std::vector<std::byte>>& k,
             const std::vector<std::vector<std::byte>>& v, std::vector<std::vector<std::byte>>& o,
             std::vector<std::vector<float>>& lse) override {
    const int W = p_.world;
    if (bufs_.empty()) {
      for (int r = 0; r < W; ++r) {
        world_->bind(r);
        bufs_.push_back(std::make_unique<DeviceBuffer>(q[r].size()));
        bufs_.push_back(std::make_unique<DeviceBuffer>(k[r].size()));
        bufs_.push_back(std::make_unique<DeviceBuffer>(v[r].size()));
        bufs_.push_back(std::make_unique<DeviceBuffer>(o[r].size()));
        bufs_.push_back(std::make_unique<DeviceBuffer>(lse[r].size() * sizeof(float)));
      }
    }
    std::vector<const void*> dq(W), dk(W), dv(W);
    std::vector<void*> dout(W);
    std::vector<float*> dlse(W);
    for (int r = 0; r < W; ++r) {
      world_->bind(r);
      dq[r] = bufs_[5 * r]->get(), dk[r] = bufs_[5 * r + 1]->get(), dv[r] = bufs_[5 * r + 2]->get();
      dout[r] = bufs_[5 * r + 3]->get(), dlse[r] = static_cast<float*>(bufs_[5 * r + 4]->get());
      TL_CUDA_CHECK(cudaMemcpy(bufs_[5 * r]->get(), q[r].data(), q[r].size(), cudaMemcpyHostToDevice));
      TL_CUDA_CHECK(cudaMemcpy(bufs_[5 * r + 1]->get(), k[r].data(), k[r].size(), cudaMemcpyHostToDevice));
      TL_CUDA_CHECK(cudaMemcpy(bufs_[5 * r + 2]->get(), v[r].data(), v[r].size(), cudaMemcpyHostToDevice));
      TL_CUDA_CHECK(cudaMemcpy(bufs_[5 * r + 3]->get(), o[r].data(), o[r].size(), cudaMemcpyHostToDevice));  // poisoned
      TL_CUDA_CHECK(cudaMemcpy(bufs_[5 * r + 4]->get(), lse[r].data(), lse[r].size() * sizeof(float),
                               cudaMemcpyHostToDevice));
    }
    world_->sync(p_.ring ? "ring_attn inputs" : "sp_attn inputs");
    std::vector<cudaEvent_t> ev(2 * W);
    for (int r = 0; r < W; ++r) {
      world_->bind(r);
      TL_CUDA_CHECK(cudaEventCreate(&ev[2 * r]));
      TL_CUDA_CHECK(cudaEventCreate(&ev[2 * r + 1]));
      TL_CUDA_CHECK(cudaEventRecord(ev[2 * r], world_->stream(r)));
    }
    if (fused) op_->run(dq, dk, dv, dout, dlse);
    else op_->run_unfused(dq, dk, dv, dout, dlse);
    for (int r = 0; r < W; ++r) {
      world_->bind(r);
      TL_CUDA_CHECK(cudaEventRecord(ev[2 * r + 1], world_->stream(r)));
    }
    world_->sync(fused ? (p_.ring ? "ring_attn" : "sp_attn") : (p_.ring ? "ring_attn(unfused)" : "sp_attn(unfused)"));
    float ms = 0;
    for (int r = 0; r < W; ++r) {
      float t = 0;
      TL_CUDA_CHECK(cudaEventElapsedTime(&t, ev[2 * r], ev[2 * r + 1]));
      ms = std::max(ms, t);
      TL_CUDA_CHECK(cudaEventDestroy(ev[2 * r]));
      TL_CUDA_CHECK(cudaEventDestroy(ev[2 * r + 1]));
    }
    for (int r = 0; r < W; ++r) {
      world_->bind(r);
      TL_CUDA_CHECK(cudaMemcpy(o[r].data(), dout[r], o[r].size(), cudaMemcpyDeviceToHost));
      TL_CUDA_CHECK(cudaMemcpy(lse[r].data(), dlse[r], lse[r].size() * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return ms;
  }

 private:
  AttnGpuProblem p_;
  std::unique_ptr<tlc::World> world_;
  std::unique_ptr<Op> op_;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs_;
};

}  // namespace

void attach_attention_layers_cuda() {
  attach_attn_gpu({refusal, [](const AttnGpuProblem& p) -> std::unique_ptr<AttnGpuRunner> {
                     if (p.ring) return std::make_unique<OpRunner<tlc::RingAttn>>(p);
                     return std::make_unique<OpRunner<tlc::SpAttn>>(p);
                   }});
}

}  // namespace tilelink::cli
