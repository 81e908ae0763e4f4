// Agreement::check: the values of every rank's process gathered through the world's bootstrap within
// a deadline (runtime/agreement.hpp).
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "tilelink/core/error.hpp"
#include "tilelink/core/hash.hpp"
#include "tilelink/runtime/agreement.hpp"
#include "tilelink/runtime/world.hpp"

namespace tilelink::cuda {

void Agreement::check(const World& world, std::chrono::milliseconds timeout) const {
  if (world.transport() != Transport::kIpc) return;  // one process: one set of arguments
  struct Digest {
    uint64_t names;  // hash of what_ and every name, in order
    uint64_t node;   // hash of the host name
    int32_t count;
    int32_t pad;
    int64_t values[kMaxValues];
  } mine{};
  mine.names = fnv1a(what_);
  for (const std::string& n : names_) mine.names = fnv1a(n, mine.names * 31 + 7);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  mine.node = fnv1a(host);
  mine.count = static_cast<int32_t>(values_.size());
  std::memcpy(mine.values, values_.data(), values_.size() * sizeof(int64_t));
  const int W = world.size();
  std::vector<Digest> all(W);
  world.bootstrap().allgather(&mine, all.data(), sizeof(Digest), timeout,
                              what_ + ": the ranks' agreement exchange (is every rank making this op?)");
  for (int r = 0; r < W; ++r) {
    TL_REQUIRE(all[r].node == all[0].node,
               what_ << ": rank " << r << " runs on another node than rank 0; the ipc transport needs one node");
    TL_REQUIRE(all[r].names == all[0].names && all[r].count == all[0].count,
               what_ << ": rank " << r << " is not making the same op as rank 0 (its list of values to agree on "
                     << "differs: another op, world size or config)");
  }
  std::vector<Entry> entries(W);
  for (int r = 0; r < W; ++r) {
    entries[r].names = names_;
    entries[r].values.assign(all[r].values, all[r].values + all[r].count);
  }
  const std::string why = mismatch(what_, entries);
  TL_REQUIRE(why.empty(), why);
}

}  // namespace tilelink::cuda
