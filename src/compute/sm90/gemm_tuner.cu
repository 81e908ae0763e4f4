// GemmTuner (gemm_tuner.hpp): each candidate tile timed on the caller's stream, the fastest kept.
#include "tilelink/compute/sm90/gemm_tuner.hpp"

#include <algorithm>

#include "tilelink/compute/sm90/impl/check_cuda.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::compute::sm90 {

std::vector<GemmTile> gemm_tuner_candidates() {
  return {{kTileM, kTileN},     {kTileM, kTileNNarrow}, {kTileM, kTileNFit},
          {kTileM, kTileNLean}, {kTileM, kTileNSlim},   {kTileMTall, kTileNTall}};
}

int gemm_tuner_fastest(const std::vector<double>& times_ms) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(times_ms.size()); ++i) {
    if (times_ms[i] >= 0 && (best < 0 || times_ms[i] < times_ms[best])) best = i;
  }
  return best;
}

namespace {

// Events for one measurement, destroyed however it ends.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    TL_SM90_CUDA_CHECK(cudaEventCreate(&start));
    TL_SM90_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    (void)cudaEventDestroy(start);  // NOTE: not checked: a destructor must not throw
    (void)cudaEventDestroy(stop);
  }
};

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TL_SM90_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

bool names_a_tile(const GemmArgs& args) { return args.tile_n != 0 || args.tile_m != 0; }

}  // namespace

GemmTuner::GemmTuner(int reps) : reps_(reps) {
  TL_REQUIRE(reps >= 1, "GemmTuner: reps must be >= 1, got " << reps);
}

GemmTuner::~GemmTuner() {
  if (scratch_ != nullptr) (void)cudaFree(scratch_);  // NOTE: not checked (a destructor)
}

GemmTuner::Key GemmTuner::key_of(const GemmArgs& a, int device) {
  return {device,
          static_cast<int>(a.in_type),
          static_cast<int>(a.out_type),
          static_cast<int>(a.epilogue),
          a.m,
          a.n,
          a.k,
          a.num_sms,
          a.workspace != nullptr};
}

GemmTile GemmTuner::tile_for(const GemmArgs& args, cudaStream_t stream) {
  gemm_check(args);
  if (names_a_tile(args) || gemm_takes_decode(args) || args.m == 0) {
    const GemmWork w = gemm_work(args, true);
    return {w.tile_m, w.tile_n};
  }
  int device = 0;
  TL_SM90_CUDA_CHECK(cudaGetDevice(&device));
  const Key key = key_of(args, device);
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto it = best_.find(key); it != best_.end()) return it->second;
  if (capturing(stream)) {  // nothing synchronous inside a capture: the pick, not remembered
    const GemmWork w = gemm_work(args, true);
    return {w.tile_m, w.tile_n};
  }
  const GemmTile best = measure(args, stream);
  best_.emplace(key, best);
  return best;
}

// Called with mu_ held.
GemmTile GemmTuner::measure(const GemmArgs& args, cudaStream_t stream) {
  const int64_t out_bytes = args.m * args.n * dtype_size(args.out_type);
  if (out_bytes > scratch_bytes_) {
    if (scratch_ != nullptr) {
      TL_SM90_CUDA_CHECK(cudaStreamSynchronize(stream));
      TL_SM90_CUDA_CHECK(cudaFree(scratch_));
      scratch_ = nullptr, scratch_bytes_ = 0;
    }
    TL_SM90_CUDA_CHECK(cudaMalloc(&scratch_, out_bytes));
    scratch_bytes_ = out_bytes;
  }
  TL_SM90_CUDA_CHECK(cudaMemsetAsync(scratch_, 0, out_bytes, stream));
  const std::vector<GemmTile> tiles = gemm_tuner_candidates();
  std::vector<double> times(tiles.size(), -1.0);
  EventPair ev;
  for (size_t i = 0; i < tiles.size(); ++i) {
    GemmArgs a = args;
    a.c = scratch_, a.ldc = 0;  // packed [M, N]: the tuner's own output
    a.tile_m = tiles[i].m, a.tile_n = tiles[i].n;
    a.kernel = GemmKernel::kTileEngine;
    if (args.workspace != nullptr) {
      workspace_.attach(a, stream);  // sized for this tile's split (none: no workspace)
    } else {
      a.workspace = nullptr, a.workspace_bytes = 0;
    }
    std::vector<float> ms;
    for (int r = 0; r <= reps_; ++r) {
      TL_SM90_CUDA_CHECK(cudaEventRecord(ev.start, stream));
      sm90::gemm(a, stream);
      TL_SM90_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
      TL_SM90_CUDA_CHECK(cudaEventSynchronize(ev.stop));
      float t = 0;
      TL_SM90_CUDA_CHECK(cudaEventElapsedTime(&t, ev.start, ev.stop));
      if (r > 0) ms.push_back(t);  // the first launch untimed (code and descriptors warm)
      ++launches_;
    }
    std::sort(ms.begin(), ms.end());
    times[i] = ms[ms.size() / 2];
  }
  const int best = gemm_tuner_fastest(times);
  TL_REQUIRE(best >= 0, "GemmTuner: no candidate tile was measured");
  return tiles[best];
}

void GemmTuner::gemm(const GemmArgs& args, cudaStream_t stream) {
  const GemmTile t = tile_for(args, stream);
  if (names_a_tile(args) || gemm_takes_decode(args)) return sm90::gemm(args, stream);
  GemmArgs a = args;
  a.tile_m = t.m, a.tile_n = t.n;
  if (a.workspace != nullptr) {
    GemmArgs sized = a;
    sized.workspace = nullptr;  // gemm_workspace_bytes does not read it
    if (a.workspace_bytes < gemm_workspace_bytes(sized)) a.workspace = nullptr, a.workspace_bytes = 0;
  }
  sm90::gemm(a, stream);
}

size_t GemmTuner::shapes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return best_.size();
}

int64_t GemmTuner::measured_launches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return launches_;
}

}  // namespace tilelink::compute::sm90
