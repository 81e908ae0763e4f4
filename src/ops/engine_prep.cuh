// Internal to the CUDA fused ops: the bf16 engine as both ops launch it, and made ready in every
// rank's context before any call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda::detail {

// The engine's arguments for a plan's GEMM (m(), n, k and compute_order: every op plan has them).
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
  args.tile_n = compute::sm90::kTileN;  // the plans map their signals onto these tiles
  return args;
}

// Per local rank, a workspace for the engine's split last wave (GemmArgs::workspace), zero-filled
// and sized once, at construction, for the largest split any SM count and either tile width of the
// rank gives: a call never reallocates it, so a captured graph keeps a valid pointer. Ranks whose
// GEMM never splits get none. One GEMM at a time per rank uses it (each rank's GEMMs run on one
// stream).
class EngineWorkspaces {
 public:
  // args_of(r): rank r's engine arguments (any num_sms).
  template <class ArgsOf>
  EngineWorkspaces(World& world, ArgsOf&& args_of) : world_(world), ws_(world.size()) {
    for (int r : world.local_ranks()) {
      world.bind(r);
      compute::sm90::GemmArgs a = args_of(r);
      int64_t bytes = 0;
      // The plan's tile width (hooked launches) and the engine's pick (plain ones, enqueue_gemm).
      for (int tile_n : {a.tile_n, 0}) {
        a.tile_n = tile_n;
        for (int sms = 1; sms <= world.sm_count(r); ++sms) {
          a.num_sms = sms;
          bytes = std::max(bytes, compute::sm90::gemm_workspace_bytes(a));
        }
      }
      if (bytes == 0) continue;
      TL_CUDA_CHECK(cudaMalloc(&ws_[r].ptr, bytes));
      TL_CUDA_CHECK(cudaMemset(ws_[r].ptr, 0, bytes));
      TL_CUDA_CHECK(cudaDeviceSynchronize());
      ws_[r].bytes = bytes;
    }
  }
  ~EngineWorkspaces() {
    for (int r : world_.local_ranks()) {  // NOTE: no checks: destructors must not throw
      world_.bind(r);
      if (ws_[r].ptr != nullptr) cudaFree(ws_[r].ptr);
    }
  }
  EngineWorkspaces(const EngineWorkspaces&) = delete;
  EngineWorkspaces& operator=(const EngineWorkspaces&) = delete;

  void attach(compute::sm90::GemmArgs& args, int r) const {
    args.workspace = ws_[r].ptr;
    args.workspace_bytes = ws_[r].bytes;
  }
  // How rank r's launch with these arguments (and its workspace) spreads its work.
  compute::sm90::GemmWork work(compute::sm90::GemmArgs args, int r) const {
    attach(args, r);
    world_.bind(r);  // the SM count of the rank's device
    return compute::sm90::gemm_work(args);
  }

 private:
  struct Workspace {
    void* ptr = nullptr;
    int64_t bytes = 0;
  };
  World& world_;
  std::vector<Workspace> ws_;
};

// kAltA: the instantiation that reads a band of A from GemmArgs::a_alt.
template <class Hooks, bool kAltA = false>
void launch_engine(const compute::sm90::GemmArgs& args, const Hooks& hooks, cudaStream_t stream) {
  compute::sm90::launch_gemm<cutlass::bfloat16_t, __nv_bfloat16, Hooks, kAltA>(args, hooks, stream);
}

// Launches the engine with these hooks twice in every local context, on a 1x8x8 problem and on a
// 1x8x512 one split in two parts of K (the split kernel's instance), and waits.
// `hooks_of(r)` gives rank r's hooks for that launch: waits that pass at once (epoch 0), notifies
// that write 0 into still-zero signals.
// NOTE: measured on the H200: the engine's first launch in a context, made while a comm kernel of
// the same rank was already spinning (the SM-driven AG comm is launched before the GEMM) or a
// stream wait was pending, never returned to the host, so the peers' kernels were never launched
// and the waits timed out; after one earlier launch in that context the same call ran. Loading the
// kernel and setting its attribute beforehand were not enough. So the first launch happens here,
// while nothing runs.
template <class Hooks, bool kAltA = false, class HooksOf>
void prepare_engine(World& world, HooksOf&& hooks_of) {
  for (int r : world.local_ranks()) {
    world.bind(r);
    // A [1, 512], B [8, 512], C [1, 8], then the split's workspace
    constexpr int64_t kA = 1024, kB = 8192, kC = 256;
    compute::sm90::GemmArgs args;
    args.m = 1;
    args.n = 8;
    args.k = 512;
    args.num_sms = 2;  // one tile on two blocks: two parts of 4 k-blocks each
    args.tile_n = compute::sm90::kTileN;  // the width the op's launches take
    const int64_t ws_bytes = compute::sm90::gemm_workspace_bytes(args);
    void* scratch = nullptr;
    TL_CUDA_CHECK(cudaMalloc(&scratch, kA + kB + kC + ws_bytes));
    TL_CUDA_CHECK(cudaMemset(scratch, 0, kA + kB + kC + ws_bytes));
    args.a = scratch;
    args.b = static_cast<char*>(scratch) + kA;
    args.c = static_cast<char*>(scratch) + kA + kB;
    if constexpr (kAltA) args.a_alt = args.a, args.a_alt_row0 = 0, args.a_alt_rows = 1;
    compute::sm90::GemmArgs plain = args;
    plain.k = 8, plain.num_sms = 1;
    launch_engine<Hooks, kAltA>(plain, hooks_of(r), world.stream(r));
    args.workspace = static_cast<char*>(scratch) + kA + kB + kC;
    args.workspace_bytes = ws_bytes;
    TL_REQUIRE(compute::sm90::gemm_work(args).split.tiles == 1, "prepare_engine: no split");
    launch_engine<Hooks, kAltA>(args, hooks_of(r), world.stream(r));
    TL_CUDA_CHECK(cudaStreamSynchronize(world.stream(r)));
    TL_CUDA_CHECK(cudaFree(scratch));
  }
}

}  // namespace tilelink::cuda::detail
