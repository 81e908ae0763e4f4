// Fused AllGather+GEMM on the CUDA backend: the copy-engine comm program and the sm90 engine with a
// per-tile wait hook (see include/tilelink/ops/ag_gemm_cuda.hpp), on the fused-op runtime
// (fused_runtime.hpp).
#include "tilelink/ops/ag_gemm_cuda.hpp"

#include "fused_runtime.hpp"

#include <cuda/atomic>
#include <cuda/ptx>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/ops/cuda/comm.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cuda {

using detail::LaunchOrder;

namespace {

// The compute program's link to the comm program: before a GEMM tile's loads, wait for the comm
// tiles that cover its rows (the plan's channel mapping). Lanes of the load warp share the slots.
struct AgGemmWaitHooks {
  static constexpr bool kWaits = true;
  static constexpr bool kNotifies = false;
  DeviceContext ctx;
  SymmetricView heap;
  Field<Signal> tile_ready;
  SegmentTiling comm;
  int tiles_n = 0;
  Epoch call;  // read per tile: a graph replay's epoch is on the device
  RowRange own{0, 0};  // rows the GEMM reads from A_r itself (own_direct): nothing to wait for

  // The lanes of the load warp wait on the comm tiles covering the tile's rows, one slot a lane, in
  // the quiet form (no function call in the engine: a call serialises its wgmma, C7510, ~7%
  // slower; bench/notes/gemm.md). System scope: the copy engine's stream write-values and a peer
  // GPU's stores both count. It is const, so the engine calls it on the kernel parameter, not on a
  // local-memory copy (impl/gemm_kernel.cuh, HooksInWarp).
  __device__ void before_tile_loads(const compute::sm90::TileWork& w) const {
    const Rect& region = w.region;
    if (region.row >= own.begin && region.row + region.rows <= own.end) return;  // every lane alike
    const IdRange ids = comm.covering(RowRange{region.row, region.row + region.rows});
    warp_tile_wait<Scope::kSystem, Report::kQuiet>(
        ctx, heap, ctx.rank, tile_ready, ids.begin, ids.end, call.value(),
        WaitSite{SignalField::kTileReady, w.tile.m * tiles_n + w.tile.n});
  }
};
static_assert(compute::sm90::detail::const_callable_hooks<AgGemmWaitHooks>(),
              "AgGemmWaitHooks must stay const-callable: a per-warp copy lives in local memory");

}  // namespace

AgGemm::AgGemm(World& world, const RowPartition& rows, const std::vector<int64_t>& n_per_rank,
               int64_t k, DType dtype, const AgGemmConfig& config)
    : world_(world) {
  const int W = world.size();
  TL_REQUIRE(rows.world_size == W, "ag_gemm: the row partition has " << rows.world_size
                                                                     << " ranks, the world " << W);
  TL_REQUIRE(static_cast<int>(n_per_rank.size()) == W,
             "ag_gemm: " << n_per_rank.size() << " N_r values for a world of " << W);
  TL_REQUIRE(dtype == DType::kBF16, "ag_gemm on the CUDA backend takes bf16, got " << dtype_name(dtype));
  TL_REQUIRE(config.comm_workers >= 0, "ag_gemm: comm_workers must be >= 0, got " << config.comm_workers);
  TL_REQUIRE(k % 8 == 0, "ag_gemm: K must be a multiple of 8 (16-byte rows), got " << k);
  for (int r : world.local_ranks())
    TL_REQUIRE(config.compute_workers >= 0 &&
                   config.compute_workers + config.comm_workers < world.sm_count(r),
               "ag_gemm: rank " << r << " has " << world.sm_count(r) << " SMs; compute_workers ("
                                << config.compute_workers << ") + comm_workers ("
                                << config.comm_workers << ") must leave the GEMM at least one");
  for (int r = 0; r < W; ++r)
    TL_REQUIRE(n_per_rank[r] % 8 == 0, "ag_gemm: N_" << r << " must be a multiple of 8, got " << n_per_rank[r]);

  AgGemmConfig cfg = config;
  cfg.gemm_tile_m = compute::sm90::kTileM;  // the plan's gemm tiles are the engine's tiles
  cfg.gemm_tile_n = compute::sm90::kTileN;
  for (int r = 0; r < W; ++r) {
    AgGemmConfig c = cfg;
    if (world.is_local(r)) {
      c.group_m = compute::sm90::gemm_default_group_m(rows.total(), n_per_rank[r], world.sm_count(r));
    }
    plans_.push_back(AgGemmPlan::make(r, rows, n_per_rank[r], k, dtype, c));
  }
  Agreement agreement("ag_gemm");
  agreement.add("world", W).add("dtype", static_cast<int64_t>(dtype)).add("K", k).add("M rows", rows);
  agreement.add("N", n_per_rank).add("mode", static_cast<int64_t>(config.mode));
  agreement.add("comm_tile_rows", config.comm_tile_rows).add("comm_workers", config.comm_workers);
  agreement.add("compute_workers", config.compute_workers);
  rt_ = std::make_unique<detail::FusedRuntime>(world, "ag_gemm", std::move(agreement), plans_[0].ws.num_bytes);
  rt_->init_engine(plans_);
  // Every kernel of a call ready in every context before any of them spins (engine_prep.cuh).
  auto passing_hooks = [&](int r) {
    return AgGemmWaitHooks{world.device_context(r), rt_->view(r), plans_[r].ag.f.tile_ready, plans_[r].ag.tiles,
                           plans_[r].gemm.tiles_n(), Epoch{0}};  // epoch 0: every wait passes
  };
  rt_->prepare_engine<AgGemmWaitHooks>(passing_hooks);
  bool any_direct = false;
  for (int r : world.local_ranks()) any_direct = any_direct || own_direct(r);
  if (any_direct) rt_->prepare_engine<AgGemmWaitHooks, true>(passing_hooks);
}

AgGemm::~AgGemm() = default;

compute::sm90::GemmWork AgGemm::gemm_work(int rank) const {
  return rt_->work(detail::engine_args(plans_.at(rank), nullptr, nullptr, nullptr, gemm_sms(rank)), rank);
}

int AgGemm::gemm_sms(int rank) const {
  // The rank's SMs less the comm kernel's, or with the copy engine less what it needs: same-GPU
  // copies run on SMs (virtual ranks), and in graph mode the signal operations beside the GEMM are
  // one-thread kernels (tune/sm_split.hpp).
  // NOTE: measured on the H200: with the persistent GEMM holding every SM of the rank, the comm
  // program's device-to-device cudaMemcpy2DAsync never ran (the GEMM's waits timed out); with a few
  // SMs left free it did (bench/diag/ce_probe.cu: with every thread slot of every SM held, a
  // same-GPU cudaMemcpyAsync waits for the SMs, and so does cudaMemcpyBatchAsync with
  // cudaMemcpyFlagPreferOverlapWithCompute).
  return rt_->split(rank, plans_.at(rank).config.compute_workers, comm_sms(rank)).gemm_sms;
}

int AgGemm::comm_sms(int rank) const {
  const AgGemmConfig& cfg = plans_[rank].config;
  if (cfg.comm_workers > 0) return cfg.comm_workers;
  // NOTE: measured on two H200s (tests/gpu/test_graph.cu, GraphCudaPeer): a pull on the copy engine
  // captured in graphs (one per GPU, one process) hangs on the first replay when rank 0's graph is
  // launched before rank 1's: rank 1's graph does not start (its first kernel never ran) until rank
  // 0's entry barrier gives up. Launched the other way round, or after one such replay, it passed;
  // push on the copy engine and the SM-driven pull passed in either order. The graph of the pull
  // differs from the push's in its memcpy nodes reading the peer's memory. So a captured pull on
  // separate GPUs moves its tiles on kGraphPullSms SMs (the same pull protocol: peers may be
  // eager).
  const bool graph_pull = rt_->graph_mode() && world_.transport() != Transport::kVirtual &&
                          world_.size() > 1 && cfg.mode == CommMode::kPull;
  return graph_pull ? kGraphPullSms : 0;
}

const void* AgGemm::gathered(int rank) const { return plans_.at(rank).ag.f.gathered.in(rt_->heap().base(rank)); }

void AgGemm::check_args(const std::vector<const void*>& a, const std::vector<const void*>& b,
                        const std::vector<void*>& c) const {
  rt_->check_operand("A", a, false, [&](int r) { return plans_[r].ag.own_rows().size() == 0; });
  rt_->check_operand("B", b);
  rt_->check_operand("C", c);
}

void AgGemm::enqueue_comm(int r, const void* a, AllGatherPart part) {
  const AgGemmPlan& p = plans_[r];
  if (comm_sms(r) > 0) {  // SM-driven: the whole comm kernel on the rank's stream
    if (part != AllGatherPart::kRemote)
      launch_allgather(world_, p.ag, p.ws.barrier, rt_->view(r), a, rt_->epoch(r),
                       CommLaunch{CopyMethod::kBulk, comm_sms(r)});
    return;
  }
  // The copy engine: the AllGather's program in sequence on the rank's stream (comm/allgather.hpp).
  const StreamExec x{rt_->stream_context(r), rt_->view(r)};
  allgather_rank_program(x, p.ag, p.ws.barrier, rt_->value(r), a, part);
}

void AgGemm::enqueue_gemm(int r, const void* a_gathered, const void* a_own, const void* b, void* c,
                          bool hooks, bool linked) {
  const AgGemmPlan& p = plans_[r];
  compute::sm90::GemmArgs args = detail::engine_args(p, a_gathered, b, c, gemm_sms(r));
  if (!hooks) return rt_->launch_plain_engine(r, args);
  const Epoch epoch = linked ? rt_->epoch(r) : Epoch{0};  // epoch 0: every wait passes
  AgGemmWaitHooks wait{world_.device_context(r), rt_->view(r), p.ag.f.tile_ready, p.ag.tiles, p.gemm.tiles_n(), epoch};
  if (!own_direct(r)) return rt_->launch_engine(r, args, wait);
  args.a_alt = a_own;
  args.a_alt_row0 = p.ag.own_rows().begin;
  args.a_alt_rows = p.ag.own_rows().size();
  wait.own = p.ag.own_rows();
  rt_->launch_engine<AgGemmWaitHooks, true>(r, args, wait);
}

bool AgGemm::own_direct(int r) const {
  const AgGemmPlan& p = plans_[r];
  const int64_t begin = p.ag.own_rows().begin, end = p.ag.own_rows().end, tm = compute::sm90::kTileM;
  return local_before_gemm() && p.config.mode == CommMode::kPush && end > begin &&
         begin % tm == 0 && (end % tm == 0 || end == p.m());
}

void AgGemm::run(const std::vector<const void*>& a, const std::vector<const void*>& b,
                 const std::vector<void*>& c) {
  run_call(a, b, c, true);
}

void AgGemm::run_unlinked(const std::vector<const void*>& a, const std::vector<const void*>& b,
                          const std::vector<void*>& c) {
  rt_->require_eager("run_unlinked");
  run_call(a, b, c, false);
}

void AgGemm::run_call(const std::vector<const void*>& a, const std::vector<const void*>& b,
                      const std::vector<void*>& c, bool linked) {
  check_args(a, b, c);
  if (world_.size() == 1)  // nothing to gather: the engine alone, on A itself
    return rt_->world1([&](int r) { enqueue_gemm(r, a[r], nullptr, b[r], c[r], false); });
  rt_->begin(1);
  auto gemm = [&](int r) {
    enqueue_gemm(r, rt_->view(r).local(plans_[r].ag.f.gathered), a[r], b[r], c[r], true, linked);
  };
  // The comm program runs on the rank's stream, the GEMM on its own stream of the same rank.
  if (comm_sms(rt_->first_rank()) > 0) {
    // SM-driven comm: its kernel is launched before the GEMM, so its blocks hold their SMs before
    // the persistent GEMM fills the rest. Its waits are device waits (bounded), so a failed GEMM
    // launch after it strands nothing for good.
    return rt_->fused_call(LaunchOrder::kCommFirst, detail::NoStep{}, gemm,
                           [&](int r) { enqueue_comm(r, a[r], AllGatherPart::kAll); });
  }
  // The copy engine. Virtual ranks: every rank's GEMM is launched before any comm program is
  // enqueued. Separate GPUs: the copy engine is SM-free for peer copies but a same-GPU copy runs on
  // SMs, so the own segment is copied before the GEMM starts (it then holds every SM) and only the
  // peers' tiles overlap with it; push with the own segment on tile rows skips that copy: the GEMM
  // reads it from A_r and starts at once, and the barrier and the pushes run beside it.
  const bool local_first = local_before_gemm();
  rt_->fused_call(
      LaunchOrder::kComputeFirst,
      [&](int r) {
        if (local_first && !own_direct(r)) enqueue_comm(r, a[r], AllGatherPart::kOwn);
      },
      gemm,
      [&](int r) {
        enqueue_comm(r, a[r], !local_first ? AllGatherPart::kAll : own_direct(r) ? AllGatherPart::kInPlace : AllGatherPart::kRemote);
      });
}

bool AgGemm::local_before_gemm() const {
  return world_.transport() != Transport::kVirtual && comm_sms(world_.local_ranks().front()) == 0;
}

void AgGemm::run_comm_only(const std::vector<const void*>& a) {
  rt_->require_eager("run_comm_only");
  rt_->begin(1);
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    enqueue_comm(r, a[r], own_direct(r) ? AllGatherPart::kInPlace : AllGatherPart::kAll);
  }
}

void AgGemm::run_gemm_only(const std::vector<const void*>& a, const std::vector<const void*>& b,
                           const std::vector<void*>& c) {
  // NOTE: the current epoch's signals are all set by the last comm run: the hooks' waits pass at
  // once, so this times the engine with its hooks on.
  rt_->require_eager("run_gemm_only");
  rt_->require_started("run_gemm_only", "a comm run");
  rt_->each_on_gemm_stream([&](int r) {
    enqueue_gemm(r, rt_->view(r).local(plans_[r].ag.f.gathered), a[r], b[r], c[r], world_.size() > 1);
  });
}

void AgGemm::run_unfused(const std::vector<const void*>& a, const std::vector<const void*>& b,
                         const std::vector<void*>& c) {
  check_args(a, b, c);
  const Field<Signal> barrier = plans_[rt_->first_rank()].ws.barrier;
  auto gemm = [&](int r) {  // cuBLAS: C_r [M, N_r] = gathered A [M, K] * B_r^T
    world_.bind(r);
    const AgGemmPlan& p = plans_[r];
    detail::cublas_gemm_tn(rt_->lanes().cublas(r), rt_->view(r).local(p.ag.f.gathered), b[r], c[r], p.m(), p.n,
                                p.k);
  };
  if (rt_->nccl()) {  // cuBLAS+NCCL (peer, ipc): NCCL's AllGather into every gathered A, cuBLAS
    return rt_->nccl_call(barrier, [&] {  // the barrier: peers may still pull from us
      std::vector<void*> gathered(world_.size(), nullptr);
      for (int r : world_.local_ranks()) gathered[r] = rt_->view(r).local(plans_[r].ag.f.gathered);
      const AgGemmPlan& p0 = plans_[rt_->first_rank()];
      rt_->lanes().nccl_all_gather_rows(p0.ag.tiles.parts, p0.k, a, gathered);
      for (int r : world_.local_ranks()) gemm(r);
    });
  }
  // AllGather on the copy engine, every rank: barrier, own segment into every rank, barrier.
  // NOTE: all of it is enqueued before any cuBLAS call, so a failing call cannot strand a peer's
  // stream wait.
  rt_->own_call(barrier, [&] {
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      const AgGemmPlan& p = plans_[r];
      const StreamContext sc = rt_->stream_context(r, true);
      SymmetricView heap = rt_->view(r);
      const RowRange own = p.ag.own_rows();
      for (int s = 0; s < world_.size() && own.size() > 0; ++s) {
        int peer = peer_at(r, s, world_.size());
        rank_copy_data(sc, peer, p.ag.rows_copy(a[r], own.begin, heap.peer(peer, p.ag.f.gathered), own));
      }
      rank_barrier(sc, heap, p.ws.barrier, rt_->value(r, 2));
    }
    for (int r : world_.local_ranks()) gemm(r);
  });
}

PathChoice AgGemm::choose(OpPath requested) const {
  // NOTE: every rank must take the same path (one process per rank on ipc decides alone), so the
  // choice is made from every rank's plan, on this GPU's model (the ranks' GPUs alike).
  return rt_->choose(requested, gemm_sms(rt_->first_rank()), [&](int r, MachineModel m) {
    m.own_rows_direct = own_direct(r);
    return choose_path(plans_[r], m, requested);
  });
}

void AgGemm::run_auto(const std::vector<const void*>& a, const std::vector<const void*>& b,
                      const std::vector<void*>& c, OpPath requested) {
  detail::run_chosen(*this, requested, a, b, c);
}

}  // namespace tilelink::cuda
