// Plain-engine instantiation: cutlass::bfloat16_t inputs, float output.
#include "instances.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"

namespace tilelink::compute::sm90::detail {

void gemm_bf16_f32(const GemmArgs& args, cudaStream_t stream) { launch_gemm<cutlass::bfloat16_t, float>(args, NoHooks{}, stream); }

}  // namespace tilelink::compute::sm90::detail
