// WorldGraph (include/tilelink/runtime/graph.hpp).
#include "tilelink/runtime/graph.hpp"

#include <cstdlib>
#include <exception>
#include <string>

#include "tilelink/backend/cuda/check.hpp"

namespace tilelink::cuda {

WorldGraph::WorldGraph(World& world, const std::function<void()>& call) : world_(world) {
  for (int r : world.local_ranks()) {
    world.bind(r);
    TL_CUDA_CHECK(cudaStreamBeginCapture(world.stream(r), cudaStreamCaptureModeRelaxed));
  }
  // NOTE: every capture is ended, even when the call throws, so the streams stay usable.
  std::exception_ptr failed;
  try {
    call();
  } catch (...) {
    failed = std::current_exception();
  }
  static int dumps = 0;
  const char* dot_dir = std::getenv("TILELINK_GRAPH_DOT");
  for (int r : world.local_ranks()) {
    world.bind(r);
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(world.stream(r), &g);
    if (g) graphs_.push_back(g);
    if (failed) continue;
    TL_CUDA_CHECK(e);
    if (dot_dir) {
      const std::string path = std::string(dot_dir) + "/graph_" + std::to_string(++dumps) + "_rank" + std::to_string(r) + ".dot";
      TL_CUDA_CHECK(cudaGraphDebugDotPrint(g, path.c_str(), cudaGraphDebugDotFlagsVerbose));
    }
    cudaGraphExec_t x = nullptr;
    TL_CUDA_CHECK(cudaGraphInstantiate(&x, g, 0));
    execs_.push_back(x);
  }
  if (failed) {
    for (cudaGraph_t g : graphs_) cudaGraphDestroy(g);
    graphs_.clear();
    std::rethrow_exception(failed);
  }
}

WorldGraph::~WorldGraph() {
  // NOTE: unchecked (a destructor must not throw; after a device fault every call fails).
  const std::vector<int>& ranks = world_.local_ranks();
  for (size_t i = 0; i < graphs_.size(); ++i) {
    try {
      world_.bind(ranks[i]);
    } catch (...) {
    }
    if (i < execs_.size()) cudaGraphExecDestroy(execs_[i]);
    cudaGraphDestroy(graphs_[i]);
  }
}

void WorldGraph::replay(bool reverse) {
  const std::vector<int>& ranks = world_.local_ranks();
  for (size_t j = 0; j < execs_.size(); ++j) {
    const size_t i = reverse ? execs_.size() - 1 - j : j;
    world_.bind(ranks[i]);
    TL_CUDA_CHECK(cudaGraphLaunch(execs_[i], world_.stream(ranks[i])));
  }
}

}  // namespace tilelink::cuda
