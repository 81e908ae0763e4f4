// Hopper (sm_90a) GEMM tile engine: C[M, N] (+)= A[M, K] * B[N, K]^T, the compute half of every
// fused op.
//
// The engine is a persistent, warp-specialized kernel: one producer warp issues TMA loads into a
// multi-stage shared-memory pipeline, two consumer warpgroups run wgmma on a 128x256 output tile
// with fp32 accumulators and store the tile, either through per-warp shared-memory staging (16-byte
// row stores) or, in the TMA-store configuration (gemm_tma_store_config), as a whole tile in shared
// memory that a store warp copies to C. The grid walks the output tiles in a core TileOrder
// (start_m rotation, group_m grouping, row bands), every block taking every num_blocks-th tile.
//
// Layouts: A is [M, K] row-major (row stride lda), B is [N, K] row-major (nn.Linear weight, row
// stride ldb), C is [M, N] row-major (row stride ldc). Inputs bf16 or fp16 (both the same), output
// bf16, fp16 or fp32. Any M >= 0; N and K multiples of 8 (16-byte TMA rows); edges of every tile
// are clipped.
//
// Hooks (the link to the communication side; a template parameter of the kernel, see
// impl/gemm_kernel.cuh to instantiate the engine with your own type):
//
//   struct MyHooks {
//     static constexpr bool kWaits = true;     // false: before_tile_loads is never called
//     static constexpr bool kNotifies = true;  // false: after_tile_stored is never called
//     __device__ void before_tile_loads(const TileWork& w) const;  // with kWaits only
//     __device__ void after_tile_stored(const TileWork& w) const;  // with kNotifies only
//   };
//
//   TileWork: the tile (its coordinates in the launch's TileGrid), `region`, the clipped rectangle
//   of C (in C's own row/col coordinates) the tile covers, its `group` (0 for the engine's one
//   dense problem; the problem's index where a launch computes several) and the range of K
//   [k_begin, k_end) the unit of work reads: all of K but for a part of a split tile in
//   before_tile_loads; after_tile_stored always sees all of K (the stored tile is the sum).
//
//   before_tile_loads: called by all 32 lanes of the load warp (converged) before the first TMA
//     load of that output tile; it must return in every lane once the tile's inputs may be read
//     (typically a bounded acquire spin on the tile's signal slots, at gpu or sys scope). The
//     engine follows it with __syncwarp() and `fence.proxy.async.global`, so no TMA load is hoisted
//     above the wait.
//   after_tile_stored: called once per tile by one thread (lane 0 of the store warp) after every
//     epilogue store or reduction of that tile is ordered before it: register stores by each
//     consumer thread's mbarrier arrive [release.cta] -> the store warp's wait [acquire.cta]; the
//     TMA-store configuration's tile by the store warp's own `cp.async.bulk.wait_group 0` and
//     `fence.proxy.async.global`. A release store at gpu/sys scope made by the hook therefore
//     publishes the whole tile. It runs off the consumers' critical path.
//   Hooks must make no function call (printf, non-inlined code): ptxas then serializes every wgmma
//   of the kernel (warning C7510, measured ~7% slower); report timeouts through memory and trap.
//   Hooks whose calls (those the flags enable) are const-callable are called on the kernel
//   parameter itself (constant memory); otherwise each warp calls them on its own copy (registers,
//   or local memory for arrays indexed at run time: keep big hooks const).
//
// The last wave, split (GemmArgs::workspace): when the tiles leave a last wave at most half full
// (tiles % blocks <= blocks / 2; a grid of fewer tiles than half the SMs is such a wave), each of
// that wave's tiles is computed in parts of K (2 to 4, gemm_split) by as many blocks. Each part but
// the last to finish writes its fp32 accumulators to the workspace; the last adds them and runs
// the epilogue (and the notify hook) once for the tile. Every part calls the wait hook. The sum is
// deterministic: the fixed tree (p0 + p1) + (p2 + p3), whose adds each take two operands (the
// same bits in either order), so the last part adds its own from registers wherever it sits.
// Without a workspace the engine never splits.
//
// Epilogue modes: kStore writes C (C may be a peer's memory: plain generic stores), kReduceAdd adds
// the tile into C with red.global.add (bf16x2 / f16x2 / f32x2): the GEMM+ReduceScatter push path.
//
// Decode sizes (M <= kDecodeMaxRows, 128): gemm() runs a second kernel there unless told otherwise
// (GemmArgs::kernel, gemm_takes_decode). A 128-row tile computes mostly padding at such M, and the
// few tiles along N keep most SMs idle while B streams from DRAM. The decode kernel has no tiles
// of C along M, and two forms:
//   - wgmma, "swap AB" (M 17-128, and M <= 16 where N < 2048): B's rows are the MMA's M side (64 a
//     block) and A's rows its N side (M padded to 16, 32, 64 or 128). TMA streams B's and A's
//     k-blocks through a ring of shared-memory stages, two blocks an SM.
//   - mma.sync (M <= 16 where N >= 2048): each warp streams 16 rows of B over a range of K with
//     16-byte loads straight into the registers of mma.sync.m16n8k16, again B's rows as the MMA's
//     M side (each lane's 8 contiguous elements of a row stand for its four k positions of two k16
//     steps, a permutation of K that A and B share, so no shuffles).
// In both, the blocks of a thread-block cluster (up to 8) split K, and their partials are added
// through distributed shared memory in a fixed order (deterministic, no workspace). It runs on
// every SM and has no hooks: fused ops name their tile width and always run the engine. kAuto
// takes it where gemm_decode_shape says so.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "tilelink/core/config.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/order.hpp"
#include "tilelink/core/tile.hpp"

namespace tilelink::compute::sm90 {

enum class EpilogueMode : uint8_t { kStore, kReduceAdd };

// Which kernel gemm() runs: kAuto takes the decode kernel where gemm_takes_decode says so, else
// the tile engine.
enum class GemmKernel : uint8_t { kAuto, kTileEngine, kDecode };
inline constexpr int64_t kDecodeMaxRows = 128;  // kDecode: M up to here

// kAuto's choice of the decode kernel by shape (measured against the engine, bench/notes/gemm.md,
// decode kernels): M <= 32 at any N; M 33-64 up to N = 16384 (above, its blocks of 64 rows of B
// no longer fit one wave); M 65-128 where N <= 2048 (the engine's few tiles leave most SMs idle:
// 1.3-2x there), or N <= 12288 and N * K <= 2^26 (above 2^26 the engine was up to 10% faster; from
// N = 14336 it was as fast or faster at nearly every K, by 25-30% at N = 20480).
inline constexpr int64_t kDecodeAutoMaxRows = 32;
inline constexpr int64_t kDecodeWideMaxRows = 64;
inline constexpr int64_t kDecodeWideMaxN = 16384;
inline constexpr int64_t kDecodeTallMaxN = 2048;
inline constexpr int64_t kDecodeTallMaxNK = int64_t{1} << 26;
inline constexpr int64_t kDecodeTallNKMaxN = 12288;
TL_HD inline bool gemm_decode_shape(int64_t m, int64_t n, int64_t k) {
  if (m < 1 || m > kDecodeMaxRows) return false;
  if (m <= kDecodeAutoMaxRows) return true;
  if (m <= kDecodeWideMaxRows) return n <= kDecodeWideMaxN;
  return n <= kDecodeTallMaxN || (n <= kDecodeTallNKMaxN && n * k <= kDecodeTallMaxNK);
}

// The engine's output tile (the grid a fused op maps its signal slots onto): 128 x kTileN. A
// launch may instead take tiles kTileNNarrow, kTileNLean or kTileNSlim wide (GemmArgs::tile_n,
// gemm_pick_tile_n), where they fill the SMs' waves better; the fused ops name kTileN.
inline constexpr int kTileM = 128;
inline constexpr int kTileN = 256;
inline constexpr int kTileNNarrow = 192;
inline constexpr int kTileNLean = 160;
inline constexpr int kTileNSlim = 128;
inline constexpr int kTileK = 64;
// The plain engine's own tiles (gemm() with no hooks and no a_alt; never split): 128 x kTileNFit,
// and kTileMTall x kTileNTall, whose two consumer warpgroups hold 128 rows each. They fill the
// SMs' waves where no 128-row tile of the hooked widths does: 2048x7168 is 656 tiles of 176 (4.97
// waves of 132), 3000x5000 384 tiles of 256x160 (2.9 waves), against 448 and 480 tiles of 128x256
// (3.4 and 3.6). A fused op's tiles are its signal grid and stay 128 rows of the hooked widths.
// (A width must be a multiple of 16: a stage of B is then whole 128-byte swizzle periods.)
inline constexpr int kTileNFit = 176;
inline constexpr int kTileMTall = 256;
inline constexpr int kTileNTall = 160;
TL_HD inline bool gemm_plain_only_tile(int tile_m, int tile_n) {
  return tile_m == kTileMTall || tile_n == kTileNFit;
}

// Where the engine reports, before it traps, that the split last wave (see above) cannot go on:
// host-mapped memory (cudaHostAllocMapped), readable after the trap.
struct GemmStallReport {
  // flag values: the last part waited too long for the others; more parts arrived than the tile
  // has (the workspace was not zero-filled)
  static constexpr int kTimedOut = 1;
  static constexpr int kDirtyWorkspace = 2;
  int flag = 0;  // 0 until written, then why
  int tile_m = 0, tile_n = 0;
};

// What the engine tells a hook about a unit of work (see Hooks above).
struct TileWork {
  TileCoord tile;
  Rect region;
  int group = 0;
  int64_t k_begin = 0, k_end = 0;
};

struct GemmArgs {
  const void* a = nullptr;  // [m, k], row stride lda
  const void* b = nullptr;  // [n, k], row stride ldb
  void* c = nullptr;        // [m, n], row stride ldc (may be a peer's memory)
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // 0: packed (k, k, n)
  DType in_type = DType::kBF16;       // A and B
  DType out_type = DType::kBF16;
  EpilogueMode epilogue = EpilogueMode::kStore;
  int num_sms = 0;  // blocks of the persistent grid (one per SM); 0: every SM of the device
  int start_m = 0;  // TileOrder: first tile row visited
  int group_m = 0;  // TileOrder: tile rows per group; 0: heuristic (gemm_default_group_m)
  int row_bands = 1;  // TileOrder: row bands visited in turn (1: the rows in order)
  // Width of the output tiles: kTileN, kTileNNarrow, kTileNLean or kTileNSlim, or for the plain
  // engine kTileNFit (128 rows), or kTileNTall with tile_m kTileMTall; 0: the engine picks
  // (gemm_pick_tile; gemm() among the plain engine's tiles too where plain_tiles is set). The hooks
  // see tiles of gemm_tile_grid(args); an op that maps signals onto tiles names its width.
  int tile_n = 0;
  // Rows of the output tiles: 0 (kTileM, or what gemm()'s pick takes where tile_n is 0 too and
  // plain_tiles is set), kTileM, or kTileMTall (with tile_n kTileNTall or 0; the plain engine only).
  int tile_m = 0;
  // Lets gemm()'s pick (tile_n and tile_m 0) take the plain engine's own tiles (gemm_pick_tile).
  // Off by default until their margins are measured on the GPU (bench/notes/gemm.md, the plain
  // engine's tiles); naming one (tile_n kTileNFit, tile_m kTileMTall) needs no opt-in.
  bool plain_tiles = false;
  // A second source for a band of A's rows: rows [a_alt_row0, a_alt_row0 + a_alt_rows) of A are read
  // from a_alt (its row 0 is A's row a_alt_row0; row stride lda_alt, 0: K), the rest from a. The band
  // starts on a tile row (a multiple of kTileM) and ends on one or at M. Only launch_gemm<..., true>
  // (impl/gemm_kernel.cuh) reads it; gemm() refuses it. AG+GEMM uses it to read the rank's own rows
  // from its input instead of copying them into the gathered buffer first.
  const void* a_alt = nullptr;
  int64_t a_alt_row0 = 0, a_alt_rows = 0, lda_alt = 0;
  // Device memory for the split last wave (see above), at least gemm_workspace_bytes(args) bytes,
  // 16-byte aligned, zero-filled before its first use; every launch leaves it zero-filled again.
  // One launch at a time per workspace. nullptr: no split.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  GemmStallReport* stall_report = nullptr;  // optional, host-mapped
  // gemm() only (launch_gemm is the tile engine; it refuses kDecode). kDecode needs M <=
  // kDecodeMaxRows and num_sms = 0, and ignores the tile order, tile_n and the workspace.
  GemmKernel kernel = GemmKernel::kAuto;
};

// The output tile grid of a problem (the shape mapping of the engine's tiles).
TL_HD inline TileGrid gemm_tile_grid(int64_t m, int64_t n, int tile_n = kTileN,
                                    int tile_m = kTileM) {
  return TileGrid{m, n, tile_m, tile_n};
}

// group_m heuristic: about twice as many tile rows as tile columns in one wave of resident tiles
// (128x256 tiles make that footprint square), capped by the grid; 1 (row-major) when the grid is
// so narrow that a wave holds whole tile rows even at that width.
// For kTileMTall tiles, half as many tile rows: the same footprint of C.
int gemm_default_group_m(int64_t m, int64_t n, int num_blocks, int tile_n = kTileN,
                         int tile_m = kTileM);

// The tile order the engine walks for these arguments (after defaults are resolved).
TileOrder gemm_tile_order(const GemmArgs& args, int num_blocks);

// The split last wave of a grid of `tiles` on `blocks` persistent blocks: the last wave's tiles,
// when it is at most half full and K has at least kSplitMinKTiles k-blocks, in `parts` parts of K:
// as many as the blocks allow, at most kSplitMaxParts, more than two only where each part keeps
// kSplitMinPartKTiles k-blocks (their meeting costs more), or kSplitMinPartKTilesFewRows where the
// tiles hold at most kSplitFewRows rows of C (`rows`: gemm_tile_rows(M); the meeting moves only the
// rows of C). {0, 1}: no split.
struct GemmSplit {
  int64_t tiles = 0;
  int parts = 1;
};
inline constexpr int64_t kSplitMinKTiles = 8;
inline constexpr int64_t kSplitMinPartKTiles = 32;
inline constexpr int64_t kSplitFewRows = 64;
inline constexpr int64_t kSplitMinPartKTilesFewRows = 8;
inline constexpr int kSplitMaxParts = 4;
// Rows of C the fullest tile of an M-row grid holds: M, or kTileM where M is larger.
TL_HD inline int64_t gemm_tile_rows(int64_t m) { return m < kTileM ? m : kTileM; }
TL_HD inline GemmSplit gemm_split(int64_t tiles, int blocks, int64_t k, int64_t rows = kTileM) {
  const int64_t tail = tiles % blocks, k_tiles = (k + kTileK - 1) / kTileK;
  if (tail == 0 || 2 * tail > blocks || k_tiles < kSplitMinKTiles) return {};
  const int64_t min_part = rows <= kSplitFewRows ? kSplitMinPartKTilesFewRows : kSplitMinPartKTiles;
  int parts = blocks / tail < kSplitMaxParts ? static_cast<int>(blocks / tail) : kSplitMaxParts;
  while (parts > 2 && k_tiles < min_part * parts) --parts;
  return {tail, parts};
}
// Workspace of a split: the flag records (16 bytes a split tile) at a fixed place for any shape,
// so that a workspace reused by another shape finds them zero (a partial tile's old data never
// lies under them), then the fp32 partial tiles (one a tile with two parts, `parts` with more).
inline constexpr int64_t kSplitFlagsBytes = 16;
inline constexpr int64_t kSplitMaxTiles = 1024;  // > SMs / 2 on any GPU
inline constexpr int64_t kSplitFlagsRegionBytes = kSplitMaxTiles * kSplitFlagsBytes;
TL_HD inline int64_t gemm_split_partial_bytes(int tile_n) { return int64_t{kTileM} * tile_n * 4; }
TL_HD inline int64_t gemm_split_partials(const GemmSplit& s) { return s.parts == 2 ? 1 : s.parts; }
TL_HD inline int64_t gemm_split_workspace_bytes(const GemmSplit& s, int tile_n = kTileN) {
  return s.tiles > 0 ? kSplitFlagsRegionBytes +
                           s.tiles * gemm_split_partials(s) * gemm_split_partial_bytes(tile_n)
                     : 0;
}

// The tile width the engine picks for an M x N x K launch on `blocks` SMs: the one whose waves take
// the least time, counting each wave as its tiles' width (a tile's time is proportional to its
// width) and a split last wave (gemm_split) as 1 / parts of a wave plus kSplitWaveCost, each width
// divided by a margin for its lower efficiency (kTileN 1):
// - kTileNNarrow: kNarrowTileGain (set from a few shapes, then checked on a grid of 59, where it
//   lost 0.3% on average against the better width of each shape and 128x256 everywhere lost 4%;
//   bench/notes/gemm.md, tile widths), kNarrowTileGainFewRows for M <= kSplitFewRows (decode sizes:
//   on 74 shapes of M 1-64 the narrow tile won where its cost was 0.75 of the wide one's,
//   0.97-1.29x, and lost up to 7% at 0.93).
// - kTileNSlim: kSlimTileGain, and only for M > kSplitFewRows. Its tiles run at 0.90-0.97 of
//   kTileN's speed on full waves; on 77 shapes of M 136-1536 the rule ran each at a mean 0.998 of
//   its fastest width (min 0.95) where the two-width rule ran at 0.972 (min 0.79) (tile widths).
// - kTileNLean: kLeanTileGain, and only for M > kSplitFewRows. Its waves fit where the others' do
//   not (576x4096: 130 tiles of 160 against 80 of 256, 110 of 192 or 132 + 28 split of 128), and
//   on a full wave it ran as fast as 256 (1408x1920x8192 1.03 of cuBLAS, 1408x3072x8192 at 256
//   1.00). The margin was fitted on 75 shapes of M 200-1408 and checked on 70 more of M 512-2048:
//   on all 145 the rule ran each at a mean 0.997 of its fastest width (min 0.960), where the
//   three-width rule ran at 0.995 (min 0.948) (bench/notes/gemm.md, tile widths).
// - Many rows: the narrow tile loses less to the wide one above kManyRows rows (more than 16 tile
//   rows; kNarrowTileGainManyRows), the slim one above kManyRowsSlim (kSlimTileGainManyRows).
//   Fitted on 114 shapes of M 2048-16384 (tensor-parallel shards and a grid, each width measured)
//   and checked on 72 held-out ones of M 2304-12288 (0.988 -> 0.992 of the fastest width); the
//   pick then measured against the old one where it changed: with one bound the slim tile lost
//   3.5-7% on four shapes of M 2304-3072, hence its higher bound; with both, on the 34 shapes it
//   changed, median 1.029x (0.961-1.106x). On all 185 shapes: mean 0.990 -> 0.995 of the fastest
//   width, the worst 0.888 -> 0.952 (bench/notes/gemm.md, tile widths).
inline constexpr double kSplitWaveCost = 0.1;
inline constexpr double kNarrowTileGain = 0.965;
inline constexpr double kNarrowTileGainFewRows = 0.9;
inline constexpr double kLeanTileGain = 0.975;
inline constexpr double kSlimTileGain = 0.91;
inline constexpr int64_t kManyRows = 2048;
inline constexpr int64_t kManyRowsSlim = 3072;
inline constexpr double kNarrowTileGainManyRows = 0.985;
inline constexpr double kSlimTileGainManyRows = 0.96;
TL_HD inline double gemm_wave_cost(int64_t m, int64_t n, int64_t k, int blocks, int tile_n) {
  const int64_t tiles = gemm_tile_grid(m, n, tile_n).num_tiles();
  const GemmSplit split = gemm_split(tiles, blocks, k, gemm_tile_rows(m));
  const double waves =
      split.tiles > 0 ? static_cast<double>(tiles / blocks) + 1.0 / split.parts + kSplitWaveCost
                      : static_cast<double>((tiles + blocks - 1) / blocks);
  return waves * tile_n;
}
struct GemmTile {
  int m = kTileM, n = kTileN;
};
// The pick with its cost (waves x width, divided by the width's margin).
struct GemmTileCost {
  GemmTile tile;
  double cost = 0;
};
TL_HD inline GemmTileCost gemm_pick_hooked_tile(int64_t m, int64_t n, int64_t k, int blocks) {
  const double margin = m <= kSplitFewRows ? kNarrowTileGainFewRows
                        : m > kManyRows    ? kNarrowTileGainManyRows
                                           : kNarrowTileGain;
  const double wide = gemm_wave_cost(m, n, k, blocks, kTileN);
  const double narrow = gemm_wave_cost(m, n, k, blocks, kTileNNarrow) / margin;
  int pick = narrow < wide ? kTileNNarrow : kTileN;
  double best = narrow < wide ? narrow : wide;
  if (m > kSplitFewRows) {
    const double lean = gemm_wave_cost(m, n, k, blocks, kTileNLean) / kLeanTileGain;
    if (lean < best) pick = kTileNLean, best = lean;
    const double slim_gain = m > kManyRowsSlim ? kSlimTileGainManyRows : kSlimTileGain;
    const double slim = gemm_wave_cost(m, n, k, blocks, kTileNSlim) / slim_gain;
    if (slim < best) pick = kTileNSlim, best = slim;
  }
  return {{kTileM, pick}, best};
}
TL_HD inline int gemm_pick_tile_n(int64_t m, int64_t n, int64_t k, int blocks) {
  return gemm_pick_hooked_tile(m, n, k, blocks).tile.n;
}

// The plain engine's pick (gemm() with tile_n and tile_m 0 and plain_tiles set): the hooked widths'
// pick, or one of the plain engine's tiles where its whole waves (it never splits: only where its
// last wave is more than half full) cost less, counted as waves x (rows / kTileM) x width divided
// by its margin, and only from kPlainTileMinRows rows. The margins: bench/notes/gemm.md, the plain
// engine's tiles.
inline constexpr int64_t kPlainTileMinRows = 1024;
inline constexpr double kFitTileGain = 0.975;
inline constexpr double kTallTileGain = 0.99;
TL_HD inline double gemm_plain_tile_cost(int64_t m, int64_t n, int64_t k, int blocks, GemmTile t,
                                         double gain) {
  const int64_t tiles = gemm_tile_grid(m, n, t.n, t.m).num_tiles();
  if (gemm_split(tiles, blocks, k).tiles > 0) {
    return -1;  // the hooked widths would split this last wave; these tiles do not
  }
  const double waves = static_cast<double>((tiles + blocks - 1) / blocks);
  return waves * (static_cast<double>(t.m) / kTileM) * t.n / gain;
}
TL_HD inline GemmTile gemm_pick_tile(int64_t m, int64_t n, int64_t k, int blocks, bool plain) {
  GemmTileCost best = gemm_pick_hooked_tile(m, n, k, blocks);
  if (!plain || m < kPlainTileMinRows) return best.tile;
  const GemmTile fit{kTileM, kTileNFit}, tall{kTileMTall, kTileNTall};
  const double fit_cost = gemm_plain_tile_cost(m, n, k, blocks, fit, kFitTileGain);
  if (fit_cost > 0 && fit_cost < best.cost) best = {fit, fit_cost};
  const double tall_cost = gemm_plain_tile_cost(m, n, k, blocks, tall, kTallTileGain);
  if (tall_cost > 0 && tall_cost < best.cost) best = {tall, tall_cost};
  return best.tile;
}

// How a launch with these arguments spreads its work: the tile width (args.tile_n, or the pick),
// tiles, the split of its last wave (only with a workspace), and blocks = min(SMs, tiles +
// (parts - 1) * split tiles). Checks num_sms.
struct GemmWork {
  int tile_n = kTileN;
  int tile_m = kTileM;
  int64_t tiles = 0;
  GemmSplit split;
  int blocks = 1;
};
// `plain`: the launch is the plain engine's (gemm(); NoHooks, no a_alt), whose pick may take its
// own tiles (gemm_pick_tile); a plain-only tile never splits.
GemmWork gemm_work(const GemmArgs& args, bool plain = false);

// The tile grid a launch with these arguments walks (its hooks see these tiles; `plain` as above).
TileGrid gemm_tile_grid(const GemmArgs& args, bool plain = false);

// Number of persistent blocks a launch with these arguments uses (gemm_work(args).blocks).
int gemm_num_blocks(const GemmArgs& args);

// Workspace bytes these arguments' launch would use to split its last wave (whether or not
// args.workspace is set), 0 where it would not split.
int64_t gemm_workspace_bytes(const GemmArgs& args);

// Whether a launch takes the engine's TMA-store configuration: a 16-bit output with at least two
// tiles a block. Its consumers write each tile to shared memory and the store warp copies it to C
// with TMA while the next tile's MMAs run (3 pipeline stages); the other configuration stores from
// registers (4 stages), which wins at one tile a block. Stores that TMA cannot make (C not in this
// device's memory, or rows not 16-byte aligned, or kReduceAdd) fall back to register stores in
// either configuration.
TL_HD inline bool gemm_tma_store_config(DType out, int64_t tiles, int num_blocks) {
  return dtype_size(out) == 2 && tiles >= 2 * static_cast<int64_t>(num_blocks);
}

// Whether a launch reads A and B with 256-byte L2 promotion (each 128-byte row segment of a box
// that misses L2 brings the next k-block's segment along) instead of CUTLASS's 128 bytes: at most
// four tile rows, where B streams from DRAM nearly once. Measured (bench/notes/gemm.md, a wider L2
// fetch): +0.5..+2.6% at M = 128-512; on 8192x1536x4096 it cost ~1%, so larger M keeps 128 bytes.
TL_HD inline bool gemm_wide_l2_fetch(int64_t m) { return m <= 4 * kTileM; }

// Checks every argument and throws tilelink::Error with a clear message before anything is launched:
// null pointers, N or K not a multiple of 8, unsupported or mismatched dtypes, bad strides or
// alignment, num_sms out of [0, device SMs], start_m/group_m out of range.
void gemm_check(const GemmArgs& args);

// Whether gemm() runs the decode kernel for these arguments: kernel = kDecode, or kAuto with
// gemm_decode_shape(M, N, K), num_sms = 0 (the decode kernel cannot keep to an SM budget) and
// tile_n = 0 (a named width asks for the tile engine).
bool gemm_takes_decode(const GemmArgs& args);

// Runs the plain engine (no hooks), or the decode kernel (gemm_takes_decode), on `stream`.
// Asynchronous; errors of the launch throw.
void gemm(const GemmArgs& args, cudaStream_t stream);

// Owns a workspace for the split last wave and sizes it to each launch:
//   GemmWorkspace ws;
//   ws.attach(args, stream);  // sets args.workspace, workspace_bytes (null, 0: no split)
//   gemm(args, stream);
// It grows (a new zero-filled buffer, filled on `stream`) when a launch needs more. Launches that
// share it must be ordered (one stream, or synchronized): it holds flags the launches count on.
class GemmWorkspace {
 public:
  GemmWorkspace() = default;
  GemmWorkspace(const GemmWorkspace&) = delete;
  GemmWorkspace& operator=(const GemmWorkspace&) = delete;
  ~GemmWorkspace();
  void attach(GemmArgs& args, cudaStream_t stream);
  int64_t bytes() const { return bytes_; }

 private:
  void* buffer_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace tilelink::compute::sm90
