// Fused GEMM+ReduceScatter on the CUDA backend (see include/tilelink/ops/gemm_rs_cuda.hpp): the
// engine with the tile-done notify hook, the reduce (pull) or push+reduce kernels beside it, on the
// fused-op runtime (fused_runtime.hpp).
#include "tilelink/ops/gemm_rs_cuda.hpp"

#include <algorithm>

#include "cuda/tile_done_hooks.cuh"
#include "fused_runtime.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/cuda/comm.hpp"

namespace tilelink::cuda {

using detail::LaunchOrder;
using detail::TileDoneNotifyHooks;

GemmRs::GemmRs(World& world, const RowPartition& rows, int64_t n,
               const std::vector<int64_t>& k_per_rank, DType dtype, const GemmRsConfig& config)
    : world_(world) {
  const int W = world.size();
  TL_REQUIRE(rows.world_size == W, "gemm_rs: the row partition has " << rows.world_size
                                                                     << " ranks, the world " << W);
  TL_REQUIRE(static_cast<int>(k_per_rank.size()) == W,
             "gemm_rs: " << k_per_rank.size() << " K_r values for a world of " << W);
  TL_REQUIRE(dtype == DType::kBF16, "gemm_rs on the CUDA backend takes bf16, got " << dtype_name(dtype));
  TL_REQUIRE(n % 8 == 0, "gemm_rs: N must be a multiple of 8 (16-byte rows), got " << n);
  for (int r = 0; r < W; ++r)
    TL_REQUIRE(k_per_rank[r] % 8 == 0, "gemm_rs: K_" << r << " must be a multiple of 8, got " << k_per_rank[r]);
  TL_REQUIRE(config.comm_workers >= 0 && config.compute_workers >= 0,
             "gemm_rs: comm_workers (" << config.comm_workers << ") and compute_workers ("
                                       << config.compute_workers << ") must be >= 0");
  TL_REQUIRE(config.mode == CommMode::kPull || config.comm_workers == 0 ||
                 config.comm_workers >= 2 || W == 1,
             "gemm_rs push: comm_workers must be >= 2 (pushers and reducers), got "
                 << config.comm_workers);
  GemmRsConfig cfg = config;
  cfg.mode = CommMode::kPull;  // the engine's side: partial, tile_done, barrier (push_plans_ below)
  cfg.gemm_tile_m = compute::sm90::kTileM;  // the plan's gemm tiles are the engine's tiles
  cfg.gemm_tile_n = compute::sm90::kTileN;
  cfg.comm_tile_rows = kReduceBandRows;     // the reduce's items are a warp's bands
  for (int r = 0; r < W; ++r) {
    GemmRsConfig c = cfg;
    const int sms = world.is_local(r) ? world.sm_count(r) : 0;
    if (world.is_local(r)) c.group_m = compute::sm90::gemm_default_group_m(rows.total(), n, sms);
    GemmRsPlan p = GemmRsPlan::make(r, rows, n, k_per_rank[r], dtype, c);
    if (world.is_local(r)) {
      int& workers = p.config.comm_workers;
      if (workers == 0)  // the model's choice (tune/path_model.hpp), or push's fixed share
        workers = config.mode == CommMode::kPush ? std::clamp(sms / 4, 2, 16)
                                                 : gemm_rs_reduce_sms(p, detail::machine_model(world, r, sms));
      TL_REQUIRE(workers >= 1 && workers + c.compute_workers < sms,
                 "gemm_rs: rank " << r << " has " << sms << " SMs; the reduce needs comm_workers >= 1 (got "
                                  << workers << ") and must leave the GEMM at least one (compute_workers "
                                  << c.compute_workers << ")");
      split_sms({.sms = sms, .world_size = W, .compute_workers = c.compute_workers, .comm_sms = workers});
    }
    plans_.push_back(p);
  }
  Agreement agreement("gemm_rs");
  agreement.add("world", W).add("dtype", static_cast<int64_t>(dtype)).add("N", n).add("M rows", rows);
  agreement.add("K", k_per_rank).add("mode", static_cast<int64_t>(config.mode));
  agreement.add("comm_tile_rows", config.comm_tile_rows).add("comm_workers", config.comm_workers);
  agreement.add("compute_workers", config.compute_workers);
  rt_ = std::make_unique<detail::FusedRuntime>(world, "gemm_rs", std::move(agreement), plans_[0].ws.num_bytes);
  if (config.mode == CommMode::kPush) {
    for (int r = 0; r < W; ++r) {
      GemmRsConfig c = plans_[r].config;
      c.mode = CommMode::kPush;
      push_plans_.push_back(GemmRsPlan::make(r, rows, n, k_per_rank[r], dtype, c));
    }
    ws_push_ = world.allocate(push_plans_[0].ws.num_bytes);
  }
  rt_->init_engine(plans_);
  rt_->prepare_engine<TileDoneNotifyHooks>([&](int r) {  // tile_done[0] = 0: still zero
    return TileDoneNotifyHooks{rt_->view(r).local(plans_[r].rs.f.tile_done), plans_[r].gemm.tiles_n(), Epoch{0}};
  });
}

GemmRs::~GemmRs() = default;

compute::sm90::GemmWork GemmRs::gemm_work(int rank) const {
  return rt_->work(detail::engine_args(plans_.at(rank), nullptr, nullptr, nullptr, gemm_sms(rank)), rank);
}

int GemmRs::gemm_sms(int rank) const {
  const GemmRsConfig& cfg = plans_.at(rank).config;
  return rt_->split(rank, cfg.compute_workers, cfg.comm_workers).gemm_sms;
}

void GemmRs::check_args(const std::vector<const void*>& a, const std::vector<const void*>& b,
                        const std::vector<void*>& c) const {
  rt_->check_operand("A", a);
  rt_->check_operand("B", b);
  rt_->check_operand("C", c, true, [&](int r) { return plans_[r].rows.size(r) == 0; });
}

void GemmRs::enqueue_gemm(int r, const void* a, const void* b, void* out, bool hooks) {
  const GemmRsPlan& p = plans_[r];
  const compute::sm90::GemmArgs args = detail::engine_args(p, a, b, out, gemm_sms(r));
  if (!hooks) return rt_->launch_plain_engine(r, args);
  rt_->launch_engine(r, args, TileDoneNotifyHooks{rt_->view(r).local(p.rs.f.tile_done), p.gemm.tiles_n(), rt_->epoch(r)});
}

void GemmRs::run(const std::vector<const void*>& a, const std::vector<const void*>& b,
                 const std::vector<void*>& c) {
  check_args(a, b, c);
  if (world_.size() == 1)  // nothing to reduce: the engine alone, into C
    return rt_->world1([&](int r) { enqueue_gemm(r, a[r], b[r], c[r], false); });
  const bool pull = push_plans_.empty();
  rt_->begin(1);
  rt_->fused_call(
      LaunchOrder::kComputeFirst,
      // The entry barrier: the previous call's reduces are done everywhere.
      [&](int r) { rt_->entry_barrier(r, plans_[r].ws.barrier); },
      [&](int r) {
        enqueue_gemm(r, a[r], b[r], rt_->view(r).local(plans_[r].rs.f.partial), true);
        // Pull: once the GEMM is done, its SMs join the reduce: they claim the bands still left, the
        // last tiles' (the reduce's workers share one counter; bench/notes/fused_ops_cuda.md).
        if (pull)
          launch_reduce_scatter(world_, plans_[r].rs, rt_->view(r), c[r], rt_->epoch(r),
                           CommLaunch{CopyMethod::kVector, gemm_sms(r), 512, rt_->gemm_stream(r)});
      },
      [&](int r) { enqueue_reduce(r, c[r]); });
}

void GemmRs::enqueue_reduce(int r, void* c) {
  const GemmRsPlan& p = plans_[r];
  const CommLaunch how{CopyMethod::kVector, p.config.comm_workers};
  if (push_plans_.empty())
    launch_reduce_scatter(world_, p.rs, rt_->view(r), c, rt_->epoch(r), how);
  else
    launch_rs_push_reduce(world_, push_plans_[r], ws_push_.view(r), rt_->view(r), p.rs.f.partial, p.rs.f.tile_done, c,
                          rt_->epoch(r), how, how.workers / 2);
}

void GemmRs::run_gemm_only(const std::vector<const void*>& a, const std::vector<const void*>& b) {
  rt_->require_eager("run_gemm_only");
  rt_->begin(1);
  rt_->each_on_gemm_stream(
      [&](int r) { enqueue_gemm(r, a[r], b[r], rt_->view(r).local(plans_[r].rs.f.partial), world_.size() > 1); });
}

void GemmRs::run_reduce_only(const std::vector<void*>& c) {
  // NOTE: reuses the current epoch, whose tile_done signals the last GEMM set everywhere.
  // Repeated with one epoch, push's reducers need not wait for this call's pushes (timing only).
  rt_->require_eager("run_reduce_only");
  rt_->require_started("run_reduce_only", "a GEMM run");
  if (world_.size() == 1) return;  // a world-1 call has no reduce (run() is the engine alone)
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    if (push_plans_.empty())  // the last call with this epoch claimed every band: a fresh counter
      TL_CUDA_CHECK(
          cudaMemsetAsync(rt_->view(r).local(plans_[r].rs.f.claims), 0, sizeof(uint64_t), world_.stream(r)));
    enqueue_reduce(r, c[r]);
  }
}

void GemmRs::run_unfused(const std::vector<const void*>& a, const std::vector<const void*>& b,
                         const std::vector<void*>& c) {
  check_args(a, b, c);
  const Field<Signal> barrier = plans_[rt_->first_rank()].ws.barrier;
  auto gemm_into_partial = [&](int r) {  // cuBLAS: P_r [M, N] = A_r B_r^T
    world_.bind(r);
    const GemmRsPlan& p = plans_[r];
    void* partial = rt_->view(r).local(p.rs.f.partial);
    detail::cublas_gemm_tn(rt_->lanes().cublas(r), a[r], b[r], partial, p.m(), p.n, p.k);
    return partial;
  };
  if (rt_->nccl()) {  // cuBLAS+NCCL (peer, ipc): cuBLAS into the partial, NCCL's ReduceScatter
    return rt_->nccl_call(barrier, [&] {
      std::vector<const void*> partial(world_.size(), nullptr);
      for (int r : world_.local_ranks()) partial[r] = gemm_into_partial(r);
      const GemmRsPlan& p0 = plans_[rt_->first_rank()];
      rt_->lanes().nccl_reduce_scatter_rows(p0.rows, p0.n, partial, c);
    });
  }
  rt_->own_call(barrier, [&] {
    for (int r : world_.local_ranks()) {  // the partial, then published whole
      gemm_into_partial(r);
      detail::launch_set_signals(rt_->view(r).local(plans_[r].rs.f.tile_done), plans_[r].gemm.num_tiles(),
                                 rt_->epoch(r, 2), world_.stream(r));
    }
    for (int r : world_.local_ranks())  // the ReduceScatter, on all the rank's SMs
      launch_reduce_scatter(world_, plans_[r].rs, rt_->view(r), c[r], rt_->epoch(r, 2),
                       CommLaunch{CopyMethod::kVector, world_.sm_count(r)});
  });
}

PathChoice GemmRs::choose(OpPath requested) const {
  // push: its own plan (the engine's side, plans_, is always a pull plan)
  const std::vector<GemmRsPlan>& plans = push_plans_.empty() ? plans_ : push_plans_;
  return rt_->choose(requested, gemm_sms(rt_->first_rank()),
                     [&](int r, const MachineModel& m) { return choose_path(plans[r], m, requested); });
}

void GemmRs::run_auto(const std::vector<const void*>& a, const std::vector<const void*>& b,
                      const std::vector<void*>& c, OpPath requested) {
  detail::run_chosen(*this, requested, a, b, c);
}

}  // namespace tilelink::cuda
