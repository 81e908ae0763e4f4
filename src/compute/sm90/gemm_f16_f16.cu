// Plain-engine instantiation: cutlass::half_t inputs, __half output (every tile of the plain engine).
#include "instances.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"

namespace tilelink::compute::sm90 {

template void launch_gemm<cutlass::half_t, __half, NoHooks, false>(const GemmArgs&, const NoHooks&,
                                                                cudaStream_t);

namespace detail {

void gemm_f16_f16(const GemmArgs& args, cudaStream_t stream) {
  launch_gemm<cutlass::half_t, __half>(args, NoHooks{}, stream);
}

}  // namespace detail
}  // namespace tilelink::compute::sm90
