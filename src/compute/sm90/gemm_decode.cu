// The decode kernel (gemm.hpp, "Decode sizes"): C[M, N] (+)= A[M, K] * B[N, K]^T for M <=
// kDecodeMaxRows. gemm_decode runs this file's mma.sync form at M <= 16 where N >= 2048, and the
// wgmma form (gemm_decode_wgmma.cu) elsewhere. (A form of this kernel that staged A's chunks in
// shared memory for M 17-32 lost to the wgmma form on every shape measured: bench/notes/gemm.md,
// decode kernels.)
//
// A warp takes 16 rows of B (an n-group) over a range of K. Per step of 32 elements of K, lane
// (g = lane / 4, t = lane % 4) loads 16 bytes (8 elements, k0 + 8t ..) of B rows g and g + 8,
// and of A rows g (+ 8 e). mma.m16n8k16 (row.col) wants of each lane the
// A-side elements (row g / g + 8, k 2t, 2t + 1, 2t + 8, 2t + 9) and the B-side ones (k 2t, 2t + 1,
// 2t + 8, 2t + 9, column g): the lane's 8 loaded elements stand for exactly those k positions of
// two k16 steps (elements 0-3 the first step's, 4-7 the second's). That is a permutation of K,
// the same for both operands, so the sum is the product's. The MMA's M side is B's rows (N of C),
// its N side A's rows (M of C): one m16n8 per 8 rows of A.
//
// The 8 warps of a block take 1, 2 or 4 n-groups (decode_grid) and split K among those of a
// group; the blocks of a cluster (1-8, along x) split it further. Each warp leaves its fp32
// partials in its block's shared memory, and the cluster's first block adds them all (its own and
// the others', through distributed shared memory) in rank and warp order, then stores C (or adds
// into it) two columns at a time with the engine's store_pair / red_add_pair.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "cluster_launch.hpp"
#include "instances.hpp"
#include "tilelink/compute/sm90/impl/check_cuda.hpp"
#include "tilelink/compute/sm90/impl/gemm_epilogue.cuh"
#include "tilelink/core/error.hpp"

namespace tilelink::compute::sm90::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;        // a block
constexpr int kStepK = 32;       // elements of K a warp covers per step (4 lanes x 8)
constexpr int kMinWarpK = 512;   // the least K a warp takes when a cluster splits K
constexpr int kMaxCluster = 8;   // portable cluster size
constexpr int kBlocksPerSm = 2;  // resident (__launch_bounds__; <= 128 registers a thread)
constexpr int kSteps = 4;        // steps of K whose loads a warp issues before their MMAs
// This kernel takes M <= kMmaSyncMaxRows where N >= kMmaSyncMinN; the wgmma form
// (gemm_decode_wgmma.cu) takes the rest (bench/notes/gemm.md, decode kernels).
constexpr int64_t kMmaSyncMaxRows = 16;
constexpr int64_t kMmaSyncMinN = 2048;

template <class In, class Out>
struct DecodeParams {
  const In* a;
  const In* b;
  Out* c;
  int m, n, k;
  int64_t lda, ldb, ldc;
  int warp_k;   // elements of K a warp covers (a multiple of kStepK)
  int warps_n;  // warps of a block on different n-groups (the rest split K)
  bool reduce;
};

template <class In>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Where a warp of either kernel works: its n-group (16 rows of B from n0) and its range of K
// [k_begin, k_end), from its place in the block (the wn-th of warps_n on different n-groups, the
// wk-th of the block's ranges of K) and its block's rank in the cluster. Lane (g = lane / 4, t =
// lane % 4) reads rows g and g + 8 of the n-group from element 8t of each step (b_row; b_ok: the
// row is in B).
template <class In, class Out>
struct WarpPlace {
  int wn, wk, n0, k_begin, k_end;
  const In* b_row[2];
  bool b_ok[2];

  __device__ __forceinline__ WarpPlace(const DecodeParams<In, Out>& p, int warp, int lane) {
    const int warps_n = p.warps_n;
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = static_cast<int>(cluster.block_rank());
    const int ranks = static_cast<int>(cluster.num_blocks());
    const int warps_k = kWarps / warps_n;
    wn = warp % warps_n, wk = warp / warps_n;
    n0 = (static_cast<int>(blockIdx.x) / ranks * warps_n + wn) * 16;
    k_begin = (rank * warps_k + wk) * p.warp_k;
    k_end = min(p.k, k_begin + p.warp_k);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = n0 + 8 * h + lane / 4;
      b_ok[h] = row < p.n;
      b_row[h] = p.b + (b_ok[h] ? row : 0) * p.ldb + 8 * (lane % 4);
    }
  }
};

// After each warp left its fp32 partials in `partial` ([kWarps][kMF * 4][32], at the same address
// in every block of the cluster): the cluster's first block adds them in rank and warp order and
// stores C (or adds into it), two adjacent columns a thread (the engine's store_pair /
// red_add_pair): lanes l and l + 4 of a partial hold rows g and g + 1 of the MMA, i.e. columns n
// and n + 1 of C. n_block: the block's first row of B.
template <int kMF, class In, class Out>
__device__ __forceinline__ void add_partials_and_store(const DecodeParams<In, Out>& p,
                                                       float* partial, int n_block) {
  constexpr int kValues = kMF * 4;
  cg::cluster_group cluster = cg::this_cluster();
  const int ranks = static_cast<int>(cluster.num_blocks());
  cluster.sync();  // every block's partials written (a block of one: __syncthreads)
  if (cluster.block_rank() == 0) {
    for (int i = static_cast<int>(threadIdx.x); i < p.warps_n * kValues * 16; i += kWarps * 32) {
      const int on = i / (kValues * 16), value = i / 16 % kValues, q = i % 16;
      const int l = q / 4 * 8 + q % 4;  // g = 2 (q / 4), t = q % 4
      float sum0 = 0.f, sum1 = 0.f;
      for (int r = 0; r < ranks; ++r) {
        const float* base = cluster.map_shared_rank(partial, r);
        for (int w = on; w < kWarps; w += p.warps_n) {
          sum0 += base[(w * kValues + value) * 32 + l];
          sum1 += base[(w * kValues + value) * 32 + l + 4];
        }
      }
      // value = e * 4 + v; the accumulator's v: rows (of the MMA) g, g, g + 8, g + 8, columns 2t,
      // 2t + 1, 2t, 2t + 1 of the fragment.
      const int e = value / 4, v = value % 4;
      const int n = n_block + on * 16 + l / 4 + 8 * (v / 2);  // even; N is a multiple of 8
      const int m = 8 * e + 2 * (l % 4) + v % 2;
      if (m < p.m && n < p.n) {
        Out* dst = p.c + m * p.ldc + n;
        if (p.reduce) {
          red_add_pair(dst, sum0, sum1);
        } else {
          store_pair(dst, sum0, sum1);
        }
      }
    }
  }
  cluster.sync();  // the others' shared memory stays until the first block has read it
}

// kMF: m16n8 fragments along A's rows (M <= 8 kMF); kU: steps of K whose loads are issued before
// their MMAs.
template <class In, class Out, int kMF, int kU>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm)
    decode_kernel(const DecodeParams<In, Out> p) {
  constexpr int kValues = kMF * 4;  // fp32 partials a lane holds
  __shared__ float partial[kWarps][kValues][32];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const WarpPlace<In, Out> w(p, warp, lane);
  const int wn = w.wn, n0 = w.n0;
  const int k_begin = w.k_begin, k_end = w.k_end;
  const In* const b_row[2] = {w.b_row[0], w.b_row[1]};
  const bool b_ok[2] = {w.b_ok[0], w.b_ok[1]};

  const In* a_row[kMF];
  bool a_ok[kMF];
#pragma unroll
  for (int e = 0; e < kMF; ++e) {
    const int row = 8 * e + g;
    a_ok[e] = row < p.m;
    a_row[e] = p.a + (a_ok[e] ? row : 0) * p.lda + 8 * t;
  }

  float acc[kMF][4];
#pragma unroll
  for (int e = 0; e < kMF; ++e) acc[e][0] = acc[e][1] = acc[e][2] = acc[e][3] = 0.f;

  for (int k0 = k_begin; k0 < k_end; k0 += kStepK * kU) {
    uint4 bv[kU][2], av[kU][kMF];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int kk = k0 + kStepK * u;
      const bool in_k = kk + 8 * t < k_end;  // K and the ranges are multiples of 8
#pragma unroll
      for (int h = 0; h < 2; ++h)
        bv[u][h] = in_k && b_ok[h] ? __ldcs(reinterpret_cast<const uint4*>(b_row[h] + kk))
                                   : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int e = 0; e < kMF; ++e)
        av[u][e] = in_k && a_ok[e] ? __ldg(reinterpret_cast<const uint4*>(a_row[e] + kk))
                                   : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int e = 0; e < kMF; ++e) {
        mma_16816<In>(acc[e], bv[u][0].x, bv[u][1].x, bv[u][0].y, bv[u][1].y, av[u][e].x,
                      av[u][e].y);
        mma_16816<In>(acc[e], bv[u][0].z, bv[u][1].z, bv[u][0].w, bv[u][1].w, av[u][e].z,
                      av[u][e].w);
      }
    }
  }

#pragma unroll
  for (int e = 0; e < kMF; ++e)
#pragma unroll
    for (int v = 0; v < 4; ++v) partial[warp][e * 4 + v][lane] = acc[e][v];
  add_partials_and_store<kMF>(p, &partial[0][0][0], n0 - wn * 16);
}

// How a launch spreads its work: n-groups of 16 rows of B (warps_n of them a block), and blocks
// a cluster (splitting K with the block's other warps).
struct DecodeGrid {
  int warps_n = 1, cluster = 1;
  int64_t blocks = 0, warp_k = 0;
};

DecodeGrid decode_grid(int64_t n, int64_t k, int sms) {
  DecodeGrid d;
  const int64_t slots = int64_t{sms} * kBlocksPerSm;
  auto groups = [&] { return (n + 16 * d.warps_n - 1) / (16 * d.warps_n); };
  // One wave of blocks, if it can be had: the warps of a block take 2 or 4 n-groups (each warp a
  // longer range of K) where one a block would make more blocks than the SMs hold; then blocks in
  // clusters split K where that still leaves a wave.
  while (d.warps_n < 4 && groups() > slots) d.warps_n *= 2;
  const int64_t warps_k = kWarps / d.warps_n;
  while (d.cluster < kMaxCluster && groups() * 2 * d.cluster <= slots &&
         k >= 2 * d.cluster * warps_k * kMinWarpK)
    d.cluster *= 2;
  d.blocks = groups() * d.cluster;
  const int64_t parts = d.cluster * warps_k;
  d.warp_k = ((k + parts - 1) / parts + kStepK - 1) / kStepK * kStepK;
  return d;
}

template <class In, class Out>
DecodeParams<In, Out> decode_params(const GemmArgs& args, const DecodeGrid& d) {
  DecodeParams<In, Out> p;
  p.a = static_cast<const In*>(args.a);
  p.b = static_cast<const In*>(args.b);
  p.c = static_cast<Out*>(args.c);
  p.m = static_cast<int>(args.m), p.n = static_cast<int>(args.n), p.k = static_cast<int>(args.k);
  p.lda = args.lda ? args.lda : args.k, p.ldb = args.ldb ? args.ldb : args.k;
  p.ldc = args.ldc ? args.ldc : args.n;
  p.warp_k = static_cast<int>(d.warp_k);
  p.warps_n = d.warps_n;
  p.reduce = args.epilogue == EpilogueMode::kReduceAdd;
  return p;
}

template <class In, class Out, int kMF>
void launch(const GemmArgs& args, int sms, cudaStream_t stream) {
  const DecodeGrid d = decode_grid(args.n, args.k, sms);
  ClusterLaunch(d.blocks, kWarps * 32, 0, d.cluster, stream)
      .launch(decode_kernel<In, Out, kMF, kSteps>, decode_params<In, Out>(args, d));
}

template <class In, class Out>
void launch_for_shape(const GemmArgs& args, int sms, cudaStream_t stream) {
  if (args.m > kMmaSyncMaxRows || args.n < kMmaSyncMinN) {
    gemm_decode_wgmma<In, Out>(args, stream);
  } else if (args.m <= 8) {
    launch<In, Out, 1>(args, sms, stream);
  } else {
    launch<In, Out, 2>(args, sms, stream);
  }
}

}  // namespace

void gemm_decode(const GemmArgs& args, int sms, cudaStream_t stream) {
  TL_REQUIRE(args.m >= 1 && args.m <= kDecodeMaxRows, "sm90 gemm: the decode kernel takes M in [1, "
                                                          << kDecodeMaxRows << "], got " << args.m);
  const DType in = args.in_type, out = args.out_type;
  if (in == DType::kBF16 && out == DType::kBF16)
    return launch_for_shape<__nv_bfloat16, __nv_bfloat16>(args, sms, stream);
  if (in == DType::kBF16 && out == DType::kF32)
    return launch_for_shape<__nv_bfloat16, float>(args, sms, stream);
  if (in == DType::kF16 && out == DType::kF16)
    return launch_for_shape<__half, __half>(args, sms, stream);
  if (in == DType::kF16 && out == DType::kF32)
    return launch_for_shape<__half, float>(args, sms, stream);
  TL_REQUIRE(false, "sm90 gemm: unsupported dtype combination " << dtype_name(in) << " -> "
                                                                << dtype_name(out));
}

}  // namespace tilelink::compute::sm90::detail
