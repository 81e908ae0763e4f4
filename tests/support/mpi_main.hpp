// The main() of an ipc test program (tests/gpu/ipc_*.cu, run as mpirun -np 2): MPI set up around
// `body`, which returns its failures; an exception counts as one, with its message. The program
// exits 0 only when no rank failed. Without MPI in the build it reports a skip and exits 0.
#pragma once

#include <cstdio>
#include <exception>

#if defined(TILELINK_HAS_MPI)
#include <mpi.h>
#endif

namespace tilelink::test {

template <class Body>
int mpi_main(int argc, char** argv, const char* name, Body&& body) {
#if !defined(TILELINK_HAS_MPI)
  (void)argc;
  (void)argv;
  (void)body;
  std::printf("%s: built without MPI, skipped\n", name);
  return 0;
#else
  MPI_Init(&argc, &argv);
  int failures = 0;
  try {
    failures += body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    failures += 1;
  }
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return all == 0 ? 0 : 1;
#endif
}

}  // namespace tilelink::test
