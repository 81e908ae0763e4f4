// Random MoE routings for the tests (CPU and GPU): the library's draws (ops/moe_routing.hpp) under
// the tests' names.
#pragma once

#include <cstdint>
#include <vector>

#include "random.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace tilelink::test {

using Routing = MoeRoutingPattern;

inline std::vector<int32_t> draw_ids(Rng& rng, int64_t tokens, int topk, int experts, Routing how) {
  return moe_draw_routing(rng.gen(), tokens, topk, experts, how);
}
inline const char* name(Routing r) { return moe_routing_name(r); }

}  // namespace tilelink::test
