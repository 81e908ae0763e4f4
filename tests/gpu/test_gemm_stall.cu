// The split last wave refuses a workspace whose flags are not zero: the engine reports the tile to
// GemmArgs::stall_report and traps, instead of leaving the tile unwritten. (Its own executable: the
// trap kills the process's CUDA context.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "tilelink/compute/sm90/gemm.hpp"

using namespace tilelink;
using namespace tilelink::compute::sm90;

TEST(Sm90GemmStall, DirtyWorkspaceTrapsAndReportsTheTile) {
  GemmArgs a;
  a.m = 300, a.n = 776, a.k = 1024, a.num_sms = 8;  // 12 tiles on 8 blocks: the last 4 split
  a.tile_n = kTileN;
  void *buf = nullptr, *ws = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 4 << 20), cudaSuccess);
  ASSERT_EQ(cudaMemset(buf, 0, 4 << 20), cudaSuccess);
  a.a = a.b = a.c = buf;
  a.workspace_bytes = gemm_workspace_bytes(a);
  ASSERT_GT(a.workspace_bytes, 0);
  ASSERT_EQ(cudaMalloc(&ws, a.workspace_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0, a.workspace_bytes), cudaSuccess);
  const uint32_t dirty = 5;  // split slot 0's arrival count, left by something else
  ASSERT_EQ(cudaMemcpy(ws, &dirty, sizeof(dirty), cudaMemcpyHostToDevice), cudaSuccess);
  a.workspace = ws;
  GemmStallReport* report = nullptr;
  ASSERT_EQ(cudaHostAlloc(&report, sizeof(GemmStallReport), cudaHostAllocMapped), cudaSuccess);
  *report = GemmStallReport{};
  a.stall_report = report;
  const GemmWork w = gemm_work(a);
  ASSERT_EQ(w.split.tiles, 4);
  const TileCoord first_split = gemm_tile_order(a, w.blocks).at(static_cast<int>(w.tiles - 4));
  gemm(a, 0);
  EXPECT_NE(cudaDeviceSynchronize(), cudaSuccess) << "the engine did not trap";
  EXPECT_EQ(report->flag, GemmStallReport::kDirtyWorkspace);
  EXPECT_EQ(report->tile_m, first_split.m);
  EXPECT_EQ(report->tile_n, first_split.n);
  std::printf("reported: flag %d, tile (%d, %d)\n", report->flag, report->tile_m, report->tile_n);
}
