// The plain engine (every tile it runs) for cutlass::bfloat16_t inputs, float output.
#include "instances.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"

TL_SM90_PLAIN_GEMM_INSTANCE(cutlass::bfloat16_t, float, gemm_bf16_f32)
