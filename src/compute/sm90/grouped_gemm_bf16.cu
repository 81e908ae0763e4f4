// Grouped-mode instantiation: cutlass::bfloat16_t inputs, __nv_bfloat16 output.
#include "instances.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"

namespace tilelink::compute::sm90::detail {

void grouped_gemm_bf16(const GroupedGemmArgs& args, cudaStream_t stream) {
  launch_grouped_gemm<cutlass::bfloat16_t, __nv_bfloat16>(args, NoHooks{}, stream);
}

}  // namespace tilelink::compute::sm90::detail
