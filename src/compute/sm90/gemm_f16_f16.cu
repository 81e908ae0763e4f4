// The plain engine (every tile it runs) for cutlass::half_t inputs, __half output.
#include "instances.hpp"
#include "tilelink/compute/sm90/impl/gemm_kernel.cuh"

TL_SM90_PLAIN_GEMM_INSTANCE(cutlass::half_t, __half, gemm_f16_f16)
