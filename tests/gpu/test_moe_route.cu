// MoE routing on the device (ops/moe_route_cuda.hpp) against the one-thread form of
// ops/moe_routing.hpp on the host: every table entry, every routing pattern, 1 to 1024 experts, top-k
// 1 to 8, no tokens to 20,000; bad ids reported, not placed; replays of a captured graph follow
// routings that change between them; bad arguments refused before anything is enqueued.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "../support/moe_routing.hpp"
#include "../support/random.hpp"
#include "../support/refused.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/ops/moe_route_cuda.hpp"
#include "tilelink/ops/moe_routing.hpp"

using namespace tilelink;

namespace {

template <class T>
struct DeviceArray {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceArray(size_t count) : n(count) {
    TL_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
    TL_CUDA_CHECK(cudaMemset(p, 0x7b, std::max<size_t>(count, 1) * sizeof(T)));  // poison
  }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n) TL_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void put(const std::vector<T>& h, cudaStream_t s = nullptr) {
    if (!h.empty()) TL_CUDA_CHECK(cudaMemcpyAsync(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  }
};

// The device tables of one routing problem, with the grouped GEMM's grid over its offsets.
struct Tables {
  int64_t tokens;
  int topk, experts;
  DeviceArray<int32_t> ids;
  DeviceArray<int64_t> counts, offsets, pair_of_row, row_of_pair, status;
  DeviceArray<int> first;
  cuda::MoeRouteTables t;
  static constexpr int64_t kExtentN = 1000;  // columns of the grid: 4 tiles of 256
  Tables(int64_t tokens_, int topk_, int experts_)
      : tokens(tokens_), topk(topk_), experts(experts_), ids(tokens_ * topk_), counts(experts_),
        offsets(experts_ + 1), pair_of_row(tokens_ * topk_), row_of_pair(tokens_ * topk_), status(1),
        first(experts_ + 1) {
    t = {counts.p, offsets.p, pair_of_row.p, row_of_pair.p, status.p};
    t.grid = DynamicTileGrid::make(DynamicRowPartition::make(experts, offsets.p), kExtentN, 128, 256, first.p);
    t.first_tiles = first.p;
  }
  void route(cudaStream_t s = nullptr) { cuda::moe_route_async(ids.p, tokens, topk, experts, t, s); }

  // Every table against the host's one-thread form of the same ids.
  void expect_match(const std::vector<int32_t>& h_ids) const {
    std::vector<int64_t> c(experts), o(experts + 1), por(tokens * topk), rop(tokens * topk);
    ASSERT_TRUE(moe_route(h_ids.data(), tokens, topk, experts, c.data(), o.data(), por.data(), rop.data()));
    EXPECT_EQ(status.host()[0], 0);
    EXPECT_EQ(counts.host(), c);
    EXPECT_EQ(offsets.host(), o);
    EXPECT_EQ(pair_of_row.host(), por);
    EXPECT_EQ(row_of_pair.host(), rop);
    std::vector<int> f(experts + 1);
    const DynamicTileGrid host_grid =
        DynamicTileGrid::make(DynamicRowPartition::make(experts, o.data()), kExtentN, 128, 256, f.data());
    fill_first_tiles(host_grid, std::span<int>(f));
    EXPECT_EQ(first.host(), f);
  }
};

TEST(MoeRouteCuda, MatchesHostTables) {
  TL_SEEDED_RNG(rng);
  cudaEvent_t e0, e1;
  TL_CUDA_CHECK(cudaEventCreate(&e0));
  TL_CUDA_CHECK(cudaEventCreate(&e1));
  int trials = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const int experts = trial < 4    ? std::vector<int>{1, 256, 1024, 1000}[trial]
                        : rng.coin(0.2) ? rng.uniform_int(1, 4)
                        : rng.coin(0.2) ? rng.uniform_int(257, cuda::kMoeRouteMaxExperts)
                                        : rng.uniform_int(1, 256);
    const int topk = trial == 1 ? 8 : rng.uniform_int(1, std::min(8, experts));
    const int64_t tokens = trial == 1 ? 8192 : rng.coin(0.1) ? 0 : rng.coin(0.3) ? rng.uniform(1, 40) : rng.uniform(1, 20000);
    const auto how = trial == 1 ? test::Routing::kUniform : static_cast<test::Routing>(rng.uniform_int(0, 3));
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " tokens " << tokens << " topk " << topk
                                      << " experts " << experts << " " << test::name(how));
    const std::vector<int32_t> h_ids = test::draw_ids(rng, tokens, topk, experts, how);
    Tables tb(tokens, topk, experts);
    tb.ids.put(h_ids);
    tb.route();
    TL_CUDA_CHECK(cudaDeviceSynchronize());
    if (trial == 1) {  // DeepSeek-V3's routing of 8192 tokens: what the tables cost a call
      std::vector<float> ms(20);
      for (float& t : ms) {
        TL_CUDA_CHECK(cudaEventRecord(e0));
        tb.route();
        TL_CUDA_CHECK(cudaEventRecord(e1));
        TL_CUDA_CHECK(cudaEventSynchronize(e1));
        TL_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      }
      std::sort(ms.begin(), ms.end());
      std::printf("moe_route: 8192 tokens x top-8 of 256 experts: %.1f us (median of 20 launches, events)\n",
                  ms[10] * 1e3);
    }
    tb.expect_match(h_ids);
    ++trials;
  }
  EXPECT_EQ(trials, 80);
  TL_CUDA_CHECK(cudaEventDestroy(e0));
  TL_CUDA_CHECK(cudaEventDestroy(e1));
}

// Out-of-range ids: reported by the first bad pair, left out of every table; the good pairs keep
// their order.
TEST(MoeRouteCuda, BadIdsReportedNotPlaced) {
  TL_SEEDED_RNG(rng);
  const int64_t tokens = 3000;
  const int topk = 2, experts = 16;
  std::vector<int32_t> h_ids = test::draw_ids(rng, tokens, topk, experts, test::Routing::kUniform);
  h_ids[1234] = experts;  // first bad pair
  h_ids[4001] = -3;
  Tables tb(tokens, topk, experts);
  tb.ids.put(h_ids);
  tb.route();
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(tb.status.host()[0], 1235);
  const auto rop = tb.row_of_pair.host(), por = tb.pair_of_row.host(), off = tb.offsets.host();
  EXPECT_EQ(rop[1234], -1);
  EXPECT_EQ(rop[4001], -1);
  EXPECT_EQ(off[experts], tokens * topk - 2);
  int64_t prev_e = -1, prev_p = -1;
  for (int64_t row = 0; row < off[experts]; ++row) {
    const int64_t p = por[row];
    ASSERT_GE(p, 0);
    ASSERT_LT(p, tokens * topk);
    EXPECT_EQ(rop[p], row);
    const int64_t e = h_ids[p];
    EXPECT_GE(row, off[e]);
    EXPECT_LT(row, off[e + 1]);
    if (e == prev_e) {
      EXPECT_LT(prev_p, p) << "row " << row;
    }
    prev_e = e, prev_p = p;
  }
}

// The routing captured once in a graph; each replay reads the ids as they are then (new routings
// copied in between, in stream order) and its tables match that routing.
TEST(MoeRouteCuda, GraphReplaysFollowNewRoutings) {
  TL_SEEDED_RNG(rng);
  const int64_t tokens = 4096;
  const int topk = 6, experts = 64;
  Tables tb(tokens, topk, experts);
  cudaStream_t s;
  TL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TL_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  tb.route(s);
  TL_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  TL_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 4; ++replay) {
    SCOPED_TRACE(::testing::Message() << "replay " << replay);
    const auto how = static_cast<test::Routing>(replay);
    const std::vector<int32_t> h_ids = test::draw_ids(rng, tokens, topk, experts, how);
    tb.ids.put(h_ids, s);
    TL_CUDA_CHECK(cudaGraphLaunch(exec, s));
    TL_CUDA_CHECK(cudaStreamSynchronize(s));
    tb.expect_match(h_ids);
  }
  TL_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TL_CUDA_CHECK(cudaGraphDestroy(graph));
  TL_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(MoeRouteCuda, RefusesBadArguments) {
  Tables tb(10, 2, 8);
  auto call = [&](int64_t tokens, int topk, int experts, cuda::MoeRouteTables t) {
    cuda::moe_route_async(tb.ids.p, tokens, topk, experts, t, nullptr);
  };
  test::expect_refused([&] { call(10, 2, 0, tb.t); }, "experts must be in [1, 1024], got 0");
  test::expect_refused([&] { call(10, 2, 1025, tb.t); }, "experts must be in [1, 1024], got 1025");
  test::expect_refused([&] { call(10, 9, 8, tb.t); }, "top-k must be in [1, experts = 8], got 9");
  test::expect_refused([&] { call(-1, 2, 8, tb.t); }, "tokens must be >= 0, got -1");
  test::expect_refused([&] { call(int64_t{1} << 30, 2, 8, tb.t); }, "pairs; at most 2^31 - 1");
  cuda::MoeRouteTables no_rows = tb.t;
  no_rows.pair_of_row = nullptr;
  test::expect_refused([&] { call(10, 2, 8, no_rows); }, "a table pointer is null");
  test::expect_refused([&] { call(10, 2, 4, tb.t); }, "the grid's rows must be a view of the routing's offsets");
  // nothing ran: the poisoned tables are untouched
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  for (int64_t v : tb.offsets.host()) EXPECT_EQ(v, 0x7b7b7b7b7b7b7b7bll);
}

}  // namespace
