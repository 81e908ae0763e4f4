// The AllToAll counts-then-rows exchange (comm/alltoall.hpp) on the CPU backend: random counts per
// (source, destination) pair, empty pairs and full ones, worlds 1..8, repeated calls with new
// epochs; every rank's output is every source's rows for it, in rank order; counts arrive before
// rows; a count over the capacity is refused on the sending rank and the world stops.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../support/random.hpp"
#include "tilelink/backend/cpu/comm_exec.hpp"
#include "tilelink/backend/cpu/world.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink {
namespace {

// One call: every rank sends its rows, then receives. The byte of row i of (src -> dst) encodes
// (call, src, dst, i), so a misplaced row shows.
std::byte row_byte(int call, int src, int dst, int64_t i, int64_t b) {
  return static_cast<std::byte>((call * 131 + src * 31 + dst * 7 + i * 3 + b) & 0xff);
}

void run_exchange(int world_size, int64_t row_bytes, int64_t capacity, int calls, test::Rng& rng) {
  cpu::World world(world_size, std::chrono::seconds(20));
  std::vector<AllToAllPlan> plans;
  LayoutBuilder b;
  for (int r = 0; r < world_size; ++r) plans.push_back(AllToAllPlan::make(r, world_size, row_bytes, capacity));
  plans[0].make_layout(b);
  const Field<Signal> barrier = b.add<Signal>(world_size);
  for (auto& p : plans) p.f = plans[0].f;
  cpu::SymmetricAllocation ws = world.allocate(b.num_bytes());
  for (int call = 1; call <= calls; ++call) {
    SCOPED_TRACE(::testing::Message() << "world " << world_size << " row_bytes " << row_bytes << " call " << call);
    std::vector<std::vector<int64_t>> n(world_size, std::vector<int64_t>(world_size));
    for (auto& row : n)
      for (auto& x : row) x = rng.uniform_int(0, 3) == 0 ? 0 : rng.uniform(0, capacity);
    std::vector<std::vector<std::vector<std::byte>>> send(world_size, std::vector<std::vector<std::byte>>(world_size));
    for (int s = 0; s < world_size; ++s)
      for (int d = 0; d < world_size; ++d) {
        send[s][d].resize(static_cast<size_t>(n[s][d] * row_bytes));
        for (int64_t i = 0; i < n[s][d]; ++i)
          for (int64_t by = 0; by < row_bytes; ++by) send[s][d][i * row_bytes + by] = row_byte(call, s, d, i, by);
      }
    std::vector<std::vector<std::byte>> out(world_size);
    std::vector<int64_t> totals(world_size, -1);
    world.run([&](cpu::RankContext& ctx) {
      const AllToAllPlan& p = plans[ctx.rank];
      const SymmetricView heap = ws.view(ctx.rank);
      ctx.op = "alltoall";
      cpu::rank_barrier(ctx, heap, barrier, call);  // every peer is done reading its slots
      cpu::AllToAllExec x{ctx, heap, p};
      for (int step = 0; step < world_size; ++step) {
        const int d = p.send_peer(step);
        alltoall_send_count(x, p, d, n[ctx.rank][d], call);
      }
      std::vector<int64_t> offsets(world_size + 1);
      totals[ctx.rank] = alltoall_recv_counts(x, p, call, offsets.data());
      for (int step = 0; step < world_size; ++step) {
        const int d = p.send_peer(step);
        alltoall_send_rows(x, p, d, send[ctx.rank][d].data(), n[ctx.rank][d], call);
      }
      out[ctx.rank].assign(static_cast<size_t>(totals[ctx.rank] * row_bytes), std::byte{0xEE});
      for (int s = 0; s < world_size; ++s) alltoall_recv_rows(x, p, s, call, offsets.data(), out[ctx.rank].data());
    });
    for (int d = 0; d < world_size; ++d) {
      std::vector<std::byte> want;
      for (int s = 0; s < world_size; ++s) want.insert(want.end(), send[s][d].begin(), send[s][d].end());
      ASSERT_EQ(totals[d] * row_bytes, static_cast<int64_t>(want.size())) << "rank " << d << "'s total";
      ASSERT_TRUE(out[d] == want) << "rank " << d << ": rows misplaced";
    }
  }
}

TEST(AllToAll, EveryRankGetsEverySourcesRowsInRankOrder) {
  TL_SEEDED_RNG(rng);
  for (int w = 1; w <= 8; ++w) run_exchange(w, rng.uniform(1, 40), rng.uniform(0, 24), 6, rng);
}

TEST(AllToAll, ACountOverTheCapacityIsRefusedAndTheWorldStops) {
  cpu::World world(3, std::chrono::seconds(5));
  std::vector<AllToAllPlan> plans;
  LayoutBuilder b;
  for (int r = 0; r < 3; ++r) plans.push_back(AllToAllPlan::make(r, 3, 16, 4));
  plans[0].make_layout(b);
  for (auto& p : plans) p.f = plans[0].f;
  cpu::SymmetricAllocation ws = world.allocate(b.num_bytes());
  try {
    world.run([&](cpu::RankContext& ctx) {
      const SymmetricView heap = ws.view(ctx.rank);
      cpu::AllToAllExec x{ctx, heap, plans[ctx.rank]};
      for (int d = 0; d < 3; ++d) alltoall_send_count(x, plans[ctx.rank], d, ctx.rank == 1 ? 5 : 1, 1);
      std::vector<int64_t> offsets(4);
      alltoall_recv_counts(x, plans[ctx.rank], 1, offsets.data());  // peers stop: rank 1 failed
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 sends 5 rows to rank 0; the plan holds 0..4"), std::string::npos)
        << e.what();
  }
}

TEST(AllToAll, PlanRefusesBadInput) {
  EXPECT_THROW(AllToAllPlan::make(3, 3, 16, 4), Error);
  EXPECT_THROW(AllToAllPlan::make(0, 0, 16, 4), Error);
  EXPECT_THROW(AllToAllPlan::make(0, 2, 0, 4), Error);
  EXPECT_THROW(AllToAllPlan::make(0, 2, 16, -1), Error);
  EXPECT_THROW(AllToAllPlan::make(0, 2, 1 << 20, int64_t{1} << 40), Error);
}

}  // namespace
}  // namespace tilelink
