// One AG+GEMM call on the CPU backend from a project that found tilelink with find_package: three
// ranks, a ragged M split, checked against a plain loop. Exits 0 when every output matches.
#include <cmath>
#include <cstdio>
#include <vector>

#include "tilelink/backend/cpu/ops.hpp"

int main() {
  using namespace tilelink;
  const int W = 3;
  const int64_t K = 24;
  const std::vector<int64_t> m_split{5, 0, 9}, n_split{8, 4, 12};
  const RowPartition rows = RowPartition::from_counts(m_split);
  const int64_t M = rows.total();
  auto value = [](int64_t i, int64_t j, int salt) { return static_cast<float>((i * 7 + j * 3 + salt) % 11) - 5.f; };
  std::vector<std::vector<float>> a(W), b(W), c(W);
  for (int r = 0; r < W; ++r) {
    for (int64_t i = 0; i < m_split[r]; ++i)
      for (int64_t k = 0; k < K; ++k) a[r].push_back(value(rows.begin(r) + i, k, 1));
    for (int64_t j = 0; j < n_split[r]; ++j)
      for (int64_t k = 0; k < K; ++k) b[r].push_back(value(j, k, 2 + r));
    c[r].assign(M * n_split[r], NAN);
  }
  cpu::World world(W);
  cpu::AgGemm op(world, rows, n_split, K, DType::kF32, AgGemmConfig{});
  world.run([&](cpu::RankContext& ctx) {
    const int r = ctx.rank;
    op.run(ctx, a[r].empty() ? nullptr : a[r].data(), b[r].data(), c[r].data());
  });
  int wrong = 0;
  for (int r = 0; r < W; ++r)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < n_split[r]; ++j) {
        double want = 0;
        for (int64_t k = 0; k < K; ++k) want += double(value(i, k, 1)) * value(j, k, 2 + r);
        wrong += c[r][i * n_split[r] + j] != static_cast<float>(want);
      }
  std::printf("consumer: AG+GEMM on %d CPU ranks, M %lld (ragged), %d wrong\n", W, static_cast<long long>(M), wrong);
  return wrong == 0 ? 0 : 1;
}
