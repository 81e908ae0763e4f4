// The sampled float64 reference of `tilelink bench moe_*`
// (tools/tilelink/moe_sampled_reference.hpp): every sampled row equal to the whole layer's
// reference (compute/cpu_moe.hpp) on random small layers of every op, dtype and routing pattern
// (one expert, top-1, fewer rows than samples), and an exception of the reader reaches the caller.
#include "moe_sampled_reference.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "../support/random.hpp"
#include "tilelink/compute/cpu_moe.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace tilelink {
namespace {

using cli::MoeBenchOp;

void copy_bytes(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

TEST(MoeSampledReference, RowsEqualTheWholeReference) {
  TL_SEEDED_RNG(rng);
  for (int trial = 0; trial < 60; ++trial) {
    const auto op = static_cast<MoeBenchOp>(trial % 3);
    const DType dtype = rng.coin() ? DType::kBF16 : DType::kF16;
    const int experts = rng.pick(std::vector<int>{1, 3, 8, 20});
    const int topk = rng.uniform_int(1, std::min(experts, 4));
    const int64_t tokens = rng.uniform(1, 40), hidden = 8 * rng.uniform(1, 4),
                  ffn = 8 * rng.uniform(1, 3);
    const auto pattern = static_cast<MoeRoutingPattern>(rng.uniform_int(0, 3));
    SCOPED_TRACE(::testing::Message()
                 << "op " << int(op) << ", " << dtype_name(dtype) << ", " << tokens << " tokens, H "
                 << hidden << ", F " << ffn << ", " << experts << " experts, top-" << topk << ", "
                 << moe_routing_name(pattern));
    const std::vector<int32_t> ids = moe_draw_routing(rng.gen(), tokens, topk, experts, pattern);
    const MoeRouting route = moe_route(ids, tokens, topk, experts);
    std::vector<float> weights(route.rows());
    for (float& w : weights) w = rng.uniform_float(0.1f, 1.0f);

    cli::MoeSampleInputs in{.op = op,
                            .dtype = dtype,
                            .tokens = tokens,
                            .hidden = hidden,
                            .ffn = ffn,
                            .experts = experts,
                            .topk = topk};
    const std::vector<std::byte> x = rng.tensor(dtype, tokens * hidden),
                                 w1 = rng.tensor(dtype, experts * in.n0() * hidden),
                                 h1 = rng.tensor(dtype, route.rows() * ffn),
                                 w2 = rng.tensor(dtype, experts * hidden * ffn);
    in.x = x.data(), in.w1 = w1.data(), in.h1 = h1.data(), in.w2 = w2.data();
    const std::vector<double> whole =
        op == MoeBenchOp::kAgGemm ? moe_layer0_f64(x.data(), route, w1.data(), hidden, ffn, dtype)
        : op == MoeBenchOp::kGemmRs
            ? moe_layer1_partial_f64(h1.data(), route, w2.data(), weights, hidden, ffn, dtype)
            : moe_mlp_partial_f64(x.data(), route, w1.data(), w2.data(), weights, hidden, ffn,
                                  dtype);

    const cli::SampledReference s =
        cli::sampled_reference(in, route, ids, weights, rng.gen(), copy_bytes);
    const int64_t population = op == MoeBenchOp::kAgGemm ? route.rows() : tokens;
    const int64_t cols = in.out_cols();
    ASSERT_EQ(static_cast<int64_t>(s.rows.size()), std::min(cli::kMoeSamples, population));
    ASSERT_EQ(s.want.size(), s.rows.size() * cols);
    for (size_t i = 0; i < s.rows.size(); ++i) {
      ASSERT_TRUE(s.rows[i] >= 0 && s.rows[i] < population) << s.rows[i];
      if (i > 0) {
        ASSERT_LT(s.rows[i - 1], s.rows[i]);
      }
      for (int64_t j = 0; j < cols; ++j) {
        // The same products in double, summed in another order for the layers with a reduce.
        const double want = whole[s.rows[i] * cols + j];
        ASSERT_NEAR(s.want[i * cols + j], want, 1e-12 * (1 + std::abs(want)))
            << "row " << s.rows[i] << ", column " << j;
      }
    }
  }
}

TEST(MoeSampledReference, ReaderExceptionReachesTheCaller) {
  TL_SEEDED_RNG(rng);
  const int64_t tokens = 40;
  const std::vector<int32_t> ids =
      moe_draw_routing(rng.gen(), tokens, 3, 8, MoeRoutingPattern::kUniform);
  const MoeRouting route = moe_route(ids, tokens, 3, 8);
  const std::vector<float> weights(route.rows(), 0.3f);
  const std::vector<std::byte> any(1 << 16);
  const cli::MoeSampleInputs in{.op = MoeBenchOp::kMlp,
                                .dtype = DType::kBF16,
                                .tokens = tokens,
                                .hidden = 16,
                                .ffn = 8,
                                .experts = 8,
                                .topk = 3,
                                .x = any.data(),
                                .w1 = any.data(),
                                .h1 = any.data(),
                                .w2 = any.data()};
  EXPECT_THROW(cli::sampled_reference(
                   in, route, ids, weights, rng.gen(),
                   [](void*, const void*, size_t) { throw std::runtime_error("the copy failed"); }),
               std::runtime_error);
}

}  // namespace
}  // namespace tilelink
