// GPU tests of sequence-parallel attention, sp_attn and ring_attn, on virtual ranks (ops/attention_cuda.hpp, run on an
// H100/H200): worlds 1-4 and 8, ragged contiguous shards with an empty one, zigzag shards (odd
// worlds and odd lengths included), causal and not, GQA, both
// head dims, bf16 and fp16, batch 2, lse given or not; several calls on fresh inputs; graph replays.
// Every rank's O and lse start poisoned (0xFF: NaN); each call is compared with the float64
// attention of the whole sequence (compute/cpu_attention.hpp) on every element, and sp_attn's fused
// call with its unfused baseline bit for bit (ring_attn merges W softmaxes: close, not equal). Bad arguments are refused before anything is launched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>

#include "../support/gpu.hpp"
#include "../support/random.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/compute/cpu_attention.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/ops/attention_cuda.hpp"
#include "tilelink/runtime/graph.hpp"
#include "tilelink/runtime/world.hpp"

namespace {

using namespace tilelink;
namespace tlc = tilelink::cuda;
using test::DeviceBuffer;
using Bytes = std::vector<std::byte>;

struct Case {
  int world = 2;
  SpAttnShape shape;
  SeqShard shard = SeqShard::kContiguous;
  std::vector<int64_t> split;  // contiguous: S_r per rank (zigzag: filled from the sharding)
  DType dtype = DType::kBF16;
  bool lse = true;
  tlc::Transport transport = tlc::Transport::kVirtual;  // peer: a GPU a rank
};

::testing::Message describe(const Case& c) {
  ::testing::Message m;
  m << "world " << c.world << " " << tlc::transport_name(c.transport) << (c.shard == SeqShard::kZigzag ? " zigzag" : "") << ", batch " << c.shape.batch << ", S " << c.shape.seq << " (";
  for (int64_t n : c.split) m << n << " ";
  m << "), heads " << c.shape.heads_q << "/" << c.shape.heads_kv << ", D " << c.shape.head_dim
    << (c.shape.causal ? ", causal" : ", no mask") << ", " << dtype_name(c.dtype) << (c.lse ? ", lse" : "");
  return m;
}

// One case's world, op (tlc::SpAttn or tlc::RingAttn) and device buffers; call() runs the fused op
// or its baseline on the inputs last uploaded and returns every rank's O and lse.
template <class Op>
class Harness {
 public:
  explicit Harness(const Case& c)
      : c_(c),
        world_(tlc::WorldOptions{.transport = c.transport, .world_size = c.world}),
        sharding_(SeqSharding::make(c.shard, c.shape.seq, c.world, c.split)),
        op_(world_, c.shape, sharding_, c.dtype) {
    c_.split.resize(c.world);
    for (int r = 0; r < c.world; ++r) c_.split[r] = sharding_.rows.size(r);
    const int64_t eb = dtype_size(c.dtype);
    for (int r = 0; r < c.world; ++r) {
      world_.bind(r);
      const int64_t n = c_.split[r];
      q_.push_back(std::make_unique<DeviceBuffer>(c.shape.batch * n * c.shape.heads_q * c.shape.head_dim * eb));
      k_.push_back(std::make_unique<DeviceBuffer>(c.shape.batch * n * c.shape.heads_kv * c.shape.head_dim * eb));
      v_.push_back(std::make_unique<DeviceBuffer>(c.shape.batch * n * c.shape.heads_kv * c.shape.head_dim * eb));
      o_.push_back(std::make_unique<DeviceBuffer>(q_.back()->bytes));
      lse_.push_back(std::make_unique<DeviceBuffer>(c.shape.batch * n * c.shape.heads_q * sizeof(float)));
    }
  }

  tlc::World& world() { return world_; }

  // Every rank's shards of the whole-sequence tensors ([B, S, H, D], position order).
  void upload(const Bytes& q, const Bytes& k, const Bytes& v) {
    for (int r = 0; r < c_.world; ++r) {
      world_.bind(r);
      q_[r]->put(shard(q, c_.shape.heads_q, r));
      k_[r]->put(shard(k, c_.shape.heads_kv, r));
      v_[r]->put(shard(v, c_.shape.heads_kv, r));
    }
  }
  void poison() {
    for (int r = 0; r < c_.world; ++r) {
      world_.bind(r);
      TL_CUDA_CHECK(cudaMemset(o_[r]->p, 0xff, o_[r]->bytes));
      TL_CUDA_CHECK(cudaMemset(lse_[r]->p, 0xff, lse_[r]->bytes));
    }
  }
  // Enqueues one call on every rank's stream (no sync): fused, unfused or on the model's path.
  void enqueue(bool fused) {
    with_operands([&](auto&... x) { fused ? op_.run(x...) : op_.run_unfused(x...); });
  }
  void enqueue_auto() {
    with_operands([&](auto&... x) { op_.run_auto(x...); });
  }
  Op& op() { return op_; }
  // O and lse of every rank, concatenated in rank order.
  Bytes outputs() {
    Bytes out;
    for (int r = 0; r < c_.world; ++r) {
      world_.bind(r);
      Bytes o(o_[r]->bytes), l(lse_[r]->bytes);
      o_[r]->get(o.data(), o.size());
      lse_[r]->get(l.data(), l.size());
      out.insert(out.end(), o.begin(), o.end());
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  }

  // Checks outputs() against the float64 attention of the whole sequence.
  void expect_matches(const Bytes& out, const Bytes& q, const Bytes& k, const Bytes& v) const {
    const SpAttnShape& s = c_.shape;
    const int64_t eb = dtype_size(c_.dtype), qrow = s.heads_q * s.head_dim, kvrow = s.heads_kv * s.head_dim;
    std::vector<int64_t> pos(s.seq);
    std::iota(pos.begin(), pos.end(), 0);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    size_t at = 0;
    std::vector<size_t> o_at(c_.world), l_at(c_.world);
    for (int r = 0; r < c_.world; ++r) {
      o_at[r] = at;
      at += static_cast<size_t>(s.batch * c_.split[r] * qrow * eb);
      l_at[r] = at;
      at += static_cast<size_t>(s.batch * c_.split[r] * s.heads_q * sizeof(float));
    }
    for (int b = 0; b < s.batch; ++b) {
      const AttnReference ref = attention_reference_f64(
          q.data() + b * s.seq * qrow * eb, k.data() + b * s.seq * kvrow * eb, v.data() + b * s.seq * kvrow * eb,
          c_.dtype, s.seq, s.seq, s.heads_q, s.heads_kv, s.head_dim, pos, scale, s.causal);
      for (int r = 0; r < c_.world; ++r) {
        const int64_t n = c_.split[r];
        for (int64_t i = 0; i < n; ++i) {
          const int64_t at_pos = sharding_.position_of(r, i);
          double row_max = 0, row_err = 0;
          for (int64_t e = 0; e < qrow; ++e) {
            const double want = ref.out[at_pos * qrow + e];
            const double got = load_as_float(out.data() + o_at[r], c_.dtype, (b * n + i) * qrow + e);
            row_max = std::max(row_max, std::abs(want));
            row_err = std::max(row_err, std::isnan(got) ? INFINITY : std::abs(got - want));
          }
          ASSERT_LE(row_err, 2e-2 * std::max(1.0, row_max)) << "rank " << r << ", batch " << b << ", row " << i;
          if (!c_.lse) continue;
          for (int h = 0; h < s.heads_q; ++h) {
            float got;
            std::memcpy(&got, out.data() + l_at[r] + ((b * n + i) * s.heads_q + h) * sizeof(float), sizeof(float));
            const double want = ref.lse[at_pos * s.heads_q + h];
            ASSERT_LE(std::abs(got - want), 1e-3 * (1 + std::abs(want)))
                << "lse: rank " << r << ", batch " << b << ", row " << i << ", head " << h;
          }
        }
      }
    }
  }

 private:
  // fn(q, k, v, o, lse): every rank's device operands.
  template <class Fn>
  void with_operands(Fn&& fn) {
    std::vector<const void*> q(c_.world), k(c_.world), v(c_.world);
    std::vector<void*> o(c_.world);
    std::vector<float*> lse(c_.world);
    for (int r = 0; r < c_.world; ++r) {
      q[r] = q_[r]->p, k[r] = k_[r]->p, v[r] = v_[r]->p, o[r] = o_[r]->p;
      lse[r] = c_.lse ? lse_[r]->as<float>() : nullptr;
    }
    fn(q, k, v, o, lse);
  }
  Bytes shard(const Bytes& all, int heads, int r) const {
    const SpAttnShape& s = c_.shape;
    const int64_t row = heads * s.head_dim * dtype_size(c_.dtype), n = c_.split[r];
    Bytes out(static_cast<size_t>(std::max<int64_t>(s.batch * n * row, 1)));
    for (int b = 0; b < s.batch; ++b)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(out.data() + (b * n + i) * row, all.data() + (b * s.seq + sharding_.position_of(r, i)) * row, row);
    return out;
  }

  Case c_;
  tlc::World world_;
  SeqSharding sharding_;
  Op op_;
  std::vector<std::unique_ptr<DeviceBuffer>> q_, k_, v_, o_, lse_;
};

// Fresh inputs, fused and unfused each from poisoned outputs: both against float64, and (sp_attn)
// equal.
template <class Op = tlc::SpAttn>
void run_case(const Case& c, test::Rng& rng, int calls = 2) {
  SCOPED_TRACE(describe(c));
  Harness<Op> h(c);
  const SpAttnShape& s = c.shape;
  for (int call = 0; call < calls; ++call) {
    const Bytes q = rng.tensor(c.dtype, s.batch * s.seq * s.heads_q * s.head_dim);
    const Bytes k = rng.tensor(c.dtype, s.batch * s.seq * s.heads_kv * s.head_dim);
    const Bytes v = rng.tensor(c.dtype, s.batch * s.seq * s.heads_kv * s.head_dim);
    h.upload(q, k, v);
    h.world().sync("inputs");
    h.poison();
    h.enqueue(true);
    h.world().sync("sp_attn");
    const Bytes fused = h.outputs();
    h.poison();
    h.enqueue(false);
    h.world().sync("sp_attn(unfused)");
    const Bytes unfused = h.outputs();
    h.expect_matches(fused, q, k, v);
    if constexpr (std::is_same_v<Op, tlc::SpAttn>) {
      EXPECT_TRUE(fused == unfused) << "fused and unfused differ (call " << call << ")";
    } else {
      h.expect_matches(unfused, q, k, v);
    }
  }
}

Case make(int world, int64_t seq, int hq, int hkv, int d, bool causal, test::Rng& rng) {
  Case c;
  c.world = world;
  c.shape.seq = seq, c.shape.heads_q = hq, c.shape.heads_kv = hkv, c.shape.head_dim = d, c.shape.causal = causal;
  c.split = rng.uneven_counts(seq, world);
  return c;
}

TEST(SpAttnCuda, WorldsShardsAndMasks) {
  TL_SEEDED_RNG(rng);
  for (int world : {1, 2, 3, 4, 8})
    for (bool causal : {false, true}) run_case(make(world, 700 + 13 * world, 8, 2, 128, causal, rng), rng);
}

TEST(SpAttnCuda, EvenShardsHeadDim64Fp16AndBatch) {
  TL_SEEDED_RNG(rng);
  Case c = make(4, 1024, 4, 4, 64, true, rng);
  c.split = {256, 256, 256, 256};
  run_case(c, rng);
  c = make(2, 600, 8, 4, 128, false, rng);
  c.dtype = DType::kF16, c.shape.batch = 2, c.lse = false;
  run_case(c, rng);
  c = make(3, 500, 4, 1, 64, true, rng);
  c.split = {0, 300, 200};  // an empty shard
  run_case(c, rng);
}

// Zigzag shards: rank r holds chunks r and 2W - 1 - r; the gathered keys sit in position order.
TEST(SpAttnCuda, ZigzagShards) {
  TL_SEEDED_RNG(rng);
  for (int world : {1, 2, 3, 4, 8}) {
    for (bool causal : {false, true}) {
      Case c = make(world, 300 + 37 * world, 4, 2, 128, causal, rng);
      c.shard = SeqShard::kZigzag, c.split.clear();
      run_case(c, rng);
    }
  }
  Case c = make(2, 530, 4, 4, 64, true, rng);
  c.shard = SeqShard::kZigzag, c.split.clear();
  c.dtype = DType::kF16, c.shape.batch = 2;
  run_case(c, rng);
  c = make(4, 13, 4, 2, 128, true, rng);  // chunks of one or two rows
  c.shard = SeqShard::kZigzag, c.split.clear();
  run_case(c, rng);
}

// A captured call replayed on fresh inputs gives what an eager call gives.
template <class Op>
void graph_replays(test::Rng& rng, tlc::Transport transport = tlc::Transport::kVirtual) {
  Case c = make(2, 900, 8, 2, 128, true, rng);
  c.transport = transport;
  Harness<Op> h(c);
  const SpAttnShape& s = c.shape;
  tlc::WorldGraph graph(h.world(), [&] { h.enqueue(true); });
  for (int replay = 0; replay < 3; ++replay) {
    const Bytes q = rng.tensor(c.dtype, s.seq * s.heads_q * s.head_dim);
    const Bytes k = rng.tensor(c.dtype, s.seq * s.heads_kv * s.head_dim);
    const Bytes v = rng.tensor(c.dtype, s.seq * s.heads_kv * s.head_dim);
    h.upload(q, k, v);
    h.world().sync("inputs");
    h.poison();
    graph.replay();
    h.world().sync("sp_attn (graph)");
    h.expect_matches(h.outputs(), q, k, v);
  }
}

TEST(SpAttnCuda, GraphReplays) {
  TL_SEEDED_RNG(rng);
  graph_replays<tlc::SpAttn>(rng);
}

// ring_attn: every world with ragged contiguous shards (an empty one among them) and zigzag shards,
// causal and not, GQA, D 64, fp16, batch 2, without lse (the op's own buffer carries the merges).
TEST(RingAttnCuda, WorldsShardsAndMasks) {
  TL_SEEDED_RNG(rng);
  for (int world : {1, 2, 3, 4, 8}) {
    for (bool causal : {false, true}) {
      run_case<tlc::RingAttn>(make(world, 300 + 29 * world, 4, 2, 128, causal, rng), rng);
      Case c = make(world, 280 + 31 * world, 4, 2, 128, causal, rng);
      c.shard = SeqShard::kZigzag, c.split.clear();
      run_case<tlc::RingAttn>(c, rng);
    }
  }
  Case c = make(3, 500, 4, 1, 64, true, rng);
  c.split = {200, 0, 300};  // an empty shard passes blocks of no rows
  c.dtype = DType::kF16, c.shape.batch = 2, c.lse = false;
  run_case<tlc::RingAttn>(c, rng);
  c = make(4, 600, 8, 8, 64, false, rng);
  c.lse = false;
  run_case<tlc::RingAttn>(c, rng, 3);
}

// The path model on virtual ranks: unfused (the copies share the ranks' SMs: measured slower fused),
// the bare engine at world 1; run_auto gives what the chosen path gives.
TEST(SpAttnCuda, AutoPath) {
  TL_SEEDED_RNG(rng);
  for (int world : {1, 2}) {
    Case c = make(world, 400, 4, 2, 128, true, rng);
    {
      Harness<tlc::RingAttn> hr(c);
      EXPECT_EQ(hr.op().choose().path, world == 1 ? OpPath::kFused : OpPath::kUnfused) << hr.op().choose().why;
    }
    Harness<tlc::SpAttn> h(c);
    tlc::SpAttn& op = h.op();
    EXPECT_EQ(op.choose().path, world == 1 ? OpPath::kFused : OpPath::kUnfused) << op.choose().why;
    EXPECT_EQ(op.choose(OpPath::kFused).path, OpPath::kFused);
    const Bytes q = rng.tensor(c.dtype, c.shape.seq * c.shape.heads_q * c.shape.head_dim);
    const Bytes k = rng.tensor(c.dtype, c.shape.seq * c.shape.heads_kv * c.shape.head_dim);
    const Bytes v = rng.tensor(c.dtype, c.shape.seq * c.shape.heads_kv * c.shape.head_dim);
    h.upload(q, k, v);
    h.world().sync("inputs");
    h.poison();
    h.enqueue_auto();
    h.world().sync("sp_attn (auto)");
    h.expect_matches(h.outputs(), q, k, v);
  }
}

TEST(RingAttnCuda, GraphReplays) {
  TL_SEEDED_RNG(rng);
  graph_replays<tlc::RingAttn>(rng);
}

TEST(SpAttnCuda, RefusesWhatItCannotRun) {
  tlc::World world(tlc::WorldOptions{.transport = tlc::Transport::kVirtual, .world_size = 2});
  SpAttnShape s;
  s.seq = 256, s.heads_q = 4, s.heads_kv = 2, s.head_dim = 128;
  const SeqSharding even = SeqSharding::make(SeqShard::kContiguous, 256, 2, {128, 128});
  EXPECT_THROW(tlc::SpAttn(world, s, even, DType::kF32), Error);
  SpAttnShape d96 = s;
  d96.head_dim = 96;
  EXPECT_THROW(tlc::SpAttn(world, d96, even, DType::kBF16), Error);
  tlc::SpAttn op(world, s, even, DType::kBF16);
  std::vector<const void*> none(2, nullptr);
  std::vector<void*> none_o(2, nullptr);
  std::vector<float*> no_lse(2, nullptr);
  EXPECT_THROW(op.run(none, none, none, none_o, no_lse), Error);  // null tensors
  std::vector<const void*> one(1, nullptr);
  EXPECT_THROW(op.run(one, one, one, none_o, no_lse), Error);  // one entry for two ranks
  tlc::RingAttn ring(world, s, even, DType::kBF16);
  EXPECT_THROW(ring.run(none, none, none, none_o, no_lse), Error);
  EXPECT_THROW(ring.run(one, one, one, none_o, no_lse), Error);
  EXPECT_THROW(tlc::RingAttn(world, d96, even, DType::kBF16), Error);
}

// A GPU a rank (peer): sp_attn's engine a block an item waiting per tile beside the copy engines'
// pulls, its own pieces moved before it starts; the baseline's AllGather is NCCL's (rank order for
// contiguous shards, a broadcast a chunk for zigzag ones); both against float64 and equal. The
// ring between GPUs, and captured calls of both.
TEST(SpAttnCudaPeer, SeparateGpus) {
  TL_SKIP_UNLESS_GPUS(2);
  TL_SEEDED_RNG(rng);
  const int gpus = std::min(test::gpu_count(), 4);
  for (int world = 2; world <= gpus; ++world) {
    for (bool causal : {false, true}) {
      Case c = make(world, 700 + 13 * world, 8, 2, 128, causal, rng);
      c.transport = tlc::Transport::kPeer;
      run_case(c, rng);
      c.shard = SeqShard::kZigzag, c.split.clear();
      run_case(c, rng);
      run_case<tlc::RingAttn>(c, rng);
    }
  }
  Case c = make(2, 600, 8, 4, 64, true, rng);
  c.transport = tlc::Transport::kPeer, c.split = {0, 600};  // an empty shard
  c.dtype = DType::kF16, c.shape.batch = 2;
  run_case(c, rng);
  run_case<tlc::RingAttn>(c, rng);
  c.split = {300, 300};  // even: one ncclAllGather a batch entry and tensor
  run_case(c, rng);
  graph_replays<tlc::SpAttn>(rng, tlc::Transport::kPeer);
  graph_replays<tlc::RingAttn>(rng, tlc::Transport::kPeer);
}

}  // namespace
