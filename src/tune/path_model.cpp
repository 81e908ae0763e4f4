#include "tilelink/tune/path_model.hpp"

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include "tilelink/core/error.hpp"

namespace tilelink {

const char* op_path_name(OpPath p) {
  switch (p) {
    case OpPath::kAuto: return "auto";
    case OpPath::kFused: return "fused";
    case OpPath::kUnfused: return "unfused";
  }
  return "?";
}

bool parse_op_path(const std::string& s, OpPath* out) {
  if (s == "auto") { *out = OpPath::kAuto; return true; }
  if (s == "fused") { *out = OpPath::kFused; return true; }
  if (s == "unfused") { *out = OpPath::kUnfused; return true; }
  return false;
}

double ag_gemm_comm_bytes(const AgGemmPlan& p) {
  return static_cast<double>(p.m() - p.ag.own_rows().size()) * p.k * dtype_size(p.dtype);
}

double gemm_rs_comm_bytes(const GemmRsPlan& p) {
  return static_cast<double>(p.rows.size(p.rank)) * p.n * dtype_size(p.dtype) * (p.world_size - 1);
}

PathChoice choose_path(double flops, double comm_bytes, const MachineModel& m, OpPath requested,
                       int comm_tiles, double fused_gemm_us) {
  TL_REQUIRE(m.sms >= 1 && m.gemm_sms >= 1 && m.gemm_sms <= m.sms,
             "path model: SM counts must satisfy 1 <= gemm_sms (" << m.gemm_sms << ") <= sms ("
                                                               << m.sms << ")");
  TL_REQUIRE(m.gemm_tflops > 0 && m.link_gbps > 0, "path model: rates must be positive");
  TL_REQUIRE(m.direct_exposed >= 0,
             "path model: direct_exposed must be >= 0, got " << m.direct_exposed);
  PathChoice c;
  if (requested != OpPath::kAuto) {
    c.path = requested;
    c.why = std::string("forced by the caller (") + op_path_name(requested) + ")";
    return c;
  }
  if (m.ranks_share_gpu) {
    c.path = OpPath::kUnfused;
    c.why = "ranks share one GPU: the copies compete with the GEMM for its SMs (measured slower fused)";
    return c;
  }
  const double t_gemm_all = flops / (m.gemm_tflops * 1e12) * 1e6;
  const double t_gemm_fused = fused_gemm_us > 0 ? fused_gemm_us : t_gemm_all * m.sms / m.gemm_sms;
  // The baseline's collective moves the bytes in one go; the fused comm program pays per tile too.
  const double t_comm = comm_bytes / (m.link_gbps * 1e9) * 1e6;
  const double t_comm_tiled = t_comm + comm_tiles * m.comm_tile_us;
  c.unfused_us = t_gemm_all + t_comm;
  c.fused_us = std::max(t_gemm_fused, t_comm_tiled) +
               (m.own_rows_direct ? m.direct_exposed * t_comm : m.fused_overhead_us);
  c.path = c.fused_us <= c.unfused_us * (1 - m.margin) ? OpPath::kFused : OpPath::kUnfused;
  std::ostringstream os;
  os << "predicted fused " << c.fused_us << " us vs unfused " << c.unfused_us << " us (gemm "
     << t_gemm_all << " us on all SMs, " << t_gemm_fused << " us on " << m.gemm_sms << ", comm "
     << t_comm << " us, " << t_comm_tiled << " us in " << comm_tiles << " tiles"
     << (m.own_rows_direct ? ", own rows read from A_r" : "") << ")";
  c.why = os.str();
  return c;
}

namespace {
// One rank: nothing to communicate, and the fused op is the bare engine (no comm program, no hooks),
// measured 0.99-1.00x of the bare engine on 8 shapes (bench/notes/fused_ops_cuda.md), while the
// baseline still pays a one-rank collective (a local copy: 0.05-0.19 ms at 8192 rows).
bool single_rank(int world_size, OpPath requested, PathChoice* c) {
  if (world_size != 1 || requested != OpPath::kAuto) return false;
  c->path = OpPath::kFused;
  c->why = "one rank: nothing to communicate, the fused op is the bare engine";
  return true;
}
}  // namespace

PathChoice choose_path(const AgGemmPlan& p, const MachineModel& m, OpPath requested) {
  if (PathChoice c; single_rank(p.world_size, requested, &c)) return c;
  // The tiles this rank pulls (or pushes) from or to its peers.
  const int remote = p.config.mode == CommMode::kPull ? p.ag.tiles.num_tiles() - p.ag.own_count()
                                                      : p.ag.own_count() * (p.world_size - 1);
  return choose_path(2.0 * p.m() * p.n * p.k, ag_gemm_comm_bytes(p), m, requested, remote);
}

double gemm_rs_reduce_us(const GemmRsPlan& p, const MachineModel& m, int reduce_sms) {
  TL_REQUIRE(reduce_sms >= 1 && m.reduce_sm_gbps > 0 && m.reduce_peak_gbps > 0,
             "path model: the reduce needs SMs (" << reduce_sms << ") and positive rates");
  const double out_bytes = static_cast<double>(p.rows.size(p.rank)) * p.n * dtype_size(p.dtype);
  const double work = out_bytes * p.world_size / 2;  // the rates are for two sources
  return work / (std::min(reduce_sms * m.reduce_sm_gbps, m.reduce_peak_gbps) * 1e9) * 1e6;
}

namespace {
// One gemm tile on one SM at the wave rate, us.
double gemm_rs_tile_us(const GemmRsPlan& p, const MachineModel& m) {
  TL_REQUIRE(m.rs_sm_tflops > 0, "path model: rs_sm_tflops must be positive");
  return 2.0 * p.gemm.tile_m * p.gemm.tile_n * p.k / (m.rs_sm_tflops * 1e12) * 1e6;
}
}  // namespace

double gemm_rs_gemm_us(const GemmRsPlan& p, const MachineModel& m, int gemm_sms) {
  TL_REQUIRE(gemm_sms >= 1, "path model: the GEMM needs SMs, got " << gemm_sms);
  const int64_t waves = ceil_div(p.gemm.num_tiles(), gemm_sms);
  return static_cast<double>(waves) * gemm_rs_tile_us(p, m);
}

double gemm_rs_after_us(const GemmRsPlan& p, const MachineModel& m, int reduce_sms) {
  TL_REQUIRE(reduce_sms >= 1 && reduce_sms < m.sms,
             "path model: the reduce needs 1.." << m.sms - 1 << " SMs, got " << reduce_sms);
  TL_REQUIRE(m.reduce_during_gbps > 0 && m.reduce_after_gbps > 0,
             "path model: reduce rates must be positive");
  const int gemm_sms = m.sms - reduce_sms;
  const double out_bytes = static_cast<double>(p.rows.size(p.rank)) * p.n * dtype_size(p.dtype);
  const double work = out_bytes * p.world_size / 2;  // the rates are for two sources
  const double t_gemm = gemm_rs_gemm_us(p, m, gemm_sms);
  const double waves = static_cast<double>(ceil_div(p.gemm.num_tiles(), gemm_sms));
  const double during = reduce_sms * m.reduce_during_gbps * 1e3 * t_gemm;  // bytes (GB/s x us)
  const double left = std::max(work - during, work / waves);
  return left / (m.reduce_after_gbps * 1e3) + m.rs_fused_overhead_us +
         m.rs_tail_tiles * gemm_rs_tile_us(p, m);
}

double gemm_rs_fused_us(const GemmRsPlan& p, const MachineModel& m, int reduce_sms) {
  return gemm_rs_gemm_us(p, m, m.sms - reduce_sms) + gemm_rs_after_us(p, m, reduce_sms);
}

int gemm_rs_reduce_sms(const GemmRsPlan& p, const MachineModel& m) {
  TL_REQUIRE(m.sms >= 8, "path model: GEMM+RS needs a GPU of 8 SMs or more, got " << m.sms);
  int best = 2;
  for (int sms = 3; sms <= m.sms / 4; ++sms)
    if (gemm_rs_fused_us(p, m, sms) <= gemm_rs_fused_us(p, m, best)) best = sms;
  return best;
}

PathChoice choose_path(const GemmRsPlan& p, const MachineModel& m, OpPath requested) {
  if (PathChoice c; single_rank(p.world_size, requested, &c)) return c;
  if (p.config.mode == CommMode::kPush && requested == OpPath::kAuto) {
    // NOTE: the model below is pull's (its reduce rates, the GEMM's SMs joining the reduce); push
    // pays its pushes on SMs beside the GEMM and measured slower than the baseline on every shape.
    PathChoice c;
    c.path = OpPath::kUnfused;
    c.why =
        "push: measured 0.57-0.97x of cuBLAS+NCCL on every shape on two H200s (bench/notes/"
        "fused_ops_cuda.md, push); the model predicts pull only (--path fused forces push)";
    return c;
  }
  const int reduce_sms = m.sms - m.gemm_sms;
  MachineModel rs = m;
  rs.fused_overhead_us = reduce_sms >= 1 ? gemm_rs_after_us(p, m, reduce_sms) : 0;
  return choose_path(2.0 * p.m() * p.n * p.k, gemm_rs_comm_bytes(p), rs, requested, 0,
                     gemm_rs_gemm_us(p, m, m.gemm_sms));
}

// ---- sequence-parallel attention ----------------------------------------------------------------

double attention_rank_flops(const AttnLayout& p) {
  double pairs = 0;
  for (const QueryRun& q : query_runs(p)) {
    const double n = static_cast<double>(q.rows);
    pairs += p.shape.causal ? n * static_cast<double>(q.pos0) + n * (n + 1) / 2 : n * static_cast<double>(p.shape.seq);
  }
  return 4.0 * p.shape.batch * p.shape.heads_q * static_cast<double>(p.shape.head_dim) * pairs;
}

double sp_attn_comm_bytes(const SpAttnPlan& p) {
  const int64_t needed = keys_needed(p);
  double rows = 0;
  for (int o = 0; o < p.world_size; ++o) {
    if (o == p.rank) continue;
    for (const KeyPiece& k : key_pieces(p.sharding, o))
      if (k.pos.begin < needed) rows += static_cast<double>(k.pos.size());
  }
  return 2.0 * p.shape.batch * rows * static_cast<double>(p.kv_row_bytes());
}

double ring_attn_comm_bytes(const RingAttnPlan& p) {
  double rows = 0;
  for (int s = 1; s < p.steps(); ++s) rows += static_cast<double>(p.sharding.rows.size(p.owner_at(s)));
  return 2.0 * p.shape.batch * rows * static_cast<double>(p.kv_row_bytes());
}

PathChoice choose_path(const SpAttnPlan& p, const MachineModel& m, OpPath requested) {
  if (PathChoice c; single_rank(p.world_size, requested, &c)) return c;
  const int64_t needed = keys_needed(p);
  int pieces = 0;
  for (int o = 0; o < p.world_size; ++o)
    for (const KeyPiece& k : key_pieces(p.sharding, o)) pieces += o != p.rank && k.pos.begin < needed;
  MachineModel a = m;
  a.gemm_tflops = m.attn_tflops;
  return choose_path(attention_rank_flops(p), sp_attn_comm_bytes(p), a, requested, 2 * p.shape.batch * pieces);
}

// ---- MoE ----------------------------------------------------------------------------------------

double moe_ag_gemm_comm_bytes(const MoeAgGemmPlan& p) {
  const int64_t peers_tokens = p.tokens() - p.x.own_rows().size();
  return static_cast<double>(peers_tokens) * static_cast<double>(p.x.row_bytes + p.ids.row_bytes + p.weights.row_bytes);
}

double moe_gemm_rs_comm_bytes(const MoeGemmRsPlan& p) {
  // the partial's rows of every other rank's segment, out (a ReduceScatter moves as much in)
  const int64_t others = p.tokens() - p.rs.rows.size(p.rank);
  return static_cast<double>(others) * static_cast<double>(p.hidden) * dtype_size(p.dtype);
}

namespace {

PathChoice forced_or_shared(const MachineModel& m, OpPath requested, int world_size, bool* decided) {
  PathChoice c;
  *decided = true;
  if (requested != OpPath::kAuto) {
    c.path = requested;
    c.why = std::string("forced by the caller (") + op_path_name(requested) + ")";
  } else if (m.ranks_share_gpu && world_size > 1) {
    c.path = OpPath::kUnfused;
    c.why = "ranks share one GPU: the copies run on its SMs and HBM beside the GEMM (measured slower fused)";
  } else {
    *decided = false;
  }
  return c;
}

struct MoeCost {
  double fused_us = 0, unfused_us = 0;
  std::string parts;
};

void check_moe_model(const MachineModel& m) {
  TL_REQUIRE(m.sms >= 1 && m.gemm_sms >= 1 && m.gemm_sms <= m.sms,
             "path model: SM counts must satisfy 1 <= gemm_sms (" << m.gemm_sms << ") <= sms (" << m.sms << ")");
  TL_REQUIRE(m.gemm_tflops > 0 && m.link_gbps > 0 && m.hbm_pass_gbps > 0 && m.moe_gathered_rate > 0 &&
                 m.moe_gathered_rate <= 1 && m.moe_grouped_share > 0,
             "path model: rates must be positive (moe_gathered_rate at most 1), got moe_gathered_rate "
                 << m.moe_gathered_rate);
  TL_REQUIRE(m.moe_tile_rows >= 1 && m.moe_gathered_margin >= 0 && m.moe_gathered_margin < 1,
             "path model: moe_tile_rows must be positive and moe_gathered_margin in [0, 1), got "
                 << m.moe_tile_rows << " and " << m.moe_gathered_margin);
}

// The grouped GEMM's rows in whole tiles when `rows` spread evenly over the experts that get any.
double moe_padded_rows(int64_t rows, int experts, int tile_rows) {
  const int64_t active = std::min<int64_t>(experts, rows);
  if (active < 1) return 0.0;
  const int64_t per = (rows + active - 1) / active;
  return static_cast<double>(active) * static_cast<double>((per + tile_rows - 1) / tile_rows * tile_rows);
}

// Layer 0 of `rows` grouped rows (of `tokens` tokens) x n x hidden over `experts` on `world` ranks,
// comm_bytes in.
MoeCost moe_layer0_cost(int64_t rows_i, int64_t tokens, int64_t hidden, int64_t n, int experts, DType dtype,
                        int world, double comm_bytes, const MachineModel& m) {
  check_moe_model(m);
  const double rows = static_cast<double>(rows_i), h = static_cast<double>(hidden);
  const double rate = m.gemm_tflops * m.moe_grouped_share * 1e12;
  const double t_gemm = 2 * moe_padded_rows(rows_i, experts, m.moe_tile_rows) * static_cast<double>(n) * h / rate * 1e6;
  const double t_load = (1 / m.moe_gathered_rate - 1) * 2 * rows * static_cast<double>(n) * h / rate * 1e6;
  const double t_gather = (rows + static_cast<double>(tokens)) * h * dtype_size(dtype) / (m.hbm_pass_gbps * 1e9) * 1e6;
  const double t_comm = comm_bytes / (m.link_gbps * 1e9) * 1e6;
  const int tiles = 3 * (world - 1);
  MoeCost c;
  c.unfused_us = t_comm + t_gather + t_gemm;
  c.fused_us = std::max((t_gemm + t_load) * m.sms / m.gemm_sms, t_comm + tiles * m.comm_tile_us) +
               (world > 1 ? m.fused_overhead_us : 0.0);
  std::ostringstream os;
  os << "layer 0: gemm " << t_gemm << " us on all SMs, gather pass " << t_gather << " us, comm " << t_comm
     << " us, the gathered load " << t_load << " us more (at " << m.moe_gathered_rate << " of the contiguous)";
  c.parts = os.str();
  return c;
}

MoeCost moe_layer0_cost(const MoeAgGemmPlan& p, const MachineModel& m) {
  return moe_layer0_cost(p.rows(), p.tokens(), p.hidden, p.ffn, p.experts, p.dtype, p.world_size,
                         moe_ag_gemm_comm_bytes(p), m);
}

MoeCost moe_layer1_cost(const MoeGemmRsPlan& p, const MachineModel& m) {
  check_moe_model(m);
  const double rows = static_cast<double>(p.rows()), h = static_cast<double>(p.hidden);
  const double eb = dtype_size(p.dtype);
  const double t_gemm = 2 * rows * h * static_cast<double>(p.ffn) / (m.gemm_tflops * m.moe_grouped_share * 1e12) * 1e6;
  const double t_reduce = (rows + static_cast<double>(p.tokens())) * h * eb / (m.hbm_pass_gbps * 1e9) * 1e6;
  const double t_comm = moe_gemm_rs_comm_bytes(p) / (m.link_gbps * 1e9) * 1e6;
  MoeCost c;
  c.unfused_us = t_gemm + t_reduce + t_comm;
  c.fused_us = p.world_size == 1 ? c.unfused_us
                                 : std::max(t_gemm * m.sms / m.gemm_sms + t_reduce,
                                            t_comm + (p.world_size - 1) * m.comm_tile_us) +
                                       m.fused_overhead_us;
  std::ostringstream os;
  os << "layer 1: gemm " << t_gemm << " us on all SMs, top-k reduce " << t_reduce << " us, comm " << t_comm << " us";
  c.parts = os.str();
  return c;
}

// One rank: the margin is moe_gathered_margin (nothing overlaps; both paths are measured kernels
// of the same work, and the margin is their run-to-run spread).
PathChoice moe_choice_of(const MoeCost& c, const MachineModel& m, int world) {
  PathChoice out;
  out.fused_us = c.fused_us, out.unfused_us = c.unfused_us;
  const double margin = world > 1 ? m.margin : m.moe_gathered_margin;
  out.path = c.fused_us <= c.unfused_us * (1 - margin) ? OpPath::kFused : OpPath::kUnfused;
  std::ostringstream os;
  os << "predicted fused " << c.fused_us << " us vs unfused " << c.unfused_us << " us (" << c.parts << ")";
  out.why = os.str();
  return out;
}

}  // namespace

PathChoice choose_path(const MoeAgGemmPlan& p, const MachineModel& m, OpPath requested) {
  bool decided = false;
  if (PathChoice c = forced_or_shared(m, requested, p.world_size, &decided); decided) return c;
  return moe_choice_of(moe_layer0_cost(p, m), m, p.world_size);
}

PathChoice choose_path(const MoeGemmRsPlan& p, const MachineModel& m, OpPath requested) {
  bool decided = false;
  if (PathChoice c = forced_or_shared(m, requested, p.world_size, &decided); decided) return c;
  if (p.world_size == 1) {
    PathChoice c;
    c.path = OpPath::kFused;
    c.why = "one rank: both paths are the same kernels";
    return c;
  }
  return moe_choice_of(moe_layer1_cost(p, m), m, p.world_size);
}

PathChoice moe_mlp_choice(const MoeAgGemmPlan& l0, const MachineModel& m0, const MoeGemmRsPlan& l1,
                          const MachineModel& m1, OpPath requested) {
  bool decided = false;
  if (PathChoice c = forced_or_shared(m0, requested, l0.world_size, &decided); decided) return c;
  const MoeCost a = moe_layer0_cost(l0, m0), b = moe_layer1_cost(l1, m1);
  MoeCost both;
  both.fused_us = a.fused_us + b.fused_us, both.unfused_us = a.unfused_us + b.unfused_us;
  both.parts = a.parts + "; " + b.parts;
  return moe_choice_of(both, m0, l0.world_size);
}

PathChoice moe_layer0_one_gpu(int64_t tokens, int64_t hidden, int64_t n, int experts, int topk, DType dtype,
                              int sms) {
  TL_REQUIRE(tokens >= 1 && hidden >= 1 && n >= 1 && experts >= 1 && topk >= 1 && sms >= 1,
             "path model: MoE layer 0 on one GPU needs positive sizes, got tokens "
                 << tokens << ", hidden " << hidden << ", n " << n << ", experts " << experts << ", topk " << topk
                 << ", sms " << sms);
  MachineModel m;
  m.sms = m.gemm_sms = sms;
  return moe_choice_of(moe_layer0_cost(tokens * topk, tokens, hidden, n, experts, dtype, 1, 0.0, m), m, 1);
}

PathChoice choose_path(const RingAttnPlan& p, const MachineModel& m, OpPath requested) {
  if (PathChoice c; single_rank(p.world_size, requested, &c)) return c;
  MachineModel a = m;
  a.gemm_tflops = m.attn_tflops;
  a.gemm_sms = m.sms;  // the ring's engine takes every SM (its copies wait for none of them)
  return choose_path(attention_rank_flops(p), ring_attn_comm_bytes(p), a, requested, p.steps() - 1);
}

}  // namespace tilelink
