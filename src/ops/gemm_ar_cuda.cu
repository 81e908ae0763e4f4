// Fused GEMM+AllReduce on the CUDA backend (see include/tilelink/ops/gemm_ar_cuda.hpp).
#include "tilelink/ops/gemm_ar_cuda.hpp"

#include <cublas_v2.h>

#include <algorithm>

#include "call_epochs.hpp"
#include "cuda/tile_done_hooks.cuh"
#include "engine_prep.cuh"
#include "rank_lanes.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/cuda/comm.hpp"
#include "tilelink/tune/gemm_ar_model.hpp"

namespace tilelink::cuda {

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
    const int sms = world.is_local(r) ? world.sm_count(r) : 0;
    if (world.is_local(r)) {
      c.group_m = compute::sm90::gemm_default_group_m(rows.total(), n, sms);
      if (c.comm_workers == 0) c.comm_workers = std::clamp(sms / 8, 2, 16);
      TL_REQUIRE(W == 1 || c.comm_workers + c.compute_workers < sms,
                 "gemm_ar: rank " << r << " has " << sms << " SMs; comm_workers (" << c.comm_workers
                                  << ") + compute_workers (" << c.compute_workers
                                  << ") must leave the GEMM at least one");
    }
    plans_.push_back(GemmArPlan::make(r, rows, n, k_per_rank[r], dtype, c));
  }
  ws_ = world.allocate(plans_[0].num_bytes);
  lanes_ = std::make_unique<detail::RankLanes>(world);
  epochs_ = std::make_unique<detail::CallEpochs>(world);
  engine_ws_ = std::make_unique<detail::EngineWorkspaces>(
      world, [&](int r) { return detail::engine_args(plans_[r], nullptr, nullptr, nullptr, 0); });
  // Every kernel of a call ready in every context before any of them spins (engine_prep.cuh).
  detail::prepare_engine<TileDoneNotifyHooks>(world, [&](int r) {  // tile_done[0] = 0: still zero
    return TileDoneNotifyHooks{ws_.view(r).local(plans_[r].ar.f.tile_done), plans_[r].gemm.tiles_n(), Epoch{0}};
  });
  detail::prepare_engine<compute::sm90::NoHooks>(world, [](int) { return compute::sm90::NoHooks{}; });
}

GemmAr::~GemmAr() = default;

int GemmAr::gemm_sms(int rank) const {
  const GemmArConfig& cfg = plans_.at(rank).config;
  if (cfg.compute_workers > 0) return cfg.compute_workers;
  return world_.size() == 1 ? world_.sm_count(rank) : world_.sm_count(rank) - cfg.comm_workers;
}

void GemmAr::check_args(const std::vector<const void*>& a, const std::vector<const void*>& b,
                        const std::vector<void*>& c) const {
  const int W = world_.size();
  TL_REQUIRE(static_cast<int>(a.size()) == W && static_cast<int>(b.size()) == W && static_cast<int>(c.size()) == W,
             "gemm_ar: pass one A, B and C entry per rank (" << W << ")");
  for (int r : world_.local_ranks()) {
    TL_REQUIRE(a[r] && b[r] && c[r], "gemm_ar: null tensor on rank " << r);
    TL_REQUIRE(reinterpret_cast<uintptr_t>(a[r]) % 16 == 0 && reinterpret_cast<uintptr_t>(b[r]) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(c[r]) % 16 == 0,
               "gemm_ar: A, B and C of rank " << r << " must be 16-byte aligned");
  }
}

void GemmAr::enqueue_gemm(int r, const void* a, const void* b, void* out, bool hooks) {
  const GemmArPlan& p = plans_[r];
  compute::sm90::GemmArgs args = detail::engine_args(p, a, b, out, gemm_sms(r));
  engine_ws_->attach(args, r);
  if (!hooks) {
    args.tile_n = 0;  // no signals mapped onto its tiles: the engine picks the width
    return detail::launch_engine(args, compute::sm90::NoHooks{}, lanes_->gemm_stream(r));
  }
  TileDoneNotifyHooks notify{ws_.view(r).local(p.ar.f.tile_done), p.gemm.tiles_n(), epochs_->epoch(r, 1)};
  detail::launch_engine(args, notify, lanes_->gemm_stream(r));
}

void GemmAr::run(const std::vector<const void*>& a, const std::vector<const void*>& b,
                 const std::vector<void*>& c) {
  check_args(a, b, c);
  if (world_.size() == 1) {  // nothing to reduce: the engine alone, into C
    const int r = world_.local_ranks().front();
    world_.bind(r);
    lanes_->on_gemm_stream(r, [&] { enqueue_gemm(r, a[r], b[r], c[r], false); });
    return;
  }
  epochs_->begin(1);
  // 1. Entry barrier: the previous call's reads of every partial are done everywhere.
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    StreamContext sc{&world_, r, world_.stream(r), "gemm_ar", epochs_->counter(r)};
    rank_barrier(sc, ws_.view(r), plans_[r].barrier, epochs_->value(r, 1));
  }
  // 2. Every rank's GEMM, then on its SMs the AllReduce items still left; 3. the AllReduce on the
  // comm SMs beside it.
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    lanes_->fork(r);
    enqueue_gemm(r, a[r], b[r], ws_.view(r).local(plans_[r].ar.f.partial), true);
    launch_allreduce(world_, plans_[r].ar, ws_.view(r), c[r], epochs_->epoch(r, 1),
                     CommLaunch{CopyMethod::kVector, gemm_sms(r), 512, lanes_->gemm_stream(r)});
    lanes_->join_record(r);
  }
  for (int r : world_.local_ranks()) {
    launch_allreduce(world_, plans_[r].ar, ws_.view(r), c[r], epochs_->epoch(r, 1),
                     CommLaunch{CopyMethod::kVector, plans_[r].config.comm_workers});
    lanes_->join_wait(r);
  }
}

void GemmAr::run_gemm_only(const std::vector<const void*>& a, const std::vector<const void*>& b) {
  TL_REQUIRE(!epochs_->graph_mode(), "gemm_ar: run_gemm_only is for eager benches, not after a capture");
  epochs_->begin(1);
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    lanes_->on_gemm_stream(
        r, [&] { enqueue_gemm(r, a[r], b[r], ws_.view(r).local(plans_[r].ar.f.partial), world_.size() > 1); });
  }
}

void GemmAr::run_comm_only(const std::vector<void*>& c) {
  // NOTE: reuses the current epoch, whose tile_done (and band_ready) signals the last call set.
  TL_REQUIRE(!epochs_->graph_mode(), "gemm_ar: run_comm_only is for eager benches, not after a capture");
  TL_REQUIRE(epochs_->started(), "gemm_ar: run_comm_only needs a GEMM run first");
  if (world_.size() == 1) return;
  for (int r : world_.local_ranks()) {
    const GemmArPlan& p = plans_[r];
    world_.bind(r);
    // The last call with this epoch claimed every item: fresh counters.
    TL_CUDA_CHECK(cudaMemsetAsync(ws_.view(r).local(p.ar.f.claims), 0, 2 * sizeof(uint64_t), world_.stream(r)));
    launch_allreduce(world_, p.ar, ws_.view(r), c[r], epochs_->epoch(r, 1),
                     CommLaunch{CopyMethod::kVector, p.config.comm_workers});
  }
}

void GemmAr::run_unfused(const std::vector<const void*>& a, const std::vector<const void*>& b,
                         const std::vector<void*>& c) {
  check_args(a, b, c);
  if (lanes_->nccl()) {  // cuBLAS+NCCL (peer, ipc): cuBLAS into the partial, NCCL's AllReduce into C
    const int r0 = world_.local_ranks().front();
    auto mark = [&] { return epochs_->started() && !epochs_->graph_mode() ? epochs_->value(r0, 1) : 0; };
    if (lanes_->nccl_entry_barrier(epochs_->graph_mode(), mark())) {  // peers may still read partials
      epochs_->begin(1);
      for (int r : world_.local_ranks()) {
        world_.bind(r);
        StreamContext sc{&world_, r, world_.stream(r), "gemm_ar(unfused)", epochs_->counter(r)};
        rank_barrier(sc, ws_.view(r), plans_[r].barrier, epochs_->value(r, 1));
      }
    }
    std::vector<const void*> partial(world_.size(), nullptr);
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      const GemmArPlan& p = plans_[r];
      partial[r] = ws_.view(r).local(p.ar.f.partial);
      detail::cublas_gemm_bf16_tn(lanes_->cublas(r), a[r], b[r], const_cast<void*>(partial[r]), p.m(), p.n, p.k);
    }
    lanes_->nccl_all_reduce(plans_[r0].m() * plans_[r0].n, partial, c);
    lanes_->nccl_done(mark());
    return;
  }
  epochs_->begin(2);
  for (int r : world_.local_ranks()) {  // barrier: partial buffers are free
    world_.bind(r);
    StreamContext sc{&world_, r, world_.stream(r), "gemm_ar(unfused)", epochs_->counter(r)};
    rank_barrier(sc, ws_.view(r), plans_[r].barrier, epochs_->value(r, 1));
  }
  for (int r : world_.local_ranks()) {  // cuBLAS: P_r = A_r B_r^T, then published whole
    world_.bind(r);
    const GemmArPlan& p = plans_[r];
    detail::cublas_gemm_bf16_tn(lanes_->cublas(r), a[r], b[r], ws_.view(r).local(p.ar.f.partial), p.m(), p.n, p.k);
    detail::launch_set_signals(ws_.view(r).local(p.ar.f.tile_done), p.gemm.num_tiles(), epochs_->epoch(r, 2),
                               world_.stream(r));
  }
  for (int r : world_.local_ranks())  // the AllReduce, on all the rank's SMs
    launch_allreduce(world_, plans_[r].ar, ws_.view(r), c[r], epochs_->epoch(r, 2),
                     CommLaunch{CopyMethod::kVector, world_.sm_count(r)});
}

PathChoice GemmAr::choose(OpPath requested) const {
  const int r0 = world_.local_ranks().front();
  const MachineModel m = detail::machine_model(world_, r0, gemm_sms(r0));
  return agreed_choice(world_.size(), r0, requested, [&](int r) { return choose_path(plans_[r], m, requested); });
}

void GemmAr::run_auto(const std::vector<const void*>& a, const std::vector<const void*>& b,
                      const std::vector<void*>& c, OpPath requested) {
  if (choose(requested).path == OpPath::kFused) run(a, b, c);
  else run_unfused(a, b, c);
}

}  // namespace tilelink::cuda
