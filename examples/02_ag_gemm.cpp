// Example 2: the fused AllGather+GEMM op on the CPU backend, checked against its unfused baseline.
#include <cstdio>
#include <random>
#include <vector>

#include "tilelink/backend/cpu/ops.hpp"
#include "tilelink/compute/cpu_gemm.hpp"

using namespace tilelink;

int main() {
  const int world_size = 3;
  const int64_t M = 250, K = 96, N_r = 40;  // M is ragged: 84 + 83 + 83 rows
  RowPartition rows = RowPartition::even(M, world_size);
  AgGemmConfig cfg;                 // communication tiles of 32 rows, GEMM tiles of 64 x 32:
  cfg.comm_tile_rows = 32;          // different sizes, linked only by the plan's mappings
  cfg.gemm_tile_m = 64;
  cfg.gemm_tile_n = 32;
  cpu::World world(world_size);
  cpu::AgGemm op(world, rows, std::vector<int64_t>(world_size, N_r), K, DType::kF32, cfg);

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<std::vector<float>> a(world_size), b(world_size), c(world_size), c_ref(world_size);
  for (int r = 0; r < world_size; ++r) {
    for (int64_t i = 0; i < rows.size(r) * K; ++i) a[r].push_back(u(rng));
    for (int64_t i = 0; i < N_r * K; ++i) b[r].push_back(u(rng));
    c[r].assign(M * N_r, -1.f);
    c_ref[r].assign(M * N_r, -2.f);
  }
  world.run([&](cpu::RankContext& ctx) {
    const int r = ctx.rank;
    op.run(ctx, a[r].data(), b[r].data(), c[r].data());              // fused
    op.run_unfused(ctx, a[r].data(), b[r].data(), c_ref[r].data());  // AllGather, then GEMM
  });
  bool same = true;
  for (int r = 0; r < world_size; ++r) same = same && c[r] == c_ref[r];
  std::printf("AG+GEMM, world %d, M=%lld (ragged), fused == unfused: %s\n", world_size,
              static_cast<long long>(M), same ? "yes" : "NO");
  return same ? 0 : 1;
}
