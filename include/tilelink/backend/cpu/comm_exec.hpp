// The CPU executor of the comm programs written over an executor (comm/allreduce.hpp): a rank
// thread's primitives (backend/cpu/prim.hpp) under the names the programs call.
//
//   cpu::AllReduceExec x{ctx, heap, plan};
//   for (int j = worker; j < plan.reduce_count(); j += workers) allreduce_reduce_item(x, plan, j, epoch, c);
#pragma once

#include <cstddef>
#include <vector>

#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/comm/allreduce.hpp"
#include "tilelink/comm/alltoall.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

struct AllReduceExec {
  const RankContext& ctx;
  const SymmetricView& heap;
  const AllReducePlan& p;
  std::vector<std::byte> pulled{};  // the sources' rects of the item being summed

  template <class Fn>
  void wait_each(int count, Fn&& wait_at, uint64_t target) {
    for (int w = 0; w < count; ++w) {
      int source = 0, slot = 0;
      wait_at(w, &source, &slot);
      peer_tile_wait(ctx, heap, source, p.f.tile_done, slot, target, WaitSite{"tile_done", slot});
    }
  }

  // out[rect] = sum over s = 0..W-1 of partial_s[rect], fp32, rounded once (rows of out at rect.row).
  void sum(const AllReducePlan& plan, const Rect& r, void* out, int64_t out_ld) {
    const int64_t eb = dtype_size(plan.dtype), elems = r.rows * r.cols;
    pulled.resize(static_cast<size_t>(elems * eb * plan.world_size));
    for (int s = 0; s < plan.world_size; ++s)
      tile_pull_data(ctx, s,
                     Copy2D{heap.peer(s, plan.f.partial) + (r.row * plan.n + r.col) * eb, plan.n * eb,
                            pulled.data() + s * elems * eb, r.cols * eb, r.rows, r.cols * eb});
    for (int64_t i = 0; i < r.rows; ++i)
      for (int64_t j = 0; j < r.cols; ++j) {
        float acc = 0.f;
        for (int s = 0; s < plan.world_size; ++s) acc += load_as_float(pulled.data(), plan.dtype, s * elems + i * r.cols + j);
        store_from_float(out, plan.dtype, (r.row + i) * out_ld + r.col + j, acc);
      }
  }

  void* local_reduced() const { return heap.local(p.f.reduced); }
  void notify_local(Field<Signal> f, int slot, uint64_t value) {
    producer_tile_notify(ctx, heap, f, slot, value);
  }
  void wait_band(int owner, int slot, uint64_t target) {
    peer_tile_wait(ctx, heap, owner, p.f.band_ready, slot, target, WaitSite{"band_ready", slot});
  }
  void copy_rows(int owner, const Rect& r, void* dst, int64_t dst_ld) {
    const int64_t eb = dtype_size(p.dtype);
    tile_pull_data(ctx, owner,
                   Copy2D{heap.peer(owner, p.f.reduced) + (r.row * p.n + r.col) * eb, p.n * eb,
                          static_cast<std::byte*>(dst) + (r.row * dst_ld + r.col) * eb, dst_ld * eb, r.rows,
                          r.cols * eb});
  }
};

// The AllToAll exchange's executor (comm/alltoall.hpp) on a rank thread.
struct AllToAllExec {
  const RankContext& ctx;
  const SymmetricView& heap;
  const AllToAllPlan& p;

  void put_count(int peer, int slot, int64_t n) { heap.peer(peer, p.f.counts)[slot] = n; }
  void notify_peer(int peer, Field<Signal> f, int slot, uint64_t value) {
    peer_tile_notify(ctx, heap, peer, f, slot, value);
  }
  void wait_local(Field<Signal> f, int slot, uint64_t target) {
    consumer_tile_wait(ctx, heap, f, slot, target, WaitSite{f.offset == p.f.counts_ready.offset ? "counts_ready" : "rows_ready", slot});
  }
  int64_t local_count(int slot) const { return heap.local(p.f.counts)[slot]; }
  void push_rows(int peer, int64_t offset, const void* src, int64_t bytes) {
    tile_push_data(ctx, peer, Copy2D{src, bytes, heap.peer(peer, p.f.staging) + offset, bytes, 1, bytes});
  }
  void copy_local(int64_t offset, void* dst, int64_t bytes) {
    tile_pull_data(ctx, ctx.rank, Copy2D{heap.local(p.f.staging) + offset, bytes, dst, bytes, 1, bytes});
  }
  [[noreturn]] void fail_capacity(int peer, int64_t n) {
    std::ostringstream os;
    os << "alltoall: rank " << ctx.rank << " sends " << n << " rows to rank " << peer << "; the plan holds 0.."
       << p.capacity << " a pair";
    ::tilelink::detail::throw_error(__FILE__, __LINE__, os.str());
  }
};

}  // namespace tilelink::cpu
