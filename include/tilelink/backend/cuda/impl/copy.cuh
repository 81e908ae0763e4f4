// Bodies of the CUDA vector-copy data primitives (contracts: backend/cuda/prim.cuh).
#pragma once

#include <cstdint>

namespace tilelink::cuda {

namespace detail {

inline constexpr int kVectorsInFlight = 8;

// Element `i` (of `per_row` per row) of a 2-D copy, as a byte offset into src and dst.
struct RowMap {
  int64_t per_row, src_pitch, dst_pitch;
  TL_DEVICE TL_INLINE void at(int64_t i, int64_t esize, int64_t* so, int64_t* dof) const {
    int64_t row = i / per_row, col = i - row * per_row;
    *so = row * src_pitch + col * esize;
    *dof = row * dst_pitch + col * esize;
  }
};

// How a group-wide vector copy issues its memory operations. The primitives use the defaults;
// `tilelink bench prim` instantiates others to measure them.
//   in_flight: 16-byte (or narrower) loads each thread issues before its first store;
//   no_l1:     16-byte loads skip L1 allocation (ld.global.L1::no_allocate: coherent, uncached in L1).
template <int kInFlight = kVectorsInFlight, bool kNoL1 = false>
struct VectorTuning {
  static constexpr int in_flight = kInFlight;
  static constexpr bool no_l1 = kNoL1;
};

template <class V, bool kNoL1>
TL_DEVICE TL_INLINE V load_vector(const char* p) {
  if constexpr (kNoL1 && sizeof(V) == 16) {
    // NOTE: volatile keeps it after any acquire (also volatile asm) that guards the data.
    uint4 r;
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return *reinterpret_cast<V*>(&r);
  } else {
    return *reinterpret_cast<const V*>(p);
  }
}

// Group-wide copy of `total` elements of type V; Tuning::in_flight loads in flight per thread
// before the stores.
template <class Tuning, class V, class Group>
TL_DEVICE TL_INLINE void copy_elems(const char* src, char* dst, int64_t total, RowMap map, bool flat,
                                    Group g) {
  constexpr int kN = Tuning::in_flight;
  const int64_t stride = g.size();
  for (int64_t base = g.index(); base < total; base += stride * kN) {
    V r[kN];
#pragma unroll
    for (int u = 0; u < kN; ++u) {
      int64_t i = base + u * stride;
      if (i < total) {
        int64_t so = i * static_cast<int64_t>(sizeof(V)), dof = so;
        if (!flat) map.at(i, sizeof(V), &so, &dof);
        r[u] = load_vector<V, Tuning::no_l1>(src + so);
      }
    }
#pragma unroll
    for (int u = 0; u < kN; ++u) {
      int64_t i = base + u * stride;
      if (i < total) {
        int64_t so = i * static_cast<int64_t>(sizeof(V)), dof = so;
        if (!flat) map.at(i, sizeof(V), &so, &dof);
        *reinterpret_cast<V*>(dst + dof) = r[u];
      }
    }
  }
}

template <class Tuning = VectorTuning<>, class Group>
TL_DEVICE TL_INLINE void copy_2d(const Copy2D& c, Group g) {
  if (c.rows <= 0 || c.row_bytes <= 0) return;
  const char* src = static_cast<const char*>(c.src);
  char* dst = static_cast<char*>(c.dst);
  const bool flat = c.rows == 1 || (c.src_pitch == c.row_bytes && c.dst_pitch == c.row_bytes);
  const uint64_t bits = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                        static_cast<uint64_t>(c.row_bytes) |
                        (flat ? 0 : static_cast<uint64_t>(c.src_pitch | c.dst_pitch));
  const int64_t esize = bits % 16 == 0 ? 16 : bits % 4 == 0 ? 4 : 1;
  const int64_t per_row = c.row_bytes / esize;
  const RowMap map{per_row, c.src_pitch, c.dst_pitch};
  const int64_t total = per_row * c.rows;
  if (esize == 16) copy_elems<Tuning, uint4>(src, dst, total, map, flat, g);
  else if (esize == 4) copy_elems<Tuning, uint32_t>(src, dst, total, map, flat, g);
  else copy_elems<Tuning, unsigned char>(src, dst, total, map, flat, g);
}

}  // namespace detail

template <class Group>
TL_DEVICE TL_INLINE void tile_push_data(const DeviceContext&, int, const Copy2D& copy, Group g) {
  detail::copy_2d(copy, g);
}

template <class Group>
TL_DEVICE TL_INLINE void tile_pull_data(const DeviceContext&, int, const Copy2D& copy, Group g) {
  detail::copy_2d(copy, g);
}

}  // namespace tilelink::cuda
