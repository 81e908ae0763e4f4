// The AllGather comm plan (comm/allgather.hpp) on the CPU backend, as a collective of its own: random
// ragged partitions (empty segments included), row sizes and tile heights, worlds 1..8, pull and
// push, the items strided over 1..3 workers or the rank program in sequence (whole, or own rows then
// the rest); repeated calls with fresh rows and new epochs; poisoned buffers; every rank's gathered
// buffer must be every rank's rows in rank order. Then the plan's refusals and a lost peer's timeout.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../support/refused.hpp"
#include "../support/random.hpp"
#include "tilelink/backend/cpu/comm_exec.hpp"
#include "tilelink/backend/cpu/workers.hpp"
#include "tilelink/backend/cpu/world.hpp"
#include "tilelink/comm/allgather.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink {
namespace {

enum class Runner { kWorkers, kRankProgram, kOwnThenRemote };
const char* runner_name(Runner r) {
  return r == Runner::kWorkers ? "workers" : r == Runner::kRankProgram ? "rank program" : "own then remote";
}

RowPartition random_rows(test::Rng& rng, int world) {
  std::vector<int64_t> counts(world);
  for (auto& c : counts) c = rng.uniform_int(0, 4) == 0 ? 0 : rng.uniform(1, 90);
  if (rng.uniform_int(0, 1)) counts[rng.uniform_int(0, world - 1)] = 0;
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0) counts[0] = 1;
  return RowPartition::from_counts(counts);
}

void run_case(test::Rng& rng, int world_size, CommMode mode, Runner runner, int calls) {
  const RowPartition rows = random_rows(rng, world_size);
  const int64_t row_bytes = rng.uniform(1, 40);
  const int tile_rows = static_cast<int>(rng.uniform(1, 33));
  const int workers = static_cast<int>(rng.uniform(1, 3));
  SCOPED_TRACE(::testing::Message() << "world " << world_size << " mode " << (mode == CommMode::kPull ? "pull" : "push")
                                    << " " << runner_name(runner) << " rows " << rows.total() << " row_bytes "
                                    << row_bytes << " tile_rows " << tile_rows << " workers " << workers);
  cpu::World world(world_size, std::chrono::seconds(20));
  std::vector<AllGatherPlan> plans;
  LayoutBuilder b;
  for (int r = 0; r < world_size; ++r) plans.push_back(AllGatherPlan::make(r, rows, row_bytes, tile_rows, mode));
  plans[0].make_layout(b);
  const Field<Signal> barrier = b.add<Signal>(world_size);
  for (auto& p : plans) p.f = plans[0].f;
  ASSERT_EQ(plans[0].f.tile_ready.count, plans[0].tiles.num_tiles());
  ASSERT_EQ(plans[0].f.gathered.count, rows.total() * row_bytes);
  cpu::SymmetricAllocation ws = world.allocate(b.num_bytes());
  const size_t total = static_cast<size_t>(rows.total() * row_bytes);
  for (int call = 1; call <= calls; ++call) {
    std::vector<std::byte> want(total);
    for (auto& x : want) x = static_cast<std::byte>(rng.uniform_int(0, 255));
    for (int r = 0; r < world_size; ++r) std::memset(plans[r].f.gathered.in(ws.base(r)), 0xA5, total);  // poison
    world.run([&](cpu::RankContext& ctx) {
      const AllGatherPlan& p = plans[ctx.rank];
      const SymmetricView heap = ws.view(ctx.rank);
      ctx.op = "allgather";
      const cpu::CommExec x{ctx, heap};
      const void* a = want.data() + rows.begin(ctx.rank) * row_bytes;
      switch (runner) {
        case Runner::kWorkers:
          x.barrier(barrier, call);
          cpu::run_workers(ctx, {{workers, [&](int w) {
                                    for (int i = w; i < p.count(); i += workers) allgather_item(x, p, i, call, a);
                                  }}});
          break;
        case Runner::kRankProgram:
          allgather_rank_program(x, p, barrier, call, a, AllGatherPart::kAll);
          break;
        case Runner::kOwnThenRemote:
          allgather_rank_program(x, p, barrier, call, a, AllGatherPart::kOwn);
          allgather_rank_program(x, p, barrier, call, a, AllGatherPart::kRemote);
          break;
      }
      // Every tile of every rank announced on this rank (push: by its owner; pull: by itself).
      for (int t = 0; t < p.tiles.num_tiles(); ++t)
        cpu::consumer_tile_wait(ctx, heap, p.f.tile_ready, t, call, WaitSite{SignalField::kTileReady, t});
    });
    for (int r = 0; r < world_size; ++r)
      ASSERT_EQ(0, std::memcmp(plans[r].f.gathered.in(ws.base(r)), want.data(), total))
          << "rank " << r << " call " << call;
  }
}

TEST(AllGatherPlan, EveryRankGetsEveryRow) {
  TL_SEEDED_RNG(rng);
  for (int world = 1; world <= 8; ++world)
    for (CommMode mode : {CommMode::kPull, CommMode::kPush})
      for (Runner runner : {Runner::kWorkers, Runner::kRankProgram, Runner::kOwnThenRemote})
        for (int rep = 0; rep < 3; ++rep) run_case(rng, world, mode, runner, 3);
}

TEST(AllGatherPlan, OrdersCoverEveryTileOnce) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 500; ++iter) {
    const int world = static_cast<int>(rng.uniform(1, 8));
    const RowPartition rows = random_rows(rng, world);
    const int tile_rows = static_cast<int>(rng.uniform(1, 40));
    for (int r = 0; r < world; ++r) {
      const AllGatherPlan pull = AllGatherPlan::make(r, rows, 16, tile_rows, CommMode::kPull);
      const AllGatherPlan push = AllGatherPlan::make(r, rows, 16, tile_rows, CommMode::kPush);
      const int n = pull.tiles.num_tiles();
      ASSERT_EQ(pull.count(), n);
      std::vector<int> seen(n, 0);
      for (int i = 0; i < n; ++i) {
        const int t = pull.pull_tile_at(i);
        ++seen[t];
        // The first own_count() items are the own tiles, then the peers' in ring order.
        ASSERT_EQ(pull.tiles.rank_of(t) == r, i < pull.own_count()) << "rank " << r << " item " << i;
      }
      for (int v : seen) ASSERT_EQ(v, 1);
      ASSERT_EQ(push.count(), push.own_count() * world);
      std::vector<int> pushed(static_cast<size_t>(n) * world, 0);
      for (int i = 0; i < push.count(); ++i) {
        int peer = 0, t = 0;
        push.push_at(i, &peer, &t);
        ASSERT_EQ(push.tiles.rank_of(t), r);
        ASSERT_EQ(peer == r, i < push.own_count());
        ++pushed[static_cast<size_t>(peer) * n + t];
      }
      for (int peer = 0; peer < world; ++peer)
        for (int t = push.tiles.first[r]; t < push.tiles.first[r + 1]; ++t)
          ASSERT_EQ(pushed[static_cast<size_t>(peer) * n + t], 1);
    }
  }
}

TEST(AllGatherPlan, RefusesBadInput) {
  const RowPartition rows = RowPartition::even(10, 2);
  test::expect_refused([&] { AllGatherPlan::make(2, rows, 16, 4, CommMode::kPull); }, "rank 2 outside a world of 2");
  test::expect_refused([&] { AllGatherPlan::make(0, rows, 0, 4, CommMode::kPull); }, "row_bytes must be in [1, 2^30]");
  test::expect_refused([&] { AllGatherPlan::make(0, rows, 16, 0, CommMode::kPull); }, "tile_rows must be in [1, 2^20]");
  test::expect_refused([&] { AllGatherPlan::make(0, RowPartition::even(int64_t{1} << 40, 2), 1024, 4, CommMode::kPull); },
               "is out of range");
}

// A rank that never runs its program: its peers' pulls time out naming the field, slot and owner.
TEST(AllGatherPlan, LostPeerTimesOutNamingTheField) {
  const RowPartition rows = RowPartition::even(8, 2);
  cpu::World world(2, std::chrono::milliseconds(200));
  std::vector<AllGatherPlan> plans;
  LayoutBuilder b;
  for (int r = 0; r < 2; ++r) plans.push_back(AllGatherPlan::make(r, rows, 8, 4, CommMode::kPull));
  plans[0].make_layout(b);
  for (auto& p : plans) p.f = plans[0].f;
  cpu::SymmetricAllocation ws = world.allocate(b.num_bytes());
  std::vector<std::byte> a(64);
  try {
    world.run([&](cpu::RankContext& ctx) {
      ctx.op = "allgather";
      if (ctx.rank != 0) return;
      const cpu::CommExec x{ctx, ws.view(0)};
      for (int i = 0; i < plans[0].count(); ++i) allgather_item(x, plans[0], i, 1, a.data());
    });
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("op allgather: rank 0 timed out waiting on tile_ready[1] of rank 1: "
                                         "expected >= 1, observed 0"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tilelink
