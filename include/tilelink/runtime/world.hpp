// The CUDA runtime's world: ranks, their streams and SM shares, the symmetric heap.
//
//   cuda::World world({.transport = cuda::Transport::kVirtual, .world_size = 4});
//   cuda::SymmetricBuffer ws = world.allocate(plan.ws.num_bytes);      // zero-filled, every rank
//   for (int r : world.local_ranks()) {
//     world.bind(r);                                                    // r's context current
//     my_kernel<<<grid, block, smem, world.stream(r)>>>(world.device_context(r), ws.view(r), ...);
//   }
//   world.sync("my_op");   // bounded; a device wait timeout becomes a TimeoutError naming my_op
//
// Transports
//   virtual  N ranks (1..8 or more, as the SMs allow) in this process on ONE GPU; rank r is a green
//            context holding its own share of the SMs (split evenly, granularity from the driver),
//            with its own stream. Kernels of different ranks run concurrently on disjoint SMs, so a
//            rank may spin on another rank's signals. The green contexts of a split are made once
//            per process and kept (worlds of the same size reuse them: one such world at a time).
//   peer     one process drives world_size GPUs with peer access (rank r = device r).
//   ipc      one process per rank; this process holds the bootstrap's rank on its device
//            (runtime/bootstrap.hpp: MPI under mpirun, torch.distributed under torchrun);
//            buffers are exchanged as CUDA IPC handles through the bootstrap. allocate() is
//            collective.
//
// Every kernel registered with TL_REGISTER_KERNELS, and every kernel of the program through
// CUDA_MODULE_LOADING=EAGER (set before the first CUDA call, whatever the environment says), is
// loaded in every rank's context when the world is made: lazy loading deadlocks spinning kernels.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tilelink/backend/cuda/prim.cuh"
#include "tilelink/core/symmetric.hpp"
#include "tilelink/prim/signal.hpp"
#include "tilelink/runtime/bootstrap.hpp"

namespace tilelink::cuda {

enum class Transport : uint8_t { kVirtual, kPeer, kIpc };
const char* transport_name(Transport t);
bool parse_transport(const std::string& s, Transport* out);

struct WorldOptions {
  Transport transport = Transport::kVirtual;
  int world_size = 1;  // virtual and peer; ipc takes the bootstrap's size
  int device = 0;      // virtual: the GPU
  int sms_per_rank = 0;  // virtual: 0 = an even split of the device
  std::chrono::milliseconds timeout{20000};  // every device and stream wait, every exchange
  std::shared_ptr<Bootstrap> bootstrap;      // ipc: how the processes exchange (null: mpi_bootstrap())
};

class World;

// A buffer of the same size on every rank, zero-filled at allocation. Move-only; frees on
// destruction (ipc: closes the peers' handles; call it on every rank, the world still alive).
class SymmetricBuffer {
 public:
  SymmetricBuffer() = default;
  SymmetricBuffer(SymmetricBuffer&& o) noexcept;
  SymmetricBuffer& operator=(SymmetricBuffer&& o) noexcept;
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;
  ~SymmetricBuffer();

  uint64_t num_bytes() const { return bytes_; }
  // Rank r's buffer as a device pointer valid in this process (every rank's, for every transport).
  void* base(int rank) const;
  // The view of a rank driven by this process: its own base plus every peer's.
  SymmetricView view(int rank) const;

 private:
  friend class World;
  void release() noexcept;
  World* world_ = nullptr;
  uint64_t bytes_ = 0;
  std::vector<void*> bases_;  // per rank
  std::vector<bool> owned_;   // allocated here (else opened from an IPC handle)
};

class World {
 public:
  explicit World(const WorldOptions& options);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int size() const { return size_; }
  Transport transport() const { return options_.transport; }
  const WorldOptions& options() const { return options_; }
  // ipc: the processes' exchange (every collective step of the world and its ops goes through it).
  Bootstrap& bootstrap() const;
  // The narrowest scope that covers every pair of ranks: gpu for virtual, system otherwise.
  Scope scope() const { return options_.transport == Transport::kVirtual ? Scope::kGpu : Scope::kSystem; }

  // Ranks driven by this process (all of them for virtual and peer; one for ipc).
  const std::vector<int>& local_ranks() const { return local_ranks_; }
  bool is_local(int rank) const;
  int device(int rank) const;
  int sm_count(int rank) const;          // SMs this rank's kernels may use
  cudaStream_t stream(int rank) const;   // the rank's stream (in its green context if virtual)
  // A new non-blocking stream of the rank (in its green context if virtual, so kernels launched on
  // it stay on the rank's SMs); the caller destroys it with cudaStreamDestroy.
  cudaStream_t create_stream(int rank) const;
  // Makes rank's context current on the calling thread (its green context, or its device).
  void bind(int rank) const;
  // The device-side context of a local rank, for kernels.
  DeviceContext device_context(int rank) const;

  SymmetricBuffer allocate(uint64_t bytes);

  // Waits for every local rank's stream, bounded by the timeout (plus a margin). A device wait
  // timeout (trap) or a stream wait that never completes becomes TimeoutError naming `op`, rank,
  // tile, slot, expected and observed; any other CUDA failure an Error naming `op`. After a timeout
  // the world is unusable (the device context is dead).
  void sync(const char* op);
  // sync(), then a host barrier across processes (ipc) so every rank has finished.
  void barrier(const char* op);
  // Fault propagation from the host: writes 1 + this process's first rank into every rank's stop
  // word that is still 0 (a rank that faulted first keeps the blame), so every rank's bounded device
  // waits stop within microseconds of polling and report that this rank stopped the world, instead
  // of waiting out their timeouts. For a host error that peers cannot see (a refusal of this rank's
  // own arguments, a failure between launches). The world is unusable afterwards, on every rank.
  // Bounded; never throws (it runs on error paths).
  void stop_peers() noexcept;

  // Stream waits enqueued by the stream primitives, remembered until the next sync() so that a
  // timeout can say which one never completed.
  struct StreamWait {
    int rank, owner, slot, tile;
    const char* field;
    const uint64_t* addr;  // device address, readable with cudaMemcpy
    uint64_t target;
  };
  void note_stream_wait(const StreamWait& w);

  // Loads `fn` (a __global__ function) in every local context now; the kernels registered with
  // TL_REGISTER_KERNELS are loaded by the constructor.
  void load_kernel(const void* fn) const;

  struct Rank;  // per local rank state (runtime/src)

 private:
  void init_virtual();
  void init_peer();
  void init_ipc();
  void load_registered_kernels() const;
  [[noreturn]] void fail(const char* op, int rank, cudaError_t e);

  WorldOptions options_;
  int size_ = 0;
  std::vector<int> local_ranks_;
  std::vector<std::unique_ptr<Rank>> ranks_;  // indexed by rank; null where not local
  DeviceFault* fault_ = nullptr;              // host-mapped
  std::vector<StreamWait> stream_waits_;
  // Fault propagation (prim.cuh, DeviceContext): every rank's stop word, and per local rank a device
  // table of every rank's word as that rank addresses it. Released before the ranks' state.
  SymmetricBuffer stops_;
  std::vector<unsigned int**> stop_tables_;
  friend class SymmetricBuffer;
};

// ---- kernel registry ------------------------------------------------------------------------------
// Registers __global__ functions for eager loading, at static initialization:
//   TL_REGISTER_KERNELS(my_kernel, other_kernel<int, 2>);
void register_kernel(const void* fn);
template <class... Kernels>
bool register_kernels(Kernels... kernels) {
  (register_kernel(reinterpret_cast<const void*>(kernels)), ...);
  return true;
}
const std::vector<const void*>& registered_kernels();

}  // namespace tilelink::cuda

#define TL_KERNEL_CAT2(a, b) a##b
#define TL_KERNEL_CAT(a, b) TL_KERNEL_CAT2(a, b)
#define TL_REGISTER_KERNELS(...)                                       \
  static const bool TL_KERNEL_CAT(tl_registered_kernels_, __LINE__) = \
      ::tilelink::cuda::register_kernels(__VA_ARGS__)
