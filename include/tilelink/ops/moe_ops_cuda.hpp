// MoE layers over the ranks of a cuda::World: the plans of ops/moe_plan.hpp (shared with the CPU
// backend), their comm programs on the copy engine and one cuda::MoeLayer per rank (its routing
// kernel, grouped GEMMs and the kernels between them, ops/moe_cuda.hpp), on the fused-op runtime.
//
// Layer 0, MoeAgGemm (rank r: X_r [M_r, H], topk_ids_r / topk_weights_r [M_r, topk], W1_r
// [experts, F_r, H]; out_r [M * topk, F_r] in the grouped order of ops/moe_routing.hpp):
//   comm program     per rank on the rank's stream: the entry barrier, then the AllGathers' pull
//                    programs (comm/allgather.hpp), the routing ids first, then X, then the weights
//                    (layer 1's); a comm tile is a rank's whole segment (one copy-engine move and one
//                    announcement a rank and tensor). On a GPU per rank (peer, ipc) the barrier and
//                    the own rows of each go before the fork: the GEMM then holds every SM, and a
//                    copy inside one GPU may need SMs.
//   compute program  on the rank's second stream: a stream wait for every ids tile, the routing
//                    kernel over the gathered ids (the same tables on every rank), the arrival
//                    order of the grouped tile rows (the rank's own tokens first, then as the pull
//                    order brings the peers': moe_arrival_order_async), then the grouped GEMM
//                    walking the tile rows in that order and reading X's rows by index from the
//                    gathered buffer (no gathered copy of X): before a tile's loads its load warps find the comm tiles holding the tokens of
//                    its rows (a dynamic mapping: grouped row -> pair -> token -> owner's segment,
//                    from the routing tables) and wait for those (bounded, SignalField::kTileReady)
//   baseline (a)     the three AllGathers (the copy engine on virtual ranks: barrier, every rank's
//                    rows into every rank, barrier; NCCL on peer and ipc), then the routing, a gather
//                    of X into grouped order and the grouped GEMM on every SM of the rank
//   baseline (b)     (a) with one cuBLAS GEMM a non-empty expert for the grouped GEMM, its sizes read
//                    back to the host (run_expert_loop; layer 1 and the MLP alike)
// Layer 1, MoeGemmRs (rank r: H1_r [M * topk, F_r] grouped, every token's topk_ids / topk_weights
// [M, topk] (the same on every rank), W2_r [experts, H, F_r]; C_r [M_r, H] = its tokens' rows of
// Σ_s P_s, P_s = the top-k reduce of H1_s · W2_s[e]ᵀ):
//   compute program  on the rank's second stream: the routing, then the completion order of the
//                    grouped tile rows (moe_completion_order_async: the tile rows of the tokens the
//                    reduce takes first go first), then the grouped GEMM into Y [M * topk, H] walking
//                    them in that order on the rank's SMs less the reduces', its notify hook
//                    announcing each stored tile (pair_done, the plan's)
//   top-k reduce     after the GEMM on its SMs (the default: measured faster on one GPU, below), or
//                    with set_reduce_beside_gemm(true) beside it, on a third stream of the rank and
//                    topk_sms() SMs: by tiles of
//                    kMoeReduceTileRows tokens into the symmetric partial P_r, the next rank's
//                    tokens first; a tile first waits for the GEMM tiles of its tokens' rows (a
//                    dynamic mapping: token range -> each expert's run of rows -> tile rows; bounded,
//                    SignalField::kTileDone), and is announced (tile_done) once stored. Tiles are
//                    claimed from one counter, so once the GEMM ends its SMs take what is left.
//                    On virtual ranks of one H200 beside measured 0.56-0.70 of unfused against
//                    after's 0.76-0.80 on mixtral (bench/results/2026-12-05_h200_moe_ranks.md): the
//                    SMs it holds cost the GEMM more than its overlap gains where the comm is a
//                    same-HBM copy; it is there for separate GPUs, not yet measured.
//   comm program     the ReduceScatter (comm/reduce_scatter.hpp, pull) on its own SMs, launched
//                    before the GEMM: each band of the rank's tokens, once every source announced
//                    its tile, summed over sources in rank order (fp32, rounded once); once the
//                    partial is out, the GEMM's SMs join it (the shared band counter)
//   baseline (a)     the routing, the grouped GEMM and the top-k reduce on every SM, the partial
//                    published whole, then the ReduceScatter on every SM (virtual ranks); NCCL's
//                    ReduceScatter on peer and ipc
// MoeMlp: layer 0 into [M * topk, 2 F_r] (gate rows then up rows), SiLU(gate) · up (fp32, one
// rounding), layer 1 on the routing layer 0 gathered.
//
// Every path gives the same bits where its collectives are the op's own (virtual ranks): the same
// kernels, one summation order. World 1 runs cuda::MoeLayer alone. CUDA graphs: run() and
// run_unfused() may be captured; the routing may change between replays.
//
//   cuda::World world({.transport = cuda::Transport::kVirtual, .world_size = 4});
//   cuda::MoeMlp mlp(world, RowPartition::even(M, 4), H, {f, f, f, f}, experts, topk, DType::kBF16);
//   mlp.run(x, ids, weights, w1, w2, out);   // vectors indexed by rank
//   world.sync("moe_mlp");
#pragma once

#include <memory>
#include <vector>

#include "tilelink/core/dtype.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/ops/moe_cuda.hpp"
#include "tilelink/ops/moe_plan.hpp"
#include "tilelink/runtime/world.hpp"
#include "tilelink/tune/path_model.hpp"

namespace tilelink::cuda {

namespace detail {
class FusedRuntime;
}

// Tokens a tile of layer 1's top-k reduce (the ReduceScatter's producer tile: kMoeReduceTileRows
// tokens x H).
inline constexpr int kMoeReduceTileRows = 128;
// Layer 1's completion order by default: two phases (the next rank's tokens' tiles first, as the
// ReduceScatter serves them, then the rest).
inline constexpr int kMoeCompletionKeys = 2;
// At most this many ranks (a comm tile a rank; the load warps' wait mask is a 32-bit word).
inline constexpr int kMoeMaxWorld = 32;

class MoeAgGemm {
 public:
  // tokens: M over the ranks (ragged allowed); ffn_per_rank[r] = F_r (a multiple of 8); bf16 or
  // fp16. Checks everything (tilelink::Error) and allocates.
  MoeAgGemm(World& world, const RowPartition& tokens, int64_t hidden, const std::vector<int64_t>& ffn_per_rank,
            int experts, int topk, DType dtype);
  ~MoeAgGemm();
  MoeAgGemm(const MoeAgGemm&) = delete;
  MoeAgGemm& operator=(const MoeAgGemm&) = delete;

  const MoeAgGemmPlan& plan(int rank) const { return plans_.at(rank); }
  // Vectors indexed by rank (non-local entries ignored): x [M_r, H], ids / weights [M_r, topk]
  // (int32 / fp32; null where M_r = 0), w1 [experts, F_r, H], out [M * topk, F_r].
  void run(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
           const std::vector<const float*>& weights, const std::vector<const void*>& w1,
           const std::vector<void*>& out);
  void run_unfused(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                   const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                   const std::vector<void*>& out);
  // Baseline (b): baseline (a) with one cuBLAS GEMM a non-empty expert instead of the grouped GEMM
  // (each rank's expert sizes read back to the host first: eager calls only). The same rows as
  // run(), within cuBLAS's rounding.
  void run_expert_loop(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                       const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                       const std::vector<void*>& out);
  PathChoice choose(OpPath requested = OpPath::kAuto) const;
  void run_auto(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                const std::vector<void*>& out, OpPath requested = OpPath::kAuto);

  // Parts, for the bench's bounds (eager, W > 1): the AllGathers alone, then the routing and the
  // grouped GEMM alone (its waits find the last comm run's tiles in place).
  void run_comm_only(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                     const std::vector<const float*>& weights);
  void run_compute_only(const std::vector<const void*>& w1, const std::vector<void*>& out);

  // After a call, on rank r's device: every token's routing as the rank gathered it, [M, topk]
  // (what layer 1 takes), and the rank's routing tables (MoeLayer::offsets()...).
  const int32_t* gathered_ids(int rank) const;
  const float* gathered_weights(int rank) const;
  const MoeLayer& layer(int rank) const { return *layers_.at(rank); }
  // The SMs rank r's grouped GEMM takes in a fused call (the rest are the copies').
  int gemm_sms(int rank) const;

 private:
  void check_args(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                  const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                  const std::vector<void*>& out) const;
  void enqueue_grouped(int r, const void* w1, void* out, bool hooked, cudaStream_t stream);
  // Baseline (a), or (b) with expert_loop_gemm.
  void unfused(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
               const std::vector<const float*>& weights, const std::vector<const void*>& w1,
               const std::vector<void*>& out, bool expert_loop_gemm);
  // World 1: cuda::MoeLayer alone on `path` (or baseline (b)'s gather and expert loop), the routing
  // kept for gathered_ids()/gathered_weights().
  void world1(const void* x, const int32_t* ids, const float* weights, const void* w1, void* out, MoePath path,
              bool expert_loop_gemm = false);
  // The fused call's programs on rank r: the AllGathers (rank's stream), the routing and the
  // grouped GEMM (the GEMM stream).
  void enqueue_comm(int r, const void* x, const int32_t* ids, const float* weights, AllGatherPart part);
  void enqueue_compute(int r, const void* w1, void* out);

  World& world_;
  std::vector<MoeAgGemmPlan> plans_;
  std::vector<std::unique_ptr<MoeLayer>> layers_;  // per local rank, over all M tokens
  std::unique_ptr<detail::FusedRuntime> rt_;
  std::vector<int64_t> loop_offsets_;  // baseline (b): an expert loop's sizes on the host
};

class MoeGemmRs {
 public:
  MoeGemmRs(World& world, const RowPartition& tokens, int64_t hidden, const std::vector<int64_t>& ffn_per_rank,
            int experts, int topk, DType dtype);
  ~MoeGemmRs();
  MoeGemmRs(const MoeGemmRs&) = delete;
  MoeGemmRs& operator=(const MoeGemmRs&) = delete;

  const MoeGemmRsPlan& plan(int rank) const { return plans_.at(rank); }
  // Vectors indexed by rank: h1 [M * topk, F_r] (grouped by the routing of ids), ids / weights
  // [M, topk] (every token's, the same on every rank), w2 [experts, H, F_r], c [M_r, H] (null
  // where M_r = 0).
  void run(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
           const std::vector<const float*>& weights, const std::vector<const void*>& w2,
           const std::vector<void*>& c);
  void run_unfused(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                   const std::vector<const float*>& weights, const std::vector<const void*>& w2,
                   const std::vector<void*>& c);
  // Baseline (b), as MoeAgGemm's: the per-expert cuBLAS loop for the grouped GEMM (eager only).
  void run_expert_loop(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                       const std::vector<const float*>& weights, const std::vector<const void*>& w2,
                       const std::vector<void*>& c);
  PathChoice choose(OpPath requested = OpPath::kAuto) const;
  void run_auto(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                const std::vector<const float*>& weights, const std::vector<const void*>& w2,
                const std::vector<void*>& c, OpPath requested = OpPath::kAuto);

  // Parts, for the bench's bounds (eager, W > 1): the partials alone (routing, grouped GEMM, top-k
  // reduce, each tile announced), then the ReduceScatter alone on its SMs (every tile in place).
  void run_compute_only(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                        const std::vector<const float*>& weights, const std::vector<const void*>& w2);
  void run_comm_only(const std::vector<void*>& c);

  // Rank r's routing tables of the last call (MoeLayer::offsets()...).
  const MoeLayer& layer(int rank) const { return *layers_.at(rank); }
  // The SMs of rank r's ReduceScatter in a fused call, of its top-k reduce beside the GEMM, and its
  // grouped GEMM's (the rest).
  int reduce_sms(int rank) const;
  int topk_sms(int rank) const;
  int gemm_sms(int rank) const;
  // The fused call's top-k reduce: after the grouped GEMM on its SMs (the default, measured faster
  // on one GPU), or beside it (the GEMM walks its tile rows in completion order and announces each
  // tile, the reduce takes its tiles as their rows are stored).
  void set_reduce_beside_gemm(bool beside);
  bool reduce_beside_gemm() const { return reduce_beside_gemm_; }
  // The completion order's keys (MoeCompletion::make's max_keys, 1 to kMoeOrderKeys): the phases
  // the GEMM's walk goes through the tokens in; each phase streams every expert's weights it needs
  // again, so few phases (kMoeCompletionKeys by default).
  void set_completion_keys(int keys);
  int completion_keys() const { return completion_keys_; }

 private:
  void check_args(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
                  const std::vector<const float*>& weights, const std::vector<const void*>& w2,
                  const std::vector<void*>& c) const;
  // Rank r's routing, grouped GEMM into Y and top-k reduce into the partial, on `stream`; fused:
  // the GEMM on gemm_sms(r) and each reduce tile announced with the call's epoch.
  // expert_loop_gemm: baseline (b)'s per-expert cuBLAS GEMMs (unfused only).
  void enqueue_partial(int r, const void* h1, const int32_t* ids, const float* weights, const void* w2,
                       bool fused, cudaStream_t stream, bool expert_loop_gemm = false);
  void unfused(const std::vector<const void*>& h1, const std::vector<const int32_t*>& ids,
               const std::vector<const float*>& weights, const std::vector<const void*>& w2,
               const std::vector<void*>& c, bool expert_loop_gemm);

  World& world_;
  std::vector<MoeGemmRsPlan> plans_;
  std::vector<std::unique_ptr<MoeLayer>> layers_;
  std::unique_ptr<detail::FusedRuntime> rt_;
  std::vector<int64_t> loop_offsets_;  // baseline (b): an expert loop's sizes on the host
  struct ReduceLanes;
  std::unique_ptr<ReduceLanes> lanes_;  // the reduce beside the GEMM: its stream, events, claim counter
  bool reduce_beside_gemm_ = false;
  int completion_keys_ = kMoeCompletionKeys;
};

class MoeMlp {
 public:
  MoeMlp(World& world, const RowPartition& tokens, int64_t hidden, const std::vector<int64_t>& ffn_per_rank,
         int experts, int topk, DType dtype);
  ~MoeMlp();
  MoeMlp(const MoeMlp&) = delete;
  MoeMlp& operator=(const MoeMlp&) = delete;

  // x [M_r, H], ids / weights [M_r, topk], w1 [experts, 2 F_r, H] (gate rows, then up rows),
  // w2 [experts, H, F_r], out [M_r, H].
  void run(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
           const std::vector<const float*>& weights, const std::vector<const void*>& w1,
           const std::vector<const void*>& w2, const std::vector<void*>& out);
  void run_unfused(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                   const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                   const std::vector<const void*>& w2, const std::vector<void*>& out);
  // Baseline (b): both layers' per-expert cuBLAS loops, the same activation (eager only).
  void run_expert_loop(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                       const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                       const std::vector<const void*>& w2, const std::vector<void*>& out);
  PathChoice choose(OpPath requested = OpPath::kAuto) const;
  void run_auto(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
                const std::vector<const float*>& weights, const std::vector<const void*>& w1,
                const std::vector<const void*>& w2, const std::vector<void*>& out,
                OpPath requested = OpPath::kAuto);

  const MoeAgGemm& layer0() const { return layer0_; }
  const MoeGemmRs& layer1() const { return layer1_; }

 private:
  void call(const std::vector<const void*>& x, const std::vector<const int32_t*>& ids,
            const std::vector<const float*>& weights, const std::vector<const void*>& w1,
            const std::vector<const void*>& w2, const std::vector<void*>& out, bool fused,
            bool expert_loop_gemm = false);

  World& world_;
  MoeAgGemm layer0_;
  MoeGemmRs layer1_;
  std::vector<void*> gate_up_, act_;  // per local rank: [M * topk, 2 F_r], [M * topk, F_r]
};

}  // namespace tilelink::cuda
