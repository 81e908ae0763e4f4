// The comm plans as collectives a user calls on their own (CUDA backend): the same programs the
// fused ops run beside their GEMMs, here on every SM of each rank (or the copy engine), each call
// opened by a stream barrier of every rank (the previous call's reads are done everywhere).
//
//   cuda::World world({.transport = cuda::Transport::kVirtual, .world_size = 4});
//   cuda::AllReduceCollective ar(world, M, N, AllReduceAlgo::kTwoShot);
//   // fill ar.input(r) [M, N] bf16 on every rank (stream order on world.stream(r)), then
//   ar.run(out);            // out[r] = sum over ranks of input, [M, N]
//   world.sync("allreduce");
//
// Inputs live in the symmetric heap (input(r)): a rank's peers read them in place. bf16, summed in
// rank order in fp32. Eager calls only (no graph capture).
#pragma once

#include <cstdint>
#include <vector>

#include "tilelink/comm/allgather.hpp"
#include "tilelink/comm/allreduce.hpp"
#include "tilelink/comm/reduce_scatter.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda {

// Row AllGather: rank r's rows [M_r, K] (rows.size(r) x k) into every rank's gathered [M, K].
class AllGatherCollective {
 public:
  // copy_engine: the comm program on stream operations and cudaMemcpy2DAsync; else on every SM
  // (bulk copies). comm_tile_rows: rows a tile (each announced on its own signal).
  AllGatherCollective(World& world, const RowPartition& rows, int64_t k, bool copy_engine, int comm_tile_rows);
  // a[r]: rank r's rows, device memory of its rank.
  void run(const std::vector<const void*>& a);
  const void* gathered(int rank) const;

 private:
  World& world_;
  std::vector<AllGatherPlan> plans_;
  Field<Signal> barrier_;
  SymmetricBuffer ws_;
  bool copy_engine_;
  uint64_t epoch_ = 0;
};

// Row ReduceScatter: every rank's input [M, N] summed; rank r receives rows [begin(r), end(r)).
class ReduceScatterCollective {
 public:
  ReduceScatterCollective(World& world, const RowPartition& rows, int64_t n);
  void* input(int rank) const;  // [M, N] bf16, in the symmetric heap
  // out[r]: [M_r, N] bf16 of rank r (16-byte aligned).
  void run(const std::vector<void*>& out);

 private:
  World& world_;
  std::vector<ReduceScatterPlan> plans_;
  Field<Signal> barrier_;
  SymmetricBuffer ws_;
  uint64_t epoch_ = 0;
};

// AllReduce (one-shot or two-shot = ReduceScatter then AllGather): every rank's out = the sum of
// every rank's input [M, N]. rows: the two-shot's segments (even by default).
class AllReduceCollective {
 public:
  AllReduceCollective(World& world, int64_t m, int64_t n, AllReduceAlgo algo);
  void* input(int rank) const;  // [M, N] bf16, in the symmetric heap
  void run(const std::vector<void*>& out);

 private:
  World& world_;
  std::vector<AllReducePlan> plans_;
  Field<Signal> barrier_;
  SymmetricBuffer ws_;
  uint64_t epoch_ = 0;
};

}  // namespace tilelink::cuda
