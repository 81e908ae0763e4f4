// GPU tests of GemmTuner (gemm_tuner.hpp): the tuned call is correct against a float32 reference
// on fresh random data (outputs poisoned first); a shape is measured once and remembered; a stream
// capture measures nothing and its graph replays correctly; kReduceAdd keeps the caller's C through
// the measurement; named tiles, decode sizes and bad arguments are not tuned.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/compute/sm90/gemm_tuner.hpp"
#include "tilelink/compute/sm90/impl/check_cuda.hpp"
#include "tilelink/compute/sm90/impl/gemm_reference.cuh"
#include "tilelink/core/error.hpp"

namespace {

using namespace tilelink;
using namespace tilelink::compute::sm90;
namespace ref = tilelink::compute::sm90::reference;
#define CK(call) TL_SM90_CUDA_CHECK(call)

uint64_t fresh_seed() {
  static uint64_t counter = 0;
  return 0x7E5E0000ull + 104729 * (++counter) + static_cast<uint64_t>(std::rand());
}

// Operands of one shape, a float32 reference of A B^T (+ C0 for kReduceAdd) and checks of C.
struct Problem {
  GemmArgs args;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  float* ref = nullptr;
  Problem(int64_t m, int64_t n, int64_t k, DType out = DType::kBF16, bool reduce = false) {
    args.m = m, args.n = n, args.k = k, args.in_type = DType::kBF16, args.out_type = out;
    CK(cudaMalloc(&a, m * k * 2));
    CK(cudaMalloc(&b, n * k * 2));
    CK(cudaMalloc(&c, m * n * dtype_size(out)));
    CK(cudaMalloc(&ref, m * n * sizeof(float)));
    ref::fill_uniform(a, DType::kBF16, m * k, fresh_seed(), 1.0f);
    ref::fill_uniform(b, DType::kBF16, n * k, fresh_seed(), 1.0f);
    if (reduce) {
      ref::fill_uniform(c, out, m * n, fresh_seed(), 4.0f);
    } else {
      CK(cudaMemset(c, 0xff, m * n * dtype_size(out)));  // NaN everywhere
    }
    ref::reference_gemm(a, b, DType::kBF16, m, n, k, k, k, reduce ? c : nullptr, out, n, ref);
    CK(cudaDeviceSynchronize());
    args.a = a, args.b = b, args.c = c;
    args.epilogue = reduce ? EpilogueMode::kReduceAdd : EpilogueMode::kStore;
  }
  ~Problem() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    cudaFree(ref);
  }
  void poison() { CK(cudaMemset(c, 0xff, args.m * args.n * dtype_size(args.out_type))); }
  void check() const {
    CK(cudaDeviceSynchronize());
    const ref::Comparison cmp = ref::compare(c, args.out_type, args.n, ref, args.m, args.n);
    EXPECT_EQ(cmp.non_finite, 0) << args.m << "x" << args.n << "x" << args.k;
    EXPECT_LE(cmp.rel_err, ref::tolerance(args.out_type)) << args.m << "x" << args.n << "x" << args.k;
  }
};

bool is_candidate(GemmTile t) {
  const auto c = gemm_tuner_candidates();
  return std::any_of(c.begin(), c.end(), [&](GemmTile x) { return x.m == t.m && x.n == t.n; });
}

// Measured once per shape (every candidate, reps + 1 launches each), then remembered; the tuned
// launch correct, with and without a split workspace, for both output widths.
TEST(GemmTuner, MeasuresOnceAndRunsTheFastestCorrectly) {
  GemmTuner tuner(2);
  const int64_t per_shape = static_cast<int64_t>(gemm_tuner_candidates().size()) * 3;
  Problem p(2048, 7168, 2048);
  tuner.gemm(p.args, 0);
  p.check();
  EXPECT_EQ(tuner.shapes(), 1u);
  EXPECT_EQ(tuner.measured_launches(), per_shape);
  const GemmTile t = tuner.tile_for(p.args, 0);
  EXPECT_TRUE(is_candidate(t)) << t.m << "x" << t.n;
  p.poison();
  tuner.gemm(p.args, 0);  // remembered: no measurement
  p.check();
  EXPECT_EQ(tuner.measured_launches(), per_shape);

  Problem q(1000, 1032, 4096, DType::kF32);  // another shape and output type: measured again
  GemmWorkspace ws;
  ws.attach(q.args, 0);
  tuner.gemm(q.args, 0);
  q.check();
  EXPECT_EQ(tuner.shapes(), 2u);
  EXPECT_EQ(tuner.measured_launches(), 2 * per_shape);
}

// The measurement writes the tuner's scratch, not C: kReduceAdd adds once.
TEST(GemmTuner, ReduceAddKeepsTheCallersOutput) {
  GemmTuner tuner(1);
  Problem p(1000, 776, 1032, DType::kBF16, true);
  tuner.gemm(p.args, 0);
  p.check();
}

// Inside a capture nothing is measured or remembered: the graph runs gemm()'s pick, and replays
// correctly on new inputs; a shape measured before the capture runs its tile inside it.
TEST(GemmTuner, CaptureMeasuresNothing) {
  GemmTuner tuner(1);
  Problem p(2048, 7168, 1024);
  cudaStream_t s = nullptr;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  tuner.gemm(p.args, s);
  CK(cudaStreamEndCapture(s, &graph));
  EXPECT_EQ(tuner.shapes(), 0u);
  EXPECT_EQ(tuner.measured_launches(), 0);
  cudaGraphExec_t exec = nullptr;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    p.poison();
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    p.check();
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  tuner.gemm(p.args, s);  // outside: measured now
  CK(cudaStreamSynchronize(s));
  EXPECT_EQ(tuner.shapes(), 1u);
  const int64_t launches = tuner.measured_launches();
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  tuner.gemm(p.args, s);  // known: its tile, nothing measured
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  p.poison();
  CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  p.check();
  EXPECT_EQ(tuner.measured_launches(), launches);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(s));
}

// Named tiles and decode sizes run as named (nothing measured); bad arguments throw before
// anything is measured or launched.
TEST(GemmTuner, NamedTilesDecodeAndBadArguments) {
  GemmTuner tuner(1);
  Problem p(1000, 1112, 520);
  p.args.tile_m = kTileMTall;
  EXPECT_EQ(tuner.tile_for(p.args, 0).m, kTileMTall);
  tuner.gemm(p.args, 0);
  p.check();
  Problem d(16, 4096, 1024);  // a decode size
  tuner.gemm(d.args, 0);
  d.check();
  EXPECT_EQ(tuner.measured_launches(), 0);
  GemmArgs bad = p.args;
  bad.tile_m = 0, bad.n = 1001;  // N not a multiple of 8
  EXPECT_THROW(tuner.gemm(bad, 0), tilelink::Error);
  EXPECT_THROW(GemmTuner(0), tilelink::Error);
  EXPECT_EQ(tuner.shapes(), 0u);
}

}  // namespace
