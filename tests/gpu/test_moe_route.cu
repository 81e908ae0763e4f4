// MoE routing on the device (ops/moe_route_cuda.hpp) against the one-thread form of
// ops/moe_routing.hpp on the host: every table entry, every routing pattern, 1 to 1024 experts, top-k
// 1 to 8, no tokens to 20,000; 1 to kMoeRouteBlocks blocks with ragged chunk ends, one expert taking
// every pair; bad ids reported (the first over all blocks), not placed; replays of a captured graph
// follow routings that change between them, bad ids included, over scratch poisoned between them;
// bad arguments refused before anything is enqueued; the arrival order of the grouped tile rows
// against its host form.
//
// Timing (information, not an assertion): gpu_test_moe_route --gtest_filter='*Time*' prints the
// routing of 8192 tokens x top-8 of 256 experts, eager and in a graph.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "../support/moe_routing.hpp"
#include "../support/random.hpp"
#include "../support/refused.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/dynamic_partition.hpp"
#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/partition.hpp"
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

// The tables the device must make from ids: the one-thread form of ops/moe_routing.hpp, over the good
// pairs only where some ids are bad (outside [0, experts)), with row_of_pair -1 at the bad pairs and
// status 1 + the first bad pair.
struct HostTables {
  std::vector<int64_t> counts, offsets, pair_of_row, row_of_pair;  // pair_of_row: the placed rows only
  int64_t status = 0;
};
HostTables host_tables(const std::vector<int32_t>& ids, int64_t tokens, int topk, int experts) {
  const int64_t pairs = tokens * topk;
  HostTables h;
  h.counts.assign(experts, 0);
  h.offsets.assign(experts + 1, 0);
  h.pair_of_row.assign(pairs, -1);
  h.row_of_pair.assign(pairs, -1);
  auto good = [&](int64_t p) { return ids[p] >= 0 && ids[p] < experts; };
  for (int64_t p = pairs - 1; p >= 0; --p)
    if (!good(p)) h.status = p + 1;
  if (h.status == 0) {
    EXPECT_TRUE(moe_route(ids.data(), tokens, topk, experts, h.counts.data(), h.offsets.data(),
                          h.pair_of_row.data(), h.row_of_pair.data()));
    return h;
  }
  for (int64_t p = 0; p < pairs; ++p)
    if (good(p)) ++h.counts[ids[p]];
  for (int e = 0; e < experts; ++e) h.offsets[e + 1] = h.offsets[e] + h.counts[e];
  std::vector<int64_t> cursor(h.offsets.begin(), h.offsets.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {
    if (!good(p)) continue;
    const int64_t row = cursor[ids[p]]++;
    h.pair_of_row[row] = p;
    h.row_of_pair[p] = row;
  }
  h.pair_of_row.resize(h.offsets[experts]);
  return h;
}

// The device tables of one routing problem, with the grouped GEMM's grid over its offsets.
struct Tables {
  int64_t tokens;
  int topk, experts;
  DeviceArray<int32_t> ids;
  DeviceArray<int64_t> counts, offsets, pair_of_row, row_of_pair, status;
  DeviceArray<unsigned char> scratch;
  DeviceArray<int> first;
  cuda::MoeRouteTables t;
  static constexpr int64_t kExtentN = 1000;  // columns of the grid: 4 tiles of 256
  Tables(int64_t tokens_, int topk_, int experts_)
      : tokens(tokens_), topk(topk_), experts(experts_), ids(tokens_ * topk_), counts(experts_),
        offsets(experts_ + 1), pair_of_row(tokens_ * topk_), row_of_pair(tokens_ * topk_), status(1),
        scratch(cuda::moe_route_scratch_bytes(tokens_, topk_, experts_)), first(experts_ + 1) {
    t = {counts.p, offsets.p, pair_of_row.p, row_of_pair.p, status.p, scratch.p};
    t.grid = DynamicTileGrid::make(DynamicRowPartition::make(experts, offsets.p), kExtentN, 128, 256, first.p);
    t.first_tiles = first.p;
  }
  void route(cudaStream_t s = nullptr) { cuda::moe_route_async(ids.p, tokens, topk, experts, t, s); }
  // h_ids uploaded, routed, and waited for.
  void route_now(const std::vector<int32_t>& h_ids) {
    ids.put(h_ids);
    route();
    TL_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // Every table against the host's form of the same ids (bad ids included).
  void expect_match(const std::vector<int32_t>& h_ids) const {
    const HostTables h = host_tables(h_ids, tokens, topk, experts);
    EXPECT_EQ(status.host()[0], h.status);
    EXPECT_EQ(counts.host(), h.counts);
    EXPECT_EQ(offsets.host(), h.offsets);
    std::vector<int64_t> por = pair_of_row.host();
    por.resize(h.pair_of_row.size());  // rows past the placed ones (bad pairs) are not written
    EXPECT_EQ(por, h.pair_of_row);
    EXPECT_EQ(row_of_pair.host(), h.row_of_pair);
    std::vector<int> f(experts + 1);
    const DynamicTileGrid host_grid = DynamicTileGrid::make(DynamicRowPartition::make(experts, h.offsets.data()),
                                                            kExtentN, 128, 256, f.data());
    fill_first_tiles(host_grid, std::span<int>(f));
    EXPECT_EQ(first.host(), f);
  }
};

TEST(MoeRouteCuda, MatchesHostTables) {
  TL_SEEDED_RNG(rng);
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
    tb.route_now(h_ids);
    tb.expect_match(h_ids);
    ++trials;
  }
  EXPECT_EQ(trials, 80);
}

// Shapes chosen for the blocks' chunks: every block count from 1 to kMoeRouteBlocks's cap, chunks
// and warp chunks ending off any multiple, trailing blocks left with nothing, one expert taking
// every pair (all lanes of every step the same expert), a single expert.
TEST(MoeRouteCuda, ManyBlocksRaggedChunks) {
  TL_SEEDED_RNG(rng);
  struct Shape {
    int64_t tokens;
    int topk, experts;
    int all_to = -1;  // every pair to this expert, else drawn
    test::Routing how = test::Routing::kUniform;
  };
  const std::vector<Shape> shapes = {
      {2047, 1, 8},                                  // one block, 1 pair short of two
      {2048, 1, 8},                                  // two blocks exactly
      {3001, 3, 5, -1, test::Routing::kSkewed},      // 8 blocks, ragged
      {12347, 7, 300},                               // 64 blocks, the last one short
      {65537, 1, 256, -1, test::Routing::kSkewed},   // 64 blocks, the last one empty
      {65535, 1, 256, -1, test::Routing::kOneExpert},
      {20011, 8, 1024},                              // 64 blocks, the most experts
      {9973, 8, 1000, -1, test::Routing::kEmptyExperts},
      {100003, 1, 64, 63},                           // the last expert takes everything
      {30011, 4, 16, 0},                             // the first expert takes everything (top-4 alike)
      {70001, 1, 1, 0},                              // a single expert
      {33, 1, 1, 0},
  };
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(::testing::Message() << "tokens " << sh.tokens << " topk " << sh.topk << " experts " << sh.experts
                                      << (sh.all_to >= 0 ? " all to one expert " : " ") << test::name(sh.how));
    const std::vector<int32_t> h_ids =
        sh.all_to >= 0 ? std::vector<int32_t>(sh.tokens * sh.topk, sh.all_to)
                       : test::draw_ids(rng, sh.tokens, sh.topk, sh.experts, sh.how);
    Tables tb(sh.tokens, sh.topk, sh.experts);
    tb.route_now(h_ids);
    tb.expect_match(h_ids);
  }
}

// A routing's device tables (tile rows of 128), their host copies, and an order table and its
// scratch of the most tile rows any routing gives (poisoned: entries past the tile rows show).
struct Ordered {
  Tables tb;
  std::vector<int64_t> offsets, pair_of_row;
  std::vector<int> first;
  DeviceArray<int> order;
  DeviceArray<uint8_t> keys;
  Ordered(test::Rng& rng, int64_t tokens, int topk, int experts, test::Routing how)
      : tb(tokens, topk, experts),
        order(DynamicSegmentTiling::max_num_tiles(tokens * topk, experts, 128)),
        keys(DynamicSegmentTiling::max_num_tiles(tokens * topk, experts, 128)) {
    tb.t.grid = DynamicTileGrid::make(DynamicRowPartition::make(experts, tb.offsets.p), 1, 128, 1, tb.first.p);
    tb.route_now(test::draw_ids(rng, tokens, topk, experts, how));
    offsets = tb.offsets.host(), pair_of_row = tb.pair_of_row.host(), first = tb.first.host();
  }
};

// The arrival order of the grouped tile rows (moe_arrival_order_async) equals the host form
// (ops/moe_routing.hpp's moe_arrival_row_order) over the device's own tables: worlds 1 to 64,
// ragged and empty segments, every routing pattern, up to 1024 experts and 40,000 tile rows' worth
// of pairs (rounds of the block's stable counting sort), every rank; entries past the tile rows
// untouched.
TEST(MoeRouteCuda, ArrivalOrderMatchesTheHostForm) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 40; ++trial) {
    const int world = trial == 0 ? kMaxWorldSize : rng.uniform_int(1, 32);
    const int experts = trial == 1 ? 1024 : rng.uniform_int(1, 300);
    const int topk = rng.uniform_int(1, std::min(8, experts));
    const int64_t tokens = trial == 1 ? 20000 : rng.coin(0.1) ? 0 : rng.uniform(1, 12000);
    const auto how = static_cast<test::Routing>(rng.uniform_int(0, 3));
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " world " << world << " tokens " << tokens << " topk "
                                      << topk << " experts " << experts << " " << test::name(how));
    const RowPartition part = RowPartition::from_counts(rng.uneven_counts(tokens, world));
    const Ordered o(rng, tokens, topk, experts, how);
    for (int rank : {0, world - 1, rng.uniform_int(0, world - 1)}) {
      SCOPED_TRACE(::testing::Message() << "rank " << rank);
      cuda::moe_arrival_order_async(o.tb.offsets.p, o.tb.first.p, experts, 128, o.tb.pair_of_row.p, topk, part, rank,
                                    o.order.p, o.keys.p, nullptr);
      TL_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<int> want = moe_arrival_row_order(o.offsets, o.first, 128, o.pair_of_row, topk, part, rank);
      std::vector<int> got = o.order.host();
      for (size_t i = want.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0x7b7b7b7b) << "entry " << i << " written";
      got.resize(want.size());
      ASSERT_EQ(got, want);
    }
  }
  // refused before anything is enqueued
  const RowPartition two = RowPartition::even(10, 2);
  DeviceArray<int64_t> off(2), por(10);
  DeviceArray<int> first(2), order(1);
  DeviceArray<uint8_t> keys(1);
  test::expect_refused([&] { cuda::moe_arrival_order_async(off.p, first.p, 1, 128, por.p, 1, two, 2, order.p, keys.p, nullptr); },
                       "rank 2 of a world of 2");
  test::expect_refused([&] { cuda::moe_arrival_order_async(off.p, first.p, 1, 128, por.p, 1, two, 0, nullptr, keys.p, nullptr); },
                       "a table pointer is null");
}

// The completion order (moe_completion_order_async, layer 1 over ranks) equals the host form
// (moe_completion_row_order) over the device's own tables: reduce tiles of 1 to 128 tokens, fewer
// and more reduce tiles than kMoeOrderKeys, any first tile, every routing pattern, up to 1024
// experts; entries past the tile rows untouched.
TEST(MoeRouteCuda, CompletionOrderMatchesTheHostForm) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 40; ++trial) {
    const int experts = trial == 1 ? 1024 : rng.uniform_int(1, 300);
    const int topk = rng.uniform_int(1, std::min(8, experts));
    const int64_t tokens = trial == 1 ? 20000 : rng.uniform(1, 12000);
    const int reduce_rows = rng.pick(std::vector<int>{1, 32, 128});
    const auto how = static_cast<test::Routing>(rng.uniform_int(0, 3));
    const int64_t tiles = (tokens + reduce_rows - 1) / reduce_rows;
    const MoeCompletion c = MoeCompletion::make(tokens, reduce_rows, static_cast<int>(rng.uniform(0, tiles - 1)));
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " tokens " << tokens << " topk " << topk << " experts "
                                      << experts << " " << test::name(how) << " reduce rows " << reduce_rows
                                      << " first tile " << c.first_tile << " keys " << c.keys);
    const Ordered o(rng, tokens, topk, experts, how);
    cuda::moe_completion_order_async(o.tb.offsets.p, o.tb.first.p, experts, 128, o.tb.pair_of_row.p, topk, c,
                                     o.order.p, o.keys.p, nullptr);
    TL_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int> want = moe_completion_row_order(o.offsets, o.first, 128, o.pair_of_row, topk, c);
    std::vector<int> got = o.order.host();
    for (size_t i = want.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0x7b7b7b7b) << "entry " << i << " written";
    got.resize(want.size());
    ASSERT_EQ(got, want);
  }
  DeviceArray<int64_t> off(2), por(10);
  DeviceArray<int> first(2), order(1);
  DeviceArray<uint8_t> keys(1);
  test::expect_refused([&] { cuda::moe_completion_order_async(off.p, first.p, 1, 128, por.p, 1,
                                                              MoeCompletion::make(10, 4, 3), order.p, keys.p, nullptr); },
                       "bad completion");
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
  tb.route_now(h_ids);
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
  tb.expect_match(h_ids);
}

// Bad ids in several blocks' chunks (64 blocks here): the status names the first over all of them,
// whichever block finds its own first.
TEST(MoeRouteCuda, BadIdsAcrossBlocksReportTheFirst) {
  TL_SEEDED_RNG(rng);
  const int64_t tokens = 20000;
  const int topk = 8, experts = 256;
  std::vector<int32_t> h_ids = test::draw_ids(rng, tokens, topk, experts, test::Routing::kSkewed);
  for (int64_t p : {int64_t{150001}, int64_t{70002}, int64_t{70003}, tokens * topk - 1}) h_ids[p] = experts + 7;
  h_ids[70031] = -1;
  Tables tb(tokens, topk, experts);
  tb.route_now(h_ids);
  EXPECT_EQ(tb.status.host()[0], 70003);
  tb.expect_match(h_ids);
}

// The routing captured once in a graph; each replay reads the ids as they are then (new routings
// copied in between, in stream order) and its tables match that routing. The scratch is poisoned
// differently before each replay: no call may read what an earlier one left there. A routing with
// bad ids is followed by a good one, whose status is 0 again.
TEST(MoeRouteCuda, GraphReplaysFollowNewRoutings) {
  TL_SEEDED_RNG(rng);
  const int64_t tokens = 10007;  // 60,042 pairs: 58 blocks, the last one short
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
  const int poison[] = {0x00, 0xff, 0x7b, 0x01};
  for (int replay = 0; replay < 8; ++replay) {
    SCOPED_TRACE(::testing::Message() << "replay " << replay);
    std::vector<int32_t> h_ids = test::draw_ids(rng, tokens, topk, experts, static_cast<test::Routing>(replay % 4));
    if (replay == 4 || replay == 6) {  // bad ids, in different blocks each time
      h_ids[rng.uniform(0, tokens * topk - 1)] = experts;
      h_ids[rng.uniform(0, tokens * topk - 1)] = -5;
    }
    if (replay == 7) std::fill(h_ids.begin(), h_ids.end(), experts - 1);
    tb.ids.put(h_ids, s);
    TL_CUDA_CHECK(cudaMemsetAsync(tb.scratch.p, poison[replay % 4], tb.scratch.n, s));
    TL_CUDA_CHECK(cudaGraphLaunch(exec, s));
    TL_CUDA_CHECK(cudaStreamSynchronize(s));
    tb.expect_match(h_ids);
  }
  TL_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TL_CUDA_CHECK(cudaGraphDestroy(graph));
  TL_CUDA_CHECK(cudaStreamDestroy(s));
}

// Scratch sized for the most tokens and experts serves a smaller call.
TEST(MoeRouteCuda, ScratchForMoreServesLess) {
  TL_SEEDED_RNG(rng);
  EXPECT_LE(cuda::moe_route_scratch_bytes(100, 2, 16), cuda::moe_route_scratch_bytes(8192, 8, 16));
  EXPECT_LE(cuda::moe_route_scratch_bytes(8192, 8, 16), cuda::moe_route_scratch_bytes(8192, 8, 256));
  EXPECT_EQ(cuda::moe_route_scratch_bytes(8192, 8, 256), cuda::moe_route_scratch_bytes(1 << 20, 8, 256));
  const int64_t tokens = 5003;
  const int topk = 3, experts = 40;
  Tables tb(tokens, topk, experts);
  DeviceArray<unsigned char> big(cuda::moe_route_scratch_bytes(8192, 8, 256));
  tb.t.scratch = big.p;
  const std::vector<int32_t> h_ids = test::draw_ids(rng, tokens, topk, experts, test::Routing::kSkewed);
  tb.route_now(h_ids);
  tb.expect_match(h_ids);
}

// What the tables cost a call for DeepSeek-V3's routing of 8192 tokens (top-8 of 256 experts):
// printed, not asserted.
TEST(MoeRouteCuda, TimeDeepSeekV3Routing) {
  TL_SEEDED_RNG(rng);
  const int64_t tokens = 8192;
  const int topk = 8, experts = 256;
  Tables tb(tokens, topk, experts);
  const std::vector<int32_t> h_ids = test::draw_ids(rng, tokens, topk, experts, test::Routing::kUniform);
  tb.ids.put(h_ids);
  cudaStream_t s;
  TL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  TL_CUDA_CHECK(cudaEventCreate(&e0));
  TL_CUDA_CHECK(cudaEventCreate(&e1));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TL_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  tb.route(s);
  TL_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  TL_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  auto median_us = [&](auto&& call) {
    call();  // warm
    std::vector<float> ms(20);
    for (float& t : ms) {
      TL_CUDA_CHECK(cudaEventRecord(e0, s));
      call();
      TL_CUDA_CHECK(cudaEventRecord(e1, s));
      TL_CUDA_CHECK(cudaEventSynchronize(e1));
      TL_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    }
    std::sort(ms.begin(), ms.end());
    return ms[10] * 1e3;
  };
  const double eager = median_us([&] { tb.route(s); });
  const double replay = median_us([&] { TL_CUDA_CHECK(cudaGraphLaunch(exec, s)); });
  std::printf("moe_route: 8192 tokens x top-8 of 256 experts: %.1f us launched, %.1f us in a graph "
              "(median of 20, events)\n",
              eager, replay);
  TL_CUDA_CHECK(cudaStreamSynchronize(s));
  tb.expect_match(h_ids);
  TL_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TL_CUDA_CHECK(cudaGraphDestroy(graph));
  TL_CUDA_CHECK(cudaEventDestroy(e0));
  TL_CUDA_CHECK(cudaEventDestroy(e1));
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
  cuda::MoeRouteTables no_scratch = tb.t;
  no_scratch.scratch = nullptr;
  test::expect_refused([&] { call(10, 2, 8, no_scratch); }, "the scratch is null or not 4-byte aligned");
  cuda::MoeRouteTables odd_scratch = tb.t;
  odd_scratch.scratch = tb.scratch.p + 1;
  test::expect_refused([&] { call(10, 2, 8, odd_scratch); }, "the scratch is null or not 4-byte aligned");
  test::expect_refused([&] { call(10, 2, 4, tb.t); }, "the grid's rows must be a view of the routing's offsets");
  test::expect_refused([&] { cuda::moe_route_scratch_bytes(-1, 2, 8); }, "needs tokens >= 0");
  test::expect_refused([&] { cuda::moe_route_scratch_bytes(10, 0, 8); }, "topk >= 1");
  // nothing ran: the poisoned tables are untouched
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  for (int64_t v : tb.offsets.host()) EXPECT_EQ(v, 0x7b7b7b7b7b7b7b7bll);
}

}  // namespace
