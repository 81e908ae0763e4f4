// Plain-engine instantiation: cutlass::half_t inputs, float output.
#include "instances.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"

namespace tilelink::compute::sm90::detail {

void gemm_f16_f32(const GemmArgs& args, cudaStream_t stream) { launch_gemm<cutlass::half_t, float>(args, NoHooks{}, stream); }

}  // namespace tilelink::compute::sm90::detail
