// tilelink bench moe_ag_gemm | moe_gemm_rs | moe_mlp: the MoE layers of cuda::MoeLayer
// (ops/moe_cuda.hpp) on one GPU, on the layers of six models, each timed four ways on one stream:
//   fused  moe.route + the op with --fused's path: gathered (the default, MoePath::kFused: the
//          GEMM gathers X's rows in its load path; what the layer ops' fused call runs at world 1)
//          or overlap (MoePath::kOverlap: layer 0's gather kernel on a few SMs writes X's rows in
//          grouped order beside the grouped GEMM, whose tiles wait for their tile rows) or ahead
//          (MoePath::kAhead: the GEMM's own blocks copy X's rows in grouped order, the first
//          waves' in a prologue, the rest on idle producer warps, its tiles waiting for them)
//          or auto (MoePath::kAuto: what the layer itself takes, gathered or the unfused
//          pipeline by the path model; the row's last column names it)
//   (a)    moe.route + the op with MoePath::kUnfused: the best unfused pipeline (a gather kernel
//          writes X in grouped order, then the grouped GEMM). Layer 1 has one path: for
//          moe_gemm_rs at world 1, (a) runs the same kernels as fused, and fus/a is their A/A.
//   (b)    a per-expert loop of cuBLAS GEMMs, what the largest published MoE speedups compare
//          against: moe.route, the offsets copied to the host (cudaMemcpyAsync + stream sync,
//          inside the timed region), moe.gather into moe.xs(), one cublasGemmEx per non-empty
//          expert, then moe.activate, a second loop and moe.topk_reduce as the op needs
//   dense  the ideal bound: one dense cublasGemmEx per GEMM of the op with the same FLOPs
//          (rows x N x K against expert 0's weights), nothing else
//   gather (layer 0) moe.gather alone: the gather kernel that writes X in grouped order, the one
//          pass of (a) a fused layer 0 removes. ceil = a_ms / (a_ms - gather_ms): the fus/a a fused
//          layer 0 would reach with the gather free and the GEMM as fast as (a)'s
// The layers (H hidden, F ffn, E experts, top-k; rows = tokens * topk grouped rows):
//   moe_ag_gemm   layer 0: out [rows, F] = X [tokens, H] gathered · W1_eᵀ, W1 [E, F, H]
//   moe_gemm_rs   layer 1: out [tokens, H] = the top-k reduce of H1 [rows, F] · W2_eᵀ, W2 [E, H, F]
//   moe_mlp       layer 0 with W1 [E, 2F, H] (gate; up), SiLU(gate) · up, layer 1
// --world W > 1 runs the ops over W ranks instead (bench_moe_ranks below).
//
// Inputs: hashed uniform values on the device (X and H1 in [-1, 1), weights in [-3, 3) / sqrt(K),
// so every GEMM's outputs have a standard deviation near 1); topk_weights fp32, positive, each
// token's summing to 1; the routing drawn by moe_draw_routing, seeded from --seed and the case.
//
// Timing: CUDA events around each call, L2 flushed (a 2x-L2 memset) before every call; every rep
// runs each variant once in a fresh random order (as bench gemm: a launch runs slightly faster
// right after one of the same kernel), median of --reps after --warmup. fus/a and fus/b are
// speedups: the baseline's ms over fused's (> 1: fused is faster).
//
// Check (--check, the default; untimed, before timing): each path's output poisoned (0xFF bytes)
// before its run; the device routing tables equal moe_route's; fused and (a) bit-identical (layer
// 0: its rows [0, rows), and the 128 spare rows past them still poisoned, also after timing; the
// others: the whole [tokens, H]); (b) within the op's tolerance of fused (relative Frobenius);
// fused against float64 on 16 sampled grouped rows (layer 0) or tokens (moe_sampled_reference.hpp:
// each expert's weights read back once and handed to compute/cpu_moe.hpp's references). Tolerances
// as `tilelink run` uses for the layer ops (tools/tilelink/layer_moe.cpp). A failure prints a
// "# FAIL" line, "FAIL" in the check column, and the command exits 1.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench_moe_models.hpp"
#include "bench_world.hpp"
#include "cli.hpp"
#include "device_buffer.hpp"
#include "moe_sampled_reference.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_gemm.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/moe_cuda.hpp"
#include "tilelink/ops/moe_ops_cuda.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace tilelink::cli {
namespace {

using cuda::MoeLayer;
using cuda::MoePath;

#define CK(call) TL_CUDA_CHECK(call)

const char* op_name(MoeBenchOp op) {
  return op == MoeBenchOp::kAgGemm   ? "moe_ag_gemm"
         : op == MoeBenchOp::kGemmRs ? "moe_gemm_rs"
                                     : "moe_mlp";
}

// The relative error `tilelink run` accepts for the layer op in bf16 and fp16 (layer_moe.cpp).
double tolerance(MoeBenchOp op) {
  return op == MoeBenchOp::kAgGemm ? 1e-2 : op == MoeBenchOp::kGemmRs ? 2e-2 : 3e-2;
}

// Each GPU's F of every expert at world W: F / W rounded up to a multiple of 8 (the kernels move
// 8-element chunks).
int64_t ffn_shard(int64_t ffn, int64_t world) { return ((ffn + world - 1) / world + 7) / 8 * 8; }

// Pinned host memory (the per-expert loop's copy of the offsets).
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) { CK(cudaMallocHost(&p_, bytes < 1 ? 1 : bytes)); }
  ~PinnedBuffer() { (void)cudaFreeHost(p_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

// Row-major C [m, n] = A [m, k] · B [n, k]ᵀ in fp32 compute. NOTE: cuBLAS is column-major, so it
// computes Cᵀ = B · Aᵀ with B read transposed (as bench gemm calls it).
void gemm_rows(cublasHandle_t handle, const void* a, const void* b, void* c, int64_t m, int64_t n,
               int64_t k, DType t) {
  const float alpha = 1.f, beta = 0.f;
  const cudaDataType_t ct = cuda_type(t);
  TL_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b,
                               ct, int(k), a, ct, int(k), &beta, c, ct, int(n), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

// ||out - want||_F / ||want||_F over `count` stored elements; +inf where out is not finite.
double rel_error(const void* out, const void* want, DType t, int64_t count) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double o = load_as_float(out, t, i), w = load_as_float(want, t, i);
    if (!std::isfinite(o)) return INFINITY;
    num += (o - w) * (o - w);
    den += w * w;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The host copy of `bytes` bytes of device memory.
std::vector<std::byte> read_back(const void* src, size_t bytes) {
  std::vector<std::byte> h(bytes);
  CK(cudaMemcpy(h.data(), src, bytes, cudaMemcpyDeviceToHost));
  return h;
}

std::string fmt(const char* f, double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

struct CaseOptions {
  MoeBenchOp op;
  DType dtype;
  int64_t world;
  uint64_t seed;
  int reps, warmup;
  bool check;
  MoePath fused = MoePath::kFused;    // --fused gathered|overlap
  int gather_sms = 0;                 // --gather-sms (overlap): 0, the layer's default
  int ahead_waves = -1;               // --ahead-waves (ahead): -1, the layer's default
  bool reduce_beside = false;         // --reduce beside|after (moe_gemm_rs over ranks)
  int completion_keys = 0;            // --completion-keys K (moe_gemm_rs over ranks): 0, the op's default
  std::string transport = "auto";     // --transport auto|virtual|peer (over ranks)
};

// One row of the table.
struct CaseRow {
  int64_t rows = 0;
  double ms[5] = {};  // fused, (a), (b), dense, gather (layer 0; 0 without)
  double flop = 0;    // of the op's GEMMs
  double err_b = -1, err_f64 = -1;
  std::string why;   // the failures, empty when every check passed
  MoePath path{};    // the path the fused column's layer 0 took (--fused auto: the layer's choice)
};

enum { kFused, kUnfused, kLoop, kDense, kGather, kVariants };

CaseRow bench_case(const BenchStream& ctx, const CaseOptions& o, size_t model_index,
                   const MoeModel& model, int64_t tokens, MoeRoutingPattern pattern) {
  const MoeBenchOp op = o.op;
  const DType dt = o.dtype;
  const int experts = model.experts, topk = model.topk;
  const int64_t hidden = model.hidden, ffn = ffn_shard(model.ffn, o.world);
  const int64_t rows = tokens * topk;
  const int64_t es = dtype_size(dt);
  cudaStream_t stream = ctx.stream;
  CaseRow row;
  row.rows = rows;

  // ---- the routing and the top-k weights, drawn on the host ----
  std::seed_seq case_seed{static_cast<uint32_t>(o.seed),      static_cast<uint32_t>(o.seed >> 32),
                          static_cast<uint32_t>(model_index), static_cast<uint32_t>(tokens),
                          static_cast<uint32_t>(pattern),     static_cast<uint32_t>(op)};
  std::mt19937_64 gen(case_seed);
  const std::vector<int32_t> ids = moe_draw_routing(gen, tokens, topk, experts, pattern);
  const MoeRouting route = moe_route(std::span<const int32_t>(ids), tokens, topk, experts);
  std::vector<float> weights(rows);
  std::uniform_real_distribution<float> unit(0.1f, 1.0f);
  for (int64_t tk = 0; tk < tokens; ++tk) {
    float* w = weights.data() + tk * topk;
    for (int s = 0; s < topk; ++s) w[s] = unit(gen);
    const float sum = std::accumulate(w, w + topk, 0.0f);
    for (int s = 0; s < topk; ++s) w[s] /= sum;
  }

  // ---- the layer, its inputs and the outputs (freed when the case ends) ----
  MoeLayer moe(tokens, hidden, ffn, experts, topk, dt);
  if (o.gather_sms > 0) moe.set_gather_sms(o.gather_sms);
  if (o.ahead_waves >= 0) moe.set_ahead_waves(o.ahead_waves);
  const bool has_layer0 = op != MoeBenchOp::kGemmRs, has_layer1 = op != MoeBenchOp::kAgGemm;
  const int64_t n0 = op == MoeBenchOp::kMlp ? 2 * ffn : ffn;  // layer 0's N
  row.path = has_layer0 ? moe.layer0_path(o.fused, n0) : MoePath::kFused;
  DeviceBuffer d_ids(rows * sizeof(int32_t)), d_weights(rows * sizeof(float));
  DeviceBuffer x(has_layer0 ? tokens * hidden * es : 0);
  DeviceBuffer w1(has_layer0 ? experts * n0 * hidden * es : 0);
  DeviceBuffer h1(has_layer1 && !has_layer0 ? rows * ffn * es : 0);
  DeviceBuffer w2(has_layer1 ? experts * hidden * ffn * es : 0);
  const MoeSampleInputs in{.op = op,
                           .dtype = dt,
                           .tokens = tokens,
                           .hidden = hidden,
                           .ffn = ffn,
                           .experts = experts,
                           .topk = topk,
                           .x = x.get(),
                           .w1 = w1.get(),
                           .h1 = h1.get(),
                           .w2 = w2.get()};
  const int64_t cols = in.out_cols();
  CK(cudaMemcpyAsync(d_ids.get(), ids.data(), d_ids.bytes(), cudaMemcpyHostToDevice, stream));
  CK(cudaMemcpyAsync(d_weights.get(), weights.data(), d_weights.bytes(), cudaMemcpyHostToDevice,
                     stream));
  const uint64_t fill_seed = o.seed ^ (0x9E3779B97F4A7C15ull * (model_index + 1)) ^
                             (static_cast<uint64_t>(tokens) << 20) ^ static_cast<uint64_t>(pattern);
  if (has_layer0) {
    fill_uniform(x.get(), dt, tokens * hidden, fill_seed ^ 0x1, 1.0f, stream);
    fill_uniform(w1.get(), dt, experts * n0 * hidden, fill_seed ^ 0x2,
                 3.0f / std::sqrt(float(hidden)), stream);
  }
  if (has_layer1) {
    if (h1.bytes() > 0) fill_uniform(h1.get(), dt, rows * ffn, fill_seed ^ 0x3, 1.0f, stream);
    fill_uniform(w2.get(), dt, experts * hidden * ffn, fill_seed ^ 0x4,
                 3.0f / std::sqrt(float(ffn)), stream);
  }
  // Outputs: layer 0 [rows + spare, F]; the others [tokens, H]. The dense bound's C holds the
  // widest of its GEMMs.
  const int64_t out_rows = op == MoeBenchOp::kAgGemm ? rows + kSpareRows : tokens;
  const size_t out_bytes = out_rows * cols * es;
  DeviceBuffer out_fused(out_bytes), out_unfused(out_bytes), out_loop(out_bytes);
  DeviceBuffer dense(rows * std::max(has_layer0 ? n0 : 0, has_layer1 ? hidden : 0) * es);
  PinnedBuffer offsets_host((experts + 1) * sizeof(int64_t));
  const auto* ids_dev = static_cast<const int32_t*>(d_ids.get());
  const auto* w_dev = static_cast<const float*>(d_weights.get());

  // ---- the variants ----
  auto run_op = [&](MoePath path, void* out) {
    moe.route(ids_dev, stream);
    if (op == MoeBenchOp::kAgGemm) moe.layer0(x.get(), w1.get(), ffn, out, path, stream);
    if (op == MoeBenchOp::kGemmRs) moe.layer1(h1.get(), w2.get(), w_dev, out, stream);
    if (op == MoeBenchOp::kMlp) moe.mlp(x.get(), w1.get(), w2.get(), w_dev, out, path, stream);
  };
  // One cublasGemmEx per non-empty expert over its grouped rows: C_e = A_e · B_eᵀ.
  auto expert_loop = [&](const void* a, const void* b, void* c, int64_t n, int64_t k) {
    const auto* off = static_cast<const int64_t*>(offsets_host.get());
    for (int e = 0; e < experts; ++e) {
      const int64_t m = off[e + 1] - off[e];
      if (m == 0) continue;
      gemm_rows(ctx.handle, element_at(a, off[e] * k, dt), element_at(b, e * n * k, dt),
                element_at(c, off[e] * n, dt), m, n, k, dt);
    }
  };
  auto run_loop = [&] {
    moe.route(ids_dev, stream);
    CK(cudaMemcpyAsync(offsets_host.get(), moe.offsets(), (experts + 1) * sizeof(int64_t),
                       cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));  // the loop's sizes come from the host
    if (has_layer0) moe.gather(x.get(), moe.xs(), stream);
    if (op == MoeBenchOp::kAgGemm) expert_loop(moe.xs(), w1.get(), out_loop.get(), ffn, hidden);
    if (op == MoeBenchOp::kMlp) {
      expert_loop(moe.xs(), w1.get(), moe.h(), n0, hidden);
      moe.activate(moe.h(), moe.act(), stream);
    }
    if (has_layer1) {
      expert_loop(op == MoeBenchOp::kMlp ? moe.act() : h1.get(), w2.get(), moe.y(), hidden, ffn);
      moe.topk_reduce(moe.y(), w_dev, out_loop.get(), stream);
    }
  };
  // NOTE: the dense GEMMs read moe.xs() and moe.act(), which the untimed call below fills first.
  auto run_dense = [&] {
    if (op == MoeBenchOp::kAgGemm)
      gemm_rows(ctx.handle, moe.xs(), w1.get(), dense.get(), rows, ffn, hidden, dt);
    if (op == MoeBenchOp::kGemmRs)
      gemm_rows(ctx.handle, h1.get(), w2.get(), dense.get(), rows, hidden, ffn, dt);
    if (op == MoeBenchOp::kMlp) {
      gemm_rows(ctx.handle, moe.xs(), w1.get(), dense.get(), rows, n0, hidden, dt);
      gemm_rows(ctx.handle, moe.act(), w2.get(), dense.get(), rows, hidden, ffn, dt);
    }
  };
  auto run_variant = [&](int v) {
    switch (v) {
      case kFused:
        run_op(o.fused, out_fused.get());
        break;
      case kUnfused:
        run_op(MoePath::kUnfused, out_unfused.get());
        break;
      case kLoop:
        run_loop();
        break;
      case kDense:
        run_dense();
        break;
      case kGather:
        moe.gather(x.get(), moe.xs(), stream);
        break;
    }
  };
  row.flop = 2.0 * rows * ((has_layer0 ? n0 * hidden : 0) + (has_layer1 ? hidden * ffn : 0));

  // ---- the checks: untimed, each output poisoned before its run ----
  const int64_t routed = (op == MoeBenchOp::kAgGemm ? rows : tokens) * cols;  // elements
  const size_t spare_bytes = op == MoeBenchOp::kAgGemm ? kSpareRows * cols * es : 0;
  auto spare_poisoned = [&](const std::byte* out_rows_end) {
    return std::all_of(out_rows_end, out_rows_end + spare_bytes,
                       [](std::byte b) { return b == std::byte{0xff}; });
  };
  if (o.check) {
    auto checked_run = [&](int v, const DeviceBuffer& out) {
      CK(cudaMemsetAsync(out.get(), 0xff, out_bytes, stream));
      run_variant(v);
      CK(cudaStreamSynchronize(stream));
      return read_back(out.get(), out_bytes);
    };
    const std::vector<std::byte> fused = checked_run(kFused, out_fused);
    // The device's routing against moe_route's (the references below use the host's tables).
    int64_t status = -1;
    CK(cudaMemcpy(&status, moe.status(), sizeof(status), cudaMemcpyDeviceToHost));
    std::vector<int64_t> offsets(experts + 1), pair_of_row(rows);
    CK(cudaMemcpy(offsets.data(), moe.offsets(), offsets.size() * sizeof(int64_t),
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(pair_of_row.data(), moe.pair_of_row(), pair_of_row.size() * sizeof(int64_t),
                  cudaMemcpyDeviceToHost));
    if (status != 0 || offsets != route.offsets || pair_of_row != route.pair_of_row)
      row.why += " the device's routing tables differ from moe_route's (status " +
                 std::to_string(status) + ");";

    const std::vector<std::byte> unfused = checked_run(kUnfused, out_unfused);
    if (std::memcmp(fused.data(), unfused.data(), routed * es) != 0) {
      int64_t differ = 0;
      for (int64_t i = 0; i < routed; ++i)
        differ += std::memcmp(element_at(fused.data(), i, dt), element_at(unfused.data(), i, dt),
                              es) != 0;
      row.why += " fused and (a) differ in " + std::to_string(differ) + " of " +
                 std::to_string(routed) + " elements;";
    }
    if (!spare_poisoned(element_at(fused.data(), routed, dt)))
      row.why += " fused wrote rows past the routed ones;";
    if (!spare_poisoned(element_at(unfused.data(), routed, dt)))
      row.why += " (a) wrote rows past the routed ones;";

    const std::vector<std::byte> loop = checked_run(kLoop, out_loop);
    row.err_b = rel_error(loop.data(), fused.data(), dt, routed);
    if (!(row.err_b <= tolerance(op)))
      row.why += " (b) against fused: relative error " + fmt("%.3g", row.err_b) + ";";

    const SampledReference ref =
        sampled_reference(in, route, ids, weights, gen, [](void* dst, const void* src, size_t n) {
          CK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
        });
    std::vector<std::byte> got(ref.rows.size() * cols * es);
    for (size_t i = 0; i < ref.rows.size(); ++i)
      std::memcpy(element_at(got.data(), i * cols, dt),
                  element_at(fused.data(), ref.rows[i] * cols, dt), cols * es);
    row.err_f64 = relative_error(got.data(), dt, ref.want);
    if (!(row.err_f64 <= tolerance(op)))
      row.why += " fused against float64 (" + std::to_string(ref.rows.size()) +
                 " sampled rows): relative error " + fmt("%.3g", row.err_f64) + ";";
  }

  // ---- timing: every variant once a rep, shuffled order, L2 flushed before each ----
  run_op(o.fused, out_fused.get());                       // fills moe.act() for the dense
  if (has_layer0) moe.gather(x.get(), moe.xs(), stream);  // bound, and moe.xs()
  CK(cudaStreamSynchronize(stream));
  std::vector<std::vector<float>> t(kVariants);
  std::vector<int> order{kFused, kUnfused, kLoop, kDense};
  if (has_layer0) order.push_back(kGather);
  std::mt19937 shuffle_rng(static_cast<uint32_t>(o.seed));
  for (int r = 0; r < o.warmup + o.reps; ++r) {
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    for (int v : order) {
      CK(cudaMemsetAsync(ctx.flush, r & 0xff, ctx.flush_bytes, stream));
      CK(cudaEventRecord(ctx.ev[0], stream));
      run_variant(v);
      CK(cudaEventRecord(ctx.ev[1], stream));
      CK(cudaEventSynchronize(ctx.ev[1]));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, ctx.ev[0], ctx.ev[1]));
      if (r >= o.warmup) t[v].push_back(ms);
    }
  }
  for (int v = 0; v < kVariants; ++v) row.ms[v] = t[v].empty() ? 0.0 : median(t[v]);

  // ---- layer 0's spare rows, after every timed call: still poisoned ----
  if (o.check && spare_bytes > 0) {
    for (const DeviceBuffer* out : {&out_fused, &out_unfused}) {
      const std::vector<std::byte> spare =
          read_back(element_at(out->get(), routed, dt), spare_bytes);
      if (!spare_poisoned(spare.data()))
        row.why += std::string(out == &out_fused ? " fused" : " (a)") +
                   " wrote rows past the routed ones while timed;";
    }
  }
  return row;
}

// ---- over the ranks of a world ------------------------------------------------------------------

// `bench moe_* --world W` (W > 1): the ops of ops/moe_ops_cuda.hpp on W ranks (virtual ranks of this
// GPU, or a GPU a rank with --transport peer),
// each rank F / W of every expert (rounded up to a multiple of 8) and M / W of the tokens; unfused =
// baseline (a) (the AllGathers, copy engine or NCCL, then the routing, the gather and the grouped GEMM;
// layer 1: the partial, then the ReduceScatter), fused = the op's run(); comm / compute = the
// parts alone (moe_mlp: not split), ideal = max(comm, compute), overlap = (comm + compute - fused)
// / min(comm, compute); check: fused and unfused bit for bit on every rank, no output left poisoned.
int bench_moe_ranks(const CaseOptions& o, const std::vector<size_t>& models, const std::vector<int64_t>& tokens_list,
                    const std::vector<MoeRoutingPattern>& patterns) {
  namespace tlc = tilelink::cuda;
  const MoeBenchOp op = o.op;
  const char* name = op_name(op);
  const int W = static_cast<int>(o.world);
  const BenchGpu gpu = require_sm90_gpu(std::string("bench ") + name);
  const tlc::Transport transport = one_process_transport(o.transport, W, std::string("bench ") + name);
  std::printf("# date %s; device %s, %d SMs; commit %s\n", utc_now().c_str(), gpu.prop.name, gpu.sms,
              source_commit().c_str());
  const std::string reduce_form =
      o.reduce_beside ? "beside the grouped GEMM (--reduce beside), completion keys " +
                            (o.completion_keys > 0 ? std::to_string(o.completion_keys) : std::string("default"))
                      : std::string("after the grouped GEMM (--reduce after)");
  std::printf(
      "# bench %s: %s, world %d, %s, F / W of every expert a "
      "rank, M / W tokens a rank; unfused = baseline (a): the AllGathers (copy engine; NCCL on peer), then the routing, a gather "
      "and the grouped GEMM (layer 1: the partial, then the ReduceScatter on every SM); loop = baseline (b): (a) "
      "with one cuBLAS GEMM a non-empty expert (sizes read back to the host); fused = the op's fused call; comm / "
      "compute = the parts alone; ideal = max(comm, compute); speedup = unfused / fused, over_b = loop / fused; "
      "overlap = (comm + compute - fused) / min(comm, compute); ms: host wall medians of %d after %d warm-ups; "
      "check: fused and unfused bit-identical on every rank (on peer, layer 1 and the MLP: within the tolerance, NCCL summing in its own order), and err_b (the loop against unfused, relative, "
      "Frobenius, the worst rank) within the one-GPU bench's tolerance; auto: the op's choice; layer 1's top-k "
      "reduce %s\n",
      name, std::string(dtype_name(o.dtype)).c_str(), W, transport_words(transport), o.reps, o.warmup,
      reduce_form.c_str());
  std::printf("%-13s %6s %-13s | %9s %9s %9s %9s %9s %9s | %7s %7s %7s | %8s %5s | %s\n", "model", "tokens",
              "routing", "unfused", "loop", "fused", "comm", "compute", "ideal", "speedup", "over_b", "overlap",
              "err_b", "check", "auto");
  tlc::World world({.transport = transport, .world_size = W});
  const int64_t eb = dtype_size(o.dtype);
  bool all_ok = true;
  std::vector<double> speedups;
  for (size_t model_index : models) {
    const MoeModel& model = kMoeModels[model_index];
    const int64_t hidden = model.hidden, ffn = ffn_shard(model.ffn, W);
    const int experts = model.experts, topk = model.topk;
    for (int64_t tokens : tokens_list) {
      const RowPartition parts = RowPartition::even(tokens, W);
      const std::vector<int64_t> ffns(W, ffn);
      const int64_t rows = tokens * topk;
      for (MoeRoutingPattern pattern : patterns) {
        std::seed_seq case_seed{static_cast<uint32_t>(o.seed), static_cast<uint32_t>(model_index),
                                static_cast<uint32_t>(tokens), static_cast<uint32_t>(pattern),
                                static_cast<uint32_t>(op), static_cast<uint32_t>(W)};
        std::mt19937_64 gen(case_seed);
        const std::vector<int32_t> ids = moe_draw_routing(gen, tokens, topk, experts, pattern);
        std::vector<float> weights(rows);
        std::uniform_real_distribution<float> unit(0.1f, 1.0f);
        for (float& v : weights) v = unit(gen);
        const bool layer0 = op != MoeBenchOp::kGemmRs, layer1 = op != MoeBenchOp::kAgGemm;
        const int64_t n0 = op == MoeBenchOp::kMlp ? 2 * ffn : ffn;
        std::vector<std::unique_ptr<DeviceBuffer>> keep;
        auto alloc = [&](int r, int64_t bytes) {
          world.bind(r);
          keep.push_back(std::make_unique<DeviceBuffer>(static_cast<size_t>(std::max<int64_t>(bytes, 16))));
          return keep.back()->get();
        };
        std::vector<const void*> x(W), w1(W), w2(W), h1(W);
        std::vector<const int32_t*> my_ids(W), all_ids(W);
        std::vector<const float*> my_w(W), all_w(W);
        std::vector<void*> out_f(W), out_u(W), out_b(W);
        std::vector<int64_t> out_bytes(W);
        for (int r = 0; r < W; ++r) {
          const int64_t t0 = parts.begin(r), tr = parts.size(r);
          const uint64_t fill = o.seed ^ (0x9E3779B97F4A7C15ull * (model_index + 1)) ^ (uint64_t(tokens) << 20) ^
                                (uint64_t(r) << 8) ^ uint64_t(pattern);
          auto upload = [&](const void* host, int64_t bytes) {
            void* d = alloc(r, bytes);
            if (bytes > 0) CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
            return d;
          };
          my_ids[r] = tr ? static_cast<const int32_t*>(upload(ids.data() + t0 * topk, tr * topk * 4)) : nullptr;
          my_w[r] = tr ? static_cast<const float*>(upload(weights.data() + t0 * topk, tr * topk * 4)) : nullptr;
          all_ids[r] = static_cast<const int32_t*>(upload(ids.data(), rows * 4));
          all_w[r] = static_cast<const float*>(upload(weights.data(), rows * 4));
          if (layer0) {
            void* xd = alloc(r, tr * hidden * eb);
            fill_uniform(xd, o.dtype, tr * hidden, fill ^ 0x1, 1.0f, world.stream(r));
            x[r] = tr ? xd : nullptr;
            void* w = alloc(r, experts * n0 * hidden * eb);
            fill_uniform(w, o.dtype, experts * n0 * hidden, fill ^ 0x2, 3.0f / std::sqrt(float(hidden)), world.stream(r));
            w1[r] = w;
          }
          if (layer1) {
            if (!layer0) {
              void* hd = alloc(r, rows * ffn * eb);
              fill_uniform(hd, o.dtype, rows * ffn, fill ^ 0x3, 1.0f, world.stream(r));
              h1[r] = hd;
            }
            void* w = alloc(r, experts * hidden * ffn * eb);
            fill_uniform(w, o.dtype, experts * hidden * ffn, fill ^ 0x4, 3.0f / std::sqrt(float(ffn)), world.stream(r));
            w2[r] = w;
          }
          out_bytes[r] = (op == MoeBenchOp::kAgGemm ? rows * ffn : tr * hidden) * eb;
          out_f[r] = alloc(r, out_bytes[r]), out_u[r] = alloc(r, out_bytes[r]), out_b[r] = alloc(r, out_bytes[r]);
          CK(cudaMemsetAsync(out_f[r], 0xff, out_bytes[r], world.stream(r)));
          CK(cudaMemsetAsync(out_u[r], 0xff, out_bytes[r], world.stream(r)));
          CK(cudaMemsetAsync(out_b[r], 0xff, out_bytes[r], world.stream(r)));
          if (out_bytes[r] == 0) out_f[r] = out_u[r] = out_b[r] = nullptr;
        }
        world.sync("inputs");
        std::unique_ptr<tlc::MoeAgGemm> l0;
        std::unique_ptr<tlc::MoeGemmRs> l1;
        std::unique_ptr<tlc::MoeMlp> mlp;
        if (op == MoeBenchOp::kAgGemm) l0 = std::make_unique<tlc::MoeAgGemm>(world, parts, hidden, ffns, experts, topk, o.dtype);
        if (op == MoeBenchOp::kGemmRs) {
          l1 = std::make_unique<tlc::MoeGemmRs>(world, parts, hidden, ffns, experts, topk, o.dtype);
          l1->set_reduce_beside_gemm(o.reduce_beside);
          if (o.completion_keys > 0) l1->set_completion_keys(o.completion_keys);
        }
        if (op == MoeBenchOp::kMlp) mlp = std::make_unique<tlc::MoeMlp>(world, parts, hidden, ffns, experts, topk, o.dtype);
        auto call = [&](bool fused, const std::vector<void*>& out) {
          if (l0) fused ? l0->run(x, my_ids, my_w, w1, out) : l0->run_unfused(x, my_ids, my_w, w1, out);
          if (l1) fused ? l1->run(h1, all_ids, all_w, w2, out) : l1->run_unfused(h1, all_ids, all_w, w2, out);
          if (mlp) fused ? mlp->run(x, my_ids, my_w, w1, w2, out) : mlp->run_unfused(x, my_ids, my_w, w1, w2, out);
        };
        auto call_loop = [&] {  // baseline (b)
          if (l0) l0->run_expert_loop(x, my_ids, my_w, w1, out_b);
          if (l1) l1->run_expert_loop(h1, all_ids, all_w, w2, out_b);
          if (mlp) mlp->run_expert_loop(x, my_ids, my_w, w1, w2, out_b);
        };
        // the check: one call of each path, every rank's output bit for bit, none left poisoned
        call(true, out_f);
        world.sync(name);
        call(false, out_u);
        world.sync(name);
        call_loop();
        world.sync(name);
        bool same = true;
        double err_b = 0;  // the loop against the unfused path, the worst rank
        for (int r = 0; r < W; ++r) {
          if (out_bytes[r] == 0) continue;
          world.bind(r);
          const std::vector<std::byte> a = read_back(out_b[r], out_bytes[r]), b = read_back(out_u[r], out_bytes[r]);
          err_b = std::max(err_b, rel_error(a.data(), b.data(), o.dtype, out_bytes[r] / eb));
        }
        // NCCL's ReduceScatter (layer 1 and the MLP on peer) sums in its own order: there fused is held
        // to the tolerance against unfused instead of bit for bit.
        const bool nccl_sum = transport == tlc::Transport::kPeer && op != MoeBenchOp::kAgGemm;
        for (int r = 0; r < W && same; ++r) {
          if (out_bytes[r] == 0) continue;
          world.bind(r);
          const std::vector<std::byte> a = read_back(out_f[r], out_bytes[r]), b = read_back(out_u[r], out_bytes[r]);
          same = nccl_sum ? rel_error(a.data(), b.data(), o.dtype, out_bytes[r] / eb) <= tolerance(op) : a == b;
          for (size_t i = 0; i + 1 < a.size() && same; i += 2)
            same = !(a[i] == std::byte{0xff} && a[i + 1] == std::byte{0xff});
        }
        std::vector<double> tu, tf, tc, tk, tb;
        for (int i = 0; i < o.warmup + o.reps; ++i) {
          const double u = timed_ms(world, name, [&] { call(false, out_u); });
          const double lb = timed_ms(world, name, call_loop);
          const double f = timed_ms(world, name, [&] { call(true, out_f); });
          double c = 0, k = 0;
          if (l0) {
            c = timed_ms(world, "comm alone", [&] { l0->run_comm_only(x, my_ids, my_w); });
            k = timed_ms(world, "compute alone", [&] { l0->run_compute_only(w1, out_f); });
          }
          if (l1) {
            k = timed_ms(world, "compute alone", [&] { l1->run_compute_only(h1, all_ids, all_w, w2); });
            c = timed_ms(world, "comm alone", [&] { l1->run_comm_only(out_f); });
          }
          if (i < o.warmup) continue;
          tu.push_back(u), tf.push_back(f), tc.push_back(c), tk.push_back(k), tb.push_back(lb);
        }
        const double u = median_of(tu), f = median_of(tf), c = median_of(tc), k = median_of(tk), b = median_of(tb);
        const bool loop_ok = err_b <= tolerance(op);
        const bool parts_timed = !mlp;
        const double overlap = parts_timed && std::min(c, k) > 0 ? (c + k - f) / std::min(c, k) : 0.0;
        speedups.push_back(u / f);
        const std::string auto_path =
            op_path_name(l0 ? l0->choose().path : l1 ? l1->choose().path : mlp->choose().path);
        const char* check = same && loop_ok ? "ok" : "FAIL";
        if (parts_timed) {
          std::printf("%-13s %6lld %-13s | %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f | %7.3f %7.3f %7.2f | %8.1e %5s | %s\n",
                      model.name, (long long)tokens, moe_routing_name(pattern), u, b, f, c, k, std::max(c, k), u / f,
                      b / f, overlap, err_b, check, auto_path.c_str());
        } else {
          std::printf("%-13s %6lld %-13s | %9.4f %9.4f %9.4f %9s %9s %9s | %7.3f %7.3f %7s | %8.1e %5s | %s\n",
                      model.name, (long long)tokens, moe_routing_name(pattern), u, b, f, "-", "-", "-", u / f, b / f,
                      "-", err_b, check, auto_path.c_str());
        }
        std::fflush(stdout);
        all_ok = all_ok && same && loop_ok;
      }
    }
  }
  if (!speedups.empty()) {
    std::sort(speedups.begin(), speedups.end());
    std::printf("# fused / unfused: median %.3f, min %.3f\n", median_of(speedups), speedups.front());
  }
  std::printf("# check %s\n", all_ok ? "PASSED" : "FAILED");
  return all_ok ? 0 : 1;
}

int bench_moe(MoeBenchOp op, Args& args) {
  const std::string name = std::string("bench ") + op_name(op);
  const std::vector<std::string> model_names = split_list(args.get("--models", ""));
  const std::vector<int64_t> tokens_list = args.get_int_list("--tokens", {2048, 8192});
  const std::vector<std::string> routing_names =
      split_list(args.get("--routing", "uniform,skewed"));
  CaseOptions o;
  o.op = op;
  o.world = args.get_int_in("--world", 1, 1, 1024);
  o.reps = static_cast<int>(args.get_int_in("--reps", 10, 1, 100000));
  o.warmup = static_cast<int>(args.get_int_in("--warmup", 2, 0, 100000));
  o.seed = static_cast<uint64_t>(args.get_int("--seed", 1));
  o.dtype = DType::kBF16;
  TL_REQUIRE(parse_dtype(args.get("--dtype", "bf16"), &o.dtype) && o.dtype != DType::kF32,
             name << ": --dtype must be bf16 or fp16");
  const bool check_flag = args.flag("--check"), no_check = args.flag("--no-check");
  const bool csv = args.flag("--csv");
  const std::string fused = args.get("--fused", "gathered");
  o.gather_sms = static_cast<int>(args.get_int_in("--gather-sms", 0, 0, 1024));
  o.ahead_waves = static_cast<int>(args.get_int("--ahead-waves", -1));
  TL_REQUIRE(o.ahead_waves == -1 || (o.ahead_waves >= 0 && o.ahead_waves <= 1000000),
             name << ": --ahead-waves must be in [0, 1000000], got " << o.ahead_waves);
  const std::string reduce = args.get("--reduce", "after");
  o.completion_keys = static_cast<int>(args.get_int_in("--completion-keys", 0, 0, kMoeOrderKeys));
  o.transport = args.get("--transport", "auto");
  args.finish();
  require_one_process_transport_name(o.transport, name);
  TL_REQUIRE(o.world > 1 || o.transport == "auto", name << ": --transport applies to --world W > 1");
  TL_REQUIRE(reduce == "beside" || reduce == "after",
             name << ": --reduce must be beside or after, got '" << reduce << "'");
  o.reduce_beside = reduce == "beside";
  TL_REQUIRE(fused == "overlap" || fused == "gathered" || fused == "ahead" || fused == "auto",
             name << ": --fused must be gathered, overlap, ahead or auto, got '" << fused << "'");
  TL_REQUIRE(fused != "auto" || o.world == 1, name << ": --fused auto applies at --world 1");
  o.fused = fused == "overlap" ? MoePath::kOverlap
            : fused == "ahead" ? MoePath::kAhead
            : fused == "auto"  ? MoePath::kAuto
                               : MoePath::kFused;
  TL_REQUIRE(!(check_flag && no_check), name << ": --check and --no-check both given");
  o.check = !no_check;

  // ---- the cases, checked before the device is touched ----
  const std::vector<MoeModel> selected = select_moe_models(model_names, name.c_str());
  std::vector<size_t> models;  // indices into kMoeModels (a case's seed takes its index)
  for (size_t i = 0; i < std::size(kMoeModels); ++i)
    for (const MoeModel& m : selected)
      if (std::string(m.name) == kMoeModels[i].name) models.push_back(i);
  TL_REQUIRE(!tokens_list.empty(), name << ": --tokens is empty");
  for (int64_t tk : tokens_list)
    TL_REQUIRE(tk >= 1 && tk <= (int64_t{1} << 20),
               name << ": --tokens must be in [1, 2^20], got " << tk);
  std::vector<MoeRoutingPattern> patterns;
  for (const std::string& r : routing_names) patterns.push_back(moe_routing_pattern(r));
  TL_REQUIRE(!patterns.empty(), name << ": --routing is empty");

  if (o.world > 1) {
    TL_REQUIRE(o.world <= 8, name << ": --world takes 1 to 8 ranks, got " << o.world);
    return bench_moe_ranks(o, models, tokens_list, patterns);
  }

  // ---- the device ----
  const BenchGpu gpu = require_sm90_gpu(name);
  const int l2 = gpu.l2, sms = gpu.sms;
  const cudaDeviceProp& prop = gpu.prop;
  const std::string dname(dtype_name(o.dtype));
  std::printf(
      "# device: %s, %d SMs, L2 %d MB; %s, world 1 (each expert's whole F); fused: %s; %s; reps "
      "%d, warmup %d, seed %llu; gather SMs %s; ahead waves %s; L2 flushed before every call; ms: medians; fus/a, fus/b: the "
      "baseline's ms over fused's; gather_ms: layer 0's gather kernel alone, ceil: a_ms / (a_ms - gather_ms); check %s\n",
      prop.name, sms, l2 >> 20, op_name(op), cuda::moe_path_name(o.fused), dname.c_str(), o.reps,
      o.warmup, (unsigned long long)o.seed,
      o.gather_sms > 0 ? std::to_string(o.gather_sms).c_str() : "default",
      o.ahead_waves >= 0 ? std::to_string(o.ahead_waves).c_str() : "default", o.check ? "on" : "off (--no-check)");
  if (op == MoeBenchOp::kGemmRs)
    std::printf(
        "# moe_gemm_rs at world 1: fused and (a) are the same kernels (the grouped GEMM into Y, "
        "then the top-k reduce; no ReduceScatter on one GPU), so fus/a is their A/A\n");

  const BenchStream ctx(static_cast<size_t>(l2));

  if (csv) {
    std::printf(
        "model,tokens,routing,rows,fused_ms,unfused_ms,loop_ms,dense_ms,gather_ms,fused_over_a,"
        "ceil_over_a,fused_over_b,fused_tflops,err_b,err_f64,check,path\n");
  } else {
    std::printf("%-13s %6s %-13s %6s | %9s %9s %9s %9s %9s | %6s %6s %6s | %6s | %8s %8s %5s | %s\n",
                "model", "tokens", "routing", "rows", "fused_ms", "a_ms", "b_ms", "dense_ms", "gather_ms",
                "fus/a", "ceil", "fus/b", "fus_TF", "err_b", "err_f64", "check", "path");
  }
  std::vector<double> over_a, over_b, ceils;
  bool all_ok = true;
  for (size_t model_index : models) {
    const MoeModel& model = kMoeModels[model_index];
    for (int64_t tokens : tokens_list) {
      for (MoeRoutingPattern pattern : patterns) {
        const CaseRow row = bench_case(ctx, o, model_index, model, tokens, pattern);
        const bool ok = row.why.empty();
        all_ok = all_ok && ok;
        if (!ok)
          std::printf("# FAIL %s tokens %lld %s:%s\n", model.name, (long long)tokens,
                      moe_routing_name(pattern), row.why.c_str());
        const double ra = row.ms[kUnfused] / row.ms[kFused], rb = row.ms[kLoop] / row.ms[kFused];
        over_a.push_back(ra);
        over_b.push_back(rb);
        const double tf = row.ms[kFused] > 0 ? row.flop / (row.ms[kFused] * 1e-3) / 1e12 : 0.0;
        const double g = row.ms[kGather];
        const double ceil = g > 0 && g < row.ms[kUnfused] ? row.ms[kUnfused] / (row.ms[kUnfused] - g) : 1.0;
        ceils.push_back(ceil);
        auto err = [](double e) { return e >= 0 ? fmt("%.2e", e) : std::string("-"); };
        const char* check = o.check ? (ok ? "ok" : "FAIL") : "-";
        if (csv) {
          std::printf("%s,%lld,%s,%lld,%.4f,%.4f,%.4f,%.4f,%.4f,%.3f,%.3f,%.3f,%.1f,%s,%s,%s,%s\n", model.name,
                      (long long)tokens, moe_routing_name(pattern), (long long)row.rows,
                      row.ms[kFused], row.ms[kUnfused], row.ms[kLoop], row.ms[kDense], g, ra, ceil, rb, tf,
                      err(row.err_b).c_str(), err(row.err_f64).c_str(), check, cuda::moe_path_name(row.path));
        } else {
          std::printf(
              "%-13s %6lld %-13s %6lld | %9.4f %9.4f %9.4f %9.4f %9.4f | %6.3f %6.3f %6.3f | %6.1f | %8s %8s "
              "%5s | %s\n",
              model.name, (long long)tokens, moe_routing_name(pattern), (long long)row.rows,
              row.ms[kFused], row.ms[kUnfused], row.ms[kLoop], row.ms[kDense], g, ra, ceil, rb, tf,
              err(row.err_b).c_str(), err(row.err_f64).c_str(), check, cuda::moe_path_name(row.path));
        }
        std::fflush(stdout);
      }
    }
  }

  auto med_min = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const double med =
        v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    return std::pair<double, double>{med, v.front()};
  };
  if (!over_a.empty()) {
    const auto [a_med, a_min] = med_min(over_a);
    const auto [b_med, b_min] = med_min(over_b);
    std::printf("# fused / (a)%s: median %.3f, min %.3f\n",
                op == MoeBenchOp::kGemmRs ? " (the same kernels: A/A)" : "", a_med, a_min);
    std::printf("# fused / (b) per-expert cuBLAS loop: median %.3f, min %.3f\n", b_med, b_min);
    if (op != MoeBenchOp::kGemmRs) {
      const auto [c_med, c_min] = med_min(ceils);
      std::printf("# ceil (a_ms / (a_ms - gather_ms), the most a fused layer 0 removes): median %.3f, min %.3f\n",
                  c_med, c_min);
    }
  }
  std::printf("# check %s\n", o.check ? (all_ok ? "PASSED" : "FAILED") : "skipped (--no-check)");
  return all_ok ? 0 : 1;
}

const char* kUsage =
    "[--models mixtral-8x7b,mixtral-8x22b,qwen1.5-moe,deepseek-moe,deepseek-v3,qwen3-30b-a3b] "
    "[--tokens M,...] [--routing uniform,skewed,one-expert,empty-experts] [--world W (1: the layer on one GPU; 2-8: ranks)] "
    "[--transport auto|virtual|peer (over ranks; auto: peer where there is a GPU a rank)] "
    "[--dtype bf16|fp16] [--seed S] [--reps R] [--warmup W] [--check|--no-check] [--csv] "
    "[--fused gathered|overlap|ahead|auto (world 1: the layer's own choice)] [--gather-sms N (overlap: SMs of the gather kernel)] "
    "[--ahead-waves W (ahead: the waves whose rows every warp copies first)] "
    "[--reduce beside|after (moe_gemm_rs over ranks: its top-k reduce beside or after the grouped GEMM)] "
    "[--completion-keys K (beside: the phases of the GEMM's walk, 1-64)]";
const std::vector<std::string> kFlags{"--check", "--no-check", "--csv"};

}  // namespace

TILELINK_REGISTER_COMMAND(
    "bench moe_ag_gemm", kUsage,
    "MoE layer 0 on one GPU (route + grouped GEMM, X gathered in the load path) vs the unfused "
    "pipeline, a per-expert cuBLAS loop and a dense GEMM; checked against (a) and float64; with --world W, "
    "AllGather + grouped GEMM over W ranks vs baseline (a), checked bit for bit",
    [](Args& args) { return bench_moe(MoeBenchOp::kAgGemm, args); }, kFlags);
TILELINK_REGISTER_COMMAND(
    "bench moe_gemm_rs", kUsage,
    "MoE layer 1 on one GPU (route + grouped GEMM + top-k reduce) vs a per-expert cuBLAS loop and "
    "a dense GEMM; checked against (a) and float64; with --world W, + ReduceScatter over W ranks "
    "vs baseline (a), checked bit for bit",
    [](Args& args) { return bench_moe(MoeBenchOp::kGemmRs, args); }, kFlags);
TILELINK_REGISTER_COMMAND(
    "bench moe_mlp", kUsage,
    "the whole MoE layer on one GPU (fused layer 0, SiLU(gate) * up, layer 1) vs the unfused "
    "pipeline, a per-expert cuBLAS loop and dense GEMMs; checked against (a) and float64; with --world W, "
    "over W ranks vs baseline (a), checked bit for bit",
    [](Args& args) { return bench_moe(MoeBenchOp::kMlp, args); }, kFlags);

}  // namespace tilelink::cli
