// The collective of the CUDA fused ops' unfused baselines (AgGemm::run_unfused,
// GemmRs::run_unfused), per world: cuBLAS GEMM + NCCL where the transport allows NCCL, else
// cuBLAS + the op's own collective (copy-engine AllGather, SM reduce).
//
//   virtual  kOwn: NCCL refuses two ranks on one GPU
//   peer     kNccl: one communicator per rank (ncclCommInitAll)
//   ipc      kNccl when every rank has its own GPU (ncclCommInitRank, the unique id through the bootstrap);
//            kOwn when ranks share a GPU (more ranks than GPUs on a node)
#pragma once

#include <cstdint>

#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda {

enum class BaselineComm : uint8_t { kOwn, kNccl };

// Collective under ipc: every rank calls it (the ranks compare their GPUs through the bootstrap).
BaselineComm baseline_comm(const World& world);

}  // namespace tilelink::cuda
