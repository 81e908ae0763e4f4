// GPU tests of the sm90 attention engine (compute/sm90/attention.hpp; run on an H100/H200): head
// dims 128 and 64, causal and not, multi-head and GQA, sequence lengths off the 128-row tiles
// (1 .. 2048 + 13), query shards with positions of their own (at the end of a longer key
// sequence; before the first key, where rows see no key), batch 2 in padded and head-major
// layouts, fp16 as well as bf16, lse in a layout of its own or not written at all, key ranges
// merged over calls (merge), graph replays,
// and argument checks that throw before anything is launched.
// O and lse start poisoned (0xFF bytes: NaN) and every element is compared with a device reference
// computed here from the same inputs (naive: a thread a query row, fp32, two passes over the keys):
// |O - ref| <= 2e-2 + 2e-2 |ref| element by element, and within 2e-2 of the row's largest |ref|
// row by row; lse within 1e-3 (natural log). A row that sees no key must give O = 0 exactly and
// lse = -inf. Every byte of O and lse that is not one of their elements (head and row padding, a
// guard past the last element) must be as it was, and the inputs hold NaN in their padding, so a
// read outside a tensor's elements shows in O.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../support/gpu.hpp"
#include "../support/random.hpp"
#include "../support/refused.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/sm90/attention.hpp"
#include "tilelink/core/error.hpp"

namespace {

using namespace tilelink;
using namespace tilelink::compute::sm90;
using Bytes = std::vector<std::byte>;

constexpr double kOutAbsTol = 2e-2, kOutRelTol = 2e-2;  // O: |got - want| <= abs + rel * |want|
constexpr double kLseTol = 1e-3;                        // lse: |got - want| (natural log)
// A row of O as a whole: max |got - want| <= kRowTol * max |want| over the row. NOTE: the
// element-wise bound alone passes O = 0 on rows of many keys (their values shrink as 1 /
// sqrt(keys)).
constexpr double kRowTol = 2e-2;
constexpr int64_t kGuard = 64;  // elements past the last one of every tensor (must stay untouched)

using test::DeviceBuffer;

// ---- layouts ------------------------------------------------------------------------------------

// How a tensor of the engine lies in memory.
enum class Layout {
  kPacked,     // [b, s, h, d], passed as strides 0
  kPadded,     // [b, s, h, d] with padding after every head, every row and every batch entry
  kHeadMajor,  // [b, h, s, d] through the strides
};
const char* layout_name(Layout l) {
  return l == Layout::kPacked ? "packed" : l == Layout::kPadded ? "padded" : "head-major";
}

// lse's layout.
enum class LseLayout {
  kPacked,  // [b, h, s], passed as strides 0
  kCustom,  // [h, b, s] with each (h, b) row padded: strides of its own
  kNone,    // lse = nullptr
};
const char* lse_name(LseLayout l) {
  return l == LseLayout::kPacked ? "packed" : l == LseLayout::kCustom ? "custom" : "none";
}

// A [batch, seq, heads, width] tensor in memory: element strides (width contiguous) and the
// allocation's size.
struct Strided {
  int64_t batch = 0, seq = 0, heads = 0, width = 0;
  int64_t sb = 0, ss = 0, sh = 0;
  int64_t elems = 0;  // the allocation in elements: up to the last element, then kGuard more

  int64_t at(int64_t b, int64_t s, int64_t h) const { return b * sb + s * ss + h * sh; }
  void finish() {
    elems = batch == 0 ? kGuard : at(batch - 1, seq - 1, heads - 1) + width + kGuard;
  }
  // 1 at the tensor's elements, 0 at padding and the guard.
  std::vector<char> mask() const {
    std::vector<char> m(static_cast<size_t>(elems), 0);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h) std::fill_n(m.begin() + at(b, s, h), width, 1);
    return m;
  }
};

Strided tensor_layout(Layout l, int64_t batch, int64_t seq, int64_t heads, int64_t d) {
  Strided t;
  t.batch = batch, t.seq = seq, t.heads = heads, t.width = d;
  switch (l) {
    case Layout::kPacked:
      t.sh = d, t.ss = heads * d, t.sb = seq * heads * d;
      break;
    case Layout::kPadded:  // every stride a multiple of 8 elements, none of them packed
      t.sh = d + 24, t.ss = heads * t.sh + 16, t.sb = seq * t.ss + 40;
      break;
    case Layout::kHeadMajor:
      t.ss = d, t.sh = seq * d, t.sb = heads * seq * d;
      break;
  }
  t.finish();
  return t;
}

Strided lse_layout(LseLayout l, int64_t batch, int64_t seq_q, int64_t heads_q) {
  Strided t;
  t.batch = batch, t.seq = seq_q, t.heads = heads_q, t.width = 1;
  switch (l) {
    case LseLayout::kPacked:
      t.ss = 1, t.sh = seq_q, t.sb = heads_q * seq_q;
      break;
    case LseLayout::kCustom:
      t.ss = 1, t.sb = (seq_q + 7) / 8 * 8 + 8, t.sh = batch * t.sb;
      break;
    case LseLayout::kNone:
      t = Strided{};
      break;
  }
  t.finish();
  return t;
}

// ---- the reference ------------------------------------------------------------------------------

__device__ float load(const void* p, DType t, int64_t i) {
  return t == DType::kBF16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
                           : __half2float(static_cast<const __half*>(p)[i]);
}

// One thread a (batch, query head, query row): the row's scores in fp32, a pass for their max and
// a second for the exponentials' sum and O. `a` has every stride and the scale spelled out.
// o_ref is packed [batch, seq_q, heads_q, D], lse_ref [batch, heads_q, seq_q] (natural log); a row
// that sees no key gets O = 0 and lse = -inf.
template <int D>
__global__ void reference_attention(AttnArgs a, float* o_ref, float* lse_ref) {
  const int64_t rows = int64_t(a.batch) * a.heads_q * a.seq_q;
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows) return;
  const int64_t i = t % a.seq_q, h = t / a.seq_q % a.heads_q, b = t / a.seq_q / a.heads_q;
  const int64_t hk = h / (a.heads_q / a.heads_kv);
  float q[D], acc[D];
  const int64_t q0 = b * a.q_stride_b + i * a.q_stride_s + h * a.q_stride_h;
  for (int c = 0; c < D; ++c) q[c] = load(a.q, a.dtype, q0 + c), acc[c] = 0.f;
  // Keys j < end are visible: every key without the mask, else those at or before the row's
  // position.
  int64_t end = a.seq_k;
  if (a.causal) end = min(max(a.q_pos0 + i - a.kv_pos0 + 1, int64_t{0}), a.seq_k);
  const int64_t k0 = b * a.k_stride_b + hk * a.k_stride_h,
                v0 = b * a.v_stride_b + hk * a.v_stride_h;
  auto score = [&](int64_t j) {
    float s = 0.f;
    for (int c = 0; c < D; ++c) s = fmaf(q[c], load(a.k, a.dtype, k0 + j * a.k_stride_s + c), s);
    return s * a.scale;
  };
  float m = -INFINITY;
  for (int64_t j = 0; j < end; ++j) m = fmaxf(m, score(j));
  float l = 0.f;
  for (int64_t j = 0; j < end; ++j) {
    const float p = expf(score(j) - m);
    l += p;
    for (int c = 0; c < D; ++c)
      acc[c] = fmaf(p, load(a.v, a.dtype, v0 + j * a.v_stride_s + c), acc[c]);
  }
  float* o = o_ref + ((b * a.seq_q + i) * a.heads_q + h) * D;
  for (int c = 0; c < D; ++c) o[c] = end > 0 ? acc[c] / l : 0.f;
  lse_ref[(b * a.heads_q + h) * a.seq_q + i] = end > 0 ? m + logf(l) : -INFINITY;
}

struct Reference {
  std::vector<float> o;    // packed [batch, seq_q, heads_q, head_dim]
  std::vector<float> lse;  // packed [batch, heads_q, seq_q]
};

Reference reference(const AttnArgs& a) {
  const int64_t rows = int64_t(a.batch) * a.heads_q * a.seq_q;
  DeviceBuffer o(rows * a.head_dim * sizeof(float)), lse(rows * sizeof(float));
  const unsigned blocks = static_cast<unsigned>((rows + 127) / 128);
  if (a.head_dim == 128) {
    reference_attention<128><<<blocks, 128>>>(a, o.as<float>(), lse.as<float>());
  } else {
    reference_attention<64><<<blocks, 128>>>(a, o.as<float>(), lse.as<float>());
  }
  TL_CUDA_CHECK(cudaGetLastError());
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  return Reference{o.get<float>(rows * a.head_dim), lse.get<float>(rows)};
}

// ---- cases --------------------------------------------------------------------------------------

struct Case {
  std::string what;
  DType type = DType::kBF16;
  int batch = 1;
  int64_t seq_q = 0, seq_k = 0;
  int heads_q = 4, heads_kv = 4, head_dim = 128;
  bool causal = false;
  int64_t q_pos0 = 0, kv_pos0 = 0;
  float scale = 0.f;  // 0: the engine's default, 1 / sqrt(head_dim)
  Layout q_layout = Layout::kPacked, kv_layout = Layout::kPacked, o_layout = Layout::kPacked;
  LseLayout lse = LseLayout::kPacked;
  int num_sms = 0;            // AttnArgs::num_sms: 0, a block an item; > 0, a persistent grid
  int64_t kv_walk_from = -1;  // AttnArgs::kv_walk_from
};

Case shape(std::string what, int head_dim, int heads_q, int heads_kv, int64_t seq, bool causal) {
  Case c;
  c.what = std::move(what), c.head_dim = head_dim, c.heads_q = heads_q, c.heads_kv = heads_kv;
  c.seq_q = c.seq_k = seq, c.causal = causal;
  return c;
}

::testing::Message describe(const Case& c) {
  ::testing::Message m;
  m << c.what << ": batch " << c.batch << ", seq_q " << c.seq_q << ", seq_k " << c.seq_k
    << ", heads " << c.heads_q << "/" << c.heads_kv << ", head_dim " << c.head_dim << ", "
    << dtype_name(c.type) << (c.causal ? ", causal" : ", no mask") << ", q_pos0 " << c.q_pos0
    << ", kv_pos0 " << c.kv_pos0 << ", scale " << c.scale << ", q " << layout_name(c.q_layout)
    << ", k/v " << layout_name(c.kv_layout) << ", o " << layout_name(c.o_layout) << ", lse "
    << lse_name(c.lse) << ", num_sms " << c.num_sms << ", kv_walk_from " << c.kv_walk_from;
  return m;
}

// NaN (0xFF bytes) everywhere but at the tensor's elements, which are uniform in [-1, 1].
Bytes random_tensor(test::Rng& rng, DType t, const Strided& s) {
  Bytes h(static_cast<size_t>(s.elems * dtype_size(t)));
  test::poison(h);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.seq; ++i)
      for (int64_t hh = 0; hh < s.heads; ++hh)
        for (int64_t c = 0; c < s.width; ++c)
          store_from_float(h.data(), t, s.at(b, i, hh) + c, rng.uniform_float(-1.f, 1.f));
  return h;
}

// One case's tensors on the device: the inputs random (NaN in their padding), O and lse poisoned,
// and the arguments as the engine gets them (strides 0 for packed tensors) and as the reference
// does (every stride and the scale spelled out).
struct Problem {
  Case c;
  Strided q, k, v, o, lse;
  DeviceBuffer dq, dk, dv, dout, dlse;
  Bytes o_before, lse_before;  // 0xFF everywhere
  AttnArgs args, resolved;

  Problem(const Case& c_, test::Rng& rng)
      : c(c_),
        q(tensor_layout(c.q_layout, c.batch, c.seq_q, c.heads_q, c.head_dim)),
        k(tensor_layout(c.kv_layout, c.batch, c.seq_k, c.heads_kv, c.head_dim)),
        v(tensor_layout(c.kv_layout, c.batch, c.seq_k, c.heads_kv, c.head_dim)),
        o(tensor_layout(c.o_layout, c.batch, c.seq_q, c.heads_q, c.head_dim)),
        lse(lse_layout(c.lse, c.batch, c.seq_q, c.heads_q)),
        dq(q.elems * dtype_size(c.type)),
        dk(k.elems * dtype_size(c.type)),
        dv(v.elems * dtype_size(c.type)),
        dout(o.elems * dtype_size(c.type)),
        dlse(lse.elems * sizeof(float)) {
    dq.put(random_tensor(rng, c.type, q));
    dk.put(random_tensor(rng, c.type, k));
    dv.put(random_tensor(rng, c.type, v));
    o_before.resize(dout.bytes);
    test::poison(o_before);
    lse_before.resize(dlse.bytes);
    test::poison(lse_before);
    poison();

    args.q = dq.p, args.k = dk.p, args.v = dv.p, args.o = dout.p;
    args.lse = c.lse == LseLayout::kNone ? nullptr : dlse.as<float>();
    args.batch = c.batch, args.seq_q = c.seq_q, args.seq_k = c.seq_k;
    args.heads_q = c.heads_q, args.heads_kv = c.heads_kv, args.head_dim = c.head_dim;
    args.scale = c.scale, args.causal = c.causal, args.q_pos0 = c.q_pos0, args.kv_pos0 = c.kv_pos0;
    args.num_sms = c.num_sms, args.kv_walk_from = c.kv_walk_from;
    args.dtype = c.type;
    auto spell = [](const Strided& s, int64_t& sb, int64_t& ss, int64_t& sh) {
      sb = s.sb, ss = s.ss, sh = s.sh;
    };
    if (c.q_layout != Layout::kPacked) spell(q, args.q_stride_b, args.q_stride_s, args.q_stride_h);
    if (c.kv_layout != Layout::kPacked) {
      spell(k, args.k_stride_b, args.k_stride_s, args.k_stride_h);
      spell(v, args.v_stride_b, args.v_stride_s, args.v_stride_h);
    }
    if (c.o_layout != Layout::kPacked) spell(o, args.o_stride_b, args.o_stride_s, args.o_stride_h);
    if (c.lse == LseLayout::kCustom)
      args.lse_stride_b = lse.sb, args.lse_stride_h = lse.sh, args.lse_stride_s = lse.ss;

    resolved = args;
    spell(q, resolved.q_stride_b, resolved.q_stride_s, resolved.q_stride_h);
    spell(k, resolved.k_stride_b, resolved.k_stride_s, resolved.k_stride_h);
    spell(v, resolved.v_stride_b, resolved.v_stride_s, resolved.v_stride_h);
    spell(o, resolved.o_stride_b, resolved.o_stride_s, resolved.o_stride_h);
    resolved.lse_stride_b = lse.sb, resolved.lse_stride_h = lse.sh, resolved.lse_stride_s = lse.ss;
    if (resolved.scale == 0.f) resolved.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  }

  // O and lse back to 0xFF bytes (NaN).
  void poison() {
    dout.put(o_before);
    dlse.put(lse_before);
  }
  Bytes o_now() const { return dout.get<std::byte>(dout.bytes); }
  Bytes lse_now() const { return dlse.get<std::byte>(dlse.bytes); }
};

// Every element of O and lse against the reference (see the file's comment), every other byte of
// both as it was.
void expect_outputs(const Problem& p, const Reference& ref, const Bytes& o_after,
                    const Bytes& lse_after) {
  const Case& c = p.c;
  const int es = dtype_size(c.type);
  const int64_t d = c.head_dim;
  const bool has_lse = c.lse != LseLayout::kNone;
  int64_t bad = 0, non_finite = 0, bad_lse = 0, bad_rows = 0, empty_rows = 0;
  double worst = 0, worst_row = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t i = 0; i < c.seq_q; ++i) {
      for (int64_t h = 0; h < c.heads_q; ++h) {
        const float want_lse = ref.lse[(b * c.heads_q + h) * c.seq_q + i];
        const bool no_key = std::isinf(want_lse) && want_lse < 0;
        empty_rows += no_key;
        const float* want = &ref.o[((b * c.seq_q + i) * c.heads_q + h) * d];
        const int64_t at = p.o.at(b, i, h);
        double row_err = 0, row_mag = 0;
        for (int64_t col = 0; col < d; ++col) {
          const double got = load_as_float(o_after.data(), c.type, at + col);
          if (!std::isfinite(got)) {
            if (non_finite++ == 0)
              ADD_FAILURE() << "O[" << b << ", " << i << ", " << h << ", " << col
                            << "] not written or not finite: " << got;
            continue;
          }
          const double err = std::abs(got - want[col]);
          const double tol = no_key ? 0.0 : kOutAbsTol + kOutRelTol * std::abs(want[col]);
          worst = std::max(worst, err);
          row_err = std::max(row_err, err);
          row_mag = std::max(row_mag, double(std::abs(want[col])));
          if (err > tol && bad++ == 0) {
            ADD_FAILURE() << "O[" << b << ", " << i << ", " << h << ", " << col << "] = " << got
                          << ", want " << want[col] << (no_key ? " (the row sees no key)" : "")
                          << " (tolerance " << tol << ")";
          }
        }
        if (!no_key && row_mag > 0) {
          worst_row = std::max(worst_row, row_err / row_mag);
          if (row_err > kRowTol * row_mag && bad_rows++ == 0) {
            ADD_FAILURE() << "O[" << b << ", " << i << ", " << h << ", :] off by " << row_err
                          << " where its largest value is " << row_mag << " (tolerance " << kRowTol
                          << " of it)";
          }
        }
        if (!has_lse) continue;
        float got_lse;
        std::memcpy(&got_lse, lse_after.data() + p.lse.at(b, i, h) * sizeof(float), sizeof(float));
        const bool ok = no_key ? (std::isinf(got_lse) && got_lse < 0)
                               : std::abs(double(got_lse) - want_lse) <= kLseTol;
        if (!ok && bad_lse++ == 0) {
          ADD_FAILURE() << "lse[" << b << ", " << h << ", " << i << "] = " << got_lse << ", want "
                        << want_lse << (no_key ? " (the row sees no key)" : "");
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements of O off by more than the tolerance; worst |O - ref| " << worst
                    << "; " << empty_rows << " of " << c.batch * c.seq_q * c.heads_q
                    << " rows see no key";
  EXPECT_EQ(bad_rows, 0) << "rows of O off by more than " << kRowTol
                         << " of their largest value; worst " << worst_row;
  EXPECT_EQ(non_finite, 0) << "elements of O not finite";
  EXPECT_EQ(bad_lse, 0) << "lse values off by more than " << kLseTol;
  // Bytes that are not elements: padding and the guard.
  auto touched_outside = [](const Bytes& after, const Bytes& before, const Strided& s, int es) {
    const std::vector<char> inside = s.mask();
    int64_t touched = 0;
    for (int64_t e = 0; e < s.elems; ++e)
      if (!inside[e])
        for (int k = 0; k < es; ++k) touched += after[e * es + k] != before[e * es + k];
    return touched;
  };
  EXPECT_EQ(touched_outside(o_after, p.o_before, p.o, es), 0)
      << "bytes of O written outside its elements";
  if (has_lse) {
    EXPECT_EQ(touched_outside(lse_after, p.lse_before, p.lse, sizeof(float)), 0)
        << "bytes of lse written outside its elements";
  } else {
    EXPECT_EQ(lse_after, p.lse_before);
  }
}

// Runs one case on fresh random inputs and checks it (expect_outputs).
void run_case(const Case& c, test::Rng& rng) {
  SCOPED_TRACE(describe(c));
  Problem p(c, rng);
  EXPECT_NO_THROW(attention_check(p.args));
  attention_forward(p.args, nullptr);
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  expect_outputs(p, reference(p.resolved), p.o_now(), p.lse_now());
}

// ---- the tests ----------------------------------------------------------------------------------

// Both head dims, with and without the mask, multi-head (4 heads) on lengths around the 128-row
// tiles, and GQA (32 query heads over 8) on a longer one.
TEST(Sm90Attention, HeadDimsMasksAndLengths) {
  TL_SEEDED_RNG(rng);
  for (int d : {128, 64}) {
    for (bool causal : {false, true}) {
      for (int64_t seq : {1, 77, 128, 200, 1000}) run_case(shape("MHA", d, 4, 4, seq, causal), rng);
      run_case(shape("GQA", d, 32, 8, 200, causal), rng);
      run_case(shape("GQA", d, 32, 8, 2048 + 13, causal), rng);
    }
  }
}

// A persistent grid (num_sms blocks walking the items, the key/value ring and the Q buffer running
// on from item to item) and key/value walks that start inside the sequence and wrap past tile 0
// (a fused op's own rows first): the same outputs as the reference.
TEST(Sm90Attention, PersistentGridAndWalks) {
  TL_SEEDED_RNG(rng);
  for (int d : {128, 64}) {
    for (bool causal : {false, true}) {
      for (int sms : {1, 7, 132}) {
        Case c = shape("persistent", d, 8, 2, 1000 + 13, causal);
        c.batch = 2, c.num_sms = sms;
        run_case(c, rng);
      }
      for (int64_t from : {0, 300, 640, 1012}) {
        Case c = shape("walk", d, 4, 4, 1000 + 13, causal);
        c.kv_walk_from = from, c.num_sms = from == 300 ? 5 : 0;
        run_case(c, rng);
      }
      Case c = shape("shard walk", d, 4, 2, 200, causal);
      c.seq_k = 1000, c.q_pos0 = 400, c.kv_walk_from = 599;  // the shard's own keys first
      run_case(c, rng);
    }
  }
}

TEST(Sm90Attention, Fp16) {
  TL_SEEDED_RNG(rng);
  std::vector<Case> cases;
  cases.push_back(shape("fp16", 128, 4, 4, 1000, true));
  cases.push_back(shape("fp16", 64, 32, 8, 200, false));
  cases.push_back(shape("fp16", 128, 32, 8, 2048 + 13, false));
  cases.push_back(shape("fp16", 64, 4, 4, 77, true));
  for (Case& c : cases) {
    c.type = DType::kF16;
    run_case(c, rng);
  }
}

// seq_q != seq_k with the queries' and keys' own positions: a query shard at the end of a longer
// key sequence (q_pos0 = seq_k - seq_q), one query row (decoding), queries that start before the
// first key (their first rows see no key: O = 0, lse = -inf), a shard that sees no key at all, and
// without the mask (every row sees every key, whatever the positions).
TEST(Sm90Attention, QueryShardsWithPositions) {
  TL_SEEDED_RNG(rng);
  std::vector<Case> cases;
  auto add = [&](std::string what, int d, int hq, int hkv, int64_t sq, int64_t sk, bool causal,
                 int64_t q_pos0, int64_t kv_pos0) {
    Case c = shape(std::move(what), d, hq, hkv, sq, causal);
    c.seq_k = sk, c.q_pos0 = q_pos0, c.kv_pos0 = kv_pos0;
    cases.push_back(c);
  };
  add("last shard", 128, 32, 8, 200, 1000, true, 800, 0);
  add("last shard", 64, 4, 4, 77, 2048 + 13, true, 2048 + 13 - 77, 0);
  add("last shard, both offset", 128, 4, 4, 333, 1000, true, 5000 + 667, 5000);
  add("one query row", 128, 32, 8, 1, 2048 + 13, true, 2048 + 12, 0);
  add("one query row in the middle", 64, 4, 4, 1, 1000, true, 400, 0);
  add("shard before the keys start", 128, 4, 4, 300, 500, true, 0, 100);
  add("shard before the keys start", 64, 32, 8, 130, 64, true, 1000, 1100);
  add("no row sees a key", 128, 4, 4, 200, 300, true, 0, 5000);
  add("no mask", 128, 32, 8, 77, 1000, false, 5, 0);
  add("no mask, more queries than keys", 64, 4, 4, 1000, 77, false, 0, 900);
  add("more queries than keys", 128, 4, 4, 1000, 200, true, 0, 0);
  for (const Case& c : cases) run_case(c, rng);
}

// merge: the keys split into ranges, one call a range in some order (a ring's steps: the own
// range first, then the others), each call after the first folding its keys into O and lse;
// the result against the reference over all the keys. Ranges where some rows see no key (under
// the mask, keys past the row's position) and a padded O in batch 2 included.
void run_split_case(const Case& c, const std::vector<std::pair<int64_t, int64_t>>& ranges, test::Rng& rng) {
  SCOPED_TRACE(describe(c));
  ::testing::Message m;
  for (auto [lo, hi] : ranges) m << "[" << lo << ", " << hi << ") ";
  SCOPED_TRACE(m);
  Problem p(c, rng);
  const int es = dtype_size(c.type);
  bool first = true;
  for (auto [lo, hi] : ranges) {
    AttnArgs a = p.resolved;
    a.k = static_cast<const std::byte*>(p.args.k) + lo * p.k.ss * es;
    a.v = static_cast<const std::byte*>(p.args.v) + lo * p.v.ss * es;
    a.seq_k = hi - lo, a.kv_pos0 = c.kv_pos0 + lo, a.merge = !first;
    first = false;
    attention_forward(a, nullptr);
  }
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  expect_outputs(p, reference(p.resolved), p.o_now(), p.lse_now());
}

TEST(Sm90Attention, MergesKeyRanges) {
  TL_SEEDED_RNG(rng);
  for (int d : {128, 64}) {
    for (bool causal : {false, true}) {
      run_split_case(shape("two ranges", d, 4, 2, 1000 + 13, causal), {{0, 500}, {500, 1013}}, rng);
      run_split_case(shape("ring order", d, 8, 2, 777, causal), {{300, 600}, {0, 300}, {600, 777}}, rng);
      run_split_case(shape("later keys first", d, 4, 4, 1000, causal), {{900, 1000}, {1, 900}, {0, 1}}, rng);
    }
  }
  Case c = shape("fp16, padded O, batch 2", 128, 4, 4, 600, true);
  c.type = DType::kF16, c.batch = 2, c.o_layout = Layout::kPadded, c.kv_layout = Layout::kHeadMajor;
  run_split_case(c, {{128, 256}, {0, 128}, {256, 600}}, rng);
  c = shape("query shard", 128, 32, 8, 200, true);
  c.seq_k = 1000, c.q_pos0 = 800;
  run_split_case(c, {{800, 1000}, {0, 800}}, rng);
}

// Batch 2 with strides: padded rows and heads (every stride a multiple of 8, none packed) and
// [b, h, s, d] through the strides, mixed across Q, K/V and O, with NaN in every padding element.
TEST(Sm90Attention, StridedLayouts) {
  TL_SEEDED_RNG(rng);
  std::vector<Case> cases;
  Case c = shape("padded q/o, head-major k/v", 128, 8, 2, 333, true);
  c.batch = 2, c.q_layout = c.o_layout = Layout::kPadded, c.kv_layout = Layout::kHeadMajor;
  cases.push_back(c);
  c = shape("head-major q/o, padded k/v", 64, 4, 4, 200, false);
  c.batch = 2, c.seq_k = 457, c.type = DType::kF16;
  c.q_layout = c.o_layout = Layout::kHeadMajor, c.kv_layout = Layout::kPadded;
  cases.push_back(c);
  c = shape("all padded, last shard", 128, 4, 4, 200, true);
  c.batch = 2, c.seq_k = 457, c.q_pos0 = 257;
  c.q_layout = c.o_layout = c.kv_layout = Layout::kPadded;
  cases.push_back(c);
  c = shape("head-major q, padded o", 128, 32, 8, 1000, true);
  c.batch = 2, c.q_layout = Layout::kHeadMajor, c.o_layout = Layout::kPadded;
  cases.push_back(c);
  c = shape("all head-major", 64, 8, 8, 129, false);
  c.batch = 2, c.q_layout = c.o_layout = c.kv_layout = Layout::kHeadMajor;
  cases.push_back(c);
  for (const Case& x : cases) run_case(x, rng);
}

// lse in a layout of its own ([h, b, s], each row padded), lse not written (nullptr), and a scale
// other than the default (sharper rows).
TEST(Sm90Attention, LseLayoutsAndScale) {
  TL_SEEDED_RNG(rng);
  std::vector<Case> cases;
  Case c = shape("custom lse strides", 128, 8, 2, 1000, true);
  c.batch = 2, c.lse = LseLayout::kCustom;
  cases.push_back(c);
  c = shape("custom lse strides, rows that see no key", 64, 4, 4, 300, true);
  c.batch = 2, c.seq_k = 500, c.kv_pos0 = 100, c.lse = LseLayout::kCustom;
  cases.push_back(c);
  c = shape("no lse", 128, 32, 8, 200, false);
  c.lse = LseLayout::kNone;
  cases.push_back(c);
  c = shape("no lse", 64, 4, 4, 1000, true);
  c.batch = 2, c.lse = LseLayout::kNone, c.o_layout = Layout::kPadded;
  cases.push_back(c);
  c = shape("scale 0.5", 128, 4, 4, 1000, true);
  c.scale = 0.5f;
  cases.push_back(c);
  c = shape("scale 0.02", 64, 4, 4, 200, false);
  c.scale = 0.02f, c.lse = LseLayout::kCustom;
  cases.push_back(c);
  for (const Case& x : cases) run_case(x, rng);
}

// The launch captured once in a CUDA graph and replayed three times, O and lse poisoned before
// each replay: every replay writes the same bytes, and the first matches the reference.
TEST(Sm90Attention, GraphReplaysAreIdentical) {
  TL_SEEDED_RNG(rng);
  Case c = shape("graph", 128, 32, 8, 1000, true);
  c.batch = 2, c.seq_q = 777, c.q_pos0 = 1000 - 777, c.o_layout = Layout::kPadded;
  c.lse = LseLayout::kCustom;
  SCOPED_TRACE(describe(c));
  Problem p(c, rng);

  cudaStream_t s;
  TL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TL_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  attention_forward(p.args, s);
  TL_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  TL_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  // Nothing ran while capturing.
  EXPECT_EQ(p.o_now(), p.o_before);

  std::vector<Bytes> o, lse;
  for (int replay = 0; replay < 3; ++replay) {
    p.poison();
    TL_CUDA_CHECK(cudaDeviceSynchronize());
    TL_CUDA_CHECK(cudaGraphLaunch(exec, s));
    TL_CUDA_CHECK(cudaStreamSynchronize(s));
    o.push_back(p.o_now());
    lse.push_back(p.lse_now());
  }
  expect_outputs(p, reference(p.resolved), o[0], lse[0]);
  for (int replay = 1; replay < 3; ++replay) {
    EXPECT_EQ(o[replay], o[0]) << "O of replay " << replay << " differs from replay 0's";
    EXPECT_EQ(lse[replay], lse[0]) << "lse of replay " << replay << " differs from replay 0's";
  }
  TL_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TL_CUDA_CHECK(cudaGraphDestroy(graph));
  TL_CUDA_CHECK(cudaStreamDestroy(s));
}

// Each bad argument is refused (tilelink::Error naming the field) by the check and by the launch,
// before anything runs: the poisoned O and lse stay as they were.
TEST(Sm90Attention, RefusesBadArguments) {
  TL_SEEDED_RNG(rng);
  Case c = shape("refused", 128, 8, 2, 200, true);
  c.batch = 2;
  SCOPED_TRACE(describe(c));
  Problem p(c, rng);
  const AttnArgs good = p.args;
  EXPECT_NO_THROW(attention_check(good));

  struct Bad {
    const char* what;
    const char* needle;  // in the message
    AttnArgs args;
  };
  std::vector<Bad> bad;
  auto with = [&](const char* what, const char* needle, auto&& edit) {
    AttnArgs a = good;
    edit(a);
    bad.push_back({what, needle, a});
  };
  with("null q", "q", [](AttnArgs& a) { a.q = nullptr; });
  with("null k", "k", [](AttnArgs& a) { a.k = nullptr; });
  with("null v", "v", [](AttnArgs& a) { a.v = nullptr; });
  with("null o", "o", [](AttnArgs& a) { a.o = nullptr; });
  with("head_dim 96", "head_dim", [](AttnArgs& a) { a.head_dim = 96; });
  with("head_dim 256", "head_dim", [](AttnArgs& a) { a.head_dim = 256; });
  with("heads_q not a multiple of heads_kv", "heads_", [](AttnArgs& a) { a.heads_kv = 3; });
  with("heads_kv above heads_q", "heads_", [](AttnArgs& a) { a.heads_q = 2, a.heads_kv = 8; });
  with("heads_kv 0", "heads_kv", [](AttnArgs& a) { a.heads_kv = 0; });
  with("q_stride_s not a multiple of 8", "stride", [](AttnArgs& a) {
    a.q_stride_s = 8 * 128 + 4, a.q_stride_h = 128, a.q_stride_b = 200 * 1028;
  });
  with("k_stride_h not a multiple of 8", "stride", [](AttnArgs& a) {
    a.k_stride_h = 132, a.k_stride_s = 2 * 132, a.k_stride_b = 200 * 2 * 132;
  });
  with("o_stride_b not a multiple of 8", "stride", [](AttnArgs& a) {
    a.o_stride_h = 128, a.o_stride_s = 8 * 128, a.o_stride_b = 200 * 8 * 128 + 1;
  });
  with("dtype fp32", "dtype", [](AttnArgs& a) { a.dtype = DType::kF32; });
  with("seq_q 0", "seq_q", [](AttnArgs& a) { a.seq_q = 0; });
  with("seq_k 0", "seq_k", [](AttnArgs& a) { a.seq_k = 0; });
  with("batch 0", "batch", [](AttnArgs& a) { a.batch = 0; });
  with("merge without lse", "merge", [](AttnArgs& a) { a.merge = true, a.lse = nullptr; });
  for (const Bad& x : bad) {
    SCOPED_TRACE(x.what);
    test::expect_refused([&] { attention_check(x.args); }, x.needle);
    test::expect_refused([&] { attention_forward(x.args, nullptr); }, x.needle);
  }
  TL_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(p.o_now(), p.o_before);
  EXPECT_EQ(p.lse_now(), p.lse_before);
}

}  // namespace
