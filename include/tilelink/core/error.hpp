// Host-side errors. Library code throws; it never calls exit().
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tilelink {

// Any refused input or failed operation.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bounded wait ran out of time. The message names op, rank, tile, signal slot, expected and
// observed value.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// An argument that does not fit the call: a shape, a count, a split or a type that disagrees with
// the others. (Python bindings raise it as ValueError.)
class ArgumentError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] inline void throw_error(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  os << what << " [" << file << ":" << line << "]";
  throw Error(os.str());
}
}  // namespace detail

}  // namespace tilelink

// TL_REQUIRE(cond, stream-expression): refuse with a clear message and file:line.
//   TL_REQUIRE(k % 8 == 0, "K must be a multiple of 8, got " << k);
#define TL_REQUIRE(cond, msg)                                              \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::ostringstream tl_os_;                                           \
      tl_os_ << msg;                                                       \
      ::tilelink::detail::throw_error(__FILE__, __LINE__, tl_os_.str());   \
    }                                                                      \
  } while (0)
