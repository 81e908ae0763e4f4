#include "tilelink/backend/cpu/workers.hpp"

#include <atomic>
#include <exception>
#include <sstream>
#include <thread>

namespace tilelink::cpu {

void run_workers(RankContext& ctx, const std::vector<WorkerGroup>& groups) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors;
  size_t total = 0;
  for (const auto& g : groups) total += static_cast<size_t>(g.count);
  errors.resize(total);
  std::atomic<long> first_failure{-1};  // the root cause fails first; the rest see the abort
  size_t slot = 0;
  for (const auto& g : groups) {
    for (int w = 0; w < g.count; ++w, ++slot) {
      threads.emplace_back([&ctx, &errors, &first_failure, &g, w, slot] {
        try {
          g.fn(w);
        } catch (const std::exception& e) {
          std::ostringstream os;
          os << "rank " << ctx.rank << " failed: " << e.what();
          if (ctx.world) ctx.world->abort(os.str());
          errors[slot] = std::current_exception();
          long none = -1;
          first_failure.compare_exchange_strong(none, static_cast<long>(slot));
        } catch (...) {
          if (ctx.world) ctx.world->abort("rank " + std::to_string(ctx.rank) + " failed");
          errors[slot] = std::current_exception();
          long none = -1;
          first_failure.compare_exchange_strong(none, static_cast<long>(slot));
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  if (long f = first_failure.load(); f >= 0) std::rethrow_exception(errors[static_cast<size_t>(f)]);
}

}  // namespace tilelink::cpu
