// GEMM+AR's path and algorithm choice (tune/gemm_ar_model.hpp).
#include "tilelink/tune/gemm_ar_model.hpp"

#include <gtest/gtest.h>

namespace tilelink {
namespace {

GemmArPlan plan(int world, int64_t m, int64_t n, int64_t k_local, AllReduceAlgo algo) {
  GemmArConfig c;
  c.algo = algo;
  return GemmArPlan::make(0, RowPartition::even(m, world), n, k_local, DType::kBF16, c);
}

MachineModel gpus(int gemm_sms = 120) {
  MachineModel m;
  m.sms = 132;
  m.gemm_sms = gemm_sms;
  return m;
}

TEST(GemmArModel, AlgorithmOneShotAtTwoRanksOrSmallPartials) {
  EXPECT_EQ(choose_allreduce_algo(8192, 8192, 2, DType::kBF16), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_allreduce_algo(64, 4096, 8, DType::kBF16), AllReduceAlgo::kOneShot);  // 512 KiB
  EXPECT_EQ(choose_allreduce_algo(8192, 8192, 8, DType::kBF16), AllReduceAlgo::kTwoShot);
  EXPECT_EQ(choose_allreduce_algo(128, 4096, 4, DType::kBF16), AllReduceAlgo::kOneShot);  // exactly 1 MiB
  EXPECT_EQ(choose_allreduce_algo(129, 4096, 4, DType::kBF16), AllReduceAlgo::kTwoShot);
}

TEST(GemmArModel, PeerBytesPerAlgorithm) {
  const double partial = 1024.0 * 2048 * 2;
  EXPECT_DOUBLE_EQ(gemm_ar_comm_bytes(plan(4, 1024, 2048, 512, AllReduceAlgo::kOneShot)), 3 * partial);
  EXPECT_DOUBLE_EQ(gemm_ar_comm_bytes(plan(4, 1024, 2048, 512, AllReduceAlgo::kTwoShot)), 1.5 * partial);
  // Two ranks: the same bytes either way (one-shot then has one round trip fewer).
  EXPECT_DOUBLE_EQ(gemm_ar_comm_bytes(plan(2, 1024, 2048, 512, AllReduceAlgo::kOneShot)),
                   gemm_ar_comm_bytes(plan(2, 1024, 2048, 512, AllReduceAlgo::kTwoShot)));
}

TEST(GemmArModel, PathRules) {
  // One rank: the bare engine. Forced paths are kept.
  EXPECT_EQ(choose_path(plan(1, 4096, 4096, 4096, AllReduceAlgo::kOneShot), gpus(), OpPath::kAuto).path, OpPath::kFused);
  EXPECT_EQ(choose_path(plan(4, 4096, 4096, 4096, AllReduceAlgo::kTwoShot), gpus(), OpPath::kUnfused).path,
            OpPath::kUnfused);
  // Ranks on one GPU: unfused whatever the shape.
  MachineModel shared = gpus();
  shared.ranks_share_gpu = true;
  EXPECT_EQ(choose_path(plan(4, 8192, 8192, 8192, AllReduceAlgo::kTwoShot), shared, OpPath::kAuto).path,
            OpPath::kUnfused);
}

TEST(GemmArModel, FusedWhereTheGemmHidesTheReads) {
  // A long GEMM (K_r = 8192) with a partial the reads move in less time: fused; its prediction is
  // the GEMM on its SMs plus the tail, below the GEMM on all SMs plus NCCL's AllReduce.
  const PathChoice big = choose_path(plan(8, 8192, 8192, 8192, AllReduceAlgo::kTwoShot), gpus(), OpPath::kAuto);
  EXPECT_EQ(big.path, OpPath::kFused) << big.why;
  EXPECT_LT(big.fused_us, big.unfused_us);
  // Decode (M = 1): the GEMM is a few microseconds, the tail dominates: not worth fusing.
  const PathChoice tiny = choose_path(plan(8, 1, 4096, 512, AllReduceAlgo::kOneShot), gpus(), OpPath::kAuto);
  EXPECT_EQ(tiny.path, OpPath::kUnfused) << tiny.why;
  // Fewer GEMM SMs make the fused prediction longer, never shorter.
  const PathChoice few = choose_path(plan(8, 8192, 8192, 8192, AllReduceAlgo::kTwoShot), gpus(66), OpPath::kAuto);
  EXPECT_GT(few.fused_us, big.fused_us);
}

}  // namespace
}  // namespace tilelink
