// tilelink bench prim: the primitives on the GPU, one table.
//   one-way notify->wait latency per scope (block: two warps of a block; gpu and system: two
//   blocks), SM-driven copy bandwidth against the number of SMs (pull and push, vector and bulk),
//   copy-engine bandwidth, and how few SMs each SM method needs for a target bandwidth.
// Runs on a virtual world of two ranks (green contexts): rank 0's kernels copy from (pull) or to
// (push) rank 1's buffer. CUDA events, warm-up, median of --reps repetitions.
// With two GPUs or more, a second table: the same copies between GPU 0 and GPU 1 (peer transport,
// NVLink): GPU 0's SMs reading (pull) or writing (push) GPU 1's memory, and the copy engine.
// Diagnostic rows: SMs only reading or only writing (the copy moves each byte in and out of the SM),
// and vector copies of other depths, to show what limits an SM's copy rate.
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
      consumer_tile_wait<S>(ctx, heap, f, 1, e, WaitSite{SignalField::kProbe, -1});
    } else {
      consumer_tile_wait<S>(ctx, heap, f, 0, e, WaitSite{SignalField::kProbe, -1});
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

// NOTE: the launch bound caps the registers (16 in flight wants ~170 a thread, too many for 512).
template <class Tuning, int kThreads>
__global__ void __launch_bounds__(kThreads, 1) bw_vector(DeviceContext, Copy2D all, bool) {
  const Copy2D c = slice_of(all, blockIdx.x, gridDim.x);
  const Block block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  ::tilelink::cuda::detail::copy_2d<Tuning>(c, block);
}

// Diagnostics: an SM only reading (8 x 16 B in flight per thread, folded into one word) or only
// writing 16-byte vectors. `all.src` is read / `all.dst` written.
__global__ void bw_read_only(DeviceContext, Copy2D all, bool) {
  const Copy2D c = slice_of(all, blockIdx.x, gridDim.x);
  const uint4* src = static_cast<const uint4*>(c.src);
  const int64_t n = c.row_bytes / 16;
  uint32_t acc = 0;
  for (int64_t base = threadIdx.x; base < n; base += int64_t(blockDim.x) * 8) {
    uint4 r[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int64_t i = base + int64_t(u) * blockDim.x;
      r[u] = i < n ? src[i] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
  }
  if (acc == 0x9e3779b9u) static_cast<uint32_t*>(all.dst)[0] = acc;  // keeps the loads alive
}

__global__ void bw_write_only(DeviceContext, Copy2D all, bool) {
  const Copy2D c = slice_of(all, blockIdx.x, gridDim.x);
  uint4* dst = static_cast<uint4*>(c.dst);
  const int64_t n = c.row_bytes / 16;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    dst[i] = make_uint4(uint32_t(i), uint32_t(i >> 32), 1u, 2u);
}

// The calling pipe's (one warp's) part of a bulk kernel: its slice of the copy, its shared-memory
// stages and its mbarriers (after every pipe's stages).
struct PipeSlice {
  Copy2D copy;
  unsigned char* stages;
  uint64_t* bars;
};
__device__ PipeSlice pipe_slice(unsigned char* smem, const Copy2D& all, const BulkShape& shape) {
  const int pipe_id = threadIdx.x / 32;
  return {slice_of(all, int64_t(blockIdx.x) * shape.pipes + pipe_id, int64_t(gridDim.x) * shape.pipes),
          smem + size_t(pipe_id) * shape.stages * shape.stage_bytes,
          reinterpret_cast<uint64_t*>(smem + size_t(shape.pipes) * shape.stages * shape.stage_bytes) +
              pipe_id * shape.stages};
}

__global__ void bw_bulk(DeviceContext ctx, Copy2D all, bool push, BulkShape shape) {
  extern __shared__ __align__(128) unsigned char smem[];
  if (threadIdx.x % 32 != 0) return;
  const PipeSlice ps = pipe_slice(smem, all, shape);
  BulkPipe pipe;
  pipe.init(ps.stages, ps.bars, shape.stages, shape.stage_bytes, ctx);
  pipe.set_prefetch(shape.prefetch);
  if (push) tile_push_data(ctx, 1, ps.copy, pipe);
  else tile_pull_data(ctx, 1, ps.copy, pipe);
}

// Diagnostics of the bulk (TMA) path alone, per pipe: loads into shared memory that nothing stores
// (bytes read), or stores from shared memory that nothing loaded (bytes written, up to `stages` bulk
// groups in flight). Do the bulk engine's own reads or writes go faster than the vector rows'?
__device__ void bulk_spin_fail(const DeviceContext& ctx, uint64_t chunk, uint64_t t0) {
  ::tilelink::cuda::detail::fail_wait(ctx, ctx.rank, -1, static_cast<int>(chunk), SignalField::kProbe, 0, 0,
                                      ::tilelink::cuda::detail::now_ns() - t0, 1);
}

__global__ void bw_bulk_read_only(DeviceContext ctx, Copy2D all, bool, BulkShape shape) {
  extern __shared__ __align__(128) unsigned char smem[];
  if (threadIdx.x % 32 != 0) return;
  const PipeSlice ps = pipe_slice(smem, all, shape);
  const Copy2D& c = ps.copy;
  unsigned char* mine = ps.stages;
  uint64_t* bars = ps.bars;
  for (int s = 0; s < shape.stages; ++s) ::cuda::ptx::mbarrier_init(&bars[s], 1);
  ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  const char* src = static_cast<const char*>(c.src);
  const uint64_t n = (static_cast<uint64_t>(c.row_bytes) + shape.stage_bytes - 1) / shape.stage_bytes;
  auto wait = [&](uint64_t chunk) {
    const uint32_t parity = static_cast<uint32_t>((chunk / shape.stages) & 1);
    const uint64_t t0 = ::tilelink::cuda::detail::now_ns();
    while (!::cuda::ptx::mbarrier_try_wait_parity(&bars[chunk % shape.stages], parity))
      if (::tilelink::cuda::detail::now_ns() - t0 > ctx.timeout_ns) bulk_spin_fail(ctx, chunk, t0);
  };
  for (uint64_t j = 0; j < n; ++j) {
    if (j >= static_cast<uint64_t>(shape.stages)) wait(j - shape.stages);
    const uint64_t off = j * shape.stage_bytes;
    const uint32_t bytes = static_cast<uint32_t>(min64(c.row_bytes - static_cast<int64_t>(off), shape.stage_bytes));
    uint64_t* bar = &bars[j % shape.stages];
    ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                           ::cuda::ptx::space_shared, bar, bytes);
    ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global,
                               mine + (j % shape.stages) * shape.stage_bytes, src + off, bytes, bar);
  }
  for (uint64_t j = n > static_cast<uint64_t>(shape.stages) ? n - shape.stages : 0; j < n; ++j) wait(j);
}

__global__ void bw_bulk_write_only(DeviceContext, Copy2D all, bool, BulkShape shape) {
  extern __shared__ __align__(128) unsigned char smem[];
  if (threadIdx.x % 32 != 0) return;
  const PipeSlice ps = pipe_slice(smem, all, shape);
  const Copy2D& c = ps.copy;
  unsigned char* mine = ps.stages;
  char* dst = static_cast<char*>(c.dst);
  const uint64_t n = (static_cast<uint64_t>(c.row_bytes) + shape.stage_bytes - 1) / shape.stage_bytes;
  for (uint64_t j = 0; j < n; ++j) {
    const uint64_t off = j * shape.stage_bytes;
    const uint32_t bytes = static_cast<uint32_t>(min64(c.row_bytes - static_cast<int64_t>(off), shape.stage_bytes));
    ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared, dst + off,
                               mine + (j % shape.stages) * shape.stage_bytes, bytes);
    ::cuda::ptx::cp_async_bulk_commit_group();
    ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<4>{});  // at most 5 groups in flight
  }
  ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<0>{});
}

// Diagnostic: a copy that reads with 16-byte vector loads (the load/store unit) and writes with bulk
// stores from shared memory (the TMA unit), so the two directions use different units. 512 threads;
// each warp moves 4 KiB chunks (8 vectors a lane) through two 4 KiB shared-memory stages of its own.
constexpr int kHybridThreads = 512;
constexpr int kHybridChunk = 32 * 8 * 16;
constexpr size_t kHybridSmem = size_t(kHybridThreads / 32) * 2 * kHybridChunk;

__global__ void __launch_bounds__(kHybridThreads, 1) bw_hybrid(DeviceContext, Copy2D all, bool) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Copy2D c = slice_of(all, blockIdx.x, gridDim.x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  unsigned char* stages = smem + size_t(warp) * 2 * kHybridChunk;
  const char* src = static_cast<const char*>(c.src);
  char* dst = static_cast<char*>(c.dst);
  const int64_t chunks = c.row_bytes / kHybridChunk;
  for (int64_t i = chunks * kHybridChunk / 16 + threadIdx.x; i < c.row_bytes / 16; i += blockDim.x)  // the tail
    reinterpret_cast<uint4*>(c.dst)[i] = reinterpret_cast<const uint4*>(c.src)[i];
  int k = 0;
  for (int64_t ch = warp; ch < chunks; ch += warps, ++k) {
    unsigned char* stage = stages + (k & 1) * kHybridChunk;
    if (k >= 2) {
      if (lane == 0) ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<1>{});
      __syncwarp();
    }
    uint4 v[8];
    const uint4* from = reinterpret_cast<const uint4*>(src + ch * kHybridChunk);
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = from[u * 32 + lane];
#pragma unroll
    for (int u = 0; u < 8; ++u) reinterpret_cast<uint4*>(stage)[u * 32 + lane] = v[u];
    ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);  // the stores, before the bulk engine reads
    __syncwarp();
    if (lane == 0) {
      ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared, dst + ch * kHybridChunk,
                                 stage, kHybridChunk);
      ::cuda::ptx::cp_async_bulk_commit_group();
    }
  }
  if (lane == 0) ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<0>{});
}

using VecDefault = ::tilelink::cuda::detail::VectorTuning<>;        // what the primitives use: 8 in flight
using VecShallow = ::tilelink::cuda::detail::VectorTuning<4>;       // half the depth
using VecDeep = ::tilelink::cuda::detail::VectorTuning<16>;         // twice the depth (512 threads: the registers)
using VecNoL1 = ::tilelink::cuda::detail::VectorTuning<8, true>;    // loads not allocated in L1

TL_REGISTER_KERNELS(pingpong<Scope::kBlock>, pingpong<Scope::kGpu>, pingpong<Scope::kSystem>,
                    bw_vector<VecDefault, 1024>, bw_vector<VecShallow, 1024>, bw_vector<VecDeep, 512>,
                    bw_vector<VecNoL1, 1024>, bw_read_only, bw_write_only, bw_bulk, bw_bulk_read_only,
                    bw_bulk_write_only, bw_hybrid);

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

using VecKernel = void (*)(DeviceContext, Copy2D, bool);
using BulkKernel = void (*)(DeviceContext, Copy2D, bool, BulkShape);

// One row of a bandwidth table: a kernel (vector-style, or bulk when null) at 1..max_sms SMs.
struct Method {
  std::string name;
  VecKernel vec;  // nullptr: a bulk kernel (`bulk`)
  bool push;      // pull: remote -> local; push: local -> remote
  int threads;    // vector-style kernels
  enum Traffic { kCopy, kReadOnly, kWriteOnly } traffic = kCopy;
  BulkKernel bulk = bw_bulk;
  std::vector<double> gbps;
};

struct BenchSetup {
  int reps, max_sms, vec_threads;
  int64_t bytes;
  double target;
  BulkShape shape;
};

// Raises the dynamic shared memory limit of every kernel of the table in the current context
// (NOTE: per context: each green context loads its own copy of the kernel).
void set_smem_limits(const BenchSetup& b, const std::vector<Method>& methods) {
  for (BulkKernel k : {bw_bulk, bw_bulk_read_only, bw_bulk_write_only})
    TL_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(k), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(b.shape.smem())));
  for (const Method& m : methods)
    if (m.vec)
      TL_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(m.vec),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(kOneBlockPerSmSmem)));
  static_assert(kHybridSmem <= kOneBlockPerSmSmem, "the hybrid copy's stages live in the one-block-per-SM smem");
}

// Fills m.gbps for SM counts 1..max_sms: rank 0's kernels between `local` (rank 0's) and `remote`.
void measure_sm_methods(World& w, const BenchSetup& b, std::byte* local, std::byte* remote,
                        std::vector<Method>& methods) {
  const DeviceContext ctx = w.device_context(0);
  cudaStream_t s0 = w.stream(0);
  w.bind(0);
  set_smem_limits(b, methods);
  for (Method& m : methods) {
    Copy2D all = m.push ? Copy2D{local, 0, remote, 0, 1, b.bytes} : Copy2D{remote, 0, local, 0, 1, b.bytes};
    if (m.traffic == Method::kReadOnly) all = Copy2D{remote, 0, local, 0, 1, b.bytes};
    if (m.traffic == Method::kWriteOnly) all = Copy2D{local, 0, remote, 0, 1, b.bytes};
    for (int n = 1; n <= b.max_sms; ++n) {
      double ms = time_ms(s0, w, b.reps, [&] {
        // NOTE: the vector kernels' unused shared memory keeps one block per SM, so the grid is the
        // SM count; the bulk kernel's too while shape.smem() > half an SM's (the default shape).
        if (!m.vec) m.bulk<<<n, 32 * b.shape.pipes, b.shape.smem(), s0>>>(ctx, all, m.push, b.shape);
        else m.vec<<<n, m.threads, kOneBlockPerSmSmem, s0>>>(ctx, all, m.push);
        TL_CUDA_CHECK(cudaGetLastError());
      });
      m.gbps.push_back(b.bytes / (ms * 1e-3) / 1e9);
    }
  }
}

// Copy engine between a stream wait and a stream write (the comm programs' pattern), GB/s.
double measure_copy_engine(World& w, const BenchSetup& b, const SymmetricView& v0, Field<Signal> flags,
                           uint64_t* base, const void* src, void* dst) {
  cudaStream_t s0 = w.stream(0);
  w.bind(0);
  StreamContext sc{&w, 0, s0, "bench prim"};
  double ms = time_ms(s0, w, b.reps, [&] {
    ++*base;
    producer_tile_notify(sc, v0, flags, 0, *base);
    consumer_tile_wait(sc, v0, flags, 0, *base, WaitSite{SignalField::kProbe, -1});
    rank_copy_data(sc, 1, Copy2D{src, b.bytes, dst, b.bytes, 1, b.bytes});
    producer_tile_notify(sc, v0, flags, 1, *base);
  });
  return b.bytes / (ms * 1e-3) / 1e9;
}

std::string sms_for(const Method& m, double target, int max_sms) {
  for (int n = 1; n <= max_sms; ++n)
    if (m.gbps[n - 1] >= target) return std::to_string(n);
  return std::string(">") + std::to_string(max_sms);
}

// The fewest SMs that reach 95% of the row's best (where a link, not the SMs, is the limit).
std::string sms_for_95(const Method& m, int max_sms) {
  const double best = *std::max_element(m.gbps.begin(), m.gbps.end());
  return sms_for(m, 0.95 * best, max_sms) + " (" + std::to_string(static_cast<int>(0.95 * best + 0.5)) + ")";
}

void print_header(const std::vector<int>& cols, double target) {
  std::printf("%-39s %-5s", "measurement", "unit");
  for (int n : cols) std::printf(" %7s", (std::to_string(n) + "SM").c_str());
  std::printf("  %-16s %s\n", (std::string("SMs for ") + std::to_string(static_cast<int>(target)) + " GB/s").c_str(),
              "SMs for 95% of best (GB/s)");
}

void print_rows(const std::vector<Method>& methods, const std::vector<int>& cols, double target, int max_sms,
                const char* prefix) {
  for (const Method& m : methods) {
    std::printf("%-39s %-5s", (std::string(prefix) + m.name).c_str(), "GB/s");
    for (int n : cols) std::printf(" %7.0f", m.gbps[n - 1]);
    std::printf("  %-16s %s\n", sms_for(m, target, max_sms).c_str(), sms_for_95(m, max_sms).c_str());
  }
}

void print_csv(const std::vector<Method>& methods, int max_sms, const char* prefix) {
  for (const Method& m : methods)
    for (int n = 1; n <= max_sms; ++n) std::printf("%s%s,GB/s,%d,%.1f\n", prefix, m.name.c_str(), n, m.gbps[n - 1]);
}

// The methods of a table: the primitives' two SM methods (pull and push), then diagnostics.
std::vector<Method> table_methods(int vec_threads, bool diagnostics) {
  std::vector<Method> m = {
      {"vector pull", bw_vector<VecDefault, 1024>, false, vec_threads},
      {"vector push", bw_vector<VecDefault, 1024>, true, vec_threads},
      {"bulk pull", nullptr, false, 0},
      {"bulk push", nullptr, true, 0},
  };
  if (diagnostics) {
    m.push_back({"vector pull, 4 in flight", bw_vector<VecShallow, 1024>, false, vec_threads});
    m.push_back({"vector pull, 16 in flight x512", bw_vector<VecDeep, 512>, false, 512});
    m.push_back({"vector pull, no L1 alloc", bw_vector<VecNoL1, 1024>, false, vec_threads});
    m.push_back({"read only (bytes read)", bw_read_only, false, vec_threads, Method::kReadOnly});
    m.push_back({"write only (bytes written)", bw_write_only, true, vec_threads, Method::kWriteOnly});
    m.push_back({"vector loads + bulk stores", bw_hybrid, false, kHybridThreads});
    m.push_back({"bulk read only (bytes read)", nullptr, false, 0, Method::kReadOnly, bw_bulk_read_only});
    m.push_back({"bulk write only (bytes written)", nullptr, true, 0, Method::kWriteOnly, bw_bulk_write_only});
  }
  return m;
}

int bench_prim(Args& args) {
  BenchSetup b;
  b.bytes = args.get_int("--bytes", 256ll << 20);
  b.reps = static_cast<int>(args.get_int("--reps", 7));
  const int iters = static_cast<int>(args.get_int("--iters", 20000));
  b.max_sms = static_cast<int>(args.get_int("--max-sms", 32));
  b.target = args.get_double("--target-gbps", 450);
  b.vec_threads = static_cast<int>(args.get_int("--threads", 1024));
  const bool csv = args.flag("--csv");
  const bool diagnostics = !args.flag("--no-diagnostics");
  const std::string peer_opt = args.get("--peer", "auto");
  b.shape.pipes = static_cast<int>(args.get_int("--bulk-pipes", b.shape.pipes));
  b.shape.stages = static_cast<int>(args.get_int("--bulk-stages", b.shape.stages));
  b.shape.prefetch = static_cast<int>(args.get_int("--bulk-prefetch", b.shape.prefetch));
  b.shape.stage_bytes = static_cast<uint32_t>(args.get_int("--bulk-stage-kib", b.shape.stage_bytes / 1024) * 1024);
  args.finish();
  const BulkShape& shape = b.shape;
  TL_REQUIRE(shape.pipes >= 1 && shape.pipes <= 32 && shape.stages >= 2 && shape.stage_bytes >= 1024,
             "--bulk-pipes in [1, 32], --bulk-stages >= 2, --bulk-stage-kib >= 1");
  TL_REQUIRE(b.bytes >= (1 << 20) && b.bytes % 16 == 0, "--bytes must be >= 1 MiB and a multiple of 16");
  TL_REQUIRE(b.reps >= 1 && iters >= 1, "--reps and --iters must be >= 1");
  TL_REQUIRE(b.vec_threads >= 32 && b.vec_threads <= 1024 && b.vec_threads % 32 == 0,
             "--threads: a multiple of 32 up to 1024");
  TL_REQUIRE(peer_opt == "auto" || peer_opt == "on" || peer_opt == "off", "--peer: auto, on or off");
  TL_REQUIRE(b.max_sms >= 1, "--max-sms must be >= 1");
  int gpus = 0;
  TL_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  const bool peer = peer_opt == "on" || (peer_opt == "auto" && gpus >= 2);
  TL_REQUIRE(!peer || gpus >= 2, "--peer on needs two GPUs, this machine has " << gpus);

  LayoutBuilder lb;
  Field<Signal> flags = lb.add<Signal>(2);
  ByteField data = lb.add<std::byte>(b.bytes);
  uint64_t base = 0;
  std::vector<Method> methods = table_methods(b.vec_threads, diagnostics);
  double lat_block = 0, lat_gpu = 0, lat_sys = 0, ce_gbps = 0;
  cudaDeviceProp prop{};
  int sms0 = 0, sms1 = 0;
  {
    World w({.transport = Transport::kVirtual, .world_size = 2});
    b.max_sms = std::min(b.max_sms, w.sm_count(0));
    sms0 = w.sm_count(0), sms1 = w.sm_count(1);
    TL_CUDA_CHECK(cudaGetDeviceProperties(&prop, w.device(0)));
    TL_REQUIRE(shape.smem() <= static_cast<size_t>(prop.sharedMemPerBlockOptin),
               "bulk pipelines need " << shape.smem() << " bytes of shared memory, the GPU gives a block "
                                      << prop.sharedMemPerBlockOptin);
    SymmetricBuffer buf = w.allocate(lb.num_bytes());
    const SymmetricView v0 = buf.view(0);
    const DeviceContext ctx = w.device_context(0);
    cudaStream_t s0 = w.stream(0);
    w.bind(0);

    // ---- latency ----
    auto latency_us = [&](auto kernel, int grid, int block) {
      double ms = time_ms(s0, w, b.reps, [&] {
        kernel<<<grid, block, 0, s0>>>(v0, ctx, flags, base, iters);
        TL_CUDA_CHECK(cudaGetLastError());
        base += iters;
      });
      return ms * 1e3 / (2.0 * iters);
    };
    lat_block = latency_us(pingpong<Scope::kBlock>, 1, 64);
    lat_gpu = latency_us(pingpong<Scope::kGpu>, 2, 32);
    lat_sys = latency_us(pingpong<Scope::kSystem>, 2, 32);

    // ---- SM-driven bandwidth, SMs 1..max_sms; the copy engine ----
    std::byte* local = v0.local(data);
    std::byte* remote = v0.peer(1, data);
    measure_sm_methods(w, b, local, remote, methods);
    ce_gbps = measure_copy_engine(w, b, v0, flags, &base, remote, local);
  }

  // ---- the same between two GPUs (peer transport): GPU 0's SMs and copy engine, GPU 1's memory ----
  std::vector<Method> peer_methods;
  double ce_pull = 0, ce_push = 0;
  int peer_max_sms = b.max_sms;
  if (peer) {
    World w({.transport = Transport::kPeer, .world_size = 2});
    peer_max_sms = std::min(std::max(b.max_sms, 64), w.sm_count(0));  // NVLink needs more SMs
    BenchSetup pb = b;
    pb.max_sms = peer_max_sms;
    SymmetricBuffer buf = w.allocate(lb.num_bytes());
    const SymmetricView v0 = buf.view(0);
    peer_methods = table_methods(b.vec_threads, diagnostics);
    measure_sm_methods(w, pb, v0.local(data), v0.peer(1, data), peer_methods);
    uint64_t pbase = 0;
    ce_pull = measure_copy_engine(w, pb, v0, flags, &pbase, v0.peer(1, data), v0.local(data));
    ce_push = measure_copy_engine(w, pb, v0, flags, &pbase, v0.local(data), v0.peer(1, data));
  }

  std::vector<int> cols;
  for (int n : {1, 2, 4, 8, 12, 16, 24, 32})
    if (n <= b.max_sms) cols.push_back(n);

  if (csv) {
    std::printf("what,unit,sms,value\n");
    std::printf("latency block,us,,%.3f\nlatency gpu,us,,%.3f\nlatency system,us,,%.3f\n", lat_block, lat_gpu, lat_sys);
    print_csv(methods, b.max_sms, "");
    std::printf("stream copy same GPU,GB/s,,%.1f\n", ce_gbps);
    if (peer) {
      print_csv(peer_methods, peer_max_sms, "gpu0<->gpu1 ");
      std::printf("gpu0<->gpu1 copy engine pull,GB/s,,%.1f\ngpu0<->gpu1 copy engine push,GB/s,,%.1f\n", ce_pull, ce_push);
    }
    return 0;
  }
  std::printf("tilelink bench prim: %s, %d SMs; virtual world of 2 ranks (%d + %d SMs); %lld MiB copies; "
              "median of %d after warm-up; %d round trips per latency sample; vector: %d threads, "
              "%d x 16 B in flight each; bulk: %d pipes x %d stages x %u KiB per SM, L2 prefetch %d chunks ahead\n",
              prop.name, prop.multiProcessorCount, sms0, sms1, static_cast<long long>(b.bytes >> 20), b.reps, iters,
              b.vec_threads, ::tilelink::cuda::detail::kVectorsInFlight, shape.pipes, shape.stages, shape.stage_bytes / 1024,
              shape.prefetch);
  print_header(cols, b.target);
  std::printf("%-39s %-5s %7.3f\n", "one-way latency, block", "us", lat_block);
  std::printf("%-39s %-5s %7.3f\n", "one-way latency, gpu", "us", lat_gpu);
  std::printf("%-39s %-5s %7.3f\n", "one-way latency, system", "us", lat_sys);
  print_rows(methods, cols, b.target, b.max_sms, "SM copy, ");
  // NOTE: a same-GPU copy is a driver kernel on the SMs, not a copy-engine transfer (bench/diag/ce_probe.cu:
  // it waits while another kernel holds every SM); only the GPU 0 <-> GPU 1 copies below use no SMs.
  std::printf("%-39s %-5s %7.0f  (a driver kernel on the SMs)\n", "stream copy, same GPU", "GB/s", ce_gbps);
  if (peer) {
    std::vector<int> pcols = cols;
    for (int n : {48, 64})
      if (n <= peer_max_sms) pcols.push_back(n);
    std::printf("\nGPU 0 <-> GPU 1 (peer transport, %d GPUs here): GPU 0's SMs pull from / push to GPU 1's memory; "
                "copied bytes\n", gpus);
    print_header(pcols, b.target);
    print_rows(peer_methods, pcols, b.target, peer_max_sms, "SM copy, ");
    std::printf("%-39s %-5s %7.0f  (no SMs)\n", "copy engine, GPU 1 -> GPU 0", "GB/s", ce_pull);
    std::printf("%-39s %-5s %7.0f  (no SMs)\n", "copy engine, GPU 0 -> GPU 1", "GB/s", ce_push);
  } else {
    std::printf("(no GPU 0 <-> GPU 1 table: %d GPU%s here)\n", gpus, gpus == 1 ? "" : "s");
  }
  return 0;
}

TILELINK_REGISTER_COMMAND("bench prim",
                          "[--bytes N] [--reps N] [--iters N] [--max-sms N] [--threads N] "
                          "[--target-gbps X] [--bulk-pipes N] [--bulk-stages N] [--bulk-stage-kib N] [--bulk-prefetch CHUNKS] "
                          "[--peer auto|on|off] [--no-diagnostics] [--csv]",
                          "signal latency per scope, SM copy bandwidth vs SMs, copy engine (and GPU 0 <-> GPU 1)",
                          bench_prim, {"--csv", "--no-diagnostics"});

}  // namespace
}  // namespace tilelink::cli
