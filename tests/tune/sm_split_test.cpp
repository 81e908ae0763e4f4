// The SM split of a fused op's rank (tune/sm_split.hpp): every case the CUDA ops take.
#include "tilelink/tune/sm_split.hpp"

#include <gtest/gtest.h>

#include "tilelink/core/error.hpp"

namespace tilelink {
namespace {

TEST(SmSplit, CommKernelTakesItsSmsTheGemmTheRest) {
  const SmSplit s = split_sms({.sms = 132, .world_size = 2, .comm_sms = 16});
  EXPECT_EQ(s.comm, CommEngine::kSms);
  EXPECT_EQ(s.comm_sms, 16);
  EXPECT_EQ(s.gemm_sms, 116);
  EXPECT_EQ(s.spare_sms, 0);
}

TEST(SmSplit, CopyEngineOnSeparateGpusNeedsNoSmWhileEager) {
  const SmSplit s = split_sms({.sms = 132, .world_size = 4});
  EXPECT_EQ(s.comm, CommEngine::kCopyEngine);
  EXPECT_EQ(s.gemm_sms, 132);
  const SmSplit g = split_sms({.sms = 132, .world_size = 4, .graph_mode = true});
  EXPECT_EQ(g.gemm_sms, 132 - kGraphSignalSms);
  EXPECT_EQ(g.spare_sms, kGraphSignalSms);
}

TEST(SmSplit, CopyEngineOnOneGpuLeavesSmsToTheCopies) {
  const SmSplit s = split_sms({.sms = 33, .world_size = 4, .ranks_share_gpu = true});
  EXPECT_EQ(s.gemm_sms, 33 - kCopySpareSms);
  EXPECT_EQ(s.spare_sms, kCopySpareSms);
  // Too few SMs to spare: the GEMM keeps them (the copy then waits for its blocks to retire).
  EXPECT_EQ(split_sms({.sms = 4, .world_size = 2, .ranks_share_gpu = true}).gemm_sms, 4);
}

TEST(SmSplit, ComputeWorkersOverrideAndWorldOneTakesAll) {
  EXPECT_EQ(split_sms({.sms = 132, .world_size = 2, .compute_workers = 100, .comm_sms = 8}).gemm_sms, 100);
  const SmSplit one = split_sms({.sms = 132, .world_size = 1, .comm_sms = 16});
  EXPECT_EQ(one.gemm_sms, 132);
  EXPECT_EQ(one.comm, CommEngine::kNone);
  EXPECT_EQ(split_sms({.sms = 132, .world_size = 1, .compute_workers = 132}).gemm_sms, 132);
}

TEST(SmSplit, RefusesWhatLeavesNothing) {
  EXPECT_THROW(split_sms({.sms = 132, .world_size = 2, .comm_sms = 132}), Error);
  EXPECT_THROW(split_sms({.sms = 132, .world_size = 2, .compute_workers = 124, .comm_sms = 8}), Error);
  EXPECT_THROW(split_sms({.sms = 132, .world_size = 2, .compute_workers = 132}), Error);
  EXPECT_THROW(split_sms({.sms = 132, .world_size = 2, .comm_sms = -1}), Error);
  EXPECT_THROW(split_sms({.sms = 0, .world_size = 2}), Error);
}

}  // namespace
}  // namespace tilelink
