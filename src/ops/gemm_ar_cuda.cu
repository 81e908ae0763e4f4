// Fused GEMM+AllReduce on the CUDA backend (see include/tilelink/ops/gemm_ar_cuda.hpp): the engine
// with the tile-done notify hook, the AllReduce's programs (comm/allreduce.hpp) on SMs beside it,
// on the fused-op runtime (fused_runtime.hpp).
#include "tilelink/ops/gemm_ar_cuda.hpp"

#include <algorithm>

#include "cuda/tile_done_hooks.cuh"
#include "fused_runtime.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/cuda/comm.hpp"
#include "tilelink/tune/gemm_ar_model.hpp"

namespace tilelink::cuda {

using detail::LaunchOrder;
using detail::TileDoneNotifyHooks;

GemmAr::GemmAr(World& world, const RowPartition& rows, int64_t n, const std::vector<int64_t>& k_per_rank,
               DType dtype, const GemmArConfig& config)
    : world_(world) {
  const int W = world.size();
  TL_REQUIRE(rows.world_size == W, "gemm_ar: the row partition has " << rows.world_size << " ranks, the world " << W);
  TL_REQUIRE(static_cast<int>(k_per_rank.size()) == W,
             "gemm_ar: " << k_per_rank.size() << " K_r values for a world of " << W);
  TL_REQUIRE(dtype == DType::kBF16, "gemm_ar on the CUDA backend takes bf16, got " << dtype_name(dtype));
  TL_REQUIRE(n % 8 == 0, "gemm_ar: N must be a multiple of 8 (16-byte rows), got " << n);
  for (int r = 0; r < W; ++r)
    TL_REQUIRE(k_per_rank[r] % 8 == 0 && k_per_rank[r] >= 8,
               "gemm_ar: K_" << r << " must be a positive multiple of 8, got " << k_per_rank[r]);
  TL_REQUIRE(config.comm_workers >= 0 && config.compute_workers >= 0,
             "gemm_ar: comm_workers (" << config.comm_workers << ") and compute_workers (" << config.compute_workers
                                       << ") must be >= 0");
  GemmArConfig cfg = config;
  cfg.gemm_tile_m = compute::sm90::kTileM;  // the producer grid is the engine's tiles
  cfg.gemm_tile_n = compute::sm90::kTileN;
  for (int r = 0; r < W; ++r) {
    GemmArConfig c = cfg;
    if (world.is_local(r)) {
      const int sms = world.sm_count(r);
      c.group_m = compute::sm90::gemm_default_group_m(rows.total(), n, sms);
      if (c.comm_workers == 0) c.comm_workers = std::clamp(sms / 8, 2, 16);
      TL_REQUIRE(W == 1 || c.comm_workers + c.compute_workers < sms,
                 "gemm_ar: rank " << r << " has " << sms << " SMs; comm_workers (" << c.comm_workers
                                  << ") + compute_workers (" << c.compute_workers
                                  << ") must leave the GEMM at least one");
      split_sms({.sms = sms, .world_size = W, .compute_workers = c.compute_workers, .comm_sms = c.comm_workers});
    }
    plans_.push_back(GemmArPlan::make(r, rows, n, k_per_rank[r], dtype, c));
  }
  Agreement agreement("gemm_ar");
  agreement.add("world", W).add("dtype", static_cast<int64_t>(dtype)).add("N", n).add("M rows", rows);
  agreement.add("K", k_per_rank).add("algorithm", static_cast<int64_t>(config.algo));
  agreement.add("band_cols", config.band_cols).add("comm_workers", config.comm_workers);
  agreement.add("compute_workers", config.compute_workers);
  rt_ = std::make_unique<detail::FusedRuntime>(world, "gemm_ar", std::move(agreement), plans_[0].num_bytes);
  rt_->init_engine(plans_);
  rt_->prepare_engine<TileDoneNotifyHooks>([&](int r) {  // tile_done[0] = 0: still zero
    return TileDoneNotifyHooks{rt_->view(r).local(plans_[r].ar.f.tile_done), plans_[r].gemm.tiles_n(), Epoch{0}};
  });
}

GemmAr::~GemmAr() = default;

int GemmAr::gemm_sms(int rank) const {
  const GemmArConfig& cfg = plans_.at(rank).config;
  return rt_->split(rank, cfg.compute_workers, cfg.comm_workers).gemm_sms;
}

void GemmAr::check_args(const std::vector<const void*>& a, const std::vector<const void*>& b,
                        const std::vector<void*>& c) const {
  rt_->check_operand("A", a);
  rt_->check_operand("B", b);
  rt_->check_operand("C", c);
}

void GemmAr::enqueue_gemm(int r, const void* a, const void* b, void* out, bool hooks) {
  const GemmArPlan& p = plans_[r];
  const compute::sm90::GemmArgs args = detail::engine_args(p, a, b, out, gemm_sms(r));
  if (!hooks) return rt_->launch_plain_engine(r, args);
  rt_->launch_engine(r, args, TileDoneNotifyHooks{rt_->view(r).local(p.ar.f.tile_done), p.gemm.tiles_n(), rt_->epoch(r)});
}

void GemmAr::run(const std::vector<const void*>& a, const std::vector<const void*>& b,
                 const std::vector<void*>& c) {
  check_args(a, b, c);
  if (world_.size() == 1)  // nothing to reduce: the engine alone, into C
    return rt_->world1([&](int r) { enqueue_gemm(r, a[r], b[r], c[r], false); });
  rt_->begin(1);
  rt_->fused_call(
      LaunchOrder::kComputeFirst,
      // The entry barrier: the previous call's reads of every partial are done everywhere.
      [&](int r) { rt_->entry_barrier(r, plans_[r].barrier); },
      // The GEMM into the partial, then on its SMs the AllReduce items still left.
      [&](int r) {
        enqueue_gemm(r, a[r], b[r], rt_->view(r).local(plans_[r].ar.f.partial), true);
        launch_allreduce(world_, plans_[r].ar, rt_->view(r), c[r], rt_->epoch(r),
                         CommLaunch{CopyMethod::kVector, gemm_sms(r), 512, rt_->gemm_stream(r)});
      },
      // The AllReduce on the comm SMs beside it.
      [&](int r) {
        launch_allreduce(world_, plans_[r].ar, rt_->view(r), c[r], rt_->epoch(r),
                         CommLaunch{CopyMethod::kVector, plans_[r].config.comm_workers});
      });
}

void GemmAr::run_gemm_only(const std::vector<const void*>& a, const std::vector<const void*>& b) {
  rt_->require_eager("run_gemm_only");
  rt_->begin(1);
  rt_->each_on_gemm_stream(
      [&](int r) { enqueue_gemm(r, a[r], b[r], rt_->view(r).local(plans_[r].ar.f.partial), world_.size() > 1); });
}

void GemmAr::run_comm_only(const std::vector<void*>& c) {
  // NOTE: reuses the current epoch, whose tile_done (and band_ready) signals the last call set.
  rt_->require_eager("run_comm_only");
  rt_->require_started("run_comm_only", "a GEMM run");
  if (world_.size() == 1) return;
  for (int r : world_.local_ranks()) {
    const GemmArPlan& p = plans_[r];
    world_.bind(r);
    // The last call with this epoch claimed every item: fresh counters.
    TL_CUDA_CHECK(cudaMemsetAsync(rt_->view(r).local(p.ar.f.claims), 0, 2 * sizeof(uint64_t), world_.stream(r)));
    launch_allreduce(world_, p.ar, rt_->view(r), c[r], rt_->epoch(r),
                     CommLaunch{CopyMethod::kVector, p.config.comm_workers});
  }
}

void GemmAr::run_unfused(const std::vector<const void*>& a, const std::vector<const void*>& b,
                         const std::vector<void*>& c) {
  check_args(a, b, c);
  const Field<Signal> barrier = plans_[rt_->first_rank()].barrier;
  if (rt_->nccl()) {  // cuBLAS+NCCL (peer, ipc): cuBLAS into the partial, NCCL's AllReduce into C
    return rt_->nccl_call(barrier, [&] {
      std::vector<const void*> partial(world_.size(), nullptr);
      for (int r : world_.local_ranks()) {
        world_.bind(r);
        const GemmArPlan& p = plans_[r];
        partial[r] = rt_->view(r).local(p.ar.f.partial);
        detail::cublas_gemm_tn(rt_->lanes().cublas(r), a[r], b[r], const_cast<void*>(partial[r]), p.m(), p.n,
                                    p.k);
      }
      const GemmArPlan& p0 = plans_[rt_->first_rank()];
      rt_->lanes().nccl_all_reduce(p0.m() * p0.n, partial, c);
    });
  }
  rt_->own_call(barrier, [&] {
    for (int r : world_.local_ranks()) {  // cuBLAS: P_r = A_r B_r^T, then published whole
      world_.bind(r);
      const GemmArPlan& p = plans_[r];
      detail::cublas_gemm_tn(rt_->lanes().cublas(r), a[r], b[r], rt_->view(r).local(p.ar.f.partial), p.m(),
                                  p.n, p.k);
      detail::launch_set_signals(rt_->view(r).local(p.ar.f.tile_done), p.gemm.num_tiles(), rt_->epoch(r, 2),
                                 world_.stream(r));
    }
    for (int r : world_.local_ranks())  // the AllReduce, on all the rank's SMs
      launch_allreduce(world_, plans_[r].ar, rt_->view(r), c[r], rt_->epoch(r, 2),
                       CommLaunch{CopyMethod::kVector, world_.sm_count(r)});
  });
}

PathChoice GemmAr::choose(OpPath requested) const {
  return rt_->choose(requested, gemm_sms(rt_->first_rank()),
                     [&](int r, const MachineModel& m) { return choose_path(plans_[r], m, requested); });
}

void GemmAr::run_auto(const std::vector<const void*>& a, const std::vector<const void*>& b,
                      const std::vector<void*>& c, OpPath requested) {
  detail::run_chosen(*this, requested, a, b, c);
}

}  // namespace tilelink::cuda
