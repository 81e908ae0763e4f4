// tilelink bench gemm: the sm90 GEMM engine against cuBLAS in the same run, plus the engine with
// wait/notify hooks on (every wait signal already set), each checked against a float32 reference.
// Timing: CUDA events around each launch, L2 flushed (a 2x-L2 memset) before every launch, the three
// variants interleaved rep by rep, median of --reps after --warmup.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"
#include "tilelink/compute/sm90/impl/gemm_reference.cuh"
#include "tilelink/compute/sm90/impl/signal_hooks.cuh"
#include "tilelink/core/error.hpp"

namespace tilelink::cli {
namespace {

namespace sm90 = ::tilelink::compute::sm90;
namespace ref = ::tilelink::compute::sm90::reference;

const char* kDefaultShapes =
    "8192x8192x8192,8192x3584x8192,8192x8192x3584,8192x1536x4096,8192x4096x1536,4096x3072x8192,"
    "16384x1024x8192,2048x28672x8192,512x8192x8192";

void check_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    ::tilelink::detail::throw_error(file, line, std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
  }
}
#define TL_CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)
#define CK(call) TL_SM90_CUDA_CHECK(call)

struct Shape3 {
  int64_t m, n, k;
};

std::vector<Shape3> parse_shapes(const std::string& s) {
  std::vector<Shape3> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    Shape3 sh{};
    char x1 = 0, x2 = 0;
    std::stringstream is(item);
    TL_REQUIRE((is >> sh.m >> x1 >> sh.n >> x2 >> sh.k) && x1 == 'x' && x2 == 'x',
               "bench gemm: bad shape '" << item << "', expected MxNxK");
    out.push_back(sh);
  }
  return out;
}

cudaDataType_t cuda_type(DType t) {
  return t == DType::kBF16 ? CUDA_R_16BF : t == DType::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

// The hooks-on variant is instantiated for bf16 -> bf16 (the fused ops' type); other types time the
// plain engine and cuBLAS only.
using BenchHooks = sm90::SignalHooks<cuda::thread_scope_device>;
void gemm_with_hooks(const sm90::GemmArgs& args, const BenchHooks& hooks, cudaStream_t s) {
  sm90::launch_gemm<cutlass::bfloat16_t, __nv_bfloat16>(args, hooks, s);
}

int bench_gemm(Args& args) {
  const auto shapes = parse_shapes(args.get("shapes", kDefaultShapes));
  DType in = DType::kBF16, out = DType::kBF16;
  TL_REQUIRE(parse_dtype(args.get("dtype", "bf16"), &in), "bench gemm: bad --dtype");
  TL_REQUIRE(parse_dtype(args.get("out-dtype", std::string(dtype_name(in))), &out), "bench gemm: bad --out-dtype");
  const int reps = static_cast<int>(args.get_int("reps", 50));
  const int warmup = static_cast<int>(args.get_int("warmup", 5));
  const int num_sms = static_cast<int>(args.get_int("num-sms", 0));
  const int group_m = static_cast<int>(args.get_int("group-m", 0));
  const bool verify = !args.flag("no-verify");
  const bool csv = args.flag("csv");
  const uint64_t seed = static_cast<uint64_t>(args.get_int("seed", 20261129));
  args.finish();
  TL_REQUIRE(reps >= 1 && warmup >= 0, "bench gemm: --reps must be >= 1 and --warmup >= 0");
  const bool hooks_on = in == DType::kBF16 && out == DType::kBF16;

  int dev = 0, l2 = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("# device: %s, %d SMs, L2 %d MB; engine tile %dx%dx%d, num_sms %d; %s -> %s; reps %d, warmup %d\n",
              prop.name, sms, l2 >> 20, sm90::kTileM, sm90::kTileN, sm90::kTileK, num_sms ? num_sms : sms,
              std::string(dtype_name(in)).c_str(), std::string(dtype_name(out)).c_str(), reps, warmup);

  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t handle;
  TL_CUBLAS_CHECK(cublasCreate(&handle));
  TL_CUBLAS_CHECK(cublasSetStream(handle, stream));
  const size_t ws_bytes = size_t(64) << 20;
  void* ws = nullptr;
  CK(cudaMalloc(&ws, ws_bytes));
  TL_CUBLAS_CHECK(cublasSetWorkspace(handle, ws, ws_bytes));
  const size_t flush_bytes = size_t(2) * l2;
  void* flush = nullptr;
  CK(cudaMalloc(&flush, flush_bytes));
  cudaEvent_t ev[2];
  CK(cudaEventCreate(&ev[0]));
  CK(cudaEventCreate(&ev[1]));

  if (csv) std::printf("m,n,k,engine_tflops,cublas_tflops,ratio,hooks_tflops,hooks_overhead_pct,err_engine,err_hooks,err_cublas\n");
  else
    std::printf("%6s %6s %6s | %9s %9s %6s | %9s %8s | %9s %9s %9s\n", "M", "N", "K", "engine", "cuBLAS", "ratio",
                "hooks", "hooks+%", "err_eng", "err_hooks", "err_cublas");

  std::vector<double> ratios, overheads;
  bool all_ok = true;
  for (const Shape3& sh : shapes) {
    const int64_t m = sh.m, n = sh.n, k = sh.k;
    void *a = nullptr, *b = nullptr, *c = nullptr, *c_blas = nullptr;
    float* refc = nullptr;
    uint64_t *wait_sig = nullptr, *notify_sig = nullptr;
    const TileGrid grid = sm90::gemm_tile_grid(m, n);
    CK(cudaMalloc(&a, m * k * dtype_size(in)));
    CK(cudaMalloc(&b, n * k * dtype_size(in)));
    CK(cudaMalloc(&c, m * n * dtype_size(out)));
    CK(cudaMalloc(&c_blas, m * n * dtype_size(out)));
    CK(cudaMalloc(&wait_sig, grid.num_tiles() * sizeof(uint64_t)));
    CK(cudaMalloc(&notify_sig, grid.num_tiles() * sizeof(uint64_t)));
    std::vector<uint64_t> ones(grid.num_tiles(), 1);
    CK(cudaMemcpy(wait_sig, ones.data(), ones.size() * sizeof(uint64_t), cudaMemcpyHostToDevice));
    CK(cudaMemset(notify_sig, 0, grid.num_tiles() * sizeof(uint64_t)));
    ref::fill_uniform(a, in, m * k, seed ^ (m * 31 + n * 7 + k), 1.0f, stream);
    ref::fill_uniform(b, in, n * k, ~seed ^ (m * 13 + n * 5 + k), 1.0f, stream);

    sm90::GemmArgs ga;
    ga.a = a, ga.b = b, ga.c = c, ga.m = m, ga.n = n, ga.k = k;
    ga.in_type = in, ga.out_type = out, ga.num_sms = num_sms, ga.group_m = group_m;
    BenchHooks hooks;
    hooks.wait_signals = wait_sig, hooks.notify_signals = notify_sig, hooks.tiles_n = grid.tiles_n(), hooks.epoch = 1;
    const float alpha = 1.f, beta = 0.f;
    auto run_engine = [&] { sm90::gemm(ga, stream); };
    auto run_hooks = [&] { gemm_with_hooks(ga, hooks, stream); };
    auto run_cublas = [&] {
      TL_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b, cuda_type(in),
                                   int(k), a, cuda_type(in), int(k), &beta, c_blas, cuda_type(out), int(n),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };

    // ---- verification: poisoned outputs, float32 reference ----
    double err_eng = -1, err_hooks = -1, err_blas = -1;
    if (verify) {
      CK(cudaMalloc(&refc, m * n * sizeof(float)));
      ref::reference_gemm(a, b, in, m, n, k, k, k, nullptr, out, 0, refc, stream);
      auto check = [&](auto&& run, void* dst, double* err) {
        CK(cudaMemsetAsync(dst, 0xff, m * n * dtype_size(out), stream));
        run();
        CK(cudaStreamSynchronize(stream));
        const ref::Comparison cmp = ref::compare(dst, out, n, refc, m, n);
        *err = cmp.rel_err;
        if (cmp.non_finite != 0 || !(cmp.rel_err <= ref::tolerance(out))) {
          all_ok = false;
          std::printf("# FAIL %lldx%lldx%lld: rel_err %.3g, non-finite %lld\n", (long long)m, (long long)n,
                      (long long)k, cmp.rel_err, (long long)cmp.non_finite);
        }
      };
      check(run_engine, c, &err_eng);
      if (hooks_on) {
        check(run_hooks, c, &err_hooks);
        std::vector<uint64_t> got(grid.num_tiles());
        CK(cudaMemcpy(got.data(), notify_sig, got.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        if (std::count(got.begin(), got.end(), uint64_t{1}) != int64_t(got.size())) {
          all_ok = false;
          std::printf("# FAIL %lldx%lldx%lld: not every tile notified\n", (long long)m, (long long)n, (long long)k);
        }
      }
      check(run_cublas, c_blas, &err_blas);
      CK(cudaFree(refc));
    }

    // ---- timing: interleaved, L2 flushed before each launch ----
    std::vector<float> t_eng, t_blas, t_hooks;
    for (int r = 0; r < warmup + reps; ++r) {
      for (int v = 0; v < 3; ++v) {
        if (v == 2 && !hooks_on) continue;
        CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, stream));
        CK(cudaEventRecord(ev[0], stream));
        if (v == 0) run_engine();
        else if (v == 1) run_cublas();
        else run_hooks();
        CK(cudaEventRecord(ev[1], stream));
        CK(cudaEventSynchronize(ev[1]));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        if (r >= warmup) (v == 0 ? t_eng : v == 1 ? t_blas : t_hooks).push_back(ms);
      }
    }
    const double flop = 2.0 * m * n * k;
    const double tf_eng = flop / (median(t_eng) * 1e-3) / 1e12;
    const double tf_blas = flop / (median(t_blas) * 1e-3) / 1e12;
    const double tf_hooks = hooks_on ? flop / (median(t_hooks) * 1e-3) / 1e12 : 0;
    const double ratio = tf_eng / tf_blas;
    const double overhead = hooks_on ? 100.0 * (median(t_hooks) / median(t_eng) - 1.0) : 0;
    ratios.push_back(ratio);
    if (hooks_on) overheads.push_back(overhead);
    if (csv)
      std::printf("%lld,%lld,%lld,%.1f,%.1f,%.3f,%.1f,%.2f,%.2e,%.2e,%.2e\n", (long long)m, (long long)n, (long long)k,
                  tf_eng, tf_blas, ratio, tf_hooks, overhead, err_eng, err_hooks, err_blas);
    else
      std::printf("%6lld %6lld %6lld | %9.1f %9.1f %6.3f | %9.1f %+7.2f%% | %9.2e %9.2e %9.2e\n", (long long)m,
                  (long long)n, (long long)k, tf_eng, tf_blas, ratio, tf_hooks, overhead, err_eng, err_hooks, err_blas);
    std::fflush(stdout);
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    CK(cudaFree(c_blas));
    CK(cudaFree(wait_sig));
    CK(cudaFree(notify_sig));
  }
  std::vector<double> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                       : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  std::printf("# ratio to cuBLAS: median %.3f, min %.3f", med, sorted.front());
  if (!overheads.empty()) {
    std::vector<double> o = overheads;
    std::sort(o.begin(), o.end());
    std::printf("; hooks overhead: median %+.2f%%, max %+.2f%%", o[o.size() / 2], o.back());
  }
  std::printf("; verification %s\n", verify ? (all_ok ? "PASSED" : "FAILED") : "skipped");
  CK(cudaFree(ws));
  CK(cudaFree(flush));
  CK(cudaEventDestroy(ev[0]));
  CK(cudaEventDestroy(ev[1]));
  TL_CUBLAS_CHECK(cublasDestroy(handle));
  CK(cudaStreamDestroy(stream));
  return all_ok ? 0 : 1;
}

}  // namespace

TILELINK_REGISTER_COMMAND({"bench gemm",
                           "[--shapes MxNxK,...] [--dtype bf16|fp16] [--out-dtype bf16|fp16|fp32] [--reps R] "
                           "[--warmup W] [--num-sms S] [--group-m G] [--seed S] [--no-verify] [--csv]",
                           "sm90 GEMM engine vs cuBLAS (TFLOP/s, ratio) and with wait/notify hooks on; verified "
                           "against a float32 reference",
                           &bench_gemm,
                           {"no-verify", "csv"}});

}  // namespace tilelink::cli
