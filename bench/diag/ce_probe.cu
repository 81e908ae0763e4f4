// ce_probe: does a same-GPU device-to-device copy run while every SM is held by another kernel?
// (i.e. on a copy engine, not as a driver kernel on the SMs). A diagnostic for the AG+GEMM design:
// its own-segment copy is a same-GPU copy, which the driver runs on SMs by default.
//
// A "hold" kernel takes every SM (two blocks of 1024 threads per SM: every thread slot, and half of the
// SM's shared memory each, so no other block fits) and spins until a flag is set or `--hold-ms` passes; each copy variant is enqueued on a second stream right after it,
// with events around the copy. A copy that needs SMs cannot start until the hold ends: its time is the
// hold. Each variant is also timed alone (SMs free).
//
// --peer: enable peer access from GPU 0 to GPU 1 first (as the peer transport does).
//
//   usage: ce_probe [--mib N] [--hold-ms T] [--peer]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "diag_check.hpp"

__global__ void hold(const volatile int* flag, unsigned long long hold_ns) {
  extern __shared__ int smem[];
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if (threadIdx.x == 0) smem[0] = 0;
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (*flag == 0 && t - t0 < hold_ns);
}

enum Variant { kMemcpy, kMemcpy2D, kBatch, kBatchOverlap, k3DBatchOverlap, kVariants };
const char* kNames[kVariants] = {"cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemcpyBatchAsync",
                                 "cudaMemcpyBatchAsync+PreferOverlapWithCompute",
                                 "cudaMemcpy3DBatchAsync(2D)+PreferOverlapWithCompute"};

void copy(Variant v, void* dst, const void* src, size_t bytes, cudaStream_t s) {
  switch (v) {
    case kMemcpy: CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); break;
    case kMemcpy2D: {
      const size_t row = 8192;
      CK(cudaMemcpy2DAsync(dst, row, src, row, row, bytes / row, cudaMemcpyDeviceToDevice, s));
      break;
    }
    case kBatch:
    case kBatchOverlap: {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attr.flags = v == kBatchOverlap ? cudaMemcpyFlagPreferOverlapWithCompute : 0;
      void* dsts[1] = {dst};
      const void* srcs[1] = {src};
      size_t sizes[1] = {bytes};
      size_t idx[1] = {0};
      CK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &attr, idx, 1, s));
      break;
    }
    case k3DBatchOverlap: {
      const size_t row = 8192;
      cudaMemcpy3DBatchOp op{};
      op.src.type = cudaMemcpyOperandTypePointer;
      op.src.op.ptr.ptr = const_cast<void*>(src);
      op.src.op.ptr.rowLength = row;  // elements (bytes here)
      op.src.op.ptr.layerHeight = bytes / row;
      op.src.op.ptr.locHint = {};
      op.dst.type = cudaMemcpyOperandTypePointer;
      op.dst.op.ptr.ptr = dst;
      op.dst.op.ptr.rowLength = row;
      op.dst.op.ptr.layerHeight = bytes / row;
      op.extent = make_cudaExtent(row, bytes / row, 1);
      op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      op.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      CK(cudaMemcpy3DBatchAsync(1, &op, 0, s));
      break;
    }
    default: break;
  }
}

int main(int argc, char** argv) {
  size_t mib = 256;
  double hold_ms = 50;
  bool peer = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mib") && i + 1 < argc) mib = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--hold-ms") && i + 1 < argc) hold_ms = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--peer")) peer = true;
    else { std::fprintf(stderr, "usage: ce_probe [--mib N] [--hold-ms T] [--peer]\n"); return 2; }
  }
  const size_t bytes = mib << 20;
  if (peer) {
    int n = 0, can = 0;
    CK(cudaGetDeviceCount(&n));
    if (n < 2) { std::fprintf(stderr, "--peer needs two GPUs\n"); return 2; }
    CK(cudaDeviceCanAccessPeer(&can, 0, 1));
    CK(cudaSetDevice(1));
    CK(cudaDeviceEnablePeerAccess(0, 0));
    CK(cudaSetDevice(0));
    CK(cudaDeviceEnablePeerAccess(1, 0));
    std::printf("# peer access enabled between GPU 0 and GPU 1 (can access: %d)\n", can);
  }
  int sms = 0, smem = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  smem /= 2;
  CK(cudaFuncSetAttribute(hold, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  void *src, *dst;
  int* flag;
  CK(cudaMalloc(&src, bytes));
  CK(cudaMalloc(&dst, bytes));
  CK(cudaMalloc(&flag, sizeof(int)));
  CK(cudaMemset(src, 1, bytes));
  CK(cudaMemset(flag, 0, sizeof(int)));
  cudaStream_t s_hold, s_copy;
  CK(cudaStreamCreateWithFlags(&s_hold, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s_copy, cudaStreamNonBlocking));
  cudaEvent_t e0, e1, h0, h1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreate(&h0));
  CK(cudaEventCreate(&h1));
  std::printf("# ce_probe: %zu MiB same-GPU copies; hold kernel: %d blocks x 1024 threads x %d B smem, %.0f ms\n",
              mib, 2 * sms, smem, hold_ms);
  std::printf("%-52s %12s %12s %12s %s\n", "variant", "alone GB/s", "held ms", "held GB/s", "verdict");
  for (int v = 0; v < kVariants; ++v) {
    // alone (best of 3 after a warm-up)
    float best = 1e9f;
    for (int i = 0; i < 4; ++i) {
      CK(cudaEventRecord(e0, s_copy));
      copy(Variant(v), dst, src, bytes, s_copy);
      CK(cudaEventRecord(e1, s_copy));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (i > 0 && ms < best) best = ms;
    }
    // while every SM is held
    CK(cudaEventRecord(h0, s_hold));
    hold<<<2 * sms, 1024, smem, s_hold>>>(flag, static_cast<unsigned long long>(hold_ms * 1e6));
    CK(cudaGetLastError());
    CK(cudaEventRecord(h1, s_hold));
    CK(cudaStreamWaitEvent(s_copy, h0, 0));  // the copy is enqueued after the hold started
    CK(cudaEventRecord(e0, s_copy));
    copy(Variant(v), dst, src, bytes, s_copy);
    CK(cudaEventRecord(e1, s_copy));
    CK(cudaDeviceSynchronize());
    float held = 0, hold_total = 0;
    CK(cudaEventElapsedTime(&held, h0, e1));
    CK(cudaEventElapsedTime(&hold_total, h0, h1));
    const bool ran_beside = held < 0.5 * hold_total;
    std::printf("%-52s %12.0f %12.3f %12.0f %s (hold %.1f ms)\n", kNames[v], bytes / (best * 1e-3) / 1e9, held,
                bytes / (held * 1e-3) / 1e9, ran_beside ? "ran beside the held SMs (copy engine)" : "waited for the SMs",
                hold_total);
  }
  return 0;
}
