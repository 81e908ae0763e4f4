// What every rank of an op must agree on, checked across processes before the op's first call.
//
//   Agreement ag("gemm_ar");
//   ag.add("world", W).add("N", n).add("rows", rows).add("K", k_per_rank).add("dtype", int(dtype));
//   ag.check(world);   // ipc: every rank refuses a mismatch, naming the field and the ranks
//
// One process (virtual, peer) builds every rank's plan from one set of arguments: nothing to
// exchange. Under ipc (one process per rank) each process was given its own arguments: check()
// gathers every rank's values through the world's bootstrap within a deadline (5 s by default), and on every rank
// throws an Error naming the first field that differs and the ranks' values, so no rank launches
// on mismatched plans. It also compares the node (ipc needs one node).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tilelink/core/partition.hpp"

namespace tilelink::cuda {

class World;

class Agreement {
 public:
  static constexpr int kMaxValues = 256;

  explicit Agreement(std::string what) : what_(std::move(what)) {}
  Agreement& add(const std::string& name, int64_t value);
  Agreement& add(const std::string& name, const std::vector<int64_t>& values);  // name[0], name[1], ...
  Agreement& add(const std::string& name, const RowPartition& rows);            // each rank's row count

  // Refuses (tilelink::Error, on every rank) where the ranks' values differ; TimeoutError where a
  // peer does not take part within `timeout`.
  void check(const World& world, std::chrono::milliseconds timeout = std::chrono::seconds(5)) const;

  // Where `all` (one entry per rank: its names and values) disagree, the message check() throws;
  // empty where they agree. Pure: tested on the CPU.
  struct Entry {
    std::vector<std::string> names;
    std::vector<int64_t> values;
  };
  static std::string mismatch(const std::string& what, const std::vector<Entry>& all);

  const std::vector<std::string>& names() const { return names_; }
  const std::vector<int64_t>& values() const { return values_; }

 private:
  std::string what_;
  std::vector<std::string> names_;
  std::vector<int64_t> values_;
};

}  // namespace tilelink::cuda
