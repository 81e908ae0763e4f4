// MoE routing on the host (ops/moe_routing.hpp).
#include "tilelink/ops/moe_routing.hpp"

#include "tilelink/core/error.hpp"

namespace tilelink {

MoeRouting moe_route(std::span<const int32_t> topk_ids, int64_t tokens, int topk, int experts) {
  TL_REQUIRE(experts >= 1, "moe routing: experts must be at least 1, got " << experts);
  TL_REQUIRE(topk >= 1 && topk <= experts,
             "moe routing: top-k must be in [1, experts = " << experts << "], got " << topk);
  TL_REQUIRE(tokens >= 0, "moe routing: tokens must be >= 0, got " << tokens);
  TL_REQUIRE(static_cast<int64_t>(topk_ids.size()) == tokens * topk,
             "moe routing: topk_ids holds " << topk_ids.size() << " ids, tokens x top-k = "
                                            << tokens << " x " << topk << " = " << tokens * topk);
  for (int64_t p = 0; p < tokens * topk; ++p) {
    TL_REQUIRE(topk_ids[p] >= 0 && topk_ids[p] < experts,
               "moe routing: token " << p / topk << ", slot " << p % topk << " names expert "
                                     << topk_ids[p] << ", outside [0, " << experts << ")");
  }
  MoeRouting r;
  r.tokens = tokens, r.topk = topk, r.experts = experts;
  r.counts.resize(experts);
  r.offsets.resize(experts + 1);
  r.pair_of_row.resize(tokens * topk);
  r.row_of_pair.resize(tokens * topk);
  const bool ok = moe_route(topk_ids.data(), tokens, topk, experts, r.counts.data(),
                            r.offsets.data(), r.pair_of_row.data(), r.row_of_pair.data());
  TL_REQUIRE(ok, "moe routing: the tables could not be filled");  // unreachable after the checks
  return r;
}

}  // namespace tilelink
