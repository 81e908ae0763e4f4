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

#define CHECK(call)                                                                              \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

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
  CHECK(cudaSetDevice(dev));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  enqueue();
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e = nullptr;
  CHECK(cudaGraphInstantiate(&e, g, 0));
  CHECK(cudaGraphDestroy(g));
  return e;
}

void run_case(Copy copy, bool b_first, bool a_eager) {
  const size_t bytes = 1 << 20;
  void *buf0 = nullptr, *buf1 = nullptr;
  unsigned long long *flag0 = nullptr, *status = nullptr;
  cudaStream_t s0 = nullptr, s1 = nullptr;
  CHECK(cudaSetDevice(0));
  CHECK(cudaMalloc(&buf0, bytes));
  CHECK(cudaMalloc(&flag0, 8));
  CHECK(cudaMemset(flag0, 0, 8));
  CHECK(cudaHostAlloc(&status, 8, cudaHostAllocMapped));
  CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CHECK(cudaSetDevice(1));
  CHECK(cudaMalloc(&buf1, bytes));
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaSetDevice(0));
  CHECK(cudaDeviceSynchronize());

  auto enqueue_a = [&] {
    wait_flag<<<1, 1, 0, s0>>>(flag0, 1, status);
    CHECK(cudaGetLastError());
    if (copy == Copy::kPull) CHECK(cudaMemcpyAsync(buf0, buf1, bytes, cudaMemcpyDefault, s0));
    if (copy == Copy::kPush) CHECK(cudaMemcpyAsync(buf1, buf0, bytes, cudaMemcpyDefault, s0));
  };
  auto enqueue_b = [&] {
    set_flag<<<1, 1, 0, s1>>>(flag0, 1);
    CHECK(cudaGetLastError());
    if (copy == Copy::kPull) CHECK(cudaMemcpyAsync(buf1, buf0, bytes, cudaMemcpyDefault, s1));
    if (copy == Copy::kPush) CHECK(cudaMemcpyAsync(buf0, buf1, bytes, cudaMemcpyDefault, s1));
  };
  cudaGraphExec_t a = a_eager ? nullptr : capture(0, s0, enqueue_a);
  cudaGraphExec_t b = capture(1, s1, enqueue_b);
  for (int launch = 1; launch <= 2; ++launch) {
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemset(flag0, 0, 8));
    CHECK(cudaDeviceSynchronize());
    *status = 99;
    auto launch_a = [&] {
      CHECK(cudaSetDevice(0));
      if (a)
        CHECK(cudaGraphLaunch(a, s0));
      else
        enqueue_a();
    };
    auto launch_b = [&] {
      CHECK(cudaSetDevice(1));
      CHECK(cudaGraphLaunch(b, s1));
    };
    if (b_first) {
      launch_b();
      launch_a();
    } else {
      launch_a();
      launch_b();
    }
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamSynchronize(s0));
    CHECK(cudaSetDevice(1));
    CHECK(cudaStreamSynchronize(s1));
    std::printf("%-12s A %s, %s first, launch %d: %s\n", name(copy), a_eager ? "eager" : "graph",
                b_first ? "B" : "A", launch,
                *status == 0   ? "ok"
                : *status == 1 ? "A timed out"
                               : "A never ran");
  }
  if (a) CHECK(cudaGraphExecDestroy(a));
  CHECK(cudaGraphExecDestroy(b));
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(buf0));
  CHECK(cudaFree(flag0));
  CHECK(cudaFreeHost(status));
  CHECK(cudaStreamDestroy(s0));
  CHECK(cudaSetDevice(1));
  CHECK(cudaFree(buf1));
  CHECK(cudaStreamDestroy(s1));
}

}  // namespace

int main() {
  int n = 0;
  CHECK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::printf("graph_p2p_probe needs 2 GPUs; this machine has %d\n", n);
    return 2;
  }
  for (int d = 0; d < 2; ++d) {
    int can = 0;
    CHECK(cudaDeviceCanAccessPeer(&can, d, 1 - d));
    if (!can) {
      std::printf("GPU %d cannot access GPU %d\n", d, 1 - d);
      return 2;
    }
    CHECK(cudaSetDevice(d));
    CHECK(cudaDeviceEnablePeerAccess(1 - d, 0));
  }
  for (Copy c : {Copy::kNone, Copy::kPull, Copy::kPush})
    for (bool b_first : {false, true}) run_case(c, b_first, false);
  run_case(Copy::kPull, false, true);
  run_case(Copy::kPush, false, true);
  return 0;
}
