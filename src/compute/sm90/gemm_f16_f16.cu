// Plain-engine instantiation: cutlass::half_t inputs, __half output.
#include "instances.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"

namespace tilelink::compute::sm90::detail {

void gemm_f16_f16(const GemmArgs& args, cudaStream_t stream) { launch_gemm<cutlass::half_t, __half>(args, NoHooks{}, stream); }

}  // namespace tilelink::compute::sm90::detail
