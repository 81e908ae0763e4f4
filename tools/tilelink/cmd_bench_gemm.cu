// tilelink bench gemm: the sm90 GEMM engine against cuBLAS in the same run, plus the engine with
// wait/notify hooks on (every wait signal already set), each checked against a float32 reference.
// Timing: CUDA events around each launch, L2 flushed (a 2x-L2 memset) before every launch; every
// rep runs each variant once, in a fresh random order (NOTE: a launch runs ~0.5% faster right after
// a launch of the same kernel, and a fixed order gave one variant that bonus every time), median of
// --reps after --warmup.
// Hooks overhead: paired per rep, hooks time over the mean of the rep's two plain-engine launches
// (E and E'), median over reps. A/A: E' over E the same way: the noise floor of that comparison,
// with half its interquartile spread. The summary line also gives the hooks' overhead as time (the
// paired median difference, us a launch: it is a fixed cost, so its share grows as launches get
// short). Columns that split the hooks' cost (bf16 -> bf16):
//   hooks+%   SignalHooks: acquire of a per-tile signal already set, release store of a per-tile
//             notify signal
//   wait+%    waits only (no notify stores; the engine's consumer -> notify-warp handoff remains)
//   notif+%   notifies only (no waits)
//   ag+%      waits only, compiled without the notify side (no handoff, no notify warp),
//             system scope: the hooks as AG+GEMM's engine instance has them
//   rs+%      notifies only, compiled without the wait side, system scope: as GEMM+RS's instance
// --hot-signals: after every flush, before every variant, a small kernel writes the wait signals
// again, as a communication program leaves them just before the GEMM (without it the flush evicts
// them with everything else and the first wait reads DRAM).
// --warm-code: every timed launch right after an untimed launch of the same variant (the L2 flush
// between them). NOTE: a launch that follows a launch of the same kernel code runs ~0.5 us faster
// (measured on the H200, bench/notes/gemm.md, code warmth), and in the shuffled order the hooks
// kernel's code runs in 3 of 8 launches (hooks, wait, notify), the plain engine's in 2, the ag- and
// rs-type kernels' in 1 each (so those two start ~0.5 us behind the plain engine): --warm-code
// gives every variant the same warm code, the default gives every variant the same shuffled
// neighbours.
// --sustained-ms T: afterwards, per shape, each variant launched back to back for ~T ms (no flush:
// L2 warm, as in a training loop), 7 rounds in a rotating order after an untimed one, paired per
// round like the table, with the engine's A/A: the rate under the board's power cap (the H200
// holds a GEMM at 700 W by lowering the SM clock: bench/notes/fused_ops_cuda.md, power),
// where energy per FLOP decides, not latency.
// --host-us: afterwards, per shape, the host time of one call (engine: sm90::gemm, argument checks
// and descriptors included; cuBLAS: cublasGemmEx), 200 calls enqueued back to back without a sync
// after 20 untimed ones, median of 5 such batches: what an eager (not graph-captured) caller pays
// on the CPU for each GEMM.
// --tile-n N, --tile-m R: every launch (engine and hooks) with R x N tiles (GemmArgs::tile_n,
// tile_m); 0, the default: the engine's pick (gemm_pick_tile), listed after the table where it is
// not 128x256. --plain-tiles: the engine's pick may take the plain engine's own tiles
// (GemmArgs::plain_tiles). The plain engine's own tiles (176 wide, or 256x160) run no hooks: where the engine
// column takes one, the hooks columns are measured against a plain launch of the hooked widths'
// pick (the hooks' own tile), timed in the same reps; where one is named, they are "-".
// --tuned: the engine column runs through a GemmTuner (gemm_tuner.hpp): each shape's candidate
// tiles timed once before its table row, the fastest run from then on.
// --kernel auto|tile|decode: the engine column's kernel (GemmArgs::kernel). auto, the default,
// runs the decode kernel where gemm_takes_decode says so (gemm_decode_shape, M <= 128; with
// --tile-n 0 and --num-sms 0); those shapes are listed after the table, and their hooks columns
// are "-" (hooks run in the tile engine only: `--kernel tile` measures them there).
// TILELINK_CLI_TRACE=1 prints each batch's wall-clock span on stderr (to match clock samples).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_stream.hpp"
#include "cli.hpp"
#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/compute/sm90/gemm_tuner.hpp"
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

// The median of an already sorted, non-empty sample.
template <class T>
double sorted_median(const std::vector<T>& q) {
  return q.size() % 2 ? q[q.size() / 2] : 0.5 * (q[q.size() / 2 - 1] + q[q.size() / 2]);
}
double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : sorted_median(v);
}

// The hooks-on variants are instantiated for bf16 -> bf16 (the fused ops' type); other types time the
// plain engine and cuBLAS only.
using BenchHooks = sm90::SignalHooks<Scope::kGpu>;
using AgTypeHooks = sm90::SignalHooks<Scope::kSystem, true, false>;  // as AG+GEMM's
using RsTypeHooks = sm90::SignalHooks<Scope::kSystem, false, true>;  // as GEMM+RS's

// Sets every wait signal to `epoch` (again): the lines land in L2, where a producer's stores leave them.
__global__ void set_signals(uint64_t* sig, int64_t n, uint64_t epoch) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sig[i] = epoch;
}
template <class Hooks>
void gemm_with_hooks(const sm90::GemmArgs& args, const Hooks& hooks, cudaStream_t s) {
  sm90::launch_gemm<cutlass::bfloat16_t, __nv_bfloat16>(args, hooks, s);
}

// The plain engine's reference, from its two launches a rep (E, E'): both pooled (its rate), their
// mean per rep (the base of the hooks' paired ratios) and E alone (the base of the A/A).
struct EngineBase {
  std::vector<float> pooled;
  std::vector<double> mean, first;
};
EngineBase engine_base(const std::vector<float>& e, const std::vector<float>& e2) {
  EngineBase b{e, std::vector<double>(e.size()), std::vector<double>(e.begin(), e.end())};
  b.pooled.insert(b.pooled.end(), e2.begin(), e2.end());
  for (size_t r = 0; r < e.size(); ++r) b.mean[r] = 0.5 * (e[r] + e2[r]);
  return b;
}

// Paired statistics: the median over reps of x[r] / y[r] - 1, in percent, and half the spread
// between its 25th and 75th percentiles.
struct Paired {
  double median_pct = 0, half_iqr_pct = 0;
};
Paired paired(const std::vector<float>& x, const std::vector<double>& y) {
  std::vector<double> q;
  for (size_t r = 0; r < x.size() && r < y.size(); ++r) q.push_back(100.0 * (x[r] / y[r] - 1.0));
  if (q.empty()) return {};
  std::sort(q.begin(), q.end());
  auto at = [&](double f) { return q[static_cast<size_t>(f * (q.size() - 1) + 0.5)]; };
  return Paired{sorted_median(q), 0.5 * (at(0.75) - at(0.25))};
}
// The median over reps of x[r] - y[r] (ms), in us: an overhead as time a launch, not a share of it.
double paired_us(const std::vector<float>& x, const std::vector<double>& y) {
  std::vector<double> d;
  for (size_t r = 0; r < x.size() && r < y.size(); ++r) d.push_back(1e3 * (x[r] - y[r]));
  if (d.empty()) return 0;
  std::sort(d.begin(), d.end());
  return sorted_median(d);
}

int bench_gemm(Args& args) {
  const auto shapes = parse_shapes(args.get("--shapes", kDefaultShapes));
  DType in = DType::kBF16, out = DType::kBF16;
  TL_REQUIRE(parse_dtype(args.get("--dtype", "bf16"), &in), "bench gemm: bad --dtype");
  TL_REQUIRE(parse_dtype(args.get("--out-dtype", std::string(dtype_name(in))), &out), "bench gemm: bad --out-dtype");
  const int reps = static_cast<int>(args.get_int("--reps", 300));
  const int warmup = static_cast<int>(args.get_int("--warmup", 5));
  const int num_sms = static_cast<int>(args.get_int("--num-sms", 0));
  const int group_m = static_cast<int>(args.get_int("--group-m", 0));
  const bool verify = !args.flag("--no-verify");
  const bool csv = args.flag("--csv");
  const bool hot_signals = args.flag("--hot-signals");
  const bool warm_code = args.flag("--warm-code");
  const double sustained_ms = args.get_double("--sustained-ms", 0);
  const bool trace_batches = std::getenv("TILELINK_CLI_TRACE") != nullptr;
  const uint64_t seed = static_cast<uint64_t>(args.get_int("--seed", 20261129));
  const bool plain = args.flag("--plain");  // the engine and cuBLAS only (quick engine sweeps)
  const bool no_split = args.flag("--no-split");  // no workspace: the last wave is never split
  const bool host_us = args.flag("--host-us");
  const int tile_n = static_cast<int>(args.get_int("--tile-n", 0));  // 0: the engine picks
  const int tile_m = static_cast<int>(args.get_int("--tile-m", 0));
  const bool plain_tiles = args.flag("--plain-tiles");
  const bool tuned = args.flag("--tuned");
  const std::string kernel_name = args.get("--kernel", "auto");
  args.finish();
  sm90::GemmKernel kernel = sm90::GemmKernel::kAuto;
  if (kernel_name == "tile") {
    kernel = sm90::GemmKernel::kTileEngine;
  } else if (kernel_name == "decode") {
    kernel = sm90::GemmKernel::kDecode;
  } else {
    TL_REQUIRE(kernel_name == "auto",
               "bench gemm: --kernel must be auto, tile or decode, got " << kernel_name);
  }
  TL_REQUIRE(reps >= 1 && warmup >= 0, "bench gemm: --reps must be >= 1 and --warmup >= 0");
  const bool hooks_type = in == DType::kBF16 && out == DType::kBF16 && !plain;

  int dev = 0, l2 = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf(
      "# device: %s, %d SMs, L2 %d MB; engine tile %dx%sx%d, num_sms %d; %s -> %s; reps %d, warmup "
      "%d%s%s%s\n",
      prop.name, sms, l2 >> 20, tile_m ? tile_m : sm90::kTileM,
      tile_n ? std::to_string(tile_n).c_str()
             : "(256|192|176|160|128, or 256x160: gemm_pick_tile)",
      sm90::kTileK,
      num_sms ? num_sms : sms, std::string(dtype_name(in)).c_str(),
      std::string(dtype_name(out)).c_str(), reps, warmup,
      hot_signals ? "; wait signals rewritten after every flush (--hot-signals)" : "",
      warm_code ? "; each timed launch after an untimed one of the same variant (--warm-code)" : "",
      no_split ? "; the last wave never split (--no-split)" : "");

  BenchStream bench(static_cast<size_t>(l2));
  cudaStream_t stream = bench.stream;
  cublasHandle_t handle = bench.handle;
  void* flush = bench.flush;
  const size_t flush_bytes = bench.flush_bytes;
  cudaEvent_t* ev = bench.ev;
  sm90::GemmWorkspace split_ws;
  sm90::GemmTuner tuner;

  if (csv)
    std::printf(
        "m,n,k,engine_tflops,cublas_tflops,ratio,hooks_tflops,hooks_pct,aa_pct,aa_half_iqr_pct,"
        "wait_only_pct,notify_only_pct,ag_type_pct,rs_type_pct,err_engine,err_hooks,err_cublas,"
        "hooks_us,tile_n,kernel,split,tile_m\n");
  else
    std::printf("%6s %6s %6s | %7s %7s %6s | %7s %7s %11s %7s %7s | %6s %6s | %8s %8s %8s\n", "M",
                "N", "K", "engine", "cuBLAS", "ratio", "hooks", "hooks+%", "A/A% (+-)", "wait+%",
                "notif+%", "ag+%", "rs+%", "err_eng", "err_hook", "err_blas");

  std::vector<double> ratios, overheads, overheads_us, aa_abs, ag_overheads, rs_overheads,
      sustained_ratios;
  std::string narrow_shapes;  // shapes whose tiles are not 128 x kTileN, and the tile
  std::string decode_shapes;  // shapes whose engine column is the decode kernel
  bool all_ok = true;
  for (const Shape3& sh : shapes) {
    const int64_t m = sh.m, n = sh.n, k = sh.k;
    void *a = nullptr, *b = nullptr, *c = nullptr, *c_blas = nullptr;
    float* refc = nullptr;
    uint64_t *wait_sig = nullptr, *notify_sig = nullptr;
    sm90::GemmArgs ga;
    ga.m = m, ga.n = n, ga.k = k, ga.num_sms = num_sms, ga.tile_n = tile_n, ga.kernel = kernel;
    ga.tile_m = tile_m, ga.plain_tiles = plain_tiles;
    const bool decode = sm90::gemm_takes_decode(ga);
    // hooks run in the tile engine only, on its hooked widths
    const bool hooks_on = hooks_type && !decode && !sm90::gemm_plain_only_tile(tile_m, tile_n);
    // the engine column's tile, and whether it is one of the plain engine's own (the hooks' base is
    // then a plain launch of the hooks' tile, kHookedPlain)
    TileGrid engine_grid = sm90::gemm_tile_grid(ga, true);
    bool own_tile = !decode && sm90::gemm_plain_only_tile(engine_grid.tile_m, engine_grid.tile_n);
    sm90::GemmArgs ga_hooked = ga;  // filled below; tile_m 128: the hooked widths' pick
    ga_hooked.tile_m = sm90::kTileM;
    const TileGrid grid = hooks_on ? sm90::gemm_tile_grid(ga) : engine_grid;  // the hooks' tiles
    const std::string shape_name =
        std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    if (decode) decode_shapes += (decode_shapes.empty() ? "" : ", ") + shape_name;
    if ((engine_grid.tile_n != sm90::kTileN || engine_grid.tile_m != sm90::kTileM) && !decode) {
      narrow_shapes += (narrow_shapes.empty() ? "" : ", ") + shape_name + " (" +
                       std::to_string(engine_grid.tile_m) + "x" +
                       std::to_string(engine_grid.tile_n) + ")";
    }
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

    ga.a = a, ga.b = b, ga.c = c;
    ga.in_type = in, ga.out_type = out, ga.group_m = group_m;
    if (!no_split) split_ws.attach(ga, stream);  // the split last wave's workspace
    {
      const int named_m = ga_hooked.tile_m;
      ga_hooked = ga;
      ga_hooked.tile_m = named_m;
    }
    // The split, for the CSV: "-" none, "TxP" T tiles in P parts of K.
    std::string split_name = "-";
    if (const sm90::GemmSplit sp = decode ? sm90::GemmSplit{} : sm90::gemm_work(ga, true).split;
        sp.tiles > 0) {
      split_name = std::to_string(sp.tiles) + "x" + std::to_string(sp.parts);
    }
    BenchHooks hooks;
    hooks.wait_signals = wait_sig, hooks.notify_signals = notify_sig, hooks.tiles_n = grid.tiles_n(), hooks.epoch = 1;
    BenchHooks wait_only = hooks, notify_only = hooks;
    wait_only.notify_signals = nullptr;
    notify_only.wait_signals = nullptr;
    AgTypeHooks ag_type;
    ag_type.wait_signals = wait_sig, ag_type.tiles_n = grid.tiles_n(), ag_type.epoch = 1;
    RsTypeHooks rs_type;
    rs_type.notify_signals = notify_sig, rs_type.tiles_n = grid.tiles_n(), rs_type.epoch = 1;
    const float alpha = 1.f, beta = 0.f;
    if (tuned && !decode) {  // measured here, before the table's launches
      const sm90::GemmTile t = tuner.tile_for(ga, stream);
      narrow_shapes += std::string(narrow_shapes.empty() ? "" : ", ") + shape_name + " (tuned " +
                       std::to_string(t.m) + "x" + std::to_string(t.n) + ")";
      engine_grid = sm90::gemm_tile_grid(m, n, t.n, t.m);
      // the hooks' base: a plain launch of their own tile wherever the engine runs another
      own_tile = hooks_on && (engine_grid.tile_m != grid.tile_m || engine_grid.tile_n != grid.tile_n);
    }
    auto run_engine = [&] {
      if (tuned) {
        tuner.gemm(ga, stream);
      } else {
        sm90::gemm(ga, stream);
      }
    };
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
        // Every hooks kernel that notifies must have notified every tile; the ag- and rs-type ones
        // count into the hooks' error column (the worst of the three).
        auto check_notified = [&](const char* which) {
          std::vector<uint64_t> got(grid.num_tiles());
          CK(cudaMemcpy(got.data(), notify_sig, got.size() * sizeof(uint64_t),
                        cudaMemcpyDeviceToHost));
          if (std::count(got.begin(), got.end(), uint64_t{1}) != int64_t(got.size())) {
            all_ok = false;
            std::printf("# FAIL %lldx%lldx%lld: %s: not every tile notified\n", (long long)m,
                        (long long)n, (long long)k, which);
          }
          CK(cudaMemset(notify_sig, 0, grid.num_tiles() * sizeof(uint64_t)));
        };
        double err_ag = 0, err_rs = 0;
        check(run_hooks, c, &err_hooks);
        check_notified("hooks");
        check([&] { gemm_with_hooks(ga, ag_type, stream); }, c, &err_ag);
        check([&] { gemm_with_hooks(ga, rs_type, stream); }, c, &err_rs);
        check_notified("rs-type hooks");
        err_hooks = std::max({err_hooks, err_ag, err_rs});
      }
      check(run_cublas, c_blas, &err_blas);
      CK(cudaFree(refc));
    }

    // ---- timing: every variant once per rep, rotated order, L2 flushed before each launch ----
    enum {
      kEngine,
      kEngine2,
      kCublas,
      kHooks,
      kWaitOnly,
      kNotifyOnly,
      kAgType,
      kRsType,
      kHookedPlain,  // own_tile only: the plain engine on the hooks' tile, their base
      kVariants
    };
    const int variants = hooks_on ? (own_tile ? kVariants : kHookedPlain) : kCublas + 1;
    auto run_variant = [&](int v) {
      switch (v) {
        case kEngine: case kEngine2: run_engine(); break;
        case kCublas: run_cublas(); break;
        case kHooks: run_hooks(); break;
        case kWaitOnly: gemm_with_hooks(ga, wait_only, stream); break;
        case kNotifyOnly: gemm_with_hooks(ga, notify_only, stream); break;
        case kAgType: gemm_with_hooks(ga, ag_type, stream); break;
        case kRsType: gemm_with_hooks(ga, rs_type, stream); break;
        case kHookedPlain: gemm_with_hooks(ga_hooked, sm90::NoHooks{}, stream); break;
      }
    };
    std::vector<std::vector<float>> t(kVariants);
    std::vector<int> order(variants);
    for (int i = 0; i < variants; ++i) order[i] = i;
    std::mt19937 shuffle_rng(static_cast<uint32_t>(seed));
    for (int r = 0; r < warmup + reps; ++r) {
      std::shuffle(order.begin(), order.end(), shuffle_rng);
      for (int i = 0; i < variants; ++i) {
        const int v = order[i];
        auto launch = [&] { run_variant(v); };
        if (warm_code) launch();
        CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, stream));
        if (hot_signals) {
          set_signals<<<1, 256, 0, stream>>>(wait_sig, grid.num_tiles(), 1);
          CK(cudaGetLastError());
        }
        CK(cudaEventRecord(ev[0], stream));
        launch();
        CK(cudaEventRecord(ev[1], stream));
        CK(cudaEventSynchronize(ev[1]));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        if (r >= warmup) t[v].push_back(ms);
      }
    }
    const EngineBase eb = engine_base(t[kEngine], t[kEngine2]);
    const std::vector<double> hooked_base(t[kHookedPlain].begin(), t[kHookedPlain].end());
    const std::vector<double>& base = own_tile ? hooked_base : eb.mean;
    const double flop = 2.0 * m * n * k;
    const double tf_eng = flop / (median(eb.pooled) * 1e-3) / 1e12;
    const double tf_blas = flop / (median(t[kCublas]) * 1e-3) / 1e12;
    const double tf_hooks = hooks_on ? flop / (median(t[kHooks]) * 1e-3) / 1e12 : 0;
    const double ratio = tf_eng / tf_blas;
    const Paired p_hooks = paired(t[kHooks], base), p_aa = paired(t[kEngine2], eb.first),
                 p_wait = paired(t[kWaitOnly], base), p_notify = paired(t[kNotifyOnly], base),
                 p_ag = paired(t[kAgType], base), p_rs = paired(t[kRsType], base);
    const double hooks_us = hooks_on ? paired_us(t[kHooks], base) : 0;
    ratios.push_back(ratio);
    if (hooks_on) {
      overheads.push_back(p_hooks.median_pct);
      overheads_us.push_back(hooks_us);
      aa_abs.push_back(std::abs(p_aa.median_pct));
      ag_overheads.push_back(p_ag.median_pct);
      rs_overheads.push_back(p_rs.median_pct);
    }
    if (csv)
      std::printf(
          "%lld,%lld,%lld,%.1f,%.1f,%.3f,%.1f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2e,%.2e,%.2e,"
          "%.3f,%d,%s,%s,%d\n",
          (long long)m, (long long)n, (long long)k, tf_eng, tf_blas, ratio, tf_hooks,
          p_hooks.median_pct, p_aa.median_pct, p_aa.half_iqr_pct, p_wait.median_pct,
          p_notify.median_pct, p_ag.median_pct, p_rs.median_pct, err_eng, err_hooks, err_blas,
          hooks_us, engine_grid.tile_n, decode ? "decode" : "tile", split_name.c_str(),
          engine_grid.tile_m);
    else {
      auto err = [](double e) {  // "-": not checked (--no-verify, or no hooks for this type)
        char buf[16] = "-";
        if (e >= 0) std::snprintf(buf, sizeof(buf), "%.2e", e);
        return std::string(buf);
      };
      // The hooks' columns: "-" where no hooks ran (--plain, or not bf16 -> bf16).
      auto hk = [&](double v, int width, bool rate = false) {
        char buf[24];
        if (!hooks_on)
          std::snprintf(buf, sizeof(buf), "%*s", width, "-");
        else if (rate)
          std::snprintf(buf, sizeof(buf), "%*.1f", width, v);
        else
          std::snprintf(buf, sizeof(buf), "%+*.2f", width, v);
        return std::string(buf);
      };
      std::printf(
          "%6lld %6lld %6lld | %7.1f %7.1f %6.3f | %s %s %+5.2f(%4.2f) %s %s | %s %s | %8s %8s "
          "%8s\n",
          (long long)m, (long long)n, (long long)k, tf_eng, tf_blas, ratio,
          hk(tf_hooks, 7, true).c_str(), hk(p_hooks.median_pct, 7).c_str(), p_aa.median_pct,
          p_aa.half_iqr_pct, hk(p_wait.median_pct, 7).c_str(), hk(p_notify.median_pct, 7).c_str(),
          hk(p_ag.median_pct, 6).c_str(), hk(p_rs.median_pct, 6).c_str(), err(err_eng).c_str(),
          err(err_hooks).c_str(), err(err_blas).c_str());
    }
    std::fflush(stdout);

    // ---- host time a call: enqueued back to back, no sync inside a batch ----
    if (host_us) {
      auto per_call_us = [&](auto&& run) {
        constexpr int kCalls = 200;
        std::vector<double> batches;
        for (int batch = 0; batch < 6; ++batch) {
          CK(cudaStreamSynchronize(stream));
          for (int i = 0; i < (batch == 0 ? 20 : 0); ++i) run();
          CK(cudaStreamSynchronize(stream));
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < kCalls; ++i) run();
          const auto t1 = std::chrono::steady_clock::now();
          if (batch > 0)
            batches.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / kCalls);
        }
        CK(cudaStreamSynchronize(stream));
        std::sort(batches.begin(), batches.end());
        return batches[batches.size() / 2];
      };
      const double eng_us = per_call_us(run_engine), blas_us = per_call_us(run_cublas);
      std::printf("# host us a call %lldx%lldx%lld: engine %.2f, cuBLAS %.2f\n", (long long)m,
                  (long long)n, (long long)k, eng_us, blas_us);
      std::fflush(stdout);
    }

    // ---- sustained: back-to-back launches, no flush, rounds in a rotating order ----
    if (sustained_ms > 0) {
      const int per_batch =
          std::clamp(static_cast<int>(sustained_ms / median(eb.pooled)), 3, 100000);
      // Every variant of the table (the engine twice: E' over E is the method's noise, A/A).
      std::vector<std::vector<float>> ts(kVariants);
      constexpr int kRounds = 7;
      for (int round = -1; round < kRounds; ++round) {  // round -1: warm-up, untimed
        for (int i = 0; i < variants; ++i) {
          const int v = (i + round + 1) % variants;
          const double wall0 = unix_seconds();
          CK(cudaEventRecord(ev[0], stream));
          for (int l = 0; l < per_batch; ++l) run_variant(v);
          CK(cudaEventRecord(ev[1], stream));
          CK(cudaEventSynchronize(ev[1]));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
          if (round >= 0) ts[v].push_back(ms / per_batch);
          if (trace_batches)  // to line up with e.g. nvidia-smi's clock samples
            std::fprintf(stderr, "[batch %lldx%lldx%lld variant %d round %d] %.3f %.3f\n",
                         (long long)m, (long long)n, (long long)k, v, round, wall0, unix_seconds());
        }
      }
      const EngineBase sb = engine_base(ts[kEngine], ts[kEngine2]);
      const std::vector<double> hooked_round_base(ts[kHookedPlain].begin(), ts[kHookedPlain].end());
      const std::vector<double>& round_base = own_tile ? hooked_round_base : sb.mean;
      const double s_eng = flop / (median(sb.pooled) * 1e-3) / 1e12;
      const double s_blas = flop / (median(ts[kCublas]) * 1e-3) / 1e12;
      sustained_ratios.push_back(s_eng / s_blas);
      // Paired per round, as above: each hooks variant over the round's mean of E and E'.
      const Paired s_aa = paired(ts[kEngine2], sb.first);
      std::printf("%6s %6s %6s   sustained (%d back to back x %d rounds): engine %.1f, cuBLAS %.1f TFLOP/s, "
                  "ratio %.3f, A/A %+.2f%% (+-%.2f)",
                  "", "", "", per_batch, kRounds, s_eng, s_blas, s_eng / s_blas, s_aa.median_pct, s_aa.half_iqr_pct);
      if (hooks_on) {
        const Paired h = paired(ts[kHooks], round_base);
        std::printf("; hooks+%% %+.2f (+-%.2f), wait+%% %+.2f, notif+%% %+.2f, ag+%% %+.2f, rs+%% %+.2f",
                    h.median_pct, h.half_iqr_pct, paired(ts[kWaitOnly], round_base).median_pct,
                    paired(ts[kNotifyOnly], round_base).median_pct, paired(ts[kAgType], round_base).median_pct,
                    paired(ts[kRsType], round_base).median_pct);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    CK(cudaFree(c_blas));
    CK(cudaFree(wait_sig));
    CK(cudaFree(notify_sig));
  }
  if (!narrow_shapes.empty() && !csv) {
    std::printf("# tiles other than %dx%d (gemm_pick_tile or --tile-m/--tile-n; rows x width): %s\n",
                sm90::kTileM, sm90::kTileN, narrow_shapes.c_str());
  }
  if (!decode_shapes.empty() && !csv) {
    std::printf("# the decode kernel (gemm_takes_decode; no hooks there): %s\n",
                decode_shapes.c_str());
  }
  std::vector<double> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  std::printf("# ratio to cuBLAS: median %.3f, min %.3f", sorted_median(sorted), sorted.front());
  auto med_max = [](const char* what, std::vector<double> o) {
    if (o.empty()) return;
    std::sort(o.begin(), o.end());
    std::printf("; %s: median %+.2f%%, max %+.2f%%", what, o[o.size() / 2], o.back());
  };
  med_max(hot_signals ? "hooks overhead (hot signals)" : "hooks overhead", overheads);
  if (!overheads_us.empty()) {
    const auto [lo, hi] = std::minmax_element(overheads_us.begin(), overheads_us.end());
    std::printf(" (%+.2f to %+.2f us a launch)", *lo, *hi);
  }
  med_max("AG+GEMM-type waits", ag_overheads);
  med_max("GEMM+RS-type notifies", rs_overheads);
  if (!aa_abs.empty())
    std::printf("; |A/A| max %.2f%%", *std::max_element(aa_abs.begin(), aa_abs.end()));
  if (!sustained_ratios.empty()) {
    std::sort(sustained_ratios.begin(), sustained_ratios.end());
    std::printf("; sustained ratio to cuBLAS: median %.3f, min %.3f", sustained_ratios[sustained_ratios.size() / 2],
                sustained_ratios.front());
  }
  std::printf("; verification %s\n", verify ? (all_ok ? "PASSED" : "FAILED") : "skipped");
  return all_ok ? 0 : 1;
}

}  // namespace

TILELINK_REGISTER_COMMAND(
    {"bench gemm",
     "[--shapes MxNxK,...] [--dtype bf16|fp16] [--out-dtype bf16|fp16|fp32] [--reps R] "
     "[--warmup W] [--num-sms S] [--group-m G] [--seed S] [--hot-signals] [--warm-code] "
     "[--sustained-ms T] [--plain] [--no-split] [--host-us] [--tile-n 0|256|192|176|160|128] [--tile-m 0|128|256 (256: 160 wide)] [--plain-tiles] [--tuned] "
     "[--kernel auto|tile|decode] [--no-verify] [--csv]",
     "sm90 GEMM engine vs cuBLAS (TFLOP/s, ratio) and with wait/notify hooks on; verified "
     "against a float32 reference",
     &bench_gemm,
     {"--no-verify", "--csv", "--hot-signals", "--warm-code", "--plain", "--no-split",
      "--host-us", "--plain-tiles", "--tuned"}});

}  // namespace tilelink::cli
