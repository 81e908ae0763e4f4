#include "tilelink/tune/gemm_ar_model.hpp"

#include <algorithm>
#include <sstream>

namespace tilelink {

AllReduceAlgo choose_allreduce_algo(int64_t m, int64_t n, int world_size, DType dtype) {
  const int64_t bytes = m * n * dtype_size(dtype);
  return world_size <= 2 || bytes <= kOneShotMaxBytes ? AllReduceAlgo::kOneShot : AllReduceAlgo::kTwoShot;
}

double gemm_ar_comm_bytes(const GemmArPlan& p) {
  const double partial = static_cast<double>(p.m()) * p.n * p.elem_bytes();
  const int W = p.world_size;
  return p.ar.algo == AllReduceAlgo::kOneShot ? (W - 1) * partial : 2.0 * (W - 1) / W * partial;
}

PathChoice choose_path(const GemmArPlan& p, const MachineModel& m, OpPath requested) {
  PathChoice c;
  if (requested != OpPath::kAuto) {
    c.path = requested;
    c.why = std::string("forced by the caller (") + op_path_name(requested) + ")";
    return c;
  }
  if (p.world_size == 1) {
    c.path = OpPath::kFused;
    c.why = "one rank: nothing to communicate, the fused op is the bare engine";
    return c;
  }
  if (m.ranks_share_gpu) {
    c.path = OpPath::kUnfused;
    c.why = "ranks share one GPU: the reads compete with the GEMM for its SMs (measured slower fused)";
    return c;
  }
  constexpr double kArTailUs = 20;
  const double flops = 2.0 * p.m() * p.n * p.k;
  const double t_gemm_all = flops / (m.gemm_tflops * 1e12) * 1e6;
  const double t_gemm_fused = t_gemm_all * m.sms / std::max(1, m.gemm_sms);
  const double partial = static_cast<double>(p.m()) * p.n * p.elem_bytes();
  const double t_nccl = 2.0 * (p.world_size - 1) / p.world_size * partial / (m.link_gbps * 1e9) * 1e6;
  const double t_read = gemm_ar_comm_bytes(p) / (m.link_gbps * 1e9) * 1e6;
  c.unfused_us = t_gemm_all + t_nccl;
  c.fused_us = std::max(t_gemm_fused, t_read) + kArTailUs;
  c.path = c.fused_us <= c.unfused_us * (1 - m.margin) ? OpPath::kFused : OpPath::kUnfused;
  std::ostringstream os;
  os << "predicted fused (" << allreduce_algo_name(p.ar.algo) << ") " << c.fused_us << " us vs unfused "
     << c.unfused_us << " us (gemm " << t_gemm_all << " us on all SMs, " << t_gemm_fused << " on " << m.gemm_sms
     << "; reads " << t_read << " us; NCCL allreduce " << t_nccl << " us)";
  c.why = os.str();
  return c;
}

}  // namespace tilelink
