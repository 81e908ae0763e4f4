// Host side of the engine's grouped mode (grouped_gemm.hpp): argument checks, the tile width, the
// grid, the first-tile table's kernel and the dtype dispatch.
#include "tilelink/compute/sm90/grouped_gemm.hpp"

#include <cuda_runtime.h>

#include "instances.hpp"
#include "tilelink/compute/sm90/impl/check_cuda.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::compute::sm90 {
namespace {

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// One thread: the table, or -1 at first[groups] where the offsets break their contract.
__global__ void first_tile_rows_kernel(DynamicTileGrid grid, int* first) {
  if (fill_first_tiles(grid, first) < 0) first[grid.num_groups()] = -1;
}

}  // namespace

int grouped_gemm_tile_n(const GroupedGemmArgs& args) {
  TL_REQUIRE(args.tile_n == 0 || args.tile_n == kTileN || args.tile_n == kTileNSlim,
             "sm90 grouped gemm: tile_n must be 0 (the engine picks), " << kTileN << " or "
                                                                       << kTileNSlim << ", got "
                                                                       << args.tile_n);
  return args.tile_n != 0 ? args.tile_n : grouped_gemm_pick_tile_n(args.n);
}

DynamicTileGrid grouped_gemm_row_grid(const GroupedGemmArgs& args) {
  return DynamicTileGrid::make(DynamicRowPartition::make(args.groups, args.offsets), 1, kTileM, 1,
                               args.first_tile_rows);
}

int64_t grouped_gemm_max_tiles(const GroupedGemmArgs& args) {
  return DynamicTileGrid::max_num_tiles(args.max_rows, args.groups, args.n, kTileM,
                                        grouped_gemm_tile_n(args));
}

void grouped_gemm_first_tile_rows_async(const GroupedGemmArgs& args, cudaStream_t stream) {
  const DynamicTileGrid grid = grouped_gemm_row_grid(args);
  first_tile_rows_kernel<<<1, 1, 0, stream>>>(grid, const_cast<int*>(args.first_tile_rows));
  TL_SM90_CUDA_CHECK(cudaGetLastError());
}

void grouped_gemm_check(const GroupedGemmArgs& a) {
  const bool bf16 = a.in_type == DType::kBF16 && a.out_type == DType::kBF16;
  const bool f16 = a.in_type == DType::kF16 && a.out_type == DType::kF16;
  TL_REQUIRE(bf16 || f16, "sm90 grouped gemm: bf16 -> bf16 or fp16 -> fp16, got "
                              << dtype_name(a.in_type) << " -> " << dtype_name(a.out_type));
  TL_REQUIRE(a.a != nullptr && a.b != nullptr && a.c != nullptr,
             "sm90 grouped gemm: null pointer (a=" << a.a << ", b=" << a.b << ", c=" << a.c << ")");
  TL_REQUIRE(a.offsets != nullptr && a.first_tile_rows != nullptr,
             "sm90 grouped gemm: the offsets and first-tile-row tables must be set (offsets="
                 << a.offsets << ", first_tile_rows=" << a.first_tile_rows << ")");
  TL_REQUIRE(a.groups >= 1 && a.groups <= kGroupedMaxGroups,
             "sm90 grouped gemm: groups must be in [1, " << kGroupedMaxGroups << "], got "
                                                         << a.groups);
  TL_REQUIRE(a.max_rows >= 0 && a.max_rows < (int64_t{1} << 31),
             "sm90 grouped gemm: max_rows must be in [0, 2^31), got " << a.max_rows);
  TL_REQUIRE(a.n > 0 && a.n < (int64_t{1} << 31) && a.n % 8 == 0,
             "sm90 grouped gemm: N must be a positive multiple of 8 below 2^31, got " << a.n);
  TL_REQUIRE(a.k > 0 && a.k < (int64_t{1} << 31) && a.k % 8 == 0,
             "sm90 grouped gemm: K must be a positive multiple of 8 below 2^31 (16-byte TMA rows), "
             "got " << a.k);
  const int64_t lda = a.lda ? a.lda : a.k, ldb = a.ldb ? a.ldb : a.k, ldc = a.ldc ? a.ldc : a.n;
  TL_REQUIRE(lda >= a.k && lda % 8 == 0,
             "sm90 grouped gemm: lda must be >= K and a multiple of 8, got " << lda);
  TL_REQUIRE(ldb >= a.k && ldb % 8 == 0,
             "sm90 grouped gemm: ldb must be >= K and a multiple of 8, got " << ldb);
  TL_REQUIRE(ldc >= a.n && ldc % 2 == 0, "sm90 grouped gemm: ldc must be >= N and even, got " << ldc);
  TL_REQUIRE(aligned(a.a, 16) && aligned(a.b, 16),
             "sm90 grouped gemm: A and B must be 16-byte aligned (TMA)");
  TL_REQUIRE(aligned(a.c, 4), "sm90 grouped gemm: C must be 4-byte aligned");
  TL_REQUIRE(aligned(a.offsets, 8) && aligned(a.first_tile_rows, 4) && aligned(a.tile_row_order, 4),
             "sm90 grouped gemm: the offsets (int64), first tile rows and tile-row order (int) must be aligned");
  if (a.a_row_index != nullptr) {
    TL_REQUIRE(a.a_rows >= 1 && a.a_rows < (int64_t{1} << 31) && a.a_row_div >= 1,
               "sm90 grouped gemm: a gathered A needs a_rows in [1, 2^31) and a_row_div >= 1, got "
               "a_rows="
                   << a.a_rows << ", a_row_div=" << a.a_row_div);
    TL_REQUIRE(aligned(a.a_row_index, 8), "sm90 grouped gemm: a_row_index (int64) must be aligned");
  }
  (void)grouped_gemm_tile_n(a);  // checks tile_n
  TL_REQUIRE(grouped_gemm_max_tiles(a) < (int64_t{1} << 31),
             "sm90 grouped gemm: " << grouped_gemm_max_tiles(a)
                                   << " tiles possible, more than an int tile id holds");
  int dev = 0, sms = 0, major = 0, minor = 0;
  TL_SM90_CUDA_CHECK(cudaGetDevice(&dev));
  TL_SM90_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TL_SM90_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TL_SM90_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  TL_REQUIRE(major == 9 && minor == 0,
             "sm90 grouped gemm: needs an sm_90 GPU (H100/H200), the current device is sm_"
                 << major << minor);
  TL_REQUIRE(a.num_sms >= 0 && a.num_sms <= sms,
             "sm90 grouped gemm: num_sms must be in [0, " << sms << "] (0 = all SMs), got "
                                                          << a.num_sms);
}

// (the instances check the arguments)
void grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream) {
  if (args.in_type == DType::kBF16) return detail::grouped_gemm_bf16(args, stream);
  return detail::grouped_gemm_f16(args, stream);
}

}  // namespace tilelink::compute::sm90
