// Which of a rank's SMs compute and which communicate: the resource policy of every CUDA fused op,
// as one visible function. Pure host code (no CUDA), tested on the CPU (tests/tune/sm_split_test.cpp).
//
//   SmSplit s = split_sms({.sms = 132, .world_size = 2, .comm_sms = 16});
//   s.gemm_sms == 116, s.comm == CommEngine::kSms
//
// The comm program runs either on comm_sms SMs of the rank (a kernel beside the GEMM: GEMM+RS's
// reduce, GEMM+AR's AllReduce, AG+GEMM with --comm-sms) or on the copy engine (stream operations:
// AG+GEMM's default). The GEMM is persistent and fills every SM it is given, so what it is not
// given is what everything else can run on:
//   - comm on SMs: the GEMM takes the rest.
//   - copy engine, ranks on separate GPUs: nothing else needs an SM while eager (stream memory
//     operations); captured in a graph, the signal operations become one-thread kernels that run
//     beside the GEMM, so it leaves them kGraphSignalSms.
//   - copy engine, ranks sharing one GPU (virtual, or ipc processes on one GPU): a same-GPU
//     cudaMemcpy runs on SMs, and with every SM held by the GEMM it never ran (measured on the
//     H200 with virtual ranks; bench/diag/ce_probe.cu), so the GEMM leaves kCopySpareSms.
//   - compute_workers > 0 overrides the GEMM's count; world 1 has nothing to communicate.
#pragma once

#include <cstdint>

namespace tilelink {

enum class CommEngine : uint8_t { kNone, kSms, kCopyEngine };
const char* comm_engine_name(CommEngine e);

struct SmPolicyInput {
  int sms = 0;               // the rank's SMs (its green-context share on virtual ranks)
  int world_size = 1;
  int compute_workers = 0;   // the GEMM's SMs asked for; 0 = the rest
  int comm_sms = 0;          // SMs the comm program holds; 0 = the copy engine
  bool ranks_share_gpu = false;  // virtual ranks, or ipc processes on one GPU: a copy may run on SMs
  bool graph_mode = false;       // the op has been captured: stream signals are one-thread kernels
};

struct SmSplit {
  int gemm_sms = 0;
  int comm_sms = 0;  // the comm kernel's SMs (0 with the copy engine or no comm)
  CommEngine comm = CommEngine::kNone;
  int spare_sms = 0;  // left to the driver's copies or the graph's signal kernels
  const char* why = "";  // one line: why this split
};

inline constexpr int kCopySpareSms = 4;    // left to same-GPU copy-engine copies (virtual ranks)
inline constexpr int kGraphSignalSms = 1;  // left to a graph's one-thread signal kernels

// Throws (TL_REQUIRE) where the GEMM would get no SM.
SmSplit split_sms(const SmPolicyInput& in);

}  // namespace tilelink
