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

std::unique_ptr<CudaOperands> make_cuda_operands(const OpSpec& spec, cuda::World& world, const OpProblem& p) {
  const int W = world.size();
  auto x = std::make_unique<CudaOperands>(world);
  x->with_ref = static_cast<double>(p.m) * p.n * p.k <= p.ref_limit;
  auto a_rows = [&](int r) { return spec.split_n ? p.rows.size(r) : p.m; };
  auto a_cols = [&](int r) { return spec.split_n ? p.k : p.split[r]; };
  auto b_rows = [&](int r) { return spec.split_n ? p.split[r] : p.n; };
  // Fresh random bf16 per rank (generated on the host, so a reference can be computed).
  x->ha.resize(W);
  x->hb.resize(W);
  for (int r = 0; r < W; ++r) {
    if (!x->with_ref && !world.is_local(r)) continue;
    std::mt19937_64 rng = rank_rng(p.seed, r);
    x->ha[r] = random_matrix(a_rows(r), a_cols(r), DType::kBF16, rng);
    x->hb[r] = random_matrix(b_rows(r), a_cols(r), DType::kBF16, rng);
  }
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

CudaCheck check_cuda(const OpSpec& spec, CudaOpRun& op, cuda::World& world, const OpProblem& p,
                     const CudaOperands& x) {
  const int W = world.size();
  if (!p.baseline_only) {
    op.run(x.a, x.b, x.c);
    world.sync(p.op.c_str());
  }
  op.run_unfused(x.a, x.b, x.c_ref);
  world.sync((p.op + "(unfused)").c_str());

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

}  // namespace tilelink::cli
