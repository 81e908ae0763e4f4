// The fused-or-unfused cost model: forced paths are kept, shared-GPU ranks never go fused, and the
// choice follows the predicted times (fused wins only where communication is a real share).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "tilelink/core/error.hpp"
#include "tilelink/tune/gemm_ar_model.hpp"
#include "tilelink/tune/path_model.hpp"

namespace tilelink {
namespace {

MachineModel links(int sms = 132, int comm_sms = 16) {
  MachineModel m;
  m.sms = sms;
  m.gemm_sms = sms - comm_sms;
  return m;
}

TEST(PathModel, ForcedPathsAreKept) {
  EXPECT_EQ(choose_path(1e12, 1e9, links(), OpPath::kFused).path, OpPath::kFused);
  EXPECT_EQ(choose_path(1e12, 1e9, links(), OpPath::kUnfused).path, OpPath::kUnfused);
  MachineModel shared = links();
  shared.ranks_share_gpu = true;
  EXPECT_EQ(choose_path(1e12, 1e9, shared, OpPath::kFused).path, OpPath::kFused);
}

TEST(PathModel, SharedGpuIsNeverFusedByAuto) {
  MachineModel m = links();
  m.ranks_share_gpu = true;
  for (double bytes : {1e6, 1e8, 1e10}) EXPECT_EQ(choose_path(1e12, bytes, m, OpPath::kAuto).path, OpPath::kUnfused);
}

TEST(PathModel, FusedOnlyWhereCommunicationIsARealShare) {
  const MachineModel m = links();
  // 8192^3 GEMM (~1.6 ms at 690 TFLOP/s): 1 KB of communication cannot pay for 16 SMs.
  const double flops = 2.0 * 8192 * 8192 * 8192;
  PathChoice tiny = choose_path(flops, 1e3, m, OpPath::kAuto);
  EXPECT_EQ(tiny.path, OpPath::kUnfused) << tiny.why;
  // ~0.9 ms of communication beside ~1.7 ms of GEMM: overlap wins.
  PathChoice big = choose_path(flops, 0.9e-3 * m.link_gbps * 1e9, m, OpPath::kAuto);
  EXPECT_EQ(big.path, OpPath::kFused) << big.why;
  EXPECT_LT(big.fused_us, big.unfused_us);
}

TEST(PathModel, ChoiceAgreesWithItsOwnPredictions) {
  const MachineModel m = links(132, 20);
  for (double flops : {1e9, 1e11, 1e13})
    for (double bytes : {1e5, 1e7, 1e9}) {
      PathChoice c = choose_path(flops, bytes, m, OpPath::kAuto);
      EXPECT_EQ(c.path == OpPath::kFused, c.fused_us <= c.unfused_us * (1 - m.margin)) << c.why;
    }
}

TEST(PathModel, OneRankIsTheBareEngine) {
  // world 1: the fused op is the engine alone, so auto takes it on any machine model, shared GPU too.
  RowPartition rows = RowPartition::from_counts(std::vector<int64_t>{8192});
  AgGemmPlan ag = AgGemmPlan::make(0, rows, 4096, 1536, DType::kBF16, AgGemmConfig{});
  GemmRsPlan rs = GemmRsPlan::make(0, rows, 4096, 1536, DType::kBF16, GemmRsConfig{});
  MachineModel shared = links();
  shared.ranks_share_gpu = true;
  for (const MachineModel& m : {links(), shared}) {
    EXPECT_EQ(choose_path(ag, m, OpPath::kAuto).path, OpPath::kFused);
    EXPECT_EQ(choose_path(rs, m, OpPath::kAuto).path, OpPath::kFused);
    EXPECT_EQ(choose_path(ag, m, OpPath::kUnfused).path, OpPath::kUnfused);  // forcing still wins
  }
  // Two ranks are not one: the model decides again.
  RowPartition two = RowPartition::from_counts(std::vector<int64_t>{4096, 4096});
  EXPECT_EQ(choose_path(AgGemmPlan::make(0, two, 4096, 1536, DType::kBF16, AgGemmConfig{}), shared, OpPath::kAuto).path,
            OpPath::kUnfused);
}

TEST(PathModel, CommBytesFollowThePlans) {
  RowPartition rows = RowPartition::from_counts(std::vector<int64_t>{100, 0, 28});
  AgGemmPlan ag = AgGemmPlan::make(0, rows, 64, 32, DType::kBF16, AgGemmConfig{});
  EXPECT_DOUBLE_EQ(ag_gemm_comm_bytes(ag), 28.0 * 32 * 2);  // the rows rank 0 does not own
  GemmRsPlan rs = GemmRsPlan::make(2, rows, 48, 16, DType::kF32, GemmRsConfig{});
  EXPECT_DOUBLE_EQ(gemm_rs_comm_bytes(rs), 28.0 * 48 * 4 * 2);  // its rows, from 2 peers
}

// The measured two-GPU rows (bench/notes/fused_ops_cuda.md, world 2 on two H200s): with the
// calibrated model, `auto` must not pick the fused path where it measured slower.
TEST(PathModel, MeasuredTwoGpuRowsStayUnfused) {
  MachineModel m = links(132, 0);
  m.gemm_sms = 132;  // separate GPUs: the GEMM keeps every SM (peer copies run on the copy engine)
  // AG+GEMM 8192x14336x4096 at world 2: rank 0 receives 4096 rows of K = 4096 in 4 tiles of 1024
  // rows; measured fused 0.790-0.807 ms vs cuBLAS+NCCL 0.765-0.775 ms.
  const double flops = 2.0 * 8192 * 7168 * 4096, bytes = 4096.0 * 4096 * 2;
  EXPECT_EQ(choose_path(flops, bytes, m, OpPath::kAuto, 4).path, OpPath::kUnfused);
  // The same with 64-row tiles (64 of them): measured fused 1.568 ms, twice the baseline.
  PathChoice many = choose_path(flops, bytes, m, OpPath::kAuto, 64);
  EXPECT_EQ(many.path, OpPath::kUnfused) << many.why;
  // The per-tile cost is the fused comm program's alone (the baseline's collective moves it in one go).
  const PathChoice few = choose_path(flops, bytes, m, OpPath::kAuto, 4);
  EXPECT_GT(many.fused_us, few.fused_us);
  EXPECT_DOUBLE_EQ(many.unfused_us, few.unfused_us);
}

// AG+GEMM whose GEMM reads the own rows from A_r (push on separate GPUs): measured on two H200s
// (peer and ipc, 2026-11-29) 1.09-1.14x at 8192x11008x4096 and 1.01-1.04x at 8192x14336x4096 over
// cuBLAS+NCCL, where the pull path (own rows copied first) measured 0.94-0.98x at 8192x14336x4096.
TEST(PathModel, OwnRowsDirectTakesTheFusedPathWhereItMeasuredFaster) {
  MachineModel m = links(132, 0);
  m.own_rows_direct = true;
  const double bytes = 4096.0 * 4096 * 2;  // rank 0 receives 4096 rows of K = 4096
  for (double n_r : {5504.0, 7168.0}) {
    const PathChoice c = choose_path(2.0 * 8192 * n_r * 4096, bytes, m, OpPath::kAuto, 4);
    EXPECT_EQ(c.path, OpPath::kFused) << c.why;
    m.own_rows_direct = false;  // the same shape with the copy first stays unfused
    EXPECT_EQ(choose_path(2.0 * 8192 * n_r * 4096, bytes, m, OpPath::kAuto, 4).path,
              OpPath::kUnfused);
    m.own_rows_direct = true;
  }
  // The exposed share is of the communication: no communication, nothing exposed.
  const PathChoice none = choose_path(1e12, 0, m, OpPath::kAuto, 0);
  EXPECT_DOUBLE_EQ(none.fused_us, none.unfused_us);
  EXPECT_EQ(none.path, OpPath::kUnfused);  // no gain, no fused path
  m.direct_exposed = -1;
  EXPECT_THROW(choose_path(1e12, 1e6, m, OpPath::kAuto), Error);
}

// GEMM+RS on two H200s, world 2, pull, engine tiles of 128x256.
GemmRsPlan two_rank_rs(int64_t m, int64_t n, int64_t k) {
  GemmRsConfig cfg;
  cfg.gemm_tile_n = 256;
  return GemmRsPlan::make(0, RowPartition::even(m, 2), n, k / 2, DType::kBF16, cfg);
}

TEST(PathModel, GemmRsReduceSmsFollowTheMeasuredSweep) {
  // 2026-11-30 (bench/notes/fused_ops_cuda.md, how many reduce SMs): fused with 4, 6, 8, 12, 16 and
  // 24 reduce SMs, the GEMM's SMs joining the reduce once done. The model must pick SMs whose
  // measured time was within ~3% of the sweep's best (or, between measured counts, the same GEMM
  // waves).
  const MachineModel m = links(132, 0);
  struct Row {
    int64_t m, n, k;
    int lo, hi;
  };
  for (const Row& r : {Row{8192, 4096, 11008, 3, 4},  // best 4 (8 GEMM waves; 6-16: 9 waves, +3-6%)
                       Row{8192, 4096, 14336, 3, 4},  // best 4 (6: +7%)
                       Row{8192, 8192, 8192, 4, 11},  // 6: 0.910, 8: 0.917, 4: 0.918, 12: 0.941 ms
                       Row{8192, 8192, 14336, 3, 8},  // best 4 (6: +1%, 8: +2%)
                       Row{8192, 8192, 28672, 3, 4},  // best 4 (6: +4%, 8: +5%)
                       Row{8192, 6144, 16384, 3, 12},  // 12: 1.263 (one round), 4: 1.295, 8: 1.318
                       Row{4096, 8192, 8192, 3, 16},   // best 4 (16: +2%, 8: +2%)
                       Row{16384, 4096, 14336, 3, 4},  // best 4 (8, 12: +5-7%)
                       Row{8192, 8192, 4096, 14, 33}}) {  // best 24 (16: +1%, 12: +5%, 4: +13%)
    const int sms = gemm_rs_reduce_sms(two_rank_rs(r.m, r.n, r.k), m);
    EXPECT_GE(sms, r.lo) << r.m << "x" << r.n << "x" << r.k;
    EXPECT_LE(sms, r.hi) << r.m << "x" << r.n << "x" << r.k;
  }
  // The reduce alone: 64 MiB of output took 0.250 ms on 16 SMs and 0.81-0.88 ms on 4.
  EXPECT_NEAR(gemm_rs_reduce_us(two_rank_rs(8192, 8192, 8192), m, 16), 250, 25);
  EXPECT_NEAR(gemm_rs_reduce_us(two_rank_rs(8192, 8192, 8192), m, 4), 840, 60);
  // 8192^3's GEMM (2048 tiles) takes 17 waves on 121..127 SMs: the model leaves it 121 and gives
  // the reduce the other 11.
  const GemmRsPlan cube = two_rank_rs(8192, 8192, 8192);
  EXPECT_DOUBLE_EQ(gemm_rs_gemm_us(cube, m, 121), gemm_rs_gemm_us(cube, m, 127));
  EXPECT_GT(gemm_rs_gemm_us(cube, m, 120), gemm_rs_gemm_us(cube, m, 121));
  EXPECT_EQ(gemm_rs_reduce_sms(cube, m), 11);
  // Bounds: [2, SMs / 4]; a GPU under 8 SMs is refused.
  for (int64_t k : {64, 4096, 1 << 22}) {
    const int sms = gemm_rs_reduce_sms(two_rank_rs(8192, 8192, k), m);
    EXPECT_GE(sms, 2) << k;
    EXPECT_LE(sms, 132 / 4) << k;
  }
  EXPECT_THROW(gemm_rs_reduce_sms(two_rank_rs(8192, 8192, 8192), links(4, 0)), Error);
}

TEST(PathModel, MeasuredGemmRsRows) {
  // At the SMs the model picks, the fused op measured 1.01-1.36x of cuBLAS+NCCL on these nine
  // shapes (2026-11-30: two rounds at 4 SMs; 8 and 16 SMs for the two shapes that pick
  // more): auto fuses them all. A GEMM too short to hide anything stays unfused.
  struct Row {
    int64_t m, n, k;
    OpPath want;
  };
  for (const Row& r : {Row{8192, 4096, 11008, OpPath::kFused},   // 1.11x, 1.11x
                       Row{8192, 4096, 14336, OpPath::kFused},   // 1.11x, 1.10x
                       Row{8192, 8192, 8192, OpPath::kFused},    // 1.13-1.16x (8 SMs)
                       Row{8192, 8192, 14336, OpPath::kFused},   // 1.06x, 1.12x
                       Row{8192, 8192, 28672, OpPath::kFused},   // 1.04x, 1.04x
                       Row{8192, 6144, 16384, OpPath::kFused},   // 1.03x, 1.01x
                       Row{4096, 8192, 8192, OpPath::kFused},    // 1.13x, 1.13x
                       Row{16384, 4096, 14336, OpPath::kFused},  // 1.10x, 1.04x
                       Row{8192, 8192, 4096, OpPath::kFused},    // 1.34-1.36x (16-24 SMs)
                       Row{1000, 8192, 8192, OpPath::kUnfused}}) {
    const GemmRsPlan p = two_rank_rs(r.m, r.n, r.k);
    MachineModel m = links(132, 0);
    m.gemm_sms = 132 - gemm_rs_reduce_sms(p, m);
    const PathChoice c = choose_path(p, m, OpPath::kAuto);
    EXPECT_EQ(c.path, r.want) << r.m << "x" << r.n << "x" << r.k << ": " << c.why;
  }
  // Forced onto 2 SMs, 8192^3's reduce (~1.7 ms alone) is mostly left for after its GEMM (~0.8
  // ms): predicted slower than on the model's SMs.
  const GemmRsPlan p = two_rank_rs(8192, 8192, 8192);
  MachineModel m = links(132, 2);
  EXPECT_GT(choose_path(p, m, OpPath::kAuto).fused_us,
            gemm_rs_fused_us(p, m, gemm_rs_reduce_sms(p, m)) + 50);
}

TEST(PathModel, GemmRsPushIsNeverFusedByAuto) {
  // Push measured 0.57-0.97x of cuBLAS+NCCL on every shape (two H200s, world 2; 2026-11-30: 0.67x,
  // 0.59x, 0.96x at 8192x4096x11008, 8192^3, 8192x8192x28672), while the pull model, which `auto`
  // used for it before, predicted those shapes fused.
  for (const int64_t k : {11008, 8192, 28672}) {
    GemmRsPlan p = two_rank_rs(8192, k == 11008 ? 4096 : 8192, k);
    MachineModel m = links(132, 0);
    m.gemm_sms = 132 - gemm_rs_reduce_sms(p, m);
    EXPECT_EQ(choose_path(p, m, OpPath::kAuto).path, OpPath::kFused) << k;
    p.config.mode = CommMode::kPush;
    const PathChoice c = choose_path(p, m, OpPath::kAuto);
    EXPECT_EQ(c.path, OpPath::kUnfused) << k;
    EXPECT_NE(c.why.find("push"), std::string::npos) << c.why;
    EXPECT_EQ(choose_path(p, m, OpPath::kFused).path, OpPath::kFused) << k;
  }
  // One rank has nothing to push: the bare engine either way.
  GemmRsConfig cfg;
  cfg.mode = CommMode::kPush;
  const GemmRsPlan one =
      GemmRsPlan::make(0, RowPartition::even(1024, 1), 1024, 1024, DType::kBF16, cfg);
  EXPECT_EQ(choose_path(one, links(132, 0), OpPath::kAuto).path, OpPath::kFused);
}

TEST(PathModel, GemmRsGemmCountsWholeWaves) {
  // 8192x6144 in 128x256 tiles: 1536 tiles, 12 waves on 128 SMs, 13 on 126 (measured 1.284 ms at
  // K_r 8192 on 126 SMs, 2026-11-30).
  const GemmRsPlan p = two_rank_rs(8192, 6144, 16384);
  const MachineModel m = links(132, 0);
  const double tile = gemm_rs_gemm_us(p, m, 1536);  // one wave
  EXPECT_DOUBLE_EQ(gemm_rs_gemm_us(p, m, 128), 12 * tile);
  EXPECT_DOUBLE_EQ(gemm_rs_gemm_us(p, m, 126), 13 * tile);
  EXPECT_NEAR(gemm_rs_gemm_us(p, m, 126), 1284, 40);
  EXPECT_THROW(gemm_rs_gemm_us(p, m, 0), Error);
  EXPECT_THROW(gemm_rs_after_us(p, m, 0), Error);
}

TEST(PathModel, EveryRankTakesTheSamePath) {
  // Rank 1's plan alone would stay unfused: auto sends every rank (each deciding for itself)
  // unfused.
  auto choose = [](int r) {
    PathChoice c;
    c.path = r == 1 ? OpPath::kUnfused : OpPath::kFused;
    return c;
  };
  for (int mine : {0, 1, 2})
    EXPECT_EQ(agreed_choice(3, mine, OpPath::kAuto, choose).path, OpPath::kUnfused) << mine;
  EXPECT_NE(agreed_choice(3, 0, OpPath::kAuto, choose).why.find("rank 1"), std::string::npos);
  // All fused: fused; a forced path is kept as it is.
  auto all = [](int) {
    PathChoice c;
    c.path = OpPath::kFused;
    return c;
  };
  EXPECT_EQ(agreed_choice(3, 2, OpPath::kAuto, all).path, OpPath::kFused);
  EXPECT_EQ(agreed_choice(3, 0, OpPath::kFused, choose).path, OpPath::kFused);
  // Real plans, rank 0 modelled with its own rows read from A_r and rank 1 with the copy first (as
  // where a rank's rows start off a 128-row tile row): the two ranks' decisions agree.
  RowPartition rows = RowPartition::from_counts(std::vector<int64_t>{4096, 4100});
  AgGemmConfig cfg;
  cfg.mode = CommMode::kPush;
  cfg.comm_tile_rows = 1024;
  const AgGemmPlan p0 = AgGemmPlan::make(0, rows, 5504, 4096, DType::kBF16, cfg);
  const AgGemmPlan p1 = AgGemmPlan::make(1, rows, 5504, 4096, DType::kBF16, cfg);
  MachineModel m = links(132, 0);
  auto model = [&](int r) {
    m.own_rows_direct = r == 0;
    return choose_path(r == 0 ? p0 : p1, m, OpPath::kAuto);
  };
  EXPECT_EQ(model(0).path, OpPath::kFused);
  EXPECT_EQ(model(1).path, OpPath::kUnfused);
  EXPECT_EQ(agreed_choice(2, 0, OpPath::kAuto, model).path,
            agreed_choice(2, 1, OpPath::kAuto, model).path);
}

TEST(PathModel, CommTilesFollowThePlan) {
  RowPartition rows = RowPartition::from_counts(std::vector<int64_t>{100, 0, 28});
  AgGemmConfig cfg;
  cfg.comm_tile_rows = 16;
  MachineModel m = links(132, 0);
  m.gemm_sms = 132;
  m.link_gbps = 1e9;  // bytes cost nothing: the tile term alone
  m.gemm_tflops = 1e9;
  m.fused_overhead_us = 0;
  AgGemmPlan ag = AgGemmPlan::make(0, rows, 64, 32, DType::kBF16, cfg);
  // rank 0 pulls the 28 rows of rank 2: 2 tiles of 16 rows.
  EXPECT_NEAR(choose_path(ag, m, OpPath::kAuto).fused_us, 2 * m.comm_tile_us, 1e-3);
}

TEST(PathModel, RefusesBadModels) {
  MachineModel m = links();
  m.gemm_sms = 0;
  EXPECT_THROW(choose_path(1e9, 1e6, m, OpPath::kAuto), Error);
  m = links();
  m.link_gbps = 0;
  EXPECT_THROW(choose_path(1e9, 1e6, m, OpPath::kAuto), Error);
  // GEMM+RS's own rates.
  const GemmRsPlan rs = two_rank_rs(8192, 8192, 8192);
  m = links(132, 4);
  m.rs_sm_tflops = 0;
  EXPECT_THROW(choose_path(rs, m, OpPath::kAuto), Error);
  EXPECT_THROW(gemm_rs_reduce_sms(rs, m), Error);
  m = links(132, 4);
  m.reduce_during_gbps = 0;
  EXPECT_THROW(choose_path(rs, m, OpPath::kAuto), Error);
  m = links(132, 4);
  m.reduce_after_gbps = -1;
  EXPECT_THROW(gemm_rs_reduce_sms(rs, m), Error);
  EXPECT_NO_THROW(choose_path(rs, links(132, 4), OpPath::kAuto));
  OpPath p;
  EXPECT_TRUE(parse_op_path("unfused", &p));
  EXPECT_EQ(p, OpPath::kUnfused);
  EXPECT_FALSE(parse_op_path("fastest", &p));
}

}  // namespace
}  // namespace tilelink

// ---- GEMM+AR (tune/gemm_ar_model.hpp) -------------------------------------------------------------

namespace tilelink {
namespace {

GemmArPlan ar_plan(int world, int64_t m, int64_t n, int64_t k_total, AllReduceAlgo algo) {
  GemmArConfig cfg;
  cfg.algo = algo;
  return GemmArPlan::make(0, RowPartition::even(m, world), n, k_total / world, DType::kBF16, cfg);
}

TEST(GemmArModel, OneShotForTwoRanksAndSmallPartialsElseTwoShot) {
  EXPECT_EQ(choose_allreduce_algo(8192, 8192, 2, DType::kBF16), AllReduceAlgo::kOneShot);   // W = 2
  EXPECT_EQ(choose_allreduce_algo(64, 4096, 8, DType::kBF16), AllReduceAlgo::kOneShot);     // 512 KiB
  EXPECT_EQ(choose_allreduce_algo(8192, 8192, 4, DType::kBF16), AllReduceAlgo::kTwoShot);   // 128 MiB
  EXPECT_EQ(choose_allreduce_algo(128, 4096, 4, DType::kBF16), AllReduceAlgo::kOneShot);    // exactly 1 MiB
  EXPECT_EQ(choose_allreduce_algo(129, 4096, 4, DType::kBF16), AllReduceAlgo::kTwoShot);
}

TEST(GemmArModel, ReadBytesPerAlgorithm) {
  const double partial = 1024.0 * 4096 * 2;
  EXPECT_DOUBLE_EQ(gemm_ar_comm_bytes(ar_plan(4, 1024, 4096, 4096, AllReduceAlgo::kOneShot)), 3 * partial);
  EXPECT_DOUBLE_EQ(gemm_ar_comm_bytes(ar_plan(4, 1024, 4096, 4096, AllReduceAlgo::kTwoShot)), 1.5 * partial);
  EXPECT_DOUBLE_EQ(gemm_ar_comm_bytes(ar_plan(2, 1024, 4096, 4096, AllReduceAlgo::kTwoShot)),
                   gemm_ar_comm_bytes(ar_plan(2, 1024, 4096, 4096, AllReduceAlgo::kOneShot)));
}

TEST(GemmArModel, PathRules) {
  MachineModel m;
  m.sms = 132;
  m.gemm_sms = 116;
  const GemmArPlan big = ar_plan(4, 8192, 8192, 28672, AllReduceAlgo::kTwoShot);
  EXPECT_EQ(choose_path(big, m, OpPath::kUnfused).path, OpPath::kUnfused);  // forced
  EXPECT_EQ(choose_path(ar_plan(1, 64, 64, 64, AllReduceAlgo::kOneShot), m, OpPath::kAuto).path, OpPath::kFused);
  MachineModel shared = m;
  shared.ranks_share_gpu = true;
  EXPECT_EQ(choose_path(big, shared, OpPath::kAuto).path, OpPath::kUnfused);
  // Separate GPUs: a long GEMM hides the reads; the prediction says why, with both times.
  const PathChoice c = choose_path(big, m, OpPath::kAuto);
  EXPECT_GT(c.unfused_us, 0);
  EXPECT_GT(c.fused_us, 0);
  EXPECT_EQ(c.path, c.fused_us <= c.unfused_us * (1 - m.margin) ? OpPath::kFused : OpPath::kUnfused);
  EXPECT_NE(c.why.find("two-shot"), std::string::npos) << c.why;
}

TEST(GemmArModel, FusedWhereTheGemmHidesTheReads) {
  MachineModel m;
  m.sms = 132;
  m.gemm_sms = 120;
  // A long GEMM (K_r = 8192) whose partial the reads move in less time: fused, predicted below the
  // GEMM on all SMs plus NCCL's AllReduce.
  const PathChoice big = choose_path(ar_plan(8, 8192, 8192, 8 * 8192, AllReduceAlgo::kTwoShot), m, OpPath::kAuto);
  EXPECT_EQ(big.path, OpPath::kFused) << big.why;
  EXPECT_LT(big.fused_us, big.unfused_us);
  // Decode (M = 1): the GEMM is a few microseconds, the tail dominates: not worth fusing.
  const PathChoice tiny = choose_path(ar_plan(8, 1, 4096, 8 * 512, AllReduceAlgo::kOneShot), m, OpPath::kAuto);
  EXPECT_EQ(tiny.path, OpPath::kUnfused) << tiny.why;
  // Fewer GEMM SMs make the fused prediction longer, never shorter.
  m.gemm_sms = 66;
  const PathChoice few = choose_path(ar_plan(8, 8192, 8192, 8 * 8192, AllReduceAlgo::kTwoShot), m, OpPath::kAuto);
  EXPECT_GT(few.fused_us, big.fused_us);
}

// ---- sequence-parallel attention ----------------------------------------------------------------

SpAttnShape attn_shape(int64_t seq, bool causal, SeqShard shard) {
  SpAttnShape s;
  s.batch = 2, s.seq = seq, s.heads_q = 8, s.heads_kv = 2, s.head_dim = 128, s.causal = causal, s.shard = shard;
  return s;
}
SeqSharding attn_sharding(SeqShard shard, int64_t seq, int world) {
  std::vector<int64_t> segs;
  if (shard == SeqShard::kContiguous) {
    const RowPartition even = RowPartition::even(seq, world);
    for (int r = 0; r < world; ++r) segs.push_back(even.size(r));
  }
  return SeqSharding::make(shard, seq, world, segs);
}

// The FLOPs counted pair by pair: every rank's queries by position against the keys they see; the
// ranks' shares add up to the whole attention (causal: S (S + 1) / 2 pairs).
TEST(AttnPathModel, FlopsAndBytesCountWhatEachRankDoes) {
  for (SeqShard shard : {SeqShard::kContiguous, SeqShard::kZigzag}) {
    for (bool causal : {false, true}) {
      for (int world : {1, 3, 4}) {
        const int64_t seq = 1000 + 7 * world;
        const SpAttnShape s = attn_shape(seq, causal, shard);
        const SeqSharding sh = attn_sharding(shard, seq, world);
        double total = 0;
        for (int r = 0; r < world; ++r) {
          const SpAttnPlan p = SpAttnPlan::make(r, s, sh, DType::kBF16, {});
          double pairs = 0;
          int64_t last = -1;
          for (int64_t i = 0; i < sh.rows.size(r); ++i) {
            const int64_t pos = sh.position_of(r, i);
            pairs += causal ? pos + 1 : seq;
            last = std::max(last, pos);
          }
          const double flops = 4.0 * s.batch * s.heads_q * s.head_dim * pairs;
          EXPECT_DOUBLE_EQ(attention_rank_flops(p), flops) << "rank " << r;
          total += flops;
          // sp_attn receives every other rank's rows it reads; the ring every other rank's rows.
          double rows = 0;
          for (int o = 0; o < world; ++o)
            for (int64_t i = 0; i < sh.rows.size(o) && o != r; ++i) rows += !causal || sh.position_of(o, i) <= last;
          const double row_bytes = 2.0 * s.batch * s.heads_kv * s.head_dim * 2;
          if (shard == SeqShard::kContiguous || !causal) EXPECT_DOUBLE_EQ(sp_attn_comm_bytes(p), rows * row_bytes);
          else EXPECT_GE(sp_attn_comm_bytes(p), rows * row_bytes);  // a zigzag chunk moves whole
          // The ring: every other rank's block, or under the mask with contiguous shards the earlier ranks'.
          const RingAttnPlan ring = RingAttnPlan::make(r, s, sh, DType::kBF16, 64, 1);
          const int64_t ring_rows = causal && shard == SeqShard::kContiguous ? sh.rows.begin(r) : seq - sh.rows.size(r);
          EXPECT_DOUBLE_EQ(ring_attn_comm_bytes(ring), ring_rows * row_bytes);
        }
        const double pairs = causal ? seq * (seq + 1.0) / 2 : double(seq) * seq;
        EXPECT_DOUBLE_EQ(total, 4.0 * s.batch * s.heads_q * s.head_dim * pairs);
      }
    }
  }
}

TEST(AttnPathModel, SharedGpuUnfusedOneRankFusedElsePredicted) {
  MachineModel m = links();
  const SpAttnShape s = attn_shape(8192, true, SeqShard::kContiguous);
  const SeqSharding one = attn_sharding(SeqShard::kContiguous, 8192, 1);
  EXPECT_EQ(choose_path(SpAttnPlan::make(0, s, one, DType::kBF16, {}), m, OpPath::kAuto).path, OpPath::kFused);
  const SeqSharding four = attn_sharding(SeqShard::kContiguous, 8192, 4);
  const SpAttnPlan p = SpAttnPlan::make(3, s, four, DType::kBF16, {});
  const RingAttnPlan ring = RingAttnPlan::make(3, s, four, DType::kBF16, 64, 1);
  MachineModel shared = m;
  shared.ranks_share_gpu = true;  // measured: fused slower at every shape on one GPU
  EXPECT_EQ(choose_path(p, shared, OpPath::kAuto).path, OpPath::kUnfused);
  EXPECT_EQ(choose_path(ring, shared, OpPath::kAuto).path, OpPath::kUnfused);
  EXPECT_EQ(choose_path(p, shared, OpPath::kFused).path, OpPath::kFused);
  for (const PathChoice& c : {choose_path(p, m, OpPath::kAuto), choose_path(ring, m, OpPath::kAuto)}) {
    EXPECT_GT(c.unfused_us, 0) << c.why;
    EXPECT_EQ(c.path, c.fused_us <= c.unfused_us * (1 - m.margin) ? OpPath::kFused : OpPath::kUnfused) << c.why;
  }
  // Rank 0 under the mask reads no other rank's keys: nothing to hide, never fused.
  const SpAttnPlan first = SpAttnPlan::make(0, s, four, DType::kBF16, {});
  EXPECT_EQ(sp_attn_comm_bytes(first), 0.0);
  EXPECT_EQ(choose_path(first, m, OpPath::kAuto).path, OpPath::kUnfused);
}

// ---- MoE ----------------------------------------------------------------------------------------

MoeAgGemmPlan moe_l0(int rank, int world, int64_t tokens, int64_t hidden, int64_t ffn, int experts, int topk) {
  return MoeAgGemmPlan::make(rank, RowPartition::even(tokens, world), hidden, ffn / world, experts, topk,
                             DType::kBF16, {});
}
MoeGemmRsPlan moe_l1(int rank, int world, int64_t tokens, int64_t hidden, int64_t ffn, int experts, int topk) {
  return MoeGemmRsPlan::make(rank, RowPartition::even(tokens, world), hidden, ffn / world, experts, topk,
                             DType::kBF16, {});
}

TEST(MoePathModel, BytesAreThePeersTokensAndTheOtherSegments) {
  const MoeAgGemmPlan l0 = moe_l0(1, 4, 1000, 256, 512, 8, 2);
  // 750 peers' tokens: H bf16, topk int32 ids and fp32 weights each
  EXPECT_DOUBLE_EQ(moe_ag_gemm_comm_bytes(l0), 750.0 * (256 * 2 + 2 * 4 + 2 * 4));
  const MoeGemmRsPlan l1 = moe_l1(1, 4, 1000, 256, 512, 8, 2);
  EXPECT_DOUBLE_EQ(moe_gemm_rs_comm_bytes(l1), 750.0 * 256 * 2);
  EXPECT_EQ(moe_ag_gemm_comm_bytes(moe_l0(0, 1, 1000, 256, 512, 8, 2)), 0.0);
}

TEST(MoePathModel, ForcedKeptSharedGpuUnfused) {
  MachineModel m = links(132, 0);
  MachineModel shared = m;
  shared.ranks_share_gpu = true;
  const MoeAgGemmPlan l0 = moe_l0(0, 2, 4096, 4096, 14336, 8, 2);
  const MoeGemmRsPlan l1 = moe_l1(0, 2, 4096, 4096, 14336, 8, 2);
  for (OpPath forced : {OpPath::kFused, OpPath::kUnfused}) {
    EXPECT_EQ(choose_path(l0, shared, forced).path, forced);
    EXPECT_EQ(choose_path(l1, m, forced).path, forced);
    EXPECT_EQ(moe_mlp_choice(l0, shared, l1, shared, forced).path, forced);
  }
  const PathChoice c = choose_path(l0, shared, OpPath::kAuto);
  EXPECT_EQ(c.path, OpPath::kUnfused);
  EXPECT_NE(c.why.find("share one GPU"), std::string::npos) << c.why;
  EXPECT_EQ(choose_path(l1, shared, OpPath::kAuto).path, OpPath::kUnfused);
  EXPECT_EQ(moe_mlp_choice(l0, shared, l1, shared, OpPath::kAuto).path, OpPath::kUnfused);
  // One rank on a shared model is still one GPU of its own: layer 1's two paths are the same kernels.
  EXPECT_EQ(choose_path(moe_l1(0, 1, 4096, 4096, 14336, 8, 2), shared, OpPath::kAuto).path, OpPath::kFused);
}

// World 1: layer 0's fused GEMM reads X by index at moe_gathered_rate of the contiguous one on its
// real rows (a tile's padding rows load nothing), against the gather pass plus the contiguous GEMM,
// with moe_gathered_margin (nothing overlaps). As measured on one H200 (bench/notes/moe.md): the
// long-K few-expert layers stay unfused (0.85-0.92 gathered), the layers whose gather pass is a
// large share go fused (qwen3-30b-a3b 1.10-1.22, deepseek-moe and qwen1.5-moe at 8192 tokens
// 1.05-1.09), and qwen1.5-moe at 2048 tokens, whose experts' second tiles are nearly empty padding
// (136 rows an expert; 0.91-1.00 gathered), stays unfused. A gathered load as fast as the
// contiguous one would save the whole pass everywhere.
TEST(MoePathModel, WorldOneWeighsTheGatheredLoadAgainstTheGatherPass) {
  MachineModel m = links(132, 0);
  const MoeAgGemmPlan mixtral = moe_l0(0, 1, 2048, 4096, 14336, 8, 2);
  const MoeAgGemmPlan mixtral22 = moe_l0(0, 1, 8192, 6144, 16384, 8, 2);
  const MoeAgGemmPlan qwen15 = moe_l0(0, 1, 2048, 2048, 1408, 60, 4);
  const MoeAgGemmPlan qwen15_long = moe_l0(0, 1, 8192, 2048, 1408, 60, 4);
  const MoeAgGemmPlan dsmoe_long = moe_l0(0, 1, 8192, 2048, 1408, 64, 6);
  const MoeAgGemmPlan qwen3 = moe_l0(0, 1, 2048, 2048, 768, 128, 8);
  const MoeAgGemmPlan qwen3_long = moe_l0(0, 1, 8192, 2048, 768, 128, 8);
  const PathChoice a = choose_path(mixtral, m, OpPath::kAuto);
  EXPECT_EQ(a.path, OpPath::kUnfused) << a.why;
  // 512 rows an expert: no padding, so the fused GEMM is the contiguous one at the gathered rate
  EXPECT_NEAR(a.fused_us * m.moe_gathered_rate, a.unfused_us, 0.05 * a.unfused_us) << a.why;  // a small gather
  EXPECT_EQ(choose_path(mixtral22, m, OpPath::kAuto).path, OpPath::kUnfused);
  const PathChoice q = choose_path(qwen15, m, OpPath::kAuto);
  EXPECT_EQ(q.path, OpPath::kUnfused) << q.why;
  EXPECT_LT(q.fused_us, q.unfused_us) << q.why;  // predicted faster, but inside the margin
  for (const MoeAgGemmPlan* p : {&qwen15_long, &dsmoe_long, &qwen3, &qwen3_long}) {
    const PathChoice b = choose_path(*p, m, OpPath::kAuto);
    EXPECT_EQ(b.path, OpPath::kFused) << b.why;
    EXPECT_GT(b.unfused_us * (1 - m.moe_gathered_margin), b.fused_us) << b.why;
  }
  // the one-GPU layer's choice is the same model
  for (const MoeAgGemmPlan* p : {&mixtral, &mixtral22, &qwen15, &qwen15_long, &dsmoe_long, &qwen3, &qwen3_long}) {
    const PathChoice one = moe_layer0_one_gpu(p->tokens(), p->hidden, p->ffn, p->experts, p->topk, p->dtype, 132);
    const PathChoice plan = choose_path(*p, m, OpPath::kAuto);
    EXPECT_EQ(one.path, plan.path) << one.why;
    EXPECT_NEAR(one.fused_us, plan.fused_us, 1e-9 * plan.fused_us);
  }
  // W1 holding gate and up (the MLP's N = 2F) doubles the GEMM, not the gather: qwen3 stays unfused
  EXPECT_EQ(moe_layer0_one_gpu(2048, 2048, 2 * 768, 128, 8, DType::kBF16, 132).path, OpPath::kUnfused);
  // padding: 64 rows an expert run as 128-row tiles, so the MMA's time is the padded rows'
  const PathChoice half = moe_layer0_one_gpu(1024, 2048, 768, 128, 8, DType::kBF16, 132);
  const PathChoice full = moe_layer0_one_gpu(2048, 2048, 768, 128, 8, DType::kBF16, 132);
  EXPECT_GT(half.unfused_us, 0.8 * full.unfused_us) << half.why;  // 0.5 without the padding
  EXPECT_THROW(moe_layer0_one_gpu(0, 2048, 768, 128, 8, DType::kBF16, 132), Error);
  EXPECT_THROW(moe_layer0_one_gpu(2048, 2048, 768, 0, 8, DType::kBF16, 132), Error);
  MachineModel bad = m;
  bad.moe_gathered_rate = 1.5;
  EXPECT_THROW(choose_path(qwen3, bad, OpPath::kAuto), Error);
  m.moe_gathered_rate = 1.0;
  m.moe_gathered_margin = 0.0;
  const PathChoice c = choose_path(mixtral, m, OpPath::kAuto);
  EXPECT_EQ(c.path, OpPath::kFused) << c.why;
  EXPECT_LT(c.fused_us, c.unfused_us) << c.why;
}

// Separate GPUs: fused where the communication is a real share of the layer and the fused GEMM's
// slowdown does not eat it; the prediction follows the formula (fused = max(GEMM, comm) + overhead).
TEST(MoePathModel, SeparateGpusFollowThePrediction) {
  MachineModel m = links(132, 0);
  m.moe_gathered_rate = 1.0;
  // little compute, many tokens to move: the comm dominates both paths
  const MoeAgGemmPlan moving = moe_l0(1, 8, 65536, 4096, 1024, 64, 1);
  const PathChoice c = choose_path(moving, m, OpPath::kAuto);
  const double t_comm = moe_ag_gemm_comm_bytes(moving) / (m.link_gbps * 1e9) * 1e6;
  EXPECT_GE(c.fused_us, t_comm + m.fused_overhead_us) << c.why;
  EXPECT_GE(c.unfused_us, t_comm) << c.why;
  EXPECT_EQ(c.path, c.fused_us <= c.unfused_us * (1 - m.margin) ? OpPath::kFused : OpPath::kUnfused) << c.why;
  // a big GEMM with a comm of the same order: hiding the comm wins
  const MoeAgGemmPlan big = moe_l0(0, 2, 16384, 8192, 8192, 8, 2);
  const PathChoice d = choose_path(big, m, OpPath::kAuto);
  EXPECT_EQ(d.path, OpPath::kFused) << d.why;
  const MoeGemmRsPlan big1 = moe_l1(0, 2, 16384, 8192, 8192, 8, 2);
  const PathChoice e = choose_path(big1, m, OpPath::kAuto);
  EXPECT_EQ(e.path, OpPath::kFused) << e.why;
  // the MLP adds its layers' predictions
  const PathChoice both = moe_mlp_choice(big, m, big1, m, OpPath::kAuto);
  EXPECT_NEAR(both.fused_us, d.fused_us + e.fused_us, 1e-6 * both.fused_us);
  EXPECT_NEAR(both.unfused_us, d.unfused_us + e.unfused_us, 1e-6 * both.unfused_us);
  // a model with no SMs left for the GEMM is refused
  MachineModel bad = m;
  bad.gemm_sms = 0;
  EXPECT_THROW(choose_path(big, bad, OpPath::kAuto), Error);
}

}  // namespace
}  // namespace tilelink
