// Example 1: two tile programs linked by signals, on the CPU backend.
// Rank r produces 8 tiles (rows of a [8, 64] buffer) and pushes each to rank r+1, announcing it with
// a per-tile signal; rank r+1 consumes each tile as soon as its signal arrives, not after all of them.
#include <cstdio>
#include <vector>

#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/core/order.hpp"

using namespace tilelink;

int main() {
  constexpr int kTiles = 8, kCols = 64, kWorld = 3;
  LayoutBuilder layout;                             // the symmetric workspace: typed fields
  Field<Signal> ready = layout.add<Signal>(kTiles);  // one signal per tile
  Field<float> inbox = layout.add<float>(kTiles * kCols);
  cpu::World world(kWorld);
  cpu::SymmetricAllocation ws = world.allocate(layout.num_bytes());
  std::vector<int> bad(kWorld, 0);
  world.run([&](cpu::RankContext& ctx) {
    SymmetricView heap = ws.view(ctx.rank);
    const int next = peer_at(ctx.rank, 1, kWorld), prev = peer_at(ctx.rank, kWorld - 1, kWorld);
    const uint64_t epoch = 1;  // first call; a second call would use 2, with no reset
    std::vector<float> tile(kCols);
    for (int t = 0; t < kTiles; ++t) {  // producer: push tile t, then notify (release)
      for (int j = 0; j < kCols; ++j) tile[j] = 1000.f * ctx.rank + t + j;
      cpu::tile_push_data(ctx, next, Copy2D{tile.data(), 0, heap.peer(next, inbox) + t * kCols, 0, 1,
                                            kCols * sizeof(float)});
      cpu::peer_tile_notify(ctx, heap, next, ready, t, epoch);
    }
    for (int t = 0; t < kTiles; ++t) {  // consumer: wait for tile t (acquire), then read it
      cpu::consumer_tile_wait(ctx, heap, ready, t, epoch, WaitSite{SignalField::kReady, t});
      for (int j = 0; j < kCols; ++j)
        bad[ctx.rank] += heap.local(inbox)[t * kCols + j] != 1000.f * prev + t + j;
    }
  });
  int errors = 0;
  for (int b : bad) errors += b;
  std::printf("%d ranks exchanged %d tiles each: %s\n", kWorld, kTiles, errors ? "WRONG" : "ok");
  return errors ? 1 : 0;
}
