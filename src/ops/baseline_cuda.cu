// Which collective the unfused baselines use on a world (include/tilelink/ops/baseline_cuda.hpp).
#include "tilelink/ops/baseline_cuda.hpp"

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cuda {

BaselineComm baseline_comm(const World& world) {
  switch (world.transport()) {
    case Transport::kVirtual:
      return BaselineComm::kOwn;
    case Transport::kPeer:  // rank r = device r: one GPU per rank by construction
      return BaselineComm::kNccl;
    case Transport::kIpc: {
      // NCCL refuses two ranks on one GPU: compare every rank's GPU UUID.
      const int me = world.local_ranks().front();
      cudaDeviceProp prop{};
      TL_CUDA_CHECK(cudaGetDeviceProperties(&prop, world.device(me)));
      std::vector<cudaUUID_t> all(world.size());
      world.bootstrap().allgather(&prop.uuid, all.data(), sizeof(cudaUUID_t), world.options().timeout,
                                  "baseline: the exchange of the ranks' GPU UUIDs");
      for (size_t i = 0; i < all.size(); ++i)
        for (size_t j = i + 1; j < all.size(); ++j)
          if (std::memcmp(&all[i], &all[j], sizeof(cudaUUID_t)) == 0) return BaselineComm::kOwn;
      return BaselineComm::kNccl;
    }
  }
  TL_REQUIRE(false, "baseline_comm: unknown transport");
  return BaselineComm::kOwn;
}

}  // namespace tilelink::cuda
