// Internal to the CUDA comm programs: the reduction every reduce program shares (fp32 sums in rank
// order, one rounding: the bits of the CPU backend), and the shared work counter that lets warps of
// several launches split one call's work.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda/atomic>

#include <cstddef>
#include <cstdint>

#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/comm/reduce_scatter.hpp"
#include "tilelink/core/dtype.hpp"

namespace tilelink::cuda::detail {

// ---- element conversions: the same rounding as core/dtype.hpp on the host ----------------------
template <DType D>
struct Elem;
template <>
struct Elem<DType::kF32> {
  using T = float;
  static TL_DEVICE float load(T x) { return x; }
  static TL_DEVICE T store(float v) { return v; }
};
template <>
struct Elem<DType::kBF16> {
  using T = __nv_bfloat16;
  static TL_DEVICE float load(T x) { return __bfloat162float(x); }
  static TL_DEVICE T store(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Elem<DType::kF16> {
  using T = __half;
  static TL_DEVICE float load(T x) { return __half2float(x); }
  static TL_DEVICE T store(float v) { return __float2half_rn(v); }
};

// Rows of a band, the item one warp takes at a time.
constexpr int kBandRows = kReduceBandRows;

// The next band of this call, claimed from the shared counter (one lane): its high half tags the
// call (the epoch's low 32 bits), its low half counts claims; the first claim of a call re-tags it.
TL_DEVICE inline int64_t claim_band(uint64_t* claims, uint64_t epoch) {
  const uint64_t tag = epoch & 0xffffffffu;
  ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_device> counter(*claims);
  uint64_t seen = counter.load(::cuda::memory_order_relaxed);
  while ((seen >> 32) != tag)
    if (counter.compare_exchange_weak(seen, (tag << 32) | 1u, ::cuda::memory_order_relaxed))
      return 0;
  return static_cast<int64_t>(counter.fetch_add(1, ::cuda::memory_order_relaxed) & 0xffffffffu);
}

// Where source s's copy of a reduce tile's first element lives, and its row stride (elements).
struct Sources {
  const std::byte* base[kMaxWorldSize];
  int64_t ld;
};

// out[i, j] = sum over s = 0..W-1 (in that order) of src_s[i, j], fp32, one rounding: the same
// reduction as the CPU backend's reduce_tile, so the same bits. `group`: the threads that share the
// rect (index(), size()); the function never synchronises them.
template <DType D, class Group>
__device__ void reduce_rect(const Sources& src, int world, std::byte* out_b, int64_t out_ld,
                            int64_t rows, int64_t cols, Group block) {
  using E = Elem<D>;
  using T = typename E::T;
  constexpr int kVec = 16 / sizeof(T);
  T* out = reinterpret_cast<T*>(out_b);
  bool vec = cols % kVec == 0 && out_ld % kVec == 0 && src.ld % kVec == 0 &&
             reinterpret_cast<uintptr_t>(out_b) % 16 == 0;
  for (int s = 0; s < world; ++s) vec = vec && reinterpret_cast<uintptr_t>(src.base[s]) % 16 == 0;
  const int64_t vec_total = rows * (cols / kVec);
  if (vec && world <= 2 && vec_total <= INT32_MAX / 2) {  // NOTE: room for base + kUnroll * threads
    // Two sources (a world of two): 16 vectors a thread in flight, 32-bit indices, and no running sum
    // held across loads, so it fits the 512-thread launch's 128 registers without spilling.
    constexpr int kUnroll = 8;
    const int per_row = static_cast<int>(cols / kVec), total = static_cast<int>(vec_total);
    const T* s0 = reinterpret_cast<const T*>(src.base[0]);
    const T* s1 = world == 2 ? reinterpret_cast<const T*>(src.base[1]) : nullptr;
    for (int base = block.index(); base < total; base += block.size() * kUnroll) {
      uint4 x0[kUnroll], x1[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int v = base + u * block.size();
        const int i = v / per_row, j = (v - i * per_row) * kVec;
        const int64_t off = i * src.ld + j;
        x0[u] = v < total ? *reinterpret_cast<const uint4*>(s0 + off) : make_uint4(0, 0, 0, 0);
        x1[u] = v < total && s1 ? *reinterpret_cast<const uint4*>(s1 + off) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int v = base + u * block.size();
        if (v >= total) continue;
        const int i = v / per_row, j = (v - i * per_row) * kVec;
        const T* a = reinterpret_cast<const T*>(&x0[u]);
        const T* b = reinterpret_cast<const T*>(&x1[u]);
        uint4 packed;
        T* y = reinterpret_cast<T*>(&packed);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          float acc = 0.f;  // NOTE: 0 + a + b in this order, as the running sum below and the CPU do
          acc += E::load(a[e]);
          if (s1) acc += E::load(b[e]);
          y[e] = E::store(acc);
        }
        *reinterpret_cast<uint4*>(out + i * out_ld + j) = packed;
      }
    }
  } else if (vec) {
    // kUnroll vectors a thread, from two sources at a time, all loaded before any is added: 8 16-byte
    // loads in flight per thread. One vector at a time left a peer's reads latency-bound (~30 GB/s on
    // 8 SMs over NVLink). Sums stay in rank order, one rounding: the same bits as before.
    constexpr int kUnroll = 4;
    const int64_t per_row = cols / kVec, total = rows * per_row;
    const int64_t stride = block.size();
    for (int64_t base = block.index(); base < total; base += stride * kUnroll) {
      int64_t row[kUnroll], col[kUnroll];
      bool live[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = base + u * stride;
        live[u] = v < total;
        // NOTE: 32-bit division where it fits (a reduce tile always does): a 64-bit one per vector
        // costs more issue slots than moving the vector.
        row[u] = total <= INT32_MAX ? static_cast<int64_t>(static_cast<uint32_t>(v) / static_cast<uint32_t>(per_row))
                                    : v / per_row;
        col[u] = (v - row[u] * per_row) * kVec;
      }
      float acc[kUnroll][kVec];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[u][e] = 0.f;
      auto add = [&](const uint4 (&raw)[kUnroll]) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const T* x = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[u][e] += E::load(x[e]);
        }
      };
      auto load = [&](int s, uint4 (&raw)[kUnroll]) {
        const T* from = reinterpret_cast<const T*>(src.base[s]);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          raw[u] = live[u] ? *reinterpret_cast<const uint4*>(from + row[u] * src.ld + col[u]) : make_uint4(0, 0, 0, 0);
      };
      for (int s = 0; s < world; s += 2) {
        uint4 r0[kUnroll], r1[kUnroll];
        load(s, r0);
        if (s + 1 < world) load(s + 1, r1);
        add(r0);
        if (s + 1 < world) add(r1);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (!live[u]) continue;
        uint4 packed;
        T* y = reinterpret_cast<T*>(&packed);
#pragma unroll
        for (int e = 0; e < kVec; ++e) y[e] = E::store(acc[u][e]);
        *reinterpret_cast<uint4*>(out + row[u] * out_ld + col[u]) = packed;
      }
    }
  } else {
    const int64_t total = rows * cols;
    for (int64_t v = block.index(); v < total; v += block.size()) {
      const int64_t i = v / cols, j = v - i * cols;
      float acc = 0.f;
      for (int s = 0; s < world; ++s)
        acc += E::load(reinterpret_cast<const T*>(src.base[s])[i * src.ld + j]);
      out[i * out_ld + j] = E::store(acc);
    }
  }
}

// The next item of a walk, claimed by lane 0 from the shared counter (warp-uniform result).
TL_DEVICE inline int claim(uint64_t* counter, uint64_t epoch, Warp lanes) {
  long long j = lanes.index() == 0 ? claim_band(counter, epoch) : 0;
  return static_cast<int>(__shfl_sync(0xffffffffu, j, 0));
}

// The executor of the reduce programs (comm/reduce_scatter.hpp, comm/allreduce.hpp) on one warp.
template <Scope S>
struct WarpExec {
  const SymmetricView& heap;
  const DeviceContext& ctx;
  Warp lanes;

  TL_DEVICE std::byte* local(ByteField f) const { return heap.local(f); }
  TL_DEVICE std::byte* peer(int rank, ByteField f) const { return heap.peer(rank, f); }

  // Every lane acquires the signal itself: its own loads follow its own acquire.
  TL_DEVICE void wait(int owner, Field<Signal> f, int slot, uint64_t target, WaitSite site) const {
    peer_tile_wait<S>(ctx, heap, owner, f, slot, target, site);
  }
  TL_DEVICE void pull(int owner, const Copy2D& c) const { tile_pull_data(ctx, owner, c, lanes); }
  // After the warp's stores: __syncwarp orders them before lane 0's release (cumulative).
  TL_DEVICE void notify_local(Field<Signal> f, int slot, uint64_t value) const {
    lanes.sync();
    if (lanes.leader()) producer_tile_notify<S>(ctx, heap, f, slot, value);
  }

  // One wait a lane, so the waits' round trips (a peer's signal is an NVLink round trip) overlap
  // instead of adding up; then the warp syncs: every lane's loads after it come after every lane's
  // acquire.
  template <class Fn>
  TL_DEVICE void wait_each(int count, Fn&& wait_at, Field<Signal> f, uint64_t target, SignalField name) const {
    for (int w = lanes.index(); w < count; w += 32) {
      int holder = 0, slot = 0, tile = 0;
      wait_at(w, &holder, &slot, &tile);
      peer_tile_wait<S>(ctx, heap, holder, f, slot, target, WaitSite{name, tile});
    }
    lanes.sync();
  }

  template <class Src>
  TL_DEVICE void sum(int count, Src&& src, int64_t src_ld, void* out, int64_t out_ld, int64_t rows, int64_t cols,
                     DType dtype) const {
    Sources srcs;
    srcs.ld = src_ld;
    for (int s = 0; s < count; ++s) srcs.base[s] = src(s);
    std::byte* o = static_cast<std::byte*>(out);
    switch (dtype) {
      case DType::kF32: reduce_rect<DType::kF32>(srcs, count, o, out_ld, rows, cols, lanes); break;
      case DType::kBF16: reduce_rect<DType::kBF16>(srcs, count, o, out_ld, rows, cols, lanes); break;
      case DType::kF16: reduce_rect<DType::kF16>(srcs, count, o, out_ld, rows, cols, lanes); break;
    }
  }
};

}  // namespace tilelink::cuda::detail
