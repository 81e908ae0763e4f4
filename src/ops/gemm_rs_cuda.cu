// Fused GEMM+ReduceScatter on the CUDA backend (see include/tilelink/ops/gemm_rs_cuda.hpp).
#include "tilelink/ops/gemm_rs_cuda.hpp"

#include <cublas_v2.h>

#include "call_epochs.hpp"
#include "engine_prep.cuh"
#include "rank_lanes.hpp"
#include "cuda/tile_done_hooks.cuh"

#include <cuda/atomic>

#include <algorithm>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/cuda/comm.hpp"

namespace tilelink::cuda {

namespace {

using GemmRsNotifyHooks = detail::TileDoneNotifyHooks;

}  // namespace

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
    }
    plans_.push_back(p);
  }
  ws_ = world.allocate(plans_[0].ws.num_bytes);
  if (config.mode == CommMode::kPush) {
    for (int r = 0; r < W; ++r) {
      GemmRsConfig c = plans_[r].config;
      c.mode = CommMode::kPush;
      push_plans_.push_back(GemmRsPlan::make(r, rows, n, k_per_rank[r], dtype, c));
    }
    ws_push_ = world.allocate(push_plans_[0].ws.num_bytes);
  }

  lanes_ = std::make_unique<detail::RankLanes>(world);
  epochs_ = std::make_unique<detail::CallEpochs>(world);
  engine_ws_ = std::make_unique<detail::EngineWorkspaces>(
      world, [&](int r) { return detail::engine_args(plans_[r], nullptr, nullptr, nullptr, 0); });
  // Every kernel of a call ready in every context before any of them spins (engine_prep.cuh).
  detail::prepare_engine<GemmRsNotifyHooks>(world, [&](int r) {  // tile_done[0] = 0: still zero
    return GemmRsNotifyHooks{ws_.view(r).local(plans_[r].ws.tile_done), plans_[r].gemm.tiles_n(), Epoch{0}};
  });
  detail::prepare_engine<compute::sm90::NoHooks>(world, [](int) { return compute::sm90::NoHooks{}; });
}

GemmRs::~GemmRs() = default;

compute::sm90::GemmWork GemmRs::gemm_work(int rank) const {
  return engine_ws_->work(
      detail::engine_args(plans_.at(rank), nullptr, nullptr, nullptr, gemm_sms(rank)), rank);
}

int GemmRs::gemm_sms(int rank) const {
  const GemmRsConfig& cfg = plans_[rank].config;
  if (cfg.compute_workers > 0) return cfg.compute_workers;
  return world_.size() == 1 ? world_.sm_count(rank) : world_.sm_count(rank) - cfg.comm_workers;
}

void GemmRs::check_args(const std::vector<const void*>& a, const std::vector<const void*>& b,
                        const std::vector<void*>& c) const {
  const int W = world_.size();
  TL_REQUIRE(static_cast<int>(a.size()) == W && static_cast<int>(b.size()) == W &&
                 static_cast<int>(c.size()) == W,
             "gemm_rs: pass one A, B and C entry per rank (" << W << ")");
  for (int r : world_.local_ranks()) {
    TL_REQUIRE(a[r] && b[r] && (c[r] || plans_[r].rows.size(r) == 0), "gemm_rs: null tensor on rank " << r);
    TL_REQUIRE(reinterpret_cast<uintptr_t>(a[r]) % 16 == 0 && reinterpret_cast<uintptr_t>(b[r]) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(c[r]) % 16 == 0,
               "gemm_rs: A, B and C of rank " << r << " must be 16-byte aligned");
  }
}

void GemmRs::enqueue_gemm(int r, const void* a, const void* b, void* out, bool hooks) {
  const GemmRsPlan& p = plans_[r];
  compute::sm90::GemmArgs args = detail::engine_args(p, a, b, out, gemm_sms(r));
  engine_ws_->attach(args, r);
  if (!hooks) {
    args.tile_n = 0;  // no signals mapped onto its tiles: the engine picks the width
    return detail::launch_engine(args, compute::sm90::NoHooks{}, lanes_->gemm_stream(r));
  }
  GemmRsNotifyHooks notify{ws_.view(r).local(p.ws.tile_done), p.gemm.tiles_n(), epochs_->epoch(r, 1)};
  detail::launch_engine(args, notify, lanes_->gemm_stream(r));
}

void GemmRs::run(const std::vector<const void*>& a, const std::vector<const void*>& b,
                 const std::vector<void*>& c) {
  check_args(a, b, c);
  if (world_.size() == 1) {  // nothing to reduce: the engine alone, into C
    const int r = world_.local_ranks().front();
    world_.bind(r);
    lanes_->on_gemm_stream(r, [&] { enqueue_gemm(r, a[r], b[r], c[r], false); });
    return;
  }
  epochs_->begin(1);
  // 1. Entry barrier on every rank's stream: the previous call's reduces are done everywhere.
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    StreamContext sc{&world_, r, world_.stream(r), "gemm_rs", epochs_->counter(r)};
    rank_barrier(sc, ws_.view(r), plans_[r].ws.barrier, epochs_->value(r, 1));
  }
  // 2. Every rank's GEMM (after its barrier), then 3. every rank's reduce: a failed launch leaves
  // only bounded device waits behind.
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    lanes_->fork(r);
    enqueue_gemm(r, a[r], b[r], ws_.view(r).local(plans_[r].ws.partial), true);
    if (push_plans_.empty()) {
      // Pull: once the GEMM is done, its SMs join the reduce: they claim the bands still left, the
      // last tiles' (the reduce's workers share one counter; bench/notes/fused_ops_cuda.md).
      launch_rs_reduce(world_, plans_[r], ws_.view(r), c[r], epochs_->epoch(r, 1),
                       CommLaunch{CopyMethod::kVector, gemm_sms(r), 512, lanes_->gemm_stream(r)});
    }
    lanes_->join_record(r);
  }
  for (int r : world_.local_ranks()) {
    const GemmRsPlan& p = plans_[r];
    const CommLaunch how{CopyMethod::kVector, p.config.comm_workers};
    if (push_plans_.empty())
      launch_rs_reduce(world_, p, ws_.view(r), c[r], epochs_->epoch(r, 1), how);
    else
      launch_rs_push_reduce(world_, push_plans_[r], ws_push_.view(r), ws_.view(r), p.ws.partial, p.ws.tile_done,
                            c[r], epochs_->epoch(r, 1), how, how.workers / 2);
    lanes_->join_wait(r);
  }
}

void GemmRs::run_gemm_only(const std::vector<const void*>& a, const std::vector<const void*>& b) {
  TL_REQUIRE(!epochs_->graph_mode(), "gemm_rs: run_gemm_only is for eager benches, not after a capture");
  epochs_->begin(1);
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    lanes_->on_gemm_stream(r, [&] {
      enqueue_gemm(r, a[r], b[r], ws_.view(r).local(plans_[r].ws.partial), world_.size() > 1);
    });
  }
}

void GemmRs::run_reduce_only(const std::vector<void*>& c) {
  // NOTE: reuses the current epoch, whose tile_done signals the last GEMM set everywhere.
  TL_REQUIRE(!epochs_->graph_mode(), "gemm_rs: run_reduce_only is for eager benches, not after a capture");
  TL_REQUIRE(epochs_->started(), "gemm_rs: run_reduce_only needs a GEMM run first");
  if (world_.size() == 1) return;  // a world-1 call has no reduce (run() is the engine alone)
  for (int r : world_.local_ranks()) {
    const GemmRsPlan& p = plans_[r];
    const CommLaunch how{CopyMethod::kVector, p.config.comm_workers};
    if (push_plans_.empty()) {
      // The last call with this epoch claimed every band: a fresh counter.
      world_.bind(r);
      TL_CUDA_CHECK(cudaMemsetAsync(ws_.view(r).local(p.ws.claims), 0, sizeof(uint64_t), world_.stream(r)));
      launch_rs_reduce(world_, p, ws_.view(r), c[r], epochs_->epoch(r, 1), how);
    } else {
      // NOTE: repeated with one epoch, the reducers need not wait for this call's pushes (timing only)
      launch_rs_push_reduce(world_, push_plans_[r], ws_push_.view(r), ws_.view(r), p.ws.partial, p.ws.tile_done,
                            c[r], epochs_->epoch(r, 1), how, how.workers / 2);
    }
  }
}

void GemmRs::run_unfused(const std::vector<const void*>& a, const std::vector<const void*>& b,
                         const std::vector<void*>& c) {
  check_args(a, b, c);
  if (lanes_->nccl()) {  // cuBLAS+NCCL (peer, ipc): cuBLAS into the partial, NCCL's ReduceScatter
    const int r0 = world_.local_ranks().front();
    auto mark = [&] { return epochs_->started() && !epochs_->graph_mode() ? epochs_->value(r0, 1) : 0; };
    if (lanes_->nccl_entry_barrier(epochs_->graph_mode(), mark())) {  // peers may still read partials
      epochs_->begin(1);
      for (int r : world_.local_ranks()) {
        world_.bind(r);
        StreamContext sc{&world_, r, world_.stream(r), "gemm_rs(unfused)", epochs_->counter(r)};
        rank_barrier(sc, ws_.view(r), plans_[r].ws.barrier, epochs_->value(r, 1));
      }
    }
    std::vector<const void*> partial(world_.size(), nullptr);
    for (int r : world_.local_ranks()) {  // P_r [M, N] = A_r B_r^T
      world_.bind(r);
      const GemmRsPlan& p = plans_[r];
      partial[r] = ws_.view(r).local(p.ws.partial);
      detail::cublas_gemm_bf16_tn(lanes_->cublas(r), a[r], b[r], const_cast<void*>(partial[r]), p.m(), p.n,
                                  p.k);
    }
    lanes_->nccl_reduce_scatter_rows(plans_[r0].rows, plans_[r0].n, partial, c);
    lanes_->nccl_done(mark());
    return;
  }
  epochs_->begin(2);
  for (int r : world_.local_ranks()) {  // barrier: partial buffers are free
    world_.bind(r);
    StreamContext sc{&world_, r, world_.stream(r), "gemm_rs(unfused)", epochs_->counter(r)};
    rank_barrier(sc, ws_.view(r), plans_[r].ws.barrier, epochs_->value(r, 1));
  }
  for (int r : world_.local_ranks()) {  // cuBLAS: P_r [M, N] = A_r B_r^T, then publish it whole
    world_.bind(r);
    const GemmRsPlan& p = plans_[r];
    detail::cublas_gemm_bf16_tn(lanes_->cublas(r), a[r], b[r], ws_.view(r).local(p.ws.partial), p.m(),
                                p.n, p.k);
    detail::launch_set_signals(ws_.view(r).local(p.ws.tile_done), p.gemm.num_tiles(), epochs_->epoch(r, 2),
                               world_.stream(r));
  }
  for (int r : world_.local_ranks()) {  // the ReduceScatter, on all the rank's SMs
    const GemmRsPlan& p = plans_[r];
    launch_rs_reduce(world_, p, ws_.view(r), c[r], epochs_->epoch(r, 2),
                     CommLaunch{CopyMethod::kVector, world_.sm_count(r)});
  }
}

PathChoice GemmRs::choose(OpPath requested) const {
  const int r0 = world_.local_ranks().front();
  const MachineModel m = detail::machine_model(world_, r0, gemm_sms(r0));
  // push: its own plan (the engine's side, plans_, is always a pull plan)
  const std::vector<GemmRsPlan>& plans = push_plans_.empty() ? plans_ : push_plans_;
  return agreed_choice(world_.size(), r0, requested,
                       [&](int r) { return choose_path(plans[r], m, requested); });
}

void GemmRs::run_auto(const std::vector<const void*>& a, const std::vector<const void*>& b,
                    const std::vector<void*>& c, OpPath requested) {
  if (choose(requested).path == OpPath::kFused) run(a, b, c);
  else run_unfused(a, b, c);
}

}  // namespace tilelink::cuda
