// What the Python module (module.cpp) asks of a backend: make an op once for a problem and run it
// on every rank's operands. The CPU backend is plain C++ (module.cpp); the CUDA one (cuda_backend.cu)
// is compiled by nvcc, so this header holds no CUDA types.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "op_registry.hpp"
#include "tilelink/runtime/bootstrap.hpp"

namespace tilelink::python {

class CudaBackend {
 public:
  virtual ~CudaBackend() = default;
  virtual int size() const = 0;
  virtual int device() const = 0;
  // Enqueues the op of problem `p` (made on its first call, then reused; p.path picks fused,
  // unfused or the path model's choice) on every rank of this process, ordered after the work on `stream` (a
  // cudaStream_t of the caller's device, 0: the legacy default stream), and makes `stream` wait for
  // it. Returns the path taken and why.
  virtual PathChoice run(const cli::OpSpec& spec, const cli::OpProblem& p, const cli::ConstPtrs& a,
                         const cli::ConstPtrs& b, const cli::Ptrs& c, uintptr_t stream) = 0;
  // Waits for every rank's work (of this process); a wait on the device that ran out of time becomes TimeoutError
  // naming the op, rank, signal and tile (World::sync).
  virtual void sync() = 0;
  // After an error this rank's peers may not see: stops every rank's device waits (World::stop_peers).
  virtual void stop_peers() = 0;
  // The op's configuration for p: one line per rank (engine tile, SMs, comm method).
  virtual std::string config(const cli::OpSpec& spec, const cli::OpProblem& p) = 0;
};

// The GPUs this process sees (0 without CUDA or a driver).
int cuda_device_count();

// W virtual ranks on one GPU (green contexts). Throws tilelink::Error without CUDA or a GPU.
std::unique_ptr<CudaBackend> make_cuda_virtual(int world, int device, std::chrono::milliseconds timeout);
// This process's rank of an ipc world whose processes exchange through `boot` (its rank, size and
// GPU). Collective: every rank makes it. CUDA builds only.
std::unique_ptr<CudaBackend> make_cuda_process(std::shared_ptr<cuda::Bootstrap> boot, std::chrono::milliseconds timeout);

}  // namespace tilelink::python
