// signal_floor: what one wait and one notify cost a launch with no GEMM around them, i.e. the floor
// under the sm90 engine's hooks (the target "hooks <= 1%") at one tile a block.
//
// A "tile" kernel, one block of 256 threads per SM. Each block:
//   [wait: warp 0 runs the engine's SignalHooks wait (lane 0 acquires the block's signal, already
//   set)] -> __syncthreads ->
//   reads its 64 KiB slice of an input (16-byte loads, cold after the flush, as a tile's first
//   k-blocks) -> spins for --work-us (clock64; the mainloop's place) -> writes its 64 KiB slice of
//   the output (16-byte stores, a tile's epilogue) -> __syncthreads ->
//   [notify: thread 0 runs SignalHooks' notify (a release store of the block's signal)].
// The variants differ only in the bracketed parts: plain, wait, notify, both ("hooks"); "+fence":
// the wait followed by `fence.proxy.async.global`, as the engine orders it before its TMA loads;
// ", sys": system scope (with the fence, for the wait), as the fused ops' instances. As in
// `tilelink bench gemm`: CUDA events around each launch, L2 flushed (a 2x-L2 memset) before every
// launch, the variants rotated rep by rep; the table gives each variant's median launch time and
// its paired median difference from plain. --hot-signals: after every flush, before every variant,
// a small kernel writes the wait signals again (as a communication program leaves them).
//
// Both hooks are on the critical path by what they mean: no read before the wait has seen its
// signal, no notify before the block's writes are visible. The "hooks" row is then the least that
// any kernel honouring that contract pays per launch; divide it by a launch's length to get the
// least hooks+% that launch can show (bench/notes/gemm.md, the floor under the hooks).
//
//   usage: signal_floor [--work-us W] [--reps R] [--hot-signals]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "diag_check.hpp"
#include "tilelink/compute/sm90/impl/signal_hooks.cuh"

namespace {

namespace sm90 = tilelink::compute::sm90;

constexpr int kThreads = 256;
constexpr int kSliceBytes = 64 * 1024;  // a 128x256 bf16 tile
constexpr int kVecsPerThread = kSliceBytes / 16 / kThreads;

// Block b is tile (0, b): its wait and notify signals are slot b. The hooks are the engine's own
// SignalHooks, called where the engine calls them: the wait by one warp (lane 0 acquires) before
// any read, the notify by one thread after every thread's writes.
template <class Hooks, bool kProxyFence>
__global__ void __launch_bounds__(kThreads)
    tile_kernel(const uint4* in, uint4* out, Hooks hooks, long long work_cycles) {
  const int b = blockIdx.x;
  const tilelink::TileCoord tile{0, b};
  if constexpr (Hooks::kWaits) {
    if (threadIdx.x < 32) {
      hooks.before_tile_loads(sm90::TileWork{tile});
      __syncwarp();
      // the engine's load warp does this after its wait, before its (async-proxy) TMA loads
      if constexpr (kProxyFence) asm volatile("fence.proxy.async.global;" ::: "memory");
    }
  }
  __syncthreads();
  const uint4* src = in + static_cast<size_t>(b) * (kSliceBytes / 16);
  uint4 acc{0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) {
    const uint4 v = src[i * kThreads + threadIdx.x];
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  const long long t0 = clock64();
  while (clock64() - t0 < work_cycles) {
  }
  uint4* dst = out + static_cast<size_t>(b) * (kSliceBytes / 16);
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) {
    dst[i * kThreads + threadIdx.x] = make_uint4(acc.x + i, acc.y, acc.z, acc.w);
  }
  __syncthreads();
  if constexpr (Hooks::kNotifies) {
    if (threadIdx.x == 0) hooks.after_tile_stored(sm90::TileWork{tile});
  }
}

__global__ void set_signals(uint64_t* signals, int n, uint64_t epoch) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) signals[i] = epoch;
}

// What every variant's hooks point at.
struct Signals {
  uint64_t* wait = nullptr;
  uint64_t* notify = nullptr;
  int tiles = 0;
  uint64_t epoch = 1;  // the value the wait signals hold and the notifies write
  tilelink::cuda::DeviceContext ctx;  // the waits' bound and fault record
};

using Launch = void (*)(const uint4*, uint4*, const Signals&, long long, int, cudaStream_t);
template <tilelink::Scope kScope, bool kWaits, bool kNotifies, bool kProxyFence = false>
void launch_variant(const uint4* in, uint4* out, const Signals& s, long long work_cycles,
                    int blocks, cudaStream_t stream) {
  sm90::SignalHooks<kScope, kWaits, kNotifies> hooks;
  hooks.wait_signals = kWaits ? s.wait : nullptr;
  hooks.notify_signals = kNotifies ? s.notify : nullptr;
  hooks.tiles_n = s.tiles;
  hooks.epoch = s.epoch;
  hooks.ctx = s.ctx;
  tile_kernel<decltype(hooks), kProxyFence>
      <<<blocks, kThreads, 0, stream>>>(in, out, hooks, work_cycles);
}

struct Variant {
  const char* name;
  Launch launch;
};
constexpr auto kDev = tilelink::Scope::kGpu;
constexpr auto kSys = tilelink::Scope::kSystem;
const Variant kVariants[] = {{"plain", launch_variant<kDev, false, false>},
                             {"wait", launch_variant<kDev, true, false>},
                             {"wait+fence", launch_variant<kDev, true, false, true>},
                             {"wait, sys", launch_variant<kSys, true, false, true>},
                             {"notify", launch_variant<kDev, false, true>},
                             {"notify, sys", launch_variant<kSys, false, true>},
                             {"hooks", launch_variant<kDev, true, true>},
                             {"hooks+fence", launch_variant<kDev, true, true, true>},
                             {"plain again", launch_variant<kDev, false, false>}};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void usage() {
  std::fprintf(stderr, "usage: signal_floor [--work-us W] [--reps R] [--hot-signals]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  double work_us = 90.0;
  int reps = 300;
  bool hot = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--work-us" && i + 1 < argc) {
      work_us = std::atof(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--hot-signals") {
      hot = true;
    } else {
      usage();
    }
  }
  if (work_us < 0 || reps < 1) usage();

  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  const int blocks = prop.multiProcessorCount;
  const long long work_cycles = static_cast<long long>(work_us * clock_khz / 1000.0);

  const size_t slice_total = static_cast<size_t>(blocks) * kSliceBytes;
  uint4 *in = nullptr, *out = nullptr;
  uint64_t *wait_signals = nullptr, *notify_signals = nullptr;
  CK(cudaMalloc(&in, slice_total));
  CK(cudaMalloc(&out, slice_total));
  CK(cudaMemset(in, 0x5a, slice_total));
  CK(cudaMalloc(&wait_signals, blocks * sizeof(uint64_t)));
  CK(cudaMalloc(&notify_signals, blocks * sizeof(uint64_t)));
  CK(cudaMemset(notify_signals, 0, blocks * sizeof(uint64_t)));
  // A wait that gives up records here (host-mapped: readable after its trap), claimed via `claim`.
  tilelink::cuda::DeviceFault* stall = nullptr;
  CK(cudaHostAlloc(&stall, sizeof(*stall), cudaHostAllocMapped));
  std::memset(stall, 0, sizeof(*stall));
  unsigned* claim = nullptr;
  CK(cudaMalloc(&claim, sizeof(unsigned)));
  CK(cudaMemset(claim, 0, sizeof(unsigned)));
  tilelink::cuda::DeviceContext ctx;
  ctx.fault = stall, ctx.claim = claim;
  const Signals signals{wait_signals, notify_signals, blocks, 1, ctx};
  const uint64_t epoch = signals.epoch;
  // A wait that gave up (the hooks' bound) wrote where before trapping.
  auto stalled = [&](const char* what) {
    if (stall->claimed == 0) return false;
    std::fprintf(stderr,
                 "signal_floor: %s: block %d's wait (tile (%d, %d), signal slot %d) timed out, "
                 "saw %llu, expected %llu\n",
                 what, stall->slot, 0, stall->tile, stall->slot, stall->observed, stall->expected);
    return true;
  };
  const size_t flush_bytes = size_t(2) * prop.l2CacheSize;
  void* flush = nullptr;
  CK(cudaMalloc(&flush, flush_bytes));
  set_signals<<<(blocks + 255) / 256, 256>>>(wait_signals, blocks, epoch);
  CK(cudaGetLastError());

  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  auto launch = [&](int v) {
    kVariants[v].launch(in, out, signals, work_cycles, blocks, stream);
    CK(cudaGetLastError());
  };
  for (int v = 0; v < kNumVariants; ++v) launch(v);  // warm-up: modules loaded, code seen once
  const cudaError_t warm = cudaStreamSynchronize(stream);
  if (stalled("warm-up")) return 1;
  CK(warm);

  std::vector<std::vector<double>> us(kNumVariants);
  for (int r = 0; r < reps; ++r) {
    for (int i = 0; i < kNumVariants; ++i) {
      const int v = (r + i) % kNumVariants;  // rotated: each variant in every position
      CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, stream));
      if (hot) {
        set_signals<<<(blocks + 255) / 256, 256, 0, stream>>>(wait_signals, blocks, epoch);
        CK(cudaGetLastError());
      }
      CK(cudaEventRecord(start, stream));
      launch(v);
      CK(cudaEventRecord(stop, stream));
      CK(cudaEventSynchronize(stop));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, start, stop));
      us[v].push_back(ms * 1e3);
    }
  }
  if (stalled("timed reps")) return 1;
  // The notify signals: every block must have written the epoch (the notify variants ran).
  std::vector<uint64_t> seen(blocks);
  CK(cudaMemcpy(seen.data(), notify_signals, blocks * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  for (int b = 0; b < blocks; ++b) {
    if (seen[b] != epoch) {
      std::fprintf(stderr, "signal_floor: block %d's notify signal is %llu, not %llu\n", b,
                   static_cast<unsigned long long>(seen[b]),
                   static_cast<unsigned long long>(epoch));
      return 1;
    }
  }

  std::printf(
      "signal_floor: %s, %d blocks x %d threads, 64 KiB read + %.1f us of work + 64 KiB written a "
      "block; L2 flushed before every launch%s; median of %d reps\n",
      prop.name, blocks, kThreads, work_us, hot ? ", wait signals rewritten after it" : "", reps);
  std::printf("%-12s %10s %12s %10s\n", "variant", "launch us", "- plain us", "% of plain");
  const double plain = median(us[0]);
  for (int v = 0; v < kNumVariants; ++v) {
    std::vector<double> d(reps);
    for (int r = 0; r < reps; ++r) d[r] = us[v][r] - us[0][r];
    const double diff = median(d);
    std::printf("%-12s %10.2f %+12.3f %+9.2f%%\n", kVariants[v].name, median(us[v]), diff,
                100.0 * diff / plain);
  }
  CK(cudaFree(flush));
  CK(cudaFree(in));
  CK(cudaFree(out));
  CK(cudaFree(wait_signals));
  CK(cudaFree(notify_signals));
  CK(cudaFreeHost(stall));
  CK(cudaFree(claim));
  return 0;
}
