// The mismatch message of Agreement (runtime/agreement.hpp): which field differs on which rank.
#include "tilelink/runtime/agreement.hpp"

#include <gtest/gtest.h>

#include "tilelink/core/error.hpp"

namespace tilelink::cuda {
namespace {

Agreement::Entry entry(int64_t n, std::vector<int64_t> rows) {
  Agreement a("gemm_ar");
  a.add("N", n).add("rows", RowPartition::from_counts(rows));
  return {a.names(), a.values()};
}

TEST(Agreement, SameValuesAgree) {
  EXPECT_EQ(Agreement::mismatch("gemm_ar", {entry(256, {3, 5}), entry(256, {3, 5})}), "");
}

TEST(Agreement, NamesTheFieldAndTheRanks) {
  const std::string m = Agreement::mismatch("gemm_ar", {entry(256, {3, 5}), entry(256, {3, 5}), entry(128, {3, 5})});
  EXPECT_NE(m.find("the ranks disagree on N: 256 on rank 0, 128 on rank 2"), std::string::npos) << m;
  const std::string rows = Agreement::mismatch("gemm_ar", {entry(256, {3, 5}), entry(256, {4, 4})});
  EXPECT_NE(rows.find("disagree on rows[0]: 3 on rank 0, 4 on rank 1"), std::string::npos) << rows;
}

TEST(Agreement, AnotherOpOrLayout) {
  Agreement a("gemm_ar");
  a.add("N", 256).add("K", 64);
  const std::string m = Agreement::mismatch("gemm_ar", {entry(256, {3, 5}), {a.names(), a.values()}});
  EXPECT_NE(m.find("rank 1 is not making the same op as rank 0"), std::string::npos) << m;
}

TEST(Agreement, BoundedNumberOfValues) {
  Agreement a("op");
  EXPECT_THROW(a.add("v", std::vector<int64_t>(Agreement::kMaxValues + 1, 0)), Error);
}

}  // namespace
}  // namespace tilelink::cuda
