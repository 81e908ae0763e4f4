// GPU tests of the sm90 GEMM engine (run on an H100/H200): every supported dtype pair on ragged and
// aligned shapes, strided operands, the reduce-add epilogue, num_sms and tile order, hooks that really
// wait (a delayed producer kernel writes A), and argument checks that throw before launching.
// Every output is poisoned with NaN first and compared with a float32 reference on fresh random data.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/compute/sm90/impl/gemm_reference.cuh"
#include "tilelink/compute/sm90/impl/signal_hooks.cuh"
#include "tilelink/core/error.hpp"

namespace {

using namespace tilelink;
using namespace tilelink::compute::sm90;
namespace ref = tilelink::compute::sm90::reference;
namespace engine = tilelink::compute::sm90::detail;
#define CK(call) TL_SM90_CUDA_CHECK(call)

// NOTE: a kernel spinning on a flag can keep a lazily loaded one from starting (see docs/design.md, the GPU machines).
const bool kEager = [] { return setenv("CUDA_MODULE_LOADING", "EAGER", 0) == 0; }();

uint64_t fresh_seed() {
  static uint64_t counter = 0;
  return 0x5EED0000ull + 7919 * (++counter) + static_cast<uint64_t>(std::rand());
}

struct Buffers {
  void *a = nullptr, *b = nullptr, *c = nullptr;
  float* ref = nullptr;
  ~Buffers() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    cudaFree(ref);
  }
};

// Runs C = A B^T (+ C0) with the given args (pointers filled in here) and checks it against the reference.
void run_and_check(GemmArgs args, bool reduce = false) {
  const int64_t lda = args.lda ? args.lda : args.k, ldb = args.ldb ? args.ldb : args.k,
                ldc = args.ldc ? args.ldc : args.n;
  Buffers buf;
  const int64_t a_elems = args.m > 0 ? (args.m - 1) * lda + args.k : 1;
  CK(cudaMalloc(&buf.a, a_elems * dtype_size(args.in_type)));
  CK(cudaMalloc(&buf.b, ((args.n - 1) * ldb + args.k) * dtype_size(args.in_type)));
  const int64_t c_bytes = std::max<int64_t>(1, args.m * ldc) * dtype_size(args.out_type);
  CK(cudaMalloc(&buf.c, c_bytes));
  CK(cudaMalloc(&buf.ref, std::max<int64_t>(1, args.m * args.n) * sizeof(float)));
  ref::fill_uniform(buf.a, args.in_type, a_elems, fresh_seed(), 1.0f);
  ref::fill_uniform(buf.b, args.in_type, (args.n - 1) * ldb + args.k, fresh_seed(), 1.0f);
  if (reduce) {
    ref::fill_uniform(buf.c, args.out_type, args.m * ldc, fresh_seed(), 4.0f);
  } else {
    CK(cudaMemset(buf.c, 0xff, c_bytes));  // NaN everywhere
  }
  ref::reference_gemm(buf.a, buf.b, args.in_type, args.m, args.n, args.k, lda, ldb, reduce ? buf.c : nullptr,
                      args.out_type, ldc, buf.ref);
  CK(cudaDeviceSynchronize());
  args.a = buf.a, args.b = buf.b, args.c = buf.c;
  args.epilogue = reduce ? EpilogueMode::kReduceAdd : EpilogueMode::kStore;
  gemm(args, 0);
  CK(cudaDeviceSynchronize());
  const ref::Comparison cmp = ref::compare(buf.c, args.out_type, ldc, buf.ref, args.m, args.n);
  EXPECT_EQ(cmp.non_finite, 0) << args.m << "x" << args.n << "x" << args.k;
  EXPECT_LE(cmp.rel_err, ref::tolerance(args.out_type)) << args.m << "x" << args.n << "x" << args.k;
  if (ldc > args.n && !reduce && args.m > 0) {  // the margins between rows must stay poisoned
    std::vector<uint8_t> host(c_bytes);
    CK(cudaMemcpy(host.data(), buf.c, c_bytes, cudaMemcpyDeviceToHost));
    const int es = dtype_size(args.out_type);
    int64_t touched = 0;
    for (int64_t r = 0; r < args.m; ++r)
      for (int64_t col = args.n; col < ldc; ++col)
        for (int e = 0; e < es; ++e) touched += host[(r * ldc + col) * es + e] != 0xff;
    EXPECT_EQ(touched, 0) << "bytes written outside [m, n]";
  }
}

// kTileN-wide tiles (the cases below count tiles of that width); NarrowTiles and PickTileN take
// the others.
GemmArgs shape(int64_t m, int64_t n, int64_t k, DType in = DType::kBF16, DType out = DType::kBF16,
               int tile_n = kTileN) {
  GemmArgs a;
  a.m = m, a.n = n, a.k = k, a.in_type = in, a.out_type = out, a.tile_n = tile_n;
  return a;
}

TEST(Sm90Gemm, AlignedShapesBf16) {
  for (auto [m, n, k] : {std::tuple{128, 256, 64}, {256, 512, 128}, {2048, 2048, 2048}, {1024, 3072, 4096}}) {
    run_and_check(shape(m, n, k));
  }
}

TEST(Sm90Gemm, RaggedShapesBf16) {
  for (int64_t m : {1, 17, 1000}) {
    for (auto [n, k] : {std::pair{8, 8}, {264, 72}, {520, 1000}, {776, 1032}}) run_and_check(shape(m, n, k));
  }
  run_and_check(shape(129, 3080, 136));
  // The last tile row's second consumer warpgroup holds no row of C at 64 and 192 rows, one row
  // at 65 and 193.
  for (int64_t m : {64, 65, 192, 193}) run_and_check(shape(m, 776, 1032));
}

TEST(Sm90Gemm, EveryDtypePair) {
  for (auto [in, out] : {std::pair{DType::kBF16, DType::kF32}, {DType::kF16, DType::kF16}, {DType::kF16, DType::kF32}}) {
    for (auto [m, n, k] : {std::tuple{17, 264, 72}, {1000, 776, 1032}, {512, 512, 512}}) {
      run_and_check(shape(m, n, k, in, out));
    }
  }
}

TEST(Sm90Gemm, StridedOperandsAndOutput) {
  GemmArgs a = shape(300, 264, 200);
  a.lda = 208, a.ldb = 216, a.ldc = 280;
  run_and_check(a);
  a.out_type = DType::kF32;
  run_and_check(a);
  a.out_type = DType::kBF16, a.ldc = 276;  // rows not 16-byte aligned: the pair-store epilogue
  run_and_check(a);
}

TEST(Sm90Gemm, ReduceAdd) {
  run_and_check(shape(1000, 776, 1032), true);
  run_and_check(shape(1000, 776, 1032, DType::kBF16, DType::kF32), true);
  run_and_check(shape(17, 264, 72, DType::kF16, DType::kF16), true);
}

TEST(Sm90Gemm, NumSmsAndOrderOptions) {
  for (int sms : {1, 3, 16}) {
    GemmArgs a = shape(1000, 2056, 264);
    a.num_sms = sms;
    a.start_m = 5, a.group_m = 3;
    run_and_check(a);
  }
}

// The TMA store configuration (two or more tiles a block): ragged edges (the boxes clip), strided
// and unaligned C (the register-store fallback inside it), both 16-bit outputs, and one tile more
// than a whole number of tiles a block.
TEST(Sm90Gemm, TmaStorePath) {
  struct Case {
    GemmArgs args;
    int sms;
  };
  std::vector<Case> cases;
  for (auto [m, n, k] : {std::tuple{1, 1032, 72},
                         {17, 776, 1032},
                         {1000, 520, 1000},
                         {129, 3080, 136},
                         {1000, 776, 1032},
                         {512, 2048, 64}}) {
    cases.push_back({shape(m, n, k), 2});
  }
  cases.push_back({shape(1000, 776, 1032, DType::kF16, DType::kF16), 3});
  cases.push_back({shape(300, 264, 200), 1});
  cases.back().args.lda = 208, cases.back().args.ldb = 216, cases.back().args.ldc = 280;
  cases.push_back(cases.back());
  cases.back().args.ldc = 276;                    // rows not 16-byte aligned: register stores
  cases.push_back({shape(1000, 1032, 520), 13});  // 40 tiles on 13 blocks: one block has 4
  for (Case& c : cases) {
    c.args.num_sms = c.sms;
    const int64_t tiles = gemm_tile_grid(c.args.m, c.args.n).num_tiles();
    ASSERT_TRUE(gemm_tma_store_config(c.args.out_type, tiles, c.sms))
        << c.args.m << "x" << c.args.n;
    run_and_check(c.args);
  }
  EXPECT_FALSE(gemm_tma_store_config(DType::kBF16, 128, 128));  // one tile a block
  EXPECT_FALSE(gemm_tma_store_config(DType::kF32, 1024, 132));  // fp32 output
}

// The default order's first wave: on a narrow grid it is whole tile rows (each A band read once),
// on a wide one a group of rows about twice as tall as the wave is wide.
TEST(Sm90Gemm, DefaultOrderFirstWave) {
  struct Case {
    int64_t m, n;
    int blocks, rows;  // tile rows the first `blocks` tiles of the order touch
  };
  // 64x6 tiles: 132 = 22 whole rows; 128x4: 33 rows; 64x16: a group of 18 rows; 4x32: all 4 rows;
  // 64x6 on 16 blocks: a group of 6 rows (16 tiles are not whole rows of a 6-row group).
  for (const Case& c :
       {Case{8192, 1536, 132, 22}, Case{16384, 1024, 132, 33}, Case{8192, 4096, 132, 18},
        Case{512, 8192, 132, 4}, Case{8192, 1536, 16, 6}}) {
    GemmArgs a = shape(c.m, c.n, 64);
    const TileOrder o = gemm_tile_order(a, c.blocks);
    std::set<int> rows;
    for (int i = 0; i < std::min(c.blocks, o.count()); ++i) rows.insert(o.at(i).m);
    EXPECT_EQ(static_cast<int>(rows.size()), c.rows)
        << c.m << "x" << c.n << " on " << c.blocks << " blocks";
  }
}

// A workspace for the split last wave of `args` (zero-filled), freed with the object; it checks on
// destruction that every launch left the flag records zero again.
struct SplitWorkspace {
  void* p = nullptr;
  explicit SplitWorkspace(GemmArgs& args) {
    const int64_t bytes = gemm_workspace_bytes(args);
    CK(cudaMalloc(&p, std::max(bytes, kSplitFlagsRegionBytes)));
    CK(cudaMemset(p, 0, std::max(bytes, kSplitFlagsRegionBytes)));
    args.workspace = p, args.workspace_bytes = bytes;
  }
  ~SplitWorkspace() {
    std::vector<uint32_t> flags(kSplitFlagsRegionBytes / 4);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(flags.data(), p, flags.size() * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < flags.size(); ++i) EXPECT_EQ(flags[i], 0u) << "flag word " << i;
    CK(cudaFree(p));
  }
};

// The split last wave: tails of 1..8 tiles split in 2, 3 or 4 parts of K (ragged, uneven parts),
// grids smaller than half the SMs, both configurations, every dtype pair, strided and unaligned C,
// kReduceAdd; each case twice on the same workspace (which every launch must leave zero-filled).
TEST(Sm90Gemm, SplitLastWave) {
  struct Case {
    GemmArgs args;
    int sms;
    bool reduce = false;
  };
  std::vector<Case> cases = {
      {shape(300, 776, 1024), 8},     // 12 tiles on 8 blocks: 4 split, 4-stage configuration
      {shape(1000, 1032, 1000), 16},  // 40 on 16: 8 split, ragged M, N and K
      {shape(17, 264, 2048), 4},      // 2 tiles on 4 blocks: both split
      {shape(1000, 1032, 520), 13},   // 40 on 13: 1 split (9 k-blocks), TMA-store configuration
      {shape(1000, 776, 1032), 11},   // 32 on 11: a last wave of 10 > 11 / 2, not split (control)
      {shape(129, 3080, 1032), 20},   // 26 on 20: 6 split, 17 k-blocks (halves 8 + 9)
      {shape(300, 776, 1024, DType::kBF16, DType::kF32), 8},
      {shape(1000, 1032, 1000, DType::kF16, DType::kF16), 16},
      {shape(300, 776, 1024, DType::kF16, DType::kF32), 8},
      {shape(1000, 1032, 520), 13, true},  // kReduceAdd
      {shape(300, 776, 1024), 8, true},
      {shape(17, 264, 8192), 8},    // 2 tiles on 8 blocks: 4 parts
      {shape(300, 776, 6144), 40},  // 12 tiles on 40 blocks: 3 parts
      {shape(129, 776, 6152), 24},  // 8 on 24: 3 parts of 32, 32 and 33 k-blocks, ragged K
      {shape(300, 768, 8192), 4},   // 9 on 4: 1 tile in 4 parts, TMA-store configuration
      {shape(17, 264, 8192, DType::kBF16, DType::kF32), 8},
      {shape(1000, 1032, 1000, DType::kF16, DType::kF32), 16},
      {shape(300, 776, 6144), 40, true},  // kReduceAdd, 3 parts
      // a few rows of C (M <= kSplitFewRows): more parts, and the meeting moves only those rows
      {shape(1, 4104, 4096), 72},                             // 17 tiles: 4 parts of 16 k-blocks
      {shape(64, 2056, 2048), 40},                            // 9 tiles: 4 parts of 8
      {shape(65, 2056, 2048), 40},                            // 65 rows: 2 parts
      {shape(5, 1032, 2048, DType::kBF16, DType::kF32), 24},  // 4 parts
      {shape(5, 1032, 2048), 24, true},                       // kReduceAdd, 4 parts
      {shape(3, 776, 2568), 20},                              // 4 tiles: 4 parts, ragged K
      {shape(20, 1032, 1536), 36},                            // 5 tiles: 3 parts of 8
  };
  cases.push_back({shape(300, 264, 1024), 4});  // strided operands and output
  cases.back().args.lda = 1032, cases.back().args.ldb = 1040, cases.back().args.ldc = 280;
  cases.push_back(cases.back());
  cases.back().args.ldc = 276;  // rows not 16-byte aligned
  int split_cases = 0, many_parts = 0;
  for (Case& c : cases) {
    c.args.num_sms = c.sms;
    SCOPED_TRACE(::testing::Message() << c.args.m << "x" << c.args.n << "x" << c.args.k << " on "
                                      << c.sms << " blocks" << (c.reduce ? ", reduce" : ""));
    SplitWorkspace ws(c.args);
    const GemmWork w = gemm_work(c.args);
    const GemmSplit rule =
        gemm_split(w.tiles, c.sms, c.args.k, std::min<int64_t>(c.args.m, kTileM));
    EXPECT_EQ(w.split.tiles, rule.tiles);
    EXPECT_EQ(w.split.parts, rule.parts);
    EXPECT_EQ(w.blocks, std::min<int64_t>(c.sms, w.tiles + (w.split.parts - 1) * w.split.tiles));
    split_cases += w.split.tiles > 0;
    many_parts += w.split.parts > 2;
    for (int rep = 0; rep < 2; ++rep) run_and_check(c.args, c.reduce);
  }
  EXPECT_EQ(split_cases, static_cast<int>(cases.size()) - 1);  // all but the control split
  EXPECT_EQ(many_parts, 12);
  // The rule: at most half a wave, at least kSplitMinKTiles k-blocks, more than two parts only
  // with kSplitMinPartKTiles k-blocks each (kSplitMinPartKTilesFewRows for at most kSplitFewRows
  // rows of C).
  auto split = [](int64_t tiles, int blocks, int64_t k, int64_t rows = kTileM) {
    const GemmSplit s = gemm_split(tiles, blocks, k, rows);
    return std::pair<int64_t, int>{s.tiles, s.parts};
  };
  EXPECT_EQ(split(16, 132, 4096), (std::pair<int64_t, int>{16, 2}));
  EXPECT_EQ(split(16, 132, 4096, 1), (std::pair<int64_t, int>{16, 4}));
  EXPECT_EQ(split(16, 132, 4096, 64), (std::pair<int64_t, int>{16, 4}));
  EXPECT_EQ(split(16, 132, 4096, 65), (std::pair<int64_t, int>{16, 2}));
  EXPECT_EQ(split(16, 132, 1536, 1), (std::pair<int64_t, int>{16, 3}));  // 24 k-blocks
  EXPECT_EQ(split(32, 132, 8192, 1), (std::pair<int64_t, int>{32, 4}));  // 4 parts fill the SMs
  EXPECT_EQ(split(192, 132, 8192), (std::pair<int64_t, int>{60, 2}));
  EXPECT_EQ(split(64, 132, 8192), (std::pair<int64_t, int>{64, 2}));
  EXPECT_EQ(split(32, 132, 8192), (std::pair<int64_t, int>{32, 4}));
  EXPECT_EQ(split(32, 132, 4096), (std::pair<int64_t, int>{32, 2}));
  EXPECT_EQ(split(24, 132, 6144), (std::pair<int64_t, int>{24, 3}));
  EXPECT_EQ(split(2048, 132, 8192), (std::pair<int64_t, int>{0, 1}));  // 68 > 66
  EXPECT_EQ(split(264, 132, 8192), (std::pair<int64_t, int>{0, 1}));   // whole waves
  EXPECT_EQ(split(192, 132, 448), (std::pair<int64_t, int>{0, 1}));    // 7 k-blocks
  // No workspace: no split.
  GemmArgs plain = shape(300, 776, 1024);
  plain.num_sms = 8;
  EXPECT_EQ(gemm_work(plain).split.tiles, 0);
  EXPECT_EQ(gemm_work(plain).blocks, 8);
  EXPECT_GT(gemm_workspace_bytes(plain), 0);
}

// Holds every SM (one block each: its shared memory leaves no room for an engine block) for a
// different pseudo-random time, so that a launch queued behind it starts its blocks in a shuffled
// order.
__global__ void hold_sms(uint32_t seed, long long max_cycles) {
  uint32_t h = (blockIdx.x + 1) * 2654435761u ^ seed;
  h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
  const long long until = clock64() + static_cast<long long>(h % 1024) * (max_cycles / 1024);
  while (clock64() < until) {
  }
}

// The split's sum does not depend on which part arrives last: the parts of each split tile start
// in a different order on every launch (hold_sms in front of it), and fp32 outputs must match the
// first launch's bit for bit (2, 3 and 4 parts; 3 and 4 parts of a tile of a few rows).
TEST(Sm90Gemm, SplitSumDoesNotDependOnArrival) {
  int sms = 0, smem = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  CK(cudaFuncSetAttribute(hold_sms, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaStream_t hold_stream, gemm_stream;
  CK(cudaStreamCreateWithFlags(&hold_stream, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&gemm_stream, cudaStreamNonBlocking));
  struct Case {
    GemmArgs args;
    int sms, parts;
  };
  for (Case c : {Case{shape(17, 264, 8192, DType::kBF16, DType::kF32), 8, 4},
                 Case{shape(300, 776, 6144, DType::kBF16, DType::kF32), 40, 3},
                 Case{shape(1000, 1032, 1000, DType::kF16, DType::kF32), 16, 2},
                 Case{shape(5, 1032, 2048, DType::kBF16, DType::kF32), 24, 4},  // a few rows
                 Case{shape(20, 1032, 1536, DType::kF16, DType::kF32), 36, 3}}) {
    GemmArgs& a = c.args;
    a.num_sms = c.sms;
    SCOPED_TRACE(::testing::Message()
                 << a.m << "x" << a.n << "x" << a.k << ", " << c.parts << " parts");
    SplitWorkspace ws(a);
    ASSERT_EQ(gemm_work(a).split.parts, c.parts);
    Buffers buf;
    CK(cudaMalloc(&buf.a, a.m * a.k * 2));
    CK(cudaMalloc(&buf.b, a.n * a.k * 2));
    CK(cudaMalloc(&buf.c, a.m * a.n * 4));
    ref::fill_uniform(buf.a, a.in_type, a.m * a.k, fresh_seed(), 1.0f);
    ref::fill_uniform(buf.b, a.in_type, a.n * a.k, fresh_seed(), 1.0f);
    CK(cudaMalloc(&buf.ref, a.m * a.n * 4));
    ref::reference_gemm(buf.a, buf.b, a.in_type, a.m, a.n, a.k, a.k, a.k, nullptr, a.out_type, a.n,
                        buf.ref);
    a.a = buf.a, a.b = buf.b, a.c = buf.c;
    std::vector<uint32_t> first(a.m * a.n), again(a.m * a.n);
    for (int run = 0; run < 6; ++run) {
      CK(cudaMemset(buf.c, 0xff, a.m * a.n * 4));
      CK(cudaDeviceSynchronize());
      if (run > 0) hold_sms<<<sms, 32, smem, hold_stream>>>(fresh_seed(), 40000);  // ~20 us at most
      CK(cudaGetLastError());
      gemm(a, gemm_stream);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(run == 0 ? first.data() : again.data(), buf.c, a.m * a.n * 4,
                    cudaMemcpyDeviceToHost));
      if (run == 0) {
        const ref::Comparison cmp = ref::compare(buf.c, a.out_type, a.n, buf.ref, a.m, a.n);
        EXPECT_EQ(cmp.non_finite, 0);
        EXPECT_LE(cmp.rel_err, ref::tolerance(a.out_type));
      } else {
        int64_t differ = 0;
        for (size_t i = 0; i < first.size(); ++i) differ += first[i] != again[i];
        EXPECT_EQ(differ, 0) << "run " << run;
      }
    }
  }
  CK(cudaStreamDestroy(hold_stream));
  CK(cudaStreamDestroy(gemm_stream));
}

// GemmWorkspace: sized to each launch, grown when one needs more, nothing for one that does not
// split; results checked after each. The shapes reuse it with more split tiles after fewer (the
// flag records must not lie where an earlier launch left a partial tile).
TEST(Sm90Gemm, WorkspaceGrowsWithTheSplit) {
  GemmWorkspace ws;
  int64_t last_bytes = 0;
  for (auto [m, n, k, sms] : {std::tuple{300, 776, 1024, 8},  // 4 tiles in 2 parts
                              {17, 264, 8192, 8},             // 2 tiles in 4 parts: more
                              {1000, 776, 1032, 11},          // no split
                              {300, 776, 1024, 8},            // less: the buffer stays
                              {256, 4096, 16384, 0},          // 32 tiles in 4 parts (16 MiB)
                              {1000, 1032, 1024, 100},        // 40 tiles in 2 parts, reused
                              {256, 4096, 16384, 0}}) {
    GemmArgs a = shape(m, n, k);
    a.num_sms = sms;
    ws.attach(a, 0);
    const int64_t need = gemm_workspace_bytes(a);
    if (need == 0) {
      EXPECT_EQ(a.workspace, nullptr);
    } else {
      EXPECT_NE(a.workspace, nullptr);
      EXPECT_GE(a.workspace_bytes, need);
      EXPECT_GE(ws.bytes(), last_bytes);
      last_bytes = ws.bytes();
    }
    run_and_check(a);
  }
  EXPECT_EQ(last_bytes, gemm_split_workspace_bytes(GemmSplit{32, 4}));
}

// Launches of at most four tile rows read A and B with 256-byte L2 promotion (gemm_wide_l2_fetch):
// the engine re-encodes CUTLASS's descriptors, but only where its reading of their geometry gives
// CUTLASS's bytes. It must on every operand shape, or the wide fetch silently stays off. (The
// launches of M <= 512 in the other tests check the results with it on.)
TEST(Sm90Gemm, WideL2FetchMatchesCutlass) {
  struct Case {
    int64_t m, n, k, lda, ldb;
  };
  auto check = [](auto cfg, DType in, const Case& c) {
    using Cfg = decltype(cfg);
    GemmArgs a = shape(c.m, c.n, c.k, in, DType::kF32);
    a.lda = c.lda, a.ldb = c.ldb;
    Buffers buf;
    CK(cudaMalloc(&buf.a, ((c.m - 1) * c.lda + c.k) * 2));
    CK(cudaMalloc(&buf.b, ((c.n - 1) * c.ldb + c.k) * 2));
    a.a = buf.a, a.b = buf.b;
    auto mp = engine::mainloop_params<Cfg>(a);
    const auto* da = mp.tma_load_a.get_tma_descriptor();
    const auto* db = mp.tma_load_b.get_tma_descriptor();
    const cute::TmaDescriptor old_a = *da, old_b = *db;
    using In = typename Cfg::ElementIn;
    EXPECT_TRUE(engine::widen_l2_fetch<In>(da, a.a, c.m, c.k, c.lda, kTileM)) << "A of " << c.m;
    EXPECT_TRUE(engine::widen_l2_fetch<In>(db, a.b, c.n, c.k, c.ldb, kTileN)) << "B of " << c.m;
    EXPECT_NE(std::memcmp(&old_a, da, sizeof(old_a)), 0);
    EXPECT_NE(std::memcmp(&old_b, db, sizeof(old_b)), 0);
    // a second pass finds 256-byte descriptors, not CUTLASS's: it leaves them alone
    EXPECT_FALSE(engine::widen_l2_fetch<In>(da, a.a, c.m, c.k, c.lda, kTileM));
  };
  for (const Case& c :
       {Case{1, 8, 8, 8, 8}, Case{17, 264, 72, 72, 72}, Case{128, 8192, 8192, 8192, 8192},
        Case{300, 776, 1032, 1040, 1096}, Case{512, 4096, 8192, 8200, 8256}}) {
    SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k);
    check(engine::GemmConfig<cutlass::bfloat16_t, __nv_bfloat16, false>{}, DType::kBF16, c);
    check(engine::GemmConfig<cutlass::half_t, float, false>{}, DType::kF16, c);
    check(engine::GemmConfig<cutlass::bfloat16_t, __nv_bfloat16, true>{}, DType::kBF16, c);
  }
}

TEST(Sm90Gemm, EmptyM) {
  GemmArgs a = shape(0, 64, 64);
  void* p = nullptr;
  CK(cudaMalloc(&p, 1 << 16));
  a.a = a.b = a.c = p;
  EXPECT_NO_THROW(gemm(a, 0));
  CK(cudaDeviceSynchronize());
  CK(cudaFree(p));
}

// ---- the decode kernel (GemmArgs::kernel, M <= kDecodeMaxRows) ----

GemmArgs decode(int64_t m, int64_t n, int64_t k, DType in = DType::kBF16,
                DType out = DType::kBF16) {
  GemmArgs a = shape(m, n, k, in, out, 0);
  a.kernel = GemmKernel::kDecode;
  return a;
}

// Every dtype pair x the rows `ms` x shapes whose N is not a multiple of 16 (nor of the wgmma
// form's 64 rows of B), from one tile of B's rows to more blocks than the SMs hold, and whose K is
// not a multiple of the 32-element step nor of the 64-element k-block, and long enough for
// clusters of 1 to 8 blocks (8 x 32776: 8). M <= 16 takes the mma.sync form where N >= 2048
// (4232: a block's warps on two n-groups; 12680: four) and the wgmma form below. `last_k`: the K of
// 12680 rows of B.
void check_decode_grid(std::initializer_list<int64_t> ms, int64_t last_k) {
  for (auto [in, out] : {std::pair{DType::kBF16, DType::kBF16},
                         {DType::kBF16, DType::kF32},
                         {DType::kF16, DType::kF16},
                         {DType::kF16, DType::kF32}}) {
    for (int64_t m : ms) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{8, 8},
                          {24, 40},
                          {776, 1032},
                          {4232, 520},
                          {8, 32776},
                          {12680, last_k}}) {
        run_and_check(decode(m, n, k, in, out));
      }
    }
  }
}

// M <= 16, across the 8-row fragments (1 and 2 of them) and the wgmma form's 16 rows; 20008 rows
// of B: more blocks than the SMs hold.
TEST(Sm90GemmDecode, ShapesAndDtypes) {
  check_decode_grid({1, 7, 8, 9, 16}, 520);
  for (int64_t m : {2, 3, 5, 12}) {
    run_and_check(decode(m, 1280, 8192));  // wgmma, clusters of 8
    run_and_check(decode(m, 2048, 8192));  // mma.sync, clusters of 2
  }
  run_and_check(decode(4, 8200, 4104));
  run_and_check(decode(15, 20008, 4104));
  run_and_check(decode(6, 264, 16392));
}

// M above 16 (the wgmma form only): every dtype pair, M on and off the 8-row edges (the rows of A
// a stage loads) and across the 32-, 64- and 128-column MMAs, K shorter than a k-block and ragged
// against it, N from one 64-row tile to more blocks than the SMs hold; K long enough for clusters
// of 2 to 8 blocks.
TEST(Sm90GemmDecode, WideShapesAndDtypes) {
  check_decode_grid({17, 24, 31, 32, 33, 40, 47, 63, 64, 65, 100, 127, 128}, 136);
  for (int64_t m : {18, 25, 34, 41, 56, 72, 121}) run_and_check(decode(m, 1280, 8192));
  run_and_check(decode(57, 8200, 4104));
  run_and_check(decode(30, 20008, 4104));
  run_and_check(decode(50, 20008, 4104));
  run_and_check(decode(64, 264, 16392));
  run_and_check(decode(36, 72, 72));
}

// Strided A, B and C (the margins between C's rows stay poisoned) and kReduceAdd, in each form and
// width of the kernel (mma.sync at M <= 16 with N >= 2048; wgmma with 16, 32, 64 and 128 columns).
TEST(Sm90GemmDecode, StridedAndReduceAdd) {
  for (auto [m, n, m_full, m_f16] : {std::tuple{13, 2056, 16, 1},
                                     {13, 264, 16, 1},
                                     {19, 264, 32, 21},
                                     {45, 264, 64, 39},
                                     {90, 264, 128, 67}}) {
    GemmArgs a = decode(m, n, 200);
    a.lda = 208, a.ldb = 216, a.ldc = n + 16;
    run_and_check(a);
    a.out_type = DType::kF32, a.ldc = n + 6;
    run_and_check(a);
    a.ldc = 0;
    for (DType out : {DType::kBF16, DType::kF32}) {
      a.out_type = out;
      run_and_check(a, true);
      run_and_check(decode(m_full, n == 264 ? 1032 : 4232, 8192, DType::kBF16, out), true);
    }
    run_and_check(decode(m_f16, n == 264 ? 776 : 2056, 1032, DType::kF16, DType::kF16), true);
  }
}

// The partials are added in a fixed order: the same inputs give the same bits.
TEST(Sm90GemmDecode, Deterministic) {
  // mma.sync in clusters of 2; wgmma with 16, 32, 64 and 128 columns in clusters of 8
  for (auto [m, n] :
       {std::pair<int64_t, int64_t>{9, 2048}, {9, 264}, {28, 264}, {50, 264}, {111, 264}}) {
    GemmArgs a = decode(m, n, 32768, DType::kBF16, DType::kF32);
    Buffers buf;
    void* c2 = nullptr;
    CK(cudaMalloc(&buf.a, a.m * a.k * 2));
    CK(cudaMalloc(&buf.b, a.n * a.k * 2));
    CK(cudaMalloc(&buf.c, a.m * a.n * 4));
    CK(cudaMalloc(&c2, a.m * a.n * 4));
    ref::fill_uniform(buf.a, a.in_type, a.m * a.k, fresh_seed(), 1.0f);
    ref::fill_uniform(buf.b, a.in_type, a.n * a.k, fresh_seed(), 1.0f);
    a.a = buf.a, a.b = buf.b, a.c = buf.c;
    gemm(a, 0);
    a.c = c2;
    gemm(a, 0);
    std::vector<float> x(a.m * a.n), y(a.m * a.n);
    CK(cudaMemcpy(x.data(), buf.c, x.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y.data(), c2, y.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaFree(c2));
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << m << "x" << n;
  }
}

// kAuto takes the decode kernel where gemm_decode_shape says so (M <= 32 at any N; M 33-64 up to
// N = kDecodeWideMaxN; M 65-128 where N <= kDecodeTallMaxN, or N <= kDecodeTallNKMaxN and N * K <=
// kDecodeTallMaxNK), with every SM and no named width; the tile engine otherwise. Both give the
// product.
TEST(Sm90GemmDecode, AutoPicksByShape) {
  EXPECT_TRUE(gemm_decode_shape(1, 28672, 8192));
  EXPECT_TRUE(gemm_decode_shape(kDecodeAutoMaxRows, 28672, 28672));
  EXPECT_TRUE(gemm_decode_shape(kDecodeAutoMaxRows + 1, kDecodeWideMaxN, 28672));
  EXPECT_FALSE(gemm_decode_shape(kDecodeAutoMaxRows + 1, kDecodeWideMaxN + 8, 1024));
  EXPECT_TRUE(gemm_decode_shape(kDecodeWideMaxRows, kDecodeWideMaxN, 8192));
  EXPECT_TRUE(gemm_decode_shape(kDecodeWideMaxRows + 1, kDecodeTallMaxN, 28672));
  EXPECT_TRUE(gemm_decode_shape(kDecodeMaxRows, 8192, 8192));  // N * K = kDecodeTallMaxNK
  EXPECT_FALSE(gemm_decode_shape(kDecodeMaxRows, 8192, 8200));
  EXPECT_TRUE(gemm_decode_shape(kDecodeMaxRows, kDecodeTallNKMaxN, 4096));
  EXPECT_FALSE(gemm_decode_shape(kDecodeMaxRows, kDecodeTallNKMaxN + 8, 1024));
  EXPECT_FALSE(gemm_decode_shape(kDecodeWideMaxRows + 1, 20480, 2048));  // N * K < 2^26
  EXPECT_FALSE(gemm_decode_shape(kDecodeMaxRows + 1, 1280, 1024));
  EXPECT_FALSE(gemm_decode_shape(0, 1280, 1024));

  GemmArgs a = shape(5, 4096, 4096, DType::kBF16, DType::kBF16, 0);
  EXPECT_TRUE(gemm_takes_decode(a));
  a.m = kDecodeMaxRows + 1;
  EXPECT_FALSE(gemm_takes_decode(a));
  a.m = 0;
  EXPECT_FALSE(gemm_takes_decode(a));
  a.m = 5, a.num_sms = 8;
  EXPECT_FALSE(gemm_takes_decode(a));
  a.num_sms = 0, a.tile_n = kTileN;
  EXPECT_FALSE(gemm_takes_decode(a));
  a.tile_n = 0, a.kernel = GemmKernel::kTileEngine;
  EXPECT_FALSE(gemm_takes_decode(a));
  a.kernel = GemmKernel::kAuto;
  EXPECT_TRUE(gemm_takes_decode(a));
  a.m = kDecodeMaxRows, a.n = 8192, a.kernel = GemmKernel::kDecode;  // kDecode: any shape in range
  EXPECT_TRUE(gemm_takes_decode(a));
  run_and_check(shape(5, 2056, 1032, DType::kBF16, DType::kBF16, 0));                  // mma.sync
  run_and_check(shape(5, 776, 1032, DType::kBF16, DType::kBF16, 0));                   // wgmma
  run_and_check(shape(kDecodeMaxRows, 776, 1032, DType::kBF16, DType::kBF16, 0));      // wgmma
  run_and_check(shape(kDecodeMaxRows + 1, 776, 1032, DType::kBF16, DType::kBF16, 0));  // the engine
  run_and_check(
      shape(kDecodeWideMaxRows, 16392, 1032, DType::kBF16, DType::kBF16, 0));  // the engine
  GemmArgs e = shape(5, 776, 1032, DType::kF16, DType::kF32, 0);
  e.kernel = GemmKernel::kTileEngine;
  run_and_check(e);
}

TEST(Sm90GemmDecode, BadInputThrows) {
  void* p = nullptr;
  CK(cudaMalloc(&p, 1 << 20));
  auto expect_error = [&](GemmArgs a, const char* what) {
    a.a = a.b = a.c = p;
    try {
      gemm(a, 0);
      ADD_FAILURE() << "no error; expected: " << what;
    } catch (const tilelink::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error(decode(kDecodeMaxRows + 1, 64, 64), "decode kernel takes M <=");
  GemmArgs a = decode(4, 64, 64);
  a.num_sms = 8;
  expect_error(a, "num_sms must be 0");
  expect_error(decode(4, 12, 64), "multiple of 8");
  a = decode(4, 64, 64);
  a.kernel = static_cast<GemmKernel>(7);
  expect_error(a, "kernel must be");
  a = decode(4, 64, 64);
  a.a = a.b = a.c = p;
  EXPECT_THROW((launch_gemm<cutlass::bfloat16_t, __nv_bfloat16>(a, NoHooks{}, 0)), tilelink::Error);
  CK(cudaDeviceSynchronize());
  CK(cudaFree(p));
}

// Shapes of a named tile: tiled(tile_n, tile_m)(m, n, k[, in, out]).
auto tiled(int tile_n, int tile_m = 0) {
  return [tile_n, tile_m](int64_t m, int64_t n, int64_t k, DType in = DType::kBF16,
                          DType out = DType::kBF16) {
    GemmArgs a = shape(m, n, k, in, out, tile_n);
    a.tile_m = tile_m;
    return a;
  };
}

// A narrower tile width (GemmArgs::tile_n): aligned and ragged shapes (`aligned`, then a grid of
// small ones), every dtype pair and kReduceAdd on 1000 rows x `nk` (a few tiles wide, the last
// one ragged), strided and unaligned C, then `cases` on a few blocks, each with the TMA-store
// configuration and the split that it expects (several tiles a block, split last waves of 2 to 4
// parts).
struct WidthCase {
  GemmArgs args;
  int sms;
  bool tma_store, split;
};
void check_tile_width(int tile_n,
                      std::initializer_list<std::tuple<int64_t, int64_t, int64_t>> aligned,
                      std::pair<int64_t, int64_t> nk, std::initializer_list<WidthCase> cases,
                      int tile_m = 0) {
  SCOPED_TRACE(::testing::Message() << "tile " << tile_m << " x " << tile_n);
  auto at = tiled(tile_n, tile_m);
  for (auto [m, n, k] : aligned) run_and_check(at(m, n, k));
  for (int64_t m : {1, 17, 64, 65, 1000}) {
    for (auto [n, k] : {std::pair{8, 8}, {200, 72}, {392, 1000}}) run_and_check(at(m, n, k));
  }
  const auto [nk_n, nk_k] = nk;
  for (auto [in, out] : {std::pair{DType::kBF16, DType::kF32},
                         {DType::kF16, DType::kF16},
                         {DType::kF16, DType::kF32}}) {
    run_and_check(at(1000, nk_n, nk_k, in, out));
  }
  GemmArgs strided = at(300, 264, 200);
  strided.lda = 208, strided.ldb = 216, strided.ldc = 280;
  run_and_check(strided);
  strided.ldc = 276;  // rows not 16-byte aligned: the pair-store epilogue
  run_and_check(strided);
  run_and_check(at(1000, nk_n, nk_k), true);
  run_and_check(at(17, 264, 72, DType::kF16, DType::kF32), true);
  for (WidthCase c : cases) {
    c.args.num_sms = c.sms;
    SCOPED_TRACE(::testing::Message()
                 << c.args.m << "x" << c.args.n << "x" << c.args.k << " on " << c.sms << " blocks");
    ASSERT_EQ(c.args.tile_n, tile_n);
    std::optional<SplitWorkspace> ws;
    if (c.split) ws.emplace(c.args);
    const GemmWork w = gemm_work(c.args);
    EXPECT_EQ(w.tile_n, tile_n);
    EXPECT_EQ(w.tile_m, tile_m == 0 ? kTileM : tile_m);
    EXPECT_EQ(w.tiles, gemm_tile_grid(c.args.m, c.args.n, tile_n, w.tile_m).num_tiles());
    EXPECT_EQ(gemm_tma_store_config(c.args.out_type, w.tiles, w.blocks), c.tma_store);
    EXPECT_EQ(w.split.tiles > 0, c.split);
    for (int rep = 0; rep < 2; ++rep) run_and_check(c.args);
  }
}

// 192-wide tiles (GemmArgs::tile_n = kTileNNarrow).
TEST(Sm90Gemm, NarrowTiles) {
  auto narrow = tiled(kTileNNarrow);
  check_tile_width(kTileNNarrow, {{128, 192, 64}, {1000, 776, 1032}, {2048, 2304, 1024}},
                   {776, 1032},
                   {{narrow(1000, 1032, 520), 13, true, false},  // 48 tiles: 3-4 a block
                    {narrow(1000, 1032, 1000), 20, true, true},  // 8 of 48 split
                    {narrow(300, 776, 6144), 48, false, true},   // 15 on 48: 3 parts of 32
                    {narrow(17, 200, 8192), 8, false, true},     // 2 tiles on 8: 4 parts
                    {narrow(1000, 1032, 1000, DType::kF16, DType::kF32), 20, false, true}});
}

// 160-wide tiles (GemmArgs::tile_n = kTileNLean): a width that is not a multiple of the epilogue's
// 64-column chunks, so the staged store ends in a 32-column chunk and the TMA store in a tail box
// of its own (the last tile of N = 1112 holds 24 of its 32 columns, of N = 1000 none).
TEST(Sm90Gemm, LeanTiles) {
  auto lean = tiled(kTileNLean);
  check_tile_width(kTileNLean, {{128, 160, 64}, {1000, 1000, 1032}, {2048, 2240, 1024}},
                   {1112, 1032},
                   {{lean(1000, 1112, 520), 7, true, false},   // 56 tiles: 8 a block
                    {lean(1000, 1000, 520), 7, true, false},   // the last tile column holds 40
                    {lean(1000, 1112, 1000), 24, true, true},  // 8 of 56 split in 2
                    {lean(300, 776, 6144), 48, false, true},   // 15 on 48: 3 parts of 32
                    {lean(17, 200, 8192), 8, false, true},     // 2 tiles on 8: 4 parts
                    {lean(1000, 1112, 1000, DType::kF16, DType::kF32), 24, false, true}});
}

// The plain engine's 176-wide tiles (kTileNFit; gemm() only, never split): a width whose TMA store
// ends in a 48-column tail box and whose staged store ends in a 48-column chunk (N = 1064 leaves a
// last tile of 8 columns, N = 1056 a whole one). A workspace is never used: gemm_work gives no split
// where the hooked widths would split.
TEST(Sm90Gemm, FitTiles) {
  auto fit = tiled(kTileNFit);
  check_tile_width(kTileNFit, {{128, 176, 64}, {1000, 1056, 1032}, {2048, 2112, 1024}},
                   {1064, 1032},
                   {{fit(1000, 1064, 520), 7, true, false},    // 56 tiles: 8 a block
                    {fit(1000, 1056, 520), 7, true, false},    // the last tile column whole
                    {fit(1000, 1064, 1000), 24, true, false},  // 8 of 56 past 2 waves: not split
                    {fit(300, 776, 6144), 48, false, false},
                    {fit(1000, 1064, 1000, DType::kF16, DType::kF32), 24, false, false}});
  GemmArgs a = fit(1000, 1064, 1000);
  a.num_sms = 24;
  SplitWorkspace ws(a);  // sized for the hooked widths' pick; the 176-wide launch ignores it
  EXPECT_EQ(gemm_work(a).split.tiles, 0);
  EXPECT_EQ(gemm_workspace_bytes(a), 0);
  run_and_check(a);
}

// The plain engine's 256-row tiles (kTileMTall x kTileNTall; two 64-row slabs a consumer warpgroup,
// the staged store slab by slab, register stores only): ragged rows and columns, every dtype pair,
// kReduceAdd, strided and unaligned C, several tiles a block, and a ragged last tile row of every
// remainder class around the 64- and 128-row slabs (the short A box of up to 256 rows).
TEST(Sm90Gemm, TallTiles) {
  auto tall = tiled(kTileNTall, kTileMTall);
  check_tile_width(kTileNTall, {{256, 160, 64}, {1024, 1120, 1032}, {2048, 2240, 1024}},
                   {1112, 1032},
                   {{tall(1000, 1112, 520), 7, true, false},  // 28 tiles: 4 a block
                    {tall(3000, 5000, 2048), 132, true, false},
                    {tall(1000, 1112, 1000, DType::kF16, DType::kF32), 24, false, false}},
                   kTileMTall);
  for (int64_t rows : {1, 8, 9, 63, 64, 65, 127, 128, 129, 192, 200, 255}) {
    for (int64_t m : {rows, 256 + rows}) run_and_check(tall(m, 328, 1032));
  }
  EXPECT_EQ(gemm_work(tall(1000, 1112, 520)).tiles, 4 * 7);
  // a named tile_m of 256 takes 160 columns; any other width is refused
  GemmArgs named = shape(1000, 1112, 520, DType::kBF16, DType::kBF16, 0);
  named.tile_m = kTileMTall;
  EXPECT_EQ(gemm_work(named).tile_n, kTileNTall);
  named.tile_n = kTileN;
  EXPECT_THROW(gemm_work(named), tilelink::Error);
  named.tile_m = 192;
  EXPECT_THROW(gemm_work(named), tilelink::Error);
}

// The plain engine's tiles run no hooks: a hooked launch that names one is refused before anything
// launches, and its pick never takes one.
struct NotifyNothingHooks {
  static constexpr bool kWaits = false;
  static constexpr bool kNotifies = true;
  __device__ void after_tile_stored(const TileWork&) const {}
};
TEST(Sm90Gemm, PlainTilesRefuseHooks) {
  void* p = nullptr;
  CK(cudaMalloc(&p, 1 << 20));
  for (auto [tm, tn] : {std::pair{kTileMTall, 0}, {0, kTileNFit}, {kTileM, kTileNFit}}) {
    GemmArgs a = shape(256, 256, 64, DType::kBF16, DType::kBF16, tn);
    a.tile_m = tm;
    a.a = a.b = a.c = p;
    EXPECT_THROW((launch_gemm<cutlass::bfloat16_t, __nv_bfloat16>(a, NotifyNothingHooks{}, 0)),
                 tilelink::Error)
        << tm << " x " << tn;
  }
  CK(cudaDeviceSynchronize());
  CK(cudaFree(p));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (auto [m, n, k] : {std::tuple{2048, 7168, 2048}, {3000, 5000, 7168}}) {
    GemmArgs a = shape(m, n, k, DType::kBF16, DType::kBF16, 0);
    a.num_sms = std::min(132, sms);
    a.plain_tiles = true;  // the hooked launch's pick ignores it
    EXPECT_EQ(gemm_work(a).tile_m, kTileM);
    EXPECT_FALSE(gemm_plain_only_tile(gemm_tile_grid(a).tile_m, gemm_tile_grid(a).tile_n));
  }
}

// The plain engine's pick (gemm() with tile_n and tile_m 0, plain_tiles): its own tiles where their
// whole waves cost less than the hooked widths' (split) ones; never below kPlainTileMinRows rows,
// never where their own last wave is at most half full, never with a start_m or row bands, never
// without the opt-in; the launch correct.
TEST(Sm90Gemm, PlainPick) {
  const GemmTile fit{kTileM, kTileNFit}, tall{kTileMTall, kTileNTall};
  auto is = [](GemmTile a, GemmTile b) { return a.m == b.m && a.n == b.n; };
  // 2048x7168: 656 tiles of 176 (4.97 waves) against 448 of 256 (3.4); 3000x5000: 384 of 256x160
  // (2.9) against 480 of 256 (3.6)
  EXPECT_TRUE(is(gemm_pick_tile(2048, 7168, 2048, 132, true), fit));
  EXPECT_TRUE(is(gemm_pick_tile(2048, 7168, 8192, 132, true), fit));
  EXPECT_TRUE(is(gemm_pick_tile(3000, 5000, 7168, 132, true), tall));
  for (auto [m, n, k] : {std::tuple{2048, 7168, 2048}, {3000, 5000, 7168}}) {
    EXPECT_EQ(gemm_pick_tile(m, n, k, 132, false).m, kTileM);
    EXPECT_FALSE(gemm_plain_only_tile(gemm_pick_tile(m, n, k, 132, false).m,
                                      gemm_pick_tile(m, n, k, 132, false).n));
  }
  EXPECT_FALSE(gemm_plain_only_tile(gemm_pick_tile(1000, 7168, 2048, 132, true).m,
                                    gemm_pick_tile(1000, 7168, 2048, 132, true).n));
  // the reference shapes keep their hooked picks
  for (auto [m, n, k] : {std::tuple{8192, 3584, 8192}, {16384, 1024, 8192}, {8192, 8192, 8192}}) {
    EXPECT_TRUE(is(gemm_pick_tile(m, n, k, 132, true), gemm_pick_tile(m, n, k, 132, false)))
        << m << "x" << n << "x" << k;
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (auto [m, n, k, want] : {std::tuple{2048, 7168, 2048, fit}, {3000, 5000, 1024, tall}}) {
    GemmArgs a = shape(m, n, k, DType::kBF16, DType::kBF16, 0);
    a.num_sms = std::min(132, sms);
    EXPECT_TRUE(is(gemm_pick_tile(m, n, k, 132, true), want));
    if (a.num_sms != 132) want = gemm_pick_tile(m, n, k, a.num_sms, true);
    EXPECT_EQ(gemm_work(a, true).tile_m, kTileM);  // not opted in
    EXPECT_FALSE(gemm_plain_only_tile(gemm_work(a, true).tile_m, gemm_work(a, true).tile_n));
    a.plain_tiles = true;
    const GemmWork w = gemm_work(a, true);
    EXPECT_TRUE(is({w.tile_m, w.tile_n}, want)) << m << "x" << n << "x" << k;
    EXPECT_EQ(gemm_tile_grid(a, true).tile_m, want.m);
    SplitWorkspace ws(a);
    run_and_check(a);
    a.start_m = 1;  // tile rows named: 128-row tiles
    EXPECT_EQ(gemm_work(a, true).tile_m, kTileM);
    run_and_check(a);
  }
}

// A ragged last tile row (M % 128 != 0) loads A in a box of its own rows (rounded up to 8), the
// stage's other rows left as an earlier stage wrote them (load_short_a), where the 128-row boxes
// would zero-fill more than an eighth of the rows: every remainder class (1, 7, 8, 9, 64, 65, 120,
// 121, 127 rows) with one tile row and several (both sides of that rule), each tile width, split
// last waves of 2 to 4 parts, several tiles a block (the TMA store), kReduceAdd and the other
// dtype pairs. Small K first, so the ring wraps with stale rows in every stage.
TEST(Sm90Gemm, RaggedLastTileRow) {
  for (int tile_n : {kTileN, kTileNNarrow, kTileNLean, kTileNSlim}) {
    SCOPED_TRACE(::testing::Message() << "tile_n " << tile_n);
    for (int64_t rows : {1, 7, 8, 9, 64, 65, 120, 121, 127}) {
      for (int64_t m : {rows, 128 + rows, 384 + rows})
        run_and_check(shape(m, 264, 1032, DType::kBF16, DType::kBF16, tile_n));
    }
    run_and_check(shape(200, 776, 72, DType::kBF16, DType::kBF16, tile_n), true);
    for (auto [in, out] : {std::pair{DType::kBF16, DType::kF32},
                           {DType::kF16, DType::kF16},
                           {DType::kF16, DType::kF32}}) {
      run_and_check(shape(1000, 776, 1032, in, out, tile_n));
    }
    struct Case {
      GemmArgs args;
      int sms;
    };
    for (Case c : {Case{shape(1000, 1032, 520, DType::kBF16, DType::kBF16, tile_n), 13},
                   Case{shape(300, 2056, 4096, DType::kBF16, DType::kBF16, tile_n), 40},
                   Case{shape(136, 776, 8192, DType::kBF16, DType::kBF16, tile_n), 32},
                   Case{shape(72, 264, 8192, DType::kF16, DType::kF32, tile_n), 8}}) {
      c.args.num_sms = c.sms;
      SCOPED_TRACE(::testing::Message() << c.args.m << "x" << c.args.n << "x" << c.args.k << " on "
                                        << c.sms << " blocks");
      SplitWorkspace ws(c.args);
      for (int rep = 0; rep < 2; ++rep) run_and_check(c.args);
    }
  }
}

// The engine's pick of the tile width (tile_n 0): a narrower tile where its waves are shorter by
// the rule's margin (the slim one never for a few rows); the pick's launch is correct, sized and
// split as the pick says; any other width is refused.
TEST(Sm90Gemm, PickTileN) {
  // 132 SMs: 96 tiles of 256 (one wave 73% full) against 129 of 192 (98%): narrow.
  EXPECT_EQ(gemm_pick_tile_n(384, 8192, 8192, 132), kTileNNarrow);
  EXPECT_EQ(gemm_pick_tile_n(896, 8192, 8192, 132), kTileNNarrow);   // 2 waves -> 2 + a split third
  EXPECT_EQ(gemm_pick_tile_n(1536, 6144, 8192, 132), kTileNNarrow);  // 2 + a split third -> 3
  // 64 tiles of 256 split in 2 parts, against 128 of 128 in one wave: slim.
  EXPECT_EQ(gemm_pick_tile_n(256, 8192, 8192, 132), kTileNSlim);
  EXPECT_EQ(gemm_pick_tile_n(1024, 2048, 8192, 132), kTileNSlim);  // 64 tiles -> 128
  EXPECT_EQ(gemm_pick_tile_n(128, 4096, 8192, 132), kTileNSlim);   // 16 tiles of 4 parts -> 32
  // 80 tiles of 256, 110 of 192, 132 + 28 split of 128, against 130 of 160 in one wave: lean.
  EXPECT_EQ(gemm_pick_tile_n(576, 4096, 8192, 132), kTileNLean);
  // Many rows: the narrow tile's margin is smaller above kManyRows rows. 8192x8192: 2048 tiles of
  // 256 (15 waves and 68, not split: 16 x 256 = 4096) against 2752 of 192 (20 and 112: 21 x 192 =
  // 4032), 4032 / 0.985 < 4096: narrow (/ 0.965: wide).
  EXPECT_EQ(gemm_pick_tile_n(8192, 8192, 8192, 132), kTileNNarrow);
  EXPECT_EQ(gemm_pick_tile_n(8192, 8192, 3584, 132), kTileNNarrow);
  // And the slim tile's above kManyRowsSlim rows. 4096x1792x4096 and 2304x3200x2560: 384 or 360
  // tiles of 160 (3 waves: 480) against 448 or 450 of 128 (3 and 52 or 54 in 2 parts: 3.6 x 128 =
  // 460.8): slim at 4096 rows (460.8 / 0.96 < 480 / 0.975), lean at 2304 (/ 0.91); lean at 2048
  // rows.
  EXPECT_EQ(gemm_pick_tile_n(4096, 1792, 4096, 132), kTileNSlim);
  EXPECT_EQ(gemm_pick_tile_n(2304, 3200, 2560, 132), kTileNLean);
  EXPECT_EQ(gemm_pick_tile_n(2048, 3584, 4096, 132), kTileNLean);
  for (auto [m, n, k] : {std::tuple{8192, 3584, 8192},
                         {8192, 1536, 4096},
                         {8192, 4096, 1536},
                         {4096, 3072, 8192},
                         {16384, 1024, 8192},
                         {2048, 28672, 8192},
                         {512, 8192, 8192},
                         {1024, 4096, 4096},
                         {4096, 4096, 4096},
                         {3072, 8192, 8192}}) {
    EXPECT_EQ(gemm_pick_tile_n(m, n, k, 132), kTileN) << m << "x" << n << "x" << k;
  }
  // A few rows (M <= 64) take the narrow tile only at a wider margin: at 0.75 (5 tiles -> 7, or
  // 16 -> 22, all in 4 parts), not at 0.93 (32 tiles in 4 parts -> 43 in 3).
  // Never the slim one.
  for (int64_t m : {1, 32, 64}) {
    EXPECT_EQ(gemm_pick_tile_n(m, 1280, 8192, 132), kTileNNarrow) << m;
    EXPECT_EQ(gemm_pick_tile_n(m, 4096, 8192, 132), kTileNNarrow) << m;
  }
  for (int64_t m : {1, 16, 64}) EXPECT_EQ(gemm_pick_tile_n(m, 8192, 8192, 132), kTileN) << m;
  for (int64_t m : {65, 128}) EXPECT_EQ(gemm_pick_tile_n(m, 8192, 8192, 132), kTileNSlim) << m;

  // A launch that leaves the pick to the engine: 3 x 43 = 129 tiles on 132 blocks.
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  GemmArgs a = shape(384, 8192, 1024);
  a.tile_n = 0;
  a.num_sms = 132 <= sms ? 132 : sms;
  const int expect = gemm_pick_tile_n(a.m, a.n, a.k, a.num_sms);
  EXPECT_EQ(gemm_work(a).tile_n, expect);
  EXPECT_EQ(gemm_tile_grid(a).tile_n, expect);
  {
    SplitWorkspace ws(a);
    run_and_check(a);
  }
  GemmArgs slim = shape(256, 4096, 2048);  // 32 tiles of 256 in 2 parts -> 64 of 128 in 2
  slim.tile_n = 0;
  slim.num_sms = a.num_sms;
  if (a.num_sms == 132) EXPECT_EQ(gemm_work(slim).tile_n, kTileNSlim);
  {
    SplitWorkspace ws(slim);
    run_and_check(slim);
  }
  GemmArgs lean = shape(576, 4096, 1024);  // 130 tiles of 160 in one wave
  lean.tile_n = 0;
  lean.num_sms = a.num_sms;
  if (a.num_sms == 132) EXPECT_EQ(gemm_work(lean).tile_n, kTileNLean);
  {
    SplitWorkspace ws(lean);
    run_and_check(lean);
  }
  for (int bad : {64, 96, 224}) {
    a.tile_n = bad;
    EXPECT_THROW(gemm_work(a), Error) << bad;
  }
}

// ---- hooks -------------------------------------------------------------------------------------

// Records, per tile: the notify ticket (order of notification) and the SM that notified it.
struct RecordingHooks {
  static constexpr bool kWaits = true;
  static constexpr bool kNotifies = true;
  SignalHooks<Scope::kGpu> signals;
  int* tickets = nullptr;  // [tiles]; global counter at tickets[tiles]
  int* smids = nullptr;    // [tiles]
  int tiles = 0;
  __device__ void before_tile_loads(const TileWork& w) { signals.before_tile_loads(w); }
  __device__ void after_tile_stored(const TileWork& w) {
    const TileCoord t = w.tile;
    const int id = t.m * signals.tiles_n + t.n;
    tickets[id] = atomicAdd(&tickets[tiles], 1);
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    smids[id] = static_cast<int>(smid);
    signals.after_tile_stored(w);
  }
};

// Writes A (rows of tile row tm) from src, then releases the signals of every tile of that row,
// tile row by tile row in reverse order, after an initial delay: the GEMM must wait for each.
__global__ void delayed_producer(const __nv_bfloat16* src, __nv_bfloat16* a, int64_t m, int64_t k, uint64_t* signals,
                                 int tiles_m, int tiles_n, uint64_t epoch) {
  for (int i = 0; i < 200; ++i) __nanosleep(1000);  // ~200 us: the GEMM is up and spinning by then
  for (int tm = tiles_m - 1; tm >= 0; --tm) {
    const int64_t r0 = int64_t(tm) * kTileM, r1 = std::min<int64_t>(m, r0 + kTileM);
    for (int64_t i = r0 * k + threadIdx.x; i < r1 * k; i += blockDim.x) a[i] = src[i];
    __syncthreads();
    if (threadIdx.x < tiles_n) {
      ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_device> sig(signals[tm * tiles_n + threadIdx.x]);
      sig.store(epoch, ::cuda::memory_order_release);  // cumulative over the block's writes (barrier above)
    }
  }
}

struct HookRun {
  std::vector<int> tickets, smids;
  std::vector<uint64_t> notified;
};

HookRun run_with_hooks(GemmArgs args, bool delayed, uint64_t epoch) {
  const TileGrid g = gemm_tile_grid(args);
  const int tiles = g.num_tiles();
  Buffers buf;
  void* a_src = nullptr;
  uint64_t *wait_sig = nullptr, *notify_sig = nullptr;
  int *tickets = nullptr, *smids = nullptr;
  CK(cudaMalloc(&buf.a, args.m * args.k * 2));
  CK(cudaMalloc(&a_src, args.m * args.k * 2));
  CK(cudaMalloc(&buf.b, args.n * args.k * 2));
  CK(cudaMalloc(&buf.c, args.m * args.n * 2));
  CK(cudaMalloc(&buf.ref, args.m * args.n * 4));
  CK(cudaMalloc(&wait_sig, tiles * 8));
  CK(cudaMalloc(&notify_sig, tiles * 8));
  CK(cudaMalloc(&tickets, (tiles + 1) * 4));
  CK(cudaMalloc(&smids, tiles * 4));
  ref::fill_uniform(a_src, DType::kBF16, args.m * args.k, fresh_seed(), 1.0f);
  ref::fill_uniform(buf.b, DType::kBF16, args.n * args.k, fresh_seed(), 1.0f);
  CK(cudaMemset(buf.c, 0xff, args.m * args.n * 2));
  CK(cudaMemset(notify_sig, 0, tiles * 8));
  CK(cudaMemset(tickets, 0, (tiles + 1) * 4));
  ref::reference_gemm(a_src, buf.b, DType::kBF16, args.m, args.n, args.k, args.k, args.k, nullptr, DType::kBF16, 0,
                      buf.ref);
  if (delayed) {
    CK(cudaMemset(buf.a, 0xff, args.m * args.k * 2));   // NaN until the producer writes it
    CK(cudaMemset(wait_sig, 0, tiles * 8));             // epoch - 1 < epoch: not ready
  } else {
    CK(cudaMemcpy(buf.a, a_src, args.m * args.k * 2, cudaMemcpyDeviceToDevice));
    std::vector<uint64_t> set(tiles, epoch);
    CK(cudaMemcpy(wait_sig, set.data(), tiles * 8, cudaMemcpyHostToDevice));
  }
  CK(cudaDeviceSynchronize());
  cudaFuncAttributes attr;
  CK(cudaFuncGetAttributes(&attr, delayed_producer));  // loaded before anything spins

  RecordingHooks hooks;
  hooks.signals.wait_signals = wait_sig, hooks.signals.notify_signals = notify_sig;
  hooks.signals.tiles_n = g.tiles_n(), hooks.signals.epoch = epoch;
  hooks.tickets = tickets, hooks.smids = smids, hooks.tiles = tiles;
  args.a = buf.a, args.b = buf.b, args.c = buf.c;
  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  launch_gemm<cutlass::bfloat16_t, __nv_bfloat16>(args, hooks, s1);
  if (delayed) {
    delayed_producer<<<1, 256, 0, s2>>>(static_cast<const __nv_bfloat16*>(a_src), static_cast<__nv_bfloat16*>(buf.a),
                                        args.m, args.k, wait_sig, g.tiles_m(), g.tiles_n(), epoch);
    CK(cudaGetLastError());
  }
  CK(cudaDeviceSynchronize());
  const ref::Comparison cmp = ref::compare(buf.c, DType::kBF16, args.n, buf.ref, args.m, args.n);
  EXPECT_EQ(cmp.non_finite, 0);
  EXPECT_LE(cmp.rel_err, ref::tolerance(DType::kBF16));
  HookRun out;
  out.tickets.resize(tiles), out.smids.resize(tiles), out.notified.resize(tiles);
  CK(cudaMemcpy(out.tickets.data(), tickets, tiles * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(out.smids.data(), smids, tiles * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(out.notified.data(), notify_sig, tiles * 8, cudaMemcpyDeviceToHost));
  for (uint64_t v : out.notified) EXPECT_EQ(v, epoch);
  CK(cudaStreamDestroy(s1));
  CK(cudaStreamDestroy(s2));
  for (void* p : {(void*)a_src, (void*)wait_sig, (void*)notify_sig, (void*)tickets, (void*)smids}) CK(cudaFree(p));
  return out;
}

TEST(Sm90GemmHooks, SignalsSetEveryTileNotifiedOnce) {
  GemmArgs a = shape(1000, 1032, 520);
  HookRun r = run_with_hooks(a, false, 7);
  std::set<int> t(r.tickets.begin(), r.tickets.end());
  EXPECT_EQ(t.size(), r.tickets.size());  // each tile notified exactly once (distinct tickets)
  // Split last waves: only the part that stores a tile notifies it.
  for (auto [m, n, k, sms, parts] : {std::tuple{1000, 1032, 520, 13, 2}, {300, 768, 8192, 4, 4}}) {
    GemmArgs s = shape(m, n, k);
    s.num_sms = sms;
    SplitWorkspace ws(s);
    ASSERT_EQ(gemm_work(s).split.tiles, 1);
    ASSERT_EQ(gemm_work(s).split.parts, parts);
    r = run_with_hooks(s, false, 8);
    t = std::set<int>(r.tickets.begin(), r.tickets.end());
    EXPECT_EQ(t.size(), r.tickets.size());
    EXPECT_EQ(*t.rbegin(), static_cast<int>(r.tickets.size()) - 1);  // one notify a tile, no more
  }
}

TEST(Sm90GemmHooks, OneBlockFollowsTileOrder) {
  GemmArgs a = shape(1000, 1032, 136);
  a.num_sms = 1, a.start_m = 3, a.group_m = 2;
  HookRun r = run_with_hooks(a, false, 1);
  const TileOrder order = gemm_tile_order(a, 1);
  const TileGrid g = gemm_tile_grid(a.m, a.n);
  for (int i = 0; i < order.count(); ++i) EXPECT_EQ(r.tickets[g.linear(order.at(i))], i) << "visit " << i;
}

// An observer on another stream acquires each tile's notify signal and then reads the tile from C:
// every element must be written by then (C starts poisoned). The store warp's TMA path must
// complete the tile's writes before the hook's release.
__global__ void observe_notified_tiles(const __nv_bfloat16* c, int64_t m, int64_t n, int tile_n,
                                       uint64_t* notify, int tiles_m, int tiles_n, uint64_t epoch,
                                       int* unwritten, int* timed_out) {
  __shared__ int ready;
  for (int t = 0; t < tiles_m * tiles_n; ++t) {
    if (threadIdx.x == 0) {
      ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_device> sig(notify[t]);
      long long polls = 0;
      while (sig.load(::cuda::memory_order_acquire) < epoch && ++polls < (1ll << 24)) __nanosleep(64);
      ready = polls < (1ll << 24);
      if (!ready) atomicAdd(timed_out, 1);
    }
    __syncthreads();  // orders the acquire before every thread's reads
    if (ready) {
      const int64_t r0 = int64_t(t / tiles_n) * kTileM, c0 = int64_t(t % tiles_n) * tile_n;
      const int64_t rows = std::min<int64_t>(kTileM, m - r0),
                    cols = std::min<int64_t>(tile_n, n - c0);
      int bad = 0;
      for (int64_t i = threadIdx.x; i < rows * cols; i += blockDim.x) {
        const float v = __bfloat162float(c[(r0 + i / cols) * n + c0 + i % cols]);
        bad += !isfinite(v);
      }
      if (bad) atomicAdd(unwritten, bad);
    }
    __syncthreads();
  }
}

TEST(Sm90GemmHooks, NotifiedTileIsVisible) {
  // 40 tiles on 2 blocks: the TMA-store configuration; on 24 (one or two tiles a block): register
  // stores. With a workspace, on 13 (TMA) and 32 (register) blocks the last wave is split: only
  // the half that stores a tile notifies it. The same with 192-wide tiles (48 of them; split on
  // 20) and 160-wide ones (56; the TMA store's tail box on 2, split on 24).
  for (auto [sms, split, tile_n] : {std::tuple{2, false, kTileN},
                                    {24, false, kTileN},
                                    {13, true, kTileN},
                                    {32, true, kTileN},
                                    {2, false, kTileNNarrow},
                                    {20, true, kTileNNarrow},
                                    {2, false, kTileNLean},
                                    {24, true, kTileNLean}}) {
    GemmArgs a = shape(1000, 1032, 1024, DType::kBF16, DType::kBF16, tile_n);
    a.num_sms = sms;
    std::optional<SplitWorkspace> ws;
    if (split) {
      ws.emplace(a);
      ASSERT_GT(gemm_work(a).split.tiles, 0);
    }
    const TileGrid g = gemm_tile_grid(a);
    ASSERT_EQ(g.tile_n, tile_n);
    const int tiles = static_cast<int>(g.num_tiles());
    Buffers buf;
    uint64_t *wait_sig = nullptr, *notify_sig = nullptr;
    int* counts = nullptr;
    CK(cudaMalloc(&buf.a, a.m * a.k * 2));
    CK(cudaMalloc(&buf.b, a.n * a.k * 2));
    CK(cudaMalloc(&buf.c, a.m * a.n * 2));
    CK(cudaMalloc(&wait_sig, tiles * 8));
    CK(cudaMalloc(&notify_sig, tiles * 8));
    CK(cudaMalloc(&counts, 2 * sizeof(int)));
    ref::fill_uniform(buf.a, DType::kBF16, a.m * a.k, fresh_seed(), 1.0f);
    ref::fill_uniform(buf.b, DType::kBF16, a.n * a.k, fresh_seed(), 1.0f);
    CK(cudaMemset(buf.c, 0xff, a.m * a.n * 2));  // NaN until written
    CK(cudaMemset(notify_sig, 0, tiles * 8));
    CK(cudaMemset(counts, 0, 2 * sizeof(int)));
    std::vector<uint64_t> set(tiles, 1);
    CK(cudaMemcpy(wait_sig, set.data(), tiles * 8, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    SignalHooks<Scope::kGpu> hooks;
    hooks.wait_signals = wait_sig, hooks.notify_signals = notify_sig, hooks.tiles_n = g.tiles_n(),
    hooks.epoch = 1;
    a.a = buf.a, a.b = buf.b, a.c = buf.c;
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    observe_notified_tiles<<<1, 256, 0, s2>>>(static_cast<const __nv_bfloat16*>(buf.c), a.m, a.n,
                                              g.tile_n, notify_sig, g.tiles_m(), g.tiles_n(), 1,
                                              counts, counts + 1);
    CK(cudaGetLastError());
    launch_gemm<cutlass::bfloat16_t, __nv_bfloat16>(a, hooks, s1);
    CK(cudaDeviceSynchronize());
    int host[2] = {0, 0};
    CK(cudaMemcpy(host, counts, sizeof(host), cudaMemcpyDeviceToHost));
    EXPECT_EQ(host[1], 0) << "tiles never notified (" << sms << " blocks)";
    EXPECT_EQ(host[0], 0) << "elements unwritten when their tile was notified (" << sms
                          << " blocks)";
    CK(cudaStreamDestroy(s1));
    CK(cudaStreamDestroy(s2));
    for (void* p : {(void*)wait_sig, (void*)notify_sig, (void*)counts}) CK(cudaFree(p));
  }
}

TEST(Sm90GemmHooks, NumSmsBoundsTheGrid) {
  GemmArgs a = shape(2048, 4096, 256);
  a.num_sms = 16;
  HookRun r = run_with_hooks(a, false, 1);
  std::set<int> sms(r.smids.begin(), r.smids.end());
  EXPECT_LE(sms.size(), 16u);
}

TEST(Sm90GemmHooks, WaitHoldsLoadsUntilProducerReleases) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  GemmArgs a = shape(1000, 1032, 1024);
  a.num_sms = sms - 8;  // leave room for the producer kernel
  run_with_hooks(a, true, 3);
  SplitWorkspace ws(a);  // 40 tiles on under half the SMs: every tile split, every part waits
  ASSERT_EQ(gemm_work(a).split.tiles, 40);
  run_with_hooks(a, true, 5);
}

// Several tiles per block: every later tile waits in the load warp too.
TEST(Sm90GemmHooks, WaitHoldsEveryTileOfABlock) {
  GemmArgs a = shape(1000, 1032, 1024);
  a.num_sms = 3;
  run_with_hooks(a, true, 4);
}

// 192- and 160-wide tiles: the hooks see that grid (48 or 56 tiles), one tile a block and several.
TEST(Sm90GemmHooks, WaitHoldsNarrowerTiles) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint64_t epoch = 6;
  for (auto [tile_n, tiles] : {std::pair{kTileNNarrow, 48}, {kTileNLean, 56}}) {
    SCOPED_TRACE(::testing::Message() << "tile_n " << tile_n);
    GemmArgs a = shape(1000, 1032, 1024, DType::kBF16, DType::kBF16, tile_n);
    ASSERT_EQ(gemm_tile_grid(a).num_tiles(), tiles);
    a.num_sms = sms - 8;
    run_with_hooks(a, true, epoch++);
    a.num_sms = 3;
    run_with_hooks(a, true, epoch++);
  }
}

// ---- argument checks: throw before launching -----------------------------------------------------

TEST(Sm90GemmArgs, BadInputThrows) {
  void* p = nullptr;
  CK(cudaMalloc(&p, 1 << 20));
  auto ok = [&] {
    GemmArgs a = shape(64, 64, 64);
    a.a = a.b = a.c = p;
    return a;
  };
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  GemmArgs a;
  a = ok(), a.n = 12;
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  a = ok(), a.k = 20;
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  a = ok(), a.a = nullptr;
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  a = ok(), a.c = nullptr;
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  a = ok(), a.in_type = DType::kF32;
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  a = ok(), a.out_type = DType::kF16;  // bf16 -> fp16 is not instantiated
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  a = ok(), a.num_sms = -1;
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  a = ok(), a.num_sms = sms + 1;
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  a = ok(), a.start_m = 5;
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  a = ok(), a.lda = 60;
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  a = ok(), a.b = static_cast<char*>(p) + 2;  // not 16-byte aligned
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  a = ok(), a.m = 300, a.n = 776, a.k = 1024, a.num_sms = 8;  // splits 4 of 12 tiles
  a.workspace = p, a.workspace_bytes = gemm_workspace_bytes(a) - 16;
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  try {
    gemm(a, 0);
  } catch (const tilelink::Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace is too small"), std::string::npos) << e.what();
  }
  a.workspace = static_cast<char*>(p) + 8;  // not 16-byte aligned (and big enough)
  a.workspace_bytes = gemm_workspace_bytes(a);
  EXPECT_THROW(gemm(a, 0), tilelink::Error);
  try {
    a = ok(), a.n = 12;
    gemm(a, 0);
  } catch (const tilelink::Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 8"), std::string::npos) << e.what();
  }
  a = ok();
  EXPECT_NO_THROW(gemm(a, 0));
  CK(cudaDeviceSynchronize());
  CK(cudaFree(p));
}

}  // namespace

// ---- a second A source (GemmArgs::a_alt): a band of A's rows read from another buffer ---------------

namespace {

// Plain engine with the a_alt instantiation (a type of this file: its own kernel).
struct AltNoHooks : NoHooks {};

// A [m, k] whose rows [row0, row0 + rows) are NaN in `a` and live in a separate buffer: the result
// must equal the reference on the real A, so every band row must come from a_alt.
void run_alt_band(int64_t m, int64_t n, int64_t k, int64_t row0, int64_t rows, int64_t lda_alt = 0,
                  bool split = false) {
  SCOPED_TRACE(::testing::Message()
               << m << "x" << n << "x" << k << " band [" << row0 << ", " << row0 + rows
               << ") lda_alt " << lda_alt << (split ? ", split" : ""));
  const int64_t la = lda_alt ? lda_alt : k;
  Buffers buf;
  void* alt = nullptr;
  CK(cudaMalloc(&buf.a, m * k * 2));
  CK(cudaMalloc(&buf.b, n * k * 2));
  CK(cudaMalloc(&buf.c, m * n * 2));
  CK(cudaMalloc(&buf.ref, m * n * sizeof(float)));
  CK(cudaMalloc(&alt, rows * la * 2));
  ref::fill_uniform(buf.a, DType::kBF16, m * k, fresh_seed(), 1.0f);
  ref::fill_uniform(buf.b, DType::kBF16, n * k, fresh_seed(), 1.0f);
  ref::reference_gemm(buf.a, buf.b, DType::kBF16, m, n, k, k, k, nullptr, DType::kBF16, n, buf.ref);
  CK(cudaMemset(alt, 0xff, rows * la * 2));
  CK(cudaMemcpy2D(alt, la * 2, static_cast<char*>(buf.a) + row0 * k * 2, k * 2, k * 2, rows, cudaMemcpyDeviceToDevice));
  CK(cudaMemset(static_cast<char*>(buf.a) + row0 * k * 2, 0xff, rows * k * 2));  // NaN where the band is
  CK(cudaMemset(buf.c, 0xff, m * n * 2));
  GemmArgs args = shape(m, n, k);
  args.a = buf.a, args.b = buf.b, args.c = buf.c;
  args.a_alt = alt, args.a_alt_row0 = row0, args.a_alt_rows = rows, args.lda_alt = lda_alt;
  GemmWorkspace ws;
  if (split) {
    ws.attach(args, 0);
    EXPECT_GT(gemm_work(args).split.tiles, 0);
  }
  launch_gemm<cutlass::bfloat16_t, __nv_bfloat16, AltNoHooks, true>(args, AltNoHooks{}, 0);
  CK(cudaDeviceSynchronize());
  const ref::Comparison cmp = ref::compare(buf.c, DType::kBF16, n, buf.ref, m, n);
  EXPECT_EQ(cmp.non_finite, 0);
  EXPECT_LE(cmp.rel_err, ref::tolerance(DType::kBF16));
  cudaFree(alt);
}

}  // namespace

TEST(Sm90GemmAltA, BandRowsComeFromTheSecondSource) {
  run_alt_band(1024, 512, 256, 256, 512);           // a band in the middle
  run_alt_band(1000, 768, 512, 384, 616);           // ending at a ragged M
  run_alt_band(128, 256, 64, 0, 128);               // the whole of A
  run_alt_band(2048, 1024, 512, 1024, 1024, 520);   // strided band
  run_alt_band(1000, 768, 512, 384, 616, 0, true);  // 24 tiles, every one split in two parts
}

TEST(Sm90GemmAltA, BadBandThrows) {
  void* p = nullptr;
  CK(cudaMalloc(&p, 1 << 20));
  GemmArgs a = shape(512, 64, 64);
  a.a = a.b = a.c = p;
  a.a_alt = p, a.a_alt_row0 = 128, a.a_alt_rows = 256;
  EXPECT_THROW(gemm(a, 0), tilelink::Error);  // the plain dispatch does not read a_alt
  EXPECT_THROW((launch_gemm<cutlass::bfloat16_t, __nv_bfloat16, NoHooks, false>(a, NoHooks{}, 0)), tilelink::Error);
  auto bad = [&](int64_t row0, int64_t rows, int64_t lda_alt, const void* alt) {
    GemmArgs b = a;
    b.a_alt_row0 = row0, b.a_alt_rows = rows, b.lda_alt = lda_alt, b.a_alt = alt;
    EXPECT_THROW((launch_gemm<cutlass::bfloat16_t, __nv_bfloat16, AltNoHooks, true>(b, AltNoHooks{}, 0)),
                 tilelink::Error)
        << row0 << " " << rows << " " << lda_alt;
  };
  bad(100, 256, 0, p);                              // does not start on a tile row
  bad(128, 200, 0, p);                              // ends inside a tile row, not at M
  bad(384, 256, 0, p);                              // past M
  bad(128, 0, 0, p);                                // empty
  bad(128, 256, 60, p);                             // lda_alt < K
  bad(128, 256, 0, static_cast<char*>(p) + 2);      // not 16-byte aligned
  CK(cudaDeviceSynchronize());
  cudaFree(p);
}
