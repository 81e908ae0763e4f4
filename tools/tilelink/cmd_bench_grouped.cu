// tilelink bench grouped_gemm: the sm90 engine's grouped mode (compute/sm90/grouped_gemm.hpp) on
// the MoE layers of six models, against cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx, one
// problem per non-empty expert), a loop of one cublasGemmEx per non-empty expert, and one dense
// cublasGemmEx of the same FLOPs (rows x N x K against expert 0's weights: the bound a grouped GEMM
// would reach if the grouping cost nothing).
//
// Shapes, as bench/torch_grouped_mm.py (its rows join this table's on model, tokens, routing and
// layer): rank 0 of a tensor-parallel world of W holds F / W of each expert's FFN; M tokens routed
// top-k to E experts (moe_draw_routing, seeded from --seed and the case) give rows = M * topk
// grouped rows, by expert (moe_route's order). Two grouped GEMMs a layer:
//   layer 0: rows x (2 F / W) x H   (gathered X times W1 = [gate; up], [E, 2 F / W, H])
//   layer 1: rows x H x (F / W)     (the activations times W2, [E, H, F / W])
// Inputs uniform in [-1, 1); fp32 accumulation; the output in the input type.
//
// Timing: CUDA events around each launch, L2 flushed (a 2x-L2 memset) before every launch; every
// rep runs each variant once in a fresh random order (as bench gemm: a launch runs slightly faster
// right after one of the same kernel), median of --reps after --warmup. The engine's time is the
// grouped_gemm launch alone: the groups' first tile rows are filled once beforehand, as the routing
// kernel fills them in a MoE layer. Its A is stacked by expert (no gather in the load path), as
// cuBLAS's. Ratios are throughputs: engine / cuBLAS grouped and engine / dense (> 1: the engine is
// faster).
//
// Check (unless --no-verify): the engine's output and cuBLAS grouped's against the per-expert
// loop's, as max |x - loop| / max |loop| within two ulps of the output type; the engine's C has
// max_rows = rows + 128 rows, poisoned (0xFF: NaN) before the first launch, and the spare rows
// must still be poisoned after every timed launch; the table of first tile rows that
// grouped_gemm_first_tile_rows_async writes must equal the host's fill_first_tiles. A failure
// prints a "# FAIL" line, "FAIL" in the check column, and the command exits 1.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "bench_moe_models.hpp"
#include "cli.hpp"
#include "tilelink/compute/sm90/grouped_gemm.hpp"
#include "tilelink/compute/sm90/impl/gemm_reference.cuh"
#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace tilelink::cli {
namespace {

namespace sm90 = ::tilelink::compute::sm90;
namespace ref = ::tilelink::compute::sm90::reference;

#define CK(call) TL_SM90_CUDA_CHECK(call)

// max |out - want| and max |want| over `count` elements (as the bits of non-negative floats, which
// order as unsigned integers), and the number of non-finite outputs.
struct MaxDiff {
  unsigned diff_bits, want_bits;
  unsigned long long non_finite;
};
__global__ void max_diff_kernel(const void* out, const void* want, DType t, int64_t count,
                                MaxDiff* result) {
  float diff = 0, mag = 0;
  unsigned long long bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float o = ref::load_f(out, t, i), w = ref::load_f(want, t, i);
    if (!isfinite(o)) {
      ++bad;
    } else {
      diff = fmaxf(diff, fabsf(o - w));
    }
    mag = fmaxf(mag, fabsf(w));
  }
  for (int off = 16; off > 0; off /= 2) {
    diff = fmaxf(diff, __shfl_down_sync(0xffffffffu, diff, off));
    mag = fmaxf(mag, __shfl_down_sync(0xffffffffu, mag, off));
    bad += __shfl_down_sync(0xffffffffu, bad, off);
  }
  if (threadIdx.x % 32 == 0) {
    atomicMax(&result->diff_bits, __float_as_uint(diff));
    atomicMax(&result->want_bits, __float_as_uint(mag));
    if (bad) atomicAdd(&result->non_finite, bad);
  }
}

struct Check {
  double rel_err = 0;      // max |out - want| / max |want|
  int64_t non_finite = 0;  // outputs left poisoned (NaN) or overflowed
};
// Compares out with want (both packed, `count` elements of type t). Synchronizes the stream.
Check max_rel_diff(const void* out, const void* want, DType t, int64_t count, MaxDiff* scratch,
                   cudaStream_t stream) {
  CK(cudaMemsetAsync(scratch, 0, sizeof(MaxDiff), stream));
  if (count > 0) {
    max_diff_kernel<<<1024, 256, 0, stream>>>(out, want, t, count, scratch);
    CK(cudaGetLastError());
  }
  MaxDiff h{};
  CK(cudaMemcpyAsync(&h, scratch, sizeof(h), cudaMemcpyDeviceToHost, stream));
  CK(cudaStreamSynchronize(stream));
  float diff = 0, mag = 0;
  std::memcpy(&diff, &h.diff_bits, 4);
  std::memcpy(&mag, &h.want_bits, 4);
  return Check{mag > 0 ? diff / mag : diff, static_cast<int64_t>(h.non_finite)};
}

// Two ulps of the output type at the output's largest magnitude: both sides round an fp32 sum once
// (bf16 keeps 8 significant bits, fp16 11).
double tolerance(DType out) { return out == DType::kBF16 ? 0x1p-6 : 0x1p-9; }

// One row of the table.
struct Row {
  double ms[4] = {};  // engine, cuBLAS grouped, per-expert loop, dense
  double err_eng = -1, err_grp = -1;
  bool ok = true;
};

int bench_grouped_gemm(Args& args) {
  const std::vector<std::string> model_names = split_list(args.get("--models", ""));
  const std::vector<int64_t> tokens_list = args.get_int_list("--tokens", {2048, 8192});
  const std::vector<std::string> routing_names =
      split_list(args.get("--routing", "uniform,skewed"));
  const int64_t world = args.get_int_in("--world", 8, 1, 1024);
  const int reps = static_cast<int>(args.get_int_in("--reps", 20, 1, 100000));
  const int warmup = static_cast<int>(args.get_int_in("--warmup", 3, 0, 100000));
  const uint64_t seed = static_cast<uint64_t>(args.get_int("--seed", 1));
  DType dtype = DType::kBF16;
  TL_REQUIRE(parse_dtype(args.get("--dtype", "bf16"), &dtype) && dtype != DType::kF32,
             "bench grouped_gemm: --dtype must be bf16 or fp16");
  const int tile_n = static_cast<int>(args.get_int_in("--tile-n", 0, 0, sm90::kTileN));
  const int num_sms = static_cast<int>(args.get_int_in("--num-sms", 0, 0, 1 << 20));
  const bool verify = !args.flag("--no-verify");
  const bool csv = args.flag("--csv");
  const std::string counts_out = args.get("--counts-out", "");
  args.finish();

  // ---- the cases, checked before the device is touched ----
  const std::vector<MoeModel> models = select_moe_models(model_names, "bench grouped_gemm");
  TL_REQUIRE(!tokens_list.empty(), "bench grouped_gemm: --tokens is empty");
  for (int64_t t : tokens_list)
    TL_REQUIRE(t >= 1 && t <= (int64_t{1} << 20),
               "bench grouped_gemm: --tokens must be in [1, 2^20], got " << t);
  std::vector<MoeRoutingPattern> patterns;
  for (const std::string& name : routing_names) patterns.push_back(moe_routing_pattern(name));
  TL_REQUIRE(!patterns.empty(), "bench grouped_gemm: --routing is empty");
  TL_REQUIRE(tile_n == 0 || tile_n == sm90::kTileN || tile_n == sm90::kTileNSlim,
             "bench grouped_gemm: --tile-n must be 0, " << sm90::kTileN << " or "
                                                        << sm90::kTileNSlim << ", got " << tile_n);
  for (const MoeModel& m : models) {
    TL_REQUIRE(m.ffn % world == 0 && (m.ffn / world) % 8 == 0,
               "bench grouped_gemm: " << m.name << "'s FFN " << m.ffn << " over --world " << world
                                      << " is not a multiple of 8 a rank");
  }

  // ---- the device ----
  const BenchGpu gpu = require_sm90_gpu("bench grouped_gemm");
  const int l2 = gpu.l2, sms = gpu.sms;
  const cudaDeviceProp& prop = gpu.prop;
  TL_REQUIRE(num_sms <= sms,
             "bench grouped_gemm: --num-sms " << num_sms << " > the device's " << sms << " SMs");
  const std::string dname(dtype_name(dtype));
  std::printf(
      "# device: %s, %d SMs, L2 %d MB; world %lld (F / W a rank); %s -> %s; engine tile %dx%s, "
      "num_sms %d; reps %d, warmup %d, seed %llu; L2 flushed before every launch\n",
      prop.name, sms, l2 >> 20, (long long)world, dname.c_str(), dname.c_str(), sm90::kTileM,
      tile_n ? std::to_string(tile_n).c_str() : "(256|128: grouped_gemm_pick_tile_n)",
      num_sms ? num_sms : sms, reps, warmup, (unsigned long long)seed);

  BenchStream bench(static_cast<size_t>(l2));
  cudaStream_t stream = bench.stream;
  cublasHandle_t handle = bench.handle;
  void* flush = bench.flush;
  const size_t flush_bytes = bench.flush_bytes;
  cudaEvent_t* ev = bench.ev;
  MaxDiff* diff_scratch = nullptr;
  CK(cudaMalloc(&diff_scratch, sizeof(MaxDiff)));

  if (csv) {
    std::printf(
        "model,tokens,routing,layer,rows,n,k,empty,max_group,tile_n,engine_ms,engine_tflops,"
        "grouped_ms,grouped_tflops,loop_ms,loop_tflops,dense_ms,dense_tflops,eng_over_grouped,"
        "eng_over_dense,err_engine,err_grouped,check\n");
  } else {
    std::printf(
        "%-13s %6s %-8s %5s %6s %5s %5s %5s %6s %4s | %8s %6s | %8s %6s | %8s %6s | %8s %6s | "
        "%7s %7s | %8s %8s %5s\n",
        "model", "tokens", "routing", "layer", "rows", "N", "K", "empty", "maxg", "tile", "eng_ms",
        "eng_TF", "grp_ms", "grp_TF", "loop_ms", "loop_TF", "dense_ms", "dens_TF", "eng/grp",
        "eng/dns", "err_eng", "err_grp", "check");
  }

  // --counts-out: every case's group sizes, one line a case ("model tokens routing c0 c1 ..."), so
  // bench/torch_grouped_mm.py --counts times torch on the same groups.
  FILE* counts_file = nullptr;
  if (!counts_out.empty()) {
    counts_file = std::fopen(counts_out.c_str(), "w");
    TL_REQUIRE(counts_file != nullptr, "bench grouped_gemm: cannot write " << counts_out);
  }
  std::vector<double> over_grouped, over_dense;
  bool all_ok = true;
  for (size_t mi = 0; mi < models.size(); ++mi) {
    const MoeModel& model = models[mi];
    const int experts = model.experts, topk = model.topk;
    const int64_t f_r = model.ffn / world;
    for (int64_t tokens : tokens_list) {
      for (MoeRoutingPattern pattern : patterns) {
        // ---- the routing: drawn on the host, its offsets copied to the device ----
        std::seed_seq case_seed{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                                static_cast<uint32_t>(mi), static_cast<uint32_t>(tokens),
                                static_cast<uint32_t>(pattern)};
        std::mt19937_64 gen(case_seed);
        const std::vector<int32_t> ids = moe_draw_routing(gen, tokens, topk, experts, pattern);
        const MoeRouting route = moe_route(std::span<const int32_t>(ids), tokens, topk, experts);
        const int64_t rows = route.rows(), max_rows = rows + kSpareRows;
        if (counts_file != nullptr) {
          std::fprintf(counts_file, "%s %lld %s", model.name, (long long)tokens,
                       moe_routing_name(pattern));
          for (int e = 0; e < experts; ++e) std::fprintf(counts_file, " %lld", (long long)route.counts[e]);
          std::fprintf(counts_file, "\n");
        }
        int empty = 0;
        int64_t max_group = 0;
        for (int e = 0; e < experts; ++e) {
          empty += route.counts[e] == 0;
          max_group = std::max(max_group, route.counts[e]);
        }
        int64_t* offsets = nullptr;
        int* first_tile_rows = nullptr;
        CK(cudaMalloc(&offsets, (experts + 1) * sizeof(int64_t)));
        CK(cudaMalloc(&first_tile_rows, (experts + 1) * sizeof(int)));
        CK(cudaMemcpy(offsets, route.offsets.data(), (experts + 1) * sizeof(int64_t),
                      cudaMemcpyHostToDevice));

        for (int layer = 0; layer < 2; ++layer) {
          const int64_t n = layer == 0 ? 2 * f_r : model.hidden;
          const int64_t k = layer == 0 ? model.hidden : f_r;
          const int64_t es = dtype_size(dtype);
          void *a = nullptr, *b = nullptr, *c_eng = nullptr, *c_grp = nullptr, *c_loop = nullptr,
               *c_dense = nullptr;
          CK(cudaMalloc(&a, max_rows * k * es));
          CK(cudaMalloc(&b, experts * n * k * es));
          CK(cudaMalloc(&c_eng, max_rows * n * es));
          CK(cudaMalloc(&c_grp, rows * n * es));
          CK(cudaMalloc(&c_loop, rows * n * es));
          CK(cudaMalloc(&c_dense, rows * n * es));
          ref::fill_uniform(a, dtype, max_rows * k, seed ^ (0x9E37ull * (mi + 1) + 31 * n + k),
                            1.0f, stream);
          ref::fill_uniform(b, dtype, experts * n * k, ~seed ^ (0x7F4Bull * (mi + 1) + 13 * n + k),
                            1.0f, stream);
          CK(cudaMemsetAsync(c_eng, 0xff, max_rows * n * es, stream));  // NaN everywhere

          sm90::GroupedGemmArgs g;
          g.a = a, g.b = b, g.c = c_eng;
          g.max_rows = max_rows, g.n = n, g.k = k;
          g.groups = experts, g.offsets = offsets, g.first_tile_rows = first_tile_rows;
          g.in_type = dtype, g.out_type = dtype;
          g.tile_n = tile_n, g.num_sms = num_sms;
          sm90::grouped_gemm_check(g);
          const int launch_tile_n = sm90::grouped_gemm_tile_n(g);
          sm90::grouped_gemm_first_tile_rows_async(g, stream);  // as the routing kernel fills it

          // cuBLAS (column-major): C^T [n, rows_e] = B_e^T-view op T times A^T-view, as bench gemm.
          std::vector<int> non_empty;
          for (int e = 0; e < experts; ++e)
            if (route.counts[e] > 0) non_empty.push_back(e);
          const int problems = static_cast<int>(non_empty.size());
          std::vector<cublasOperation_t> op_a(problems, CUBLAS_OP_T), op_b(problems, CUBLAS_OP_N);
          std::vector<int> pm(problems, int(n)), pn(problems), pk(problems, int(k)),
              plda(problems, int(k)), pldb(problems, int(k)), pldc(problems, int(n)),
              group_size(problems, 1);
          std::vector<float> alphas(problems, 1.f), betas(problems, 0.f);
          std::vector<const void*> h_a(problems), h_b(problems);
          std::vector<void*> h_c(problems);
          for (int p = 0; p < problems; ++p) {
            const int e = non_empty[p];
            pn[p] = static_cast<int>(route.counts[e]);
            h_a[p] = static_cast<const char*>(b) + e * n * k * es;
            h_b[p] = static_cast<const char*>(a) + route.offsets[e] * k * es;
            h_c[p] = static_cast<char*>(c_grp) + route.offsets[e] * n * es;
          }
          void** d_ptrs = nullptr;  // A, B and C pointer arrays, device memory
          CK(cudaMalloc(&d_ptrs, std::max(1, 3 * problems) * sizeof(void*)));
          CK(cudaMemcpy(d_ptrs, h_a.data(), problems * sizeof(void*), cudaMemcpyHostToDevice));
          CK(cudaMemcpy(d_ptrs + problems, h_b.data(), problems * sizeof(void*),
                        cudaMemcpyHostToDevice));
          CK(cudaMemcpy(d_ptrs + 2 * problems, h_c.data(), problems * sizeof(void*),
                        cudaMemcpyHostToDevice));
          const cudaDataType_t ct = cuda_type(dtype);
          const float alpha = 1.f, beta = 0.f;

          auto run_engine = [&] { sm90::grouped_gemm(g, stream); };
          auto run_grouped = [&] {
            TL_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
                handle, op_a.data(), op_b.data(), pm.data(), pn.data(), pk.data(), alphas.data(),
                reinterpret_cast<const void* const*>(d_ptrs), ct, plda.data(),
                reinterpret_cast<const void* const*>(d_ptrs + problems), ct, pldb.data(),
                betas.data(), d_ptrs + 2 * problems, ct, pldc.data(), problems, group_size.data(),
                CUBLAS_COMPUTE_32F));
          };
          auto run_loop = [&] {
            for (int e : non_empty) {
              TL_CUBLAS_CHECK(cublasGemmEx(
                  handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(route.counts[e]), int(k), &alpha,
                  static_cast<const char*>(b) + e * n * k * es, ct, int(k),
                  static_cast<const char*>(a) + route.offsets[e] * k * es, ct, int(k), &beta,
                  static_cast<char*>(c_loop) + route.offsets[e] * n * es, ct, int(n),
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            }
          };
          auto run_dense = [&] {
            TL_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(rows),
                                         int(k), &alpha, b, ct, int(k), a, ct, int(k), &beta,
                                         c_dense, ct, int(n), CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT));
          };

          Row row;
          std::string why;  // the failures of this row
          // ---- verification: the first tile rows, then each output against the loop's ----
          if (verify) {
            std::vector<int> first_dev(experts + 1), first_host(experts + 1);
            CK(cudaMemcpyAsync(first_dev.data(), first_tile_rows, (experts + 1) * sizeof(int),
                               cudaMemcpyDeviceToHost, stream));
            CK(cudaStreamSynchronize(stream));
            const DynamicTileGrid rows_grid = sm90::grouped_gemm_row_grid(g);
            const DynamicTileGrid host_grid = DynamicTileGrid::make(
                DynamicRowPartition::make(experts, route.offsets.data()), rows_grid.extent_n,
                rows_grid.tile_m, rows_grid.tile_n, first_host.data());
            fill_first_tiles(host_grid, std::span<int>(first_host));
            if (first_dev != first_host) why += " first tile rows differ from the host's;";
            CK(cudaMemsetAsync(c_grp, 0xff, rows * n * es, stream));
            CK(cudaMemsetAsync(c_loop, 0xff, rows * n * es, stream));
            run_engine();
            run_grouped();
            run_loop();
            const Check ce = max_rel_diff(c_eng, c_loop, dtype, rows * n, diff_scratch, stream);
            const Check cg = max_rel_diff(c_grp, c_loop, dtype, rows * n, diff_scratch, stream);
            row.err_eng = ce.rel_err, row.err_grp = cg.rel_err;
            if (ce.non_finite != 0 || !(ce.rel_err <= tolerance(dtype))) {
              why += " engine: max rel. diff " + std::to_string(ce.rel_err) + ", " +
                     std::to_string(ce.non_finite) + " non-finite;";
            }
            if (cg.non_finite != 0 || !(cg.rel_err <= tolerance(dtype))) {
              why += " cuBLAS grouped: max rel. diff " + std::to_string(cg.rel_err) + ", " +
                     std::to_string(cg.non_finite) + " non-finite;";
            }
          }

          // ---- timing: every variant once a rep, shuffled order, L2 flushed before each ----
          enum { kEngine, kGrouped, kLoop, kDense, kVariants };
          auto run_variant = [&](int v) {
            switch (v) {
              case kEngine:
                run_engine();
                break;
              case kGrouped:
                run_grouped();
                break;
              case kLoop:
                run_loop();
                break;
              case kDense:
                run_dense();
                break;
            }
          };
          std::vector<std::vector<float>> t(kVariants);
          std::vector<int> order{kEngine, kGrouped, kLoop, kDense};
          std::mt19937 shuffle_rng(static_cast<uint32_t>(seed));
          for (int r = 0; r < warmup + reps; ++r) {
            std::shuffle(order.begin(), order.end(), shuffle_rng);
            for (int v : order) {
              CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, stream));
              CK(cudaEventRecord(ev[0], stream));
              run_variant(v);
              CK(cudaEventRecord(ev[1], stream));
              CK(cudaEventSynchronize(ev[1]));
              float ms = 0;
              CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
              if (r >= warmup) t[v].push_back(ms);
            }
          }
          for (int v = 0; v < kVariants; ++v) row.ms[v] = median(t[v]);

          // ---- the spare rows, after every launch: still poisoned ----
          if (verify) {
            std::vector<uint8_t> spare(kSpareRows * n * es);
            CK(cudaMemcpy(spare.data(), static_cast<char*>(c_eng) + rows * n * es, spare.size(),
                          cudaMemcpyDeviceToHost));
            const int64_t touched =
                std::count_if(spare.begin(), spare.end(), [](uint8_t x) { return x != 0xff; });
            if (touched != 0)
              why += " engine wrote " + std::to_string(touched) + " bytes of the spare rows;";
          }
          row.ok = why.empty();
          all_ok = all_ok && row.ok;
          if (!row.ok) {
            std::printf("# FAIL %s tokens %lld %s layer %d (%lldx%lldx%lld):%s\n", model.name,
                        (long long)tokens, moe_routing_name(pattern), layer, (long long)rows,
                        (long long)n, (long long)k, why.c_str());
          }

          const double flop = 2.0 * rows * n * k;
          auto tflops = [&](double ms) { return ms > 0 ? flop / (ms * 1e-3) / 1e12 : 0.0; };
          const double r_grp = row.ms[kGrouped] / row.ms[kEngine];
          const double r_dense = row.ms[kDense] / row.ms[kEngine];
          over_grouped.push_back(r_grp);
          over_dense.push_back(r_dense);
          auto err = [](double e) {  // "-": not checked (--no-verify)
            char buf[16] = "-";
            if (e >= 0) std::snprintf(buf, sizeof(buf), "%.2e", e);
            return std::string(buf);
          };
          const char* check = verify ? (row.ok ? "ok" : "FAIL") : "-";
          const char* row_format =
              csv ? "%s,%lld,%s,%d,%lld,%lld,%lld,%d,%lld,%d,%.4f,%.1f,%.4f,%.1f,%.4f,%.1f,%.4f,"
                    "%.1f,%.3f,%.3f,%s,%s,%s\n"
                  : "%-13s %6lld %-8s %5d %6lld %5lld %5lld %5d %6lld %4d | %8.4f %6.1f | %8.4f "
                    "%6.1f | %8.4f %6.1f | %8.4f %6.1f | %7.3f %7.3f | %8s %8s %5s\n";
          std::printf(row_format, model.name, (long long)tokens, moe_routing_name(pattern), layer,
                      (long long)rows, (long long)n, (long long)k, empty, (long long)max_group,
                      launch_tile_n, row.ms[kEngine], tflops(row.ms[kEngine]), row.ms[kGrouped],
                      tflops(row.ms[kGrouped]), row.ms[kLoop], tflops(row.ms[kLoop]),
                      row.ms[kDense], tflops(row.ms[kDense]), r_grp, r_dense,
                      err(row.err_eng).c_str(), err(row.err_grp).c_str(), check);
          std::fflush(stdout);
          CK(cudaFree(d_ptrs));
          CK(cudaFree(a));
          CK(cudaFree(b));
          CK(cudaFree(c_eng));
          CK(cudaFree(c_grp));
          CK(cudaFree(c_loop));
          CK(cudaFree(c_dense));
        }
        CK(cudaFree(offsets));
        CK(cudaFree(first_tile_rows));
      }
    }
  }

  auto med_min = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const double med =
        v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    return std::pair<double, double>{med, v.front()};
  };
  const auto [g_med, g_min] = med_min(over_grouped);
  const auto [d_med, d_min] = med_min(over_dense);
  std::printf(
      "# engine / cuBLAS grouped: median %.3f, min %.3f; engine / dense: median %.3f, min %.3f; "
      "over %zu shapes; verification %s\n",
      g_med, g_min, d_med, d_min, over_grouped.size(),
      verify ? (all_ok ? "PASSED" : "FAILED") : "skipped");
  CK(cudaFree(diff_scratch));
  if (counts_file != nullptr) std::fclose(counts_file);
  return all_ok ? 0 : 1;
}

}  // namespace

TILELINK_REGISTER_COMMAND(
    {"bench grouped_gemm",
     "[--models mixtral-8x7b,mixtral-8x22b,qwen1.5-moe,deepseek-moe,deepseek-v3,qwen3-30b-a3b] "
     "[--tokens 2048,8192] [--routing uniform,skewed] [--world W] [--reps R] [--warmup W] "
     "[--seed S] [--dtype bf16|fp16] [--tile-n 0|256|128] [--num-sms S] [--no-verify] [--csv] "
     "[--counts-out FILE]",
     "sm90 grouped GEMM on MoE layers vs cuBLAS grouped, a per-expert cuBLAS loop and a dense "
     "GEMM of the same FLOPs; checked against the loop",
     &bench_grouped_gemm,
     {"--no-verify", "--csv"}});

}  // namespace tilelink::cli
