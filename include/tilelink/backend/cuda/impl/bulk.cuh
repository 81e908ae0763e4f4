// Bodies of the bulk-copy data primitives (contracts: backend/cuda/prim.cuh): global -> shared by
// cp.async.bulk completing on an mbarrier, shared -> global by cp.async.bulk in bulk groups.
#pragma once

#include <cuda/ptx>

namespace tilelink::cuda {

namespace detail {
// NOTE: hand-written: CCCL's cuda::ptx has no cp.async.bulk.prefetch (PTX ISA 8.0, sm_90).
TL_DEVICE TL_INLINE void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
}  // namespace detail

TL_DEVICE inline void BulkPipe::init(void* smem, uint64_t* bars, int stages, uint32_t stage_bytes,
                                     const DeviceContext& ctx) {
  smem_ = static_cast<char*>(smem);
  bars_ = bars;
  stages_ = stages < 2 ? 2 : stages;  // NOTE: the refill scheme below needs two stages at least
  stage_bytes_ = stage_bytes & ~15u;
  loaded_ = 0;
  ctx_ = ctx;
  for (int s = 0; s < stages_; ++s) ::cuda::ptx::mbarrier_init(&bars_[s], 1);
  // Make the initialized barriers visible to the async proxy (the bulk copies complete on them).
  ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
}

TL_DEVICE inline void BulkPipe::load(uint64_t chunk, const char* src, uint32_t bytes) {
  uint64_t* bar = &bars_[chunk % stages_];
  ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                         ::cuda::ptx::space_shared, bar, bytes);
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global,
                             smem_ + (chunk % stages_) * stage_bytes_, src, bytes, bar);
}

TL_DEVICE inline void BulkPipe::wait_loaded(uint64_t chunk) {
  uint64_t* bar = &bars_[chunk % stages_];
  const uint32_t parity = static_cast<uint32_t>((chunk / stages_) & 1);
  if (::cuda::ptx::mbarrier_try_wait_parity(bar, parity)) return;
  const uint64_t t0 = detail::now_ns();
  while (!::cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
    uint64_t waited = detail::now_ns() - t0;
    if (waited > ctx_.timeout_ns)
      detail::fail_wait(ctx_, ctx_.rank, -1, static_cast<int>(chunk % stages_), SignalField::kSignal,
                        chunk / stages_ + 1, 0, waited, 1);
  }
}

TL_DEVICE inline void BulkPipe::copy(const void* src_v, void* dst_v, uint64_t bytes) {
  if (bytes == 0) return;
  const char* src = static_cast<const char*>(src_v);
  char* dst = static_cast<char*>(dst_v);
  const uint64_t sb = stage_bytes_;
  const uint64_t n = (bytes + sb - 1) / sb;
  const uint64_t first = loaded_;
  auto chunk_bytes = [&](uint64_t j) {
    return static_cast<uint32_t>(bytes - j * sb < sb ? bytes - j * sb : sb);
  };
  const uint64_t prefetch = n < static_cast<uint64_t>(stages_) ? n : stages_;
  for (uint64_t j = 0; j < prefetch; ++j) load(first + j, src + j * sb, chunk_bytes(j));
  const uint64_t ahead = static_cast<uint64_t>(prefetch_);
  if (ahead)
    for (uint64_t k = stages_; k < n && k < stages_ + ahead; ++k)
      detail::prefetch_l2(src + k * sb, chunk_bytes(k));
  for (uint64_t j = 0; j < n; ++j) {
    wait_loaded(first + j);
    ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared, dst + j * sb,
                               smem_ + ((first + j) % stages_) * sb, chunk_bytes(j));
    ::cuda::ptx::cp_async_bulk_commit_group();
    // Refill the stage of chunk j-1 once its store has read shared memory.
    if (j >= 1 && j - 1 + stages_ < n) {
      ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<1>{});
      uint64_t next = j - 1 + stages_;
      load(first + next, src + next * sb, chunk_bytes(next));
      if (ahead && next + ahead < n) detail::prefetch_l2(src + (next + ahead) * sb, chunk_bytes(next + ahead));
    }
  }
  loaded_ = first + n;
  // Every store complete, and ordered before the caller's next generic-proxy operation (a notify).
  ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<0>{});
  ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_global);
}

TL_DEVICE inline void BulkPipe::copy(const Copy2D& c) {
  if (c.rows <= 0 || c.row_bytes <= 0) return;
  const bool flat = c.rows == 1 || (c.src_pitch == c.row_bytes && c.dst_pitch == c.row_bytes);
  const uint64_t bits = reinterpret_cast<uintptr_t>(c.src) | reinterpret_cast<uintptr_t>(c.dst) |
                        static_cast<uint64_t>(c.row_bytes) |
                        (flat ? 0 : static_cast<uint64_t>(c.src_pitch | c.dst_pitch));
  if (bits % 16 != 0) {
    detail::copy_2d(c, Thread{});  // NOTE: bulk copies need 16-byte alignment
    return;
  }
  if (flat) {
    copy(c.src, c.dst, static_cast<uint64_t>(c.rows * c.row_bytes));
    return;
  }
  for (int64_t r = 0; r < c.rows; ++r)
    copy(static_cast<const char*>(c.src) + r * c.src_pitch,
         static_cast<char*>(c.dst) + r * c.dst_pitch, static_cast<uint64_t>(c.row_bytes));
}

TL_DEVICE inline void tile_push_data(const DeviceContext&, int, const Copy2D& copy, BulkPipe& pipe) {
  pipe.copy(copy);
}

TL_DEVICE inline void tile_pull_data(const DeviceContext&, int, const Copy2D& copy, BulkPipe& pipe) {
  pipe.copy(copy);
}

}  // namespace tilelink::cuda
