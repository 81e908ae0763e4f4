// The fused-or-unfused choice of an overlapped op: a visible cost model, so that `auto` never picks
// the fused path where overlap cannot win. Pure host code (no CUDA), tested on the CPU.
//
//   unfused = T_gemm(all SMs) + T_comm                  (one after the other, one collective)
//   fused   = max(T_gemm(the GEMM's SMs), T_comm + tiles * comm_tile_us) + a per-call overhead
//   T_gemm  = 2*M*N*K / (rate * gemm_sms / sms)         T_comm = bytes moved / link bandwidth
// GEMM+RS counts its fused GEMM in waves of tiles (ceil(tiles / gemm_sms) tiles an SM), and as its
// per-call cost the reduce left when the GEMM is done (gemm_rs_after_us).
// AG+GEMM whose GEMM reads the rank's own rows from A_r (push on separate GPUs, own rows on tile
// rows) starts at once, with no entry barrier or own copy before it: its per-call cost is a share
// of the communication, not a constant:
//   fused   = max(T_gemm(the GEMM's SMs), T_comm + tiles * comm_tile_us) + direct_exposed * T_comm
// fused is chosen when it is predicted at least `margin` faster. When the ranks share one GPU
// (virtual transport) the communication is a same-GPU copy that competes with the GEMM for the same
// SMs and memory: measured slower fused at every shape (bench/notes/fused_ops_cuda.md), so unfused.
// The attention ops (sp_attn, ring_attn) take the same form with the attention engine's rate.
// With one rank the plan overloads take the fused path: it is the bare engine (nothing to overlap,
// nothing to pay), while the baseline still runs a one-rank collective. The MoE layers are costed
// on their own terms (choose_path of their plans, below): layer 0's fused GEMM reads X's rows by
// index, slower than the contiguous GEMM, while its baseline pays a gather pass.
#pragma once

#include <string>

#include "tilelink/ops/ag_gemm_plan.hpp"
#include "tilelink/ops/attention_plan.hpp"
#include "tilelink/ops/gemm_rs_plan.hpp"
#include "tilelink/ops/moe_plan.hpp"

namespace tilelink {

enum class OpPath : uint8_t { kAuto, kFused, kUnfused };
const char* op_path_name(OpPath p);
bool parse_op_path(const std::string& s, OpPath* out);

struct MachineModel {
  bool ranks_share_gpu = false;  // virtual transport
  int sms = 0;                   // SMs of one rank's GPU (or share): read from the world
  int gemm_sms = 0;              // SMs the fused GEMM runs on (the rest run the comm program)
  // Sustained bf16 rate on `sms`: the engine and cuBLAS ran 8192x{14336,11008}x4096 / 2 ranks at
  // 687-700 TFLOP/s, 8192x28672x8192 / 2 at 665-680 (two H200s; bench/notes/gemm.md: 640-800
  // alone).
  double gemm_tflops = 690;
  // Per rank, one direction, as the baseline's collective moves it: cuBLAS+NCCL AG+GEMM with N = 16
  // (a GEMM of <= 25 us) took 179 us for 32 MiB received and 331-334 us for 64 MiB on two H200s
  // (NV18; bench/notes/fused_ops_cuda.md, the path model): ~215-235 GB/s of NCCL AllGather, against
  // 370-390 GB/s that SMs or copy engines move alone (tilelink bench prim).
  double link_gbps = 250;
  // Signals, the entry barrier, the own segment's copy, the last tile's tail, and what overlap
  // leaves exposed. Measured on two H200s (NV18), peer transport, AG+GEMM 8192x14336x4096 at world
  // 2: fused - T_gemm = 167 us (bench/notes/fused_ops_cuda.md); 15 us (the first guess) made `auto`
  // pick the fused path there, 0.95x of cuBLAS+NCCL.
  double fused_overhead_us = 150;
  double margin = 0.05;          // fused must be predicted this much faster
  // Per communication tile on the critical path of the fused copy-engine program (a stream wait on a
  // peer's signal, the copy, the notify). Measured on two H200s: 64 remote tiles of 64 rows took
  // 1.667 ms at 8192x11008x4096, world 2 (26 us a tile; bench/notes/fused_ops_cuda.md).
  double comm_tile_us = 25;
  // AG+GEMM reading the own rows from A_r (see above). Measured on two H200s (peer and ipc, world
  // 2, 2026-11-29): fused - T_gemm = 51-83 us at 32 MiB (T_comm 134 us here), 48-145 us at 64 MiB
  // (268 us): 0.18-0.62 of T_comm. It is not the waits: the same launches with the GEMM not
  // waiting (`bench ag_gemm`'s "together") take as long. It is power: both H200s run at their
  // 700 W cap (throttle reason SW power cap) with the GEMM alone (SM clock ~1500 MHz), and the
  // copy engines' NVLink and HBM traffic beside it take the clock down to ~1440 (2026-11-30).
  bool own_rows_direct = false;
  double direct_exposed = 0.6;
  // GEMM+RS, pull: the reduce (the warp reduce of ops/cuda/rs_comm.cu) sums `reduce_sm_gbps` of
  // output an SM with two sources (W sources: W/2 times the reads), `reduce_peak_gbps` at most on
  // any number of SMs. Measured on two H200s (NV18), 64 MiB of output: 0.250 ms on 16 SMs,
  // 0.43-0.45 on 8, 0.55-0.61 on 6, 0.81-0.88 on 4, 1.0-1.06 on 3 (bench/notes/fused_ops_cuda.md,
  // a warp per 32-row band).
  double reduce_sm_gbps = 19;
  double reduce_peak_gbps = 270;
  // GEMM+RS's GEMM on its SMs, in waves: ceil(tiles / gemm_sms) tiles an SM, each taking its flops
  // at rs_sm_tflops (one SM; the engine is persistent: a wave that is not full costs a whole tile).
  // Measured on two H200s (2026-11-30, nine shapes, 99-128 GEMM SMs): within -2..+4% of this at
  // 715 / 132 SMs, where the flat rate missed by up to 7% (8192x6144x16384 on 126 SMs: 1536 tiles,
  // 13 waves, 1.284 ms; flat 1.25, waves 1.288).
  double rs_sm_tflops = 715.0 / 132;
  // GEMM+RS, pull, what the fused call adds after its GEMM (gemm_rs_after_us): while the GEMM
  // runs, each reduce SM sums reduce_during_gbps of output (two sources; about half its rate alone:
  // the GEMM shares HBM and L2 with it); what is left when the GEMM is done, and never less than
  // its last wave's share (those tiles are done only at the end), every SM reduces at
  // reduce_after_gbps (the GEMM's SMs join the reduce); then rs_fused_overhead_us + rs_tail_tiles
  // times one tile's time. Fit to a sweep of 4-24 reduce SMs on nine shapes (2026-11-30, two
  // H200s): the model's best SMs measured within 2.5% of the sweep's best on every shape.
  // NOTE: "the last wave's share" is 1/waves of the work because the compute order is banded (every
  // wave holds every owner's tiles alike: TileOrder::bands). The fit was made with the staggered
  // order before it, whose last waves held only the owner's own tiles; the banded order measured
  // 0-4% faster fused (2026-11-30), so the model is now slightly conservative.
  // Sequence-parallel attention: the sm90 attention engine's sustained rate, bf16, head dim 128
  // (bench attention on one H200, 2026-12-04: 610-685 TFLOP/s over 12 shapes; D 64 435-450).
  double attn_tflops = 620;
  // The MoE layers' grouped GEMM as a share of gemm_tflops: measured on one H200 (2026-12-04, 48
  // MoE shapes) at a median 0.71 of a dense GEMM of the same FLOPs (bench/notes/moe.md).
  double moe_grouped_share = 0.71;
  // MoE layer 0: the grouped GEMM with X's rows gathered in its load path, as a share of the
  // contiguous grouped GEMM's rate on the rows it loads (a tile's padding rows load nothing).
  // Fit on one H200 (2026-12-05/06, the six MoE models at 2048 and 8192 tokens, world 1, four
  // warps of cp.async; bench/notes/moe.md): the gathered GEMM costs 6-21% more than the
  // contiguous one on its real rows, so it wins where the gather pass it saves is the larger
  // (qwen3-30b-a3b 1.10-1.22, deepseek-moe and qwen1.5-moe at 8192 tokens 1.05-1.09) and loses on
  // the long-K few-expert mixtral shapes (0.85-0.92).
  double moe_gathered_rate = 0.88;
  // World 1 has nothing to overlap, so the gathered GEMM must be predicted this much faster than
  // the gather pass plus the contiguous GEMM: the run-to-run spread of the same kernels (A/A of
  // (a) 0.97-1.03 on the H200), so that a coin-flip shape keeps (a).
  double moe_gathered_margin = 0.02;
  // The grouped GEMM's tile rows: an expert's rows run in whole tiles of this many, the last one
  // padded (what the MMA pays for, where the gathered load pays only for the rows it loads).
  int moe_tile_rows = 128;
  // A gather or a top-k reduce pass over HBM: bytes read and written a second. A copy kernel on one
  // H200 moves ~3 TB/s (bench prim); kept below it for the H100's 3.35 TB/s peak.
  double hbm_pass_gbps = 2500;
  double reduce_during_gbps = 10;
  double reduce_after_gbps = 350;
  double rs_fused_overhead_us = 0;
  double rs_tail_tiles = 0.5;
};

struct PathChoice {
  OpPath path = OpPath::kUnfused;
  double fused_us = 0, unfused_us = 0;  // predictions (0 when the model does not apply)
  std::string why;
};

// Bytes a rank receives: AG+GEMM, the rows of A it does not own; GEMM+RS, its segment's partials
// from every other rank.
double ag_gemm_comm_bytes(const AgGemmPlan& p);
double gemm_rs_comm_bytes(const GemmRsPlan& p);

// comm_tiles: the communication tiles a rank moves (each costs m.comm_tile_us); fused_gemm_us: the
// fused GEMM's time on its SMs (0: the flat rate scaled by sms / gemm_sms).
PathChoice choose_path(double flops, double comm_bytes, const MachineModel& m, OpPath requested,
                       int comm_tiles = 0, double fused_gemm_us = 0);
PathChoice choose_path(const AgGemmPlan& p, const MachineModel& m, OpPath requested);
// GEMM+RS: the pull model; a push plan (config.mode) is never fused by `auto` (measured slower than
// the baseline on every shape).
PathChoice choose_path(const GemmRsPlan& p, const MachineModel& m, OpPath requested);

// GEMM+RS's GEMM on `gemm_sms` SMs, in waves of tiles (m.rs_sm_tflops), us.
double gemm_rs_gemm_us(const GemmRsPlan& p, const MachineModel& m, int gemm_sms);
// GEMM+RS (pull) with its reduce on `reduce_sms` SMs: the reduce of the rank's segment alone, us.
double gemm_rs_reduce_us(const GemmRsPlan& p, const MachineModel& m, int reduce_sms);
// GEMM+RS (pull) with its reduce on `reduce_sms` SMs and the GEMM on the rest: what the fused call
// adds after the GEMM (the reduce left over, then the tail; see MachineModel), us.
double gemm_rs_after_us(const GemmRsPlan& p, const MachineModel& m, int reduce_sms);
// The fused call's time: gemm_rs_gemm_us(m.sms - reduce_sms) + gemm_rs_after_us(reduce_sms).
double gemm_rs_fused_us(const GemmRsPlan& p, const MachineModel& m, int reduce_sms);
// The reduce SMs the model gives GEMM+RS on a GPU of m.sms SMs: those in [2, m.sms / 4] with the
// shortest gemm_rs_fused_us, the most of them where several tie (SMs the GEMM's waves do not need
// are free for the reduce). Fewer SMs leave the GEMM whole waves (8192x4096 on 128 SMs: 8 waves
// of 1024 tiles; on 123: 9), more finish the reduce sooner.
int gemm_rs_reduce_sms(const GemmRsPlan& p, const MachineModel& m);

// Sequence-parallel attention. attention_rank_flops: the FLOPs of rank p.rank's queries (4 B Hq D a
// visible (query, key) pair: every key, or under the mask those at or before the query's
// position). The bytes of K and V a rank receives: sp_attn, the other ranks' rows its queries
// read (under the mask none past its last position); ring_attn, the blocks of its steps past the
// first (every other rank's, or under the mask with contiguous shards the earlier ranks').
double attention_rank_flops(const AttnLayout& p);
double sp_attn_comm_bytes(const SpAttnPlan& p);
double ring_attn_comm_bytes(const RingAttnPlan& p);
// The engine at m.attn_tflops in place of the GEMM's rate; sp_attn's comm tiles are the other
// ranks' pieces it moves, the ring's its steps past the first.
PathChoice choose_path(const SpAttnPlan& p, const MachineModel& m, OpPath requested);
PathChoice choose_path(const RingAttnPlan& p, const MachineModel& m, OpPath requested);

// The MoE layers over ranks (ops/moe_plan.hpp), rank p.rank on a GPU of its own:
//   layer 0  T_gemm = 2 padded F_r H / (rate * moe_grouped_share), padded = the rows in whole tiles
//            of moe_tile_rows per expert, routed evenly (rows = every token's pairs);
//            T_load = (1 / moe_gathered_rate - 1) 2 rows F_r H / (rate * moe_grouped_share), what
//            the gathered load adds on the real rows;
//            unfused = T_comm (the peers' tokens, ids and weights) + the gather pass (X read,
//            rows x H written) + T_gemm;
//            fused = max((T_gemm + T_load) * sms / gemm_sms, T_comm + 3 (W - 1) tiles)
//            + fused_overhead_us (none at world 1, where there is nothing to move, and the margin
//            there is moe_gathered_margin).
//   layer 1  T_gemm = 2 rows H F_r / (rate * moe_grouped_share), T_reduce = the top-k reduce pass
//            (Y read, P written);
//            unfused = T_gemm + T_reduce + T_comm (the partial's other segments out); fused =
//            max(T_gemm * sms / gemm_sms + T_reduce, T_comm + (W - 1) tiles) + fused_overhead_us;
//            at world 1 both paths are the same kernels (fused).
// Ranks sharing a GPU take the unfused path (measured slower fused at every shape: the copies run
// on the same SMs and HBM). moe_mlp_choice adds the two layers' predictions, each on its own
// model (its GEMM's SMs); the MLP takes one path for both.
double moe_ag_gemm_comm_bytes(const MoeAgGemmPlan& p);
double moe_gemm_rs_comm_bytes(const MoeGemmRsPlan& p);
PathChoice choose_path(const MoeAgGemmPlan& p, const MachineModel& m, OpPath requested);
PathChoice choose_path(const MoeGemmRsPlan& p, const MachineModel& m, OpPath requested);
PathChoice moe_mlp_choice(const MoeAgGemmPlan& l0, const MachineModel& m0, const MoeGemmRsPlan& l1,
                          const MachineModel& m1, OpPath requested);
// Layer 0 on one GPU (cuda::MoeLayer's MoePath::kAuto): the grouped GEMM reading X's rows by index
// (fused) against the gather pass then the contiguous GEMM (unfused), by the world-1 costs above
// with moe_gathered_margin; n: the GEMM's N (F, or 2F where W1 holds gate and up), on `sms` SMs.
PathChoice moe_layer0_one_gpu(int64_t tokens, int64_t hidden, int64_t n, int experts, int topk, DType dtype,
                              int sms);

// The path every rank takes: rank `mine`'s choice, made unfused where `auto` would send any rank
// down a different path than the others (each process of an ipc world decides alone, on the same
// inputs: all of them then agree). choose(r): the model's choice for rank r's plan.
template <class Choose>
PathChoice agreed_choice(int world_size, int mine, OpPath requested, Choose&& choose) {
  PathChoice c = choose(mine);
  if (requested != OpPath::kAuto || c.path != OpPath::kFused) return c;
  for (int r = 0; r < world_size; ++r) {
    if (r == mine || choose(r).path == OpPath::kFused) continue;
    c.path = OpPath::kUnfused;
    c.why += "; unfused: the model does not favour fused for rank " + std::to_string(r) +
             ", and every rank takes the same path";
    break;
  }
  return c;
}

}  // namespace tilelink
