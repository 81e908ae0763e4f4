// Grouped-mode instantiation: cutlass::half_t inputs, __half output.
#include "instances.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"

namespace tilelink::compute::sm90::detail {

void grouped_gemm_f16(const GroupedGemmArgs& args, cudaStream_t stream) {
  launch_grouped_gemm<cutlass::half_t, __half>(args, NoHooks{}, stream);
}

}  // namespace tilelink::compute::sm90::detail
