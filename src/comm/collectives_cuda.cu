// The comm plans as stand-alone collectives (include/tilelink/comm/collectives_cuda.hpp).
#include "tilelink/comm/collectives_cuda.hpp"

#include "../ops/cuda/tile_done_hooks.cuh"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/backend/cuda/stream_prim.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/cuda/comm.hpp"

namespace tilelink::cuda {

// ---- AllGather --------------------------------------------------------------------------------

AllGatherCollective::AllGatherCollective(World& world, const RowPartition& rows, int64_t k, bool copy_engine,
                                         int comm_tile_rows)
    : world_(world), copy_engine_(copy_engine) {
  TL_REQUIRE(rows.world_size == world.size(),
             "allgather: the row partition has " << rows.world_size << " ranks, the world " << world.size());
  TL_REQUIRE(k >= 8 && k % 8 == 0, "allgather: K must be a positive multiple of 8 (16-byte rows), got " << k);
  LayoutBuilder b;
  for (int r = 0; r < world.size(); ++r)
    plans_.push_back(AllGatherPlan::make(r, rows, k * dtype_size(DType::kBF16), comm_tile_rows, CommMode::kPull));
  AllGatherPlan layout = plans_[0];
  layout.make_layout(b);
  barrier_ = b.add<Signal>(world.size());
  for (AllGatherPlan& p : plans_) p.f = layout.f;
  ws_ = world.allocate(b.num_bytes());
}

void AllGatherCollective::run(const std::vector<const void*>& a) {
  TL_REQUIRE(static_cast<int>(a.size()) == world_.size(), "allgather: one input per rank");
  ++epoch_;  // the comm program opens with its own entry barrier
  for (int r : world_.local_ranks())
    launch_allgather(world_, plans_[r], barrier_, ws_.view(r), a[r], epoch_,
                     copy_engine_ ? CommLaunch{CopyMethod::kCopyEngine, 0}
                                  : CommLaunch{CopyMethod::kBulk, world_.sm_count(r)});
}

const void* AllGatherCollective::gathered(int rank) const { return plans_.at(rank).f.gathered.in(ws_.base(rank)); }

// ---- ReduceScatter ----------------------------------------------------------------------------

ReduceScatterCollective::ReduceScatterCollective(World& world, const RowPartition& rows, int64_t n)
    : world_(world) {
  TL_REQUIRE(rows.world_size == world.size(),
             "reduce_scatter: the row partition has " << rows.world_size << " ranks, the world " << world.size());
  TL_REQUIRE(n >= 8 && n % 8 == 0, "reduce_scatter: N must be a positive multiple of 8, got " << n);
  // The producer grid: 128 x 128 tiles, all announced at once (the input is whole when a call starts).
  LayoutBuilder b;
  for (int r = 0; r < world.size(); ++r)
    plans_.push_back(ReduceScatterPlan::make(r, rows, n, DType::kBF16, CommMode::kPull, 128, 128, 1,
                                             kReduceBandRows, 512));
  ReduceScatterPlan layout = plans_[0];
  layout.make_layout(b);
  barrier_ = b.add<Signal>(world.size());
  for (ReduceScatterPlan& p : plans_) p.f = layout.f;
  ws_ = world.allocate(b.num_bytes());
}

void* ReduceScatterCollective::input(int rank) const { return plans_.at(rank).f.partial.in(ws_.base(rank)); }

void ReduceScatterCollective::run(const std::vector<void*>& out) {
  TL_REQUIRE(static_cast<int>(out.size()) == world_.size(), "reduce_scatter: one output per rank");
  ++epoch_;
  for (int r : world_.local_ranks()) {  // barrier: every input is in place, every previous read done
    world_.bind(r);
    StreamContext sc{&world_, r, world_.stream(r), "reduce_scatter"};
    rank_barrier(sc, ws_.view(r), barrier_, epoch_);
    detail::launch_set_signals(ws_.view(r).local(plans_[r].f.tile_done), plans_[r].producer.num_tiles(), epoch_,
                               world_.stream(r));
  }
  for (int r : world_.local_ranks())
    launch_reduce_scatter(world_, plans_[r], ws_.view(r), out[r], epoch_,
                          CommLaunch{CopyMethod::kVector, world_.sm_count(r)});
}

// ---- AllReduce --------------------------------------------------------------------------------

AllReduceCollective::AllReduceCollective(World& world, int64_t m, int64_t n, AllReduceAlgo algo) : world_(world) {
  TL_REQUIRE(n >= 8 && n % 8 == 0, "allreduce: N must be a positive multiple of 8, got " << n);
  const RowPartition rows = RowPartition::even(m, world.size());
  LayoutBuilder b;
  for (int r = 0; r < world.size(); ++r) plans_.push_back(AllReducePlan::make(r, algo, rows, n, DType::kBF16, 128, 128, 1));
  AllReducePlan layout = plans_[0];
  layout.make_layout(b);
  barrier_ = b.add<Signal>(world.size());
  for (AllReducePlan& p : plans_) p.f = layout.f;
  ws_ = world.allocate(b.num_bytes());
}

void* AllReduceCollective::input(int rank) const { return plans_.at(rank).f.partial.in(ws_.base(rank)); }

void AllReduceCollective::run(const std::vector<void*>& out) {
  TL_REQUIRE(static_cast<int>(out.size()) == world_.size(), "allreduce: one output per rank");
  ++epoch_;
  for (int r : world_.local_ranks()) {
    world_.bind(r);
    StreamContext sc{&world_, r, world_.stream(r), "allreduce"};
    rank_barrier(sc, ws_.view(r), barrier_, epoch_);
    detail::launch_set_signals(ws_.view(r).local(plans_[r].f.tile_done), plans_[r].producer.num_tiles(), epoch_,
                               world_.stream(r));
  }
  for (int r : world_.local_ranks())
    launch_allreduce(world_, plans_[r], ws_.view(r), out[r], epoch_,
                     CommLaunch{CopyMethod::kVector, world_.sm_count(r)});
}

}  // namespace tilelink::cuda
