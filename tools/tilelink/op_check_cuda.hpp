// Any registered op (op_registry.hpp) on the CUDA backend, checked: fresh random bf16 inputs per
// rank, outputs poisoned (NaN) so unwritten tiles show, one fused and one unfused call, then the
// fused output against the baseline's and, where M*N*K <= p.ref_limit, both against the float64
// reference (op_check.hpp). The one harness of `tilelink run|bench <op>` on the CUDA backend and of
// the GPU tests that run every registered op (tests/gpu/test_op_registry.cu).
//
// CUDA headers: for the CUDA sources of the command line and the GPU tests.
#pragma once

#include <cstddef>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "op_check.hpp"
#include "op_registry.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cli {

// Device allocations of the local ranks, freed (each in its rank's context) when it goes.
class RankAllocs {
 public:
  explicit RankAllocs(cuda::World& world) : world_(world) {}
  ~RankAllocs();
  RankAllocs(const RankAllocs&) = delete;
  RankAllocs& operator=(const RankAllocs&) = delete;

  void* alloc(int r, size_t bytes);
  void* upload(int r, const std::vector<std::byte>& host);  // null for an empty matrix
  void* poisoned(int r, size_t bytes);                      // 0xff bytes: NaN in bf16

 private:
  cuda::World& world_;
  std::vector<std::pair<int, void*>> allocs_;
};

// Rank r's inputs come from their own generator, so a process makes only its own ranks' inputs
// (all of them where the float64 reference needs them) and every transport sees the same data.
std::mt19937_64 rank_rng(uint64_t seed, int r);

// One problem's operands on a CUDA world: every rank's A_r, B_r shaped as the spec says, C_r for
// the fused call and C_ref_r for the baseline, both poisoned.
struct CudaOperands {
  explicit CudaOperands(cuda::World& world) : mem(world) {}
  RankAllocs mem;
  bool with_ref = false;                        // M*N*K <= p.ref_limit: a float64 reference
  std::vector<std::vector<std::byte>> ha, hb;   // host inputs (every rank's with the reference)
  ConstPtrs a, b;
  Ptrs c, c_ref;
};
std::unique_ptr<CudaOperands> make_cuda_operands(const OpSpec& spec, cuda::World& world, const OpProblem& p);

// The errors of the local ranks (max; the caller combines over processes): the fused output's
// relative difference from the baseline's, and with the reference each one's relative error.
struct CudaCheck {
  double err_base = 0;      // fused vs the unfused baseline
  double err_ref = 0;       // fused vs float64
  double err_base_ref = 0;  // baseline vs float64
};
// One fused call (unless p.baseline_only) and one unfused call, synchronised, then compared.
CudaCheck check_cuda(const OpSpec& spec, CudaOpRun& op, cuda::World& world, const OpProblem& p,
                     const CudaOperands& x);
// One fused call captured in a CUDA graph on every local rank's stream, then `replays` times: fresh
// inputs in the same buffers (from a seed that follows p.seed), outputs poisoned, the graphs
// replayed, the unfused call run eagerly, and both compared as check_cuda does (worst over the
// replays). A replay that did not wait for its own call's data, or did not write every tile, shows.
CudaCheck check_cuda_graph(const OpSpec& spec, CudaOpRun& op, cuda::World& world, OpProblem p, CudaOperands& x,
                           int replays);

}  // namespace tilelink::cli
