// WorldGraph: one call of the fused ops captured in CUDA graphs, one per local rank, and replayed.
//
//   cuda::WorldGraph g(world, [&] { op.run(a, b, c); });   // captured, not run
//   for (...) { /* new inputs in the same buffers */ g.replay(); world.sync("op"); }
//
// Every local rank's stream is captured (cudaStreamCaptureModeRelaxed) around `call`, which must
// enqueue on those streams (the ops do: their forks join back onto world.stream(r)). A replay
// launches every rank's graph on its stream; the ops' signals carry per-call epochs on the device, so
// replays and eager calls mix. TILELINK_GRAPH_DOT=<dir> writes each captured graph as a DOT file.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda {

class WorldGraph {
 public:
  WorldGraph(World& world, const std::function<void()>& call);
  ~WorldGraph();
  WorldGraph(const WorldGraph&) = delete;
  WorldGraph& operator=(const WorldGraph&) = delete;

  // Launches every local rank's graph on its stream, in rank order or (reverse) the other way round.
  void replay(bool reverse = false);

 private:
  World& world_;
  std::vector<cudaGraph_t> graphs_;
  std::vector<cudaGraphExec_t> execs_;
};

}  // namespace tilelink::cuda
