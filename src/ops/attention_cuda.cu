// Sequence-parallel attention on the CUDA backend: the copy-engine AllGather of K and V and the
// sm90 attention engine with a per-key/value-tile wait (see include/tilelink/ops/attention_cuda.hpp),
// on the fused-op runtime (fused_runtime.hpp).
#include "tilelink/ops/attention_cuda.hpp"

#include "fused_runtime.hpp"

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/compute/sm90/impl/attention_kernel.cuh"
#include "tilelink/core/error.hpp"

#include <algorithm>

namespace tilelink::cuda {

using detail::LaunchOrder;
namespace sm90 = compute::sm90;

namespace {

// The compute program's link to the comm program: before a key/value tile's loads, the engine's
// load thread waits for the K and V comm tiles covering its rows (the AllGather plans' channel
// mapping), system scope (the copy engine's stream write-values), the quiet form (no function call
// inside the engine).
struct SpAttnWaitHooks {
  static constexpr bool kWaits = true;
  static constexpr bool kNotifies = false;
  DeviceContext ctx;
  SymmetricView heap;
  Field<Signal> k_ready, v_ready;
  SegmentTiling comm;
  int64_t seq = 0;  // the keys the engine reads (a tile's rows past them are never waited for)
  int64_t walk_from = 0;  // the engine's kv_walk_from
  Epoch call;  // read per tile: a graph replay's epoch is on the device

  // Steps of the walk from walk_from's tile (down, then on from the last tile) the load thread has
  // seen in place. The comm program moves and announces the rows in that walk's order (own rows,
  // then rank - 1's, ...), so once a step's tiles are in, every earlier step's are: each comm tile
  // is waited for about once a block, not once an item.
  struct State {
    int known = 0;
  };

  __device__ void before_kv_tile(const sm90::AttnTileWork& w, State& state) const {
    const int tiles = static_cast<int>((seq + sm90::kAttnBlockN - 1) / sm90::kAttnBlockN);
    const int start = static_cast<int>(walk_from / sm90::kAttnBlockN);
    const int step = ((start - w.kv_tile) % tiles + tiles) % tiles;
    if (step < state.known) return;
    state.known = step + 1;
    const int64_t first = int64_t{w.kv_tile} * sm90::kAttnBlockN;
    const IdRange ids = comm.covering(RowRange{first, first + sm90::kAttnBlockN < seq ? first + sm90::kAttnBlockN : seq});
    const uint64_t target = call.value();
    for (int t = ids.begin; t < ids.end; ++t) {
      consumer_tile_wait<Scope::kSystem, Report::kQuiet>(ctx, heap, k_ready, t, target,
                                                         WaitSite{SignalField::kTileReady, t});
      consumer_tile_wait<Scope::kSystem, Report::kQuiet>(ctx, heap, v_ready, t, target,
                                                         WaitSite{SignalField::kTileReady, t});
    }
  }
};

}  // namespace

SpAttn::SpAttn(World& world, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype) : world_(world) {
  const int W = world.size();
  TL_REQUIRE(sharding.rows.world_size == W,
             "sp_attn: the sharding has " << sharding.rows.world_size << " ranks, the world " << W);
  TL_REQUIRE(sharding.shard == SeqShard::kContiguous,
             "sp_attn on the CUDA backend takes contiguous shards (zigzag runs on the CPU backend)");
  TL_REQUIRE(dtype == DType::kBF16 || dtype == DType::kF16,
             "sp_attn on the CUDA backend takes bf16 or fp16, got " << dtype_name(dtype));
  TL_REQUIRE(shape.head_dim == 64 || shape.head_dim == 128,
             "sp_attn on the CUDA backend takes head dim 64 or 128, got " << shape.head_dim);
  // A comm tile is a rank's whole segment: the copy engine moves it in one operation and announces
  // it with one. NOTE: with 128-row comm tiles (a move, or an announcement, a tile) a call put
  // ~1000 stream operations a rank in flight at S 65536 over two ranks, and the host's enqueue
  // blocked on the full queue behind a stream wait for a peer whose operations it had not yet
  // enqueued: the call never ran (measured on the H200; a move a tile was also ~25 us an operation).
  SpAttnConfig config;
  config.comm_tile_rows = static_cast<int>(std::max<int64_t>(1, sharding.rows.max_size()));
  for (int r = 0; r < W; ++r) plans_.push_back(SpAttnPlan::make(r, shape, sharding, dtype, config));
  Agreement agreement("sp_attn");
  agreement.add("world", W).add("dtype", static_cast<int64_t>(dtype)).add("S rows", sharding.rows);
  agreement.add("batch", shape.batch).add("heads_q", shape.heads_q).add("heads_kv", shape.heads_kv);
  agreement.add("head_dim", shape.head_dim).add("causal", static_cast<int64_t>(shape.causal));
  rt_ = std::make_unique<detail::FusedRuntime>(world, "sp_attn", std::move(agreement), plans_[0].ws_bytes);

  // Every kernel of a call loaded in every rank's context before any of them spins: one launch of
  // the hooked engine on a one-row problem whose waits pass (epoch 0).
  for (int r : world.local_ranks()) {
    world.bind(r);
    const int64_t kv_elems = int64_t{shape.heads_kv} * shape.head_dim, q_elems = int64_t{shape.heads_q} * shape.head_dim;
    void* buf = nullptr;
    TL_CUDA_CHECK(cudaMalloc(&buf, (2 * kv_elems + 2 * q_elems) * 2 + 4 * 64));
    auto* base = static_cast<std::byte*>(buf);
    sm90::AttnArgs a;
    a.q = base, a.o = base + q_elems * 2, a.k = base + 2 * q_elems * 2, a.v = base + (2 * q_elems + kv_elems) * 2;
    a.batch = 1, a.seq_q = a.seq_k = 1, a.heads_q = shape.heads_q, a.heads_kv = shape.heads_kv;
    a.head_dim = static_cast<int>(shape.head_dim), a.dtype = dtype, a.causal = shape.causal;
    const SpAttnPlan& p = plans_[r];
    SpAttnWaitHooks pass{world.device_context(r), rt_->view(r), p.k[0].f.tile_ready, p.v[0].f.tile_ready,
                         p.k[0].tiles, shape.seq, 0, Epoch{0}};
    a.num_sms = 1;
    sm90::attn_detail::launch_checked(a, pass, world.stream(r));
    TL_CUDA_CHECK(cudaStreamSynchronize(world.stream(r)));
    TL_CUDA_CHECK(cudaFree(buf));
  }
}

SpAttn::~SpAttn() = default;

int SpAttn::attention_sms(int rank) const { return rt_->split(rank, 0, 0).gemm_sms; }

void SpAttn::check_args(const std::vector<const void*>& q, const std::vector<const void*>& k,
                        const std::vector<const void*>& v, const std::vector<void*>& o,
                        const std::vector<float*>& lse) const {
  auto empty = [&](int r) { return plans_[r].local_rows() == 0; };
  rt_->check_operand("Q", q, true, empty);
  rt_->check_operand("K", k, true, empty);
  rt_->check_operand("V", v, true, empty);
  rt_->check_operand("O", o, true, empty);
  TL_REQUIRE(static_cast<int>(lse.size()) == world_.size(),
             "sp_attn: pass one lse entry per rank (" << world_.size() << "), got " << lse.size());
  bool any = false, all = true;
  for (int r : world_.local_ranks()) {
    if (empty(r)) continue;
    any = any || lse[r] != nullptr;
    all = all && lse[r] != nullptr;
  }
  TL_REQUIRE(any == all, "sp_attn: give lse on every rank or on none");
  if (any) rt_->check_operand("lse", lse, false, empty);
}

void SpAttn::enqueue_attention(int r, const void* q, void* o, float* lse, bool hooked, int sms, cudaStream_t stream) {
  const SpAttnPlan& p = plans_[r];
  const SpAttnShape& s = p.shape;
  const int64_t n = p.local_rows();
  if (n == 0) return;
  const int64_t eb = dtype_size(p.dtype), q_row = int64_t{s.heads_q} * s.head_dim;
  for (int b = 0; b < s.batch; ++b) {
    sm90::AttnArgs a;
    a.q = static_cast<const std::byte*>(q) + b * n * q_row * eb;
    a.o = static_cast<std::byte*>(o) + b * n * q_row * eb;
    a.k = rt_->view(r).local(p.k[b].f.gathered);
    a.v = rt_->view(r).local(p.v[b].f.gathered);
    if (lse != nullptr) {  // [B, S_r, Hq]
      a.lse = lse + b * n * s.heads_q;
      a.lse_stride_b = n * s.heads_q, a.lse_stride_s = s.heads_q, a.lse_stride_h = 1;
    }
    // Under the mask no query of the shard sees past its last row: the engine reads no key beyond it
    // (rows of later ranks are never gathered then; TMA reads them as zeros).
    a.batch = 1, a.seq_q = n, a.seq_k = s.causal ? p.sharding.rows.end(r) : s.seq;
    a.heads_q = s.heads_q, a.heads_kv = s.heads_kv, a.head_dim = static_cast<int>(s.head_dim);
    a.causal = s.causal, a.dtype = p.dtype;
    a.q_pos0 = p.sharding.rows.begin(r), a.kv_pos0 = 0;
    a.kv_walk_from = p.sharding.rows.end(r) - 1;  // the own rows first (fused and unfused alike: same bits)
    a.num_sms = sms;
    if (!hooked) {
      sm90::attn_detail::launch_checked(a, sm90::NoAttnHooks{}, stream);
      continue;
    }
    SpAttnWaitHooks wait{world_.device_context(r), rt_->view(r), p.k[b].f.tile_ready, p.v[b].f.tile_ready,
                         p.k[b].tiles, a.seq_k, a.kv_walk_from, rt_->epoch(r)};
    sm90::attn_detail::launch_checked(a, wait, stream);
  }
}

void SpAttn::enqueue_comm(int r, const void* k, const void* v) {
  const SpAttnPlan& p = plans_[r];
  const int W = p.world_size;
  const StreamExec x{rt_->stream_context(r), rt_->view(r)};
  const uint64_t epoch = rt_->value(r);
  x.barrier(p.barrier, epoch);
  const int64_t block = p.local_rows() * p.kv_row_bytes();  // a batch entry of this rank's K or V
  // The AllGather plan's pull items (a rank's segment each) in the attention's walk: the own
  // rows, then rank - 1's, ...; under the mask, later ranks' rows are never read and never moved.
  for (int b = 0; b < p.shape.batch; ++b) {
    const AllGatherPlan& kp = p.k[b];
    const int tiles = kp.tiles.num_tiles();
    const auto* kb = static_cast<const std::byte*>(k) + b * block;
    const auto* vb = static_cast<const std::byte*>(v) + b * block;
    for (int s = 0; s < W; ++s) {
      const int owner = ((r - s) % W + W) % W;
      if (p.shape.causal && owner > r) continue;
      for (int t = kp.tiles.first[owner + 1] - 1; t >= kp.tiles.first[owner]; --t) {  // one, or none
        const int item = ((t - kp.tiles.first[r]) % tiles + tiles) % tiles;       // pull_tile_at(item) == t
        allgather_item(x, kp, item, epoch, kb);
        allgather_item(x, p.v[b], item, epoch, vb);
      }
    }
  }
}

void SpAttn::run(const std::vector<const void*>& q, const std::vector<const void*>& k,
                 const std::vector<const void*>& v, const std::vector<void*>& o, const std::vector<float*>& lse) {
  check_args(q, k, v, o, lse);
  if (world_.size() == 1) {  // nothing to gather: the engine alone on the rank's own K and V
    return rt_->world1([&](int r) {
      const SpAttnPlan& p = plans_[r];
      const SpAttnShape& s = p.shape;
      sm90::AttnArgs a;
      a.q = q[r], a.k = k[r], a.v = v[r], a.o = o[r], a.lse = lse[r];
      if (lse[r] != nullptr) a.lse_stride_b = s.seq * s.heads_q, a.lse_stride_s = s.heads_q, a.lse_stride_h = 1;
      a.batch = s.batch, a.seq_q = a.seq_k = s.seq;
      a.heads_q = s.heads_q, a.heads_kv = s.heads_kv, a.head_dim = static_cast<int>(s.head_dim);
      a.causal = s.causal, a.dtype = p.dtype;
      sm90::attn_detail::launch_checked(a, sm90::NoAttnHooks{}, rt_->gemm_stream(r));
    });
  }
  rt_->begin(1);
  // Virtual ranks: every rank's engine (persistent, waiting per tile) is launched before any comm
  // program is enqueued, as AG+GEMM's (fused_runtime.hpp, LaunchOrder).
  rt_->fused_call(
      LaunchOrder::kComputeFirst, detail::NoStep{},
      [&](int r) { enqueue_attention(r, q[r], o[r], lse[r], true, attention_sms(r), rt_->gemm_stream(r)); },
      [&](int r) { enqueue_comm(r, k[r], v[r]); });
}

void SpAttn::run_comm_only(const std::vector<const void*>& k, const std::vector<const void*>& v) {
  rt_->require_eager("run_comm_only");
  TL_REQUIRE(world_.size() > 1, "sp_attn: run_comm_only needs a world of more than one rank");
  rt_->begin(1);
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    enqueue_comm(r, k[r], v[r]);
  }
}

void SpAttn::run_attention_only(const std::vector<const void*>& q, const std::vector<void*>& o,
                                const std::vector<float*>& lse) {
  rt_->require_eager("run_attention_only");
  rt_->require_started("run_attention_only", "a comm run");
  rt_->each_on_gemm_stream([&](int r) {
    enqueue_attention(r, q[r], o[r], lse[r], true, attention_sms(r), rt_->gemm_stream(r));
  });
}

void SpAttn::run_unfused(const std::vector<const void*>& q, const std::vector<const void*>& k,
                         const std::vector<const void*>& v, const std::vector<void*>& o,
                         const std::vector<float*>& lse) {
  check_args(q, k, v, o, lse);
  const Field<Signal> barrier = plans_[rt_->first_rank()].barrier;
  // AllGather of K and V on the copy engine, every rank: barrier, own rows into every rank,
  // barrier; then the engine on every SM. NOTE: all copies are enqueued before any engine launch.
  rt_->own_call(barrier, [&] {
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      const SpAttnPlan& p = plans_[r];
      const StreamContext sc = rt_->stream_context(r, true);
      SymmetricView heap = rt_->view(r);
      const RowRange own = p.k[0].own_rows();
      const int64_t block = p.local_rows() * p.kv_row_bytes();
      for (int b = 0; b < p.shape.batch && own.size() > 0; ++b) {
        for (int s = 0; s < world_.size(); ++s) {
          const int peer = peer_at(r, s, world_.size());
          rank_copy_data(sc, peer, p.k[b].rows_copy(static_cast<const std::byte*>(k[r]) + b * block, own.begin,
                                                    heap.peer(peer, p.k[b].f.gathered), own));
          rank_copy_data(sc, peer, p.v[b].rows_copy(static_cast<const std::byte*>(v[r]) + b * block, own.begin,
                                                    heap.peer(peer, p.v[b].f.gathered), own));
        }
      }
      rank_barrier(sc, heap, p.barrier, rt_->value(r, 2));
    }
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      enqueue_attention(r, q[r], o[r], lse[r], false, 0, world_.stream(r));
    }
  });
}

}  // namespace tilelink::cuda
