// Typed workspace layouts: a workspace (in the symmetric heap) is a struct of Fields, each an array of
// a known element type at a known byte offset. Plans build their layout once with LayoutBuilder and
// read it the same way on every backend; nobody does raw offset arithmetic.
#pragma once

#include <cstddef>

#include "tilelink/core/config.hpp"

namespace tilelink {

// Signals are 64-bit epoch counters (see prim/signal.hpp).
using Signal = uint64_t;

template <class T>
struct Field {
  uint64_t offset = 0;  // bytes from the workspace base
  int64_t count = 0;    // elements

  TL_HD T* in(void* base) const {
    return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
  }
  TL_HD const T* in(const void* base) const {
    return reinterpret_cast<const T*>(static_cast<const char*>(base) + offset);
  }
  TL_HD uint64_t num_bytes() const { return static_cast<uint64_t>(count) * sizeof(T); }
};

// Byte buffers whose element type is chosen at run time (staging tiles in the op's dtype).
using ByteField = Field<std::byte>;

class LayoutBuilder {
 public:
  // Appends an array of `count` T, aligned to `align` bytes (256 by default: TMA and 16-byte vectors).
  template <class T>
  Field<T> add(int64_t count, uint64_t align = 256) {
    cursor_ = static_cast<uint64_t>(round_up(static_cast<int64_t>(cursor_), static_cast<int64_t>(align)));
    Field<T> f{cursor_, count};
    cursor_ += f.num_bytes();
    return f;
  }
  uint64_t num_bytes() const {
    return static_cast<uint64_t>(round_up(static_cast<int64_t>(cursor_), 256));
  }

 private:
  uint64_t cursor_ = 0;
};

}  // namespace tilelink
