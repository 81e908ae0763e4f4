// Seeded random data for the tests. Every test draws from its own generator, seeded from the run's
// base seed and the test's name; the seed is printed with every failure (SCOPED_TRACE) and a run is
// reproduced with TILELINK_TEST_SEED=<base seed>. Without the variable each run uses a fresh seed.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tilelink/core/dtype.hpp"

namespace tilelink::test {

inline uint64_t base_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* env = std::getenv("TILELINK_TEST_SEED")) return std::strtoull(env, nullptr, 0);
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  return seed;
}

// FNV-1a of the current test's full name, mixed into the base seed.
inline uint64_t test_seed() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return base_seed() ^ h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : seed_(seed), gen_(seed) {}
  uint64_t seed() const { return seed_; }
  std::mt19937_64& gen() { return gen_; }

  // Uniform integer in [lo, hi].
  int64_t uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen_);
  }
  int uniform_int(int lo, int hi) { return static_cast<int>(uniform(lo, hi)); }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(gen_); }
  float uniform_float(float lo, float hi) {
    return std::uniform_real_distribution<float>(lo, hi)(gen_);
  }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(uniform(0, static_cast<int64_t>(v.size()) - 1))];
  }

  // `world` row counts summing to `total`, split at random cut points: uneven, empty segments
  // likely.
  std::vector<int64_t> uneven_counts(int64_t total, int world) {
    std::vector<int64_t> cuts{0, total};
    for (int i = 0; i + 1 < world; ++i) cuts.push_back(uniform(0, total));
    std::sort(cuts.begin(), cuts.end());
    std::vector<int64_t> counts;
    for (int i = 0; i < world; ++i) counts.push_back(cuts[i + 1] - cuts[i]);
    // Force at least one empty segment now and then.
    if (world > 1 && coin(0.3)) {
      int e = uniform_int(0, world - 1), to = (e + 1) % world;
      counts[to] += counts[e];
      counts[e] = 0;
    }
    return counts;
  }

  // Fills `count` elements of `dtype` with values uniform in [-1, 1] (rounded to the dtype).
  std::vector<std::byte> tensor(DType dtype, int64_t count) {
    std::vector<std::byte> buf(static_cast<size_t>(count * dtype_size(dtype)));
    for (int64_t i = 0; i < count; ++i)
      store_from_float(buf.data(), dtype, i, uniform_float(-1.f, 1.f));
    return buf;
  }

 private:
  uint64_t seed_;
  std::mt19937_64 gen_;
};

// `count` bf16 values uniform in [-1, 1] from `gen`.
inline std::vector<BF16> random_bf16(int64_t count, std::mt19937_64& gen) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<BF16> v(static_cast<size_t>(count));
  for (auto& x : v) x = float_to_bf16(u(gen));
  return v;
}

// 0xFF bytes: NaN in fp32, bf16 and fp16, and an obviously wrong byte pattern otherwise.
inline void poison(void* p, size_t bytes) { std::memset(p, 0xFF, bytes); }
inline void poison(std::vector<std::byte>& v) { poison(v.data(), v.size()); }

}  // namespace tilelink::test

// Declares `rng`, seeded for this test, and prints its seeds with every failure in the scope.
#define TL_SEEDED_RNG(rng)                                             \
  ::tilelink::test::Rng rng(::tilelink::test::test_seed());            \
  SCOPED_TRACE(::testing::Message()                                    \
               << "seed " << rng.seed() << " (reproduce the run with " \
               << "TILELINK_TEST_SEED=" << ::tilelink::test::base_seed() << ")")
