// The ipc transport (mpirun -np 2): a fault on one rank stops its peer, which names it. Rank 0 (a
// world timeout of 0.5 s) waits on a signal nobody sets; rank 1 (a timeout of 30 s) waits on a
// signal of rank 0's that rank 0 never sets. Rank 0 times out, writes every rank's stop word and
// traps; rank 1's wait sees its stop word and stops too, within a few seconds of the start instead
// of at its own 30 s deadline, and its error names rank 0 as the rank that faulted.
#include <chrono>
#include <cstdio>
#include <string>

#include "../support/mpi_main.hpp"
#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/core/error.hpp"
#include "tilelink/runtime/world.hpp"

using namespace tilelink;
namespace tlc = tilelink::cuda;

namespace {

__global__ void wait_kernel(SymmetricView heap, tlc::DeviceContext ctx, Field<Signal> flags, int slot) {
  if (threadIdx.x == 0)
    tlc::peer_tile_wait<Scope::kSystem>(ctx, heap, 0, flags, slot, 1, WaitSite{SignalField::kReady, slot});
}
TL_REGISTER_KERNELS(wait_kernel);

}  // namespace

int main(int argc, char** argv) {
  return tilelink::test::mpi_main(argc, argv, "ipc_fault", [] {
    int failures = 0;
#if defined(TILELINK_HAS_MPI)
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    using namespace std::chrono_literals;
    // NOTE: held, never destroyed: a world whose kernel trapped is not destroyed cleanly while the
    // trap is on its way (on one GPU shared by two processes it can take seconds to surface); the
    // process exits instead, which frees everything.
    tlc::World& w = *new tlc::World({.transport = tlc::Transport::kIpc, .timeout = me == 0 ? 500ms : 30000ms});
    if (w.size() != 2) {
      std::printf("ipc_fault: needs 2 ranks, got %d\n", w.size());
      return 1;
    }
    LayoutBuilder lb;
    const Field<Signal> flags = lb.add<Signal>(2);
    tlc::SymmetricBuffer& buf = *new tlc::SymmetricBuffer(w.allocate(lb.num_bytes()));
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    w.bind(me);
    wait_kernel<<<1, 32, 0, w.stream(me)>>>(buf.view(me), w.device_context(me), flags, me);
    try {
      w.sync("fault_probe");
      std::printf("ipc_fault rank %d: the wait returned: FAILED\n", me);
      ++failures;
    } catch (const TimeoutError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string m = e.what();
      // Rank 1 names rank 0 either from its own device wait's record (the wait on ready[1] saw the
      // stop) or, when its host saw the stop word first and no device wait took it within 5 ms (ranks
      // time-slicing one GPU), from the host; rank 1's message must come well before its own 30 s.
      const std::string want = me == 0 ? "rank 0 timed out waiting on ready[0] of rank 0"
                                       : "rank 0 stopped the world (a fault on its device or an error in its host "
                                         "code; its own process reports it); rank 1 stopped waiting";
      const bool ok = m.find(want) != std::string::npos && s < (me == 0 ? 10 : 3);
      std::printf("ipc_fault rank %d: %s after %.2f s: %s\n", me, ok ? "stopped" : "WRONG", s, m.c_str());
      failures += !ok;
    }
#endif
    return failures;
  });
}
