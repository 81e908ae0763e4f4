// Fused AllGather+GEMM on the CUDA backend: the copy-engine comm program and the sm90 engine with a
// per-tile wait hook (see include/tilelink/ops/ag_gemm_cuda.hpp).
#include "tilelink/ops/ag_gemm_cuda.hpp"

#include <cublas_v2.h>

#include "call_epochs.hpp"
#include "engine_prep.cuh"
#include "rank_lanes.hpp"

#include <cuda/atomic>
#include <cuda/ptx>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/ops/cuda/comm.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cuda {

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

  // NOTE: no function calls in here (not even a noinline error path with printf): a kernel that
  // calls any function gets its wgmma serialised by ptxas (C7510), ~7% slower (bench/notes/gemm.md).
  // So the bounded acquire spin is written out, and a timeout records the world's fault (reported by
  // World::sync) and traps without printing. It is const, so the engine calls it on the kernel
  // parameter, not on a local-memory copy (impl/gemm_kernel.cuh, HooksInWarp).
  __device__ void before_tile_loads(TileCoord tile, Rect region) const {
    if (region.row >= own.begin && region.row + region.rows <= own.end) return;  // every lane alike
    const IdRange ids = comm.covering(RowRange{region.row, region.row + region.rows});
    const uint64_t epoch = call.value();
    unsigned lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    // System scope: the copy engine's stream write-values and a peer GPU's stores both count.
    for (int s = ids.begin + static_cast<int>(lane); s < ids.end; s += 32) {
      ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system> sig(heap.local(tile_ready)[s]);
      uint64_t seen = sig.load(::cuda::memory_order_acquire);
      if (seen >= epoch) continue;
      const uint64_t t0 = ::cuda::ptx::get_sreg_globaltimer();
      for (uint32_t spins = 1; seen < epoch; ++spins) {
        seen = sig.load(::cuda::memory_order_acquire);
        if ((spins & 255u) == 0 && ::cuda::ptx::get_sreg_globaltimer() - t0 > ctx.timeout_ns) {
          if (ctx.fault && atomicCAS_system(&ctx.fault->claimed, 0u, 1u) == 0u) {
            ctx.fault->rank = ctx.rank;
            ctx.fault->owner = ctx.rank;
            ctx.fault->tile = tile.m * tiles_n + tile.n;
            ctx.fault->slot = s;
            ctx.fault->kind = 0;
            ctx.fault->expected = epoch;
            ctx.fault->observed = seen;
            ctx.fault->waited_ns = ::cuda::ptx::get_sreg_globaltimer() - t0;
            __threadfence_system();
          }
          __trap();
        }
      }
    }
    __syncwarp();  // the engine adds fence.proxy.async before its TMA loads
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
  ws_ = world.allocate(plans_[0].ws.num_bytes);

  lanes_ = std::make_unique<detail::RankLanes>(world);
  epochs_ = std::make_unique<detail::CallEpochs>(world);
  engine_ws_ = std::make_unique<detail::EngineWorkspaces>(
      world, [&](int r) { return detail::engine_args(plans_[r], nullptr, nullptr, nullptr, 0); });
  // Every kernel of a call ready in every context before any of them spins (engine_prep.cuh).
  auto passing_hooks = [&](int r) {
    return AgGemmWaitHooks{world.device_context(r), ws_.view(r), plans_[r].ws.tile_ready, plans_[r].comm,
                           plans_[r].gemm.tiles_n(), Epoch{0}};  // epoch 0: every wait passes
  };
  detail::prepare_engine<AgGemmWaitHooks>(world, passing_hooks);
  detail::prepare_engine<compute::sm90::NoHooks>(world, [](int) { return compute::sm90::NoHooks{}; });
  bool any_direct = false;
  for (int r : world.local_ranks()) any_direct = any_direct || own_direct(r);
  if (any_direct) detail::prepare_engine<AgGemmWaitHooks, true>(world, passing_hooks);
}

AgGemm::~AgGemm() = default;

compute::sm90::GemmWork AgGemm::gemm_work(int rank) const {
  return engine_ws_->work(
      detail::engine_args(plans_.at(rank), nullptr, nullptr, nullptr, gemm_sms(rank)), rank);
}

int AgGemm::gemm_sms(int rank) const {
  // NOTE: measured on the H200: with the persistent GEMM holding every SM of the rank, the comm
  // program's device-to-device cudaMemcpy2DAsync never ran (the GEMM's waits timed out); with a few
  // SMs left free it did. The driver runs such copies on SMs, so compute_workers = 0 leaves
  // kCopySpareSms of the rank's SMs to them. (bench/diag/ce_probe.cu shows it on one GPU: with every
  // thread slot of every SM held, a same-GPU cudaMemcpyAsync waits for the SMs, and so does
  // cudaMemcpyBatchAsync with cudaMemcpyFlagPreferOverlapWithCompute.)
  const int total = world_.sm_count(rank);
  const AgGemmConfig& cfg = plans_[rank].config;
  if (cfg.compute_workers > 0) return cfg.compute_workers;
  if (world_.size() == 1) return total;  // no comm program
  if (comm_sms(rank) > 0) return total - comm_sms(rank);  // the comm kernel's SMs
  // Separate GPUs: peer copies leave the SMs alone. In graph mode the signal operations beside the
  // GEMM are one-thread kernels (backend/cuda/stream_prim.cu), and a GEMM block fills a whole SM,
  // so kGraphSignalSms are left to them; eager calls use stream memory operations and need none.
  if (local_before_gemm())
    return epochs_->graph_mode() && total > kGraphSignalSms ? total - kGraphSignalSms : total;
  return total > kCopySpareSms ? total - kCopySpareSms : total;
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
  const bool graph_pull = epochs_->graph_mode() && world_.transport() != Transport::kVirtual &&
                          world_.size() > 1 && cfg.mode == CommMode::kPull;
  return graph_pull ? kGraphPullSms : 0;
}

const void* AgGemm::gathered(int rank) const { return plans_.at(rank).ws.gathered.in(ws_.base(rank)); }

void AgGemm::check_args(const std::vector<const void*>& a, const std::vector<const void*>& b,
                        const std::vector<void*>& c) const {
  const int W = world_.size();
  TL_REQUIRE(static_cast<int>(a.size()) == W && static_cast<int>(b.size()) == W &&
                 static_cast<int>(c.size()) == W,
             "ag_gemm: pass one A, B and C entry per rank (" << W << ")");
  for (int r : world_.local_ranks()) {
    TL_REQUIRE((a[r] || plans_[r].comm.parts.size(r) == 0) && b[r] && c[r],
               "ag_gemm: null tensor on rank " << r);
    TL_REQUIRE(reinterpret_cast<uintptr_t>(b[r]) % 16 == 0 && reinterpret_cast<uintptr_t>(c[r]) % 16 == 0,
               "ag_gemm: B and C of rank " << r << " must be 16-byte aligned");
  }
}

void AgGemm::enqueue_comm(int r, const void* a, CommPart part) {
  const AgGemmPlan& p = plans_[r];
  if (comm_sms(r) > 0) {  // SM-driven: the whole comm kernel on the rank's stream
    if (part != CommPart::kRemote)
      launch_ag_comm(world_, p, ws_.view(r), a, epochs_->epoch(r, 1),
                     CommLaunch{CopyMethod::kBulk, comm_sms(r)});
    return;
  }
  StreamContext sc{&world_, r, world_.stream(r), "ag_gemm", epochs_->counter(r)};
  const uint64_t epoch = epochs_->value(r, 1);
  SymmetricView heap = ws_.view(r);
  const int64_t rb = p.row_bytes();
  auto rows_copy = [&](const void* src, int64_t src_row0, void* dst, RowRange rows) {
    return Copy2D{static_cast<const char*>(src) + (rows.begin - src_row0) * rb, rb,
                  static_cast<char*>(dst) + rows.begin * rb, rb, rows.size(), rb};
  };
  const int64_t seg0 = p.comm.parts.begin(r);
  const RowRange own{seg0, p.comm.parts.end(r)};
  const bool pull = p.config.mode == CommMode::kPull;
  if (part != CommPart::kRemote) {
    // Entry barrier: every peer has finished its previous call (its comm stream waited for it).
    rank_barrier(sc, heap, p.ws.barrier, epoch);
  }
  if (part != CommPart::kRemote && part != CommPart::kDirect) {
    // The own segment, each own tile announced after it lands (pull: to this rank's GEMM and to the
    // peers that pull it; push: to this rank's GEMM). Before the GEMM (kLocal): one copy; beside it
    // (kAll): tile by tile, so the GEMM's first tiles start early.
    if (part == CommPart::kLocal) rank_copy_data(sc, r, rows_copy(a, seg0, heap.local(p.ws.gathered), own));
    for (int t = p.comm.first[r]; t < p.comm.first[r + 1]; ++t) {
      if (part == CommPart::kAll) rank_copy_data(sc, r, rows_copy(a, seg0, heap.local(p.ws.gathered), p.comm.rows_of(t)));
      if (pull) producer_tile_notify(sc, heap, p.ws.tile_ready, t, epoch);
      else peer_tile_notify(sc, heap, r, p.ws.tile_ready, t, epoch);
    }
  }
  if (part == CommPart::kLocal) return;
  if (pull) {
    for (int i = 0; i < p.comm.num_tiles(); ++i) {
      const int t = p.pull_tile_at(i);
      const int owner = p.comm.rank_of(t);
      if (owner == r) continue;
      peer_tile_wait(sc, heap, owner, p.ws.tile_ready, t, epoch, WaitSite{"tile_ready", t});
      rank_copy_data(sc, owner, rows_copy(heap.peer(owner, p.ws.gathered), 0, heap.local(p.ws.gathered),
                                          p.comm.rows_of(t)));
      producer_tile_notify(sc, heap, p.ws.tile_ready, t, epoch);
    }
  } else {
    for (int i = 0; i < p.push_count(); ++i) {
      int peer = 0, t = 0;
      p.push_at(i, &peer, &t);
      if (peer == r) continue;
      rank_copy_data(sc, peer, rows_copy(a, seg0, heap.peer(peer, p.ws.gathered), p.comm.rows_of(t)));
      peer_tile_notify(sc, heap, peer, p.ws.tile_ready, t, epoch);
    }
  }
}

void AgGemm::enqueue_gemm(int r, const void* a_gathered, const void* a_own, const void* b, void* c,
                          bool hooks, bool linked) {
  const AgGemmPlan& p = plans_[r];
  compute::sm90::GemmArgs args = detail::engine_args(p, a_gathered, b, c, gemm_sms(r));
  engine_ws_->attach(args, r);
  if (!hooks) {
    args.tile_n = 0;  // no signals mapped onto its tiles: the engine picks the width
    return detail::launch_engine(args, compute::sm90::NoHooks{}, lanes_->gemm_stream(r));
  }
  const Epoch epoch = linked ? epochs_->epoch(r, 1) : Epoch{0};  // epoch 0: every wait passes
  AgGemmWaitHooks wait{world_.device_context(r), ws_.view(r), p.ws.tile_ready, p.comm,
                       p.gemm.tiles_n(), epoch};
  if (!own_direct(r)) return detail::launch_engine(args, wait, lanes_->gemm_stream(r));
  args.a_alt = a_own;
  args.a_alt_row0 = p.comm.parts.begin(r);
  args.a_alt_rows = p.comm.parts.size(r);
  wait.own = RowRange{p.comm.parts.begin(r), p.comm.parts.end(r)};
  detail::launch_engine<AgGemmWaitHooks, true>(args, wait, lanes_->gemm_stream(r));
}

bool AgGemm::own_direct(int r) const {
  const AgGemmPlan& p = plans_[r];
  const int64_t begin = p.comm.parts.begin(r), end = p.comm.parts.end(r), tm = compute::sm90::kTileM;
  return local_before_gemm() && p.config.mode == CommMode::kPush && end > begin &&
         begin % tm == 0 && (end % tm == 0 || end == p.m());
}

void AgGemm::run(const std::vector<const void*>& a, const std::vector<const void*>& b,
                 const std::vector<void*>& c) {
  run_call(a, b, c, true);
}

void AgGemm::run_unlinked(const std::vector<const void*>& a, const std::vector<const void*>& b,
                          const std::vector<void*>& c) {
  TL_REQUIRE(!epochs_->graph_mode(),
             "ag_gemm: run_unlinked is for eager benches, not after a capture");
  run_call(a, b, c, false);
}

void AgGemm::run_call(const std::vector<const void*>& a, const std::vector<const void*>& b,
                      const std::vector<void*>& c, bool linked) {
  check_args(a, b, c);
  if (world_.size() == 1) {  // nothing to gather: the engine alone, on A itself
    const int r = world_.local_ranks().front();
    world_.bind(r);
    lanes_->on_gemm_stream(r, [&] { enqueue_gemm(r, a[r], nullptr, b[r], c[r], false); });
    return;
  }
  epochs_->begin(1);
  // The comm program runs on the rank's stream s, the GEMM on its own stream g of the same rank.
  // Virtual ranks: every rank's GEMM is launched before any comm program is enqueued (NOTE: a launch
  // that fails then leaves nothing behind but GEMMs whose waits time out, bounded; enqueued the
  // other way, it left peers' stream waits blocked for good, and the next synchronisation hung).
  // Separate GPUs: the copy engine is SM-free for peer copies but a same-GPU copy runs on SMs, so the
  // own segment is copied before the GEMM starts (it then holds every SM) and only the peers' tiles
  // overlap with it.
  if (comm_sms(world_.local_ranks().front()) > 0) {
    // SM-driven comm: its kernel is launched before the GEMM, so its blocks hold their SMs before
    // the persistent GEMM fills the rest (NOTE: launched after it, they could find no free SM while
    // the GEMM spun on the tiles they were to bring; the waits timed out on the H200). Its waits are
    // device waits (bounded), so a failed GEMM launch after it strands nothing for good.
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      lanes_->fork(r);
      enqueue_comm(r, a[r], CommPart::kAll);
      enqueue_gemm(r, ws_.view(r).local(plans_[r].ws.gathered), a[r], b[r], c[r], true, linked);
      lanes_->join_record(r);
    }
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      lanes_->join_wait(r);
    }
    return;
  }
  // Push with the own segment on tile rows: the GEMM reads it from A_r and starts at once; the
  // barrier and the pushes (copy engine, no SMs) run beside it.
  const bool local_first = local_before_gemm();
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    if (local_first && !own_direct(r)) enqueue_comm(r, a[r], CommPart::kLocal);
    lanes_->fork(r);  // the previous call is done with `gathered`; the epoch has advanced
    enqueue_gemm(r, ws_.view(r).local(plans_[r].ws.gathered), a[r], b[r], c[r], true, linked);
    lanes_->join_record(r);
  }
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    enqueue_comm(r, a[r], !local_first ? CommPart::kAll : own_direct(r) ? CommPart::kDirect : CommPart::kRemote);
    lanes_->join_wait(r);  // the call ends with both
  }
}

bool AgGemm::local_before_gemm() const {
  return world_.transport() != Transport::kVirtual && comm_sms(world_.local_ranks().front()) == 0;
}

void AgGemm::run_comm_only(const std::vector<const void*>& a) {
  TL_REQUIRE(!epochs_->graph_mode(), "ag_gemm: run_comm_only is for eager benches, not after a capture");
  epochs_->begin(1);
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    enqueue_comm(r, a[r], own_direct(r) ? CommPart::kDirect : CommPart::kAll);
  }
}

void AgGemm::run_gemm_only(const std::vector<const void*>& a, const std::vector<const void*>& b,
                           const std::vector<void*>& c) {
  // NOTE: the current epoch's signals are all set by the last comm run: the hooks' waits pass at
  // once, so this times the engine with its hooks on.
  TL_REQUIRE(!epochs_->graph_mode(), "ag_gemm: run_gemm_only is for eager benches, not after a capture");
  TL_REQUIRE(epochs_->started(), "ag_gemm: run_gemm_only needs a comm run first");
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    lanes_->on_gemm_stream(r, [&] {
      enqueue_gemm(r, ws_.view(r).local(plans_[r].ws.gathered), a[r], b[r], c[r], world_.size() > 1);
    });
  }
}

void AgGemm::run_unfused(const std::vector<const void*>& a, const std::vector<const void*>& b,
                         const std::vector<void*>& c) {
  check_args(a, b, c);
  if (lanes_->nccl()) {  // cuBLAS+NCCL (peer, ipc): NCCL's AllGather into every gathered A, cuBLAS
    const int r0 = world_.local_ranks().front();
    auto mark = [&] { return epochs_->started() && !epochs_->graph_mode() ? epochs_->value(r0, 1) : 0; };
    if (lanes_->nccl_entry_barrier(epochs_->graph_mode(), mark())) {  // peers may still pull from us
      epochs_->begin(1);
      for (int r : world_.local_ranks()) {
        world_.bind(r);
        StreamContext sc{&world_, r, world_.stream(r), "ag_gemm(unfused)", epochs_->counter(r)};
        rank_barrier(sc, ws_.view(r), plans_[r].ws.barrier, epochs_->value(r, 1));
      }
    }
    std::vector<void*> gathered(world_.size(), nullptr);
    for (int r : world_.local_ranks()) gathered[r] = ws_.view(r).local(plans_[r].ws.gathered);
    lanes_->nccl_all_gather_rows(plans_[r0].comm.parts, plans_[r0].k, a, gathered);
    for (int r : world_.local_ranks()) {  // C_r [M, N_r] = gathered A [M, K] * B_r^T
      world_.bind(r);
      const AgGemmPlan& p = plans_[r];
      detail::cublas_gemm_bf16_tn(lanes_->cublas(r), gathered[r], b[r], c[r], p.m(), p.n, p.k);
    }
    lanes_->nccl_done(mark());
    return;
  }
  epochs_->begin(2);
  // AllGather on the copy engine, every rank: barrier, own segment into every rank, barrier.
  // NOTE: all of it is enqueued before any cuBLAS call, so a failing call cannot strand a peer's
  // stream wait.
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    const AgGemmPlan& p = plans_[r];
    StreamContext sc{&world_, r, world_.stream(r), "ag_gemm(unfused)", epochs_->counter(r)};
    const uint64_t e1 = epochs_->value(r, 1), e2 = epochs_->value(r, 2);
    SymmetricView heap = ws_.view(r);
    const int64_t rb = p.row_bytes();
    const RowRange own{p.comm.parts.begin(r), p.comm.parts.end(r)};
    rank_barrier(sc, heap, p.ws.barrier, e1);
    for (int s = 0; s < world_.size() && own.size() > 0; ++s) {
      int peer = peer_at(r, s, world_.size());
      rank_copy_data(sc, peer, Copy2D{a[r], rb, heap.peer(peer, p.ws.gathered) + own.begin * rb,
                                      rb, own.size(), rb});
    }
    rank_barrier(sc, heap, p.ws.barrier, e2);
  }
  // cuBLAS: C_r [M, N_r] = gathered A [M, K] * B_r^T.
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    const AgGemmPlan& p = plans_[r];
    detail::cublas_gemm_bf16_tn(lanes_->cublas(r), ws_.view(r).local(p.ws.gathered), b[r], c[r], p.m(),
                                p.n, p.k);
  }
}

PathChoice AgGemm::choose(OpPath requested) const {
  const int r0 = world_.local_ranks().front();
  MachineModel m = detail::machine_model(world_, r0, gemm_sms(r0));
  // NOTE: every rank must take the same path (one process per rank on ipc decides alone), so the
  // choice is made from every rank's plan, on this GPU's model (the ranks' GPUs alike).
  return agreed_choice(world_.size(), r0, requested, [&](int r) {
    m.own_rows_direct = own_direct(r);
    return choose_path(plans_[r], m, requested);
  });
}

void AgGemm::run_auto(const std::vector<const void*>& a, const std::vector<const void*>& b,
                    const std::vector<void*>& c, OpPath requested) {
  if (choose(requested).path == OpPath::kFused) run(a, b, c);
  else run_unfused(a, b, c);
}

}  // namespace tilelink::cuda
