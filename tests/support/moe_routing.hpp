// Random MoE routings for the tests (CPU and GPU): topk distinct experts per token, drawn by a
// routing pattern.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "random.hpp"

namespace tilelink::test {

enum class Routing { kUniform, kSkewed, kOneExpert, kEmptyExperts };

// topk distinct experts per token, drawn by the routing pattern.
inline std::vector<int32_t> draw_ids(test::Rng& rng, int64_t tokens, int topk, int experts, Routing how) {
  std::vector<int32_t> ids(tokens * topk);
  // the experts a token may take: all, a skewed few first, or half of them (the rest get nothing)
  const int live = how == Routing::kEmptyExperts ? std::max(topk, experts / 2) : experts;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> pool(live);
    std::iota(pool.begin(), pool.end(), 0);
    if (how == Routing::kOneExpert) {
      // every token's first slot takes expert 0 (and the others what is left)
      std::shuffle(pool.begin() + 1, pool.end(), rng.gen());
    } else if (how == Routing::kSkewed) {
      // experts drawn with weight 1 / (1 + e): the low ids take most tokens
      std::vector<double> w(live);
      for (int e = 0; e < live; ++e) w[e] = 1.0 / (1.0 + e);
      for (int s = 0; s < topk; ++s) {
        std::discrete_distribution<int> d(w.begin() + s, w.end());
        const int j = s + d(rng.gen());
        std::swap(pool[s], pool[j]);
        std::swap(w[s], w[j]);
      }
    } else {
      std::shuffle(pool.begin(), pool.end(), rng.gen());
    }
    for (int s = 0; s < topk; ++s) ids[t * topk + s] = pool[s];
  }
  return ids;
}

inline const char* name(Routing r) {
  switch (r) {
    case Routing::kUniform: return "uniform";
    case Routing::kSkewed: return "skewed";
    case Routing::kOneExpert: return "one-expert";
    case Routing::kEmptyExperts: return "empty-experts";
  }
  return "?";
}

}  // namespace tilelink::test
