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

OpProblem problem_of_operands(const std::string& op, bool split_n, const std::string& backend,
                              const std::vector<Extent2>& a, const std::vector<Extent2>& b, DType dtype,
                              const std::vector<int64_t>& m_split) {
  auto refuse = [&](const std::string& what) { throw ArgumentError(op + ": " + what); };
  const int world = static_cast<int>(a.size());
  if (world < 1 || world > kMaxWorldSize)
    refuse("a holds " + std::to_string(a.size()) + " ranks' operands; the world size must be in [1, " +
           std::to_string(kMaxWorldSize) + "]");
  if (b.size() != a.size())
    refuse("a holds " + std::to_string(a.size()) + " ranks' operands but b holds " + std::to_string(b.size()));
  auto shape = [](const char* name, int r, Extent2 e) {
    return std::string(name) + "[" + std::to_string(r) + "] [" + std::to_string(e.rows) + ", " +
           std::to_string(e.cols) + "]";
  };
  constexpr int64_t kMaxExtent = int64_t{1} << 40;
  for (int r = 0; r < world; ++r)
    for (auto [name, e] : {std::pair{"a", a[r]}, std::pair{"b", b[r]}})
      if (e.rows < 0 || e.cols < 0 || e.rows > kMaxExtent || e.cols > kMaxExtent ||
          (e.cols > 0 && e.rows > kMaxExtent / e.cols))
        refuse(shape(name, r, e) + " is out of range");
  OpProblem p;
  p.op = op;
  p.split_n = split_n;
  p.backend = backend;
  p.world = world;
  p.dtype = dtype;
  p.split.resize(world);
  std::vector<int64_t> counts(world);
  if (split_n) {  // A_r [M_r, K], B_r [N_r, K]
    p.k = a[0].cols;
    for (int r = 0; r < world; ++r) {
      if (a[r].cols != p.k) refuse(shape("a", r, a[r]) + " has K = " + std::to_string(a[r].cols) + ", a[0] has K = " + std::to_string(p.k));
      if (b[r].cols != p.k) refuse(shape("b", r, b[r]) + " has K = " + std::to_string(b[r].cols) + ", a[0] has K = " + std::to_string(p.k));
      if (b[r].rows < 1) refuse(shape("b", r, b[r]) + " has no rows: every rank needs N_r >= 1");
      counts[r] = a[r].rows;
      p.split[r] = b[r].rows;
      p.n += b[r].rows;
    }
    p.rows = RowPartition::from_counts(counts);
    p.m = p.rows.total();
    if (p.m < 1) refuse("every a[r] has 0 rows: M must be >= 1");
    if (!m_split.empty()) refuse("m_split is for ops whose K is split; the rows of A_r already say M's split");
  } else {  // A_r [M, K_r], B_r [N, K_r]
    p.m = a[0].rows;
    p.n = b[0].rows;
    for (int r = 0; r < world; ++r) {
      if (a[r].rows != p.m) refuse(shape("a", r, a[r]) + " has M = " + std::to_string(a[r].rows) + ", a[0] has M = " + std::to_string(p.m));
      if (b[r].rows != p.n) refuse(shape("b", r, b[r]) + " has N = " + std::to_string(b[r].rows) + ", b[0] has N = " + std::to_string(p.n));
      if (b[r].cols != a[r].cols) refuse(shape("b", r, b[r]) + " has K_r = " + std::to_string(b[r].cols) + ", " + shape("a", r, a[r]) + " has K_r = " + std::to_string(a[r].cols));
      if (a[r].cols < 1) refuse(shape("a", r, a[r]) + " has no columns: every rank needs K_r >= 1");
      p.split[r] = a[r].cols;
      p.k += a[r].cols;
    }
    if (p.m < 1 || p.n < 1) refuse("M and N must be >= 1, got " + std::to_string(p.m) + " and " + std::to_string(p.n));
    if (m_split.empty()) {
      p.rows = RowPartition::even(p.m, world);
    } else {
      if (static_cast<int>(m_split.size()) != world)
        refuse("m_split has " + std::to_string(m_split.size()) + " counts for " + std::to_string(world) + " ranks");
      int64_t total = 0;
      for (int64_t c : m_split) {
        if (c < 0) refuse("m_split holds a negative count");
        total += c;
      }
      if (total != p.m) refuse("m_split adds up to " + std::to_string(total) + ", M is " + std::to_string(p.m));
      p.rows = RowPartition::from_counts(m_split);
    }
  }
  if (p.m > kMaxExtent / std::max<int64_t>(p.n, 1)) refuse("the output of M = " + std::to_string(p.m) + " by N = " + std::to_string(p.n) + " is out of range");
  return p;
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
