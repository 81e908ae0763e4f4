// The fused ops on the CPU backend, each beside its unfused baseline.
//
//   cpu::World world(3);
//   cpu::AgGemm op(world, RowPartition::even(M, 3), /*n_per_rank=*/{n0, n1, n2}, K, DType::kBF16, cfg);
//   world.run([&](cpu::RankContext& ctx) { op.run(ctx, a[ctx.rank], b[ctx.rank], c[ctx.rank]); });
//
// Construct once (it allocates the symmetric workspace), then call run() from every rank's thread,
// any number of times: signals are never reset, each call uses the next epoch. Inside run() a rank
// starts its communication workers and compute workers as threads that meet only through the
// plan's signals.
#pragma once

#include <vector>

#include "tilelink/backend/cpu/world.hpp"
#include "tilelink/ops/ag_gemm_plan.hpp"
#include "tilelink/ops/gemm_ar_plan.hpp"
#include "tilelink/ops/gemm_rs_plan.hpp"

namespace tilelink::cpu {

class AgGemm {
 public:
  // n_per_rank[r] = N_r, the columns of rank r's weight B_r [N_r, K] and output C_r [M, N_r].
  AgGemm(World& world, const RowPartition& rows, const std::vector<int64_t>& n_per_rank, int64_t k,
         DType dtype, const AgGemmConfig& config);

  const AgGemmPlan& plan(int rank) const { return plans_.at(rank); }

  // Rank ctx.rank: a = A_r [M_r, K], b = B_r [N_r, K], c = C_r [M, N_r] (row-major, dense).
  void run(RankContext& ctx, const void* a, const void* b, void* c);
  // The unfused baseline: a whole AllGather (barrier, copy, barrier), then the whole GEMM.
  void run_unfused(RankContext& ctx, const void* a, const void* b, void* c);

  // The gathered A of a rank after a call (for tests of the communication half).
  const void* gathered(int rank) const { return plans_[rank].ag.f.gathered.in(ws_.base(rank)); }

 private:
  std::vector<AgGemmPlan> plans_;
  SymmetricAllocation ws_;
  std::vector<uint64_t> epoch_;  // per rank; each rank thread touches only its own entry
};

class GemmRs {
 public:
  // k_per_rank[r] = K_r, the reduction slice of rank r: A_r [M, K_r], B_r [N, K_r].
  GemmRs(World& world, const RowPartition& rows, int64_t n, const std::vector<int64_t>& k_per_rank,
         DType dtype, const GemmRsConfig& config);

  const GemmRsPlan& plan(int rank) const { return plans_.at(rank); }

  // Rank ctx.rank: a = A_r [M, K_r], b = B_r [N, K_r], c = C_r [M_r, N].
  void run(RankContext& ctx, const void* a, const void* b, void* c);
  // The unfused baseline: the whole partial GEMM, a barrier, then a whole ReduceScatter.
  void run_unfused(RankContext& ctx, const void* a, const void* b, void* c);

 private:
  std::vector<GemmRsPlan> plans_;
  std::vector<GemmRsPlan> baseline_plans_;  // pull layout: the baseline reads whole partials
  SymmetricAllocation ws_;
  SymmetricAllocation baseline_ws_;
  std::vector<uint64_t> epoch_;
};

class GemmAr {
 public:
  // k_per_rank[r] = K_r: A_r [M, K_r], B_r [N, K_r]. rows: the two-shot's segments (M split).
  GemmAr(World& world, const RowPartition& rows, int64_t n, const std::vector<int64_t>& k_per_rank,
         DType dtype, const GemmArConfig& config);

  const GemmArPlan& plan(int rank) const { return plans_.at(rank); }

  // Rank ctx.rank: a = A_r [M, K_r], b = B_r [N, K_r], c = C [M, N] (every rank the whole sum).
  void run(RankContext& ctx, const void* a, const void* b, void* c);
  // The unfused baseline: the whole partial GEMM, a barrier, then the whole sum of every row.
  void run_unfused(RankContext& ctx, const void* a, const void* b, void* c);

 private:
  std::vector<GemmArPlan> plans_;
  SymmetricAllocation ws_;
  std::vector<uint64_t> epoch_;
};

}  // namespace tilelink::cpu
