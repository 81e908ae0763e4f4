// The ipc transport: one process per rank (mpirun -np 2), the AllGather half of AG+GEMM over CUDA
// IPC handles exchanged through MPI. Every rank checks its gathered A against the concatenation of
// every rank's A (generated from a seed every rank knows), bit for bit. With as many GPUs as ranks,
// the ranks must sit on different GPUs (checked); with fewer, they share (time-sliced, slow).
// Without MPI in the build it reports a skip.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../support/mpi_main.hpp"
#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/ops/cuda/comm.hpp"

#if defined(TILELINK_HAS_MPI)
#include <mpi.h>
#endif

using namespace tilelink;
namespace tlc = tilelink::cuda;

int main(int argc, char** argv) {
  return tilelink::test::mpi_main(argc, argv, "ipc_allgather", [] {
    int failures = 0;
#if defined(TILELINK_HAS_MPI)
    tlc::World w({.transport = tlc::Transport::kIpc});
    const int me = w.local_ranks().at(0), world = w.size();
    int gpus = 0;
    TL_CUDA_CHECK(cudaGetDeviceCount(&gpus));
    std::vector<int> devices(world);
    const int mine = w.device(me);
    MPI_Allgather(&mine, 1, MPI_INT, devices.data(), 1, MPI_INT, MPI_COMM_WORLD);
    int distinct = 0;
    for (int r = 0; r < world; ++r)
      distinct += std::count(devices.begin(), devices.begin() + r, devices[r]) == 0;
    if (me == 0) {
      std::printf("ipc_allgather: %d ranks, %d GPUs here; rank -> GPU:", world, gpus);
      for (int r = 0; r < world; ++r) std::printf(" %d->%d", r, devices[r]);
      std::printf("\n");
    }
    if (distinct != std::min(world, gpus)) {
      std::fprintf(stderr, "ipc_allgather: rank %d: %d ranks on %d distinct GPUs, %d GPUs here\n", me, world,
                   distinct, gpus);
      failures += 1;
    }
    std::vector<int64_t> counts(world);
    for (int r = 0; r < world; ++r) counts[r] = 37 + 29 * r;  // ragged
    const RowPartition rows = RowPartition::from_counts(counts);
    const int64_t k = 264;
    AgGemmConfig cfg;
    cfg.comm_tile_rows = 32;
    for (CommMode mode : {CommMode::kPull, CommMode::kPush})
      for (auto method : {tlc::CopyMethod::kVector, tlc::CopyMethod::kBulk, tlc::CopyMethod::kCopyEngine}) {
        if (mode == CommMode::kPush && method == tlc::CopyMethod::kCopyEngine) continue;
        cfg.mode = mode;
        const AgGemmPlan p = AgGemmPlan::make(me, rows, 8, k, DType::kBF16, cfg);
        tlc::SymmetricBuffer ws = w.allocate(p.ws.num_bytes);
        for (uint64_t epoch = 1; epoch <= 2; ++epoch) {
          // Everyone's A, from a shared seed; this rank uploads its own.
          std::vector<std::vector<uint16_t>> a(world);
          for (int r = 0; r < world; ++r) {
            std::mt19937 rng(1000 * epoch + 10 * r + static_cast<int>(mode));
            a[r].resize(counts[r] * k);
            for (auto& x : a[r]) x = static_cast<uint16_t>(rng());
          }
          void* a_dev = nullptr;
          TL_CUDA_CHECK(cudaMalloc(&a_dev, a[me].size() * 2));
          TL_CUDA_CHECK(cudaMemcpy(a_dev, a[me].data(), a[me].size() * 2, cudaMemcpyHostToDevice));
          const size_t gbytes = rows.total() * k * 2;
          TL_CUDA_CHECK(cudaMemset(p.ag.f.gathered.in(ws.base(me)), 0xff, gbytes));  // poison
          TL_CUDA_CHECK(cudaDeviceSynchronize());
          MPI_Barrier(MPI_COMM_WORLD);
          tlc::launch_allgather(w, p.ag, p.ws.barrier, ws.view(me), a_dev, epoch, {method, 2, 256});
          w.barrier("ipc allgather");
          std::vector<uint16_t> got(gbytes / 2), want;
          TL_CUDA_CHECK(cudaMemcpy(got.data(), p.ag.f.gathered.in(ws.base(me)), gbytes, cudaMemcpyDeviceToHost));
          for (int r = 0; r < world; ++r) want.insert(want.end(), a[r].begin(), a[r].end());
          const bool ok = std::memcmp(got.data(), want.data(), gbytes) == 0;
          failures += !ok;
          std::printf("ipc_allgather rank %d/%d %s %s epoch %llu: %s\n", me, world,
                      mode == CommMode::kPush ? "push" : "pull", tlc::copy_method_name(method),
                      static_cast<unsigned long long>(epoch), ok ? "OK" : "MISMATCH");
          cudaFree(a_dev);
        }
      }
#endif
    return failures;
  });
}
