// Host side of the sm90 GEMM engine: argument checks, tile-order heuristics, dtype dispatch.
#include "tilelink/compute/sm90/gemm.hpp"

#include <cuda_runtime.h>

#include <string>

#include "instances.hpp"
#include "tilelink/compute/sm90/impl/check_cuda.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::compute::sm90 {
namespace {

struct DeviceInfo {
  int sms = 0, major = 0, minor = 0;
};

DeviceInfo current_device() {
  int dev = 0;
  DeviceInfo d;
  TL_SM90_CUDA_CHECK(cudaGetDevice(&dev));
  TL_SM90_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
  TL_SM90_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev));
  TL_SM90_CUDA_CHECK(cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, dev));
  return d;
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

int gemm_default_group_m(int64_t m, int64_t n, int num_blocks, int tile_n, int tile_m) {
  const TileGrid g = gemm_tile_grid(m, n, tile_n, tile_m);
  // A wave of num_blocks tiles laid out as (rows x cols) with rows = 2 cols covers a square of C.
  int group = 1;
  while (2 * group * group < num_blocks) ++group;  // group ~ sqrt(num_blocks / 2) tile columns
  if (tile_m == kTileM) group *= 2;                 // ... and twice as many tile rows of 128
  // Narrow grids: when a wave holds whole tile rows even at that group's width (tiles_n <=
  // num_blocks / group), walk row-major. A wave is then ~num_blocks / tiles_n complete rows: each
  // A band is read once while B stays in L2. A group of `group` rows instead spreads the wave over
  // the group plus part of the next one, whose rows are read again in the next wave (ncu at
  // 8192x1536x4096: 143 MB of DRAM reads -> 99 MB; bench/notes/gemm.md, tile orders).
  if (static_cast<int64_t>(group) * g.tiles_n() <= num_blocks) return 1;
  if (group > g.tiles_m()) group = g.tiles_m();
  return group < 1 ? 1 : group;
}

TileOrder gemm_tile_order(const GemmArgs& args, int num_blocks) {
  const TileGrid g = gemm_tile_grid(args);
  TileOrder o;
  o.tiles_m = g.tiles_m();
  o.tiles_n = g.tiles_n();
  o.start_m = args.start_m;
  o.group_m = args.group_m > 0
                  ? args.group_m
                  : gemm_default_group_m(args.m, args.n, num_blocks, g.tile_n, g.tile_m);
  o.bands = args.row_bands;
  return o;
}

namespace {

// The SM count a launch may use (num_sms checked), and the tiles it would split with a workspace.
int resolved_sms(const GemmArgs& args, const DeviceInfo& d = current_device()) {
  TL_REQUIRE(args.num_sms >= 0 && args.num_sms <= d.sms,
             "sm90 gemm: num_sms must be in [0, " << d.sms << "] (0 = all SMs), got " << args.num_sms);
  return args.num_sms == 0 ? d.sms : args.num_sms;
}

// The tile: the one named (tile_m, tile_n), or the pick for the SMs the launch may use (`plain`:
// among the plain engine's tiles too).
GemmTile resolved_tile(const GemmArgs& args, int sms, bool plain) {
  const int tn = args.tile_n, tm = args.tile_m;
  TL_REQUIRE(tm == 0 || tm == kTileM || tm == kTileMTall,
             "sm90 gemm: tile_m must be 0, " << kTileM << " or " << kTileMTall << ", got " << tm);
  if (tm == kTileMTall) {
    TL_REQUIRE(tn == 0 || tn == kTileNTall, "sm90 gemm: " << kTileMTall << "-row tiles are "
                                                          << kTileNTall << " wide, got tile_n " << tn);
    return {kTileMTall, kTileNTall};
  }
  TL_REQUIRE(tn == 0 || tn == kTileN || tn == kTileNNarrow || tn == kTileNLean || tn == kTileNSlim ||
                 tn == kTileNFit,
             "sm90 gemm: tile_n must be 0 (the engine picks), "
                 << kTileN << ", " << kTileNNarrow << ", " << kTileNLean << ", " << kTileNSlim
                 << " or (the plain engine) " << kTileNFit << ", got " << tn);
  if (tn != 0) return {kTileM, tn};
  if (tm == kTileM) return gemm_pick_hooked_tile(args.m, args.n, args.k, sms).tile;
  // start_m and row_bands count tile rows: a launch that names them keeps 128-row tiles
  return gemm_pick_tile(args.m, args.n, args.k, sms,
                        plain && args.plain_tiles && args.start_m == 0 && args.row_bands == 1);
}

// The split of a launch of tile t (resolved_tile) with a workspace.
GemmSplit possible_split(const GemmArgs& args, int sms, GemmTile t) {
  const GemmSplit s =
      gemm_split(gemm_tile_grid(args.m, args.n, t.n, t.m).num_tiles(), sms,
                 args.k, gemm_tile_rows(args.m));
  TL_REQUIRE(s.tiles <= kSplitMaxTiles, "sm90 gemm: " << s.tiles << " split tiles, more than the "
                                                      << kSplitMaxTiles << " the workspace holds");
  return s;
}

}  // namespace

GemmWork gemm_work(const GemmArgs& args, bool plain) {
  const int sms = resolved_sms(args);
  GemmWork w;
  const GemmTile t = resolved_tile(args, sms, plain);
  w.tile_n = t.n, w.tile_m = t.m;
  w.tiles = gemm_tile_grid(args.m, args.n, t.n, t.m).num_tiles();
  if (args.workspace != nullptr && !gemm_plain_only_tile(t.m, t.n)) {
    w.split = possible_split(args, sms, t);
  }
  const int64_t units = w.tiles + (w.split.parts - 1) * w.split.tiles;
  w.blocks = static_cast<int>(units < sms ? (units < 1 ? 1 : units) : sms);
  return w;
}

int gemm_num_blocks(const GemmArgs& args) { return gemm_work(args).blocks; }

TileGrid gemm_tile_grid(const GemmArgs& args, bool plain) {
  // The SM count matters only to the pick: a named tile needs no device query.
  const bool named = args.tile_n != 0 || args.tile_m == kTileMTall;  // (tile_n 0 with 256 rows: 160)
  const GemmTile t = resolved_tile(args, named ? 0 : resolved_sms(args), plain);
  return gemm_tile_grid(args.m, args.n, t.n, t.m);
}

int64_t gemm_workspace_bytes(const GemmArgs& args) {
  const int sms = resolved_sms(args);
  const GemmTile t = resolved_tile(args, sms, false);
  if (gemm_plain_only_tile(t.m, t.n)) return 0;  // never split
  return gemm_split_workspace_bytes(possible_split(args, sms, t), t.n);
}

void gemm_check(const GemmArgs& a) {
  TL_REQUIRE(a.in_type == DType::kBF16 || a.in_type == DType::kF16,
             "sm90 gemm: inputs must be bf16 or fp16, got " << dtype_name(a.in_type));
  TL_REQUIRE(a.a != nullptr && a.b != nullptr && a.c != nullptr, "sm90 gemm: null pointer (a=" << a.a << ", b=" << a.b
                                                                                              << ", c=" << a.c << ")");
  TL_REQUIRE(a.m >= 0 && a.m < (int64_t{1} << 31), "sm90 gemm: M must be in [0, 2^31), got " << a.m);
  TL_REQUIRE(a.n > 0 && a.n < (int64_t{1} << 31), "sm90 gemm: N must be in [1, 2^31), got " << a.n);
  TL_REQUIRE(a.k > 0 && a.k < (int64_t{1} << 31), "sm90 gemm: K must be in [1, 2^31), got " << a.k);
  TL_REQUIRE(a.n % 8 == 0, "sm90 gemm: N must be a multiple of 8, got " << a.n);
  TL_REQUIRE(a.k % 8 == 0, "sm90 gemm: K must be a multiple of 8 (16-byte TMA rows), got " << a.k);
  const int64_t lda = a.lda ? a.lda : a.k, ldb = a.ldb ? a.ldb : a.k, ldc = a.ldc ? a.ldc : a.n;
  TL_REQUIRE(lda >= a.k && lda % 8 == 0, "sm90 gemm: lda must be >= K and a multiple of 8, got " << lda);
  TL_REQUIRE(ldb >= a.k && ldb % 8 == 0, "sm90 gemm: ldb must be >= K and a multiple of 8, got " << ldb);
  TL_REQUIRE(ldc >= a.n && ldc % 2 == 0, "sm90 gemm: ldc must be >= N and even, got " << ldc);
  TL_REQUIRE(aligned(a.a, 16) && aligned(a.b, 16), "sm90 gemm: A and B must be 16-byte aligned (TMA)");
  TL_REQUIRE(aligned(a.c, 2 * dtype_size(a.out_type)),
             "sm90 gemm: C must be aligned to " << 2 * dtype_size(a.out_type) << " bytes");
  // tile rows: the same at every width of a height (the pick keeps 128 rows where start_m is set)
  const TileGrid g = gemm_tile_grid(a.m, a.n, kTileN, a.tile_m == kTileMTall ? kTileMTall : kTileM);
  TL_REQUIRE(a.start_m >= 0 && (a.start_m < g.tiles_m() || a.start_m == 0),
             "sm90 gemm: start_m must be in [0, " << g.tiles_m() << "), got " << a.start_m);
  TL_REQUIRE(a.group_m >= 0, "sm90 gemm: group_m must be >= 0 (0 = heuristic), got " << a.group_m);
  TL_REQUIRE(a.row_bands >= 1, "sm90 gemm: row_bands must be >= 1, got " << a.row_bands);
  if (a.a_alt != nullptr) {
    const int64_t end = a.a_alt_row0 + a.a_alt_rows, lda_alt = a.lda_alt ? a.lda_alt : a.k;
    TL_REQUIRE(a.a_alt_rows > 0 && a.a_alt_row0 >= 0 && end <= a.m,
               "sm90 gemm: the a_alt band [" << a.a_alt_row0 << ", " << end << ") must be a non-empty part of [0, "
                                             << a.m << ")");
    TL_REQUIRE(a.a_alt_row0 % kTileM == 0 && (end % kTileM == 0 || end == a.m),
               "sm90 gemm: the a_alt band [" << a.a_alt_row0 << ", " << end << ") must start on a tile row (a multiple of "
                                             << kTileM << ") and end on one or at M");
    TL_REQUIRE(lda_alt >= a.k && lda_alt % 8 == 0, "sm90 gemm: lda_alt must be >= K and a multiple of 8, got " << lda_alt);
    TL_REQUIRE(aligned(a.a_alt, 16), "sm90 gemm: a_alt must be 16-byte aligned (TMA)");
  }
  TL_REQUIRE(a.kernel == GemmKernel::kAuto || a.kernel == GemmKernel::kTileEngine ||
                 a.kernel == GemmKernel::kDecode,
             "sm90 gemm: kernel must be kAuto, kTileEngine or kDecode, got " << int(a.kernel));
  if (a.kernel == GemmKernel::kDecode) {
    TL_REQUIRE(a.m <= kDecodeMaxRows,
               "sm90 gemm: the decode kernel takes M <= " << kDecodeMaxRows << ", got " << a.m);
    TL_REQUIRE(
        a.num_sms == 0,
        "sm90 gemm: the decode kernel runs on every SM; num_sms must be 0, got " << a.num_sms);
    TL_REQUIRE(a.a_alt == nullptr, "sm90 gemm: the decode kernel reads no a_alt");
  }
  const DeviceInfo d = current_device();
  TL_REQUIRE(d.major == 9 && d.minor == 0,
             "sm90 gemm: needs an sm_90 GPU (H100/H200), the current device is sm_" << d.major << d.minor);
  (void)resolved_sms(a, d);  // checks num_sms
  if (a.workspace != nullptr) {
    TL_REQUIRE(aligned(a.workspace, 16), "sm90 gemm: the workspace must be 16-byte aligned");
    const int64_t need = gemm_workspace_bytes(a);
    TL_REQUIRE(a.workspace_bytes >= need, "sm90 gemm: the workspace is too small for "
                                              << a.m << "x" << a.n << "x" << a.k << ": "
                                              << a.workspace_bytes << " bytes given, " << need
                                              << " needed (gemm_workspace_bytes)");
  }
}

bool gemm_takes_decode(const GemmArgs& args) {
  if (args.kernel != GemmKernel::kAuto) return args.kernel == GemmKernel::kDecode;
  return gemm_decode_shape(args.m, args.n, args.k) && args.num_sms == 0 && args.tile_n == 0 &&
         args.tile_m == 0 && args.a_alt == nullptr;
}

void gemm(const GemmArgs& args, cudaStream_t stream) {
  gemm_check(args);
  if (args.m == 0) return;  // nothing to compute
  if (gemm_takes_decode(args)) return detail::gemm_decode(args, current_device().sms, stream);
  const DType in = args.in_type, out = args.out_type;
  if (in == DType::kBF16 && out == DType::kBF16) return detail::gemm_bf16_bf16(args, stream);
  if (in == DType::kBF16 && out == DType::kF32) return detail::gemm_bf16_f32(args, stream);
  if (in == DType::kF16 && out == DType::kF16) return detail::gemm_f16_f16(args, stream);
  if (in == DType::kF16 && out == DType::kF32) return detail::gemm_f16_f32(args, stream);
  TL_REQUIRE(false, "sm90 gemm: unsupported dtype combination " << dtype_name(in) << " -> " << dtype_name(out)
                                                               << " (supported: bf16->bf16, bf16->fp32, fp16->fp16, "
                                                                  "fp16->fp32)");
}

GemmWorkspace::~GemmWorkspace() {
  // NOTE: not checked: a destructor must not throw, and a sticky error has been reported already.
  if (buffer_ != nullptr) (void)cudaFree(buffer_);
}

void GemmWorkspace::attach(GemmArgs& args, cudaStream_t stream) {
  const int64_t need = gemm_workspace_bytes(args);
  if (need == 0) {
    args.workspace = nullptr, args.workspace_bytes = 0;
    return;
  }
  if (need > bytes_) {
    if (buffer_ != nullptr) {
      TL_SM90_CUDA_CHECK(cudaStreamSynchronize(stream));  // launches on the old buffer are done
      TL_SM90_CUDA_CHECK(cudaFree(buffer_));
      buffer_ = nullptr, bytes_ = 0;
    }
    TL_SM90_CUDA_CHECK(cudaMalloc(&buffer_, need));
    TL_SM90_CUDA_CHECK(cudaMemsetAsync(buffer_, 0, need, stream));
    bytes_ = need;
  }
  args.workspace = buffer_, args.workspace_bytes = bytes_;
}

}  // namespace tilelink::compute::sm90
