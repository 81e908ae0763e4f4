// tilelink bench allgather|reduce_scatter|allreduce: the comm plans as collectives on their own
// (comm/collectives_cuda.hpp), the nccl-tests way: per size, the time of one call, algbw = size /
// time and busbw = algbw * (W-1)/W (AllGather, ReduceScatter) or 2 (W-1)/W (AllReduce), and a
// check of every output element on the device (#wrong). Beside it, the baseline: the copy-engine
// AllGather of the same plan (every transport), and NCCL where it runs (not on virtual ranks:
// NCCL refuses two ranks on one GPU).
// Size, as nccl-tests: AllGather, the gathered bytes; ReduceScatter and AllReduce, one rank's input.
// Inputs are small integers (exact sums in bf16), so the check is exact.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/comm/collectives_cuda.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cli {

namespace {

namespace tlc = tilelink::cuda;

// Element i of rank r's input: a small integer, so sums over <= 64 ranks are exact in bf16.
__host__ __device__ inline float input_value(int r, int64_t i) {
  return static_cast<float>(static_cast<int>((r * 131 + i) % 17) - 8);
}

__global__ void fill_kernel(__nv_bfloat16* x, int64_t count, int rank, int64_t offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16_rn(input_value(rank, offset + i));
}

// mode 0 (gather): out[i] = input of rank i / seg at i % seg; mode 1 (sum): out[i] = sum over ranks
// of their input at offset + i. Counts the elements that differ into *bad.
__global__ void check_kernel(const __nv_bfloat16* out, int64_t count, int mode, int world, int64_t seg,
                             int64_t offset, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float want = 0;
    if (mode == 0) {
      want = input_value(static_cast<int>(i / seg), i % seg);
    } else {
      for (int s = 0; s < world; ++s) want += input_value(s, offset + i);
    }
    mine += __bfloat162float(out[i]) != want;
  }
  if (mine) atomicAdd(bad, mine);
}
TL_REGISTER_KERNELS(fill_kernel, check_kernel);

void fill(tlc::World& w, int r, void* x, int64_t count, int64_t offset) {
  w.bind(r);
  fill_kernel<<<256, 256, 0, w.stream(r)>>>(static_cast<__nv_bfloat16*>(x), count, r, offset);
  TL_CUDA_CHECK(cudaGetLastError());
}

uint64_t count_bad(tlc::World& w, int r, const void* out, int64_t count, int mode, int64_t seg, int64_t offset) {
  w.bind(r);
  unsigned long long* bad = nullptr;
  TL_CUDA_CHECK(cudaMalloc(&bad, sizeof(*bad)));
  TL_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(*bad), w.stream(r)));
  check_kernel<<<256, 256, 0, w.stream(r)>>>(static_cast<const __nv_bfloat16*>(out), count, mode, w.size(), seg,
                                             offset, bad);
  TL_CUDA_CHECK(cudaGetLastError());
  unsigned long long host = 0;
  TL_CUDA_CHECK(cudaMemcpyAsync(&host, bad, sizeof(host), cudaMemcpyDeviceToHost, w.stream(r)));
  TL_CUDA_CHECK(cudaStreamSynchronize(w.stream(r)));
  TL_CUDA_CHECK(cudaFree(bad));
  return host;
}

// Median over 5 batches of the host wall time of one call (us), after `warmup` calls.
double time_us(tlc::World& w, const char* op, int warmup, int iters, const std::function<void()>& call) {
  for (int i = 0; i < warmup; ++i) call();
  w.sync(op);
  std::vector<double> t;
  for (int b = 0; b < 5; ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) call();
    w.sync(op);
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

// TILELINK_CLI_TRACE=1: each step on stderr with the wall clock, flushed: where a hang sits.
void trace(const char* step, int64_t bytes) {
  static const bool on = std::getenv("TILELINK_CLI_TRACE") != nullptr;
  if (!on) return;
  std::fprintf(stderr, "[trace %.3f] %s (%lld bytes)\n",
               std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(), step,
               static_cast<long long>(bytes));
  std::fflush(stderr);
}

struct Row {
  int64_t bytes;
  double us, base_us = NAN;
  uint64_t wrong;
};

// Per-rank device buffers, freed in their contexts.
struct Outputs {
  tlc::World& w;
  std::vector<void*> p;
  Outputs(tlc::World& world, const std::vector<int64_t>& bytes) : w(world), p(world.size(), nullptr) {
    for (int r : w.local_ranks()) {
      w.bind(r);
      TL_CUDA_CHECK(cudaMalloc(&p[r], std::max<int64_t>(bytes[r], 16)));
    }
  }
  ~Outputs() {
    for (int r : w.local_ranks()) w.bind(r), cudaFree(p[r]);
  }
};

int bench_coll(Args& args, const std::string& coll) {
  const int world_size = static_cast<int>(args.get_int("--world", 2));
  const int64_t min_bytes = args.get_int("--min-bytes", 4 << 10);
  const int64_t max_bytes = args.get_int("--max-bytes", int64_t{1} << 30);
  const int64_t step = args.get_int("--step", 4);
  const int warmup = static_cast<int>(args.get_int("--warmup", 3));
  const int iters = static_cast<int>(args.get_int("--iters", 20));
  const std::string variant = args.get("--variant", "two-shot");
  const int64_t timeout_ms = args.get_int("--timeout-ms", 20000);
  args.finish();
  TL_REQUIRE(world_size >= 2 && world_size <= 64, "--world must be in [2, 64], got " << world_size);
  TL_REQUIRE(min_bytes >= 1024 && max_bytes >= min_bytes && max_bytes <= (int64_t{8} << 30),
             "--min-bytes must be >= 1024 and <= --max-bytes <= 8 GiB");
  TL_REQUIRE(step >= 2, "--step must be >= 2");
  TL_REQUIRE(warmup >= 0 && iters >= 1, "--warmup must be >= 0 and --iters >= 1");
  TL_REQUIRE(variant == "one-shot" || variant == "two-shot", "--variant must be one-shot or two-shot");
  TL_REQUIRE(timeout_ms >= 1, "--timeout-ms must be >= 1");
  tlc::World w({.transport = tlc::Transport::kVirtual, .world_size = world_size,
                .timeout = std::chrono::milliseconds(timeout_ms)});
  const int W = world_size;
  const double factor = coll == "allreduce" ? 2.0 * (W - 1) / W : static_cast<double>(W - 1) / W;
  const bool ag = coll == "allgather";
  std::vector<Row> rows;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= step) {
    // Rows of `cols` bf16: 256 for small sizes, 4096 from 1 MiB on; the row count rounded down to
    // a multiple of W so every rank holds the same share (as nccl-tests' counts).
    const int64_t cols = bytes >= (1 << 20) ? 4096 : 256;
    const int64_t m = std::max<int64_t>(W, bytes / (cols * 2) / W * W);
    const int64_t size = m * cols * 2;
    const RowPartition part = RowPartition::even(m, W);
    Row row{size, 0, NAN, 0};
    if (ag) {
      std::vector<int64_t> in_bytes(W, part.size(0) * cols * 2);
      Outputs in(w, in_bytes);
      std::vector<const void*> a(W);
      for (int r : w.local_ranks()) fill(w, r, in.p[r], part.size(r) * cols, 0), a[r] = in.p[r];
      // SMs: tiles small enough that every block of every rank has several (a block moves a tile);
      // copy engine: one tile a segment (each tile costs a stream wait, a copy and a notify).
      const int sm_tile = static_cast<int>(std::clamp<int64_t>(m / (4 * w.sm_count(0)), 1, 4096));
      const int ce_tile = static_cast<int>(std::min<int64_t>(part.size(0), 1 << 20));
      trace("allgather: making the SM and copy-engine collectives", size);
      tlc::AllGatherCollective sm(w, part, cols, false, sm_tile), ce(w, part, cols, true, ce_tile);
      trace("allgather: timing the SM collective", size);
      row.us = time_us(w, "allgather", warmup, iters, [&] { sm.run(a); });
      trace("allgather: checking", size);
      for (int r : w.local_ranks()) row.wrong += count_bad(w, r, sm.gathered(r), m * cols, 0, part.size(0) * cols, 0);
      trace("allgather: timing the copy-engine collective", size);
      row.base_us = time_us(w, "allgather(copy engine)", warmup, iters, [&] { ce.run(a); });
      for (int r : w.local_ranks()) row.wrong += count_bad(w, r, ce.gathered(r), m * cols, 0, part.size(0) * cols, 0);
    } else if (coll == "reduce_scatter") {
      tlc::ReduceScatterCollective rs(w, part, cols);
      std::vector<int64_t> out_bytes(W);
      for (int r = 0; r < W; ++r) out_bytes[r] = part.size(r) * cols * 2;
      Outputs out(w, out_bytes);
      for (int r : w.local_ranks()) fill(w, r, rs.input(r), m * cols, 0);
      row.us = time_us(w, "reduce_scatter", warmup, iters, [&] { rs.run(out.p); });
      for (int r : w.local_ranks())
        row.wrong += count_bad(w, r, out.p[r], part.size(r) * cols, 1, 0, part.begin(r) * cols);
    } else {
      tlc::AllReduceCollective ar(w, m, cols, variant == "one-shot" ? AllReduceAlgo::kOneShot : AllReduceAlgo::kTwoShot);
      Outputs out(w, std::vector<int64_t>(W, size));
      for (int r : w.local_ranks()) fill(w, r, ar.input(r), m * cols, 0);
      row.us = time_us(w, "allreduce", warmup, iters, [&] { ar.run(out.p); });
      for (int r : w.local_ranks()) row.wrong += count_bad(w, r, out.p[r], m * cols, 1, 0, 0);
    }
    rows.push_back(row);
  }
  std::printf("# tilelink bench %s: world %d, virtual ranks (%d SMs each), bf16, %s%s\n", coll.c_str(), W,
              w.sm_count(0), ag ? "SM bulk copies vs the copy engine" : "SM reduce, every SM of the rank",
              coll == "allreduce" ? (", " + variant).c_str() : "");
  std::printf("| size (B) | count (elems) | type | time (us) | algbw (GB/s) | busbw (GB/s) | #wrong |%s\n",
              ag ? " copy engine time (us) | copy engine busbw (GB/s) |" : "");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |%s\n", ag ? " --- | --- |" : "");
  uint64_t wrong = 0;
  for (const Row& r : rows) {
    const double algbw = r.bytes / (r.us * 1e3);
    std::printf("| %lld | %lld | bf16 | %.1f | %.2f | %.2f | %llu |", static_cast<long long>(r.bytes),
                static_cast<long long>(r.bytes / 2), r.us, algbw, algbw * factor,
                static_cast<unsigned long long>(r.wrong));
    if (ag) std::printf(" %.1f | %.2f |", r.base_us, r.bytes / (r.base_us * 1e3) * factor);
    std::printf("\n");
    wrong += r.wrong;
  }
  std::printf("%s\n", wrong ? "CHECK FAILED" : "check passed (every element of every rank's output)");
  return wrong ? 1 : 0;
}

const char* kCollUsage =
    "[--world W] [--min-bytes B (4 KiB)] [--max-bytes B (1 GiB)] [--step F (4)] [--warmup N] [--iters N] "
    "[--timeout-ms T] [--variant one-shot|two-shot (allreduce)]";

}  // namespace

TILELINK_REGISTER_COMMAND("bench allgather", kCollUsage,
                          "the row AllGather comm plan as a collective on virtual ranks, vs the copy engine",
                          [](Args& a) { return bench_coll(a, "allgather"); });
TILELINK_REGISTER_COMMAND("bench reduce_scatter", kCollUsage,
                          "the row ReduceScatter comm plan as a collective on virtual ranks",
                          [](Args& a) { return bench_coll(a, "reduce_scatter"); });
TILELINK_REGISTER_COMMAND("bench allreduce", kCollUsage,
                          "the AllReduce comm plan (one-shot or two-shot) as a collective on virtual ranks",
                          [](Args& a) { return bench_coll(a, "allreduce"); });

}  // namespace tilelink::cli
