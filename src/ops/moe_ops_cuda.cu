// MoE layers over the ranks of a world (include/tilelink/ops/moe_ops_cuda.hpp): the plans of
// ops/moe_plan.hpp, the AllGather and ReduceScatter comm programs, a cuda::MoeLayer per rank, on
// the fused-op runtime (fused_runtime.hpp).
#include "tilelink/ops/moe_ops_cuda.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "fused_runtime.hpp"
#include "cuda/tile_done_hooks.cuh"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/cuda/comm.hpp"

namespace tilelink::cuda {

using detail::LaunchOrder;
namespace sm90 = compute::sm90;

namespace {

// Layer 0's link from the comm program to the grouped GEMM (a dynamic mapping, from the routing
// tables): before a tile's loads, each lane of a load warp maps a quarter of the tile's grouped
// rows to their tokens' comm tiles (grouped row -> pair -> token -> the owner's segment), the warp
// ORs the lanes' masks, and lane t waits for comm tile t where the mask holds it (bounded, quiet:
// no function call inside the engine; system scope: the copy engine's stream write-values).
// Both load warps of the gathered path call it; each waits before its own loads.
struct TokenTileWaitHooks {
  static constexpr bool kWaits = true;
  static constexpr bool kNotifies = false;
  DeviceContext ctx;
  SymmetricView heap;
  Field<Signal> tile_ready;  // the X AllGather's
  SegmentTiling comm;        // its comm tiles over the tokens (at most 32)
  const int64_t* pair_of_row = nullptr;
  int topk = 1;
  Epoch call;  // read per tile: a graph replay's epoch is on the device

  __device__ void before_tile_loads(const sm90::TileWork& w) const {
    unsigned lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    uint32_t need = 0;
    for (int64_t i = w.region.row + lane; i < w.region.row + w.region.rows; i += 32)
      need |= 1u << comm.tile_of_row(pair_of_row[i] / topk);
    need = __reduce_or_sync(0xffffffffu, need);
    if (need >> lane & 1u)
      consumer_tile_wait<Scope::kSystem, Report::kQuiet>(ctx, heap, tile_ready, static_cast<int>(lane), call.value(),
                                                         WaitSite{SignalField::kTileReady, static_cast<int>(lane)});
    __syncwarp();
  }
};
static_assert(sm90::detail::const_callable_hooks<TokenTileWaitHooks>(),
              "TokenTileWaitHooks must stay const-callable: a per-warp copy lives in local memory");

// Layer 1's notify hook: a stored tile (m, n) of group g announced at pair_done[(first_tile_rows[g]
// + m) * tiles_n + n] = the call's epoch (GPU scope: the rank's own reduce reads it).
struct PairDoneHooks {
  static constexpr bool kWaits = false;
  static constexpr bool kNotifies = true;
  Signal* pair_done = nullptr;
  const int* first_tile_rows = nullptr;
  int tiles_n = 0;
  Epoch call;  // read per tile: a graph replay's epoch is on the device

  __device__ void after_tile_stored(const sm90::TileWork& w) const {
    signal_notify<Scope::kGpu>(pair_done + (first_tile_rows[w.group] + w.tile.m) * tiles_n + w.tile.n, call.value());
  }
};
static_assert(sm90::detail::const_callable_hooks<PairDoneHooks>(),
              "PairDoneHooks must stay const-callable: a per-warp copy lives in local memory");

// The hooks over rank r's tables: tiles_n from the width the launch of g takes.
PairDoneHooks pair_done_hooks(const MoeGemmRsPlan& p, const MoeLayer& layer, const SymmetricView& view,
                              const sm90::GroupedGemmArgs& g, Epoch call) {
  const int width = sm90::grouped_gemm_tile_n(g);
  const int tiles_n = static_cast<int>((p.hidden + width - 1) / width);
  const int64_t most = DynamicSegmentTiling::max_num_tiles(p.rows(), p.experts, sm90::kTileM) * tiles_n;
  TL_REQUIRE(most <= p.max_pair_tiles, "moe_gemm_rs: internal: the GEMM's " << most << " tiles exceed the plan's "
                                                                              << p.max_pair_tiles << " pair signals");
  return PairDoneHooks{view.local(p.pair_done), layer.first_tile_rows(), tiles_n, call};
}

template <class Hooks>
void launch_grouped(const sm90::GroupedGemmArgs& g, const Hooks& hooks, cudaStream_t stream) {
  if (g.in_type == DType::kBF16) {
    sm90::launch_grouped_gemm<cutlass::bfloat16_t, __nv_bfloat16>(g, hooks, stream);
  } else {
    sm90::launch_grouped_gemm<cutlass::half_t, __half>(g, hooks, stream);
  }
}

// Baseline (b)'s GEMMs on `stream`: C_e = A_e · B_eᵀ over expert e's grouped rows of this call's
// routing, one cuBLAS call a non-empty expert (what the largest published MoE speedups compare
// against). The sizes come back to the host first: the stream is synchronized (not capturable).
void expert_loop(const MoeLayer& layer, cublasHandle_t handle, std::vector<int64_t>& offsets, const void* a,
                 const void* b, void* c, int64_t n, int64_t k, cudaStream_t stream) {
  offsets.resize(layer.experts() + 1);
  TL_CUDA_CHECK(cudaMemcpyAsync(offsets.data(), layer.offsets(), offsets.size() * sizeof(int64_t),
                                cudaMemcpyDeviceToHost, stream));
  TL_CUDA_CHECK(cudaStreamSynchronize(stream));
  TL_CUBLAS_CHECK(cublasSetStream(handle, stream));
  const int64_t eb = dtype_size(layer.dtype());
  auto at = [&](const void* p, int64_t elems) { return static_cast<const std::byte*>(p) + elems * eb; };
  for (int e = 0; e < layer.experts(); ++e) {
    const int64_t m = offsets[e + 1] - offsets[e];
    if (m == 0) continue;
    detail::cublas_gemm_tn(handle, at(a, offsets[e] * k), at(b, e * n * k),
                           const_cast<std::byte*>(at(c, offsets[e] * n)), m, n, k, layer.dtype());
  }
}

// What both layers check of their shape on the CUDA backend (the plans check the rest).
void check_moe_shape(const char* op, const World& world, const RowPartition& tokens, int64_t hidden,
                     const std::vector<int64_t>& ffn_per_rank, DType dtype) {
  const int W = world.size();
  TL_REQUIRE(tokens.world_size == W, op << ": the token partition has " << tokens.world_size << " ranks, the world "
                                        << W);
  TL_REQUIRE(W <= kMoeMaxWorld, op << ": at most " << kMoeMaxWorld << " ranks on the CUDA backend, got " << W);
  TL_REQUIRE(static_cast<int>(ffn_per_rank.size()) == W,
             op << ": " << ffn_per_rank.size() << " F_r values for a world of " << W);
  TL_REQUIRE(dtype == DType::kBF16 || dtype == DType::kF16,
             op << " on the CUDA backend takes bf16 or fp16, got " << dtype_name(dtype));
  TL_REQUIRE(tokens.total() >= 1, op << ": the CUDA backend needs at least one token, got " << tokens.total());
  TL_REQUIRE(hidden % 8 == 0, op << ": H must be a multiple of 8 (16-byte rows), got " << hidden);
  for (int r = 0; r < W; ++r)
    TL_REQUIRE(ffn_per_rank[r] >= 8 && ffn_per_rank[r] % 8 == 0,
               op << ": F_" << r << " must be a positive multiple of 8, got " << ffn_per_rank[r]);
}

Agreement moe_agreement(const char* op, const RowPartition& tokens, int64_t hidden,
                        const std::vector<int64_t>& ffn_per_rank, int experts, int topk, DType dtype) {
  Agreement a(op);
  a.add("world", tokens.world_size).add("dtype", static_cast<int64_t>(dtype)).add("tokens", tokens);
  a.add("H", hidden).add("F", ffn_per_rank).add("experts", experts).add("topk", topk);
  return a;
}

}  // namespace

// ---- layer 0 ----------------------------------------------------------------------------------

MoeAgGemm::MoeAgGemm(World& world, const RowPartition& tokens, int64_t hidden,
                     const std::vector<int64_t>& ffn_per_rank, int experts, int topk, DType dtype)
    : world_(world) {
  check_moe_shape("moe_ag_gemm", world, tokens, hidden, ffn_per_rank, dtype);
  // A comm tile is a rank's whole segment: one copy-engine move and one announcement a rank and
  // tensor (the copy engine's operations are costly and its queue finite: sp_attn's note).
  MoeAgGemmConfig config;
  config.comm_tile_rows = static_cast<int>(std::max<int64_t>(1, tokens.max_size()));
  for (int r = 0; r < world.size(); ++r)
    plans_.push_back(MoeAgGemmPlan::make(r, tokens, hidden, ffn_per_rank[r], experts, topk, dtype, config));
  TL_REQUIRE(plans_[0].x.tiles.num_tiles() <= kMoeMaxWorld, "moe_ag_gemm: internal: " << plans_[0].x.tiles.num_tiles()
                                                                                      << " comm tiles, at most "
                                                                                      << kMoeMaxWorld);
  rt_ = std::make_unique<detail::FusedRuntime>(
      world, "moe_ag_gemm", moe_agreement("moe_ag_gemm", tokens, hidden, ffn_per_rank, experts, topk, dtype),
      plans_[0].ws_bytes);
  layers_.resize(world.size());
  for (int r : world.local_ranks()) {
    world.bind(r);
    layers_[r] = std::make_unique<MoeLayer>(tokens.total(), hidden, ffn_per_rank[r], experts, topk, dtype);
    // Both grouped GEMMs loaded in this context while nothing spins: their tables are still empty
    // (no tiles), so these launches do nothing.
    void* any = rt_->view(r).local(plans_[r].x.f.gathered);
    enqueue_grouped(r, any, any, true, rt_->gemm_stream(r));
    enqueue_grouped(r, any, any, false, rt_->gemm_stream(r));
    TL_CUDA_CHECK(cudaStreamSynchronize(rt_->gemm_stream(r)));
  }
}

MoeAgGemm::~MoeAgGemm() = default;

int MoeAgGemm::gemm_sms(int rank) const { return rt_->split(rank, 0, 0).gemm_sms; }

const int32_t* MoeAgGemm::gathered_ids(int rank) const {
  return reinterpret_cast<const int32_t*>(rt_->view(rank).local(plans_.at(rank).ids.f.gathered));
}
const float* MoeAgGemm::gathered_weights(int rank) const {
  return reinterpret_cast<const float*>(rt_->view(rank).local(plans_.at(rank).weights.f.gathered));
}

void MoeAgGemm::check_args(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                           const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                           const std::vector<void*>& out) const {
  auto no_tokens = [&](int r) { return plans_[r].x.own_rows().size() == 0; };
  rt_->check_operand("X", x, true, no_tokens);
  rt_->check_operand("topk_ids", ids, false, no_tokens);
  rt_->check_operand("topk_weights", weights, false, no_tokens);
  rt_->check_operand("W1", w1);
  rt_->check_operand("out", out);
}

void MoeAgGemm::enqueue_grouped(int r, const void* w1, void* out, bool hooked, cudaStream_t stream) {
  const MoeAgGemmPlan& p = plans_[r];
  MoeLayer& layer = *layers_[r];
  const void* gathered = rt_->view(r).local(p.x.f.gathered);
  if (!hooked) {  // the baseline: X gathered into grouped order on every SM, then the GEMM
    layer.set_gemm_sms(world_.sm_count(r));
    sm90::GroupedGemmArgs g = layer.grouped_args(layer.xs(), nullptr, w1, out, p.ffn, p.hidden);
    return launch_grouped(g, sm90::NoHooks{}, stream);
  }
  layer.set_gemm_sms(gemm_sms(r));
  sm90::GroupedGemmArgs g = layer.grouped_args(gathered, layer.pair_of_row(), w1, out, p.ffn, p.hidden);
  g.tile_row_order = layer.tile_row_order();  // the rank's own tokens first, then as the peers' arrive
  const TokenTileWaitHooks hooks{world_.device_context(r), rt_->view(r), p.x.f.tile_ready, p.x.tiles,
                                 layer.pair_of_row(), p.topk, rt_->started() ? rt_->epoch(r) : Epoch{0}};
  launch_grouped(g, hooks, stream);
}

void MoeAgGemm::world1(const void* x, const int32_t* ids, const float* weights, const void* w1, void* out,
                       MoePath path, bool expert_loop_gemm) {
  // nothing to gather: the layer alone on the caller's tensors
  rt_->world1([&](int r) {
    MoeLayer& layer = *layers_[r];
    const MoeAgGemmPlan& p = plans_[r];
    const cudaStream_t stream = rt_->gemm_stream(r);
    layer.set_gemm_sms(0);
    layer.route(ids, stream);
    if (expert_loop_gemm) {  // baseline (b): the gather, then one cuBLAS GEMM an expert
      layer.gather(x, layer.xs(), stream);
      expert_loop(layer, rt_->lanes().cublas(r), loop_offsets_, layer.xs(), w1, out, p.ffn, p.hidden, stream);
    } else {
      layer.layer0(x, w1, p.ffn, out, path, stream);
    }
    // what gathered_ids() and gathered_weights() give layer 1
    TL_CUDA_CHECK(cudaMemcpyAsync(rt_->view(r).local(p.ids.f.gathered), ids, p.rows() * sizeof(int32_t),
                                  cudaMemcpyDeviceToDevice, stream));
    TL_CUDA_CHECK(cudaMemcpyAsync(rt_->view(r).local(p.weights.f.gathered), weights, p.rows() * sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream));
  });
}

void MoeAgGemm::run(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                    const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                    const std::vector<void*>& out) {
  check_args(x, ids, weights, w1, out);
  if (world_.size() == 1)  // X's rows read by index
    return world1(x[0], ids[0], weights[0], w1[0], out[0], MoePath::kFused);
  rt_->begin(1);
  // A GPU per rank: the GEMM holds every SM, and a copy inside one GPU may need SMs, so the own
  // rows are moved and announced before the fork (the peers' come by the copy engines beside it).
  const bool own_first = rt_->gpu_per_rank();
  rt_->fused_call(
      LaunchOrder::kComputeFirst,
      [&](int r) {
        if (own_first) enqueue_comm(r, x[r], ids[r], weights[r], AllGatherPart::kOwn);
      },
      [&](int r) { enqueue_compute(r, w1[r], out[r]); },
      [&](int r) { enqueue_comm(r, x[r], ids[r], weights[r], own_first ? AllGatherPart::kRemote : AllGatherPart::kAll); });
}

void MoeAgGemm::enqueue_compute(int r, const void* w1, void* out) {
  // the routing once every ids tile is in, then the GEMM waiting per tile
  const MoeAgGemmPlan& p = plans_[r];
  StreamContext sc = rt_->stream_context(r);
  sc.stream = rt_->gemm_stream(r);
  for (int s = 0; s < p.ids.tiles.num_tiles(); ++s)
    consumer_tile_wait(sc, rt_->view(r), p.ids.f.tile_ready, s, rt_->value(r), WaitSite{SignalField::kTileReady, s});
  layers_[r]->route(gathered_ids(r), sc.stream);
  layers_[r]->order_by_arrival(p.x.tiles.parts, r, sc.stream);
  enqueue_grouped(r, w1, out, true, sc.stream);
}

void MoeAgGemm::enqueue_comm(int r, const void* x, const int32_t* ids, const float* weights, AllGatherPart part) {
  // the AllGathers in sequence on the copy engine: ids, X, then the weights (kOwn: the barrier and
  // the own rows of each; kRemote: the peers' rows of each)
  const MoeAgGemmPlan& p = plans_[r];
  const StreamExec ex{rt_->stream_context(r), rt_->view(r)};
  const uint64_t epoch = rt_->value(r);
  if (part != AllGatherPart::kRemote) ex.barrier(p.barrier, epoch);
  const std::pair<const AllGatherPlan*, const void*> programs[] = {{&p.ids, ids}, {&p.x, x}, {&p.weights, weights}};
  for (const auto& [plan, a] : programs) {
    if (part == AllGatherPart::kOwn) allgather_own_rows(ex, *plan, epoch, a);
    else allgather_items(ex, *plan, epoch, a, part == AllGatherPart::kRemote);
  }
}

void MoeAgGemm::run_comm_only(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                              const std::vector<const float*>& weights) {
  rt_->require_eager("run_comm_only");
  TL_REQUIRE(world_.size() > 1, "moe_ag_gemm: run_comm_only needs a world of more than one rank");
  rt_->begin(1);
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    enqueue_comm(r, x[r], ids[r], weights[r], AllGatherPart::kAll);
  }
}

void MoeAgGemm::run_compute_only(const std::vector<const void*>& w1, const std::vector<void*>& out) {
  // NOTE: the current epoch's signals are all set by the last comm run: the waits pass at once.
  rt_->require_eager("run_compute_only");
  rt_->require_started("run_compute_only", "a comm run");
  TL_REQUIRE(world_.size() > 1, "moe_ag_gemm: run_compute_only needs a world of more than one rank");
  rt_->each_on_gemm_stream([&](int r) { enqueue_compute(r, w1[r], out[r]); });
}

void MoeAgGemm::run_unfused(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                            const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                            const std::vector<void*>& out) {
  unfused(x, ids, weights, w1, out, false);
}

void MoeAgGemm::run_expert_loop(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                                const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                                const std::vector<void*>& out) {
  rt_->require_eager("run_expert_loop");
  unfused(x, ids, weights, w1, out, true);
}

void MoeAgGemm::unfused(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                        const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                        const std::vector<void*>& out, bool expert_loop_gemm) {
  check_args(x, ids, weights, w1, out);
  auto compute = [&](int r, cudaStream_t stream) {  // the routing, the gather, the GEMM
    world_.bind(r);
    MoeLayer& layer = *layers_[r];
    const MoeAgGemmPlan& p = plans_[r];
    layer.route(gathered_ids(r), stream);
    layer.gather(rt_->view(r).local(p.x.f.gathered), layer.xs(), stream);
    if (!expert_loop_gemm) return enqueue_grouped(r, w1[r], out[r], false, stream);
    expert_loop(layer, rt_->lanes().cublas(r), loop_offsets_, layer.xs(), w1[r], out[r], p.ffn, p.hidden, stream);
  };
  if (world_.size() == 1)
    return world1(x[0], ids[0], weights[0], w1[0], out[0], MoePath::kUnfused, expert_loop_gemm);
  const Field<Signal> barrier = plans_[rt_->first_rank()].barrier;
  if (rt_->nccl()) {  // NCCL's AllGathers (a copy: any 4-byte or 2-byte data as bf16 elements)
    return rt_->nccl_call(barrier, [&] {
      const MoeAgGemmPlan& p0 = plans_[rt_->first_rank()];
      std::vector<void*> gi(world_.size()), gx(world_.size()), gw(world_.size());
      std::vector<const void*> si(world_.size()), sx(world_.size()), sw(world_.size());
      for (int r : world_.local_ranks()) {
        gi[r] = rt_->view(r).local(plans_[r].ids.f.gathered), si[r] = ids[r];
        gx[r] = rt_->view(r).local(plans_[r].x.f.gathered), sx[r] = x[r];
        gw[r] = rt_->view(r).local(plans_[r].weights.f.gathered), sw[r] = weights[r];
      }
      rt_->lanes().nccl_all_gather_rows(p0.x.tiles.parts, p0.ids.row_bytes / 2, si, gi);
      rt_->lanes().nccl_all_gather_rows(p0.x.tiles.parts, p0.x.row_bytes / 2, sx, gx);
      rt_->lanes().nccl_all_gather_rows(p0.x.tiles.parts, p0.weights.row_bytes / 2, sw, gw);
      for (int r : world_.local_ranks()) compute(r, world_.stream(r));
    });
  }
  // The copy engine, every rank: barrier, its rows into every rank, barrier; all of it enqueued
  // before any kernel, so a failing launch cannot strand a peer's stream wait.
  rt_->own_call(barrier, [&] {
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      const MoeAgGemmPlan& p = plans_[r];
      const StreamContext sc = rt_->stream_context(r, true);
      SymmetricView heap = rt_->view(r);
      const RowRange own = p.x.own_rows();
      for (int s = 0; s < world_.size() && own.size() > 0; ++s) {
        const int peer = peer_at(r, s, world_.size());
        rank_copy_data(sc, peer, p.ids.rows_copy(ids[r], own.begin, heap.peer(peer, p.ids.f.gathered), own));
        rank_copy_data(sc, peer, p.x.rows_copy(x[r], own.begin, heap.peer(peer, p.x.f.gathered), own));
        rank_copy_data(sc, peer, p.weights.rows_copy(weights[r], own.begin, heap.peer(peer, p.weights.f.gathered), own));
      }
      rank_barrier(sc, heap, p.barrier, rt_->value(r, 2));
    }
    for (int r : world_.local_ranks()) compute(r, world_.stream(r));
  });
}

PathChoice MoeAgGemm::choose(OpPath requested) const {
  return rt_->choose(requested, gemm_sms(rt_->first_rank()),
                     [&](int r, const MachineModel& m) { return choose_path(plans_[r], m, requested); });
}

void MoeAgGemm::run_auto(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                         const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                         const std::vector<void*>& out, OpPath requested) {
  detail::run_chosen(*this, requested, x, ids, weights, w1, out);
}

// ---- layer 1 ----------------------------------------------------------------------------------

// Per local rank, the lane of the top-k reduce beside the GEMM: a stream of the rank's context,
// forked from the GEMM stream and joined back, and the reduce's claim counter.
struct MoeGemmRs::ReduceLanes {
  World& world;
  std::vector<cudaStream_t> stream;
  std::vector<cudaEvent_t> fork, join;
  std::vector<unsigned*> claims;

  explicit ReduceLanes(World& w)
      : world(w), stream(w.size(), nullptr), fork(w.size(), nullptr), join(w.size(), nullptr), claims(w.size(), nullptr) {
    for (int r : w.local_ranks()) {
      w.bind(r);
      stream[r] = w.create_stream(r);
      TL_CUDA_CHECK(cudaEventCreateWithFlags(&fork[r], cudaEventDisableTiming));
      TL_CUDA_CHECK(cudaEventCreateWithFlags(&join[r], cudaEventDisableTiming));
      TL_CUDA_CHECK(cudaMalloc(&claims[r], sizeof(unsigned)));
    }
  }
  ~ReduceLanes() {
    // NOTE: not checked: a destructor must not throw, and after a device fault every call fails.
    for (int r : world.local_ranks()) {
      world.bind(r);
      if (claims[r]) (void)cudaFree(claims[r]);
      if (fork[r]) (void)cudaEventDestroy(fork[r]);
      if (join[r]) (void)cudaEventDestroy(join[r]);
      if (stream[r]) (void)cudaStreamDestroy(stream[r]);
    }
  }
  ReduceLanes(const ReduceLanes&) = delete;
  ReduceLanes& operator=(const ReduceLanes&) = delete;
};

MoeGemmRs::MoeGemmRs(World& world, const RowPartition& tokens, int64_t hidden,
                     const std::vector<int64_t>& ffn_per_rank, int experts, int topk, DType dtype)
    : world_(world) {
  check_moe_shape("moe_gemm_rs", world, tokens, hidden, ffn_per_rank, dtype);
  TL_REQUIRE(hidden <= (int64_t{1} << 30), "moe_gemm_rs: H = " << hidden << " is out of range");
  // The pair tiles are the grouped GEMM's (kTileM rows x its width over H); the ReduceScatter's
  // producer tiles are the top-k reduce's: kMoeReduceTileRows tokens x H; its items are a warp's
  // bands.
  MoeGemmRsConfig config;
  config.tile_m = sm90::kTileM;
  config.tile_n = sm90::grouped_gemm_pick_tile_n(hidden);
  config.reduce_tile_m = kMoeReduceTileRows;
  config.reduce_tile_n = static_cast<int>(hidden);
  config.band_rows = kReduceBandRows;
  for (int r = 0; r < world.size(); ++r)
    plans_.push_back(MoeGemmRsPlan::make(r, tokens, hidden, ffn_per_rank[r], experts, topk, dtype, config));
  rt_ = std::make_unique<detail::FusedRuntime>(
      world, "moe_gemm_rs", moe_agreement("moe_gemm_rs", tokens, hidden, ffn_per_rank, experts, topk, dtype),
      plans_[0].ws_bytes);
  lanes_ = std::make_unique<ReduceLanes>(world);
  layers_.resize(world.size());
  for (int r : world.local_ranks()) {
    world.bind(r);
    TL_REQUIRE(reduce_sms(r) + topk_sms(r) + 1 < world.sm_count(r),
               "moe_gemm_rs: rank " << r << " has " << world.sm_count(r) << " SMs, too few for the reduce and the GEMM");
    layers_[r] = std::make_unique<MoeLayer>(tokens.total(), hidden, ffn_per_rank[r], experts, topk, dtype);
    // Both grouped GEMMs loaded in this context while nothing spins (empty tables: no tiles).
    MoeLayer& layer = *layers_[r];
    layer.set_gemm_sms(world.sm_count(r));
    const sm90::GroupedGemmArgs g = layer.grouped_args(layer.y(), nullptr, layer.y(), layer.y(), hidden, ffn_per_rank[r]);
    launch_grouped(g, sm90::NoHooks{}, world.stream(r));
    launch_grouped(g, pair_done_hooks(plans_[r], layer, rt_->view(r), g, Epoch{0}), world.stream(r));
    TL_CUDA_CHECK(cudaStreamSynchronize(world.stream(r)));
  }
}

MoeGemmRs::~MoeGemmRs() = default;

int MoeGemmRs::reduce_sms(int rank) const { return std::clamp(world_.sm_count(rank) / 8, 1, 16); }

int MoeGemmRs::topk_sms(int rank) const {
  return reduce_beside_gemm_ ? std::clamp(world_.sm_count(rank) / 16, 1, 8) : 0;
}

int MoeGemmRs::gemm_sms(int rank) const { return rt_->split(rank, 0, reduce_sms(rank) + topk_sms(rank)).gemm_sms; }

void MoeGemmRs::set_reduce_beside_gemm(bool beside) { reduce_beside_gemm_ = beside; }

void MoeGemmRs::set_completion_keys(int keys) {
  TL_REQUIRE(keys >= 1 && keys <= kMoeOrderKeys,
             "moe_gemm_rs: completion keys must be in [1, " << kMoeOrderKeys << "], got " << keys);
  completion_keys_ = keys;
}

void MoeGemmRs::check_args(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                           const std::vector<const float*>& weights, const std::vector<const void*>& w2,
                           const std::vector<void*>& c) const {
  rt_->check_operand("H1", h1);
  rt_->check_operand("topk_ids", ids, false);
  rt_->check_operand("topk_weights", weights, false);
  rt_->check_operand("W2", w2);
  rt_->check_operand("C", c, true, [&](int r) { return plans_[r].rs.rows.size(r) == 0; });
}

void MoeGemmRs::enqueue_partial(int r, const void* h1, const int32_t* ids, const float* weights, const void* w2,
                                bool fused, cudaStream_t stream, bool expert_loop_gemm) {
  const MoeGemmRsPlan& p = plans_[r];
  MoeLayer& layer = *layers_[r];
  void* partial = rt_->view(r).local(p.rs.f.partial);
  layer.route(ids, stream);
  layer.set_gemm_sms(fused ? gemm_sms(r) : world_.sm_count(r));
  // The next rank's tokens first: the owner the ReduceScatter serves first.
  const int next = (r + 1) % world_.size();
  const int first = static_cast<int>(p.rs.rows.begin(next) / kMoeReduceTileRows);
  Signal* tile_done = rt_->view(r).local(p.rs.f.tile_done);
  if (fused && reduce_beside_gemm_) {
    // The GEMM walks its tile rows in completion order and announces each tile; the reduce, on its
    // own SMs on the side stream, takes its tiles as their rows are stored; once the GEMM is done
    // its SMs take the tiles left (one claim counter).
    layer.order_by_completion(MoeCompletion::make(p.tokens(), kMoeReduceTileRows, first, completion_keys_), stream);
    TL_CUDA_CHECK(cudaMemsetAsync(lanes_->claims[r], 0, sizeof(unsigned), stream));
    TL_CUDA_CHECK(cudaEventRecord(lanes_->fork[r], stream));
    TL_CUDA_CHECK(cudaStreamWaitEvent(lanes_->stream[r], lanes_->fork[r], 0));
    sm90::GroupedGemmArgs g = layer.grouped_args(h1, nullptr, w2, layer.y(), p.hidden, p.ffn);
    g.tile_row_order = layer.tile_row_order();
    const PairDoneHooks hooks = pair_done_hooks(p, layer, rt_->view(r), g, rt_->epoch(r));
    const MoeReduceLink link{hooks.pair_done, hooks.tiles_n, lanes_->claims[r], world_.device_context(r)};
    layer.topk_reduce_tiles(layer.y(), weights, partial, kMoeReduceTileRows, first, tile_done, rt_->epoch(r),
                            topk_sms(r), lanes_->stream[r], &link);
    launch_grouped(g, hooks, stream);
    layer.topk_reduce_tiles(layer.y(), weights, partial, kMoeReduceTileRows, first, tile_done, rt_->epoch(r),
                            gemm_sms(r), stream, &link);
    TL_CUDA_CHECK(cudaEventRecord(lanes_->join[r], lanes_->stream[r]));
    TL_CUDA_CHECK(cudaStreamWaitEvent(stream, lanes_->join[r], 0));
    return;
  }
  if (expert_loop_gemm)
    expert_loop(layer, rt_->lanes().cublas(r), loop_offsets_, h1, w2, layer.y(), p.hidden, p.ffn, stream);
  else
    launch_grouped(layer.grouped_args(h1, nullptr, w2, layer.y(), p.hidden, p.ffn), sm90::NoHooks{}, stream);
  if (!fused) return layer.topk_reduce(layer.y(), weights, partial, stream);
  layer.topk_reduce_tiles(layer.y(), weights, partial, kMoeReduceTileRows, first, tile_done, rt_->epoch(r),
                          gemm_sms(r), stream);
}

void MoeGemmRs::run(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                    const std::vector<const float*>& weights, const std::vector<const void*>& w2,
                    const std::vector<void*>& c) {
  check_args(h1, ids, weights, w2, c);
  if (world_.size() == 1)  // nothing to reduce over ranks: the layer alone, into C
    return rt_->world1([&](int r) {
      MoeLayer& layer = *layers_[r];
      layer.set_gemm_sms(0);
      layer.route(ids[r], rt_->gemm_stream(r));
      layer.layer1(h1[r], w2[r], weights[r], c[r], rt_->gemm_stream(r));
    });
  rt_->begin(1);
  rt_->fused_call(
      LaunchOrder::kCommFirst,
      // The entry barrier: the previous call's reads of every partial are done.
      [&](int r) { rt_->entry_barrier(r, plans_[r].barrier); },
      [&](int r) {
        enqueue_partial(r, h1[r], ids[r], weights[r], w2[r], true, rt_->gemm_stream(r));
        // Once its partial is out, the GEMM's SMs join the ReduceScatter: its warps claim the bands
        // still left (the workers share one counter, tagged with the call's epoch).
        launch_reduce_scatter(world_, plans_[r].rs, rt_->view(r), c[r], rt_->epoch(r),
                              CommLaunch{CopyMethod::kVector, gemm_sms(r), 512, rt_->gemm_stream(r)});
      },
      // The ReduceScatter on its own SMs, launched before the GEMM takes the rest.
      [&](int r) {
        launch_reduce_scatter(world_, plans_[r].rs, rt_->view(r), c[r], rt_->epoch(r),
                              CommLaunch{CopyMethod::kVector, reduce_sms(r)});
      });
}

void MoeGemmRs::run_unfused(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                            const std::vector<const float*>& weights, const std::vector<const void*>& w2,
                            const std::vector<void*>& c) {
  unfused(h1, ids, weights, w2, c, false);
}

void MoeGemmRs::run_expert_loop(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                                const std::vector<const float*>& weights, const std::vector<const void*>& w2,
                                const std::vector<void*>& c) {
  rt_->require_eager("run_expert_loop");
  unfused(h1, ids, weights, w2, c, true);
}

void MoeGemmRs::unfused(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                        const std::vector<const float*>& weights, const std::vector<const void*>& w2,
                        const std::vector<void*>& c, bool expert_loop_gemm) {
  check_args(h1, ids, weights, w2, c);
  if (world_.size() == 1) {
    if (!expert_loop_gemm) return run(h1, ids, weights, w2, c);  // one path at world 1
    return rt_->world1([&](int r) {  // the loop's Y, then the top-k reduce straight into C
      MoeLayer& layer = *layers_[r];
      const MoeGemmRsPlan& p = plans_[r];
      layer.route(ids[r], rt_->gemm_stream(r));
      expert_loop(layer, rt_->lanes().cublas(r), loop_offsets_, h1[r], w2[r], layer.y(), p.hidden, p.ffn,
                  rt_->gemm_stream(r));
      layer.topk_reduce(layer.y(), weights[r], c[r], rt_->gemm_stream(r));
    });
  }
  const Field<Signal> barrier = plans_[rt_->first_rank()].barrier;
  if (rt_->nccl()) {  // the partials, then NCCL's ReduceScatter
    return rt_->nccl_call(barrier, [&] {
      std::vector<const void*> partial(world_.size(), nullptr);
      for (int r : world_.local_ranks()) {
        world_.bind(r);
        enqueue_partial(r, h1[r], ids[r], weights[r], w2[r], false, world_.stream(r), expert_loop_gemm);
        partial[r] = rt_->view(r).local(plans_[r].rs.f.partial);
      }
      const MoeGemmRsPlan& p0 = plans_[rt_->first_rank()];
      rt_->lanes().nccl_reduce_scatter_rows(p0.rs.rows, p0.hidden, partial, c, p0.dtype);
    });
  }
  rt_->own_call(barrier, [&] {
    for (int r : world_.local_ranks()) {  // the partial, then published whole
      world_.bind(r);
      enqueue_partial(r, h1[r], ids[r], weights[r], w2[r], false, world_.stream(r), expert_loop_gemm);
      detail::launch_set_signals(rt_->view(r).local(plans_[r].rs.f.tile_done), plans_[r].rs.producer.num_tiles(),
                                 rt_->epoch(r, 2), world_.stream(r));
    }
    for (int r : world_.local_ranks())  // the ReduceScatter, on all the rank's SMs
      launch_reduce_scatter(world_, plans_[r].rs, rt_->view(r), c[r], rt_->epoch(r, 2),
                            CommLaunch{CopyMethod::kVector, world_.sm_count(r)});
  });
}

void MoeGemmRs::run_compute_only(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                                 const std::vector<const float*>& weights, const std::vector<const void*>& w2) {
  rt_->require_eager("run_compute_only");
  TL_REQUIRE(world_.size() > 1, "moe_gemm_rs: run_compute_only needs a world of more than one rank");
  rt_->begin(1);
  rt_->each_on_gemm_stream([&](int r) { enqueue_partial(r, h1[r], ids[r], weights[r], w2[r], true, rt_->gemm_stream(r)); });
}

void MoeGemmRs::run_comm_only(const std::vector<void*>& c) {
  // NOTE: reuses the current epoch, whose tile_done signals the last compute run set everywhere;
  // its band counter is zeroed first (the last call with this epoch claimed every band).
  rt_->require_eager("run_comm_only");
  rt_->require_started("run_comm_only", "a compute run");
  TL_REQUIRE(world_.size() > 1, "moe_gemm_rs: run_comm_only needs a world of more than one rank");
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    TL_CUDA_CHECK(cudaMemsetAsync(rt_->view(r).local(plans_[r].rs.f.claims), 0, sizeof(uint64_t), world_.stream(r)));
    launch_reduce_scatter(world_, plans_[r].rs, rt_->view(r), c[r], rt_->epoch(r),
                          CommLaunch{CopyMethod::kVector, reduce_sms(r)});
  }
}

PathChoice MoeGemmRs::choose(OpPath requested) const {
  return rt_->choose(requested, gemm_sms(rt_->first_rank()),
                     [&](int r, const MachineModel& m) { return choose_path(plans_[r], m, requested); });
}

void MoeGemmRs::run_auto(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                         const std::vector<const float*>& weights, const std::vector<const void*>& w2,
                         const std::vector<void*>& c, OpPath requested) {
  detail::run_chosen(*this, requested, h1, ids, weights, w2, c);
}

// ---- the whole layer --------------------------------------------------------------------------

namespace {

std::vector<int64_t> doubled(const std::vector<int64_t>& f) {
  std::vector<int64_t> d(f);
  for (auto& v : d) v *= 2;
  return d;
}

}  // namespace

MoeMlp::MoeMlp(World& world, const RowPartition& tokens, int64_t hidden, const std::vector<int64_t>& ffn_per_rank,
               int experts, int topk, DType dtype)
    : world_(world),
      layer0_(world, tokens, hidden, doubled(ffn_per_rank), experts, topk, dtype),
      layer1_(world, tokens, hidden, ffn_per_rank, experts, topk, dtype) {
  gate_up_.assign(world.size(), nullptr);
  act_.assign(world.size(), nullptr);
  const int64_t rows = tokens.total() * topk, eb = dtype_size(dtype);
  for (int r : world.local_ranks()) {
    world.bind(r);
    TL_CUDA_CHECK(cudaMalloc(&gate_up_[r], rows * 2 * ffn_per_rank[r] * eb));
    TL_CUDA_CHECK(cudaMalloc(&act_[r], rows * ffn_per_rank[r] * eb));
  }
}

MoeMlp::~MoeMlp() {
  // NOTE: not checked: a destructor must not throw, and a sticky error has been reported already.
  for (void* p : gate_up_)
    if (p != nullptr) (void)cudaFree(p);
  for (void* p : act_)
    if (p != nullptr) (void)cudaFree(p);
}

void MoeMlp::call(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                  const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                  const std::vector<const void*>& w2, const std::vector<void*>& out, bool fused,
                  bool expert_loop_gemm) {
  const int W = world_.size();
  TL_REQUIRE(static_cast<int>(w2.size()) == W && static_cast<int>(out.size()) == W,
             "moe_mlp: pass one W2 and one out entry per rank (" << W << ")");
  for (int r : world_.local_ranks())
    TL_REQUIRE(w2[r] != nullptr && (out[r] != nullptr || layer1_.plan(r).rs.rows.size(r) == 0),
               "moe_mlp: null tensor on rank " << r << " (W2 or out)");
  std::vector<void*> gate_up(gate_up_);
  std::vector<const void*> act(act_.begin(), act_.end());
  std::vector<const int32_t*> ids1(W, nullptr);
  std::vector<const float*> weights1(W, nullptr);
  for (int r : world_.local_ranks()) ids1[r] = layer0_.gathered_ids(r), weights1[r] = layer0_.gathered_weights(r);
  if (fused) layer0_.run(x, ids, weights, w1, gate_up);
  else if (expert_loop_gemm) layer0_.run_expert_loop(x, ids, weights, w1, gate_up);
  else layer0_.run_unfused(x, ids, weights, w1, gate_up);
  for (int r : world_.local_ranks()) {  // on the rank's stream, where layer 0's call ended
    world_.bind(r);
    layer0_.layer(r).activate_cols(gate_up_[r], act_[r], layer1_.plan(r).ffn, world_.stream(r));
  }
  if (fused) layer1_.run(act, ids1, weights1, w2, out);
  else if (expert_loop_gemm) layer1_.run_expert_loop(act, ids1, weights1, w2, out);
  else layer1_.run_unfused(act, ids1, weights1, w2, out);
}

void MoeMlp::run(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                 const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                 const std::vector<const void*>& w2, const std::vector<void*>& out) {
  call(x, ids, weights, w1, w2, out, true);
}

void MoeMlp::run_unfused(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                         const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                         const std::vector<const void*>& w2, const std::vector<void*>& out) {
  call(x, ids, weights, w1, w2, out, false);
}

void MoeMlp::run_expert_loop(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                             const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                             const std::vector<const void*>& w2, const std::vector<void*>& out) {
  call(x, ids, weights, w1, w2, out, false, true);
}

PathChoice MoeMlp::choose(OpPath requested) const {
  // one path for both layers: their predictions added, each on its GEMM's SMs
  const int r0 = world_.local_ranks().front();
  const MachineModel m0 = detail::machine_model(world_, r0, layer0_.gemm_sms(r0));
  const MachineModel m1 = detail::machine_model(world_, r0, layer1_.gemm_sms(r0));
  return agreed_choice(world_.size(), r0, requested, [&](int r) {
    return moe_mlp_choice(layer0_.plan(r), m0, layer1_.plan(r), m1, requested);
  });
}

void MoeMlp::run_auto(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                      const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                      const std::vector<const void*>& w2, const std::vector<void*>& out, OpPath requested) {
  detail::run_chosen(*this, requested, x, ids, weights, w1, w2, out);
}

}  // namespace tilelink::cuda
