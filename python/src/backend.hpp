// What the Python module (module.cpp) asks of a backend: make an op once for a problem and run it
// on every rank's operands. The CPU backend is plain C++ (module.cpp); the CUDA one (cuda_backend.cu)
// is compiled by nvcc, so this header holds no CUDA types.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "op_registry.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/ops/attention_plan.hpp"
#include "tilelink/runtime/bootstrap.hpp"

namespace tilelink::python {

// A sequence-parallel attention call (sp_attn or ring_attn), checked by module.cpp.
struct AttnCall {
  bool ring = false;
  SpAttnShape shape;
  SeqSharding sharding;
  DType dtype = DType::kBF16;
  OpPath path = OpPath::kAuto;
};

// The made-op cache's key of an attention problem.
inline std::string attn_key(bool ring, const SpAttnShape& s, const SeqSharding& sh, DType dtype) {
  std::string key = std::string(ring ? "ring_attn" : "sp_attn") + " " + std::string(dtype_name(dtype)) + " B" +
                    std::to_string(s.batch) + " H" + std::to_string(s.heads_q) + "/" + std::to_string(s.heads_kv) +
                    " D" + std::to_string(s.head_dim) + (s.causal ? " causal" : "") +
                    (sh.shard == SeqShard::kZigzag ? " zigzag" : " contiguous");
  for (int r = 0; r < sh.rows.world_size; ++r) key += " " + std::to_string(sh.rows.size(r));
  return key;
}

// A MoE layer call (moe_ag_gemm, moe_gemm_rs or moe_mlp), checked by module.cpp. The operands by
// rank, as the C++ ops take them (ops/moe_ops_cuda.hpp): `a` is X_r (layers 0 and the MLP) or H1_r
// (layer 1); w1 is null for layer 1, w2 for layer 0.
enum class MoeOp { kAgGemm, kGemmRs, kMlp };
struct MoeCall {
  MoeOp op = MoeOp::kMlp;
  RowPartition tokens;
  int64_t hidden = 0;
  std::vector<int64_t> ffn;  // F_r by rank
  int experts = 0, topk = 0;
  DType dtype = DType::kBF16;
  OpPath path = OpPath::kAuto;
};
struct MoeOperands {
  std::vector<const void*> a, w1, w2;
  std::vector<const int32_t*> ids;
  std::vector<const float*> weights;
  std::vector<void*> out;
};

inline const char* moe_op_name(MoeOp op) {
  return op == MoeOp::kAgGemm ? "moe_ag_gemm" : op == MoeOp::kGemmRs ? "moe_gemm_rs" : "moe_mlp";
}

// The made-op cache's key of a MoE problem.
inline std::string moe_key(const MoeCall& c) {
  std::string key = std::string(moe_op_name(c.op)) + " " + std::string(dtype_name(c.dtype)) + " H" +
                    std::to_string(c.hidden) + " E" + std::to_string(c.experts) + " k" + std::to_string(c.topk) + " M";
  for (int r = 0; r < c.tokens.world_size; ++r) key += " " + std::to_string(c.tokens.size(r));
  key += " F";
  for (int64_t f : c.ffn) key += " " + std::to_string(f);
  return key;
}

class CudaBackend {
 public:
  virtual ~CudaBackend() = default;
  virtual int size() const = 0;
  virtual int device() const = 0;
  // Enqueues the op of problem `p` (made on its first call, then reused; p.path picks fused,
  // unfused or the path model's choice) on every rank of this process, ordered after the work on `stream` (a
  // cudaStream_t of the caller's device, 0: the legacy default stream), and makes `stream` wait for
  // it. Returns the path taken and why.
  virtual PathChoice run(const cli::OpSpec& spec, const cli::OpProblem& p, const cli::ConstPtrs& a,
                         const cli::ConstPtrs& b, const cli::Ptrs& c, uintptr_t stream) = 0;
  // The attention op of `call` (made once, then reused) on every rank, ordered as run(); lse[r] may
  // be null (not written).
  virtual PathChoice attention(const AttnCall& call, const std::vector<const void*>& q,
                               const std::vector<const void*>& k, const std::vector<const void*>& v,
                               const std::vector<void*>& o, const std::vector<float*>& lse, uintptr_t stream) = 0;
  // The MoE layer of `call` (made once, then reused) on every rank, ordered as run().
  virtual PathChoice moe(const MoeCall& call, const MoeOperands& x, uintptr_t stream) = 0;
  // Waits for every rank's work (of this process); a wait on the device that ran out of time becomes TimeoutError
  // naming the op, rank, signal and tile (World::sync).
  virtual void sync() = 0;
  // After an error this rank's peers may not see: stops every rank's device waits (World::stop_peers).
  virtual void stop_peers() = 0;
  // The op's configuration for p: one line per rank (engine tile, SMs, comm method).
  virtual std::string config(const cli::OpSpec& spec, const cli::OpProblem& p) = 0;
};

// The GPUs this process sees (0 without CUDA or a driver).
int cuda_device_count();

// W virtual ranks on one GPU (green contexts). Throws tilelink::Error without CUDA or a GPU.
std::unique_ptr<CudaBackend> make_cuda_virtual(int world, int device, std::chrono::milliseconds timeout);
// This process's rank of an ipc world whose processes exchange through `boot` (its rank, size and
// GPU). Collective: every rank makes it. CUDA builds only.
std::unique_ptr<CudaBackend> make_cuda_process(std::shared_ptr<cuda::Bootstrap> boot, std::chrono::milliseconds timeout);

}  // namespace tilelink::python
