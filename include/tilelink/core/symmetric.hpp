// SymmetricView: the symmetric heap as one rank sees it. Every rank allocates the same layout; a
// Field of that layout names the same array on every rank, reached through that rank's base pointer.
// Trivially copyable, so CPU threads and GPU kernels read it the same way (on the GPU the bases are
// peer-mapped device pointers).
#pragma once

#include "tilelink/core/config.hpp"
#include "tilelink/core/workspace.hpp"

namespace tilelink {

struct SymmetricView {
  int rank = 0;
  int world_size = 1;
  void* bases[kMaxWorldSize] = {};

  template <class T>
  TL_HD T* local(Field<T> f) const { return f.in(bases[rank]); }
  template <class T>
  TL_HD T* peer(int r, Field<T> f) const { return f.in(bases[r]); }
};

}  // namespace tilelink
