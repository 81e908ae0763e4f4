// Internal: launching a rank's kernel on its context and stream, with checks.
#pragma once

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda::detail {

// Binds rank's context, raises the kernel's dynamic shared memory limit if needed, launches on
// `stream` (the rank's stream when null) and checks the launch.
template <class... Params, class... Args>
void launch_on_rank_stream(World& world, int rank, cudaStream_t stream, const char* op,
                           void (*kernel)(Params...), int grid, int block, size_t smem,
                           Args&&... args) {
  TL_REQUIRE(world.is_local(rank), "op " << op << ": rank " << rank << " is not driven by this process");
  TL_REQUIRE(grid >= 1 && grid <= world.sm_count(rank),
             "op " << op << ": " << grid << " workers (one per SM) on rank " << rank << ", which has "
                   << world.sm_count(rank) << " SMs; a spinning kernel must fit in its SMs");
  world.bind(rank);
  if (smem > 48 * 1024)
    TL_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  kernel<<<grid, block, smem, stream ? stream : world.stream(rank)>>>(std::forward<Args>(args)...);
  TL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tilelink::cuda::detail
