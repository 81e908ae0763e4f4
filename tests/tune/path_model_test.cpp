// The fused-or-unfused cost model: forced paths are kept, shared-GPU ranks never go fused, and the
// choice follows the predicted times (fused wins only where communication is a real share).
#include <gtest/gtest.h>

#include "tilelink/core/error.hpp"
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
  // 8192^3 GEMM (~1.7 ms at 650 TFLOP/s): 1 KB of communication cannot pay for 16 SMs.
  const double flops = 2.0 * 8192 * 8192 * 8192;
  PathChoice tiny = choose_path(flops, 1e3, m, OpPath::kAuto);
  EXPECT_EQ(tiny.path, OpPath::kUnfused) << tiny.why;
  // ~0.9 ms of communication beside ~1.7 ms of GEMM: overlap wins.
  PathChoice big = choose_path(flops, 0.9e-3 * 400e9, m, OpPath::kAuto);
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

TEST(PathModel, CommBytesFollowThePlans) {
  RowPartition rows = RowPartition::from_counts(std::vector<int64_t>{100, 0, 28});
  AgGemmPlan ag = AgGemmPlan::make(0, rows, 64, 32, DType::kBF16, AgGemmConfig{});
  EXPECT_DOUBLE_EQ(ag_gemm_comm_bytes(ag), 28.0 * 32 * 2);  // the rows rank 0 does not own
  GemmRsPlan rs = GemmRsPlan::make(2, rows, 48, 16, DType::kF32, GemmRsConfig{});
  EXPECT_DOUBLE_EQ(gemm_rs_comm_bytes(rs), 28.0 * 48 * 4 * 2);  // its rows, from 2 peers
}

TEST(PathModel, RefusesBadModels) {
  MachineModel m = links();
  m.gemm_sms = 0;
  EXPECT_THROW(choose_path(1e9, 1e6, m, OpPath::kAuto), Error);
  m = links();
  m.link_gbps = 0;
  EXPECT_THROW(choose_path(1e9, 1e6, m, OpPath::kAuto), Error);
  OpPath p;
  EXPECT_TRUE(parse_op_path("unfused", &p));
  EXPECT_EQ(p, OpPath::kUnfused);
  EXPECT_FALSE(parse_op_path("fastest", &p));
}

}  // namespace
}  // namespace tilelink
