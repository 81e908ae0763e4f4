// Internal to the CUDA fused ops: the engine made ready in every rank's context before any call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda::detail {

// Makes the bf16 engine with these hooks ready in every local context: loaded, its shared-memory
// attribute set (launch_gemm sets the same value again on every launch, a no-op from then on), and
// launched once on a 1x8x8 problem and waited for. `hooks_of(r)` gives rank r's hooks for that launch:
// waits that pass at once (epoch 0), notifies that write 0 into still-zero signals.
// NOTE: measured on the H200: the engine's first launch in a context, made while a comm kernel of
// the same rank was already spinning (the SM-driven AG comm is launched before the GEMM), never
// returned to the host, so the peers' comm kernels were never launched and the waits timed out;
// after one earlier launch in that context the same call ran. Setting the attribute and loading the
// kernel beforehand were not enough. So the first launch happens here, while nothing runs.
template <class Hooks, class HooksOf>
void prepare_engine(World& world, HooksOf&& hooks_of) {
  using Cfg = compute::sm90::detail::GemmConfig<cutlass::bfloat16_t, __nv_bfloat16>;
  const void* k = reinterpret_cast<const void*>(&compute::sm90::detail::gemm_kernel<Cfg, Hooks>);
  world.load_kernel(k);
  for (int r : world.local_ranks()) {
    world.bind(r);
    TL_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(sizeof(compute::sm90::detail::SharedStorage<Cfg>))));
    void* scratch = nullptr;  // A [1, 8], B [8, 8], C [1, 8], 256-byte aligned each
    TL_CUDA_CHECK(cudaMalloc(&scratch, 3 * 256));
    TL_CUDA_CHECK(cudaMemset(scratch, 0, 3 * 256));
    compute::sm90::GemmArgs args;
    args.a = scratch;
    args.b = static_cast<char*>(scratch) + 256;
    args.c = static_cast<char*>(scratch) + 512;
    args.m = 1;
    args.n = 8;
    args.k = 8;
    args.num_sms = 1;
    compute::sm90::launch_gemm<cutlass::bfloat16_t, __nv_bfloat16>(args, hooks_of(r), world.stream(r));
    TL_CUDA_CHECK(cudaStreamSynchronize(world.stream(r)));
    TL_CUDA_CHECK(cudaFree(scratch));
  }
}

}  // namespace tilelink::cuda::detail
