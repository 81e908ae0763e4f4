// gemm_timeline: where the sm90 engine's time goes inside one launch, per block, with and without the
// wait/notify hooks. A diagnostic, not a benchmark (the marks themselves cost a few stores per block):
// its numbers are compared with each other, never quoted as engine speed.
//
// Built with TL_GEMM_TIMELINE, so the engine (impl/gemm_kernel.cuh) stamps clock64() and %globaltimer
// at fixed points of every block into a per-block record. Every rep flushes L2 (a 2x-L2 memset) before
// each variant, variants in a fresh random order per rep, as `tilelink bench gemm` does. Printed per
// variant: the median over reps of the mean over blocks of each interval, in microseconds.
//
// --warm-code: every timed launch comes right after an untimed launch of the same variant (flush between),
// so the SMs' instruction caches hold its code while its data is cold.
//
//   usage: gemm_timeline [--shapes MxNxK,...] [--reps R] [--hot-signals] [--warm-code]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

__device__ unsigned long long* g_tl_timeline;  // [blocks][32]: 0..15 clock64, 16..31 globaltimer
constexpr int kRecord = 32;

// NOTE: the stamps are read before the record's address is loaded (the "memory" clobbers keep the
// compiler from hoisting that load): a warp's first mark still stalls on that load (a DRAM round trip
// after the flush), which lands in the interval that follows it, alike in every variant.
__device__ __forceinline__ void tl_gemm_timeline_mark(int slot) {
  unsigned long long c, gt;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt)::"memory");
  g_tl_timeline[blockIdx.x * kRecord + slot] = c;
  g_tl_timeline[blockIdx.x * kRecord + 16 + slot] = gt;
}
__device__ __forceinline__ void tl_gemm_timeline_max(int slot) {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  atomicMax(&g_tl_timeline[blockIdx.x * kRecord + slot], c);
}
__device__ __forceinline__ void tl_gemm_timeline_add(int slot, long long v) {
  g_tl_timeline[blockIdx.x * kRecord + slot] += static_cast<unsigned long long>(v);
}

#define TL_GEMM_TIMELINE 1
#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/compute/sm90/impl/gemm_reference.cuh"
#include "tilelink/compute/sm90/impl/signal_hooks.cuh"

namespace {

namespace sm90 = ::tilelink::compute::sm90;
using tilelink::DType;
#define CK(call) TL_SM90_CUDA_CHECK(call)

using Hooks = sm90::SignalHooks<tilelink::Scope::kGpu>;
// NOTE: types of this file only, so that the engine instantiated here (with the marks) is never the
// library's or another tool's instantiation of the same template (one definition rule).
struct DiagNoHooks : sm90::NoHooks {};
struct DiagHooks : Hooks {};
void launch(const sm90::GemmArgs& ga, const Hooks& h, cudaStream_t s) {
  DiagHooks d;
  static_cast<Hooks&>(d) = h;
  sm90::launch_gemm<cutlass::bfloat16_t, __nv_bfloat16>(ga, d, s);
}
__global__ void set_signals(uint64_t* sig, int64_t n, uint64_t epoch) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sig[i] = epoch;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Intervals, per block (microseconds); -1 where the variant has no such mark.
enum Col { kInit, kCEntry, kBarrier, kCoord, kSetup, kWait0, kConsStart, kFirstTile, kWaitsRest, kLoadsDone, kLastStore, kWarpSpread, kWake, kNotify,
           kBlockSpan, kGridSpan, kEntrySpread, kEvent, kCols };
const char* kColNames[kCols] = {"init", "c-entry", "barrier", "coord", "setup", "wait0", "cons0", "tile0", "waits+", "loads", "store", "warps~", "wake",
                                "notify", "block", "grid", "entry~", "event"};

}  // namespace

int main(int argc, char** argv) {
  std::string shapes = "8192x4096x1536,512x8192x8192,8192x1536x4096";
  int reps = 100;
  bool hot = false, repeat = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc) shapes = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--hot-signals")) hot = true;
    else if (!std::strcmp(argv[i], "--warm-code")) repeat = true;
    else { std::fprintf(stderr, "usage: gemm_timeline [--shapes MxNxK,...] [--reps R] [--hot-signals] [--warm-code]\n"); return 2; }
  }
  int dev = 0, l2 = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t flush_bytes = size_t(2) * l2;
  void* flush = nullptr;
  CK(cudaMalloc(&flush, flush_bytes));
  unsigned long long* tl = nullptr;
  const int max_blocks = 1024;
  CK(cudaMalloc(&tl, size_t(max_blocks) * kRecord * 8));
  CK(cudaMemcpyToSymbol(g_tl_timeline, &tl, sizeof(tl)));
  cudaEvent_t ev[2];
  CK(cudaEventCreate(&ev[0]));
  CK(cudaEventCreate(&ev[1]));
  std::printf("# gemm_timeline: per-block intervals in us (median over %d reps of the mean over blocks)%s%s\n", reps,
              hot ? "; hot signals" : "", repeat ? "; warm code (each timed launch right after an untimed one of the same kernel)" : "");
  std::printf("#  init: entry -> warp 0 past the pipeline init; c-entry: entry -> consumer warp 4 starts; barrier:\n"
              "#  entry -> thread 0 past the setup barrier; coord: entry -> the load warp has its first tile;\n"
              "#  setup: entry -> load warp ready for its walk; wait0: the first wait (hook+fence);\n"
              "#  cons0: entry -> consumers start; tile0: entry -> first tile's MMAs done; waits+: the other\n"
              "#  waits, summed; loads: entry -> last TMA issued; store: entry -> last tile stored (warp 4);\n"
              "#  warps~: warp 4's last store -> the last consumer warp's; wake: that -> notify warp woken; notify: the last notify hook; block: entry -> last\n"
              "#  mark (globaltimer); grid: first entry -> last mark of any block; entry~: spread of entries\n");

  std::stringstream ss(shapes);
  std::string item;
  while (std::getline(ss, item, ',')) {
    long long m = 0, n = 0, k = 0;
    if (std::sscanf(item.c_str(), "%lldx%lldx%lld", &m, &n, &k) != 3) { std::fprintf(stderr, "bad shape %s\n", item.c_str()); return 2; }
    void *a, *b, *c;
    CK(cudaMalloc(&a, m * k * 2));
    CK(cudaMalloc(&b, n * k * 2));
    CK(cudaMalloc(&c, m * n * 2));
    sm90::GemmArgs ga;
    ga.a = a, ga.b = b, ga.c = c, ga.m = m, ga.n = n, ga.k = k;
    const tilelink::TileGrid grid = sm90::gemm_tile_grid(ga);  // the launch's tiles (either width)
    uint64_t *wait_sig, *notify_sig;
    CK(cudaMalloc(&wait_sig, grid.num_tiles() * 8));
    CK(cudaMalloc(&notify_sig, grid.num_tiles() * 8));
    set_signals<<<1, 256, 0, stream>>>(wait_sig, grid.num_tiles(), 1);
    CK(cudaGetLastError());
    sm90::reference::fill_uniform(a, DType::kBF16, m * k, 1, 1.f, stream);
    sm90::reference::fill_uniform(b, DType::kBF16, n * k, 2, 1.f, stream);
    const int blocks = sm90::gemm_num_blocks(ga);
    if (blocks > max_blocks) return 2;
    Hooks hooks;
    hooks.wait_signals = wait_sig, hooks.notify_signals = notify_sig, hooks.tiles_n = grid.tiles_n(), hooks.epoch = 1;
    Hooks wait_only = hooks, notify_only = hooks;
    wait_only.notify_signals = nullptr;
    notify_only.wait_signals = nullptr;
    enum { kPlain, kPlain2, kHooks, kWaitOnly, kNotifyOnly, kVariants };
    const char* names[kVariants] = {"plain", "plain'", "hooks", "wait-only", "notify-only"};
    std::vector<std::vector<std::vector<double>>> cols(kVariants, std::vector<std::vector<double>>(kCols));
    std::vector<int> order(kVariants);
    for (int i = 0; i < kVariants; ++i) order[i] = i;
    std::mt19937 rng(12345);
    std::vector<unsigned long long> h(size_t(blocks) * kRecord);
    for (int r = 0; r < reps + 3; ++r) {
      std::shuffle(order.begin(), order.end(), rng);
      for (int v : order) {
       for (int pass = repeat ? 0 : 1; pass < 2; ++pass) {
        CK(cudaMemsetAsync(tl, 0, size_t(blocks) * kRecord * 8, stream));
        CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, stream));
        if (hot) set_signals<<<1, 256, 0, stream>>>(wait_sig, grid.num_tiles(), 1);
        CK(cudaEventRecord(ev[0], stream));
        switch (v) {
          case kPlain: case kPlain2: sm90::launch_gemm<cutlass::bfloat16_t, __nv_bfloat16>(ga, DiagNoHooks{}, stream); break;
          case kHooks: launch(ga, hooks, stream); break;
          case kWaitOnly: launch(ga, wait_only, stream); break;
          case kNotifyOnly: launch(ga, notify_only, stream); break;
        }
        CK(cudaEventRecord(ev[1], stream));
       }
        CK(cudaMemcpyAsync(h.data(), tl, h.size() * 8, cudaMemcpyDeviceToHost, stream));
        CK(cudaStreamSynchronize(stream));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        if (r < 3) continue;
        std::vector<double> sum(kCols, 0);
        std::vector<int> cnt(kCols, 0);
        unsigned long long g_first = ~0ull, g_last = 0, e_first = ~0ull, e_last = 0;
        for (int bk = 0; bk < blocks; ++bk) {
          const unsigned long long* c0 = &h[size_t(bk) * kRecord];
          const unsigned long long* g0 = c0 + 16;
          const unsigned long long g_end = std::max(g0[6], g0[8]);
          const unsigned long long c_end = std::max(c0[6], c0[8]);
          // cycles per ns of this SM over the block's life
          const double cpn = (g_end > g0[0] && c_end > c0[0]) ? double(c_end - c0[0]) / double(g_end - g0[0]) : 1.98;
          auto us = [&](unsigned long long x, unsigned long long y) { return double(int64_t(x - y)) / cpn * 1e-3; };
          auto add = [&](int col, double val) { sum[col] += val, cnt[col]++; };
          add(kInit, us(c0[9], c0[0]));
          add(kCEntry, us(c0[10], c0[0]));
          add(kBarrier, us(c0[11], c0[0]));
          add(kCoord, us(c0[14], c0[0]));
          add(kSetup, us(c0[1], c0[0]));
          add(kWait0, us(c0[2], c0[1]));
          add(kConsStart, us(c0[4], c0[0]));
          add(kFirstTile, us(c0[5], c0[0]));
          add(kWaitsRest, double(c0[3]) / cpn * 1e-3);
          add(kLoadsDone, us(c0[12], c0[0]));
          add(kLastStore, us(c0[6], c0[0]));
          add(kWarpSpread, us(c0[13], c0[6]));
          if (c0[8] != 0 && c0[7] != 0) add(kWake, us(c0[7], c0[13])), add(kNotify, us(c0[8], c0[7]));
          if (c0[8] != 0 && c0[7] == 0) add(kNotify, us(c0[8], c0[13]));  // notified by a consumer
          add(kBlockSpan, double(g_end - g0[0]) * 1e-3);
          g_first = std::min(g_first, g0[0]), g_last = std::max(g_last, g_end);
          e_first = std::min(e_first, g0[0]), e_last = std::max(e_last, g0[0]);
        }
        for (int col = 0; col < kCols; ++col)
          if (cnt[col]) cols[v][col].push_back(sum[col] / cnt[col]);
        cols[v][kGridSpan].push_back(double(g_last - g_first) * 1e-3);
        cols[v][kEntrySpread].push_back(double(e_last - e_first) * 1e-3);
        cols[v][kEvent].push_back(ms * 1e3);
      }
    }
    std::printf("\n## %lldx%lldx%lld, %d blocks, %lld tiles\n%-12s", m, n, k, blocks, (long long)grid.num_tiles(), "variant");
    for (int col = 0; col < kCols; ++col) std::printf(" %8s", kColNames[col]);
    std::printf("\n");
    for (int v = 0; v < kVariants; ++v) {
      std::printf("%-12s", names[v]);
      for (int col = 0; col < kCols; ++col) {
        if (cols[v][col].empty()) std::printf(" %8s", "-");
        else std::printf(" %8.3f", median(cols[v][col]));
      }
      std::printf("\n");
    }
    std::fflush(stdout);
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    CK(cudaFree(wait_sig));
    CK(cudaFree(notify_sig));
  }
  CK(cudaFree(flush));
  CK(cudaFree(tl));
  return 0;
}
