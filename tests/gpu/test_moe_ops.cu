// MoE layers over the ranks of a world (ops/moe_ops_cuda.hpp) on virtual ranks, against float64
// (compute/cpu_moe.hpp): layer 0 (AllGather + grouped GEMM), layer 1 (grouped GEMM + top-k reduce
// + ReduceScatter) and the whole MLP, at worlds 1 to 4 with ragged tokens (an empty rank among
// them), every routing pattern, bf16 and fp16, 1 to 60 experts, top-k 1 to 6; the fused path bit
// for bit against the unfused one; baseline (b), the per-expert cuBLAS loops, against float64; two
// calls on one op with different routings (epochs and tables follow); a captured call replayed
// over new routings; outputs poisoned before every run.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "../support/gpu.hpp"
#include "../support/moe_routing.hpp"
#include "../support/random.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_moe.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/ops/moe_ops_cuda.hpp"
#include "tilelink/ops/moe_routing.hpp"
#include "tilelink/runtime/graph.hpp"
#include "tilelink/runtime/world.hpp"

using namespace tilelink;
namespace tlc = tilelink::cuda;
using tilelink::test::Routing;
using Bytes = std::vector<std::byte>;

namespace {

using Dev = test::DeviceBuffer;
using DevPtr = std::unique_ptr<Dev>;

DevPtr upload(const void* h, size_t n) {
  auto d = std::make_unique<Dev>(n);
  if (n > 0) d->put(h, n);
  return d;
}

double rel_error(const Bytes& got, DType dtype, const std::vector<double>& ref, int64_t first, int64_t count) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double g = load_as_float(got.data(), dtype, i), r = ref[first + i];
    if (!std::isfinite(g)) return INFINITY;
    num += (g - r) * (g - r);
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Case {
  std::vector<int64_t> tokens;  // per rank
  int64_t hidden, ffn;          // ffn: every rank's F_r
  int experts, topk;
  DType dtype;
};

// Every input of a case on the host, and on the device per rank.
struct Inputs {
  int W;
  RowPartition parts;
  int64_t M, rows;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  Bytes x;
  std::vector<Bytes> w1, w1m, w2, h1;  // per rank: [E, F, H], [E, 2F, H], [E, H, F], [rows, F]
  std::vector<DevPtr> d_x, d_ids, d_weights, d_w1, d_w1m, d_w2, d_h1, d_all_ids, d_all_weights;

  Inputs(tlc::World& world, const Case& c, test::Rng& rng, Routing routing)
      : W(world.size()), parts(RowPartition::from_counts(c.tokens)), M(parts.total()), rows(M * c.topk) {
    const int64_t h = c.hidden, f = c.ffn, eb = dtype_size(c.dtype), E = c.experts;
    ids = test::draw_ids(rng, M, c.topk, c.experts, routing);
    weights.resize(rows);
    for (auto& v : weights) v = rng.uniform_float(0.f, 1.f);
    x = rng.tensor(c.dtype, M * h);
    for (int r = 0; r < W; ++r) {
      w1.push_back(rng.tensor(c.dtype, E * f * h));
      w1m.push_back(rng.tensor(c.dtype, E * 2 * f * h));
      w2.push_back(rng.tensor(c.dtype, E * h * f));
      h1.push_back(rng.tensor(c.dtype, rows * f));
    }
    for (int r = 0; r < W; ++r) {
      world.bind(r);
      const int64_t b = parts.begin(r), n = parts.size(r);
      d_x.push_back(upload(x.data() + b * h * eb, n * h * eb));
      d_ids.push_back(upload(ids.data() + b * c.topk, n * c.topk * 4));
      d_weights.push_back(upload(weights.data() + b * c.topk, n * c.topk * 4));
      d_w1.push_back(upload(w1[r].data(), w1[r].size()));
      d_w1m.push_back(upload(w1m[r].data(), w1m[r].size()));
      d_w2.push_back(upload(w2[r].data(), w2[r].size()));
      d_h1.push_back(upload(h1[r].data(), h1[r].size()));
      d_all_ids.push_back(upload(ids.data(), ids.size() * 4));
      d_all_weights.push_back(upload(weights.data(), weights.size() * 4));
    }
  }
  template <class T>
  std::vector<T> each(const std::vector<DevPtr>& v, bool null_if_no_tokens = false) const {
    std::vector<T> out(W);
    for (int r = 0; r < W; ++r)
      out[r] = null_if_no_tokens && parts.size(r) == 0 ? nullptr : static_cast<T>(v[r]->p);
    return out;
  }
};

std::vector<DevPtr> outputs(tlc::World& world, const std::vector<int64_t>& bytes) {
  std::vector<DevPtr> v;
  for (int r = 0; r < world.size(); ++r) {
    world.bind(r);
    v.push_back(std::make_unique<Dev>(bytes[r]));
    v.back()->poison();
  }
  return v;
}
std::vector<void*> ptrs(const std::vector<DevPtr>& v) {
  std::vector<void*> p;
  for (const auto& d : v) p.push_back(d->bytes > 0 ? d->p : nullptr);
  return p;
}

// The three ops of one world and case: their outputs checked against float64 and fused against
// unfused, for each of `routings` in turn on the same ops. On peer the unfused layer 1 ends in
// NCCL's ReduceScatter, which sums in its own order: there it is checked against float64 instead
// of bit for bit (layer 0's AllGather is a copy: bit for bit on every transport).
void check_case(const Case& c, const std::vector<Routing>& routings, uint64_t seed,
                tlc::Transport transport = tlc::Transport::kVirtual) {
  const int W = static_cast<int>(c.tokens.size());
  SCOPED_TRACE(testing::Message() << "world " << W << " " << tlc::transport_name(transport) << ", H " << c.hidden
                                  << ", F_r " << c.ffn << ", " << c.experts << " experts, top-" << c.topk << ", "
                                  << dtype_name(c.dtype));
  tlc::World world({.transport = transport, .world_size = W});
  const bool nccl_sum = transport != tlc::Transport::kVirtual && W > 1;
  const RowPartition parts = RowPartition::from_counts(c.tokens);
  const std::vector<int64_t> ffn(W, c.ffn);
  tlc::MoeAgGemm layer0(world, parts, c.hidden, ffn, c.experts, c.topk, c.dtype);
  tlc::MoeGemmRs layer1(world, parts, c.hidden, ffn, c.experts, c.topk, c.dtype);
  tlc::MoeGemmRs layer1_beside(world, parts, c.hidden, ffn, c.experts, c.topk, c.dtype);  // the reduce beside the GEMM
  layer1_beside.set_reduce_beside_gemm(true);
  tlc::MoeMlp mlp(world, parts, c.hidden, ffn, c.experts, c.topk, c.dtype);
  test::Rng rng(seed);
  const int64_t h = c.hidden, f = c.ffn, eb = dtype_size(c.dtype);
  for (Routing routing : routings) {
    SCOPED_TRACE(test::name(routing));
    Inputs in(world, c, rng, routing);
    const MoeRouting rt = moe_route(in.ids, in.M, c.topk, c.experts);
    std::vector<int64_t> out0_bytes(W, in.rows * f * eb), out1_bytes(W);
    for (int r = 0; r < W; ++r) out1_bytes[r] = parts.size(r) * h * eb;
    auto o0 = outputs(world, out0_bytes), o0u = outputs(world, out0_bytes);
    auto o1 = outputs(world, out1_bytes), o1u = outputs(world, out1_bytes), o1s = outputs(world, out1_bytes);
    auto om = outputs(world, out1_bytes), omu = outputs(world, out1_bytes);
    auto o0b = outputs(world, out0_bytes), o1b = outputs(world, out1_bytes), omb = outputs(world, out1_bytes);
    const auto x = in.each<const void*>(in.d_x, true);
    const auto ids = in.each<const int32_t*>(in.d_ids, true);
    const auto wts = in.each<const float*>(in.d_weights, true);
    const auto all_ids = in.each<const int32_t*>(in.d_all_ids);
    const auto all_wts = in.each<const float*>(in.d_all_weights);
    world.sync("inputs");
    layer0.run(x, ids, wts, in.each<const void*>(in.d_w1), ptrs(o0));
    world.sync("moe_ag_gemm");
    layer0.run_unfused(x, ids, wts, in.each<const void*>(in.d_w1), ptrs(o0u));
    world.sync("moe_ag_gemm(unfused)");
    layer1.run(in.each<const void*>(in.d_h1), all_ids, all_wts, in.each<const void*>(in.d_w2), ptrs(o1));
    world.sync("moe_gemm_rs");
    layer1.run_unfused(in.each<const void*>(in.d_h1), all_ids, all_wts, in.each<const void*>(in.d_w2), ptrs(o1u));
    world.sync("moe_gemm_rs(unfused)");
    layer1_beside.run(in.each<const void*>(in.d_h1), all_ids, all_wts, in.each<const void*>(in.d_w2), ptrs(o1s));
    world.sync("moe_gemm_rs(reduce beside the GEMM)");
    mlp.run(x, ids, wts, in.each<const void*>(in.d_w1m), in.each<const void*>(in.d_w2), ptrs(om));
    world.sync("moe_mlp");
    mlp.run_unfused(x, ids, wts, in.each<const void*>(in.d_w1m), in.each<const void*>(in.d_w2), ptrs(omu));
    world.sync("moe_mlp(unfused)");
    // baseline (b): the per-expert cuBLAS loops
    layer0.run_expert_loop(x, ids, wts, in.each<const void*>(in.d_w1), ptrs(o0b));
    layer1.run_expert_loop(in.each<const void*>(in.d_h1), all_ids, all_wts, in.each<const void*>(in.d_w2), ptrs(o1b));
    mlp.run_expert_loop(x, ids, wts, in.each<const void*>(in.d_w1m), in.each<const void*>(in.d_w2), ptrs(omb));
    world.sync("the expert loops");

    std::vector<double> partial1(in.M * h, 0.0), partialm(in.M * h, 0.0);
    for (int s = 0; s < W; ++s) {  // the ranks' partials summed in float64
      const auto p1 = moe_layer1_partial_f64(in.h1[s].data(), rt, in.w2[s].data(), in.weights, h, f, c.dtype);
      const auto pm = moe_mlp_partial_f64(in.x.data(), rt, in.w1m[s].data(), in.w2[s].data(), in.weights, h, f, c.dtype);
      for (int64_t i = 0; i < in.M * h; ++i) partial1[i] += p1[i], partialm[i] += pm[i];
    }
    for (int r = 0; r < W; ++r) {
      SCOPED_TRACE(testing::Message() << "rank " << r);
      const Bytes g0 = o0[r]->host(), g0u = o0u[r]->host();
      EXPECT_EQ(0, std::memcmp(g0.data(), g0u.data(), g0.size())) << "layer 0: fused != unfused";
      const std::vector<double> want0 = moe_layer0_f64(in.x.data(), rt, in.w1[r].data(), h, f, c.dtype);
      EXPECT_LT(rel_error(g0, c.dtype, want0, 0, in.rows * f), 1e-2);
      EXPECT_LT(rel_error(o0b[r]->host(), c.dtype, want0, 0, in.rows * f), 1e-2) << "layer 0's expert loop";
      // the routing the rank gathered is every token's
      std::vector<int32_t> gathered(in.rows);
      TL_CUDA_CHECK(cudaMemcpy(gathered.data(), layer0.gathered_ids(r), in.rows * 4, cudaMemcpyDeviceToHost));
      EXPECT_EQ(gathered, in.ids) << "gathered ids";
      const int64_t first = parts.begin(r) * h, count = parts.size(r) * h;
      if (count == 0) continue;
      const Bytes g1 = o1[r]->host(), g1u = o1u[r]->host();
      if (nccl_sum) {
        EXPECT_LT(rel_error(g1u, c.dtype, partial1, first, count), 2e-2) << "layer 1, unfused (NCCL)";
        EXPECT_EQ(0, std::memcmp(o1s[r]->host().data(), g1.data(), g1.size())) << "layer 1, reduce beside: != fused";
      } else {
        EXPECT_EQ(0, std::memcmp(g1.data(), g1u.data(), g1.size())) << "layer 1: fused != unfused";
        EXPECT_EQ(0, std::memcmp(o1s[r]->host().data(), g1u.data(), g1.size())) << "layer 1, reduce beside: != unfused";
      }
      EXPECT_LT(rel_error(g1, c.dtype, partial1, first, count), 2e-2);
      EXPECT_LT(rel_error(o1b[r]->host(), c.dtype, partial1, first, count), 2e-2) << "layer 1's expert loop";
      const Bytes gm = om[r]->host(), gmu = omu[r]->host();
      if (nccl_sum) EXPECT_LT(rel_error(gmu, c.dtype, partialm, first, count), 3e-2) << "mlp, unfused (NCCL)";
      else EXPECT_EQ(0, std::memcmp(gm.data(), gmu.data(), gm.size())) << "mlp: fused != unfused";
      EXPECT_LT(rel_error(gm, c.dtype, partialm, first, count), 3e-2);
      EXPECT_LT(rel_error(omb[r]->host(), c.dtype, partialm, first, count), 3e-2) << "the MLP's expert loops";
    }
  }
}

const std::vector<Routing> kEveryRouting = {Routing::kUniform, Routing::kSkewed, Routing::kOneExpert,
                                            Routing::kEmptyExperts};

TEST(MoeOpsCuda, WorldOne) {
  check_case({{200}, 256, 128, 8, 2, DType::kBF16}, kEveryRouting, 11);
}

TEST(MoeOpsCuda, WorldsAndRoutings) {
  check_case({{96, 160}, 256, 128, 8, 2, DType::kBF16}, kEveryRouting, 21);
  check_case({{64, 0, 137}, 512, 64, 16, 4, DType::kBF16}, {Routing::kUniform, Routing::kSkewed}, 22);
  check_case({{50, 50, 50, 50}, 256, 96, 60, 6, DType::kBF16}, {Routing::kEmptyExperts, Routing::kUniform}, 23);
}

TEST(MoeOpsCuda, HalfPrecisionTopOneAndOneExpert) {
  check_case({{130, 70}, 128, 64, 4, 1, DType::kF16}, {Routing::kUniform, Routing::kOneExpert}, 31);
  check_case({{33, 31}, 64, 32, 1, 1, DType::kBF16}, {Routing::kUniform}, 32);
}

TEST(MoeOpsCuda, ManyTokensManyTiles) {
  check_case({{1024, 1024}, 1024, 256, 8, 2, DType::kBF16}, {Routing::kSkewed}, 41);
}

// A captured MLP call replayed over new routings and inputs gives what the eager one gives.
TEST(MoeOpsCuda, GraphReplaysFollowNewRouting) {
  const Case c{{120, 136}, 256, 128, 8, 2, DType::kBF16};
  const int W = 2;
  tlc::World world({.transport = tlc::Transport::kVirtual, .world_size = W});
  const RowPartition parts = RowPartition::from_counts(c.tokens);
  const std::vector<int64_t> ffn(W, c.ffn);
  tlc::MoeMlp mlp(world, parts, c.hidden, ffn, c.experts, c.topk, c.dtype);
  test::Rng rng(51);
  Inputs in(world, c, rng, Routing::kUniform);
  const int64_t eb = dtype_size(c.dtype);
  std::vector<int64_t> out_bytes(W);
  for (int r = 0; r < W; ++r) out_bytes[r] = parts.size(r) * c.hidden * eb;
  auto got = outputs(world, out_bytes), want = outputs(world, out_bytes);
  tlc::WorldGraph graph(world, [&] {
    mlp.run(in.each<const void*>(in.d_x, true), in.each<const int32_t*>(in.d_ids, true),
            in.each<const float*>(in.d_weights, true), in.each<const void*>(in.d_w1m),
            in.each<const void*>(in.d_w2), ptrs(got));
  });
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE(testing::Message() << "replay " << replay);
    // new routing and tokens into the same buffers
    const std::vector<int32_t> ids = test::draw_ids(rng, parts.total(), c.topk, c.experts,
                                                    replay == 1 ? Routing::kOneExpert : Routing::kSkewed);
    const Bytes x = rng.tensor(c.dtype, parts.total() * c.hidden);
    for (int r = 0; r < W; ++r) {
      in.d_ids[r]->put(ids.data() + parts.begin(r) * c.topk, parts.size(r) * c.topk * 4);
      in.d_x[r]->put(x.data() + parts.begin(r) * c.hidden * eb, parts.size(r) * c.hidden * eb);
      got[r]->poison();
      want[r]->poison();
    }
    world.sync("inputs");
    graph.replay();
    world.sync("moe_mlp (graph)");
    mlp.run_unfused(in.each<const void*>(in.d_x, true), in.each<const int32_t*>(in.d_ids, true),
                    in.each<const float*>(in.d_weights, true), in.each<const void*>(in.d_w1m),
                    in.each<const void*>(in.d_w2), ptrs(want));
    world.sync("moe_mlp(unfused)");
    for (int r = 0; r < W; ++r) {
      const Bytes g = got[r]->host(), w = want[r]->host();
      EXPECT_EQ(0, std::memcmp(g.data(), w.data(), g.size())) << "rank " << r << ": replay != eager unfused";
    }
  }
}

// A GPU a rank (peer): layer 0's own rows moved before its GEMM (which then holds every SM), the
// peers' by the copy engines beside it; the baselines on NCCL.
TEST(MoeOpsCudaPeer, SeparateGpus) {
  TL_SKIP_UNLESS_GPUS(2);
  check_case({{96, 160}, 256, 128, 8, 2, DType::kBF16}, kEveryRouting, 61, tlc::Transport::kPeer);
  check_case({{100, 100}, 128, 64, 4, 1, DType::kF16}, {Routing::kSkewed}, 62, tlc::Transport::kPeer);
  if (test::gpu_count() >= 3)
    check_case({{64, 0, 137}, 512, 64, 16, 4, DType::kBF16}, {Routing::kUniform}, 63, tlc::Transport::kPeer);
  if (test::gpu_count() >= 4)
    check_case({{50, 50, 50, 50}, 256, 96, 60, 6, DType::kBF16}, {Routing::kEmptyExperts}, 64, tlc::Transport::kPeer);
}

TEST(MoeOpsCuda, RefusesBadShapes) {
  tlc::World world({.transport = tlc::Transport::kVirtual, .world_size = 2});
  const std::vector<int64_t> two{64, 64}, three{64, 64, 64};
  const RowPartition parts = RowPartition::from_counts(two);
  EXPECT_THROW(tlc::MoeAgGemm(world, parts, 100, {64, 64}, 8, 2, DType::kBF16), Error);   // H % 8
  EXPECT_THROW(tlc::MoeAgGemm(world, parts, 128, {64, 60}, 8, 2, DType::kBF16), Error);   // F_1 % 8
  EXPECT_THROW(tlc::MoeAgGemm(world, parts, 128, {64}, 8, 2, DType::kBF16), Error);       // F_r count
  EXPECT_THROW(tlc::MoeGemmRs(world, parts, 128, {64, 64}, 8, 9, DType::kBF16), Error);   // topk > experts
  EXPECT_THROW(tlc::MoeGemmRs(world, parts, 128, {64, 64}, 8, 2, DType::kF32), Error);    // dtype
  EXPECT_THROW(tlc::MoeMlp(world, RowPartition::from_counts(three), 128, {64, 64}, 8, 2, DType::kBF16),
               Error);  // partition of another world
}

}  // namespace
