#include "tilelink/backend/cpu/prim.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

namespace {

std::atomic_ref<uint64_t> signal_ref(const SymmetricView& heap, int rank, Field<Signal> f,
                                     int slot) {
  return std::atomic_ref<uint64_t>(heap.peer(rank, f)[slot]);
}

void check_slot(const RankContext& ctx, int rank, Field<Signal> f, int slot) {
  TL_REQUIRE(rank >= 0 && rank < ctx.world_size,
             "op " << ctx.op << ": rank " << rank << " outside a world of " << ctx.world_size);
  TL_REQUIRE(slot >= 0 && slot < f.count, "op " << ctx.op << ": signal slot " << slot
                                                 << " outside a field of " << f.count);
}

// Polls `owner`.f[slot] until it reaches target, the deadline passes, or the world aborts.
void bounded_wait(const RankContext& ctx, const SymmetricView& heap, int owner, Field<Signal> f,
                  int slot, uint64_t target, WaitSite site) {
  check_slot(ctx, owner, f, slot);
  auto ref = signal_ref(heap, owner, f, slot);
  if (ref.load(std::memory_order_acquire) >= target) return;
  auto deadline = std::chrono::steady_clock::now() + ctx.timeout;
  for (uint64_t spins = 1;; ++spins) {
    if (ref.load(std::memory_order_acquire) >= target) return;
    if (spins % 64 == 0) {
      std::this_thread::yield();
      if (ctx.world && ctx.world->aborted()) {
        std::ostringstream os;
        os << "op " << ctx.op << ": rank " << ctx.rank << " stopped waiting on " << site.name() << "[" << slot
           << "] of rank " << owner << " because the world aborted (" << ctx.world->abort_reason() << ")";
        throw Error(os.str());
      }
      if (std::chrono::steady_clock::now() > deadline) {
        std::ostringstream os;
        os << "op " << ctx.op << ": rank " << ctx.rank << " timed out waiting on " << site.name() << "[" << slot
           << "] of rank " << owner << ": expected >= " << target << ", observed "
           << ref.load(std::memory_order_acquire) << " (";
        if (site.tile >= 0) os << "tile " << site.tile << ", ";
        os << "after " << std::chrono::duration<double>(ctx.timeout).count() << " s)";
        throw TimeoutError(os.str());
      }
    }
  }
}

void copy_rows(const Copy2D& c) {
  if (c.rows <= 0 || c.row_bytes <= 0) return;
  TL_REQUIRE(c.src && c.dst, "copy with a null pointer");
  auto* d = static_cast<std::byte*>(c.dst);
  auto* s = static_cast<const std::byte*>(c.src);
  if (c.src_pitch == c.row_bytes && c.dst_pitch == c.row_bytes) {
    std::memcpy(d, s, static_cast<size_t>(c.rows * c.row_bytes));
    return;
  }
  for (int64_t i = 0; i < c.rows; ++i)
    std::memcpy(d + i * c.dst_pitch, s + i * c.src_pitch, static_cast<size_t>(c.row_bytes));
}

}  // namespace

void producer_tile_notify(const RankContext& ctx, const SymmetricView& heap, Field<Signal> f,
                          int slot, uint64_t value) {
  check_slot(ctx, ctx.rank, f, slot);
  signal_ref(heap, ctx.rank, f, slot).store(value, std::memory_order_release);
}

void consumer_tile_wait(const RankContext& ctx, const SymmetricView& heap, Field<Signal> f,
                        int slot, uint64_t target, WaitSite site) {
  bounded_wait(ctx, heap, ctx.rank, f, slot, target, site);
}

void peer_tile_notify(const RankContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
                      int slot, uint64_t value) {
  check_slot(ctx, peer, f, slot);
  signal_ref(heap, peer, f, slot).store(value, std::memory_order_release);
}

void peer_tile_wait(const RankContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
                    int slot, uint64_t target, WaitSite site) {
  bounded_wait(ctx, heap, peer, f, slot, target, site);
}

void rank_notify(const RankContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
                 uint64_t value) {
  check_slot(ctx, peer, f, ctx.rank);
  signal_ref(heap, peer, f, ctx.rank).store(value, std::memory_order_release);
}

void rank_wait(const RankContext& ctx, const SymmetricView& heap, int peer, Field<Signal> f,
               uint64_t target) {
  // NOTE: the slot is the peer's rank; check it against the world, not only against the field.
  TL_REQUIRE(peer >= 0 && peer < ctx.world_size,
             "op " << ctx.op << ": wait on rank " << peer << " outside a world of " << ctx.world_size);
  bounded_wait(ctx, heap, ctx.rank, f, peer, target, WaitSite{SignalField::kRankSignals, -1});
}

void rank_barrier(const RankContext& ctx, const SymmetricView& heap, Field<Signal> f,
                  uint64_t epoch) {
  for (int p = 0; p < ctx.world_size; ++p) rank_notify(ctx, heap, p, f, epoch);
  for (int p = 0; p < ctx.world_size; ++p) rank_wait(ctx, heap, p, f, epoch);
}

uint64_t signal_load(const SymmetricView& heap, int rank, Field<Signal> f, int slot) {
  return signal_ref(heap, rank, f, slot).load(std::memory_order_acquire);
}

void tile_push_data(const RankContext& ctx, int peer, const Copy2D& copy) {
  TL_REQUIRE(peer >= 0 && peer < ctx.world_size, "op " << ctx.op << ": push to rank " << peer
                                                       << " outside a world of " << ctx.world_size);
  copy_rows(copy);
}

void tile_pull_data(const RankContext& ctx, int peer, const Copy2D& copy) {
  TL_REQUIRE(peer >= 0 && peer < ctx.world_size, "op " << ctx.op << ": pull from rank " << peer
                                                       << " outside a world of " << ctx.world_size);
  copy_rows(copy);
}

void rank_copy_data(const RankContext& ctx, int peer, const Copy2D& copy) {
  TL_REQUIRE(peer >= 0 && peer < ctx.world_size, "op " << ctx.op << ": copy with rank " << peer
                                                       << " outside a world of " << ctx.world_size);
  copy_rows(copy);
}

}  // namespace tilelink::cpu
