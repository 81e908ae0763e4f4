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
constexpr int kMaxCommTiles = 32;  // SpAttnWaitHooks::State's bits

struct SpAttnWaitHooks {
  static constexpr bool kWaits = true;
  static constexpr bool kNotifies = false;
  DeviceContext ctx;
  SymmetricView heap;
  Field<Signal> k_ready, v_ready;
  SegmentTiling comm;
  int64_t seq = 0;  // the keys the engine reads (a tile's rows past them are never waited for)
  Epoch call;  // read per tile: a graph replay's epoch is on the device

  // The comm tiles the load thread has seen in place (a bit a tile; at most kMaxCommTiles): each is
  // waited for once a block, in whatever order the walk meets them.
  struct State {
    uint32_t known = 0;
  };

  __device__ void before_kv_tile(const sm90::AttnTileWork& w, State& state) const {
    const int64_t first = int64_t{w.kv_tile} * sm90::kAttnBlockN;
    const IdRange ids = comm.covering(RowRange{first, first + sm90::kAttnBlockN < seq ? first + sm90::kAttnBlockN : seq});
    const uint64_t target = call.value();
    for (int t = ids.begin; t < ids.end; ++t) {
      if (state.known >> t & 1u) continue;
      consumer_tile_wait<Scope::kSystem, Report::kQuiet>(ctx, heap, k_ready, t, target,
                                                         WaitSite{SignalField::kTileReady, t});
      consumer_tile_wait<Scope::kSystem, Report::kQuiet>(ctx, heap, v_ready, t, target,
                                                         WaitSite{SignalField::kTileReady, t});
      state.known |= 1u << t;
    }
  }
};

// Refuses a call's operands before anything launches: one entry per rank, device memory, 16-byte
// aligned tensors (null where the rank's shard is empty), lse on every rank or on none.
template <class Plan>
void check_attn_args(const char* op, const detail::FusedRuntime& rt, const World& world, const std::vector<Plan>& plans,
                     const std::vector<const void*>& q, const std::vector<const void*>& k,
                     const std::vector<const void*>& v, const std::vector<void*>& o, const std::vector<float*>& lse) {
  auto empty = [&](int r) { return plans[r].local_rows() == 0; };
  rt.check_operand("Q", q, true, empty);
  rt.check_operand("K", k, true, empty);
  rt.check_operand("V", v, true, empty);
  rt.check_operand("O", o, true, empty);
  TL_REQUIRE(static_cast<int>(lse.size()) == world.size(),
             op << ": pass one lse entry per rank (" << world.size() << "), got " << lse.size());
  bool any = false, all = true;
  for (int r : world.local_ranks()) {
    if (empty(r)) continue;
    any = any || lse[r] != nullptr;
    all = all && lse[r] != nullptr;
  }
  TL_REQUIRE(any == all, op << ": give lse on every rank or on none");
  if (any) rt.check_operand("lse", lse, false, empty);
}

// What every rank of an attention op must agree on.
Agreement attn_agreement(const char* op, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype) {
  Agreement a(op);
  a.add("world", sharding.rows.world_size).add("dtype", static_cast<int64_t>(dtype)).add("S rows", sharding.rows);
  a.add("batch", shape.batch).add("heads_q", shape.heads_q).add("heads_kv", shape.heads_kv);
  a.add("head_dim", shape.head_dim).add("causal", static_cast<int64_t>(shape.causal));
  a.add("shard", static_cast<int64_t>(sharding.shard));
  return a;
}

}  // namespace

SpAttn::SpAttn(World& world, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype) : world_(world) {
  const int W = world.size();
  TL_REQUIRE(sharding.rows.world_size == W,
             "sp_attn: the sharding has " << sharding.rows.world_size << " ranks, the world " << W);
  TL_REQUIRE(dtype == DType::kBF16 || dtype == DType::kF16,
             "sp_attn on the CUDA backend takes bf16 or fp16, got " << dtype_name(dtype));
  TL_REQUIRE(shape.head_dim == 64 || shape.head_dim == 128,
             "sp_attn on the CUDA backend takes head dim 64 or 128, got " << shape.head_dim);
  // A comm tile is a run of positions a rank holds (a contiguous shard; a zigzag chunk): the copy
  // engine moves it in one operation and announces it with one. NOTE: with 128-row comm tiles (a
  // move, or an announcement, a tile) a call put ~1000 stream operations a rank in flight at S
  // 65536 over two ranks, and the host's enqueue blocked on the full queue behind a stream wait for
  // a peer whose operations it had not yet enqueued: the call never ran (measured on the H200; a
  // move a tile was also ~25 us an operation).
  const bool zigzag = sharding.shard == SeqShard::kZigzag;
  const RowPartition& runs = piece_parts(sharding);
  kv_tiles_ = SegmentTiling::make(runs, static_cast<int>(std::max<int64_t>(1, runs.max_size())));
  TL_REQUIRE(kv_tiles_.num_tiles() <= kMaxCommTiles, "sp_attn: " << kv_tiles_.num_tiles() << " comm tiles, at most "
                                                                  << kMaxCommTiles);
  // The plan's AllGather fields hold the gathered K and V (here in position order) and a
  // tile_ready slot for each of kv_tiles_ (zigzag: tiles of half a chunk, so at least one a chunk).
  SpAttnConfig config;
  config.comm_tile_rows = static_cast<int>(std::max<int64_t>(1, zigzag ? (runs.max_size() + 1) / 2 : runs.max_size()));
  for (int r = 0; r < W; ++r) plans_.push_back(SpAttnPlan::make(r, shape, sharding, dtype, config));
  TL_REQUIRE(plans_[0].k[0].tiles.num_tiles() >= kv_tiles_.num_tiles(),
             "sp_attn: internal: " << plans_[0].k[0].tiles.num_tiles() << " tile_ready slots for "
                                   << kv_tiles_.num_tiles() << " comm tiles");
  Agreement agreement = attn_agreement("sp_attn", shape, sharding, dtype);
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
                         kv_tiles_, shape.seq, Epoch{0}};
    a.num_sms = 1;
    sm90::attn_detail::launch_checked(a, pass, world.stream(r));
    TL_CUDA_CHECK(cudaStreamSynchronize(world.stream(r)));
    TL_CUDA_CHECK(cudaFree(buf));
  }
}

SpAttn::~SpAttn() = default;

void SpAttn::check_args(const std::vector<const void*>& q, const std::vector<const void*>& k,
                        const std::vector<const void*>& v, const std::vector<void*>& o,
                        const std::vector<float*>& lse) const {
  check_attn_args("sp_attn", *rt_, world_, plans_, q, k, v, o, lse);
}

int SpAttn::attention_sms(int rank) const { return rt_->split(rank, 0, 0).gemm_sms; }

void SpAttn::enqueue_attention(int r, const void* q, void* o, float* lse, bool hooked, cudaStream_t stream) {
  const SpAttnPlan& p = plans_[r];
  const SpAttnShape& s = p.shape;
  const int64_t n = p.local_rows();
  if (n == 0) return;
  const int64_t eb = dtype_size(p.dtype), q_row = int64_t{s.heads_q} * s.head_dim;
  // The walk starts at the last of the rank's own positions: its own keys, in place first.
  const std::vector<KeyPiece> own = key_pieces(p.sharding, r);
  const int64_t own_last = own.back().pos.end - 1;
  for (int b = 0; b < s.batch; ++b) {
    for (const QueryRun& run : query_runs(p)) {
      const int64_t row0 = b * n + run.row0;
      sm90::AttnArgs a;
      a.q = static_cast<const std::byte*>(q) + row0 * q_row * eb;
      a.o = static_cast<std::byte*>(o) + row0 * q_row * eb;
      a.k = rt_->view(r).local(p.k[b].f.gathered);  // [S, Hkv, D] in position order
      a.v = rt_->view(r).local(p.v[b].f.gathered);
      if (lse != nullptr) {  // [B, S_r, Hq]
        a.lse = lse + row0 * s.heads_q;
        a.lse_stride_b = n * s.heads_q, a.lse_stride_s = s.heads_q, a.lse_stride_h = 1;
      }
      // Under the mask no query of the run sees past its last position: the engine reads no key
      // beyond it (rows never gathered then; TMA reads them as zeros).
      a.batch = 1, a.seq_q = run.rows, a.seq_k = s.causal ? run.pos0 + run.rows : s.seq;
      a.heads_q = s.heads_q, a.heads_kv = s.heads_kv, a.head_dim = static_cast<int>(s.head_dim);
      a.causal = s.causal, a.dtype = p.dtype;
      a.q_pos0 = run.pos0, a.kv_pos0 = 0;
      a.kv_walk_from = std::min(own_last, a.seq_k - 1);  // fused and unfused alike: the same bits
      // Hooked, ranks sharing a GPU: persistent on the rank's SMs less the copies' (there a copy is
      // a driver kernel on the SMs: a block an item filling every SM with blocks that wait for it
      // would never let it run); the same in a captured call, whose stream signals are one-thread
      // kernels (the split leaves them an SM). Hooked on a GPU per rank, eager, and plain: a block
      // an item on every SM (the peers' pieces come by the copy engines; the own ones are in place
      // before the launch).
      a.num_sms = hooked && (!rt_->gpu_per_rank() || rt_->graph_mode()) ? attention_sms(r) : 0;
      if (!hooked) {
        sm90::attn_detail::launch_checked(a, sm90::NoAttnHooks{}, stream);
        continue;
      }
      SpAttnWaitHooks wait{world_.device_context(r), rt_->view(r), p.k[b].f.tile_ready, p.v[b].f.tile_ready,
                           kv_tiles_, a.seq_k, rt_->epoch(r)};
      sm90::attn_detail::launch_checked(a, wait, stream);
    }
  }
}

void SpAttn::enqueue_comm(int r, const void* k, const void* v, Pieces which) {
  const SpAttnPlan& p = plans_[r];
  const int W = p.world_size;
  const StreamExec x{rt_->stream_context(r), rt_->view(r)};
  const uint64_t epoch = rt_->value(r);
  if (which != Pieces::kPeers) x.barrier(p.barrier, epoch);
  const int64_t block = p.local_rows() * p.kv_row_bytes();  // a batch entry of this rank's K or V
  const int64_t needed = keys_needed(p);
  // The AllGather's pull program over the pieces (comm/allgather.hpp's, with the gathered rows at
  // their positions): the own pieces first, then rank - 1's, ...; a piece the queries never read
  // (past the last key under the mask) is never moved.
  for (int b = 0; b < p.shape.batch; ++b) {
    for (int s = which == Pieces::kPeers ? 1 : 0; s < (which == Pieces::kOwn ? 1 : W); ++s) {
      const int owner = ((r - s) % W + W) % W;
      for (const KeyPiece& piece : key_pieces(p.sharding, owner)) {
        if (piece.pos.begin >= needed) continue;
        const int tile = kv_tiles_.first[piece.part];
        for (int kv = 0; kv < 2; ++kv) {
          const AllGatherPlan& g = kv == 0 ? p.k[b] : p.v[b];
          const auto* mine = static_cast<const std::byte*>(kv == 0 ? k : v) + b * block;
          const int64_t rb = p.kv_row_bytes();
          std::byte* dst = x.local(g.f.gathered) + piece.pos.begin * rb;
          if (owner == r) {
            x.pull(r, Copy2D{mine + piece.row0 * rb, rb, dst, rb, piece.pos.size(), rb});
          } else {
            // The owner announces each of its pieces once it sits in its own gathered buffer.
            x.wait(owner, g.f.tile_ready, tile, epoch, WaitSite{SignalField::kTileReady, tile});
            x.pull(owner, Copy2D{x.peer(owner, g.f.gathered) + piece.pos.begin * rb, rb, dst, rb, piece.pos.size(), rb});
          }
          x.notify_local(g.f.tile_ready, tile, epoch);
        }
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
  // Every rank's engine (waiting per tile) is launched before any comm program is enqueued, as
  // AG+GEMM's (fused_runtime.hpp, LaunchOrder). On a GPU per rank the engine is a block an item on
  // every SM, and the own pieces (a copy on the rank's GPU, which may take SMs) are moved and
  // announced before it starts: the entry barrier and the own pieces before the fork.
  const bool own_first = rt_->gpu_per_rank();
  rt_->fused_call(
      LaunchOrder::kComputeFirst,
      [&](int r) {
        if (own_first) enqueue_comm(r, k[r], v[r], Pieces::kOwn);
      },
      [&](int r) { enqueue_attention(r, q[r], o[r], lse[r], true, rt_->gemm_stream(r)); },
      [&](int r) { enqueue_comm(r, k[r], v[r], own_first ? Pieces::kPeers : Pieces::kAll); });
}

PathChoice SpAttn::choose(OpPath requested) const {
  return rt_->choose(requested, attention_sms(rt_->first_rank()),
                     [&](int r, const MachineModel& m) { return choose_path(plans_[r], m, requested); });
}

void SpAttn::run_auto(const std::vector<const void*>& q, const std::vector<const void*>& k,
                      const std::vector<const void*>& v, const std::vector<void*>& o, const std::vector<float*>& lse,
                      OpPath requested) {
  detail::run_chosen(*this, requested, q, k, v, o, lse);
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
    enqueue_attention(r, q[r], o[r], lse[r], true, rt_->gemm_stream(r));
  });
}

void SpAttn::run_unfused(const std::vector<const void*>& q, const std::vector<const void*>& k,
                         const std::vector<const void*>& v, const std::vector<void*>& o,
                         const std::vector<float*>& lse) {
  check_args(q, k, v, o, lse);
  const Field<Signal> barrier = plans_[rt_->first_rank()].barrier;
  auto engines = [&] {
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      enqueue_attention(r, q[r], o[r], lse[r], false, world_.stream(r));
    }
  };
  if (rt_->nccl()) {
    // NCCL's AllGather of K and V (a GPU per rank), then the engine on every SM. Contiguous shards
    // land in rank order: one AllGather a batch entry and tensor (broadcasts where ragged); zigzag
    // chunks land at their positions: a broadcast a chunk.
    return rt_->nccl_call(barrier, [&] {
      const SpAttnPlan& p0 = plans_[rt_->first_rank()];
      const int64_t rb = p0.kv_row_bytes();
      for (int b = 0; b < p0.shape.batch; ++b) {
        for (int kv = 0; kv < 2; ++kv) {
          const std::vector<const void*>& in = kv == 0 ? k : v;
          auto gathered = [&](int r) { return rt_->view(r).local(kv == 0 ? plans_[r].k[b].f.gathered : plans_[r].v[b].f.gathered); };
          auto mine = [&](int r) {  // batch entry b of rank r's K or V
            return static_cast<const std::byte*>(in[r]) + b * plans_[r].local_rows() * rb;
          };
          if (p0.sharding.shard == SeqShard::kContiguous) {
            std::vector<const void*> send(world_.size(), nullptr);
            std::vector<void*> recv(world_.size(), nullptr);
            for (int r : world_.local_ranks()) send[r] = mine(r), recv[r] = gathered(r);
            rt_->lanes().nccl_all_gather_rows(p0.sharding.rows, rb / 2, send, recv);
            continue;
          }
          std::vector<std::pair<int, KeyPiece>> pieces;  // (owner, piece)
          for (int owner = 0; owner < world_.size(); ++owner)
            for (const KeyPiece& piece : key_pieces(p0.sharding, owner)) pieces.emplace_back(owner, piece);
          rt_->lanes().nccl_broadcasts(static_cast<int>(pieces.size()), [&](int i, int r) {
            const auto& [root, piece] = pieces[i];
            return detail::RankLanes::Broadcast{root, r == root ? mine(r) + piece.row0 * rb : nullptr,
                                                gathered(r) + piece.pos.begin * rb,
                                                static_cast<size_t>(piece.pos.size() * rb)};
          });
        }
      }
      engines();
    });
  }
  // AllGather of K and V on the copy engine, every rank: barrier, own rows into every rank,
  // barrier; then the engine on every SM. NOTE: all copies are enqueued before any engine launch.
  rt_->own_call(barrier, [&] {
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      const SpAttnPlan& p = plans_[r];
      const StreamContext sc = rt_->stream_context(r, true);
      SymmetricView heap = rt_->view(r);
      const int64_t block = p.local_rows() * p.kv_row_bytes(), rb = p.kv_row_bytes();
      for (int b = 0; b < p.shape.batch; ++b) {
        for (const KeyPiece& piece : key_pieces(p.sharding, r)) {
          for (int s = 0; s < world_.size(); ++s) {
            const int peer = peer_at(r, s, world_.size());
            for (int kv = 0; kv < 2; ++kv) {
              const AllGatherPlan& g = kv == 0 ? p.k[b] : p.v[b];
              const auto* mine = static_cast<const std::byte*>(kv == 0 ? k[r] : v[r]) + b * block;
              rank_copy_data(sc, peer, Copy2D{mine + piece.row0 * rb, rb, heap.peer(peer, g.f.gathered) + piece.pos.begin * rb,
                                              rb, piece.pos.size(), rb});
            }
          }
        }
      }
      rank_barrier(sc, heap, p.barrier, rt_->value(r, 2));
    }
    engines();
  });
}

// ---- ring attention ---------------------------------------------------------------------------

RingAttn::RingAttn(World& world, const SpAttnShape& shape, const SeqSharding& sharding, DType dtype)
    : world_(world) {
  const int W = world.size();
  // The baseline first: it checks what both take (sharding, dtype, head dim) by name.
  gathered_ = std::make_unique<SpAttn>(world, shape, sharding, dtype);
  for (int r = 0; r < W; ++r) plans_.push_back(RingAttnPlan::make(r, shape, sharding, dtype, 64, 1));
  Agreement agreement = attn_agreement("ring_attn", shape, sharding, dtype);
  rt_ = std::make_unique<detail::FusedRuntime>(world, "ring_attn", std::move(agreement), plans_[0].ws_bytes);
  own_lse_.assign(W, nullptr);
  for (int r : world.local_ranks()) {
    world.bind(r);
    const int64_t n = std::max<int64_t>(1, plans_[r].local_rows());
    TL_CUDA_CHECK(cudaMalloc(&own_lse_[r], shape.batch * n * shape.heads_q * sizeof(float)));
  }
}

RingAttn::~RingAttn() {
  for (int r : world_.local_ranks()) {
    if (own_lse_[r] == nullptr) continue;
    world_.bind(r);
    (void)cudaFree(own_lse_[r]);
  }
}

// Rank r's compute program on its second stream: a step's block folded into O and lse once it is
// in (filled), then announced (done).
void RingAttn::enqueue_steps(int r, const void* q, const void* k, const void* v, void* o, float* lse, Part part) {
  const RingAttnPlan& p = plans_[r];
  const SpAttnShape& s = p.shape;
  const int64_t n = p.local_rows();
  StreamContext sc = rt_->stream_context(r);
  sc.stream = rt_->gemm_stream(r);
  const SymmetricView heap = rt_->view(r);
  const int64_t eb = dtype_size(p.dtype), q_row = int64_t{s.heads_q} * s.head_dim, rb = p.kv_row_bytes();
  const std::vector<QueryRun> runs = query_runs(p);
  std::vector<char> written(runs.size() * s.batch, 0);
  for (int step = 0; step < p.steps(); ++step) {
    if (step >= 1 && part != Part::kCompute)
      consumer_tile_wait(sc, heap, p.filled, step % 2, rt_->value(r, step + 1), WaitSite{SignalField::kReady, step});
    if (part == Part::kComm) {  // the folds left out: each step announced folded once its block is in
      producer_tile_notify(sc, heap, p.done, 0, rt_->value(r, step + 2));
      continue;
    }
    const int owner = p.owner_at(step);
    const int64_t owner_rows = p.sharding.rows.size(owner);
    // A block's batch entries: dense in the input ([B][S_r] rows), max S_r apart in a slot.
    const std::byte* kb = step == 0 ? static_cast<const std::byte*>(k) : heap.local(p.k_slots) + (step % 2) * p.slot_bytes();
    const std::byte* vb = step == 0 ? static_cast<const std::byte*>(v) : heap.local(p.v_slots) + (step % 2) * p.slot_bytes();
    const int64_t stride = step == 0 ? n * rb : p.block_bytes();
    // Without the mask positions do not matter: the whole block is one piece.
    std::vector<KeyPiece> pieces;
    if (s.causal) pieces = key_pieces(p.sharding, owner);
    else if (owner_rows > 0) pieces.push_back({0, RowRange{0, owner_rows}, owner});
    for (int b = 0; b < s.batch && n > 0; ++b) {
      for (size_t ri = 0; ri < runs.size(); ++ri) {
        const QueryRun& run = runs[ri];
        for (const KeyPiece& piece : pieces) {
          if (s.causal && piece.pos.begin >= run.pos_end()) continue;  // every key past every query
          const int64_t row0 = b * n + run.row0;
          sm90::AttnArgs a;
          a.q = static_cast<const std::byte*>(q) + row0 * q_row * eb;
          a.o = static_cast<std::byte*>(o) + row0 * q_row * eb;
          a.k = kb + b * stride + piece.row0 * rb;
          a.v = vb + b * stride + piece.row0 * rb;
          a.lse = lse + row0 * s.heads_q;  // [B, S_r, Hq]
          a.lse_stride_b = n * s.heads_q, a.lse_stride_s = s.heads_q, a.lse_stride_h = 1;
          a.batch = 1, a.seq_q = run.rows, a.seq_k = piece.pos.size();
          a.heads_q = s.heads_q, a.heads_kv = s.heads_kv, a.head_dim = static_cast<int>(s.head_dim);
          a.causal = s.causal, a.dtype = p.dtype;
          a.q_pos0 = run.pos0, a.kv_pos0 = piece.pos.begin;
          char& done_once = written[b * runs.size() + ri];
          a.merge = done_once != 0;
          done_once = 1;
          sm90::attn_detail::launch_checked(a, sm90::NoAttnHooks{}, sc.stream);
        }
      }
    }
    if (part == Part::kAll) producer_tile_notify(sc, heap, p.done, 0, rt_->value(r, step + 2));
  }
}

// Rank r's ring on its stream. As the CPU program (backend/cpu ring_attn.cpp) but with a slot's
// two uses announced apart: `consumed` when its block is forwarded (here), `done` when it is folded
// (the compute program); the left neighbour waits for both before refilling the slot, so a block
// moves on as soon as it is in, whatever the fold is doing. (With one announcement after both,
// the forward of block s + 1 waited for the fold of block s, and ring and engine ran in turn:
// 0.49-0.82 of the baseline at world 8, measured on the H200.)
void RingAttn::enqueue_ring(int r, const void* k, const void* v) {
  const RingAttnPlan& p = plans_[r];
  const int W = p.world_size, right = (r + 1) % W;
  const StreamContext sc = rt_->stream_context(r);
  const SymmetricView heap = rt_->view(r);
  const int64_t n = p.local_rows(), rb = p.kv_row_bytes();
  rank_barrier(sc, heap, p.barrier, rt_->value(r, 1));
  for (int s = 0; s < p.steps(); ++s) {
    if (s >= 1) consumer_tile_wait(sc, heap, p.filled, s % 2, rt_->value(r, s + 1), WaitSite{SignalField::kReady, s});
    if (p.forwards(s)) {  // block s into the right neighbour's slot (s + 1) % 2
      const int slot = (s + 1) % 2;
      if (s >= 2) {  // that slot's block (step s - 1) forwarded and folded there
        peer_tile_wait(sc, heap, right, p.consumed, slot, rt_->value(r, s + 1), WaitSite{SignalField::kConsumed, slot});
        peer_tile_wait(sc, heap, right, p.done, 0, rt_->value(r, s + 1), WaitSite{SignalField::kAck, 0});
      }
      const int64_t rows = p.sharding.rows.size(p.owner_at(s));
      const int64_t stride = s == 0 ? n * rb : p.block_bytes();
      for (int b = 0; b < p.shape.batch && rows > 0; ++b) {
        for (int kv = 0; kv < 2; ++kv) {
          const ByteField slots = kv == 0 ? p.k_slots : p.v_slots;
          const std::byte* src = s == 0 ? static_cast<const std::byte*>(kv == 0 ? k : v)
                                        : heap.local(slots) + (s % 2) * p.slot_bytes();
          rank_copy_data(sc, right, Copy2D{src + b * stride, rb,
                                           heap.peer(right, slots) + slot * p.slot_bytes() + b * p.block_bytes(), rb,
                                           rows, rb});
        }
      }
      peer_tile_notify(sc, heap, right, p.filled, slot, rt_->value(r, s + 2));
    }
    // Block s forwarded, or not to be: its slot is free as far as this program goes.
    if (s >= 1) producer_tile_notify(sc, heap, p.consumed, s % 2, rt_->value(r, s + 2));
  }
}

void RingAttn::run(const std::vector<const void*>& q, const std::vector<const void*>& k,
                   const std::vector<const void*>& v, const std::vector<void*>& o, const std::vector<float*>& lse) {
  check_attn_args("ring_attn", *rt_, world_, plans_, q, k, v, o, lse);
  const int W = world_.size();
  if (W == 1) return gathered_->run(q, k, v, o, lse);  // nothing moves: the engine alone
  // Epochs: 1 for the entry barrier, s + 1 for block s's arrival, s + 2 for its fold (s < W).
  rt_->begin(W + 1);
  rt_->fused_call(
      LaunchOrder::kComputeFirst, detail::NoStep{},
      [&](int r) {
        enqueue_steps(r, q[r], k[r], v[r], o[r], lse[r] != nullptr ? lse[r] : static_cast<float*>(own_lse_[r]), Part::kAll);
      },
      [&](int r) { enqueue_ring(r, k[r], v[r]); });
}

void RingAttn::run_unfused(const std::vector<const void*>& q, const std::vector<const void*>& k,
                           const std::vector<const void*>& v, const std::vector<void*>& o,
                           const std::vector<float*>& lse) {
  gathered_->run_unfused(q, k, v, o, lse);
}

void RingAttn::run_comm_only(const std::vector<const void*>& k, const std::vector<const void*>& v) {
  rt_->require_eager("run_comm_only");
  TL_REQUIRE(world_.size() > 1, "ring_attn: run_comm_only needs a world of more than one rank");
  rt_->begin(world_.size() + 1);
  rt_->fused_call(
      LaunchOrder::kComputeFirst, detail::NoStep{},
      [&](int r) { enqueue_steps(r, nullptr, nullptr, nullptr, nullptr, nullptr, Part::kComm); },
      [&](int r) { enqueue_ring(r, k[r], v[r]); });
}

void RingAttn::run_attention_only(const std::vector<const void*>& q, const std::vector<const void*>& k,
                                  const std::vector<const void*>& v, const std::vector<void*>& o,
                                  const std::vector<float*>& lse) {
  rt_->require_eager("run_attention_only");
  rt_->each_on_gemm_stream([&](int r) {
    enqueue_steps(r, q[r], k[r], v[r], o[r], lse[r] != nullptr ? lse[r] : static_cast<float*>(own_lse_[r]),
                  Part::kCompute);
  });
}

PathChoice RingAttn::choose(OpPath requested) const {
  return rt_->choose(requested, world_.sm_count(rt_->first_rank()),
                     [&](int r, const MachineModel& m) { return choose_path(plans_[r], m, requested); });
}

void RingAttn::run_auto(const std::vector<const void*>& q, const std::vector<const void*>& k,
                        const std::vector<const void*>& v, const std::vector<void*>& o, const std::vector<float*>& lse,
                        OpPath requested) {
  detail::run_chosen(*this, requested, q, k, v, o, lse);
}

}  // namespace tilelink::cuda
