// The CUDA world: transports virtual (green contexts on one GPU), peer (several GPUs, one
// process) and ipc (one process per rank, CUDA IPC handles through the bootstrap).
#include "tilelink/runtime/world.hpp"

#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <cstring>
#include <chrono>
#include <sstream>
#include <string>
#include <vector>
#include <thread>

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/error.hpp"


namespace tilelink::cuda {

namespace {


}  // namespace

namespace {

// NOTE: before any CUDA call of the program (static initialization of the library), and again in
// the World constructor in case a program made this object file load late: lazy module loading
// deadlocks a kernel that spins on a flag set by a not-yet-loaded kernel (docs/design.md, the GPU machines).
// Likewise the number of hardware work queues a context spreads its streams over (8 by default):
// with more streams than queues, streams share one, and a copy-engine stream wait of one rank then
// holds back another rank's copy queued behind it. Measured on the H200 (2026-12-02): the
// copy-engine AllGather of `tilelink bench allgather` hung at worlds 5, 6 and 8 of virtual ranks with
// the default, and ran at world 8 with 32 (the most CUDA takes). A value the user set is kept.
void set_runtime_environment() {
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
}
const bool kEagerLoading = [] {
  set_runtime_environment();
  return true;
}();

std::vector<const void*>& kernel_registry() {
  static std::vector<const void*> r;
  return r;
}

}  // namespace

void register_kernel(const void* fn) { kernel_registry().push_back(fn); }
const std::vector<const void*>& registered_kernels() { return kernel_registry(); }

const char* transport_name(Transport t) {
  switch (t) {
    case Transport::kVirtual: return "virtual";
    case Transport::kPeer: return "peer";
    case Transport::kIpc: return "ipc";
  }
  return "?";
}

bool parse_transport(const std::string& s, Transport* out) {
  if (s == "virtual") *out = Transport::kVirtual;
  else if (s == "peer") *out = Transport::kPeer;
  else if (s == "ipc") *out = Transport::kIpc;
  else return false;
  return true;
}

struct World::Rank {
  int rank = 0;
  int device = 0;
  int sm_count = 0;
  CUgreenCtx green = nullptr;  // virtual only
  CUcontext ctx = nullptr;     // virtual: the green context as a CUcontext
  cudaStream_t stream = nullptr;
  // Pinned host words and a side stream (made on first use) for the bounded copies of the error
  // paths (stop_peers, sync's stop and deadline checks): never a pageable or synchronous copy, which
  // would queue behind the caller's stream (made to wait for this rank's) or block on a wedged device.
  struct HostIo {
    unsigned int seen, word;
    uint64_t value;
  }* io = nullptr;
  cudaStream_t side = nullptr;
};

namespace {

// Copies `bytes` from device `src` into pinned `dst` on `side`, waiting at most `bound`; whether
// it completed.
bool bounded_read(cudaStream_t side, void* dst, const void* src, size_t bytes,
                  std::chrono::milliseconds bound = std::chrono::seconds(1)) {
  if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, side) != cudaSuccess) return false;
  const auto until = std::chrono::steady_clock::now() + bound;
  while (cudaStreamQuery(side) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  return cudaStreamQuery(side) == cudaSuccess;
}

}  // namespace

// Green contexts (with one stream each) for a split of a device, made once per process and kept.
// NOTE: never destroyed: the CUDA runtime keeps per-context state keyed by the context handle, and
// a new green context that reuses a destroyed one's handle was refused there
// (cudaErrorContextIsDestroyed at launch). Worlds of the same split share them, one world at a time.
struct GreenRank {
  CUgreenCtx green = nullptr;
  CUcontext ctx = nullptr;
  cudaStream_t stream = nullptr;
  int sm_count = 0;
};

const std::vector<GreenRank>& green_contexts(CUdevice dev, int device, int n, int per, int total) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int>, std::vector<GreenRank>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(device, n, per);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  CUdevResource all;
  TL_CU_CHECK(::tilelink::cuda::driver::cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  std::vector<CUdevResource> groups(n);
  unsigned int made = static_cast<unsigned int>(n);
  CUdevResource rest;
  TL_CU_CHECK(::tilelink::cuda::driver::cuDevSmResourceSplitByCount(groups.data(), &made, &all, &rest, 0,
                                          static_cast<unsigned int>(per)));
  TL_REQUIRE(static_cast<int>(made) >= n, "world: the driver split the GPU's " << total
                                              << " SMs into only " << made << " groups of "
                                              << per << ", need " << n);
  std::vector<GreenRank> out(n);
  for (int r = 0; r < n; ++r) {
    out[r].sm_count = static_cast<int>(groups[r].sm.smCount);
    CUdevResourceDesc desc;
    TL_CU_CHECK(::tilelink::cuda::driver::cuDevResourceGenerateDesc(&desc, &groups[r], 1));
    TL_CU_CHECK(::tilelink::cuda::driver::cuGreenCtxCreate(&out[r].green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    TL_CU_CHECK(::tilelink::cuda::driver::cuCtxFromGreenCtx(&out[r].ctx, out[r].green));
    CUstream s;
    TL_CU_CHECK(::tilelink::cuda::driver::cuGreenCtxStreamCreate(&s, out[r].green, CU_STREAM_NON_BLOCKING, 0));
    out[r].stream = reinterpret_cast<cudaStream_t>(s);
  }
  return cache.emplace(key, std::move(out)).first->second;
}

// ---- construction -----------------------------------------------------------------------------

World::World(const WorldOptions& options) : options_(options) {
  (void)kEagerLoading;
  set_runtime_environment();
  TL_REQUIRE(options.timeout.count() > 0, "world: wait timeout must be positive");
  switch (options.transport) {
    case Transport::kVirtual: init_virtual(); break;
    case Transport::kPeer: init_peer(); break;
    case Transport::kIpc: init_ipc(); break;
  }
  TL_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&fault_), sizeof(DeviceFault),
                              cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(fault_, 0, sizeof(DeviceFault));
  for (int r : local_ranks_)
    TL_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ranks_[r]->io), sizeof(Rank::HostIo), cudaHostAllocPortable));
  load_registered_kernels();
  // The stop words (fault propagation), and each local rank's table of every rank's word.
  // Word 0 of a rank: its stop word; word 1 of the process's first local rank: the fault record's
  // claim word (DeviceContext::claim).
  stops_ = allocate(2 * sizeof(unsigned int));
  stop_tables_.assign(size_, nullptr);
  std::vector<unsigned int*> words(size_);
  for (int r = 0; r < size_; ++r) words[r] = static_cast<unsigned int*>(stops_.base(r));
  for (int r : local_ranks_) {
    TL_CUDA_CHECK(cudaSetDevice(ranks_[r]->device));
    TL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&stop_tables_[r]), size_ * sizeof(unsigned int*)));
    TL_CUDA_CHECK(cudaMemcpy(stop_tables_[r], words.data(), size_ * sizeof(unsigned int*), cudaMemcpyHostToDevice));
  }
}

void World::init_virtual() {
  const int n = options_.world_size;
  TL_REQUIRE(n >= 1 && n <= kMaxWorldSize,
             "world: virtual world size must be in [1, " << kMaxWorldSize << "], got " << n);
  int count = 0;
  TL_CUDA_CHECK(cudaGetDeviceCount(&count));
  TL_REQUIRE(options_.device >= 0 && options_.device < count,
             "world: device " << options_.device << " not present (" << count << " GPUs)");
  TL_CUDA_CHECK(cudaSetDevice(options_.device));
  TL_CUDA_CHECK(cudaFree(nullptr));  // the primary context, before the green contexts
  TL_CU_CHECK(::tilelink::cuda::driver::cuInit(0));
  CUdevice dev;
  TL_CU_CHECK(::tilelink::cuda::driver::cuDeviceGet(&dev, options_.device));
  CUdevResource all;
  TL_CU_CHECK(::tilelink::cuda::driver::cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  const int total = static_cast<int>(all.sm.smCount);
  const int align = static_cast<int>(all.sm.smCoscheduledAlignment ? all.sm.smCoscheduledAlignment : 1);
  const int min_part = static_cast<int>(all.sm.minSmPartitionSize ? all.sm.minSmPartitionSize : 1);
  int per = options_.sms_per_rank > 0 ? options_.sms_per_rank : total / n;
  per -= per % align;
  TL_REQUIRE(per >= min_part && per * n <= total,
             "world: cannot give " << n << " virtual ranks " << (per > 0 ? per : 0)
                                   << " SMs each on a GPU of " << total
                                   << " SMs (partitions of at least " << min_part
                                   << " SMs, in steps of " << align << ")");
  size_ = n;
  ranks_.resize(n);
  const std::vector<GreenRank>& greens = green_contexts(dev, options_.device, n, per, total);
  for (int r = 0; r < n; ++r) {
    auto rk = std::make_unique<Rank>();
    rk->rank = r;
    rk->device = options_.device;
    rk->sm_count = greens[r].sm_count;
    rk->green = greens[r].green;
    rk->ctx = greens[r].ctx;
    rk->stream = greens[r].stream;
    ranks_[r] = std::move(rk);
    local_ranks_.push_back(r);
  }
  TL_CUDA_CHECK(cudaSetDevice(options_.device));
}

void World::init_peer() {
  const int n = options_.world_size;
  int count = 0;
  TL_CUDA_CHECK(cudaGetDeviceCount(&count));
  TL_REQUIRE(n >= 1 && n <= count, "world: the peer transport needs one GPU per rank: world size "
                                       << n << ", " << count << " GPUs here");
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      int ok = 0;
      TL_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
      TL_REQUIRE(ok, "world: GPU " << a << " cannot access GPU " << b << " as a peer");
    }
  size_ = n;
  ranks_.resize(n);
  for (int r = 0; r < n; ++r) {
    TL_CUDA_CHECK(cudaSetDevice(r));
    for (int b = 0; b < n; ++b) {
      if (b == r) continue;
      cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
      else TL_CUDA_CHECK(e);
    }
    auto rk = std::make_unique<Rank>();
    rk->rank = r;
    rk->device = r;
    TL_CUDA_CHECK(cudaDeviceGetAttribute(&rk->sm_count, cudaDevAttrMultiProcessorCount, r));
    TL_CUDA_CHECK(cudaStreamCreateWithFlags(&rk->stream, cudaStreamNonBlocking));
    ranks_[r] = std::move(rk);
    local_ranks_.push_back(r);
  }
}

void World::init_ipc() {
  if (!options_.bootstrap) options_.bootstrap = mpi_bootstrap();
  Bootstrap& boot = *options_.bootstrap;
  const int n = boot.size(), rank = boot.rank();
  TL_REQUIRE(n >= 1 && n <= kMaxWorldSize, "world: " << n << " processes, at most " << kMaxWorldSize);
  TL_REQUIRE(rank >= 0 && rank < n, "world: the bootstrap's rank " << rank << " is not in [0, " << n << ")");
  int count = 0;
  TL_CUDA_CHECK(cudaGetDeviceCount(&count));
  TL_REQUIRE(count >= 1, "world: no GPU for the ipc transport");
  TL_REQUIRE(boot.device() >= 0 && boot.device() < count,
             "world: rank " << rank << " was given GPU " << boot.device() << " of " << count);
  size_ = n;
  ranks_.resize(n);
  auto rk = std::make_unique<Rank>();
  rk->rank = rank;
  rk->device = boot.device();
  TL_CUDA_CHECK(cudaSetDevice(rk->device));
  TL_CUDA_CHECK(cudaDeviceGetAttribute(&rk->sm_count, cudaDevAttrMultiProcessorCount, rk->device));
  TL_CUDA_CHECK(cudaStreamCreateWithFlags(&rk->stream, cudaStreamNonBlocking));
  ranks_[rank] = std::move(rk);
  local_ranks_.push_back(rank);
}

Bootstrap& World::bootstrap() const {
  TL_REQUIRE(options_.bootstrap, "world: the " << transport_name(options_.transport)
                                                << " transport is one process; it has no bootstrap");
  return *options_.bootstrap;
}

void World::load_registered_kernels() const {
  for (const void* fn : registered_kernels()) load_kernel(fn);
}

void World::load_kernel(const void* fn) const {
  for (int r : local_ranks_) {
    bind(r);
    // Querying the attributes loads the kernel's module in the current (green) context.
    cudaFuncAttributes attr;
    TL_CUDA_CHECK(cudaFuncGetAttributes(&attr, fn));
    cudaFunction_t f;
    TL_CUDA_CHECK(cudaGetFuncBySymbol(&f, fn));
    CUfunctionLoadingState state;
    TL_CU_CHECK(::tilelink::cuda::driver::cuFuncIsLoaded(&state, reinterpret_cast<CUfunction>(f)));
    if (state != CU_FUNCTION_LOADING_STATE_LOADED) TL_CU_CHECK(::tilelink::cuda::driver::cuFuncLoad(reinterpret_cast<CUfunction>(f)));
  }
}

World::~World() {
  // NOTE: no checks here: after a device fault every call fails, and destructors must not throw.
  for (int r : local_ranks_)
    if (stop_tables_.size() > static_cast<size_t>(r) && stop_tables_[r]) {
      cudaSetDevice(ranks_[r]->device);
      cudaFree(stop_tables_[r]);
    }
  stops_.release();
  for (auto& rk : ranks_) {
    if (!rk) continue;
    if (rk->io) cudaFreeHost(rk->io);
    if (rk->side) {
      cudaSetDevice(rk->device);
      cudaStreamDestroy(rk->side);
    }
    if (rk->green) {
      continue;  // kept for the process (green_contexts())
    } else if (rk->stream) {
      cudaSetDevice(rk->device);
      cudaStreamDestroy(rk->stream);
    }
  }
  if (fault_) cudaFreeHost(fault_);
}

// ---- accessors --------------------------------------------------------------------------------

bool World::is_local(int rank) const {
  return rank >= 0 && rank < size_ && ranks_[rank] != nullptr;
}

int World::device(int rank) const {
  TL_REQUIRE(is_local(rank), "world: rank " << rank << " is not driven by this process");
  return ranks_[rank]->device;
}
int World::sm_count(int rank) const {
  TL_REQUIRE(is_local(rank), "world: rank " << rank << " is not driven by this process");
  return ranks_[rank]->sm_count;
}
cudaStream_t World::stream(int rank) const {
  TL_REQUIRE(is_local(rank), "world: rank " << rank << " is not driven by this process");
  return ranks_[rank]->stream;
}

cudaStream_t World::create_stream(int rank) const {
  TL_REQUIRE(is_local(rank), "world: rank " << rank << " is not driven by this process");
  const Rank& rk = *ranks_[rank];
  if (rk.green) {
    CUstream s;
    TL_CU_CHECK(::tilelink::cuda::driver::cuGreenCtxStreamCreate(&s, rk.green, CU_STREAM_NON_BLOCKING, 0));
    return reinterpret_cast<cudaStream_t>(s);
  }
  bind(rank);
  cudaStream_t s = nullptr;
  TL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void World::bind(int rank) const {
  TL_REQUIRE(is_local(rank), "world: rank " << rank << " is not driven by this process");
  const Rank& rk = *ranks_[rank];
  if (rk.ctx) TL_CU_CHECK(::tilelink::cuda::driver::cuCtxSetCurrent(rk.ctx));
  else TL_CUDA_CHECK(cudaSetDevice(rk.device));
}

DeviceContext World::device_context(int rank) const {
  TL_REQUIRE(is_local(rank), "world: rank " << rank << " is not driven by this process");
  DeviceContext c;
  c.rank = rank;
  c.world_size = size_;
  c.timeout_ns = static_cast<uint64_t>(options_.timeout.count()) * 1000000ull;
  c.fault = fault_;  // NOTE: portable mapped host memory: the same pointer on the device (UVA)
  if (!stop_tables_.empty()) {  // (none while the constructor allocates them)
    c.stop = static_cast<unsigned int*>(stops_.base(rank));
    c.stops = stop_tables_[rank];
    c.claim = static_cast<unsigned int*>(stops_.base(local_ranks_.front())) + 1;
  }
  return c;
}

void World::note_stream_wait(const StreamWait& w) { stream_waits_.push_back(w); }

// ---- symmetric heap ---------------------------------------------------------------------------

SymmetricBuffer World::allocate(uint64_t bytes) {
  SymmetricBuffer b;
  b.world_ = this;
  b.bytes_ = bytes;
  b.bases_.assign(size_, nullptr);
  b.owned_.assign(size_, false);
  const size_t n = bytes ? bytes : 256;
  for (int r : local_ranks_) {
    // NOTE: virtual ranks allocate in the primary context, which their green contexts share.
    TL_CUDA_CHECK(cudaSetDevice(ranks_[r]->device));
    TL_CUDA_CHECK(cudaMalloc(&b.bases_[r], n));
    b.owned_[r] = true;
    TL_CUDA_CHECK(cudaMemset(b.bases_[r], 0, n));
    TL_CUDA_CHECK(cudaDeviceSynchronize());
  }
  if (options_.transport == Transport::kIpc) {
    // Every rank's handle and size, then every rank's outcome of opening its peers' handles: a
    // rank whose open fails does not throw alone (its buffer's unwinding barrier would pair with
    // the peers' and let them carry on); every rank throws, naming it.
    const int me = local_ranks_.at(0);
    struct Share {
      cudaIpcMemHandle_t handle;
      uint64_t bytes;
    } mine{};
    TL_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, b.bases_[me]));
    mine.bytes = bytes;
    std::vector<Share> all(size_);
    bootstrap().allgather(&mine, all.data(), sizeof(mine), options_.timeout,
                          "world: the exchange of IPC handles for a symmetric allocation");
    for (int r = 0; r < size_; ++r)
      TL_REQUIRE(all[r].bytes == bytes, "world: symmetric allocation of " << bytes << " bytes on rank " << me
                                           << ", " << all[r].bytes << " on rank " << r
                                           << " (every rank must allocate the same sizes in the same order)");
    int ok = 1;
    std::string why;
    for (int r = 0; r < size_ && ok; ++r) {
      if (r == me) continue;
      const cudaError_t e = cudaIpcOpenMemHandle(&b.bases_[r], all[r].handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        b.bases_[r] = nullptr;
        ok = 0;
        why = std::string("cudaIpcOpenMemHandle of rank ") + std::to_string(r) + "'s buffer: " + cudaGetErrorString(e);
      }
    }
    std::vector<int> oks(size_);
    bootstrap().allgather(&ok, oks.data(), sizeof(int), options_.timeout,
                          "world: the exchange of IPC outcomes for a symmetric allocation");
    for (int r = 0; r < size_; ++r)
      TL_REQUIRE(oks[r], "world: rank " << r << " could not map its peers' symmetric buffers"
                                        << (r == me ? " (" + why + ")" : std::string()));
  }
  return b;
}

SymmetricBuffer::SymmetricBuffer(SymmetricBuffer&& o) noexcept { *this = std::move(o); }

SymmetricBuffer& SymmetricBuffer::operator=(SymmetricBuffer&& o) noexcept {
  if (this != &o) {
    release();
    world_ = o.world_;
    bytes_ = o.bytes_;
    bases_ = std::move(o.bases_);
    owned_ = std::move(o.owned_);
    o.world_ = nullptr;
    o.bases_.clear();
    o.owned_.clear();
  }
  return *this;
}

SymmetricBuffer::~SymmetricBuffer() { release(); }

void SymmetricBuffer::release() noexcept {
  if (!world_) return;
  for (size_t r = 0; r < bases_.size(); ++r)
    if (bases_[r] && !owned_[r]) cudaIpcCloseMemHandle(bases_[r]);
  // Every peer has closed its mapping before the memory goes; bounded (a peer that is gone or
  // stuck must not hang this one's teardown).
  if (world_->transport() == Transport::kIpc) {
    try {
      world_->bootstrap().barrier(world_->options().timeout, "world: the teardown barrier of a symmetric buffer");
    } catch (const std::exception&) {
    }
  }
  for (size_t r = 0; r < bases_.size(); ++r)
    if (bases_[r] && owned_[r]) {
      cudaSetDevice(world_->ranks_[r]->device);
      cudaFree(bases_[r]);
    }
  bases_.clear();
  owned_.clear();
  world_ = nullptr;
}

void* SymmetricBuffer::base(int rank) const {
  TL_REQUIRE(rank >= 0 && rank < static_cast<int>(bases_.size()),
             "symmetric buffer: rank " << rank << " outside a world of " << bases_.size());
  return bases_[rank];
}

SymmetricView SymmetricBuffer::view(int rank) const {
  TL_REQUIRE(world_ && world_->is_local(rank),
             "symmetric buffer: rank " << rank << " is not driven by this process");
  SymmetricView v;
  v.rank = rank;
  v.world_size = static_cast<int>(bases_.size());
  for (int r = 0; r < v.world_size; ++r) v.bases[r] = bases_[r];
  return v;
}

// ---- completion -------------------------------------------------------------------------------

namespace {
// How long sync waits, past its deadline, for a trap that the fault record says happened (with
// processes time-slicing one GPU it took seconds to reach the host).
constexpr std::chrono::seconds kTrapGrace{5};

// What a claimed fault record says: which wait of which rank gave up, on what.
std::string describe_fault(const DeviceFault& f) {
  std::ostringstream os;
  if (f.kind == 1) {
    os << "rank " << f.rank << " timed out on the device after " << f.waited_ns * 1e-9
       << " s waiting for a bulk copy into shared-memory stage " << f.slot;
  } else if (f.kind == 2) {
    os << "rank " << f.stopped_by << " stopped the world (a fault on its device or an error in its host code; "
       << "its own process reports it); rank " << f.rank << " stopped waiting on "
       << signal_field_name(static_cast<SignalField>(f.field)) << "[" << f.slot << "] of rank " << f.owner
       << " after " << f.waited_ns * 1e-9 << " s: expected >= " << f.expected << ", observed " << f.observed;
  } else {
    os << "rank " << f.rank << " timed out waiting on " << signal_field_name(static_cast<SignalField>(f.field)) << "["
       << f.slot << "] of rank " << f.owner << ": expected >= " << f.expected << ", observed " << f.observed << " (";
    if (f.tile >= 0) os << "tile " << f.tile << ", ";
    os << "on the device, after " << f.waited_ns * 1e-9 << " s)";
  }
  return os.str();
}

}  // namespace

void World::fail(const char* op, int rank, cudaError_t e) {
  std::ostringstream os;
  os << "op " << op << ": ";
  if (fault_ && fault_->claimed) {
    os << describe_fault(*fault_);
    if (e == cudaErrorNotReady)
      os << " (the kernel trapped; its error had not reached this process " << kTrapGrace.count()
         << " s after it was due, so the"
            " stream may still be busy: this world cannot be destroyed cleanly, the process should exit)";
    else
      os << " (the kernel trapped: " << cudaGetErrorName(e) << "; the device context is lost)";
    throw TimeoutError(os.str());
  }
  os << "rank " << rank << " failed on the device: " << cudaGetErrorName(e) << " ("
     << cudaGetErrorString(e) << ")";
  throw Error(os.str());
}

namespace {

// The watchdog of stream waits (cuStreamWaitValue64 has no device-side bound): once sync's
// deadline has passed, each wait still short of its target gets its target written from a fresh
// stream of the waiting rank's context, so the blocked streams drain (the call's outputs are
// invalid) instead of holding the world's streams, allocations and cached green-context streams for
// good; then every local rank's stream gets a bounded while to drain. Returns what to add to the
// error message.
// `drain`: wait for the streams to drain (a timeout: the world may be destroyed and a new one made);
// else return at once (a peer stopped the world: the kernels behind the released waits stop at their
// first device wait and trap, which takes seconds to surface).
std::string release_stream_waits(const World& world, const std::vector<const World::StreamWait*>& stuck,
                                 const std::vector<int>& ranks, bool drain = true) {
  using clock = std::chrono::steady_clock;
  int released = 0;
  for (const World::StreamWait* w : stuck) {
    world.bind(w->rank);
    cudaStream_t s = nullptr;
    try {
      s = world.create_stream(w->rank);
    } catch (const std::exception&) {
      continue;
    }
    // flags 0: a plain write; nothing earlier on this new stream to order after.
    if (::tilelink::cuda::driver::cuStreamWriteValue64(reinterpret_cast<CUstream>(s),
                                                       reinterpret_cast<CUdeviceptr>(w->addr), w->target,
                                                       0) == CUDA_SUCCESS) {
      const auto until = clock::now() + std::chrono::seconds(2);
      while (cudaStreamQuery(s) == cudaErrorNotReady && clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (cudaStreamQuery(s) == cudaSuccess) ++released;
    }
    cudaStreamDestroy(s);
  }
  std::ostringstream os;
  os << "; " << released << " of " << stuck.size() << " stuck stream waits released by the watchdog";
  if (!drain) {
    os << " (the kernels behind them stop at their first wait: the device context is being lost)";
    return os.str();
  }
  bool drained = true;
  const auto until = clock::now() + std::chrono::seconds(5);
  for (int r : ranks) {
    world.bind(r);
    while (cudaStreamQuery(world.stream(r)) == cudaErrorNotReady && clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    drained = drained && cudaStreamQuery(world.stream(r)) == cudaSuccess;
  }
  os << (drained ? ", every stream drained (the call's outputs are invalid; destroy this world, a new one may be made)"
                 : ", but a stream did not drain (destroying this world may block)");
  return os.str();
}

}  // namespace

void World::sync(const char* op) {
  using clock = std::chrono::steady_clock;
  // The device waits trap at the timeout and are reported from their fault record; a stream wait
  // (no device-side bound) is found 1 s later.
  const auto deadline = clock::now() + options_.timeout + std::chrono::seconds(1);
  // Bounded reads on a rank's side stream (never the caller's: under Python it waits for the
  // rank's stream, so a copy there would queue behind the very wait being diagnosed).
  auto side = [&](int r) {
    bind(r);
    Rank& rk = *ranks_[r];
    if (!rk.side) rk.side = create_stream(r);
    return rk.side;
  };
  // The stream waits still short of their target: each with its observed value.
  auto stuck_waits = [&](std::vector<std::pair<const StreamWait*, uint64_t>>* out) {
    for (const StreamWait& w : stream_waits_) {
      Rank::HostIo* io = ranks_[w.rank]->io;
      io->value = 0;
      if (!bounded_read(side(w.rank), &io->value, w.addr, sizeof(uint64_t))) continue;
      if (io->value < w.target) out->emplace_back(&w, io->value);
    }
  };
  auto describe_stuck = [&](std::ostringstream& os, const std::vector<std::pair<const StreamWait*, uint64_t>>& stuck,
                            bool drain) {
    if (stuck.empty()) return;
    const StreamWait& w = *stuck.front().first;
    os << "; rank " << w.rank << " is stuck in a stream wait on " << w.field << "[" << w.slot << "] of rank " << w.owner
       << ": expected >= " << w.target << ", observed " << stuck.front().second;
    if (w.tile >= 0) os << " (tile " << w.tile << ")";
    std::vector<const StreamWait*> waits;
    for (const auto& s : stuck) waits.push_back(s.first);
    os << release_stream_waits(*this, waits, local_ranks_, drain);
  };
  // Under ipc a peer that stopped the world (its device fault, or World::stop_peers after a host
  // error) sets this rank's stop word: the device waits see it and trap, but a stream wait cannot,
  // so the host looks too, every millisecond.
  const bool watch_stop = options_.transport == Transport::kIpc;
  auto next_look = clock::now() + std::chrono::milliseconds(1);
  clock::time_point stop_seen{};
  for (int r : local_ranks_) {
    for (;;) {
      cudaError_t e = cudaStreamQuery(ranks_[r]->stream);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) fail(op, r, e);
      const auto now = clock::now();
      if (watch_stop && now > next_look) {
        next_look = now + std::chrono::milliseconds(1);
        Rank::HostIo* io = ranks_[r]->io;
        io->seen = 0;
        if (bounded_read(side(r), &io->seen, stops_.base(r), sizeof(unsigned int), std::chrono::milliseconds(100)) &&
            io->seen != 0) {
          if (stop_seen == clock::time_point{}) stop_seen = now;
          if (fault_ && fault_->claimed) {
            // A device wait of this rank saw the stop and is trapping (which can take seconds to
            // surface): its record says what it waited on; the context is lost either way.
            throw TimeoutError(std::string("op ") + op + ": " + describe_fault(*fault_) +
                               " (the kernel is trapping: this process's device context is lost, the process "
                               "should exit)");
          }
          if (now > stop_seen + std::chrono::milliseconds(5)) {  // no device wait took it: a stream wait
            std::ostringstream os;
            os << "op " << op << ": rank " << io->seen - 1
               << " stopped the world (a fault on its device or an error in its host code; its own process "
                  "reports it); rank "
               << r << " stopped waiting";
            std::vector<std::pair<const StreamWait*, uint64_t>> stuck;
            stuck_waits(&stuck);
            describe_stuck(os, stuck, /*drain=*/false);
            stream_waits_.clear();
            throw TimeoutError(os.str());
          }
        }
      }
      if (now > deadline) {
        // A device wait that timed out has claimed the fault record and trapped; the trap can take
        // seconds to surface when processes time-slice one GPU. Give it a bounded while, so the
        // error names the wait that trapped rather than the rank that outlived the deadline.
        if (fault_ && fault_->claimed) {
          if (now < deadline + kTrapGrace) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            continue;
          }
          fail(op, r, cudaErrorNotReady);  // the record names the wait; the trap is still on its way
        }
        // A stream wait (copy engine path) cannot trap: find the one that never completed.
        std::ostringstream os;
        os << "op " << op << ": rank " << r << " did not finish within "
           << std::chrono::duration<double>(options_.timeout).count() << " s";
        std::vector<std::pair<const StreamWait*, uint64_t>> stuck;
        stuck_waits(&stuck);
        describe_stuck(os, stuck, /*drain=*/true);
        stream_waits_.clear();
        throw TimeoutError(os.str());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  stream_waits_.clear();
}

void World::stop_peers() noexcept {
  if (local_ranks_.empty() || stop_tables_.empty() || !ranks_[local_ranks_.front()]->io) return;
  const int me = local_ranks_.front();
  Rank::HostIo* io = ranks_[me]->io;
  io->word = 1u + static_cast<unsigned int>(me);
  try {
    bind(me);
    Rank& rk = *ranks_[me];
    if (!rk.side) rk.side = create_stream(me);  // not the rank's stream: it may hold a spinning kernel
    cudaStream_t s = rk.side;
    for (int r = 0; r < size_; ++r) {
      auto* addr = static_cast<unsigned int*>(stops_.base(r));
      io->seen = 1;
      if (!bounded_read(s, &io->seen, addr, sizeof(unsigned int))) break;
      if (io->seen == 0) cudaMemcpyAsync(addr, &io->word, sizeof(unsigned int), cudaMemcpyHostToDevice, s);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (cudaStreamQuery(s) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  } catch (const std::exception&) {
  }
  cudaGetLastError();  // nothing of this best effort is left for the caller's next check
}

void World::barrier(const char* op) {
  sync(op);
  if (options_.transport == Transport::kIpc)
    bootstrap().barrier(options_.timeout, std::string("the host barrier after op ") + op);
}

}  // namespace tilelink::cuda
