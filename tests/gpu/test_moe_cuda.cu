// MoE layers on one GPU (ops/moe_cuda.hpp) against float64 (compute/cpu_moe.hpp): layer 0, layer 1
// and the whole MLP on every routing pattern, bf16 and fp16, 1 to 256 experts, top-k 1 to 8, shapes
// off the tiles' edges; the fused path (X gathered in the grouped GEMM's load path) and the
// overlapped one (the gather kernel beside the GEMM, tiles waiting on their tile rows) bit for bit
// against the unfused one (a gather kernel first); outputs poisoned before every run, so rows a path
// leaves unwritten show; a captured graph replayed over routings that change between replays; ids
// out of range reported and not routed; bad shapes refused before anything runs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "../support/moe_routing.hpp"
#include "../support/random.hpp"
#include "../support/refused.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_moe.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/ops/moe_cuda.hpp"
#include "tilelink/ops/moe_routing.hpp"

using namespace tilelink;
using tilelink::cuda::MoeLayer;
using tilelink::cuda::MoePath;
using tilelink::test::Routing;

namespace {

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) { TL_CUDA_CHECK(cudaMalloc(&p, n ? n : 1)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
  void put(const void* h, size_t n) { TL_CUDA_CHECK(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice)); }
  template <class V>
  void put(const V& v) { put(v.data(), v.size() * sizeof(v[0])); }
  void poison() { TL_CUDA_CHECK(cudaMemset(p, 0xFF, bytes)); }
  std::vector<std::byte> host() const {
    std::vector<std::byte> h(bytes);
    TL_CUDA_CHECK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
};

// Relative Frobenius error of `count` elements of dtype against float64 (inf where any is not finite).
double rel_error(const std::vector<std::byte>& got, DType dtype, const std::vector<double>& ref,
                 int64_t count) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double g = load_as_float(got.data(), dtype, i);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Case {
  int64_t tokens, hidden, ffn;
  int experts, topk;
  DType dtype;
};

std::vector<float> draw_weights(test::Rng& rng, int64_t pairs) {
  std::vector<float> w(pairs);
  for (auto& v : w) v = rng.uniform_float(0.f, 1.f);
  return w;
}

// Layer 0, layer 1 and the MLP of one case and routing, both paths, checked.
void check_case(const Case& c, Routing routing, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << c.tokens << " tokens, H " << c.hidden << ", F " << c.ffn << ", "
                                  << c.experts << " experts, top-" << c.topk << ", "
                                  << test::name(routing) << ", " << dtype_name(c.dtype));
  test::Rng rng(seed);
  const int64_t rows = c.tokens * c.topk, h = c.hidden, f = c.ffn, eb = dtype_size(c.dtype);
  const std::vector<int32_t> ids = test::draw_ids(rng, c.tokens, c.topk, c.experts, routing);
  const MoeRouting rt = moe_route(ids, c.tokens, c.topk, c.experts);
  const auto x = rng.tensor(c.dtype, c.tokens * h);
  const auto w1 = rng.tensor(c.dtype, int64_t{c.experts} * 2 * f * h);  // [E, 2F, H]: gate, up
  const auto w1a = rng.tensor(c.dtype, int64_t{c.experts} * f * h);     // [E, F, H]
  const auto w2 = rng.tensor(c.dtype, int64_t{c.experts} * h * f);      // [E, H, F]
  const auto h1 = rng.tensor(c.dtype, rows * f);
  const std::vector<float> weights = draw_weights(rng, rows);

  Dev d_ids(ids.size() * 4), d_x(x.size()), d_w1(w1.size()), d_w1a(w1a.size()), d_w2(w2.size()),
      d_h1(h1.size()), d_weights(weights.size() * 4);
  d_ids.put(ids), d_x.put(x), d_w1.put(w1), d_w1a.put(w1a), d_w2.put(w2), d_h1.put(h1);
  d_weights.put(weights);
  Dev out0(rows * f * eb), out0_unfused(rows * f * eb), out1(c.tokens * h * eb),
      mlp(c.tokens * h * eb), mlp_unfused(c.tokens * h * eb);
  for (Dev* d : {&out0, &out0_unfused, &out1, &mlp, &mlp_unfused}) d->poison();

  MoeLayer moe(c.tokens, h, f, c.experts, c.topk, c.dtype);
  moe.route(d_ids.as<int32_t>(), nullptr);
  moe.layer0(d_x.p, d_w1a.p, f, out0.p, MoePath::kFused, nullptr);
  moe.layer0(d_x.p, d_w1a.p, f, out0_unfused.p, MoePath::kUnfused, nullptr);
  moe.layer1(d_h1.p, d_w2.p, d_weights.as<float>(), out1.p, nullptr);
  moe.mlp(d_x.p, d_w1.p, d_w2.p, d_weights.as<float>(), mlp.p, MoePath::kFused, nullptr);
  moe.mlp(d_x.p, d_w1.p, d_w2.p, d_weights.as<float>(), mlp_unfused.p, MoePath::kUnfused, nullptr);
  Dev mlp_auto(c.tokens * h * eb), mlp_overlap(c.tokens * h * eb), out0_overlap(rows * f * eb);
  Dev mlp_ahead(c.tokens * h * eb), out0_ahead(rows * f * eb);
  mlp_auto.poison(), mlp_overlap.poison(), out0_overlap.poison(), mlp_ahead.poison(), out0_ahead.poison();
  moe.mlp(d_x.p, d_w1.p, d_w2.p, d_weights.as<float>(), mlp_auto.p, MoePath::kAuto, nullptr);
  moe.mlp(d_x.p, d_w1.p, d_w2.p, d_weights.as<float>(), mlp_overlap.p, MoePath::kOverlap, nullptr);
  moe.layer0(d_x.p, d_w1a.p, f, out0_overlap.p, MoePath::kOverlap, nullptr);
  TL_CUDA_CHECK(cudaMemset(moe.xs(), 0xff, rows * h * eb));  // kAhead must write every row it reads
  moe.layer0(d_x.p, d_w1a.p, f, out0_ahead.p, MoePath::kAhead, nullptr);
  moe.mlp(d_x.p, d_w1.p, d_w2.p, d_weights.as<float>(), mlp_ahead.p, MoePath::kAhead, nullptr);
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  {
    const auto a = mlp_auto.host(), o = mlp_overlap.host(), u = mlp_unfused.host(), ah = mlp_ahead.host();
    EXPECT_EQ(0, std::memcmp(a.data(), u.data(), a.size())) << "mlp: auto != unfused";
    EXPECT_EQ(0, std::memcmp(o.data(), u.data(), o.size())) << "mlp: overlap != unfused";
    EXPECT_EQ(0, std::memcmp(ah.data(), u.data(), ah.size())) << "mlp: ahead != unfused";
    const auto o0 = out0_overlap.host(), u0 = out0_unfused.host(), a0 = out0_ahead.host();
    EXPECT_EQ(0, std::memcmp(o0.data(), u0.data(), o0.size())) << "layer 0: overlap != unfused";
    EXPECT_EQ(0, std::memcmp(a0.data(), u0.data(), a0.size())) << "layer 0: ahead != unfused";
  }

  // the tables the layers ran on are the host form's
  std::vector<int64_t> offsets(c.experts + 1);
  TL_CUDA_CHECK(cudaMemcpy(offsets.data(), moe.offsets(), offsets.size() * 8, cudaMemcpyDeviceToHost));
  ASSERT_EQ(offsets, rt.offsets);

  const double tol0 = 1e-2, tol1 = 2e-2, tol_mlp = 3e-2;
  const auto got0 = out0.host(), got0u = out0_unfused.host();
  EXPECT_EQ(0, std::memcmp(got0.data(), got0u.data(), got0.size())) << "layer 0: fused != unfused";
  EXPECT_LT(rel_error(got0, c.dtype, moe_layer0_f64(x.data(), rt, w1a.data(), h, f, c.dtype), rows * f),
            tol0);
  const auto got1 = out1.host();
  EXPECT_LT(rel_error(got1, c.dtype,
                      moe_layer1_partial_f64(h1.data(), rt, w2.data(), weights, h, f, c.dtype),
                      c.tokens * h),
            tol1);
  const auto gotm = mlp.host(), gotmu = mlp_unfused.host();
  EXPECT_EQ(0, std::memcmp(gotm.data(), gotmu.data(), gotm.size())) << "mlp: fused != unfused";
  EXPECT_LT(rel_error(gotm, c.dtype,
                      moe_mlp_partial_f64(x.data(), rt, w1.data(), w2.data(), weights, h, f, c.dtype),
                      c.tokens * h),
            tol_mlp);
}

constexpr Routing kRoutings[] = {Routing::kUniform, Routing::kSkewed, Routing::kOneExpert,
                                 Routing::kEmptyExperts};

TEST(MoeCuda, MatchesFloat64EveryRouting) {
  const Case cases[] = {
      {300, 256, 136, 8, 2, DType::kBF16},     // F off the tile edge, Mixtral-like routing
      {517, 512, 384, 60, 4, DType::kBF16},    // Qwen1.5-MoE-like: many small groups
      {64, 128, 64, 256, 8, DType::kBF16},     // more experts than rows: most groups empty
      {1000, 264, 200, 1, 1, DType::kBF16},    // one expert takes everything
      {200, 192, 96, 16, 3, DType::kF16},      // fp16
  };
  uint64_t seed = test::test_seed();
  for (const Case& c : cases)
    for (Routing r : kRoutings) {
      if (c.experts == 1 && r != Routing::kUniform) continue;  // every pattern is the same there
      check_case(c, r, seed++);
    }
}

// A whole tile row of one group (128 rows) and more: the gathered load's lanes each take 4 rows of
// every tile, past the group's end the group's last row again.
TEST(MoeCuda, LargeGroupsAndManyTiles) {
  check_case({2048, 1024, 768, 8, 2, DType::kBF16}, Routing::kSkewed, test::test_seed() + 100);
}

TEST(MoeCuda, GraphReplaysFollowNewRouting) {
  test::Rng rng(test::test_seed() + 200);
  const Case c{384, 256, 128, 16, 4, DType::kBF16};
  const int64_t rows = c.tokens * c.topk, h = c.hidden, f = c.ffn, eb = 2;
  const auto x = rng.tensor(c.dtype, c.tokens * h);
  const auto w1 = rng.tensor(c.dtype, int64_t{c.experts} * 2 * f * h);
  const auto w2 = rng.tensor(c.dtype, int64_t{c.experts} * h * f);
  const std::vector<float> weights = draw_weights(rng, rows);
  Dev d_ids(rows * 4), d_x(x.size()), d_w1(w1.size()), d_w2(w2.size()), d_weights(rows * 4);
  d_x.put(x), d_w1.put(w1), d_w2.put(w2), d_weights.put(weights);
  Dev out(c.tokens * h * eb), out_overlap(c.tokens * h * eb), out_ahead(c.tokens * h * eb), ref(c.tokens * h * eb);
  MoeLayer moe(c.tokens, h, f, c.experts, c.topk, c.dtype);
  cudaStream_t s;
  TL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TL_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  moe.route(d_ids.as<int32_t>(), s);
  moe.mlp(d_x.p, d_w1.p, d_w2.p, d_weights.as<float>(), out.p, MoePath::kFused, s);
  moe.mlp(d_x.p, d_w1.p, d_w2.p, d_weights.as<float>(), out_overlap.p, MoePath::kOverlap, s);
  moe.mlp(d_x.p, d_w1.p, d_w2.p, d_weights.as<float>(), out_ahead.p, MoePath::kAhead, s);
  TL_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  TL_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (Routing r : kRoutings) {
    SCOPED_TRACE(test::name(r));
    d_ids.put(test::draw_ids(rng, c.tokens, c.topk, c.experts, r));
    out.poison(), out_overlap.poison(), out_ahead.poison(), ref.poison();
    TL_CUDA_CHECK(cudaGraphLaunch(exec, s));
    TL_CUDA_CHECK(cudaStreamSynchronize(s));
    moe.route(d_ids.as<int32_t>(), s);  // eager, unfused: the same bits
    moe.mlp(d_x.p, d_w1.p, d_w2.p, d_weights.as<float>(), ref.p, MoePath::kUnfused, s);
    TL_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto a = out.host(), o = out_overlap.host(), ah = out_ahead.host(), b = ref.host();
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size())) << "fused";
    EXPECT_EQ(0, std::memcmp(o.data(), b.data(), o.size())) << "overlap";
    EXPECT_EQ(0, std::memcmp(ah.data(), b.data(), ah.size())) << "ahead";
  }
  TL_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TL_CUDA_CHECK(cudaGraphDestroy(graph));
  TL_CUDA_CHECK(cudaStreamDestroy(s));
}

// Pairs whose id is out of range are reported (status) and not routed: layer 0 leaves their rows
// (past the routed ones) unwritten, the reduce adds nothing for them.
TEST(MoeCuda, BadIdsAreReportedNotRouted) {
  test::Rng rng(test::test_seed() + 300);
  const Case c{100, 128, 64, 8, 2, DType::kBF16};
  const int64_t rows = c.tokens * c.topk, h = c.hidden, f = c.ffn;
  std::vector<int32_t> ids = test::draw_ids(rng, c.tokens, c.topk, c.experts, Routing::kUniform);
  ids[17] = c.experts, ids[61] = -3;  // two bad pairs
  const auto x = rng.tensor(c.dtype, c.tokens * h);
  const auto w1a = rng.tensor(c.dtype, int64_t{c.experts} * f * h);
  Dev d_ids(rows * 4), d_x(x.size()), d_w1a(w1a.size()), out0(rows * f * 2);
  d_ids.put(ids), d_x.put(x), d_w1a.put(w1a);
  out0.poison();
  MoeLayer moe(c.tokens, h, f, c.experts, c.topk, c.dtype);
  moe.route(d_ids.as<int32_t>(), nullptr);
  moe.layer0(d_x.p, d_w1a.p, f, out0.p, MoePath::kFused, nullptr);
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  int64_t status = 0;
  TL_CUDA_CHECK(cudaMemcpy(&status, moe.status(), 8, cudaMemcpyDeviceToHost));
  EXPECT_EQ(status, 18);  // 1 + the first bad pair
  const auto got = out0.host();
  const int64_t routed = rows - 2;
  for (int64_t i = routed * f; i < rows * f; ++i)
    ASSERT_TRUE(std::isnan(load_as_float(got.data(), c.dtype, i))) << "row " << i / f << " written";
  for (int64_t i = 0; i < routed * f; ++i)
    ASSERT_TRUE(std::isfinite(load_as_float(got.data(), c.dtype, i))) << "row " << i / f << " unwritten";
}

TEST(MoeCuda, RefusesBadShapes) {
  test::expect_refused([] { MoeLayer m(0, 128, 64, 8, 2, DType::kBF16); }, "tokens");
  test::expect_refused([] { MoeLayer m(10, 100, 64, 8, 2, DType::kBF16); }, "multiples of 8");
  test::expect_refused([] { MoeLayer m(10, 128, 60, 8, 2, DType::kBF16); }, "multiples of 8");
  test::expect_refused([] { MoeLayer m(10, 128, 64, 0, 1, DType::kBF16); }, "experts");
  test::expect_refused([] { MoeLayer m(10, 128, 64, 8, 9, DType::kBF16); }, "topk");
  test::expect_refused([] { MoeLayer m(10, 128, 64, 8, 2, DType::kF32); }, "bf16 or fp16");
}

}  // namespace
