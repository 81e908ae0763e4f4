// The bootstrap's collective helpers and its MPI form (runtime/bootstrap.hpp).
#include "tilelink/runtime/bootstrap.hpp"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#if defined(TILELINK_HAS_MPI)
#include <mpi.h>
#endif

#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink::cuda {

void Bootstrap::barrier(std::chrono::milliseconds timeout, const std::string& what) {
  const char mine = 1;
  std::vector<char> all(size());
  allgather(&mine, all.data(), 1, timeout, what);
}

void Bootstrap::broadcast(void* data, size_t bytes, std::chrono::milliseconds timeout, const std::string& what) {
  std::vector<char> all(bytes * size());
  allgather(data, all.data(), bytes, timeout, what);
  if (rank() != 0) std::memcpy(data, all.data(), bytes);
}

#if defined(TILELINK_HAS_MPI)
namespace {

class MpiBootstrap final : public Bootstrap {
 public:
  MpiBootstrap() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      TL_REQUIRE(MPI_Init(nullptr, nullptr) == MPI_SUCCESS, "bootstrap: MPI_Init failed");
      std::atexit([] {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
      });
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    int count = 0;
    TL_CUDA_CHECK(cudaGetDeviceCount(&count));
    TL_REQUIRE(count >= 1, "bootstrap: no GPU visible to MPI rank " << rank_);
    device_ = local % count;  // NOTE: ranks share a GPU when there are fewer GPUs than ranks
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }

  void allgather(const void* mine, void* all, size_t bytes, std::chrono::milliseconds timeout,
                 const std::string& what) override {
    MPI_Request req;
    TL_REQUIRE(MPI_Iallgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes), MPI_BYTE,
                              MPI_COMM_WORLD, &req) == MPI_SUCCESS,
               "rank " << rank_ << ": MPI_Iallgather for " << what << " failed");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int done = 0;;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline) {
        std::ostringstream os;
        os << "rank " << rank_ << ": " << what << " did not complete within "
           << std::chrono::duration<double>(timeout).count()
           << " s (a peer process is gone, stuck or on another path)";
        throw TimeoutError(os.str());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  int rank_ = 0, size_ = 1, device_ = 0;
};

}  // namespace

std::shared_ptr<Bootstrap> mpi_bootstrap() {
  static std::shared_ptr<Bootstrap> one = std::make_shared<MpiBootstrap>();  // MPI_Init once
  return one;
}
#else
std::shared_ptr<Bootstrap> mpi_bootstrap() {
  TL_REQUIRE(false, "bootstrap: this build of tilelink has no MPI; launch with torchrun and tilelink.init, "
                    "or pass a Bootstrap of your own");
  return nullptr;
}
#endif

}  // namespace tilelink::cuda
