// Internal to the CUDA fused ops: the epochs of an op's calls, eager or captured in a CUDA graph.
//
//   CallEpochs epochs(world);
//   epochs.begin(1);                        // a call using one epoch, on every local rank's stream
//   launch(..., epochs.epoch(r, 1));        // kernels read it (backend/cuda/epoch.hpp)
//   StreamContext sc{&world, r, s, "op", epochs.counter(r)};   // stream prims: offsets in graph mode
//   rank_barrier(sc, heap, f, epochs.value(r, 1));
//
// Eager calls use host epochs 1, 2, ... baked into each launch and stream operation (the verified
// copy-engine path, no extra kernels) and write the host epoch into the rank's device counter, so
// the counter is right whenever a capture starts. A call begun while any local rank's stream is
// being captured switches the op to graph mode for good: from then on every call, eager or
// replayed, first adds its number of epochs to the counter (a one-thread kernel) and everything
// reads its epoch from the counter when it runs, so each replay of a captured call publishes and
// waits for new values. Signals are never reset.
#pragma once

#include <cstdint>
#include <vector>

#include "tilelink/backend/cuda/epoch.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda::detail {

class CallEpochs {
 public:
  explicit CallEpochs(World& world);  // one zeroed device counter per local rank
  ~CallEpochs();
  CallEpochs(const CallEpochs&) = delete;
  CallEpochs& operator=(const CallEpochs&) = delete;

  // Starts a call that uses `n` epochs: enqueues the counter's advance on every local rank's stream.
  void begin(int n);
  // The i-th (1..n) epoch of the call begun last, on rank r.
  Epoch epoch(int r, int i) const;
  // What stream primitives take: the counter in graph mode (else null), and the value argument (an
  // offset from the counter in graph mode, the host epoch otherwise).
  const uint64_t* counter(int r) const { return graph_ ? counters_[r] : nullptr; }
  uint64_t value(int r, int i) const { return epoch(r, i).offset; }

  bool graph_mode() const { return graph_; }
  bool started() const { return host_ > 0 || graph_; }

 private:
  World& world_;
  std::vector<uint64_t*> counters_;  // per rank; null where not local
  uint64_t host_ = 0;                // eager calls' last epoch
  int last_n_ = 0;
  bool graph_ = false;
};

}  // namespace tilelink::cuda::detail
