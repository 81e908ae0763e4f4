// How the processes of one world find each other: a bounded all-gather of bytes between them.
//
//   auto boot = cuda::mpi_bootstrap();                       // mpirun: MPI_COMM_WORLD
//   cuda::World world({.transport = cuda::Transport::kIpc, .bootstrap = boot});
//
// The ipc transport (one process per rank) exchanges through it everything the processes must share
// or agree on: the CUDA IPC handles of each symmetric allocation, the agreement digest of each op,
// the NCCL unique id of the unfused baselines, the teardown barriers. Two bootstraps ship: MPI
// (mpi_bootstrap, for programs launched by mpirun) and torch.distributed (the Python package's
// tilelink.init, for programs launched by torchrun); a program with its own launcher implements
// this interface. Every exchange is bounded: an implementation throws TimeoutError naming `what`
// where a peer does not take part within the timeout.
//
// This header holds no CUDA types (the Python module implements it in plain C++).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace tilelink::cuda {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;  // this process's rank, 0..size()-1
  virtual int size() const = 0;
  // The GPU this process drives (an index of the devices it sees).
  virtual int device() const = 0;
  // Every rank's `bytes` bytes (this one's from `mine`), in rank order, into `all` (size() * bytes).
  // Collective: every rank calls it, with the same `bytes`, in the same order.
  virtual void allgather(const void* mine, void* all, size_t bytes, std::chrono::milliseconds timeout,
                         const std::string& what) = 0;

  // A barrier: allgather of nothing.
  void barrier(std::chrono::milliseconds timeout, const std::string& what);
  // Rank 0's `bytes` bytes into `data` on every rank.
  void broadcast(void* data, size_t bytes, std::chrono::milliseconds timeout, const std::string& what);
};

// MPI_COMM_WORLD, MPI initialised on first use (and finalised at exit if initialised here); the
// device is the rank among the node's processes modulo the visible GPUs. Throws Error in a build
// without MPI.
std::shared_ptr<Bootstrap> mpi_bootstrap();

}  // namespace tilelink::cuda
