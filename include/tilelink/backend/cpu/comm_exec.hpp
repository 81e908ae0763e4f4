// The CPU executors of the comm programs written over an executor (comm/allgather.hpp,
// comm/reduce_scatter.hpp, comm/allreduce.hpp, comm/alltoall.hpp): a rank thread's primitives
// (backend/cpu/prim.hpp) under the names the programs call.
//
//   const cpu::CommExec x{ctx, heap};
//   for (int i = worker; i < plan.count(); i += workers) allgather_item(x, plan, i, epoch, a);
//   for (int j = worker; j < ar.reduce_count(); j += workers) allreduce_reduce_item(x, ar, j, epoch, c);
#pragma once

#include <cstddef>
#include <vector>

#include "tilelink/backend/cpu/prim.hpp"
#include "tilelink/comm/allgather.hpp"
#include "tilelink/comm/allreduce.hpp"
#include "tilelink/comm/reduce_scatter.hpp"
#include "tilelink/comm/alltoall.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cpu {

// out[i, j] = sum over s < count, in order, of src(s)[i, j] (fp32, rounded once): each source's
// rect pulled (a data move from rank s), then summed. The one reduction of every CPU program.
template <class Src>
void sum_sources(const RankContext& ctx, int count, Src&& src, int64_t src_ld, void* out, int64_t out_ld,
                 int64_t rows, int64_t cols, DType dtype) {
  const int64_t eb = dtype_size(dtype), elems = rows * cols;
  std::vector<std::byte> pulled(static_cast<size_t>(elems * eb * count));
  for (int s = 0; s < count; ++s)
    tile_pull_data(ctx, s, Copy2D{src(s), src_ld * eb, pulled.data() + s * elems * eb, cols * eb, rows, cols * eb});
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float acc = 0.f;
      for (int s = 0; s < count; ++s) acc += load_as_float(pulled.data(), dtype, s * elems + i * cols + j);
      store_from_float(out, dtype, i * out_ld + j, acc);
    }
}

// The executor of the comm programs (AllGather, ReduceScatter, AllReduce): every wait, move, sum and
// notify of a rank thread.
struct CommExec {
  const RankContext& ctx;
  const SymmetricView& heap;

  std::byte* local(ByteField f) const { return heap.local(f); }
  std::byte* peer(int rank, ByteField f) const { return heap.peer(rank, f); }
  void barrier(Field<Signal> f, uint64_t epoch) const { rank_barrier(ctx, heap, f, epoch); }
  void wait(int owner, Field<Signal> f, int slot, uint64_t target, WaitSite site) const {
    peer_tile_wait(ctx, heap, owner, f, slot, target, site);
  }
  void pull(int owner, const Copy2D& c) const { tile_pull_data(ctx, owner, c); }
  void push(int peer, const Copy2D& c) const { tile_push_data(ctx, peer, c); }
  void notify_local(Field<Signal> f, int slot, uint64_t value) const {
    producer_tile_notify(ctx, heap, f, slot, value);
  }
  void notify_peer(int peer, Field<Signal> f, int slot, uint64_t value) const {
    peer_tile_notify(ctx, heap, peer, f, slot, value);
  }
  template <class Fn>
  void wait_each(int count, Fn&& wait_at, Field<Signal> f, uint64_t target, SignalField name) const {
    for (int w = 0; w < count; ++w) {
      int holder = 0, slot = 0, tile = 0;
      wait_at(w, &holder, &slot, &tile);
      peer_tile_wait(ctx, heap, holder, f, slot, target, WaitSite{name, tile});
    }
  }
  template <class Src>
  void sum(int count, Src&& src, int64_t src_ld, void* out, int64_t out_ld, int64_t rows, int64_t cols,
           DType dtype) const {
    sum_sources(ctx, count, src, src_ld, out, out_ld, rows, cols, dtype);
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
    consumer_tile_wait(ctx, heap, f, slot, target, WaitSite{f.offset == p.f.counts_ready.offset ? SignalField::kCountsReady : SignalField::kRowsReady, slot});
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
