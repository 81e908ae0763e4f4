// The float64 reference of a MoE layer on sampled output rows, for `tilelink bench moe_*`, whose
// layers are too large for the whole reference on the host (deepseek-v3 at 8192 tokens: 65536
// grouped rows of 7168 x 2048 products). The references themselves are compute/cpu_moe.hpp's; this
// picks the rows, reads only the inputs they need and runs the experts on host threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "tilelink/compute/cpu_moe.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/ops/moe_routing.hpp"

namespace tilelink::cli {

// The layers the MoE benches time: layer 0 (the grouped GEMM over gathered tokens), layer 1 (the
// grouped GEMM and the top-k reduce) and the whole MLP.
enum class MoeBenchOp { kAgGemm, kGemmRs, kMlp };

// Grouped rows (layer 0) or tokens the float64 check samples a case, and the host threads that
// evaluate their references.
inline constexpr int64_t kMoeSamples = 16;
inline constexpr size_t kMoeRefThreads = 16;

// Element i of a buffer of type t, as an address.
inline const std::byte* element_at(const void* p, int64_t i, DType t) {
  return static_cast<const std::byte*>(p) + i * dtype_size(t);
}
inline std::byte* element_at(void* p, int64_t i, DType t) {
  return static_cast<std::byte*>(p) + i * dtype_size(t);
}

// A MoE layer's inputs (device memory in the bench, any memory `read` can copy from) and shape.
struct MoeSampleInputs {
  MoeBenchOp op;
  DType dtype;
  int64_t tokens, hidden, ffn;  // ffn: this GPU's F
  int experts, topk;
  const void* x = nullptr;   // [tokens, H] (layer 0, mlp)
  const void* w1 = nullptr;  // [E, F, H] (layer 0) or [E, 2F, H] (mlp)
  const void* h1 = nullptr;  // [rows, F] (layer 1)
  const void* w2 = nullptr;  // [E, H, F] (layer 1, mlp)
  int64_t n0() const { return op == MoeBenchOp::kMlp ? 2 * ffn : ffn; }  // layer 0's N
  int64_t out_cols() const { return op == MoeBenchOp::kAgGemm ? ffn : hidden; }
};

// Float64 references of sampled output rows: kMoeSamples grouped rows of layer 0, or kMoeSamples
// tokens' rows of [tokens, H]. Evaluated an expert at a time: its weights read back once (a slice
// of W1 or W2), its sampled pairs made a one-expert routing (top-1, pair i on grouped row i) and
// handed to cpu_moe's references, each pair's result (weighted for the layers with a reduce) summed
// into its sample's row. read(dst, src, bytes) copies bytes of the inputs to the host (the bench:
// cudaMemcpy); it is called from several threads at once. Its exceptions reach the caller.
struct SampledReference {
  std::vector<int64_t> rows;  // the sampled rows of the output, ascending
  std::vector<double> want;   // [rows.size(), out_cols]
};

template <class Read>
SampledReference sampled_reference(const MoeSampleInputs& in, const MoeRouting& route,
                                   std::span<const int32_t> ids, std::span<const float> weights,
                                   std::mt19937_64& gen, Read&& read) {
  const bool layer0 = in.op == MoeBenchOp::kAgGemm;
  const int64_t population = layer0 ? route.rows() : in.tokens, cols = in.out_cols();
  const DType t = in.dtype;
  SampledReference s;
  std::vector<int64_t> all(population);
  std::iota(all.begin(), all.end(), int64_t{0});
  std::sample(all.begin(), all.end(), std::back_inserter(s.rows), std::min(kMoeSamples, population),
              gen);
  s.want.assign(s.rows.size() * cols, 0.0);

  // The pairs each sample needs, by expert: a grouped row's pair, or a token's top-k pairs.
  struct Use {
    int64_t pair, sample;
  };
  std::map<int, std::vector<Use>> by_expert;
  for (int64_t si = 0; si < static_cast<int64_t>(s.rows.size()); ++si) {
    if (layer0) {
      const int64_t p = route.pair_of_row[s.rows[si]];
      by_expert[ids[p]].push_back({p, si});
    } else {
      for (int slot = 0; slot < in.topk; ++slot) {
        const int64_t p = s.rows[si] * in.topk + slot;
        by_expert[ids[p]].push_back({p, si});
      }
    }
  }

  // One expert's pairs, [pairs, cols]: row i is pair uses[i]'s (one expert: the grouped order is
  // the pairs' order).
  auto expert_reference = [&](int e, const std::vector<Use>& uses) {
    const int64_t np = static_cast<int64_t>(uses.size());
    const MoeRouting one = moe_route(std::vector<int32_t>(np, 0), np, 1, 1);
    // The GEMM's A rows of the pairs: X's row of the pair's token, or H1's row of the pair.
    const int64_t k_a = in.op == MoeBenchOp::kGemmRs ? in.ffn : in.hidden;
    std::vector<std::byte> a(np * k_a * dtype_size(t));
    std::vector<float> w(np);
    for (int64_t i = 0; i < np; ++i) {
      const int64_t src =
          in.op == MoeBenchOp::kGemmRs ? route.row_of_pair[uses[i].pair] : uses[i].pair / in.topk;
      const void* base = in.op == MoeBenchOp::kGemmRs ? in.h1 : in.x;
      read(element_at(a.data(), i * k_a, t), element_at(base, src * k_a, t), k_a * dtype_size(t));
      w[i] = weights[uses[i].pair];
    }
    std::vector<std::byte> w1e, w2e;
    if (in.op != MoeBenchOp::kGemmRs) {
      w1e.resize(in.n0() * in.hidden * dtype_size(t));
      read(w1e.data(), element_at(in.w1, e * in.n0() * in.hidden, t), w1e.size());
    }
    if (in.op != MoeBenchOp::kAgGemm) {
      w2e.resize(in.hidden * in.ffn * dtype_size(t));
      read(w2e.data(), element_at(in.w2, e * in.hidden * in.ffn, t), w2e.size());
    }
    if (in.op == MoeBenchOp::kAgGemm)
      return moe_layer0_f64(a.data(), one, w1e.data(), in.hidden, in.ffn, t);
    if (in.op == MoeBenchOp::kGemmRs)
      return moe_layer1_partial_f64(a.data(), one, w2e.data(), w, in.hidden, in.ffn, t);
    return moe_mlp_partial_f64(a.data(), one, w1e.data(), w2e.data(), w, in.hidden, in.ffn, t);
  };

  // The experts on a pool of threads, each taking the next expert. NOTE: the float64 references
  // run at ~0.3 GMAC/s a core, and the samples of mixtral-8x22b's MLP take ~10 GMAC: minutes on one
  // core. At most kMoeRefThreads experts' weights are on the host at once.
  const std::vector<std::pair<int, std::vector<Use>>> work(by_expert.begin(), by_expert.end());
  std::vector<std::vector<double>> results(work.size());
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    try {
      for (size_t i = next++; i < work.size(); i = next++)
        results[i] = expert_reference(work[i].first, work[i].second);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = work.size();
    }
  };
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, kMoeRefThreads);
  std::vector<std::thread> pool;
  for (size_t i = 0; i < std::min(threads, work.size()); ++i) pool.emplace_back(worker);
  for (std::thread& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  // Summed in expert order, so the reference does not depend on the threads.
  for (size_t k = 0; k < work.size(); ++k) {
    const std::vector<Use>& uses = work[k].second;
    for (size_t i = 0; i < uses.size(); ++i)
      for (int64_t j = 0; j < cols; ++j)
        s.want[uses[i].sample * cols + j] += results[k][i * cols + j];
  }
  return s;
}

}  // namespace tilelink::cli
