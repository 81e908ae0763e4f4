// Host/device portability macros and small integer helpers shared by every layer.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TL_HD __host__ __device__
#define TL_DEVICE __device__
#define TL_INLINE __forceinline__
// Before a TL_HD template whose executor may be host-only (a comm program over a stream executor):
// an instantiation is host or device code as its executor is, with no warning.
#define TL_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define TL_HD
#define TL_DEVICE
#define TL_INLINE inline
#define TL_HD_TEMPLATE
#endif

namespace tilelink {

// Capacity of the fixed-size arrays inside trivially copyable plans (one entry per rank). The world
// size itself is always a run-time value; every constructor checks it against this capacity.
inline constexpr int kMaxWorldSize = 64;

TL_HD constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
TL_HD constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
TL_HD constexpr int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
TL_HD constexpr int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

}  // namespace tilelink
