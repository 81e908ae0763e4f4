// What the sm90 engine's epilogue assumes of CuTe's accumulator layout, checked on the host for
// every tile the engine compiles (gemm_epilogue.cuh; the tiled MMA is the recipe CUTLASS's builder
// uses for the cooperative kernel, and GemmConfig static_asserts that it is the builder's type):
// - the 256 consumer threads' accumulators cover the tile once;
// - store_tile_staged: a thread's values form 16-row slabs (one per 128 rows of the tile), a slab's
//   values contiguous in the fragment, its rows inside one 16-row band that all 32 lanes of the warp
//   share, and each 128-byte column chunk's values (4 (chunk * pairs + jj) + 2 v1 of the slab) fill
//   the warp's 16 rows x the chunk's columns exactly once, for 16-bit and 32-bit outputs.
#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "tilelink/compute/sm90/gemm.hpp"

namespace tilelink::compute::sm90 {
namespace {

template <int TileM, int TileN>
auto engine_tiled_mma() {
  using namespace cute;
  using Tile = Shape<Int<TileM>, Int<TileN>, Int<kTileK>>;
  return make_tiled_mma(GMMA::ss_op_selector<cutlass::bfloat16_t, cutlass::bfloat16_t, float, Tile,
                                             GMMA::Major::K, GMMA::Major::K>(),
                        Layout<Shape<_2, _1, _1>>{});
}

// (row, col) of each accumulator value of consumer thread t.
template <int TileM, int TileN>
std::vector<std::pair<int, int>> thread_coords(int t) {
  using namespace cute;
  auto mma = engine_tiled_mma<TileM, TileN>();
  auto c = mma.get_thread_slice(t).partition_C(
      make_identity_tensor(make_shape(Int<TileM>{}, Int<TileN>{})));
  std::vector<std::pair<int, int>> out;
  for (int i = 0; i < size(c); ++i) out.emplace_back(get<0>(c(i)), get<1>(c(i)));
  return out;
}

template <int TileM, int TileN>
void check_tile() {
  SCOPED_TRACE(::testing::Message() << "tile " << TileM << " x " << TileN);
  std::vector<std::vector<std::pair<int, int>>> coords(256);
  std::set<std::pair<int, int>> seen;
  for (int t = 0; t < 256; ++t) {
    coords[t] = thread_coords<TileM, TileN>(t);
    for (auto rc : coords[t]) EXPECT_TRUE(seen.insert(rc).second) << rc.first << "," << rc.second;
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(TileM) * TileN);  // every element once

  const int values = static_cast<int>(coords[0].size());
  const int slab_values = 2 * 2 * (TileN / 8);
  const int slabs = values / slab_values;
  ASSERT_EQ(slabs * slab_values, values);
  ASSERT_EQ(slabs * 128, TileM);
  for (int elem_bytes : {2, 4}) {
    const int chunk_cols = 128 / elem_bytes, pairs = chunk_cols / 8;
    const int chunks = (TileN + chunk_cols - 1) / chunk_cols;
    for (int warp = 0; warp < 8; ++warp) {
      for (int s = 0; s < slabs; ++s) {
        const int base = s * slab_values;
        const int row0 = coords[32 * warp][base].first & ~15;
        for (int lane = 0; lane < 32; ++lane) {
          const auto& c = coords[32 * warp + lane];
          EXPECT_EQ(c[base].first & ~15, row0) << "warp " << warp << " lane " << lane;
          for (int i = base; i < base + slab_values; ++i) {
            EXPECT_GE(c[i].first, row0);
            EXPECT_LT(c[i].first, row0 + 16);
          }
        }
        for (int chunk = 0; chunk < chunks; ++chunk) {
          const int cols = TileN - chunk * chunk_cols < chunk_cols ? TileN - chunk * chunk_cols : chunk_cols;
          std::set<std::pair<int, int>> staged;
          for (int lane = 0; lane < 32; ++lane) {
            const auto& c = coords[32 * warp + lane];
            for (int jj = 0; jj < pairs && 8 * jj < cols; ++jj) {
              for (int v1 = 0; v1 < 2; ++v1) {
                const int i = base + 4 * (chunk * pairs + jj) + 2 * v1;
                for (int e = 0; e < 2; ++e) {  // the pair: columns c and c + 1 of one row
                  EXPECT_EQ(c[i + e].first, c[i].first);
                  EXPECT_EQ(c[i + e].second, c[i].second + e);
                  const int r = c[i + e].first - row0, col = c[i + e].second - chunk * chunk_cols;
                  EXPECT_TRUE(col >= 0 && col < cols) << "chunk " << chunk << " col " << col;
                  EXPECT_TRUE(staged.insert({r, col}).second);
                }
              }
            }
          }
          EXPECT_EQ(staged.size(), static_cast<size_t>(16) * cols)
              << "warp " << warp << " slab " << s << " chunk " << chunk << " (" << elem_bytes
              << "-byte output)";
        }
      }
    }
  }
}

TEST(Sm90EpilogueLayout, HookedWidths) {
  check_tile<kTileM, kTileN>();
  check_tile<kTileM, kTileNNarrow>();
  check_tile<kTileM, kTileNLean>();
  check_tile<kTileM, kTileNSlim>();
}

TEST(Sm90EpilogueLayout, PlainEngineTiles) {
  check_tile<kTileM, kTileNFit>();
  check_tile<kTileMTall, kTileNTall>();
}

}  // namespace
}  // namespace tilelink::compute::sm90
