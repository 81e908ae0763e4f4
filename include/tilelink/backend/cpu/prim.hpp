// The CPU backend of the tile-centric primitives (contracts: prim/signal.hpp, prim/data.hpp).
// Signals are std::atomic_ref<uint64_t> on the symmetric heap with release stores and acquire loads;
// waits poll with a deadline and fail with tilelink::TimeoutError.
#pragma once

#include "tilelink/backend/cpu/world.hpp"
#include "tilelink/prim/data.hpp"
#include "tilelink/prim/signal.hpp"

namespace tilelink::cpu {

// ---- signals ----------------------------------------------------------------------------------
void producer_tile_notify(const RankContext& ctx, const SymmetricView& heap, Field<Signal> f,
                          int slot, uint64_t value);
void consumer_tile_wait(const RankContext& ctx, const SymmetricView& heap, Field<Signal> f,
                        int slot, uint64_t target, WaitSite site);
void peer_tile_notify(const RankContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
                      int slot, uint64_t value);
void peer_tile_wait(const RankContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
                    int slot, uint64_t target, WaitSite site);
void rank_notify(const RankContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
                 uint64_t value);
void rank_wait(const RankContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
               uint64_t target);
// rank_notify to every rank, then rank_wait on every rank: after it, every rank has reached it.
void rank_barrier(const RankContext& ctx, const SymmetricView& heap, Field<Signal> f,
                  uint64_t epoch);

// The observed value of a signal (acquire), for tests and diagnostics.
uint64_t signal_load(const SymmetricView& heap, int rank, Field<Signal> f, int slot);

// ---- data ---------------------------------------------------------------------------------------
void tile_push_data(const RankContext& ctx, int peer, const Copy2D& copy);
void tile_pull_data(const RankContext& ctx, int peer, const Copy2D& copy);
void rank_copy_data(const RankContext& ctx, int peer, const Copy2D& copy);

}  // namespace tilelink::cpu
