// A device wait that never completes traps after the world's timeout, and World::sync() turns the
// trap into a TimeoutError naming the op, rank, tile, slot, expected and observed values.
// (Its own executable: the trap kills the process's CUDA context.)
#include <gtest/gtest.h>

#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/core/error.hpp"
#include "tilelink/runtime/world.hpp"

using namespace tilelink;
using namespace tilelink::cuda;

namespace {
__global__ void wait_forever(SymmetricView heap, DeviceContext ctx, Field<Signal> flags) {
  if (threadIdx.x == 0) peer_tile_wait<Scope::kGpu>(ctx, heap, 1, flags, 3, 42, WaitSite{SignalField::kTileReady, 17});
}
TL_REGISTER_KERNELS(wait_forever);
}  // namespace

TEST(Timeout, DeviceWaitTrapsAndHostNamesOp) {
  World w({.transport = Transport::kVirtual, .world_size = 2, .timeout = std::chrono::milliseconds(250)});
  LayoutBuilder lb;
  Field<Signal> flags = lb.add<Signal>(8);
  SymmetricBuffer buf = w.allocate(lb.num_bytes());
  w.bind(0);
  wait_forever<<<1, 32, 0, w.stream(0)>>>(buf.view(0), w.device_context(0), flags);
  try {
    w.sync("probe_op");
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("op probe_op"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("tile 17"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 timed out waiting on tile_ready[3] of rank 1: expected >= 42, observed 0"),
              std::string::npos) << m;
    EXPECT_NE(m.find("expected >= 42, observed 0"), std::string::npos) << m;
    std::printf("reported: %s\n", m.c_str());
  }
}
