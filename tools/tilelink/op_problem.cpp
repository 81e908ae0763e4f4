// The problem an op is made for, without the command line: shapes, splits, inputs (problem.hpp).
#include <algorithm>
#include <sstream>
#include <thread>

#include "problem.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cli {

void set_shape(OpProblem& p, int64_t m, int64_t n, int64_t k) {
  TL_REQUIRE(m >= 1 && n >= 1 && k >= 1, "M, N and K must be >= 1, got " << m << ", " << n << ", " << k);
  p.m = m;
  p.n = n;
  p.k = k;
  p.rows = RowPartition::even(p.m, p.world);
  const int64_t split_total = p.split_n ? p.n : p.k;
  const RowPartition cols = RowPartition::even(split_total, p.world);
  p.split.clear();
  for (int r = 0; r < p.world; ++r) p.split.push_back(cols.size(r));
  for (int r = 0; r < p.world; ++r)
    TL_REQUIRE(p.split[r] >= 1, (p.split_n ? "N" : "K")
                                    << " = " << split_total << " leaves rank " << r
                                    << " with nothing; it must be >= --world");
}

std::string describe(const OpProblem& p) {
  std::ostringstream os;
  os << p.op << " backend=" << p.backend << " world=" << p.world << " M=" << p.m << " N=" << p.n
     << " K=" << p.k << " dtype=" << dtype_name(p.dtype)
     << " variant=" << p.variant << "\n  M split:";
  for (int r = 0; r < p.world; ++r) os << " " << p.rows.size(r);
  os << (p.split_n ? "\n  N split:" : "\n  K split:");
  for (int64_t s : p.split) os << " " << s;
  // NOTE: the CUDA ops print their own configuration (engine tile, SMs, comm tiles) once made.
  if (p.backend != "cuda")
    os << "\n  comm tile rows=" << p.comm_tile << " gemm tile=" << p.tile_m << "x" << p.tile_n
       << " comm workers=" << p.comm_workers << " compute workers=" << p.compute_workers;
  return os.str();
}

std::vector<std::byte> random_matrix(int64_t rows, int64_t cols, DType dtype, std::mt19937_64& rng) {
  // Counter-based: value i is a hash of (seed, i), so the matrix is the same whatever the number of
  // threads filling it (large inputs of the GPU benches take seconds on one thread).
  const uint64_t seed = rng();
  const int64_t count = rows * cols;
  std::vector<std::byte> out(static_cast<size_t>(count * dtype_size(dtype)));
  auto fill = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      uint64_t z = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;  // splitmix64
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
      store_from_float(out.data(), dtype, i, 2.f * u - 1.f);
    }
  };
  const int64_t kPerThread = int64_t{1} << 22;
  const int threads = static_cast<int>(std::min<int64_t>(
      std::max(1u, std::thread::hardware_concurrency()), (count + kPerThread - 1) / kPerThread));
  if (threads <= 1) {
    fill(0, count);
    return out;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (count + threads - 1) / threads;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back(fill, std::min(count, t * chunk), std::min(count, (t + 1) * chunk));
  for (auto& th : pool) th.join();
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace tilelink::cli
