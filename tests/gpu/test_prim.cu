// The CUDA primitives and the world: green-context SM shares, release/acquire signals at gpu and
// system scope between virtual ranks, vector and bulk copies, copy-engine copies between stream
// wait/write-value operations.
#include <gtest/gtest.h>

#include <algorithm>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/core/error.hpp"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/runtime/world.hpp"
#include "../support/gpu.hpp"

using namespace tilelink;
using namespace tilelink::cuda;

namespace {

__global__ void record_smid(int* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int>(::cuda::ptx::get_sreg_smid());
  // Stay a while so that blocks spread over the rank's SMs.
  const uint64_t t0 = ::cuda::ptx::get_sreg_globaltimer();
  while (::cuda::ptx::get_sreg_globaltimer() - t0 < 200000) {}
}

// Producer (rank 0): for each epoch, fill data with the epoch, release to rank 1, await its ack.
// Consumer (rank 1): acquire, check every element, ack. Any stale read counts as an error.
template <Scope S>
__global__ void ping_data(SymmetricView heap, DeviceContext ctx, Field<Signal> flags,
                          Field<uint64_t> data, int epochs, unsigned long long* errors) {
  const Block block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  for (uint64_t e = 1; e <= static_cast<uint64_t>(epochs); ++e) {
    if (ctx.rank == 0) {
      uint64_t* d = heap.peer(1, data);
      for (int64_t i = block.index(); i < data.count; i += block.size()) d[i] = e * 1000 + i;
      block.sync();
      if (block.leader()) {
        peer_tile_notify<S>(ctx, heap, 1, flags, 0, e);
        consumer_tile_wait<S>(ctx, heap, flags, 1, e, WaitSite{SignalField::kAck, -1});
      }
      block.sync();
    } else {
      if (block.leader()) consumer_tile_wait<S>(ctx, heap, flags, 0, e, WaitSite{SignalField::kReady, -1});
      block.sync();
      const uint64_t* d = heap.local(data);
      for (int64_t i = block.index(); i < data.count; i += block.size())
        if (d[i] != e * 1000 + i) atomicAdd(errors, 1ull);
      block.sync();
      if (block.leader()) peer_tile_notify<S>(ctx, heap, 0, flags, 1, e);
    }
  }
}

__global__ void copy_vector(DeviceContext ctx, Copy2D c) {
  tile_pull_data(ctx, 0, c, Block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)});
}

__global__ void copy_bulk(DeviceContext ctx, Copy2D c) {
  extern __shared__ __align__(128) unsigned char smem[];
  if (threadIdx.x != 0) return;
  BulkPipe pipe;
  pipe.init(smem, reinterpret_cast<uint64_t*>(smem + 3 * 4096), 3, 4096, ctx);
  tile_push_data(ctx, 0, c, pipe);
}

__global__ void write_and_notify(SymmetricView heap, DeviceContext ctx, Field<uint32_t> data,
                                 Field<Signal> flags, uint32_t seed) {
  const Block block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  uint32_t* d = heap.local(data);
  for (int64_t i = block.index(); i < data.count; i += block.size()) d[i] = seed ^ static_cast<uint32_t>(i);
  block.sync();
  if (block.leader()) peer_tile_notify<Scope::kGpu>(ctx, heap, 0, flags, 0, 1);
}

TL_REGISTER_KERNELS(record_smid, ping_data<Scope::kGpu>, ping_data<Scope::kSystem>, copy_vector,
                    copy_bulk, write_and_notify);

}  // namespace

TEST(World, GreenContextsGiveDisjointSmShares) {
  int total = 0;
  TL_CUDA_CHECK(cudaDeviceGetAttribute(&total, cudaDevAttrMultiProcessorCount, 0));
  for (int n : {1, 2, 3, 4, 5, 8}) {
    World w({.transport = Transport::kVirtual, .world_size = n});
    ASSERT_EQ(w.size(), n);
    int sum = 0;
    std::vector<int*> out(n);
    std::vector<int> grid(n);
    for (int r = 0; r < n; ++r) {
      EXPECT_GE(w.sm_count(r), 1);
      sum += w.sm_count(r);
      grid[r] = 2 * w.sm_count(r);
      TL_CUDA_CHECK(cudaMalloc(&out[r], grid[r] * sizeof(int)));
      w.bind(r);
      record_smid<<<grid[r], 32, 0, w.stream(r)>>>(out[r]);
      TL_CUDA_CHECK(cudaGetLastError());
    }
    EXPECT_LE(sum, total);
    w.sync("record_smid");
    std::set<int> seen;
    for (int r = 0; r < n; ++r) {
      std::vector<int> ids(grid[r]);
      TL_CUDA_CHECK(cudaMemcpy(ids.data(), out[r], ids.size() * sizeof(int), cudaMemcpyDeviceToHost));
      std::set<int> mine(ids.begin(), ids.end());
      EXPECT_LE(static_cast<int>(mine.size()), w.sm_count(r)) << "rank " << r << " of " << n;
      for (int s : mine) EXPECT_TRUE(seen.insert(s).second) << "SM " << s << " shared (world " << n << ")";
      cudaFree(out[r]);
    }
  }
}

TEST(World, RefusesImpossibleSplits) {
  EXPECT_THROW(World({.transport = Transport::kVirtual, .world_size = 0}), Error);
  EXPECT_THROW(World({.transport = Transport::kVirtual, .world_size = 2, .sms_per_rank = 100000}), Error);
  int count = 0;
  TL_CUDA_CHECK(cudaGetDeviceCount(&count));
  EXPECT_THROW(World({.transport = Transport::kPeer, .world_size = count + 1}), Error);
}

template <Scope S>
void check_ping(const char* name) {
  World w({.transport = Transport::kVirtual, .world_size = 2});
  LayoutBuilder lb;
  Field<Signal> flags = lb.add<Signal>(2);
  Field<uint64_t> data = lb.add<uint64_t>(8192);
  SymmetricBuffer buf = w.allocate(lb.num_bytes());
  unsigned long long* errors;
  TL_CUDA_CHECK(cudaMalloc(&errors, sizeof(*errors)));
  TL_CUDA_CHECK(cudaMemset(errors, 0, sizeof(*errors)));
  // Fewer rounds under compute-sanitizer (scripts/sanitize.sh sets the time scale): each poll is
  // instrumented there, and 3000 rounds do not finish within the world's timeout under racecheck.
  const int epochs = std::max(50, static_cast<int>(3000 / test::time_scale()));
  for (int r = 0; r < 2; ++r) {
    w.bind(r);
    ping_data<S><<<1, 512, 0, w.stream(r)>>>(buf.view(r), w.device_context(r), flags, data, epochs, errors);
    TL_CUDA_CHECK(cudaGetLastError());
  }
  w.sync(name);
  unsigned long long h = 1;
  TL_CUDA_CHECK(cudaMemcpy(&h, errors, sizeof(h), cudaMemcpyDeviceToHost));
  EXPECT_EQ(h, 0ull) << "stale reads after acquire (" << name << ")";
  cudaFree(errors);
}

TEST(Signals, ReleaseAcquireGpuScope) { check_ping<Scope::kGpu>("ping_gpu"); }
TEST(Signals, ReleaseAcquireSystemScope) { check_ping<Scope::kSystem>("ping_sys"); }

TEST(Data, VectorAndBulkCopies2D) {
  World w({.transport = Transport::kVirtual, .world_size = 1});
  std::mt19937 rng(7);
  const int64_t bytes = 1 << 22;
  std::vector<unsigned char> src(bytes);
  for (auto& x : src) x = static_cast<unsigned char>(rng());
  unsigned char *s, *d;
  TL_CUDA_CHECK(cudaMalloc(&s, bytes));
  TL_CUDA_CHECK(cudaMalloc(&d, bytes));
  TL_CUDA_CHECK(cudaMemcpy(s, src.data(), bytes, cudaMemcpyHostToDevice));
  struct Shape { int64_t so, sp, dof, dp, rows, rb; };
  // flat aligned; pitched aligned; unaligned offsets; odd row bytes; one big row (many stages)
  const Shape shapes[] = {{0, 4096, 0, 4096, 64, 4096},   {256, 8192, 512, 4096, 100, 2048},
                          {3, 1000, 5, 999, 37, 997},      {16, 160, 32, 176, 200, 144},
                          {0, 0, 0, 0, 1, (1 << 21) + 48}};
  for (int method = 0; method < 2; ++method)
    for (const Shape& sh : shapes) {
      TL_CUDA_CHECK(cudaMemset(d, 0xAB, bytes));  // poison
      Copy2D c{s + sh.so, sh.sp, d + sh.dof, sh.dp, sh.rows, sh.rb};
      w.bind(0);
      if (method == 0) {
        copy_vector<<<1, 256, 0, w.stream(0)>>>(w.device_context(0), c);
      } else {
        const size_t smem = 3 * 4096 + 3 * 8;
        copy_bulk<<<1, 32, smem, w.stream(0)>>>(w.device_context(0), c);
      }
      TL_CUDA_CHECK(cudaGetLastError());
      w.sync(method ? "copy_bulk" : "copy_vector");
      std::vector<unsigned char> got(bytes);
      TL_CUDA_CHECK(cudaMemcpy(got.data(), d, bytes, cudaMemcpyDeviceToHost));
      std::vector<unsigned char> want(bytes, 0xAB);
      for (int64_t r = 0; r < sh.rows; ++r)
        std::memcpy(&want[sh.dof + r * sh.dp], &src[sh.so + r * sh.sp], sh.rb);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), bytes))
          << (method ? "bulk" : "vector") << " rows " << sh.rows << " row_bytes " << sh.rb;
    }
  cudaFree(s);
  cudaFree(d);
}

TEST(Data, CopyEngineBetweenStreamWaitAndWrite) {
  World w({.transport = Transport::kVirtual, .world_size = 2});
  LayoutBuilder lb;
  Field<Signal> flags = lb.add<Signal>(2);
  Field<uint32_t> data = lb.add<uint32_t>(1 << 20);
  SymmetricBuffer buf = w.allocate(lb.num_bytes());
  const SymmetricView v0 = buf.view(0);
  // Rank 0's stream: wait for rank 1's notify, copy rank 1's data here, announce it.
  w.bind(0);
  StreamContext sc{&w, 0, w.stream(0), "ce_copy"};
  consumer_tile_wait(sc, v0, flags, 0, 1, WaitSite{SignalField::kReady, -1});
  rank_copy_data(sc, 1, Copy2D{v0.peer(1, data), 4096, v0.local(data), 4096, static_cast<int64_t>(data.num_bytes() / 4096), 4096});
  producer_tile_notify(sc, v0, flags, 1, 7);
  // Rank 1 writes and notifies, launched after rank 0's wait is already queued.
  w.bind(1);
  write_and_notify<<<4, 256, 0, w.stream(1)>>>(buf.view(1), w.device_context(1), data, flags, 0x5eed);
  TL_CUDA_CHECK(cudaGetLastError());
  w.sync("ce_copy");
  std::vector<uint32_t> got(data.count);
  TL_CUDA_CHECK(cudaMemcpy(got.data(), v0.local(data), data.num_bytes(), cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < data.count; ++i) ASSERT_EQ(got[i], 0x5eedu ^ static_cast<uint32_t>(i)) << i;
  uint64_t done = 0;
  TL_CUDA_CHECK(cudaMemcpy(&done, v0.local(flags) + 1, 8, cudaMemcpyDeviceToHost));
  EXPECT_EQ(done, 7u);
}

TEST(Data, StreamWaitTimeoutNamesOpAndSlot) {
  World w({.transport = Transport::kVirtual, .world_size = 1, .timeout = std::chrono::milliseconds(300)});
  LayoutBuilder lb;
  Field<Signal> flags = lb.add<Signal>(4);
  SymmetricBuffer buf = w.allocate(lb.num_bytes());
  StreamContext sc{&w, 0, w.stream(0), "stuck_op"};
  consumer_tile_wait(sc, buf.view(0), flags, 2, 5, WaitSite{SignalField::kReady, 9});
  try {
    w.sync("stuck_op");
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("stuck_op"), std::string::npos) << m;
    EXPECT_NE(m.find("tile 9"), std::string::npos) << m;
    EXPECT_NE(m.find("ready[2]"), std::string::npos) << m;
    EXPECT_NE(m.find("expected >= 5, observed 0"), std::string::npos) << m;
  }
  // Release the stuck stream so the world can be torn down.
  uint64_t five = 5;
  TL_CUDA_CHECK(cudaMemcpy(buf.view(0).local(flags) + 2, &five, 8, cudaMemcpyHostToDevice));
  w.sync("stuck_op");
}
