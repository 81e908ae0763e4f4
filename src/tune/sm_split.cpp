// The SM split of a fused op's rank (tune/sm_split.hpp).
#include "tilelink/tune/sm_split.hpp"

#include "tilelink/core/error.hpp"

namespace tilelink {

const char* comm_engine_name(CommEngine e) {
  switch (e) {
    case CommEngine::kNone: return "none";
    case CommEngine::kSms: return "SMs";
    case CommEngine::kCopyEngine: return "copy engine";
  }
  return "?";
}

SmSplit split_sms(const SmPolicyInput& in) {
  TL_REQUIRE(in.sms >= 1 && in.world_size >= 1, "split_sms: " << in.sms << " SMs, world " << in.world_size);
  TL_REQUIRE(in.compute_workers >= 0 && in.comm_sms >= 0,
             "split_sms: compute_workers (" << in.compute_workers << ") and comm SMs (" << in.comm_sms
                                            << ") must be >= 0");
  SmSplit s;
  if (in.world_size == 1) {
    s.gemm_sms = in.compute_workers > 0 ? in.compute_workers : in.sms;
    s.why = "world 1: nothing to communicate";
  } else if (in.comm_sms > 0) {
    s.comm = CommEngine::kSms;
    s.comm_sms = in.comm_sms;
    s.gemm_sms = in.compute_workers > 0 ? in.compute_workers : in.sms - in.comm_sms;
    s.why = "the comm kernel on its SMs, the GEMM on the rest";
  } else {
    s.comm = CommEngine::kCopyEngine;
    s.spare_sms = in.ranks_share_gpu ? kCopySpareSms : in.graph_mode ? kGraphSignalSms : 0;
    if (s.spare_sms >= in.sms) s.spare_sms = 0;  // too few SMs to spare any
    s.gemm_sms = in.compute_workers > 0 ? in.compute_workers : in.sms - s.spare_sms;
    s.why = in.ranks_share_gpu ? "copy engine; same-GPU copies run on the spare SMs"
            : in.graph_mode    ? "copy engine; the graph's signal kernels run on the spare SM"
                               : "copy engine; stream memory operations need no SM";
  }
  TL_REQUIRE(in.world_size == 1 || in.compute_workers == 0 || in.compute_workers + s.comm_sms < in.sms,
             "the rank has " << in.sms << " SMs; compute_workers (" << in.compute_workers << ") + comm SMs ("
                             << s.comm_sms << ") must be fewer: they must leave the GEMM at least one");
  TL_REQUIRE(s.gemm_sms >= 1 && s.gemm_sms <= in.sms,
             "the rank has " << in.sms << " SMs; the GEMM would run on " << s.gemm_sms << " (comm SMs "
                             << s.comm_sms << ", compute_workers " << in.compute_workers << ")");
  return s;
}

}  // namespace tilelink
