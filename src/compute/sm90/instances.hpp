// The precompiled plain-engine instantiations (one translation unit each, so they build in parallel).
#pragma once

#include <cuda_runtime.h>

#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/compute/sm90/grouped_gemm.hpp"

namespace tilelink::compute::sm90::detail {

void gemm_bf16_bf16(const GemmArgs& args, cudaStream_t stream);
void gemm_bf16_f32(const GemmArgs& args, cudaStream_t stream);
void gemm_f16_f16(const GemmArgs& args, cudaStream_t stream);
void gemm_f16_f32(const GemmArgs& args, cudaStream_t stream);
// The grouped mode's (grouped_gemm.hpp), arguments checked.
void grouped_gemm_bf16(const GroupedGemmArgs& args, cudaStream_t stream);
void grouped_gemm_f16(const GroupedGemmArgs& args, cudaStream_t stream);
// The decode kernel (gemm.hpp, "Decode sizes") on `sms` SMs; the arguments checked.
void gemm_decode(const GemmArgs& args, int sms, cudaStream_t stream);
// Its wgmma form (gemm_decode_wgmma.cu, instantiated there for the four dtype pairs), which
// gemm_decode runs where its own mma.sync form does not (gemm.hpp, "Decode sizes").
template <class In, class Out>
void gemm_decode_wgmma(const GemmArgs& args, cudaStream_t stream);

}  // namespace tilelink::compute::sm90::detail

// One translation unit's plain engine for inputs In and output Out: the explicit instance of
// launch_gemm<In, Out, NoHooks> (declared extern in impl/gemm_kernel.cuh, so the other units that
// call it link here) and its entry detail::fn. Use after including impl/gemm_kernel.cuh.
#define TL_SM90_PLAIN_GEMM_INSTANCE(In, Out, fn)                                              \
  namespace tilelink::compute::sm90 {                                                         \
  template void launch_gemm<In, Out, NoHooks, false>(const GemmArgs&, const NoHooks&,         \
                                                     cudaStream_t);                           \
  namespace detail {                                                                          \
  void fn(const GemmArgs& args, cudaStream_t stream) {                                        \
    launch_gemm<In, Out>(args, NoHooks{}, stream);                                            \
  }                                                                                           \
  }                                                                                           \
  }
