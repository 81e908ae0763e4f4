// MoE routing on the host (ops/moe_routing.hpp).
#include "tilelink/ops/moe_routing.hpp"

#include <algorithm>
#include <numeric>

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


const char* moe_routing_name(MoeRoutingPattern pattern) {
  switch (pattern) {
    case MoeRoutingPattern::kUniform: return "uniform";
    case MoeRoutingPattern::kSkewed: return "skewed";
    case MoeRoutingPattern::kOneExpert: return "one-expert";
    case MoeRoutingPattern::kEmptyExperts: return "empty-experts";
  }
  return "?";
}

MoeRoutingPattern moe_routing_pattern(std::string_view name) {
  for (MoeRoutingPattern p : {MoeRoutingPattern::kUniform, MoeRoutingPattern::kSkewed, MoeRoutingPattern::kOneExpert,
                              MoeRoutingPattern::kEmptyExperts})
    if (name == moe_routing_name(p)) return p;
  TL_REQUIRE(false, "moe routing: unknown routing '" << name << "' (uniform, skewed, one-expert, empty-experts)");
  return MoeRoutingPattern::kUniform;
}

std::vector<int32_t> moe_draw_routing(std::mt19937_64& gen, int64_t tokens, int topk, int experts,
                                      MoeRoutingPattern how) {
  TL_REQUIRE(experts >= 1 && topk >= 1 && topk <= experts && tokens >= 0,
             "moe routing: a draw needs tokens >= 0 and 1 <= top-k <= experts, got tokens " << tokens << ", top-k "
                                                                                          << topk << ", experts " << experts);
  std::vector<int32_t> ids(tokens * topk);
  // the experts a token may take: all, a skewed few first, or half of them (the rest get nothing)
  const int live = how == MoeRoutingPattern::kEmptyExperts ? std::max(topk, experts / 2) : experts;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> pool(live);
    std::iota(pool.begin(), pool.end(), 0);
    if (how == MoeRoutingPattern::kOneExpert) {
      // every token's first slot takes expert 0 (and the others what is left)
      std::shuffle(pool.begin() + 1, pool.end(), gen);
    } else if (how == MoeRoutingPattern::kSkewed) {
      // experts drawn with weight 1 / (1 + e): the low ids take most tokens
      std::vector<double> w(live);
      for (int e = 0; e < live; ++e) w[e] = 1.0 / (1.0 + e);
      for (int s = 0; s < topk; ++s) {
        std::discrete_distribution<int> d(w.begin() + s, w.end());
        const int j = s + d(gen);
        std::swap(pool[s], pool[j]);
        std::swap(w[s], w[j]);
      }
    } else {
      std::shuffle(pool.begin(), pool.end(), gen);
    }
    for (int s = 0; s < topk; ++s) ids[t * topk + s] = pool[s];
  }
  return ids;
}

namespace {

// The tile rows [0, first[groups]) stably by a key each: the latest (arrival) or the earliest
// (completion) of its rows' row_key(i).
template <class RowKey>
std::vector<int> tile_rows_by_key(const char* what, std::span<const int64_t> offsets, std::span<const int> first,
                                  int tile_rows, int topk, bool latest, RowKey row_key) {
  const int groups = static_cast<int>(offsets.size()) - 1;
  TL_REQUIRE(groups >= 1 && static_cast<int>(first.size()) == groups + 1 && tile_rows >= 1 && topk >= 1,
             what << ": bad tables (" << offsets.size() << " offsets, " << first.size()
                  << " first tile rows, tile_rows " << tile_rows << ")");
  const int count = first[groups];
  std::vector<int> key(count), order(count);
  for (int t = 0; t < count; ++t) {
    const MoeTileRowSpan span = moe_tile_row_span(offsets.data(), first.data(), groups, tile_rows, t);
    key[t] = row_key(span.begin);
    for (int64_t i = span.begin + 1; i < span.end; ++i)
      key[t] = latest ? std::max(key[t], row_key(i)) : std::min(key[t], row_key(i));
  }
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] < key[b]; });
  return order;
}

}  // namespace

std::vector<int> moe_arrival_row_order(std::span<const int64_t> offsets, std::span<const int> first, int tile_rows,
                                       std::span<const int64_t> pair_of_row, int topk, const RowPartition& tokens,
                                       int rank) {
  TL_REQUIRE(rank >= 0 && rank < tokens.world_size, "moe_arrival_row_order: rank " << rank << " of "
                                                                                    << tokens.world_size);
  return tile_rows_by_key("moe_arrival_row_order", offsets, first, tile_rows, topk, true, [&](int64_t i) {
    return moe_row_arrival(pair_of_row.data(), topk, tokens, rank, i);
  });
}

std::vector<int> moe_completion_row_order(std::span<const int64_t> offsets, std::span<const int> first, int tile_rows,
                                          std::span<const int64_t> pair_of_row, int topk, const MoeCompletion& c) {
  TL_REQUIRE(c.valid(),
             "moe_completion_row_order: bad completion (tokens " << c.tokens << ", reduce rows " << c.reduce_rows
                                                                 << ", first tile " << c.first_tile << ", keys "
                                                                 << c.keys << ")");
  return tile_rows_by_key("moe_completion_row_order", offsets, first, tile_rows, topk, false, [&](int64_t i) {
    return moe_row_completion(pair_of_row.data(), topk, c, i);
  });
}

}  // namespace tilelink
