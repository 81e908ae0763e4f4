// A copy-engine stream wait (cuStreamWaitValue64) that never completes: World::sync() reports it as
// a TimeoutError naming the op, rank, tile, field, slot, expected and observed values, and its
// watchdog releases the wait so the stream drains; the world is then destroyed without blocking and
// a new one in the same process runs an op. (Its own executable: it ends in a fresh world.)
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/gemm_ar_cuda.hpp"
#include "tilelink/runtime/world.hpp"
#include "../support/gpu.hpp"

using namespace tilelink;
using namespace tilelink::cuda;

TEST(StreamTimeout, WatchdogReleasesTheWaitAndANewWorldRuns) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    World w({.transport = Transport::kVirtual, .world_size = 2, .timeout = std::chrono::milliseconds(200)});
    LayoutBuilder lb;
    Field<Signal> flags = lb.add<Signal>(8);
    SymmetricBuffer buf = w.allocate(lb.num_bytes());
    w.bind(0);
    StreamContext sc{&w, 0, w.stream(0), "probe_op", nullptr};
    // Rank 0 waits for rank 1's flags[3] >= 7, which nobody writes; then work behind it.
    peer_tile_wait(sc, buf.view(0), 1, flags, 3, 7, WaitSite{SignalField::kTileReady, 5});
    producer_tile_notify(sc, buf.view(0), flags, 4, 9);
    try {
      w.sync("probe_op");
      FAIL() << "no timeout";
    } catch (const TimeoutError& e) {
      const std::string m = e.what();
      std::printf("reported: %s\n", m.c_str());
      EXPECT_NE(m.find("op probe_op"), std::string::npos) << m;
      EXPECT_NE(m.find("rank 0 is stuck in a stream wait on tile_ready[3] of rank 1"), std::string::npos) << m;
      EXPECT_NE(m.find("expected >= 7, observed 0"), std::string::npos) << m;
      EXPECT_NE(m.find("1 of 1 stuck stream waits released"), std::string::npos) << m;
      EXPECT_NE(m.find("every stream drained"), std::string::npos) << m;
    }
    // The stream drained: the notify behind the released wait ran.
    EXPECT_EQ(cudaStreamQuery(w.stream(0)), cudaSuccess);
    uint64_t v = 0;
    TL_CUDA_CHECK(cudaMemcpy(&v, buf.view(0).local(flags) + 4, sizeof(v), cudaMemcpyDeviceToHost));
    EXPECT_EQ(v, 9u);
  }  // the buffer and the world go: cudaFree and the streams' teardown must not block
  // The error within the timeout + 1 s, the release and teardown within a few more.
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("timeout 0.2 s: reported, released and torn down in %.2f s\n", secs);
  EXPECT_LT(secs, 5.0 * test::time_scale());

  // A new world of the same SM split, in the same process, runs an op and checks it.
  World w({.transport = Transport::kVirtual, .world_size = 2});
  const int64_t M = 256, N = 256, K = 128;
  GemmAr op(w, RowPartition::even(M, 2), N, {K, K}, DType::kBF16, GemmArConfig{});
  std::vector<uint16_t> ones(M * K, 0x3f80);  // bf16 1.0
  std::vector<const void*> a(2), b(2);
  std::vector<void*> c(2);
  for (int r = 0; r < 2; ++r) {
    w.bind(r);
    void* p = nullptr;
    TL_CUDA_CHECK(cudaMalloc(&p, (M * K + N * K + M * N) * 2));
    TL_CUDA_CHECK(cudaMemcpy(p, ones.data(), M * K * 2, cudaMemcpyHostToDevice));
    TL_CUDA_CHECK(cudaMemcpy(static_cast<char*>(p) + M * K * 2, ones.data(), N * K * 2, cudaMemcpyHostToDevice));
    TL_CUDA_CHECK(cudaMemset(static_cast<char*>(p) + (M + N) * K * 2, 0xff, M * N * 2));
    a[r] = p, b[r] = static_cast<char*>(p) + M * K * 2, c[r] = static_cast<char*>(p) + (M + N) * K * 2;
  }
  op.run(a, b, c);
  w.sync("gemm_ar");
  for (int r = 0; r < 2; ++r) {  // C = sum over 2 ranks of K ones = 256 everywhere (exact in bf16)
    std::vector<uint16_t> out(M * N);
    w.bind(r);
    TL_CUDA_CHECK(cudaMemcpy(out.data(), c[r], M * N * 2, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (uint16_t x : out) wrong += x != 0x4380;  // bf16 256.0
    EXPECT_EQ(wrong, 0) << "rank " << r;
    TL_CUDA_CHECK(cudaFree(const_cast<void*>(a[r])));
  }
}
