// Runs a rank's workers (communication and compute) as threads and joins them. A worker that throws
// aborts the world, so every other worker's waits stop, and the first failure is rethrown.
#pragma once

#include <functional>
#include <vector>

#include "tilelink/backend/cpu/world.hpp"

namespace tilelink::cpu {

// fn(worker index) for each of `count` workers of each group.
struct WorkerGroup {
  int count = 1;
  std::function<void(int worker)> fn;
};

void run_workers(RankContext& ctx, const std::vector<WorkerGroup>& groups);

}  // namespace tilelink::cpu
