// FNV-1a over the bytes of a string: a stable 64-bit digest, the same in every process (ranks that
// must agree compare such digests of names and options).
#pragma once

#include <cstdint>
#include <string_view>

namespace tilelink {

constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnv1aOffset) {
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

}  // namespace tilelink
