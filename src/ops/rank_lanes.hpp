// Internal to the CUDA fused ops: the per-rank lanes an op runs on besides the rank's own stream.
//
//   the rank's stream   (world.stream(r)) the comm program, and the whole call's end
//   gemm stream         a second stream of the rank (in its green context when virtual): the GEMM
//   fork / join         the gemm stream waits for what the rank's stream had so far (fork); the
//                       rank's stream waits for the GEMM (join), so a call ends on the rank's stream
//   cuBLAS handle       on the rank's stream, for the unfused baseline
//   NCCL communicator   for the unfused baseline's collective, where baseline_comm(world) is kNccl
//                       (peer: ncclCommInitAll over the world's GPUs; ipc: ncclCommInitRank with
//                       rank 0's unique id broadcast through the bootstrap); collectives on the rank's stream
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <vector>


#include "tilelink/backend/cuda/check.hpp"
#include "tilelink/core/dtype.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/core/partition.hpp"
#include "tilelink/ops/baseline_cuda.hpp"
#include "tilelink/runtime/world.hpp"
#include "tilelink/tune/path_model.hpp"

namespace tilelink::cuda::detail {

inline void check_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    ::tilelink::detail::throw_error(file, line, std::string(what) + ": cuBLAS status " +
                                                    std::to_string(static_cast<int>(s)));
}
#define TL_CUBLAS_CHECK(call) ::tilelink::cuda::detail::check_cublas((call), #call, __FILE__, __LINE__)

inline void check_nccl(ncclResult_t s, const char* what, const char* file, int line) {
  if (s != ncclSuccess)
    ::tilelink::detail::throw_error(file, line, std::string(what) + ": NCCL " + ncclGetErrorString(s) +
                                                    " (" + ncclGetLastError(nullptr) + ")");
}
#define TL_NCCL_CHECK(call) ::tilelink::cuda::detail::check_nccl((call), #call, __FILE__, __LINE__)

// The baseline's GEMM: C[m, n] (row-major) = A[m, k] B[n, k]^T in bf16 or fp16 with fp32
// accumulation, i.e. C^T = B A^T in cuBLAS's column-major terms. Dense rows (ld = k, k, n).
inline void cublas_gemm_tn(cublasHandle_t h, const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k,
                           DType dtype = DType::kBF16) {
  TL_REQUIRE(dtype == DType::kBF16 || dtype == DType::kF16, "the cuBLAS baseline takes bf16 or fp16");
  const cudaDataType_t t = dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = 1.f, beta = 0.f;
  TL_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                               static_cast<int>(k), &alpha, b, t, static_cast<int>(k), a, t, static_cast<int>(k), &beta,
                               c, t, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The cost model's view of a world whose GEMM runs on gemm_sms of each rank's SMs.
inline MachineModel machine_model(const World& world, int rank, int gemm_sms) {
  MachineModel m;
  m.ranks_share_gpu = world.transport() == Transport::kVirtual;
  m.sms = world.sm_count(rank);
  m.gemm_sms = gemm_sms;
  return m;
}

class RankLanes {
 public:
  explicit RankLanes(World& world) : world_(world) {
    const int W = world.size();
    gemm_.assign(W, nullptr);
    fork_.assign(W, nullptr);
    join_.assign(W, nullptr);
    cublas_.assign(W, nullptr);
    for (int r : world.local_ranks()) {
      world.bind(r);
      gemm_[r] = world.create_stream(r);
      TL_CUDA_CHECK(cudaEventCreateWithFlags(&fork_[r], cudaEventDisableTiming));
      TL_CUDA_CHECK(cudaEventCreateWithFlags(&join_[r], cudaEventDisableTiming));
      TL_CUBLAS_CHECK(cublasCreate(&cublas_[r]));
      TL_CUBLAS_CHECK(cublasSetStream(cublas_[r], world.stream(r)));
    }
    baseline_ = baseline_comm(world);
    if (baseline_ == BaselineComm::kNccl) init_nccl();
  }
  ~RankLanes() {
    // NOTE: no checks: destructors must not throw, and after a device fault every call fails.
    // ncclCommDestroy is local (no peer needs to take part), also for comms of one process.
    for (ncclComm_t comm : nccl_)
      if (comm) ncclCommDestroy(comm);
    for (int r : world_.local_ranks()) {
      world_.bind(r);
      if (cublas_[r]) cublasDestroy(cublas_[r]);
      if (fork_[r]) cudaEventDestroy(fork_[r]);
      if (join_[r]) cudaEventDestroy(join_[r]);
      if (gemm_[r]) cudaStreamDestroy(gemm_[r]);
    }
  }
  RankLanes(const RankLanes&) = delete;
  RankLanes& operator=(const RankLanes&) = delete;

  cudaStream_t gemm_stream(int r) const { return gemm_[r]; }
  cublasHandle_t cublas(int r) const { return cublas_[r]; }
  void fork(int r) {
    TL_CUDA_CHECK(cudaEventRecord(fork_[r], world_.stream(r)));
    TL_CUDA_CHECK(cudaStreamWaitEvent(gemm_[r], fork_[r]));
  }
  void join_record(int r) { TL_CUDA_CHECK(cudaEventRecord(join_[r], gemm_[r])); }
  void join_wait(int r) { TL_CUDA_CHECK(cudaStreamWaitEvent(world_.stream(r), join_[r])); }
  // fork, `enqueue` (work on the gemm stream), join: the work ends on the rank's stream.
  template <class Fn>
  void on_gemm_stream(int r, Fn&& enqueue) {
    fork(r);
    enqueue();
    join_record(r);
    join_wait(r);
  }

  // ---- the NCCL baseline ----------------------------------------------------------------------
  bool nccl() const { return baseline_ == BaselineComm::kNccl; }
  // Every rank on a GPU of its own (peer; ipc with distinct GPUs): the baseline is NCCL's, and a
  // copy from a peer's GPU runs on the copy engines, never on the SMs.
  bool gpu_per_rank() const { return baseline_ == BaselineComm::kNccl; }

  // Whether an NCCL baseline call must begin with the op's stream barrier. NCCL orders the buffers
  // its collectives touch, but an earlier call of the fused op (or of a part) may still be reading
  // this rank's symmetric buffers from a peer (pull). `mark`: 0 before the op's first call, else the
  // first epoch of the call begun last (eager calls). A barrier unless no call began since the last
  // baseline call (nccl_done) or none ever did; always in graph mode (replays are invisible here).
  // NOTE: every rank's process makes the same calls in the same order, so all decide alike.
  // NOTE: GemmRs::run_reduce_only begins no call: it must not come between two baseline calls.
  bool nccl_entry_barrier(bool graph_mode, uint64_t mark) const {
    if (graph_mode) return true;
    return mark != 0 && mark != nccl_mark_;
  }
  void nccl_done(uint64_t mark) { nccl_mark_ = mark; }

  // AllGather of row segments, bf16: send[r] holds rank r's rows (rows.size(r) x row_elems),
  // gathered[r] receives all rows.total() rows in rank order. Vectors are indexed by rank; entries
  // of local ranks are read. Even segments: ncclAllGather; ragged: one ncclBroadcast per non-empty
  // segment, grouped. On each rank's stream.
  void nccl_all_gather_rows(const RowPartition& rows, int64_t row_elems,
                            const std::vector<const void*>& send, const std::vector<void*>& gathered) {
    require_nccl("AllGather");
    const size_t row_bytes = static_cast<size_t>(row_elems) * sizeof(uint16_t);  // bf16
    if (!even(rows)) {  // each segment from its owner, at its rows
      return nccl_broadcasts(rows.world_size, [&](int root, int r) {
        return Broadcast{root, send[r], static_cast<char*>(gathered[r]) + rows.begin(root) * row_bytes,
                         static_cast<size_t>(rows.size(root)) * row_bytes};
      });
    }
    TL_NCCL_CHECK(ncclGroupStart());
    for (int r : world_.local_ranks())
      TL_NCCL_CHECK(ncclAllGather(send[r], gathered[r], static_cast<size_t>(rows.size(0) * row_elems),
                                  ncclBfloat16, nccl_[r], world_.stream(r)));
    TL_NCCL_CHECK(ncclGroupEnd());
  }

  // Broadcasts of byte pieces, grouped: piece i goes from its root to every rank (the root's own
  // copy included). piece_of(i, r) gives rank r's view of piece i, {root, send (read on the root),
  // recv (rank r's destination), bytes}; every rank must see the same roots and sizes. For pieces
  // that do not land in rank order (a zigzag shard's chunks at their positions). On each rank's stream.
  struct Broadcast {
    int root = 0;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t bytes = 0;
  };
  template <class PieceOf>
  void nccl_broadcasts(int count, PieceOf&& piece_of) {
    require_nccl("Broadcast");
    TL_NCCL_CHECK(ncclGroupStart());
    for (int r : world_.local_ranks()) {
      for (int i = 0; i < count; ++i) {
        const Broadcast b = piece_of(i, r);
        if (b.bytes == 0) continue;
        TL_NCCL_CHECK(ncclBroadcast(r == b.root ? b.send : b.recv, b.recv, b.bytes, ncclInt8, b.root, nccl_[r],
                                    world_.stream(r)));
      }
    }
    TL_NCCL_CHECK(ncclGroupEnd());
  }

  // ReduceScatter (sum; bf16, or fp16 where dtype says) of row segments: partial[r] holds rank r's
  // rows.total() x row_elems partial, out[r] receives the sum of rows [rows.begin(r), rows.end(r))
  // over every rank. Even segments: ncclReduceScatter; ragged: one ncclReduce per non-empty segment
  // (root = its owner), grouped. On each rank's stream.
  void nccl_reduce_scatter_rows(const RowPartition& rows, int64_t row_elems,
                                const std::vector<const void*>& partial, const std::vector<void*>& out,
                                DType dtype = DType::kBF16) {
    require_nccl("ReduceScatter");
    TL_REQUIRE(dtype == DType::kBF16 || dtype == DType::kF16,
               "the NCCL ReduceScatter baseline sums bf16 or fp16, got " << dtype_name(dtype));
    const ncclDataType_t type = dtype == DType::kF16 ? ncclFloat16 : ncclBfloat16;
    const size_t eb = sizeof(uint16_t);  // bf16 or fp16
    TL_NCCL_CHECK(ncclGroupStart());
    for (int r : world_.local_ranks()) {
      if (even(rows)) {
        TL_NCCL_CHECK(ncclReduceScatter(partial[r], out[r], static_cast<size_t>(rows.size(0) * row_elems),
                                        type, ncclSum, nccl_[r], world_.stream(r)));
        continue;
      }
      for (int root = 0; root < rows.world_size; ++root) {
        if (rows.size(root) == 0) continue;
        const char* src = static_cast<const char*>(partial[r]) + rows.begin(root) * row_elems * eb;
        // NOTE: recvbuff is read on the root only.
        TL_NCCL_CHECK(ncclReduce(src, r == root ? out[r] : nullptr,
                                 static_cast<size_t>(rows.size(root) * row_elems), type, ncclSum,
                                 root, nccl_[r], world_.stream(r)));
      }
    }
    TL_NCCL_CHECK(ncclGroupEnd());
  }

  // AllReduce (sum, bf16) of `count` elements: send[r] -> recv[r] on every local rank's stream.
  void nccl_all_reduce(int64_t count, const std::vector<const void*>& send, const std::vector<void*>& recv) {
    require_nccl("AllReduce");
    TL_NCCL_CHECK(ncclGroupStart());
    for (int r : world_.local_ranks())
      TL_NCCL_CHECK(ncclAllReduce(send[r], recv[r], static_cast<size_t>(count), ncclBfloat16, ncclSum, nccl_[r],
                                  world_.stream(r)));
    TL_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  static bool even(const RowPartition& rows) {
    for (int r = 1; r < rows.world_size; ++r)
      if (rows.size(r) != rows.size(0)) return false;
    return true;
  }
  void require_nccl(const char* what) const {
    TL_REQUIRE(nccl(), "the NCCL " << what << " of the baseline needs the peer or ipc transport with "
                                      "one GPU per rank; this world has "
                                   << transport_name(world_.transport()));
  }

  void init_nccl() {
    const int W = world_.size();
    nccl_.assign(W, nullptr);
    if (world_.transport() == Transport::kPeer) {  // one process, every rank's GPU: one call
      std::vector<int> devices(W);
      for (int r = 0; r < W; ++r) devices[r] = world_.device(r);
      TL_NCCL_CHECK(ncclCommInitAll(nccl_.data(), W, devices.data()));
      return;
    }
    // ipc: rank 0's unique id, broadcast with its status so that a failure there fails every rank
    // (instead of leaving them in the broadcast or the init).
    const int me = world_.local_ranks().front();
    struct {
      int ok;
      ncclUniqueId id;
    } root{};
    std::string why;
    if (me == 0) {
      const ncclResult_t s = ncclGetUniqueId(&root.id);
      root.ok = s == ncclSuccess;
      if (!root.ok) why = ncclGetErrorString(s);
    }
    world_.bootstrap().broadcast(&root, sizeof(root), world_.options().timeout,
                                 "NCCL baseline: the broadcast of rank 0's NCCL unique id");
    TL_REQUIRE(root.ok, "NCCL baseline: ncclGetUniqueId failed on rank 0" << (why.empty() ? "" : ": ") << why);
    world_.bind(me);
    TL_NCCL_CHECK(ncclCommInitRank(&nccl_[me], W, root.id, me));
  }

  World& world_;
  std::vector<cudaStream_t> gemm_;
  std::vector<cudaEvent_t> fork_, join_;
  std::vector<cublasHandle_t> cublas_;
  BaselineComm baseline_ = BaselineComm::kOwn;
  std::vector<ncclComm_t> nccl_;  // per rank; null where not local (or no NCCL)
  uint64_t nccl_mark_ = 0;  // the op's epoch mark after the last NCCL baseline call
};

}  // namespace tilelink::cuda::detail
