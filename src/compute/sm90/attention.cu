// The sm_90a attention engine, forward (compute/sm90/attention.hpp for the contract): the argument
// checks and the plain engine's instances (impl/attention_kernel.cuh for the kernel).
#include "tilelink/compute/sm90/impl/attention_kernel.cuh"

namespace tilelink::compute::sm90 {

void attention_check(const AttnArgs& a) {
  TL_REQUIRE(a.q != nullptr && a.k != nullptr && a.v != nullptr && a.o != nullptr,
             "sm90 attention: q, k, v and o must all be given");
  TL_REQUIRE(a.dtype == DType::kBF16 || a.dtype == DType::kF16,
             "sm90 attention: dtype must be bf16 or fp16, got " << dtype_name(a.dtype));
  TL_REQUIRE(a.batch >= 1 && a.batch <= 65535, "sm90 attention: batch must be in [1, 65535], got " << a.batch);
  TL_REQUIRE((a.seq_q + kAttnBlockM - 1) / kAttnBlockM * a.heads_q * a.batch < (int64_t{1} << 31),
             "sm90 attention: batch x heads_q x query blocks must be below 2^31");
  TL_REQUIRE(a.num_sms >= 0, "sm90 attention: num_sms must be >= 0 (0: every SM), got " << a.num_sms);
  TL_REQUIRE(a.seq_q >= 1 && a.seq_k >= 1,
             "sm90 attention: seq_q and seq_k must be >= 1, got " << a.seq_q << " and " << a.seq_k);
  TL_REQUIRE(a.seq_q < (int64_t{1} << 31) && a.seq_k < (int64_t{1} << 31),
             "sm90 attention: sequences must be shorter than 2^31 rows");
  TL_REQUIRE(a.heads_q >= 1 && a.heads_q <= 65535 && a.heads_kv >= 1,
             "sm90 attention: heads_q must be in [1, 65535] and heads_kv >= 1, got " << a.heads_q << " and "
                                                                                    << a.heads_kv);
  TL_REQUIRE(a.heads_q % a.heads_kv == 0, "sm90 attention: heads_q (" << a.heads_q
                                                                     << ") must be a multiple of heads_kv ("
                                                                     << a.heads_kv << ")");
  TL_REQUIRE(a.head_dim == 64 || a.head_dim == 128, "sm90 attention: head_dim must be 64 or 128, got " << a.head_dim);
  const int64_t all[] = {a.q_stride_b, a.q_stride_s, a.q_stride_h, a.k_stride_b, a.k_stride_s, a.k_stride_h,
                         a.v_stride_b, a.v_stride_s, a.v_stride_h, a.o_stride_b, a.o_stride_s, a.o_stride_h};
  const char* names[] = {"q_stride_b", "q_stride_s", "q_stride_h", "k_stride_b", "k_stride_s", "k_stride_h",
                         "v_stride_b", "v_stride_s", "v_stride_h", "o_stride_b", "o_stride_s", "o_stride_h"};
  for (int i = 0; i < 12; ++i)
    TL_REQUIRE(all[i] >= 0 && all[i] % 8 == 0,
               "sm90 attention: " << names[i] << " must be a non-negative multiple of 8 elements, got " << all[i]);
  for (int t = 0; t < 4; ++t) {
    const bool packed = all[3 * t] == 0 && all[3 * t + 1] == 0 && all[3 * t + 2] == 0;
    TL_REQUIRE(packed || (all[3 * t] > 0 && all[3 * t + 1] > 0 && all[3 * t + 2] > 0),
               "sm90 attention: give all three strides of " << "qkvo"[t] << " or none (packed)");
  }
  const void* ptrs[] = {a.q, a.k, a.v, a.o};
  for (int t = 0; t < 4; ++t)
    TL_REQUIRE(reinterpret_cast<uintptr_t>(ptrs[t]) % 16 == 0,
               "sm90 attention: " << "qkvo"[t] << " must be 16-byte aligned (TMA)");
  TL_REQUIRE(!a.merge || a.lse != nullptr, "sm90 attention: merge folds into O and lse: lse must be given");
  TL_REQUIRE(a.scale >= 0.f && std::isfinite(a.scale), "sm90 attention: scale must be finite and >= 0 (0: 1/sqrt(D))");
  int dev = 0, major = 0, minor = 0;
  TL_SM90_CUDA_CHECK(cudaGetDevice(&dev));
  TL_SM90_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TL_SM90_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  TL_REQUIRE(major == 9 && minor == 0,
             "sm90 attention: needs an sm_90 GPU (H100/H200), the current device is sm_" << major << minor);
}

void attention_forward(const AttnArgs& a, cudaStream_t stream) {
  attn_detail::launch_checked(a, NoAttnHooks{}, stream);
}

double attention_flops(const AttnArgs& a) {
  double pairs = 0;
  if (!a.causal) {
    pairs = static_cast<double>(a.seq_q) * static_cast<double>(a.seq_k);
  } else {
    for (int64_t i = 0; i < a.seq_q; ++i) {
      const int64_t visible = std::min<int64_t>(a.seq_k, std::max<int64_t>(0, a.q_pos0 + i - a.kv_pos0 + 1));
      pairs += static_cast<double>(visible);
    }
  }
  return 4.0 * a.batch * a.heads_q * a.head_dim * pairs;
}

}  // namespace tilelink::compute::sm90
