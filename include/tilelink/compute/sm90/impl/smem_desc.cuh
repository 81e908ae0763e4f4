// wgmma shared-memory operand descriptors for tiles in the 128-byte swizzle (rows of 128 bytes,
// 1024-byte atoms of 8 rows), as TMA writes them with CU_TENSOR_MAP_SWIZZLE_128B.
#pragma once

#include <cstdint>
#include <cute/arch/mma_sm90_desc.hpp>

namespace tilelink::compute::sm90::detail {

// K-major: a row a 128-byte line, 8-row groups 1024 bytes apart. `addr` moves by 32 bytes a k16
// step of 16-bit elements inside the atom (the hardware swizzles the address it forms).
__device__ __forceinline__ uint64_t sw128_k_major_desc(uint32_t addr) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>((addr & 0x3FFFF) >> 4);
  d.bitfield.leading_byte_offset_ = 1;  // unused with a swizzle
  d.bitfield.stride_byte_offset_ = 1024 >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = static_cast<uint8_t>(cute::SM90::GMMA::LayoutType::B128);
  return d.desc_;
}

// MN-major (the operand's N contiguous, a B of [K][N] stored by rows of N): 8-row groups of K 1024
// bytes apart (SBO), blocks of 64 N-columns `column_block_bytes` apart (LBO). A k16 step moves
// `addr` by 16 rows (2048 bytes).
__device__ __forceinline__ uint64_t sw128_mn_major_desc(uint32_t addr, uint32_t column_block_bytes) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>((addr & 0x3FFFF) >> 4);
  d.bitfield.leading_byte_offset_ = static_cast<uint16_t>(column_block_bytes >> 4);
  d.bitfield.stride_byte_offset_ = 1024 >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = static_cast<uint8_t>(cute::SM90::GMMA::LayoutType::B128);
  return d.desc_;
}

}  // namespace tilelink::compute::sm90::detail
