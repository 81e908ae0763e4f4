// GEMM+AR's path and algorithm choice (the model of tune/path_model.hpp applied to GEMM+AR).
//
//   unfused  = T_gemm(all SMs) + T_allreduce   NCCL's ring: 2 (W-1)/W of the partial over the link
//   fused    = max(T_gemm(the GEMM's SMs), T_read) + ar_tail_us
//              T_read: what the rank reads from its peers over the link: one-shot (W-1) partials,
//              two-shot 2 (W-1)/W of one
// One rank: the bare engine (fused). Ranks on one GPU (virtual): unfused, as every op (the reads
// compete with the GEMM for the same SMs and memory).
// The algorithm: one-shot where it reads no more than two-shot (W = 2) or the partial is small
// (<= kOneShotMaxBytes: decode sizes, where the two-shot's second round trip costs more than the
// extra bytes), else two-shot.
// NOTE: ar_tail_us (20) is a prior: the last band's reduce after the last tile plus two signal
// round trips (~1.1-1.6 us each, backend notes); not yet fit to a multi-GPU sweep.
#pragma once

#include "tilelink/ops/gemm_ar_plan.hpp"
#include "tilelink/tune/path_model.hpp"

namespace tilelink {

inline constexpr int64_t kOneShotMaxBytes = int64_t{1} << 20;

AllReduceAlgo choose_allreduce_algo(int64_t m, int64_t n, int world_size, DType dtype);
// Bytes a rank reads from its peers in the fused AllReduce.
double gemm_ar_comm_bytes(const GemmArPlan& p);
PathChoice choose_path(const GemmArPlan& p, const MachineModel& m, OpPath requested);

}  // namespace tilelink
