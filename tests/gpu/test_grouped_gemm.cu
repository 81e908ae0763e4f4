// GPU tests of the sm90 engine's grouped mode (compute/sm90/grouped_gemm.hpp; run on an H100/H200):
// ragged groups (empty ones, a group of one row, a group of every row, 1 and 256 groups), both tile
// widths and the pick, N and K off the tile sizes, padded strides, fewer SMs, spare rows past the
// groups, A gathered by an index table, the reduce-add epilogue, a table of no rows, graph replays
// over new tables, the routing kernel's tables driving it, a walk in a shuffled tile-row order
// (tile_row_order), and argument checks that throw before anything is launched.
// Every output starts poisoned (0xFF: NaN) or holds known values; each element is compared with a
// float64 reference computed on the host from the same bf16/fp16 inputs, and every byte outside the
// groups' rows and N columns must be as it was. The groups' first tile rows, from
// grouped_gemm_first_tile_rows_async or the routing kernel, must equal the host's fill_first_tiles.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../support/gpu.hpp"
#include "../support/random.hpp"
#include "../support/refused.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/sm90/grouped_gemm.hpp"
#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/moe_route_cuda.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace {

using namespace tilelink;
using namespace tilelink::compute::sm90;
using Bytes = std::vector<std::byte>;

using test::DeviceBuffer;

std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> off{0};
  for (int64_t s : sizes) off.push_back(off.back() + s);
  return off;
}

// The grouped problem on the host: A [max_rows, lda], B [groups, n, ldb], row-major.
struct HostProblem {
  DType type = DType::kBF16;
  int64_t n = 0, k = 0, lda = 0, ldb = 0;
  Bytes a, b;
};

// acc[r, j] (float64, packed [offsets.back(), n]) = sum_k A[row(r), k] * B[g, j, k] for every row r
// of every group g; row(r) = r, or a_row_of[r] where given (A's rows picked by the caller).
std::vector<double> reference_f64(const HostProblem& p, const std::vector<int64_t>& offsets,
                                  const std::vector<int64_t>* a_row_of = nullptr) {
  const int groups = static_cast<int>(offsets.size()) - 1;
  const int64_t rows = offsets.back();
  std::vector<double> bd(static_cast<size_t>(groups * p.n * p.k)), arow(p.k);
  for (int64_t gj = 0; gj < groups * p.n; ++gj)
    for (int64_t kk = 0; kk < p.k; ++kk)
      bd[gj * p.k + kk] = load_as_float(p.b.data(), p.type, gj * p.ldb + kk);
  std::vector<double> acc(static_cast<size_t>(rows * p.n));
  for (int g = 0; g < groups; ++g) {
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) {
      const int64_t src = a_row_of ? (*a_row_of)[r] : r;
      for (int64_t kk = 0; kk < p.k; ++kk)
        arow[kk] = load_as_float(p.a.data(), p.type, src * p.lda + kk);
      for (int64_t j = 0; j < p.n; ++j) {
        const double* bj = &bd[(g * p.n + j) * p.k];
        double s = 0;
        for (int64_t kk = 0; kk < p.k; ++kk) s += arow[kk] * bj[kk];
        acc[r * p.n + j] = s;
      }
    }
  }
  return acc;
}

// Relative tolerance on |out - want| against the output's magnitude (max |want|): the output's
// rounding (bf16 keeps 8 significant bits, fp16 11) with a margin for the fp32 accumulation;
// twice that for kReduceAdd (the tile and the sum are both rounded).
double tolerance(DType t, bool reduce) {
  return (t == DType::kBF16 ? 1e-2 : 5e-3) * (reduce ? 2 : 1);
}

// Checks the output C [max_rows, ldc] (after) against `before` and the reference: every element of
// the groups' rows and N columns within the tolerance of want = c0 + acc (c0: before's value with
// kReduceAdd, else 0), every other byte unchanged.
void expect_output(const Bytes& after, const Bytes& before, DType t, int64_t n, int64_t ldc,
                   int64_t rows, const std::vector<double>& acc, bool reduce) {
  const int es = dtype_size(t);
  double scale = 1e-30;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const double c0 = reduce ? load_as_float(before.data(), t, r * ldc + j) : 0.0;
      scale = std::max({scale, std::abs(acc[r * n + j] + c0), std::abs(acc[r * n + j])});
    }
  const double tol = tolerance(t, reduce) * scale;
  int64_t bad = 0, non_finite = 0;
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      const double c0 = reduce ? load_as_float(before.data(), t, r * ldc + j) : 0.0;
      const double want = acc[r * n + j] + c0, got = load_as_float(after.data(), t, r * ldc + j);
      if (!std::isfinite(got)) {
        if (non_finite++ == 0) ADD_FAILURE() << "C[" << r << ", " << j << "] not written (NaN)";
        continue;
      }
      const double d = std::abs(got - want);
      worst = std::max(worst, d);
      if (d > tol && bad++ == 0) {
        ADD_FAILURE() << "C[" << r << ", " << j << "] = " << got << ", want " << want
                      << " (tolerance " << tol << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements off by more than the tolerance; worst " << worst / scale
                    << " of the magnitude " << scale;
  EXPECT_EQ(non_finite, 0);
  // Bytes outside [rows, n]: the padding columns of every row and the spare rows.
  const int64_t max_rows = static_cast<int64_t>(after.size()) / (ldc * es);
  int64_t touched = 0;
  for (int64_t r = 0; r < max_rows; ++r) {
    for (int64_t j = r < rows ? n : 0; j < ldc; ++j)
      for (int e = 0; e < es; ++e) {
        const size_t i = static_cast<size_t>((r * ldc + j) * es + e);
        touched += after[i] != before[i];
      }
  }
  EXPECT_EQ(touched, 0) << "bytes written outside the groups' rows and N columns";
}

// The device's table of the groups' first tile rows equals the host's fill_first_tiles over the
// launch's row grid (one column of kTileM-row tiles), and the tiles it gives fit
// grouped_gemm_max_tiles.
void expect_first_tile_rows(const GroupedGemmArgs& args, const std::vector<int64_t>& offsets) {
  const DynamicTileGrid grid = grouped_gemm_row_grid(args);
  EXPECT_EQ(grid.tile_m, kTileM);
  EXPECT_EQ(grid.tiles_n(), 1);
  const int tile_n = grouped_gemm_tile_n(args);
  EXPECT_EQ(tile_n, args.tile_n ? args.tile_n : grouped_gemm_pick_tile_n(args.n));
  std::vector<int> host(args.groups + 1), dev(args.groups + 1);
  const DynamicTileGrid host_grid =
      DynamicTileGrid::make(DynamicRowPartition::make(args.groups, offsets.data()), grid.extent_n,
                            grid.tile_m, grid.tile_n, host.data());
  const int tile_rows = fill_first_tiles(host_grid, std::span<int>(host));
  TL_CUDA_CHECK(cudaMemcpy(dev.data(), args.first_tile_rows, dev.size() * sizeof(int),
                           cudaMemcpyDeviceToHost));
  EXPECT_EQ(dev, host) << "first tile rows";
  const int64_t tiles_n = (args.n + tile_n - 1) / tile_n;
  EXPECT_LE(tile_rows * tiles_n, grouped_gemm_max_tiles(args));
}

struct Case {
  std::string what;
  DType type = DType::kBF16;
  int tile_n = kTileN;
  std::vector<int64_t> sizes;  // rows of each group
  int64_t n = 0, k = 0;
  int64_t spare = 0;                  // rows of A and C past the groups' last row
  int64_t lda = 0, ldb = 0, ldc = 0;  // 0: packed
  int num_sms = 0;
  bool reduce = false;
  // Gathered A: A's rows (0: A is [max_rows, k], not gathered) and the divisor; each grouped row
  // reads a random one of them.
  int64_t a_rows = 0;
  int a_div = 1;
  bool shuffled = false;  // the walk takes the tile rows in a random order (tile_row_order)
};

Case shape(std::string what, DType type, int tile_n, std::vector<int64_t> sizes, int64_t n,
           int64_t k, int64_t spare) {
  Case c;
  c.what = std::move(what), c.type = type, c.tile_n = tile_n, c.sizes = std::move(sizes);
  c.n = n, c.k = k, c.spare = spare;
  return c;
}

// Runs one case on fresh random inputs and checks it (see expect_output and
// expect_first_tile_rows).
void run_case(const Case& c, test::Rng& rng) {
  SCOPED_TRACE(::testing::Message()
               << c.what << ": " << c.sizes.size() << " groups, N " << c.n << ", K " << c.k << ", "
               << dtype_name(c.type) << ", tile_n " << c.tile_n << (c.reduce ? ", reduce-add" : "")
               << (c.a_rows ? ", gathered A" : "") << (c.shuffled ? ", shuffled tile rows" : ""));
  const int groups = static_cast<int>(c.sizes.size());
  const std::vector<int64_t> offsets = offsets_of(c.sizes);
  const int64_t rows = offsets.back(), max_rows = rows + c.spare;
  HostProblem p;
  p.type = c.type, p.n = c.n, p.k = c.k;
  p.lda = c.lda ? c.lda : c.k, p.ldb = c.ldb ? c.ldb : c.k;
  const int64_t ldc = c.ldc ? c.ldc : c.n;
  const int es = dtype_size(c.type);
  const bool gathered = c.a_rows > 0;
  p.a = rng.tensor(c.type, (gathered ? c.a_rows : max_rows) * p.lda);
  // NaN in A's row padding (columns K .. lda): a load that reads past K shows in C
  for (int64_t r = 0; r < (gathered ? c.a_rows : max_rows); ++r)
    std::memset(p.a.data() + (r * p.lda + c.k) * dtype_size(c.type), 0xff,
                (p.lda - c.k) * dtype_size(c.type));
  // Gathered A: index[r] for the grouped rows; the rest are never read (left out of range).
  std::vector<int64_t> index(gathered ? max_rows : 0, int64_t{1} << 40), a_row_of(index.size());
  for (int64_t r = 0; gathered && r < rows; ++r) {
    index[r] = rng.uniform(0, c.a_rows * c.a_div - 1);
    a_row_of[r] = index[r] / c.a_div;
  }
  p.b = rng.tensor(c.type, groups * c.n * p.ldb);
  Bytes before;
  if (c.reduce) {
    before = rng.tensor(c.type, max_rows * ldc);
  } else {
    before.resize(static_cast<size_t>(max_rows * ldc * es));
    test::poison(before);
  }

  DeviceBuffer a(p.a.size()), b(p.b.size()), out(before.size()),
      off(offsets.size() * sizeof(int64_t)), first((groups + 1) * sizeof(int)),
      a_index(index.size() * sizeof(int64_t));
  // a random order of the tile rows (core/grouped_walk.hpp): the output must not depend on it
  std::vector<int> order;
  for (int64_t size : c.sizes) order.resize(order.size() + (size + kTileM - 1) / kTileM);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng.gen());
  DeviceBuffer order_buf(std::max<size_t>(order.size(), 1) * sizeof(int));
  order_buf.put(order);
  a.put(p.a);
  b.put(p.b);
  out.put(before);
  off.put(offsets);
  a_index.put(index);
  TL_CUDA_CHECK(cudaMemset(first.p, 0x7b, first.bytes));  // poison

  GroupedGemmArgs args;
  args.a = a.p, args.b = b.p, args.c = out.p;
  args.max_rows = max_rows, args.n = c.n, args.k = c.k;
  args.lda = c.lda, args.ldb = c.ldb, args.ldc = c.ldc;
  args.groups = groups, args.offsets = off.as<int64_t>(), args.first_tile_rows = first.as<int>();
  args.in_type = c.type, args.out_type = c.type;
  args.epilogue = c.reduce ? EpilogueMode::kReduceAdd : EpilogueMode::kStore;
  args.tile_n = c.tile_n, args.num_sms = c.num_sms;
  if (gathered) {
    args.a_row_index = a_index.as<int64_t>(), args.a_rows = c.a_rows, args.a_row_div = c.a_div;
  }
  if (c.shuffled) args.tile_row_order = order_buf.as<int>();
  grouped_gemm_first_tile_rows_async(args, nullptr);
  grouped_gemm(args, nullptr);
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  expect_first_tile_rows(args, offsets);
  const std::vector<double> acc = reference_f64(p, offsets, gathered ? &a_row_of : nullptr);
  expect_output(out.get<std::byte>(before.size()), before, c.type, c.n, ldc, rows, acc, c.reduce);
}

TEST(Sm90GroupedGemm, MatchesFloat64) {
  TL_SEEDED_RNG(rng);
  std::vector<Case> cases;
  cases.push_back(shape("ragged, empty groups, a group of one row", DType::kBF16, kTileN,
                        {0, 300, 1, 0, 129, 512, 0, 77}, 776, 520, 200));
  cases.push_back(shape("uneven groups, slim tiles", DType::kF16, kTileNSlim,
                        rng.uneven_counts(1900, 16), 264, 200, 64));
  cases.back().sizes[3] = 1;  // a group of one row wherever the cuts fell
  cases.push_back(shape("one group", DType::kBF16, 0, {777}, 520, 1000, 35));
  cases.push_back(
      shape("256 groups", DType::kBF16, 0, rng.uneven_counts(4000, 256), 136, 264, 128));
  cases.push_back(shape("every row in one group of eight (bands of tile rows)", DType::kBF16,
                        kTileNSlim, {0, 0, 0, 0, 1500, 0, 0, 0}, 1032, 72, 3));
  cases.push_back(shape("max_rows far past the groups' rows", DType::kF16, kTileN,
                        {200, 0, 150, 250}, 512, 256, 400));
  cases.push_back(
      shape("padded strides", DType::kBF16, 0, rng.uneven_counts(700, 6), 392, 328, 50));
  cases.back().lda = 328 + 24, cases.back().ldb = 328 + 8, cases.back().ldc = 392 + 40;
  cases.push_back(
      shape("three SMs", DType::kBF16, kTileN, rng.uneven_counts(2000, 32), 520, 136, 17));
  cases.back().num_sms = 3;
  cases.push_back(shape("N = K = 8", DType::kF16, 0, {130, 0, 5, 256}, 8, 8, 10));
  cases.push_back(shape("gathered A, padded lda", DType::kBF16, kTileN, rng.uneven_counts(1200, 24),
                        520, 200, 30));
  cases.back().lda = 232, cases.back().a_rows = 500, cases.back().a_div = 3;
  cases.push_back(shape("gathered A, fewer rows than the groups", DType::kF16, kTileNSlim,
                        {1, 0, 1100, 37}, 264, 136, 0));
  cases.back().a_rows = 64;
  cases.push_back(shape("a shuffled tile-row order, empty groups, bands across groups", DType::kBF16, kTileN,
                        {0, 300, 1, 0, 129, 512, 0, 77, 1400}, 776, 520, 20));
  cases.back().shuffled = true;
  cases.push_back(shape("a shuffled tile-row order, gathered A, three SMs", DType::kF16, kTileNSlim,
                        rng.uneven_counts(2500, 40), 264, 136, 0));
  cases.back().shuffled = true, cases.back().a_rows = 700, cases.back().a_div = 2, cases.back().num_sms = 3;
  for (const Case& c : cases) run_case(c, rng);
}

TEST(Sm90GroupedGemm, ReduceAdd) {
  TL_SEEDED_RNG(rng);
  Case c =
      shape("reduce-add", DType::kBF16, kTileN, {0, 300, 1, 0, 129, 512, 0, 77}, 776, 520, 100);
  c.reduce = true;
  run_case(c, rng);
  c.type = DType::kF16, c.tile_n = kTileNSlim, c.sizes = rng.uneven_counts(900, 12);
  c.n = 264, c.k = 136, c.ldc = 264 + 8;
  run_case(c, rng);
}

// Every group empty: nothing is written and nothing fails, with a grid of blocks that find no tile
// (max_rows > 0) and with no rows at all (max_rows = 0).
TEST(Sm90GroupedGemm, NoRowsAtAll) {
  for (int64_t max_rows : {300, 0}) {
    for (int tile_n : {kTileN, kTileNSlim, 0}) {
      SCOPED_TRACE(::testing::Message() << "max_rows " << max_rows << ", tile_n " << tile_n);
      const int groups = 64;
      const int64_t n = 264, k = 72;
      const std::vector<int64_t> offsets(groups + 1, 0);
      DeviceBuffer a(std::max<int64_t>(max_rows, 1) * k * 2), b(groups * n * k * 2),
          out(std::max<int64_t>(max_rows, 1) * n * 2), off(offsets.size() * sizeof(int64_t)),
          first((groups + 1) * sizeof(int));
      Bytes before(out.bytes);
      test::poison(before);
      out.put(before);
      off.put(offsets);
      TL_CUDA_CHECK(cudaMemset(a.p, 0, a.bytes));
      TL_CUDA_CHECK(cudaMemset(b.p, 0, b.bytes));
      GroupedGemmArgs args;
      args.a = a.p, args.b = b.p, args.c = out.p;
      args.max_rows = max_rows, args.n = n, args.k = k;
      args.groups = groups, args.offsets = off.as<int64_t>(),
      args.first_tile_rows = first.as<int>();
      args.tile_n = tile_n;
      grouped_gemm_first_tile_rows_async(args, nullptr);
      grouped_gemm(args, nullptr);
      TL_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<int> f = first.get<int>(groups + 1);
      EXPECT_EQ(f, std::vector<int>(groups + 1, 0));
      EXPECT_EQ(out.get<std::byte>(before.size()), before);
    }
  }
}

// The first-tile fill and the grouped GEMM captured once in a CUDA graph; before each replay new
// offsets are copied into the same device table, and each replay's output matches its table.
TEST(Sm90GroupedGemm, GraphReplaysFollowNewTables) {
  TL_SEEDED_RNG(rng);
  const int groups = 16;
  const int64_t n = 520, k = 264, max_rows = 2048;
  HostProblem p;
  p.type = DType::kBF16, p.n = n, p.k = k, p.lda = k, p.ldb = k;
  p.a = rng.tensor(p.type, max_rows * k);
  p.b = rng.tensor(p.type, groups * n * k);
  DeviceBuffer a(p.a.size()), b(p.b.size()), out(max_rows * n * 2),
      off((groups + 1) * sizeof(int64_t)), first((groups + 1) * sizeof(int));
  a.put(p.a);
  b.put(p.b);
  off.put(std::vector<int64_t>(groups + 1, 0));
  GroupedGemmArgs args;
  args.a = a.p, args.b = b.p, args.c = out.p;
  args.max_rows = max_rows, args.n = n, args.k = k;
  args.groups = groups, args.offsets = off.as<int64_t>(), args.first_tile_rows = first.as<int>();

  cudaStream_t s;
  TL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TL_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  grouped_gemm_first_tile_rows_async(args, s);
  grouped_gemm(args, s);
  TL_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  TL_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<std::vector<int64_t>> tables = {
      rng.uneven_counts(1800, groups), std::vector<int64_t>(groups, 0),
      rng.uneven_counts(max_rows, groups), std::vector<int64_t>(groups, 0),
      rng.uneven_counts(333, groups)};
  tables[1][0] = max_rows;    // every row in the first group
  tables[3][groups - 1] = 1;  // one row in the last group
  Bytes before(out.bytes);
  test::poison(before);
  for (size_t replay = 0; replay < tables.size(); ++replay) {
    SCOPED_TRACE(::testing::Message() << "replay " << replay);
    const std::vector<int64_t> offsets = offsets_of(tables[replay]);
    off.put(offsets);
    out.put(before);
    TL_CUDA_CHECK(cudaMemset(first.p, 0x7b, first.bytes));
    TL_CUDA_CHECK(cudaDeviceSynchronize());
    TL_CUDA_CHECK(cudaGraphLaunch(exec, s));
    TL_CUDA_CHECK(cudaStreamSynchronize(s));
    expect_first_tile_rows(args, offsets);
    expect_output(out.get<std::byte>(before.size()), before, p.type, n, n, offsets.back(),
                  reference_f64(p, offsets), false);
  }
  TL_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TL_CUDA_CHECK(cudaGraphDestroy(graph));
  TL_CUDA_CHECK(cudaStreamDestroy(s));
}

// A[row] = X[the token of pair_of_row[row]]: layer 0's gather of the MoE layer, 16-bit elements.
__global__ void gather_rows(const uint16_t* x, const int64_t* pair_of_row, int topk, int64_t rows,
                            int64_t k, uint16_t* a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * k;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / k, col = i % k;
    a[i] = x[(pair_of_row[row] / topk) * k + col];
  }
}

// The routing kernel writes the offsets and the groups' first tile rows (MoeRouteTables::grid =
// grouped_gemm_row_grid(args)) from device topk ids, and the grouped GEMM over those tables
// matches the float64 reference of the host's routing, with X's rows gathered by pair_of_row twice:
// by a gather kernel into a stacked A, and in the engine's load path (a_row_index = pair_of_row,
// a_row_div = topk).
TEST(Sm90GroupedGemm, DrivenByTheRoutingKernel) {
  TL_SEEDED_RNG(rng);
  const int64_t tokens = 1500, n = 264, k = 264;
  const int topk = 4, experts = 32;
  const int64_t pairs = tokens * topk, max_rows = pairs + 64;
  for (MoeRoutingPattern how : {MoeRoutingPattern::kSkewed, MoeRoutingPattern::kEmptyExperts}) {
    SCOPED_TRACE(moe_routing_name(how));
    const std::vector<int32_t> ids = moe_draw_routing(rng.gen(), tokens, topk, experts, how);
    const MoeRouting route = moe_route(std::span<const int32_t>(ids), tokens, topk, experts);
    HostProblem x;  // X [tokens, k] and the experts' weights
    x.type = DType::kBF16, x.n = n, x.k = k, x.lda = k, x.ldb = k;
    x.a = rng.tensor(x.type, tokens * k);
    x.b = rng.tensor(x.type, experts * n * k);

    // pair_of_row has max_rows entries: the gathered load's index table (rows past the pairs are
    // never read).
    DeviceBuffer d_ids(ids.size() * sizeof(int32_t)), counts(experts * sizeof(int64_t)),
        offsets((experts + 1) * sizeof(int64_t)), pair_of_row(max_rows * sizeof(int64_t)),
        row_of_pair(pairs * sizeof(int64_t)), status(sizeof(int64_t)),
        first((experts + 1) * sizeof(int)),
        scratch(tilelink::cuda::moe_route_scratch_bytes(tokens, topk, experts));
    DeviceBuffer d_x(x.a.size()), b(x.b.size()), a(max_rows * k * 2), out(max_rows * n * 2);
    d_ids.put(ids);
    d_x.put(x.a);
    b.put(x.b);
    TL_CUDA_CHECK(cudaMemset(a.p, 0, a.bytes));
    Bytes before(out.bytes);
    test::poison(before);

    GroupedGemmArgs args;
    args.a = a.p, args.b = b.p, args.c = out.p;
    args.max_rows = max_rows, args.n = n, args.k = k;
    args.groups = experts, args.offsets = offsets.as<int64_t>();
    args.first_tile_rows = first.as<int>();
    tilelink::cuda::MoeRouteTables t;
    t.counts = counts.as<int64_t>(), t.offsets = offsets.as<int64_t>();
    t.pair_of_row = pair_of_row.as<int64_t>(), t.row_of_pair = row_of_pair.as<int64_t>();
    t.status = status.as<int64_t>(), t.scratch = scratch.p;
    t.grid = grouped_gemm_row_grid(args);
    t.first_tiles = first.as<int>();
    tilelink::cuda::moe_route_async(d_ids.as<int32_t>(), tokens, topk, experts, t, nullptr);
    TL_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(status.get<int64_t>(1)[0], 0);
    EXPECT_EQ(offsets.get<int64_t>(experts + 1), route.offsets);
    expect_first_tile_rows(args, route.offsets);
    std::vector<int64_t> token_of_row(pairs);
    for (int64_t r = 0; r < pairs; ++r) token_of_row[r] = route.token_of_row(r);
    const std::vector<double> acc = reference_f64(x, route.offsets, &token_of_row);

    // A stacked by a gather kernel.
    out.put(before);
    gather_rows<<<256, 256>>>(d_x.as<uint16_t>(), pair_of_row.as<int64_t>(), topk, pairs, k,
                              a.as<uint16_t>());
    TL_CUDA_CHECK(cudaGetLastError());
    grouped_gemm(args, nullptr);
    TL_CUDA_CHECK(cudaDeviceSynchronize());
    {
      SCOPED_TRACE("gather kernel");
      expect_output(out.get<std::byte>(before.size()), before, x.type, n, n, pairs, acc, false);
    }

    // X's rows gathered in the load path.
    out.put(before);
    GroupedGemmArgs gathered = args;
    gathered.a = d_x.p, gathered.a_rows = tokens;
    gathered.a_row_index = pair_of_row.as<int64_t>(), gathered.a_row_div = topk;
    grouped_gemm(gathered, nullptr);
    TL_CUDA_CHECK(cudaDeviceSynchronize());
    {
      SCOPED_TRACE("gathered in the load path");
      expect_output(out.get<std::byte>(before.size()), before, x.type, n, n, pairs, acc, false);
    }
  }
}

// Each bad argument throws tilelink::Error from the check and from the launch, before anything
// runs (the poisoned output stays as it was).
TEST(Sm90GroupedGemm, RefusesBadArguments) {
  const int groups = 4;
  const int64_t n = 264, k = 72, max_rows = 256;
  DeviceBuffer a(max_rows * k * 2), b(groups * n * k * 2), out(max_rows * n * 2),
      off((groups + 1) * sizeof(int64_t)), first((groups + 1) * sizeof(int));
  off.put(offsets_of({64, 0, 100, 92}));
  Bytes before(out.bytes);
  test::poison(before);
  out.put(before);
  GroupedGemmArgs good;
  good.a = a.p, good.b = b.p, good.c = out.p;
  good.max_rows = max_rows, good.n = n, good.k = k;
  good.groups = groups, good.offsets = off.as<int64_t>(), good.first_tile_rows = first.as<int>();
  EXPECT_NO_THROW(grouped_gemm_check(good));
  int sms = 0;
  TL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  struct Bad {
    const char* what;
    GroupedGemmArgs args;
  };
  std::vector<Bad> bad;
  auto with = [&](const char* what, auto&& edit) {
    GroupedGemmArgs g = good;
    edit(g);
    bad.push_back({what, g});
  };
  with("null a", [](GroupedGemmArgs& g) { g.a = nullptr; });
  with("null b", [](GroupedGemmArgs& g) { g.b = nullptr; });
  with("null c", [](GroupedGemmArgs& g) { g.c = nullptr; });
  with("null offsets", [](GroupedGemmArgs& g) { g.offsets = nullptr; });
  with("null first_tile_rows", [](GroupedGemmArgs& g) { g.first_tile_rows = nullptr; });
  with("no groups", [](GroupedGemmArgs& g) { g.groups = 0; });
  with("too many groups", [](GroupedGemmArgs& g) { g.groups = kGroupedMaxGroups + 1; });
  with("N not a multiple of 8", [](GroupedGemmArgs& g) { g.n = 260; });
  with("K not a multiple of 8", [](GroupedGemmArgs& g) { g.k = 100; });
  with("fp16 in, bf16 out", [](GroupedGemmArgs& g) { g.in_type = DType::kF16; });
  with("a 192-wide tile", [](GroupedGemmArgs& g) { g.tile_n = kTileNNarrow; });
  with("more SMs than the device", [&](GroupedGemmArgs& g) { g.num_sms = sms + 1; });
  with("ldc < N", [&](GroupedGemmArgs& g) { g.ldc = n - 8; });
  with("gathered A without rows", [&](GroupedGemmArgs& g) { g.a_row_index = off.as<int64_t>(); });
  with("gathered A with divisor 0", [&](GroupedGemmArgs& g) {
    g.a_row_index = off.as<int64_t>(), g.a_rows = max_rows, g.a_row_div = 0;
  });
  for (const Bad& x : bad) {
    SCOPED_TRACE(x.what);
    EXPECT_THROW(grouped_gemm_check(x.args), Error);
    EXPECT_THROW(grouped_gemm(x.args, nullptr), Error);
  }
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out.get<std::byte>(before.size()), before);
}

}  // namespace
