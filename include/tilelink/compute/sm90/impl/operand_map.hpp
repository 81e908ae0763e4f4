// TMA tensor maps of a K-major GEMM operand, encoded by us (not by CUTLASS), and the load of one
// box: the decode kernel's A and B, and the engine's A for a ragged last tile row
// (gemm_kernel.cuh).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cutlass/cuda_host_adapter.hpp>
#include <type_traits>

#include "tilelink/core/error.hpp"

namespace tilelink::compute::sm90::detail {

// A K-major operand [rows, k] (row stride ld elements) for TMA: boxes of box_k x box_rows in the
// 128-byte swizzle, zero-filled out of bounds. promote: the L2 fetch size of a miss. In: a 16-bit
// element type (__nv_bfloat16 or __half; CUTLASS's types of the same width load alike).
template <class In>
void encode_operand_map(CUtensorMap* map, const void* base, int64_t rows, int64_t k, int64_t ld,
                        int box_k, int box_rows, CUtensorMapL2promotion promote, const char* what) {
  static_assert(sizeof(In) == 2);
  const CUtensorMapDataType type = std::is_same_v<In, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                              : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_k), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = cutlass::call_cuTensorMapEncodeTiled(
      map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promote,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TL_REQUIRE(r == CUDA_SUCCESS, "sm90 gemm: cuTensorMapEncodeTiled for "
                                    << what << " failed (CUresult " << static_cast<int>(r) << ")");
}

#if defined(__CUDACC__)
// A TMA load of the box at (c0, c1) of `map` into shared memory at `dst`, completing on the
// mbarrier `bar`.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3}], [%4];" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(map), "r"(c0), "r"(c1), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
      : "memory");
}
// The same with an L2 eviction policy (createpolicy).
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1,
                                         uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::"
      "cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(
          static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(map), "r"(c0), "r"(c1), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
      "l"(policy)
      : "memory");
}
#endif

}  // namespace tilelink::compute::sm90::detail
