// Fault propagation on the device: a rank whose stop word a peer has set stops its wait within
// moments, not at its own deadline, and World::sync() names the rank that stopped the world and what
// this one waited on. Rank 0's stop comes from the host (World::stop_peers, what a host error on
// rank 0 does; a device fault writes the same words from fail_wait, which tests/gpu/ipc_fault.cu
// runs across two processes). (Its own executable: the trap kills the process's CUDA context.)
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/core/error.hpp"
#include "tilelink/runtime/world.hpp"
#include "../support/gpu.hpp"

using namespace tilelink;
using namespace tilelink::cuda;

namespace {
__global__ void wait_on_rank0(SymmetricView heap, DeviceContext ctx, Field<Signal> flags) {
  if (threadIdx.x == 0) peer_tile_wait<Scope::kGpu>(ctx, heap, 0, flags, 3, 42, WaitSite{SignalField::kTileReady, 17});
}
TL_REGISTER_KERNELS(wait_on_rank0);
}  // namespace

TEST(FaultStop, AWaitStopsOnceAPeerHasFaulted) {
  World w({.transport = Transport::kVirtual, .world_size = 2, .timeout = std::chrono::seconds(30)});
  LayoutBuilder lb;
  const Field<Signal> flags = lb.add<Signal>(8);
  SymmetricBuffer buf = w.allocate(lb.num_bytes());
  const DeviceContext ctx = w.device_context(1);
  ASSERT_NE(ctx.stop, nullptr);
  ASSERT_NE(ctx.stops, nullptr);
  w.bind(1);
  const auto t0 = std::chrono::steady_clock::now();
  wait_on_rank0<<<1, 32, 0, w.stream(1)>>>(buf.view(1), ctx, flags);
  TL_CUDA_CHECK(cudaGetLastError());
  const auto stopped = std::chrono::steady_clock::now();
  w.stop_peers();  // this process's first rank, 0, stops the world
  const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  EXPECT_LT(stop_s, 0.1 * test::time_scale()) << "stop_peers took " << stop_s << " s";
  try {
    w.sync("probe_op");
    FAIL() << "no stop";
  } catch (const TimeoutError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string m = e.what();
    EXPECT_NE(m.find("op probe_op: rank 0 stopped the world"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 stopped waiting on tile_ready[3] of rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("expected >= 42, observed 0"), std::string::npos) << m;
    EXPECT_LT(s, 5.0 * test::time_scale()) << "the wait ran on towards its own 30 s deadline";
    std::printf("stop_peers took %.4f s; reported after %.3f s: %s\n", stop_s, s, m.c_str());
  }
}
