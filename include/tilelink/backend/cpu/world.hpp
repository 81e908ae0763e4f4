// The CPU backend's world: N ranks as threads of one process, a symmetric heap in host memory.
//
//   cpu::World world(3);                       // 3 ranks
//   cpu::SymmetricAllocation ws = world.allocate(layout.num_bytes());
//   world.run([&](cpu::RankContext& ctx) { ... ctx.rank ... ws.view(ctx.rank) ... });
//
// run() starts one thread per rank and joins them. If any rank throws (a failed check, a wait that
// timed out), the world is marked aborted: every other rank's waits stop at once with an error that
// names the failing rank, and run() rethrows the first failure.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tilelink/core/symmetric.hpp"

namespace tilelink::cpu {

class World;

// A buffer of the same size on every rank, zero-filled at allocation.
class SymmetricAllocation {
 public:
  SymmetricAllocation() = default;
  uint64_t num_bytes() const { return bytes_; }
  void* base(int rank) const { return ranks_.at(rank).get(); }
  // The view of `rank`: its own base plus every peer's.
  SymmetricView view(int rank) const;

 private:
  friend class World;
  uint64_t bytes_ = 0;
  std::vector<std::shared_ptr<std::byte[]>> ranks_;
};

// What a rank's code receives: who it is, its world, the current op's name (for diagnostics) and
// the wait deadline.
struct RankContext {
  int rank = 0;
  int world_size = 1;
  World* world = nullptr;
  const char* op = "?";
  std::chrono::nanoseconds timeout{};
};

class World {
 public:
  // timeout: the bound of every wait in this world.
  explicit World(int world_size, std::chrono::milliseconds timeout = std::chrono::seconds(20));

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  SymmetricAllocation allocate(uint64_t bytes) const;

  // Runs fn on every rank, one thread each; rethrows the first rank's failure.
  void run(const std::function<void(RankContext&)>& fn);

  // Abort protocol (used by the primitives and by run()).
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const;
  void abort(const std::string& reason);

 private:
  int size_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::string reason_;
};

}  // namespace tilelink::cpu
