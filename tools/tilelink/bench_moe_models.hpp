// What `tilelink bench grouped_gemm` and `tilelink bench moe_*` share: the MoE models they time
// (the table of bench/torch_grouped_mm.py), the selection by --models, the small helpers of their
// tables, and (bench_stream.hpp) the timed stream with its cuBLAS handle and L2 flush.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "bench_stream.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cli {

struct MoeModel {
  const char* name;
  int64_t hidden, ffn;
  int experts, topk;
};
inline constexpr MoeModel kMoeModels[] = {
    {"mixtral-8x7b", 4096, 14336, 8, 2}, {"mixtral-8x22b", 6144, 16384, 8, 2},
    {"qwen1.5-moe", 2048, 1408, 60, 4},  {"deepseek-moe", 2048, 1408, 64, 6},
    {"deepseek-v3", 7168, 2048, 256, 8}, {"qwen3-30b-a3b", 2048, 768, 128, 8},
};

// Spare rows of a grouped output past the grouped rows (they must stay poisoned).
inline constexpr int64_t kSpareRows = 128;

inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// The models `names` lists (all where it is empty), in the table's order; an unknown name throws
// tilelink::Error listing the known ones.
inline std::vector<MoeModel> select_moe_models(const std::vector<std::string>& names, const char* who) {
  std::vector<MoeModel> out;
  for (const MoeModel& m : kMoeModels)
    if (names.empty() || std::find(names.begin(), names.end(), m.name) != names.end()) out.push_back(m);
  for (const std::string& name : names) {
    const bool known = std::any_of(std::begin(kMoeModels), std::end(kMoeModels),
                                   [&](const MoeModel& m) { return name == m.name; });
    if (!known) {
      std::string all;
      for (const MoeModel& m : kMoeModels) all += (all.empty() ? "" : ", ") + std::string(m.name);
      TL_REQUIRE(false, who << ": unknown model '" << name << "'; models: " << all);
    }
  }
  return out;
}

// The current device, refused (tilelink::Error naming `who`) unless it is an sm_90 GPU.
struct BenchGpu {
  int dev = 0, l2 = 0, sms = 0;
  cudaDeviceProp prop{};
};
inline BenchGpu require_sm90_gpu(const std::string& who) {
  int devices = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&devices);
  TL_REQUIRE(count_err == cudaSuccess && devices > 0,
             who << ": needs a CUDA GPU (sm_90) and found none ("
                 << (count_err == cudaSuccess ? "no device" : cudaGetErrorString(count_err)) << ")");
  BenchGpu g;
  TL_CUDA_CHECK(cudaGetDevice(&g.dev));
  TL_CUDA_CHECK(cudaDeviceGetAttribute(&g.l2, cudaDevAttrL2CacheSize, g.dev));
  TL_CUDA_CHECK(cudaDeviceGetAttribute(&g.sms, cudaDevAttrMultiProcessorCount, g.dev));
  TL_CUDA_CHECK(cudaGetDeviceProperties(&g.prop, g.dev));
  TL_REQUIRE(g.prop.major == 9, who << ": the grouped GEMM engine needs an sm_90 GPU; " << g.prop.name
                                    << " is sm_" << g.prop.major << g.prop.minor);
  return g;
}

inline cudaDataType_t cuda_type(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F; }

inline double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace tilelink::cli
