// What the benches share beyond one stream: the run's stamp (UTC date, the commit) and, for ops
// over the virtual ranks of a world, a call timed on the host clock to the world's sync.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "tilelink/core/error.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cli {

// The run's header line: UTC date, device, the commit ($TILELINK_COMMIT, else `git rev-parse` in
// the working directory, else "unknown").
inline std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}
inline std::string source_commit() {
  if (const char* env = std::getenv("TILELINK_COMMIT"); env != nullptr && *env) return env;
  std::string out;
  if (FILE* f = popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
    char buf[64];
    if (std::fgets(buf, sizeof(buf), f) != nullptr) out = buf;
    (void)pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

// The transport of a world of `world` ranks that this one process drives: "virtual" (ranks on one
// GPU, each its green context's SMs) or "peer" (a GPU a rank, peer access, NCCL's baselines);
// "auto": peer where this machine has a GPU for every rank of a world of more than one, else
// virtual. ipc (a process a rank) is refused: these commands hold every rank's data.
inline void require_one_process_transport_name(const std::string& name, const std::string& who) {
  TL_REQUIRE(name == "auto" || name == "virtual" || name == "peer",
             who << ": --transport must be auto, virtual or peer, got '" << name << "'");
}
inline cuda::Transport one_process_transport(const std::string& name, int world, const std::string& who) {
  require_one_process_transport_name(name, who);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    (void)cudaGetLastError();
    devices = 0;
  }
  if (name == "auto") return world > 1 && devices >= world ? cuda::Transport::kPeer : cuda::Transport::kVirtual;
  const cuda::Transport t = name == "peer" ? cuda::Transport::kPeer : cuda::Transport::kVirtual;
  TL_REQUIRE(t != cuda::Transport::kPeer || devices >= world,
             who << ": --transport peer needs a GPU a rank: world " << world << ", " << devices << " GPU(s) here");
  return t;
}
inline const char* transport_words(cuda::Transport t) {
  return t == cuda::Transport::kPeer ? "ranks on separate GPUs (peer; baselines' collectives: NCCL)"
                                     : "virtual ranks on one GPU (each its green context's SMs)";
}

// Host wall time of fn() and the world's sync, in ms.
template <class Fn>
double timed_ms(cuda::World& world, const char* what, Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  world.sync(what);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace tilelink::cli
