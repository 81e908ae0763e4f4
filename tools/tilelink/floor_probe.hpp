// The floor of a fused op that reads its peers' bytes: what no fused call can beat, measured on the
// world the op runs on. A signal round trip between ranks 0 and 1 (one thread each, the world's
// scope), and rank 0's SMs reading rank 1's memory with 16-byte vector loads (nothing else: no
// reduction, no stores but one word a thread): on one SM and on all of rank 0's SMs.
//   floor(bytes) = round trip + bytes / (read rate on all the rank's SMs)
// Collective under ipc (ranks 0 and 1 take part; every process calls it).
#pragma once

#include "tilelink/runtime/world.hpp"

namespace tilelink::cli {

class FloorProbe {
 public:
  explicit FloorProbe(cuda::World& world);
  double round_trip_us() const { return rtt_us_; }
  double read_gbps_per_sm() const { return gbps_one_; }
  double read_gbps_all() const { return gbps_all_; }
  double floor_ms(double peer_bytes) const { return rtt_us_ * 1e-3 + peer_bytes / (gbps_all_ * 1e9) * 1e3; }

 private:
  double rtt_us_ = 0, gbps_one_ = 0, gbps_all_ = 0;
};

}  // namespace tilelink::cli
