// Does a CUDA graph on one GPU hold back another GPU's graph? Two GPUs, one process, one host
// thread.
//
//   graph A (GPU 0): a one-thread kernel that waits (bounded) for a flag on GPU 0, then a memcpy
//   node
//                    that touches GPU 1's memory (pull: GPU 1 -> GPU 0, push: GPU 0 -> GPU 1) or
//                    none
//   graph B (GPU 1): a one-thread kernel that sets that flag (a peer store), then the mirror memcpy
//
// A is launched first, then B (and the other way round). If B cannot start while A is running, A's
// wait gives up after ~2 s and says so. Each case captures once and launches twice (the first
// launch of a graph, then a second). A eager (no graph on GPU 0) is the control. One line per case
// and launch.
//
//   graph_p2p_probe          (needs 2 GPUs with peer access)
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "diag_check.hpp"

namespace {

__global__ void wait_flag(const volatile unsigned long long* flag, unsigned long long target,
                          unsigned long long* status) {
  const long long t0 = clock64();
  // ~2 s at ~1.98 GHz: bounded, reports instead of trapping
  while (*flag < target) {
    if (clock64() - t0 > 4'000'000'000ll) {
      *status = 1;
      return;
    }
  }
  *status = 0;
}
__global__ void set_flag(unsigned long long* flag, unsigned long long v) {
  __threadfence_system();
  *reinterpret_cast<volatile unsigned long long*>(flag) = v;
}

enum class Copy { kNone, kPull, kPush };
const char* name(Copy c) {
  return c == Copy::kNone ? "no memcpy" : c == Copy::kPull ? "pull memcpy" : "push memcpy";
}

// Stream capture of `enqueue` on device `dev`'s stream s.
template <class Fn>
cudaGraphExec_t capture(int dev, cudaStream_t s, Fn&& enqueue) {
  CK(cudaSetDevice(dev));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  enqueue();
  cudaGraph_t g = nullptr;
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e = nullptr;
  CK(cudaGraphInstantiate(&e, g, 0));
  CK(cudaGraphDestroy(g));
  return e;
}

void run_case(Copy copy, bool b_first, bool a_eager) {
  const size_t bytes = 1 << 20;
  void *buf0 = nullptr, *buf1 = nullptr;
  unsigned long long *flag0 = nullptr, *status = nullptr;
  cudaStream_t s0 = nullptr, s1 = nullptr;
  CK(cudaSetDevice(0));
  CK(cudaMalloc(&buf0, bytes));
  CK(cudaMalloc(&flag0, 8));
  CK(cudaMemset(flag0, 0, 8));
  CK(cudaHostAlloc(&status, 8, cudaHostAllocMapped));
  CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CK(cudaSetDevice(1));
  CK(cudaMalloc(&buf1, bytes));
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaDeviceSynchronize());
  CK(cudaSetDevice(0));
  CK(cudaDeviceSynchronize());

  auto enqueue_a = [&] {
    wait_flag<<<1, 1, 0, s0>>>(flag0, 1, status);
    CK(cudaGetLastError());
    if (copy == Copy::kPull) CK(cudaMemcpyAsync(buf0, buf1, bytes, cudaMemcpyDefault, s0));
    if (copy == Copy::kPush) CK(cudaMemcpyAsync(buf1, buf0, bytes, cudaMemcpyDefault, s0));
  };
  auto enqueue_b = [&] {
    set_flag<<<1, 1, 0, s1>>>(flag0, 1);
    CK(cudaGetLastError());
    if (copy == Copy::kPull) CK(cudaMemcpyAsync(buf1, buf0, bytes, cudaMemcpyDefault, s1));
    if (copy == Copy::kPush) CK(cudaMemcpyAsync(buf0, buf1, bytes, cudaMemcpyDefault, s1));
  };
  cudaGraphExec_t a = a_eager ? nullptr : capture(0, s0, enqueue_a);
  cudaGraphExec_t b = capture(1, s1, enqueue_b);
  for (int launch = 1; launch <= 2; ++launch) {
    CK(cudaSetDevice(0));
    CK(cudaMemset(flag0, 0, 8));
    CK(cudaDeviceSynchronize());
    *status = 99;
    auto launch_a = [&] {
      CK(cudaSetDevice(0));
      if (a)
        CK(cudaGraphLaunch(a, s0));
      else
        enqueue_a();
    };
    auto launch_b = [&] {
      CK(cudaSetDevice(1));
      CK(cudaGraphLaunch(b, s1));
    };
    if (b_first) {
      launch_b();
      launch_a();
    } else {
      launch_a();
      launch_b();
    }
    CK(cudaSetDevice(0));
    CK(cudaStreamSynchronize(s0));
    CK(cudaSetDevice(1));
    CK(cudaStreamSynchronize(s1));
    std::printf("%-12s A %s, %s first, launch %d: %s\n", name(copy), a_eager ? "eager" : "graph",
                b_first ? "B" : "A", launch,
                *status == 0   ? "ok"
                : *status == 1 ? "A timed out"
                               : "A never ran");
  }
  if (a) CK(cudaGraphExecDestroy(a));
  CK(cudaGraphExecDestroy(b));
  CK(cudaSetDevice(0));
  CK(cudaFree(buf0));
  CK(cudaFree(flag0));
  CK(cudaFreeHost(status));
  CK(cudaStreamDestroy(s0));
  CK(cudaSetDevice(1));
  CK(cudaFree(buf1));
  CK(cudaStreamDestroy(s1));
}

}  // namespace

int main() {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::printf("graph_p2p_probe needs 2 GPUs; this machine has %d\n", n);
    return 2;
  }
  for (int d = 0; d < 2; ++d) {
    int can = 0;
    CK(cudaDeviceCanAccessPeer(&can, d, 1 - d));
    if (!can) {
      std::printf("GPU %d cannot access GPU %d\n", d, 1 - d);
      return 2;
    }
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
  }
  for (Copy c : {Copy::kNone, Copy::kPull, Copy::kPush})
    for (bool b_first : {false, true}) run_case(c, b_first, false);
  run_case(Copy::kPull, false, true);
  run_case(Copy::kPush, false, true);
  return 0;
}
