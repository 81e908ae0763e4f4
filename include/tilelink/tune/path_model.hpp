// The fused-or-unfused choice of an overlapped op: a visible cost model, so that `auto` never picks
// the fused path where overlap cannot win. Pure host code (no CUDA), tested on the CPU.
//
//   unfused = T_gemm(all SMs) + T_comm                  (one after the other, one collective)
//   fused   = max(T_gemm(the GEMM's SMs), T_comm + tiles * comm_tile_us) + a per-call overhead
//   T_gemm  = 2*M*N*K / (rate * gemm_sms / sms)         T_comm = bytes moved / link bandwidth
// fused is chosen when it is predicted at least `margin` faster. When the ranks share one GPU
// (virtual transport) the communication is a same-GPU copy that competes with the GEMM for the same
// SMs and memory: measured slower fused at every shape (bench/notes/fused_ops_cuda.md), so unfused.
// With one rank the plan overloads take the fused path: it is the bare engine (nothing to overlap,
// nothing to pay), while the baseline still runs a one-rank collective.
#pragma once

#include <string>

#include "tilelink/ops/ag_gemm_plan.hpp"
#include "tilelink/ops/gemm_rs_plan.hpp"

namespace tilelink {

enum class OpPath : uint8_t { kAuto, kFused, kUnfused };
const char* op_path_name(OpPath p);
bool parse_op_path(const std::string& s, OpPath* out);

struct MachineModel {
  bool ranks_share_gpu = false;  // virtual transport
  int sms = 0;                   // SMs of one rank's GPU (or share): read from the world
  int gemm_sms = 0;              // SMs the fused GEMM runs on (the rest run the comm program)
  double gemm_tflops = 650;      // sustained bf16 rate on `sms` (bench/notes/gemm.md: 640-800)
  double link_gbps = 400;        // per rank, one direction (an H200's NVLink is ~450 GB/s)
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

// comm_tiles: the communication tiles a rank moves (each costs m.comm_tile_us).
PathChoice choose_path(double flops, double comm_bytes, const MachineModel& m, OpPath requested,
                       int comm_tiles = 0);
PathChoice choose_path(const AgGemmPlan& p, const MachineModel& m, OpPath requested);
PathChoice choose_path(const GemmRsPlan& p, const MachineModel& m, OpPath requested);

}  // namespace tilelink
