// Signal primitives on the CPU backend: release/acquire ordering between ranks and between workers,
// epochs reused without reset, bounded waits that say where they hang, abort propagation.
// Also run under ThreadSanitizer (label tsan): the data below is plain memory, ordered only by the
// signals, so a missing release or acquire shows up as a race.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../support/random.hpp"
#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/backend/cpu/workers.hpp"
#include "tilelink/backend/cpu/world.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {
namespace {

using namespace std::chrono_literals;

// An inbox per source rank on every rank, with ready (source -> owner) and ack (owner -> source)
// signals.
struct Mailbox {
  static constexpr int kWords = 64;
  Field<Signal> ready, ack, barrier;
  Field<uint64_t> inbox;  // [world, kWords]
  uint64_t bytes = 0;
  explicit Mailbox(int world) {
    LayoutBuilder b;
    ready = b.add<Signal>(world);
    ack = b.add<Signal>(world);
    barrier = b.add<Signal>(world);
    inbox = b.add<uint64_t>(static_cast<int64_t>(world) * kWords);
    bytes = b.num_bytes();
  }
};

uint64_t payload(uint64_t seed, int src, int dst, uint64_t epoch, int word) {
  return seed * 0x9e3779b97f4a7c15ull + (static_cast<uint64_t>(src) << 48) +
         (static_cast<uint64_t>(dst) << 40) + (epoch << 8) + static_cast<uint64_t>(word);
}

TEST(Signals, AllToAllMessagesAreSeenAfterTheWait) {
  TL_SEEDED_RNG(rng);
  const int world_size = rng.uniform_int(3, 8);
  const int iters = 300;
  const uint64_t seed = rng.seed();
  SCOPED_TRACE(::testing::Message() << "world " << world_size);
  World world(world_size);
  Mailbox mb(world_size);
  SymmetricAllocation heap = world.allocate(mb.bytes);
  std::atomic<int> bad{0};
  std::atomic<int64_t> checked{0};
  world.run([&](RankContext& ctx) {
    ctx.op = "mailbox";
    SymmetricView v = heap.view(ctx.rank);
    const int me = ctx.rank, w = ctx.world_size;
    for (uint64_t e = 1; e <= iters; ++e) {
      for (int step = 1; step < w; ++step) {
        int dst = (me + step) % w;
        // The previous message in my inbox on dst was consumed.
        consumer_tile_wait(ctx, v, mb.ack, dst, e - 1, WaitSite{SignalField::kAck, dst});
        uint64_t* box = v.peer(dst, mb.inbox) + me * Mailbox::kWords;
        for (int i = 0; i < Mailbox::kWords; ++i) box[i] = payload(seed, me, dst, e, i);
        peer_tile_notify(ctx, v, dst, mb.ready, me, e);
      }
      for (int step = 1; step < w; ++step) {
        int src = (me + w - step) % w;
        consumer_tile_wait(ctx, v, mb.ready, src, e, WaitSite{SignalField::kReady, src});
        const uint64_t* box = v.local(mb.inbox) + src * Mailbox::kWords;
        for (int i = 0; i < Mailbox::kWords; ++i)
          if (box[i] != payload(seed, src, me, e, i)) bad.fetch_add(1);
        checked.fetch_add(Mailbox::kWords);
        peer_tile_notify(ctx, v, src, mb.ack, me, e);
      }
    }
  });
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(checked.load(), int64_t{iters} * world_size * (world_size - 1) * Mailbox::kWords);
}

TEST(Signals, PingPongOverAThousandEpochsWithoutReset) {
  TL_SEEDED_RNG(rng);
  World world(2);
  Mailbox mb(2);
  SymmetricAllocation heap = world.allocate(mb.bytes);
  const uint64_t seed = rng.seed();
  std::atomic<int> bad{0};
  for (int round = 0; round < 2; ++round) {  // the world and the signals carry over between runs
    world.run([&](RankContext& ctx) {
      ctx.op = "ping_pong";
      SymmetricView v = heap.view(ctx.rank);
      const int me = ctx.rank, other = 1 - me;
      for (uint64_t i = 1; i <= 1000; ++i) {
        uint64_t e = round * 1000 + i;
        if (me == 0) {
          uint64_t* box = v.peer(other, mb.inbox);
          for (int w = 0; w < Mailbox::kWords; ++w) box[w] = payload(seed, me, other, e, w);
          peer_tile_notify(ctx, v, other, mb.ready, me, e);
          consumer_tile_wait(ctx, v, mb.ready, other, e, WaitSite{SignalField::kReady, 0});
          for (int w = 0; w < Mailbox::kWords; ++w)
            if (v.local(mb.inbox)[w] != payload(seed, other, me, e, w)) bad.fetch_add(1);
        } else {
          consumer_tile_wait(ctx, v, mb.ready, other, e, WaitSite{SignalField::kReady, 0});
          for (int w = 0; w < Mailbox::kWords; ++w)
            if (v.local(mb.inbox)[w] != payload(seed, other, me, e, w)) bad.fetch_add(1);
          uint64_t* box = v.peer(other, mb.inbox);
          for (int w = 0; w < Mailbox::kWords; ++w) box[w] = payload(seed, me, other, e, w);
          peer_tile_notify(ctx, v, other, mb.ready, me, e);
        }
      }
    });
  }
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(signal_load(heap.view(0), 1, mb.ready, 0), 2000u);
  EXPECT_EQ(signal_load(heap.view(0), 0, mb.ready, 1), 2000u);
}

TEST(Signals, ProducerConsumerWorkersInsideARank) {
  TL_SEEDED_RNG(rng);
  const int tiles = 64, words = 32, iters = 100;
  World world(2);
  LayoutBuilder b;
  Field<Signal> ready = b.add<Signal>(tiles);
  Field<Signal> consumed = b.add<Signal>(tiles);
  Field<uint64_t> data = b.add<uint64_t>(tiles * words);
  SymmetricAllocation heap = world.allocate(b.num_bytes());
  const uint64_t seed = rng.seed();
  std::atomic<int> bad{0};
  world.run([&](RankContext& ctx) {
    SymmetricView v = heap.view(ctx.rank);
    const int producers = 2, consumers = 3;
    run_workers(ctx,
                {
                    {producers,
                     [&](int w) {
                       for (uint64_t e = 1; e <= iters; ++e)
                         for (int t = w; t < tiles; t += producers) {
                           consumer_tile_wait(ctx, v, consumed, t, e - 1, WaitSite{SignalField::kConsumed, t});
                           for (int i = 0; i < words; ++i)
                             v.local(data)[t * words + i] = payload(seed, ctx.rank, t, e, i);
                           producer_tile_notify(ctx, v, ready, t, e);
                         }
                     }},
                    {consumers,
                     [&](int w) {
                       for (uint64_t e = 1; e <= iters; ++e)
                         for (int t = w; t < tiles; t += consumers) {
                           consumer_tile_wait(ctx, v, ready, t, e, WaitSite{SignalField::kReady, t});
                           for (int i = 0; i < words; ++i)
                             if (v.local(data)[t * words + i] != payload(seed, ctx.rank, t, e, i))
                               bad.fetch_add(1);
                           producer_tile_notify(ctx, v, consumed, t, e);
                         }
                     }},
                });
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(Signals, RankBarrierSeparatesPhases) {
  TL_SEEDED_RNG(rng);
  const int world_size = rng.uniform_int(2, 8);
  World world(world_size);
  LayoutBuilder b;
  Field<Signal> barrier = b.add<Signal>(world_size);
  Field<uint64_t> slots = b.add<uint64_t>(world_size);
  SymmetricAllocation heap = world.allocate(b.num_bytes());
  std::atomic<int> bad{0};
  world.run([&](RankContext& ctx) {
    SymmetricView v = heap.view(ctx.rank);
    for (uint64_t e = 1; e <= 200; ++e) {
      // Phase 1: write my slot on every rank. Phase 2: read all slots of mine.
      for (int p = 0; p < ctx.world_size; ++p) v.peer(p, slots)[ctx.rank] = e;
      rank_barrier(ctx, v, barrier, 2 * e - 1);
      for (int p = 0; p < ctx.world_size; ++p)
        if (v.local(slots)[p] != e) bad.fetch_add(1);
      rank_barrier(ctx, v, barrier, 2 * e);
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

// ---- bounded waits
// -------------------------------------------------------------------------------

struct Timeouts {
  Field<Signal> flags;
  uint64_t bytes;
  Timeouts() {
    LayoutBuilder b;
    flags = b.add<Signal>(8);
    bytes = b.num_bytes();
  }
};

void expect_contains(const std::string& what, const std::vector<std::string>& needles) {
  for (const auto& n : needles)
    EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' missing in: " << what;
}

TEST(Signals, TimeoutNamesOpRankTileSlotExpectedAndObserved) {
  World world(2, 200ms);
  Timeouts t;
  SymmetricAllocation heap = world.allocate(t.bytes);
  // Rank 1's flags[3] holds 2 from an earlier "epoch"; the wait wants 5.
  world.run([&](RankContext& ctx) {
    if (ctx.rank == 0) peer_tile_notify(ctx, heap.view(0), 1, t.flags, 3, 2);
  });
  auto start = std::chrono::steady_clock::now();
  try {
    world.run([&](RankContext& ctx) {
      ctx.op = "my_op";
      if (ctx.rank == 1)
        consumer_tile_wait(ctx, heap.view(1), t.flags, 3, 5, WaitSite{SignalField::kTileReady, 7});
    });
    FAIL() << "the wait did not time out";
  } catch (const TimeoutError& e) {
    expect_contains(e.what(),
                    {"op my_op: rank 1 timed out waiting on tile_ready[3] of rank 1: expected >= 5, observed 2", "tile 7"});
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, 200ms);
  EXPECT_LT(elapsed, 5s);
}

TEST(Signals, PeerAndRankWaitTimeoutsNameTheOwner) {
  World world(3, 200ms);
  Timeouts t;
  SymmetricAllocation heap = world.allocate(t.bytes);
  try {
    world.run([&](RankContext& ctx) {
      ctx.op = "peer_op";
      if (ctx.rank == 2)
        peer_tile_wait(ctx, heap.view(2), 0, t.flags, 6, 1, WaitSite{SignalField::kTileDone, 11});
    });
    FAIL() << "the wait did not time out";
  } catch (const TimeoutError& e) {
    expect_contains(e.what(), {"peer_op", "rank 2", "tile 11", "tile_done[6]", "of rank 0",
                               "expected >= 1", "observed 0"});
  }
  try {
    world.run([&](RankContext& ctx) {
      ctx.op = "barrier_op";
      if (ctx.rank == 1) rank_wait(ctx, heap.view(1), 2, t.flags, 4);
    });
    FAIL() << "the wait did not time out";
  } catch (const TimeoutError& e) {
    expect_contains(e.what(), {"barrier_op", "rank 1", "[2]", "expected >= 4", "observed 0"});
  }
}

// ---- abort
// ---------------------------------------------------------------------------------------

TEST(Abort, OneRankThrowsTheOthersStopPromptly) {
  World world(4, 20s);  // a long bound: only the abort can end the waits in time
  Timeouts t;
  SymmetricAllocation heap = world.allocate(t.bytes);
  std::atomic<int> stopped{0};
  auto start = std::chrono::steady_clock::now();
  try {
    world.run([&](RankContext& ctx) {
      ctx.op = "abort_op";
      if (ctx.rank == 2) {
        std::this_thread::sleep_for(50ms);
        throw std::runtime_error("rank two broke");
      }
      try {
        consumer_tile_wait(ctx, heap.view(ctx.rank), t.flags, 0, 1, WaitSite{SignalField::kReady, 0});
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("rank two broke"), std::string::npos) << e.what();
        stopped.fetch_add(1);
        throw;
      }
    });
    FAIL() << "run() did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank two broke") << "run() must rethrow the first failure itself";
  }
  EXPECT_EQ(stopped.load(), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  // The world stays usable.
  std::atomic<int> ran{0};
  world.run([&](RankContext&) { ran.fetch_add(1); });
  EXPECT_EQ(ran.load(), 4);
}

TEST(Abort, AWorkerThrowsTheOtherWorkersAndRanksStop) {
  World world(3, 20s);
  Timeouts t;
  SymmetricAllocation heap = world.allocate(t.bytes);
  auto start = std::chrono::steady_clock::now();
  try {
    world.run([&](RankContext& ctx) {
      SymmetricView v = heap.view(ctx.rank);
      run_workers(ctx, {
                           {2,
                            [&](int w) {
                              if (ctx.rank == 1 && w == 1)
                                throw Error("worker 1 of rank 1 failed on purpose");
                              consumer_tile_wait(ctx, v, t.flags, w, 1, WaitSite{SignalField::kReady, w});
                            }},
                           {1,
                            [&](int) {
                              peer_tile_wait(ctx, v, (ctx.rank + 1) % ctx.world_size, t.flags, 5, 1,
                                             WaitSite{});
                            }},
                       });
    });
    FAIL() << "run() did not rethrow";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("failed on purpose"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST(World, RefusesBadConstruction) {
  EXPECT_THROW(World(0), Error);
  EXPECT_THROW(World(kMaxWorldSize + 1), Error);
  EXPECT_THROW(World(2, 0ms), Error);
  World w(3);
  EXPECT_THROW(w.allocate(64).view(3), Error);
  EXPECT_THROW(w.allocate(64).view(-1), Error);
}

TEST(World, AllocationIsZeroedAlignedAndPerRank) {
  World w(4);
  SymmetricAllocation a = w.allocate(1000);
  EXPECT_EQ(a.num_bytes(), 1000u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.base(r)) % 256, 0u);
    for (int s = 0; s < r; ++s) EXPECT_NE(a.base(r), a.base(s));
    const auto* p = static_cast<const unsigned char*>(a.base(r));
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(p[i], 0);
    SymmetricView v = a.view(r);
    EXPECT_EQ(v.rank, r);
    EXPECT_EQ(v.world_size, 4);
    for (int s = 0; s < 4; ++s) EXPECT_EQ(v.bases[s], a.base(s));
  }
}

// Refused at once with tilelink::Error, not by a wait that runs out of time.
template <class Fn>
void expect_refused(Fn fn, const char* what) {
  try {
    fn();
    ADD_FAILURE() << what << ": accepted";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << what << ": waited instead of refusing: " << e.what();
  } catch (const Error&) {
  }
}

TEST(Signals, OutOfRangeRankOrSlotThrows) {
  World world(2, 200ms);
  Timeouts t;
  SymmetricAllocation heap = world.allocate(t.bytes);
  world.run([&](RankContext& ctx) {
    if (ctx.rank != 0) return;
    SymmetricView v = heap.view(0);
    expect_refused([&] { producer_tile_notify(ctx, v, t.flags, 8, 1); }, "notify slot 8 of 8");
    expect_refused([&] { producer_tile_notify(ctx, v, t.flags, -1, 1); }, "notify slot -1");
    expect_refused([&] { consumer_tile_wait(ctx, v, t.flags, 8, 1, WaitSite{}); },
                   "wait slot 8 of 8");
    expect_refused([&] { peer_tile_notify(ctx, v, 2, t.flags, 0, 1); }, "notify rank 2 of 2");
    expect_refused([&] { peer_tile_notify(ctx, v, -1, t.flags, 0, 1); }, "notify rank -1");
    expect_refused([&] { peer_tile_wait(ctx, v, 2, t.flags, 0, 1, WaitSite{}); },
                   "wait on rank 2 of 2");
    expect_refused([&] { peer_tile_wait(ctx, v, 1, t.flags, 9, 1, WaitSite{}); },
                   "wait on slot 9 of 8");
    expect_refused([&] { rank_notify(ctx, v, 5, t.flags, 1); }, "rank_notify rank 5 of 2");
    // The field has 8 slots, the world 2 ranks: rank 7 is still outside the world.
    expect_refused([&] { rank_wait(ctx, v, 7, t.flags, 1); }, "rank_wait rank 7 of 2");
    expect_refused([&] { rank_wait(ctx, v, -1, t.flags, 1); }, "rank_wait rank -1");
    // A wait already satisfied returns at once.
    producer_tile_notify(ctx, v, t.flags, 7, 9);
    consumer_tile_wait(ctx, v, t.flags, 7, 9, WaitSite{});
    EXPECT_EQ(signal_load(v, 0, t.flags, 7), 9u);
  });
}

}  // namespace
}  // namespace tilelink::cpu
