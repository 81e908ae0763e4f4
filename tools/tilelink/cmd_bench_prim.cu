// tilelink bench prim: the primitives on the GPU, one table.
//   one-way notify->wait latency per scope (block: two warps of a block; gpu and system: two
//   blocks), SM-driven copy bandwidth against the number of SMs (pull and push, vector and bulk),
//   copy-engine bandwidth, and how few SMs each SM method needs for a target bandwidth.
// Runs on a virtual world of two ranks (green contexts): rank 0's kernels copy from (pull) or to
// (push) rank 1's buffer. CUDA events, warm-up, median of --reps repetitions.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cli {
namespace {

using namespace tilelink::cuda;

// Bulk copies: `pipes` independent pipelines per block (one issuing thread each, in its own warp),
// each of `stages` shared-memory stages; set by --bulk-pipes/--bulk-stages/--bulk-stage-kib.
struct BulkShape {
  int pipes = 2, stages = 4, prefetch = 0;
  uint32_t stage_bytes = 24 * 1024;
  size_t smem() const { return size_t(pipes) * stages * (stage_bytes + 8); }
};
// NOTE: the vector kernel asks for this much (unused) shared memory so that exactly one block runs
// per SM: the SM count of a measurement is its grid size.
constexpr size_t kOneBlockPerSmSmem = 160 * 1024;

template <Scope S>
__global__ void pingpong(SymmetricView heap, DeviceContext ctx, Field<Signal> f, uint64_t base,
                         int iters) {
  if (threadIdx.x % 32 != 0) return;
  const int who = S == Scope::kBlock ? static_cast<int>(threadIdx.x / 32) : static_cast<int>(blockIdx.x);
  for (uint64_t e = base + 1; e <= base + static_cast<uint64_t>(iters); ++e) {
    if (who == 0) {
      producer_tile_notify<S>(ctx, heap, f, 0, e);
      consumer_tile_wait<S>(ctx, heap, f, 1, e, WaitSite{"pong", -1});
    } else {
      consumer_tile_wait<S>(ctx, heap, f, 0, e, WaitSite{"ping", -1});
      producer_tile_notify<S>(ctx, heap, f, 1, e);
    }
  }
}

// Part `part` of `parts` of a flat copy, cut at 128-byte lines so that every part starts aligned.
__device__ Copy2D slice_of(const Copy2D& all, int64_t part, int64_t parts) {
  const int64_t lines = all.row_bytes / 128;
  const int64_t per = (lines + parts - 1) / parts;
  const int64_t b = min64(lines, per * part), e = part == parts - 1 ? -1 : min64(lines, b + per);
  const int64_t end = e < 0 ? all.row_bytes : e * 128;
  return Copy2D{static_cast<const char*>(all.src) + b * 128, 0, static_cast<char*>(all.dst) + b * 128,
                0, 1, end - b * 128};
}

__global__ void bw_vector(DeviceContext ctx, Copy2D all, int peer, bool push) {
  const Copy2D c = slice_of(all, blockIdx.x, gridDim.x);
  const Block block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  if (push) tile_push_data(ctx, peer, c, block);
  else tile_pull_data(ctx, peer, c, block);
}

__global__ void bw_bulk(DeviceContext ctx, Copy2D all, int peer, bool push, BulkShape shape) {
  extern __shared__ __align__(128) unsigned char smem[];
  if (threadIdx.x % 32 != 0) return;
  const int pipe_id = threadIdx.x / 32;
  const Copy2D c = slice_of(all, int64_t(blockIdx.x) * shape.pipes + pipe_id, int64_t(gridDim.x) * shape.pipes);
  unsigned char* mine = smem + size_t(pipe_id) * shape.stages * shape.stage_bytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + size_t(shape.pipes) * shape.stages * shape.stage_bytes) +
                   pipe_id * shape.stages;
  BulkPipe pipe;
  pipe.init(mine, bars, shape.stages, shape.stage_bytes, ctx);
  pipe.set_prefetch(shape.prefetch);
  if (push) tile_push_data(ctx, peer, c, pipe);
  else tile_pull_data(ctx, peer, c, pipe);
}

TL_REGISTER_KERNELS(pingpong<Scope::kBlock>, pingpong<Scope::kGpu>, pingpong<Scope::kSystem>,
                    bw_vector, bw_bulk);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median time (ms) of fn() enqueued on `stream`, after one warm-up.
template <class Fn>
double time_ms(cudaStream_t stream, World& w, int reps, Fn fn) {
  cudaEvent_t a, b;
  TL_CUDA_CHECK(cudaEventCreate(&a));
  TL_CUDA_CHECK(cudaEventCreate(&b));
  fn();
  w.sync("bench prim");
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    TL_CUDA_CHECK(cudaEventRecord(a, stream));
    fn();
    TL_CUDA_CHECK(cudaEventRecord(b, stream));
    w.sync("bench prim");
    float ms = 0;
    TL_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

int bench_prim(Args& args) {
  const int64_t bytes = args.get_int("--bytes", 256ll << 20);
  const int reps = static_cast<int>(args.get_int("--reps", 7));
  const int iters = static_cast<int>(args.get_int("--iters", 20000));
  int max_sms = static_cast<int>(args.get_int("--max-sms", 32));
  const double target = args.get_double("--target-gbps", 450);
  const int threads = static_cast<int>(args.get_int("--threads", 1024));
  const bool csv = args.flag("--csv");
  BulkShape shape;
  shape.pipes = static_cast<int>(args.get_int("--bulk-pipes", shape.pipes));
  shape.stages = static_cast<int>(args.get_int("--bulk-stages", shape.stages));
  shape.prefetch = static_cast<int>(args.get_int("--bulk-prefetch", shape.prefetch));
  shape.stage_bytes = static_cast<uint32_t>(args.get_int("--bulk-stage-kib", shape.stage_bytes / 1024) * 1024);
  args.finish();
  TL_REQUIRE(shape.pipes >= 1 && shape.pipes <= 32 && shape.stages >= 2 && shape.stage_bytes >= 1024,
             "--bulk-pipes in [1, 32], --bulk-stages >= 2, --bulk-stage-kib >= 1");
  TL_REQUIRE(bytes >= (1 << 20) && bytes % 16 == 0, "--bytes must be >= 1 MiB and a multiple of 16");
  TL_REQUIRE(reps >= 1 && iters >= 1, "--reps and --iters must be >= 1");
  TL_REQUIRE(threads >= 32 && threads <= 1024 && threads % 32 == 0, "--threads: a multiple of 32 up to 1024");

  World w({.transport = Transport::kVirtual, .world_size = 2});
  TL_REQUIRE(max_sms >= 1, "--max-sms must be >= 1");
  max_sms = std::min(max_sms, w.sm_count(0));
  cudaDeviceProp prop{};
  TL_CUDA_CHECK(cudaGetDeviceProperties(&prop, w.device(0)));

  LayoutBuilder lb;
  Field<Signal> flags = lb.add<Signal>(2);
  ByteField data = lb.add<std::byte>(bytes);
  SymmetricBuffer buf = w.allocate(lb.num_bytes());
  const SymmetricView v0 = buf.view(0);
  const DeviceContext ctx = w.device_context(0);
  cudaStream_t s0 = w.stream(0);
  w.bind(0);
  TL_REQUIRE(shape.smem() <= static_cast<size_t>(prop.sharedMemPerBlockOptin),
             "bulk pipelines need " << shape.smem() << " bytes of shared memory, the GPU gives a block "
                                    << prop.sharedMemPerBlockOptin);
  TL_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(bw_bulk),
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, int(shape.smem())));
  TL_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(bw_vector),
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, int(kOneBlockPerSmSmem)));

  // ---- latency ----
  uint64_t base = 0;
  auto latency_us = [&](auto kernel, int grid, int block) {
    double ms = time_ms(s0, w, reps, [&] {
      kernel<<<grid, block, 0, s0>>>(v0, ctx, flags, base, iters);
      TL_CUDA_CHECK(cudaGetLastError());
      base += iters;
    });
    return ms * 1e3 / (2.0 * iters);
  };
  const double lat_block = latency_us(pingpong<Scope::kBlock>, 1, 64);
  const double lat_gpu = latency_us(pingpong<Scope::kGpu>, 2, 32);
  const double lat_sys = latency_us(pingpong<Scope::kSystem>, 2, 32);

  // ---- SM-driven bandwidth, SMs 1..max_sms ----
  std::byte* local = v0.local(data);
  std::byte* remote = v0.peer(1, data);
  struct Method { const char* name; bool bulk, push; std::vector<double> gbps; };
  std::vector<Method> methods = {{"vector pull", false, false, {}}, {"vector push", false, true, {}},
                                 {"bulk pull", true, false, {}},    {"bulk push", true, true, {}}};
  for (Method& m : methods) {
    const Copy2D all = m.push ? Copy2D{local, 0, remote, 0, 1, bytes} : Copy2D{remote, 0, local, 0, 1, bytes};
    for (int n = 1; n <= max_sms; ++n) {
      double ms = time_ms(s0, w, reps, [&] {
        // NOTE: the bulk kernel's shared memory may let two blocks share an SM when small; the
        // vector kernel's padding keeps one per SM, so the grid is the SM count for both only when
        // shape.smem() > half an SM's shared memory (the default shape is).
        if (m.bulk) bw_bulk<<<n, 32 * shape.pipes, shape.smem(), s0>>>(ctx, all, 1, m.push, shape);
        else bw_vector<<<n, threads, kOneBlockPerSmSmem, s0>>>(ctx, all, 1, m.push);
        TL_CUDA_CHECK(cudaGetLastError());
      });
      m.gbps.push_back(bytes / (ms * 1e-3) / 1e9);
    }
  }

  // ---- copy engine, between a stream wait and a stream write ----
  StreamContext sc{&w, 0, s0, "bench prim"};
  double ce_ms = time_ms(s0, w, reps, [&] {
    ++base;
    producer_tile_notify(sc, v0, flags, 0, base);
    consumer_tile_wait(sc, v0, flags, 0, base, WaitSite{"ce", -1});
    rank_copy_data(sc, 1, Copy2D{remote, bytes, local, bytes, 1, bytes});
    producer_tile_notify(sc, v0, flags, 1, base);
  });
  const double ce_gbps = bytes / (ce_ms * 1e-3) / 1e9;

  auto sms_for = [&](const Method& m) {
    for (int n = 1; n <= max_sms; ++n)
      if (m.gbps[n - 1] >= target) return std::to_string(n);
    return std::string(">") + std::to_string(max_sms);
  };
  std::vector<int> cols;
  for (int n : {1, 2, 4, 8, 12, 16, 24, 32})
    if (n <= max_sms) cols.push_back(n);

  if (csv) {
    std::printf("what,unit,sms,value\n");
    std::printf("latency block,us,,%.3f\nlatency gpu,us,,%.3f\nlatency system,us,,%.3f\n", lat_block, lat_gpu, lat_sys);
    for (const Method& m : methods)
      for (int n = 1; n <= max_sms; ++n) std::printf("%s,GB/s,%d,%.1f\n", m.name, n, m.gbps[n - 1]);
    std::printf("copy engine,GB/s,,%.1f\n", ce_gbps);
    return 0;
  }
  std::printf("tilelink bench prim: %s, %d SMs; virtual world of 2 ranks (%d + %d SMs); %lld MiB copies; "
              "median of %d after warm-up; %d round trips per latency sample; vector: %d threads, "
              "8 x 16 B in flight each; bulk: %d pipes x %d stages x %u KiB per SM, L2 prefetch %d chunks ahead\n",
              prop.name, prop.multiProcessorCount, w.sm_count(0), w.sm_count(1),
              static_cast<long long>(bytes >> 20), reps, iters, threads, shape.pipes, shape.stages,
              shape.stage_bytes / 1024, shape.prefetch);
  std::printf("%-26s %-5s", "measurement", "unit");
  for (int n : cols) std::printf(" %7s", (std::to_string(n) + "SM").c_str());
  std::printf("  %s\n", (std::string("SMs for ") + std::to_string(static_cast<int>(target)) + " GB/s").c_str());
  std::printf("%-26s %-5s %7.3f\n", "one-way latency, block", "us", lat_block);
  std::printf("%-26s %-5s %7.3f\n", "one-way latency, gpu", "us", lat_gpu);
  std::printf("%-26s %-5s %7.3f\n", "one-way latency, system", "us", lat_sys);
  for (const Method& m : methods) {
    std::printf("%-26s %-5s", (std::string("SM copy, ") + m.name).c_str(), "GB/s");
    for (int n : cols) std::printf(" %7.0f", m.gbps[n - 1]);
    std::printf("  %s\n", sms_for(m).c_str());
  }
  std::printf("%-26s %-5s %7.0f  (no SMs)\n", "copy engine (stream ops)", "GB/s", ce_gbps);
  return 0;
}

TILELINK_REGISTER_COMMAND("bench prim",
                          "[--bytes N] [--reps N] [--iters N] [--max-sms N] [--threads N] "
                          "[--target-gbps X] [--bulk-pipes N] [--bulk-stages N] [--bulk-stage-kib N] [--bulk-prefetch CHUNKS] [--csv]",
                          "signal latency per scope, SM copy bandwidth vs SMs, copy engine", bench_prim,
                          {"--csv"});

}  // namespace
}  // namespace tilelink::cli
