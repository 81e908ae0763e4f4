#include "tilelink/backend/cpu/world.hpp"

#include <cstring>
#include <exception>
#include <sstream>
#include <thread>

#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

SymmetricView SymmetricAllocation::view(int rank) const {
  TL_REQUIRE(rank >= 0 && rank < static_cast<int>(ranks_.size()),
             "rank " << rank << " outside a world of " << ranks_.size());
  SymmetricView v;
  v.rank = rank;
  v.world_size = static_cast<int>(ranks_.size());
  for (int r = 0; r < v.world_size; ++r) v.bases[r] = ranks_[r].get();
  return v;
}

World::World(int world_size, std::chrono::milliseconds timeout)
    : size_(world_size), timeout_(timeout) {
  TL_REQUIRE(world_size >= 1 && world_size <= kMaxWorldSize,
             "world size must be in [1, " << kMaxWorldSize << "], got " << world_size);
  TL_REQUIRE(timeout.count() > 0, "wait timeout must be positive");
}

SymmetricAllocation World::allocate(uint64_t bytes) const {
  SymmetricAllocation a;
  a.bytes_ = bytes;
  for (int r = 0; r < size_; ++r) {
    // NOTE: 256-byte alignment, the same as the GPU heap, so layouts mean the same everywhere.
    auto* raw = static_cast<std::byte*>(::operator new[](bytes ? bytes : 1, std::align_val_t{256}));
    std::memset(raw, 0, bytes);
    a.ranks_.emplace_back(raw, [](std::byte* p) { ::operator delete[](p, std::align_val_t{256}); });
  }
  return a;
}

void World::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_.load(std::memory_order_relaxed)) {
    reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
}

std::string World::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

void World::run(const std::function<void(RankContext&)>& fn) {
  TL_REQUIRE(!aborted(), "this world was aborted earlier: " << abort_reason());
  std::vector<std::exception_ptr> errors(size_);
  std::vector<std::thread> threads;
  threads.reserve(size_);
  for (int r = 0; r < size_; ++r) {
    threads.emplace_back([&, r] {
      RankContext ctx{r, size_, this, "?", timeout_};
      try {
        fn(ctx);
      } catch (const std::exception& e) {
        std::ostringstream os;
        os << "rank " << r << " failed: " << e.what();
        abort(os.str());
        errors[r] = std::current_exception();
      } catch (...) {
        abort("rank " + std::to_string(r) + " failed");
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (aborted()) {
    // Rethrow the failure that caused the abort (the others are consequences of it).
    std::string reason = abort_reason();
    std::exception_ptr first;
    for (int r = 0; r < size_; ++r) {
      if (errors[r] && reason.rfind("rank " + std::to_string(r) + " failed", 0) == 0) {
        first = errors[r];
        break;
      }
    }
    // The world stays usable for a new run: clear the abort state.
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_.store(false, std::memory_order_release);
      reason_.clear();
    }
    if (first) std::rethrow_exception(first);
    throw Error(reason);
  }
}

}  // namespace tilelink::cpu
