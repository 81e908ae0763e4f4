// Internal to the CUDA fused ops: the bf16 engine as both ops launch it, and made ready in every
// rank's context before any call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda::detail {

// The engine's arguments for a plan's GEMM (m(), n, k and compute_order: both op plans have them).
template <class Plan>
compute::sm90::GemmArgs engine_args(const Plan& p, const void* a, const void* b, void* c, int num_sms) {
  compute::sm90::GemmArgs args;
  args.a = a;
  args.b = b;
  args.c = c;
  args.m = p.m();
  args.n = p.n;
  args.k = p.k;
  args.in_type = DType::kBF16;
  args.out_type = DType::kBF16;
  args.num_sms = num_sms;
  args.start_m = p.compute_order.start_m;
  args.group_m = p.compute_order.group_m;
  args.row_bands = p.compute_order.bands;
  return args;
}

// kAltA: the instantiation that reads a band of A from GemmArgs::a_alt.
template <class Hooks, bool kAltA = false>
void launch_engine(const compute::sm90::GemmArgs& args, const Hooks& hooks, cudaStream_t stream) {
  compute::sm90::launch_gemm<cutlass::bfloat16_t, __nv_bfloat16, Hooks, kAltA>(args, hooks, stream);
}

// Launches the engine with these hooks once in every local context, on a 1x8x8 problem, and waits.
// `hooks_of(r)` gives rank r's hooks for that launch: waits that pass at once (epoch 0), notifies
// that write 0 into still-zero signals.
// NOTE: measured on the H200: the engine's first launch in a context, made while a comm kernel of
// the same rank was already spinning (the SM-driven AG comm is launched before the GEMM) or a stream
// wait was pending, never returned to the host, so the peers' kernels were never launched and the
// waits timed out; after one earlier launch in that context the same call ran. Loading the kernel
// and setting its attribute beforehand were not enough. So the first launch happens here, while
// nothing runs.
template <class Hooks, bool kAltA = false, class HooksOf>
void prepare_engine(World& world, HooksOf&& hooks_of) {
  for (int r : world.local_ranks()) {
    world.bind(r);
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
    if constexpr (kAltA) args.a_alt = args.a, args.a_alt_row0 = 0, args.a_alt_rows = 1;
    launch_engine<Hooks, kAltA>(args, hooks_of(r), world.stream(r));
    TL_CUDA_CHECK(cudaStreamSynchronize(world.stream(r)));
    TL_CUDA_CHECK(cudaFree(scratch));
  }
}

}  // namespace tilelink::cuda::detail
