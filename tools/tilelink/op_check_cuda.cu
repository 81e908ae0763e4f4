// The CUDA check harness of every registered op (op_check_cuda.hpp).
#include "op_check_cuda.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "problem.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/runtime/graph.hpp"

namespace tilelink::cli {

RankAllocs::~RankAllocs() {
  for (auto& [r, p] : allocs_) {
    world_.bind(r);
    cudaFree(p);  // NOTE: unchecked: a destructor must not throw
  }
}

void* RankAllocs::alloc(int r, size_t bytes) {
  void* p = nullptr;
  world_.bind(r);
  TL_CUDA_CHECK(cudaMalloc(&p, bytes));
  allocs_.emplace_back(r, p);
  return p;
}

void* RankAllocs::upload(int r, const std::vector<std::byte>& host) {
  if (host.empty()) return nullptr;
  void* p = alloc(r, host.size());
  TL_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice));
  return p;
}

void* RankAllocs::poisoned(int r, size_t bytes) {
  void* p = alloc(r, bytes);
  TL_CUDA_CHECK(cudaMemset(p, 0xff, bytes));
  return p;
}

std::mt19937_64 rank_rng(uint64_t seed, int r) { return std::mt19937_64(seed * 1000003u + 7919u * (r + 1)); }

namespace {
// Fresh random bf16 inputs of every rank the process needs, from p.seed (generated on the host, so a
// reference can be computed).
void draw_inputs(const OpSpec& spec, const cuda::World& world, const OpProblem& p, CudaOperands& x) {
  const int W = world.size();
  auto a_rows = [&](int r) { return spec.split_n ? p.rows.size(r) : p.m; };
  auto a_cols = [&](int r) { return spec.split_n ? p.k : p.split[r]; };
  auto b_rows = [&](int r) { return spec.split_n ? p.split[r] : p.n; };
  x.ha.assign(W, {});
  x.hb.assign(W, {});
  for (int r = 0; r < W; ++r) {
    if (!x.with_ref && !world.is_local(r)) continue;
    std::mt19937_64 rng = rank_rng(p.seed, r);
    x.ha[r] = random_matrix(a_rows(r), a_cols(r), DType::kBF16, rng);
    x.hb[r] = random_matrix(b_rows(r), a_cols(r), DType::kBF16, rng);
  }
}
}  // namespace

std::unique_ptr<CudaOperands> make_cuda_operands(const OpSpec& spec, cuda::World& world, const OpProblem& p) {
  const int W = world.size();
  auto x = std::make_unique<CudaOperands>(world);
  x->with_ref = static_cast<double>(p.m) * p.n * p.k <= p.ref_limit;
  draw_inputs(spec, world, p, *x);
  x->a.assign(W, nullptr);
  x->b.assign(W, nullptr);
  x->c.assign(W, nullptr);
  x->c_ref.assign(W, nullptr);
  for (int r : world.local_ranks()) {
    x->a[r] = x->mem.upload(r, x->ha[r]);
    x->b[r] = x->mem.upload(r, x->hb[r]);
    const int64_t bytes = spec.c_rows_of(p, r) * spec.c_cols(p, r) * 2 + 16;
    x->c[r] = x->mem.poisoned(r, bytes);
    x->c_ref[r] = x->mem.poisoned(r, bytes);
  }
  for (int r : world.local_ranks()) {
    world.bind(r);
    TL_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return x;
}

namespace {
// The larger error; NaN (a poisoned baseline value in the difference) counts as infinite.
double worse(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::infinity();
  return std::max(a, b);
}
}  // namespace

namespace {
// The local ranks' outputs (x.c: fused, x.c_ref: unfused) against each other and the reference.
CudaCheck compare(const OpSpec& spec, cuda::World& world, const OpProblem& p, const CudaOperands& x) {
  const int W = world.size();
  Reference want;  // the float64 reference of the local ranks' outputs
  if (x.with_ref) {
    std::vector<const std::byte*> ia(W), ib(W);
    for (int r = 0; r < W; ++r) ia[r] = x.ha[r].data(), ib[r] = x.hb[r].data();
    want = reference_f64(spec, p, ia, ib, world.local_ranks(), false);
  }
  CudaCheck out;
  for (int r : world.local_ranks()) {
    const int64_t rows_r = spec.c_rows_of(p, r), cols_r = spec.c_cols(p, r);
    if (rows_r == 0) continue;
    std::vector<std::byte> c(rows_r * cols_r * 2), c_ref(c.size());
    world.bind(r);
    TL_CUDA_CHECK(cudaMemcpy(c.data(), x.c[r], c.size(), cudaMemcpyDeviceToHost));
    TL_CUDA_CHECK(cudaMemcpy(c_ref.data(), x.c_ref[r], c.size(), cudaMemcpyDeviceToHost));
    if (!p.baseline_only) {
      std::vector<double> base(c.size() / 2);
      for (size_t i = 0; i < base.size(); ++i) base[i] = load_as_float(c_ref.data(), DType::kBF16, i);
      out.err_base = worse(out.err_base, relative_error(c.data(), DType::kBF16, base));
    }
    if (x.with_ref) {
      const std::vector<double>& ref = want.ref[r];
      if (!p.baseline_only) out.err_ref = worse(out.err_ref, relative_error(c.data(), DType::kBF16, ref));
      out.err_base_ref = worse(out.err_base_ref, relative_error(c_ref.data(), DType::kBF16, ref));
    }
  }
  return out;
}

void poison_outputs(const OpSpec& spec, cuda::World& world, const OpProblem& p, const CudaOperands& x) {
  for (int r : world.local_ranks()) {
    world.bind(r);
    const int64_t bytes = spec.c_rows_of(p, r) * spec.c_cols(p, r) * 2 + 16;
    TL_CUDA_CHECK(cudaMemsetAsync(x.c[r], 0xff, bytes, world.stream(r)));
    TL_CUDA_CHECK(cudaMemsetAsync(x.c_ref[r], 0xff, bytes, world.stream(r)));
  }
}

CudaCheck worst(const CudaCheck& a, const CudaCheck& b) {
  return {worse(a.err_base, b.err_base), worse(a.err_ref, b.err_ref), worse(a.err_base_ref, b.err_base_ref)};
}
}  // namespace

CudaCheck check_cuda(const OpSpec& spec, CudaOpRun& op, cuda::World& world, const OpProblem& p,
                     const CudaOperands& x) {
  if (!p.baseline_only) {
    op.run(x.a, x.b, x.c);
    world.sync(p.op.c_str());
  }
  op.run_unfused(x.a, x.b, x.c_ref);
  world.sync((p.op + "(unfused)").c_str());
  return compare(spec, world, p, x);
}

CudaCheck check_cuda_graph(const OpSpec& spec, CudaOpRun& op, cuda::World& world, OpProblem p, CudaOperands& x,
                           int replays) {
  TL_REQUIRE(!p.baseline_only && replays >= 1, "check_cuda_graph: a fused call and at least one replay");
  cuda::WorldGraph graphs(world, [&] { op.run(x.a, x.b, x.c); });
  CudaCheck out;
  for (int i = 0; i < replays; ++i) {
    p.seed = p.seed * 6364136223846793005ull + 1442695040888963407ull;  // new inputs in the same buffers
    draw_inputs(spec, world, p, x);
    for (int r : world.local_ranks()) {
      world.bind(r);
      if (!x.ha[r].empty())
        TL_CUDA_CHECK(cudaMemcpy(const_cast<void*>(x.a[r]), x.ha[r].data(), x.ha[r].size(), cudaMemcpyHostToDevice));
      if (!x.hb[r].empty())
        TL_CUDA_CHECK(cudaMemcpy(const_cast<void*>(x.b[r]), x.hb[r].data(), x.hb[r].size(), cudaMemcpyHostToDevice));
    }
    poison_outputs(spec, world, p, x);
    graphs.replay();
    world.sync((p.op + "(graph replay)").c_str());
    op.run_unfused(x.a, x.b, x.c_ref);
    world.sync((p.op + "(unfused)").c_str());
    out = worst(out, compare(spec, world, p, x));
  }
  return out;
}

}  // namespace tilelink::cli