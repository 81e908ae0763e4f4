// The executor of the comm programs written over an executor (comm/allgather.hpp) on a thread
// block: one thread waits and notifies, the block moves the data (16-byte vectors), or its leader
// does through a bulk-copy pipeline (cp.async.bulk, the TMA engine). A wait is followed by a
// bar.sync (the acquire reaches every thread); a move by one too (every store done before the
// leader's release).
//
//   BlockExec<Scope::kGpu, false> x{ctx, heap, block};
//   x.barrier(barrier, epoch);
//   for (int i = blockIdx.x; i < plan.count(); i += gridDim.x) allgather_item(x, plan, i, epoch, a);
#pragma once

#include "tilelink/backend/cuda/prim.cuh"

namespace tilelink::cuda {

template <Scope S, bool kBulk>
struct BlockExec {
  const DeviceContext& ctx;
  const SymmetricView& heap;
  Block block;
  BulkPipe* pipe = nullptr;  // kBulk: the block's pipeline (initialised by its leader)

  TL_DEVICE std::byte* local(ByteField f) const { return heap.local(f); }
  TL_DEVICE std::byte* peer(int rank, ByteField f) const { return heap.peer(rank, f); }
  TL_DEVICE void barrier(Field<Signal> f, uint64_t epoch) const {
    if (block.leader()) rank_barrier<S>(ctx, heap, f, epoch);
    block.sync();
  }
  TL_DEVICE void wait(int owner, Field<Signal> f, int slot, uint64_t target, WaitSite site) const {
    if (block.leader()) peer_tile_wait<S>(ctx, heap, owner, f, slot, target, site);
    block.sync();
  }
  TL_DEVICE void pull(int owner, const Copy2D& c) const { move(owner, c, false); }
  TL_DEVICE void push(int peer, const Copy2D& c) const { move(peer, c, true); }
  TL_DEVICE void notify_local(Field<Signal> f, int slot, uint64_t value) const {
    if (block.leader()) producer_tile_notify<S>(ctx, heap, f, slot, value);
  }
  TL_DEVICE void notify_peer(int peer, Field<Signal> f, int slot, uint64_t value) const {
    if (block.leader()) peer_tile_notify<S>(ctx, heap, peer, f, slot, value);
  }

 private:
  TL_DEVICE void move(int rank, const Copy2D& c, bool push) const {
    if constexpr (kBulk) {
      if (block.leader()) {
        if (push) tile_push_data(ctx, rank, c, *pipe);
        else tile_pull_data(ctx, rank, c, *pipe);
      }
    } else {
      if (push) tile_push_data(ctx, rank, c, block);
      else tile_pull_data(ctx, rank, c, block);
    }
    block.sync();
  }
};

}  // namespace tilelink::cuda
