// The host side of Agreement (runtime/agreement.hpp): the values and the mismatch message. The
// exchange across processes is in agreement_mpi.cu (it needs the World).
#include "tilelink/runtime/agreement.hpp"

#include <sstream>

#include "tilelink/core/error.hpp"

namespace tilelink::cuda {

Agreement& Agreement::add(const std::string& name, int64_t value) {
  TL_REQUIRE(static_cast<int>(values_.size()) < kMaxValues,
             what_ << ": more than " << kMaxValues << " values to agree on");
  names_.push_back(name);
  values_.push_back(value);
  return *this;
}

Agreement& Agreement::add(const std::string& name, const std::vector<int64_t>& values) {
  for (size_t i = 0; i < values.size(); ++i) add(name + "[" + std::to_string(i) + "]", values[i]);
  return *this;
}

Agreement& Agreement::add(const std::string& name, const RowPartition& rows) {
  for (int r = 0; r < rows.world_size; ++r) add(name + "[" + std::to_string(r) + "]", rows.size(r));
  return *this;
}

std::string Agreement::mismatch(const std::string& what, const std::vector<Entry>& all) {
  if (all.empty()) return {};
  const Entry& first = all[0];
  for (size_t r = 1; r < all.size(); ++r) {
    const Entry& e = all[r];
    if (e.names != first.names) {
      // A different op, or another layout of its values: name the first name that differs.
      size_t i = 0;
      while (i < e.names.size() && i < first.names.size() && e.names[i] == first.names[i]) ++i;
      std::ostringstream os;
      os << what << ": rank " << r << " is not making the same op as rank 0: ";
      if (i < e.names.size() && i < first.names.size())
        os << "its value " << i << " is '" << e.names[i] << "', rank 0's '" << first.names[i] << "'";
      else
        os << "it has " << e.names.size() << " values to agree on, rank 0 " << first.names.size();
      return os.str();
    }
  }
  for (size_t i = 0; i < first.values.size(); ++i) {
    for (size_t r = 1; r < all.size(); ++r) {
      if (all[r].values[i] == first.values[i]) continue;
      std::ostringstream os;
      os << what << ": the ranks disagree on " << first.names[i] << ": " << first.values[i] << " on rank 0, "
         << all[r].values[i] << " on rank " << r << " (every rank must be given the same shape, split and config)";
      return os.str();
    }
  }
  return {};
}

}  // namespace tilelink::cuda
