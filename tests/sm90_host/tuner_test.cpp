// GemmTuner's host-side rules (gemm_tuner.hpp): its candidates and the choice among their times.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "tilelink/compute/sm90/gemm_tuner.hpp"

namespace tilelink::compute::sm90 {
namespace {

// Every tile the engine runs, once each: the hooked widths and the plain engine's two.
TEST(Sm90Tuner, CandidatesAreEveryTileOnce) {
  std::set<std::pair<int, int>> seen;
  for (GemmTile t : gemm_tuner_candidates()) EXPECT_TRUE(seen.insert({t.m, t.n}).second);
  const std::set<std::pair<int, int>> want{{kTileM, kTileN},     {kTileM, kTileNNarrow},
                                           {kTileM, kTileNFit},  {kTileM, kTileNLean},
                                           {kTileM, kTileNSlim}, {kTileMTall, kTileNTall}};
  EXPECT_EQ(seen, want);
}

// The fastest measured time, the earliest on a tie; unmeasured (negative) ones never; -1 if none.
TEST(Sm90Tuner, FastestOfTheMeasured) {
  EXPECT_EQ(gemm_tuner_fastest({0.9, 0.7, 0.8}), 1);
  EXPECT_EQ(gemm_tuner_fastest({0.7, 0.9, 0.7}), 0);
  EXPECT_EQ(gemm_tuner_fastest({-1.0, 0.9, 0.95}), 1);
  EXPECT_EQ(gemm_tuner_fastest({-1.0, -1.0}), -1);
  EXPECT_EQ(gemm_tuner_fastest({}), -1);
}

}  // namespace
}  // namespace tilelink::compute::sm90
