// Measures the engine's tiles for a shape on this device and remembers the fastest.
//
// gemm() picks its tile from a model of waves and per-width margins, fitted on one card (the H200,
// bench/notes/gemm.md). Another card moves the margins: on an H100 the 256-wide tile beat the pick
// by up to 26% on tensor-parallel shard shapes (bench/results/2026-12-05_h100_gemm_tiles.md). A
// GemmTuner times every candidate tile once per shape, on the caller's stream and operands, and
// runs the fastest from then on:
//
//   sm90::GemmTuner tuner;
//   tuner.gemm(args, stream);  // first call for this shape: measures (synchronously), then runs
//   tuner.gemm(args, stream);  // later calls: the remembered tile, no measurement
//
// The key is (device, input and output types, epilogue, M, N, K, num_sms, whether the call has a
// split workspace). The measurement writes only the tuner's own scratch output and workspace (A and
// B are read), so kReduceAdd calls keep their C. Inside a stream capture it measures nothing: an
// unknown shape runs gemm()'s pick there. Launches that name a tile (tile_n or tile_m), and decode
// sizes (gemm_takes_decode), are not tuned. One tuner may be shared by threads.
//
// A split last wave needs a workspace sized for the tile that runs: size it after tile_for, e.g.
//   GemmArgs a = args;
//   const GemmTile t = tuner.tile_for(a, stream);  // a.workspace set: candidates measured with splits
//   a.tile_m = t.m, a.tile_n = t.n;
//   workspace.attach(a, stream);
//   sm90::gemm(a, stream);
// GemmTuner::gemm keeps the caller's workspace where it is large enough for the tile, and runs
// without a split otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include <cuda_runtime.h>

#include "tilelink/compute/sm90/gemm.hpp"

namespace tilelink::compute::sm90 {

// The tiles a tuner measures: the hooked widths (128 x 256, 192, 160, 128) and the plain engine's
// 128 x 176 and 256 x 160.
std::vector<GemmTile> gemm_tuner_candidates();

// The fastest of `times_ms` (one per candidate, negative: not measured), the earliest on a tie;
// -1 if none was measured.
int gemm_tuner_fastest(const std::vector<double>& times_ms);

class GemmTuner {
 public:
  // reps: timed launches a candidate (after one untimed), the median kept.
  explicit GemmTuner(int reps = 5);
  GemmTuner(const GemmTuner&) = delete;
  GemmTuner& operator=(const GemmTuner&) = delete;
  ~GemmTuner();

  // The tile gemm() runs args with under this tuner (measured now, on `stream`, where this shape is
  // new and the stream is not capturing). Checks the arguments (gemm_check).
  GemmTile tile_for(const GemmArgs& args, cudaStream_t stream);
  // gemm() with that tile named (and a split workspace of the tuner's where the tile splits).
  void gemm(const GemmArgs& args, cudaStream_t stream);

  // Shapes measured so far, and the candidate launches those measurements made.
  size_t shapes() const;
  int64_t measured_launches() const;

 private:
  using Key = std::tuple<int, int, int, int, int64_t, int64_t, int64_t, int, bool>;
  static Key key_of(const GemmArgs& args, int device);
  GemmTile measure(const GemmArgs& args, cudaStream_t stream);

  int reps_;
  mutable std::mutex mu_;
  std::map<Key, GemmTile> best_;
  int64_t launches_ = 0;
  void* scratch_ = nullptr;  // the candidates' output
  int64_t scratch_bytes_ = 0;
  GemmWorkspace workspace_;  // the split last wave's, for the candidates
};

}  // namespace tilelink::compute::sm90
