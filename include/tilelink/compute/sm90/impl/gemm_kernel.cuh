// The sm_90a GEMM tile engine kernel template (see ../gemm.hpp for the contract).
//
// Include this from a .cu file to instantiate the engine with your own Hooks type:
//   tilelink::compute::sm90::launch_gemm<cutlass::bfloat16_t, __nv_bfloat16>(args, hooks, stream);
// The mainloop (TMA loads into a Stages-deep smem ring, wgmma 2x(64x256x16) per k-block) is
// CUTLASS's sm90 warp-specialized collective; the persistent tile walk, the hooks and the epilogue
// are ours.
//
// Block: 384 threads = warpgroup 0 (warp 0: TMA producer; warp 1: store warp, the TMA stores of C
// tiles and the notify hook; warps 2-3 idle) + warpgroups 1-2 (consumers: 128x256 tile, each
// warpgroup 64x256, fp32 accumulators).
#pragma once

#if !defined(TILELINK_HAS_CUTE)
#error "the sm90 GEMM engine needs the CuTe/CUTLASS headers (scripts/setup.sh)"
#endif

#include <cstring>
#include <type_traits>

#include <cuda/atomic>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cuda_host_adapter.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "tilelink/compute/sm90/gemm.hpp"
#include "tilelink/compute/sm90/grouped_gemm.hpp"
#include "tilelink/compute/sm90/impl/check_cuda.hpp"
#include "tilelink/compute/sm90/impl/gemm_epilogue.cuh"
#include "tilelink/compute/sm90/impl/operand_map.hpp"
#include "tilelink/core/dynamic_tile_grid.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/core/grouped_walk.hpp"

namespace tilelink::compute::sm90 {

// The plain engine: no waits, no notifies (compiles to no extra instructions).
struct NoHooks {
  static constexpr bool kWaits = false;
  static constexpr bool kNotifies = false;
  __device__ void before_tile_loads(const TileWork&) const {}
  __device__ void after_tile_stored(const TileWork&) const {}
};

namespace detail {

// One engine configuration: element types, tile, epilogue, mainloop collective. kTmaStore_ (16-bit
// outputs only): the consumers write a tile into shared memory and the store warp copies it to C
// with TMA, so the next tile's MMAs run while the SM's write path drains it; the 64 KiB tile leaves
// room for 3 stages. Without it: stores from registers through per-warp staging buffers, 4 stages.
// kTileN_: the tile's width, kTileN, kTileNNarrow, kTileNLean or kTileNSlim, or the plain engine's
// kTileNFit (gemm.hpp). kTileRows_: kTileM, or the plain engine's kTileMTall (each consumer
// warpgroup then holds two 64-row slabs, 128 rows apart).
template <class ElementIn_, class ElementOut_, bool kTmaStore_, int kTileN_ = kTileN,
          int kTileRows_ = kTileM>
struct GemmConfig {
  using ElementIn = ElementIn_;    // cutlass::bfloat16_t or cutlass::half_t
  using ElementOut = ElementOut_;  // __nv_bfloat16, __half or float
  static constexpr int kTileN = kTileN_;
  static constexpr int kTileRows = kTileRows_;
  using TileShape = cute::Shape<cute::Int<kTileRows>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  static constexpr int kNumMmaWarps = 8;
  static constexpr bool kTmaStore = kTmaStore_;
  static_assert(!kTmaStore || sizeof(ElementOut) == 2, "the TMA store path is for 16-bit outputs");
  static constexpr int kEpilogueSmemBytes =
      kTmaStore ? tma_tile_bytes(kTileN, kTileRows) : kNumMmaWarps * kStageBytesPerWarp;
  // our barriers and the epilogue's shared memory, with room to spare
  static constexpr int kSmemCarveoutBytes = 1024 + kEpilogueSmemBytes;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,            //
      ElementIn, cutlass::layout::RowMajor, 8,                         // A [M, K], K-major
      ElementIn, cutlass::layout::ColumnMajor, 8,                      // B [N, K], K-major
      float, TileShape, ClusterShape,                                  //
      cutlass::gemm::collective::StageCountAutoCarveout<kSmemCarveoutBytes>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using TiledMma = typename Mainloop::TiledMma;
  // The builder's cooperative recipe, which tests/sm90_host/epilogue_layout_test.cpp builds on the
  // host to check the epilogue's assumptions about the accumulators' layout.
  static_assert(std::is_same_v<TiledMma, decltype(cute::make_tiled_mma(
                                             cute::GMMA::ss_op_selector<
                                                 ElementIn, ElementIn, float, TileShape,
                                                 cute::GMMA::Major::K, cute::GMMA::Major::K>(),
                                             cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}))>,
                "the tiled MMA is not the recipe the epilogue's layout test checks");
  using MainloopPipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;

  static constexpr int kNumMmaThreads = cute::size(TiledMma{});  // 2 warpgroups
  static constexpr int kNumThreads = kNumMmaThreads + 128;      // + the producer warpgroup
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(kNumMmaThreads == 256, "the cooperative mainloop uses two consumer warpgroups");
};

// The store pipeline: consumers -> store warp, in shared memory. A ring of mbarriers ("unit j is
// stored", "slot free again"), and on the TMA store path the tile buffer's "read out" barrier. 16
// slots: the consumers wait for a free slot only from a block's 17th unit on (the wait, though its
// slot is always long free, measured ~0.1-0.2% at 8 tiles a block; bench/notes/gemm.md, the hooks'
// cost). j counts the block's units of work (TileScheduler).
struct StorePipeline {
  using Barrier = cutlass::arch::ClusterBarrier;
  static constexpr int kSlots = 16;
  uint64_t full[kSlots];
  uint64_t empty[kSlots];
  uint64_t c_tile_free;  // TMA store path: the store warp has read the tile out of shared memory
  uint32_t skip[kSlots];  // the split last wave: 1 if the consumers left the tile to another part

  // One thread (of the store warp), before the block's first barrier.
  TL_DEVICE void init(int consumers) {
    for (int s = 0; s < kSlots; ++s) {
      Barrier::init(&full[s], consumers);  // an arrive per consumer thread
      Barrier::init(&empty[s], 1);
    }
    Barrier::init(&c_tile_free, 1);
    cutlass::arch::fence_barrier_init();
  }
  // Consumers, TMA store path: before staging unit j's tile, unit j - 1's is read out. NOTE: also
  // for a unit that stores nothing: the store warp frees the buffer once per unit, and a parity
  // wait must not fall two phases behind.
  TL_DEVICE void wait_tile_buffer(int j) {
    if (j > 0) Barrier::wait(&c_tile_free, (j - 1) & 1);
  }
  // Every consumer thread, after its stores of unit j (`stores`: false where another part of a split
  // tile stores it; written by one thread, `writer`).
  template <bool kSplit>
  TL_DEVICE void commit(int j, bool stores, bool writer) {
    const int slot = j % kSlots;
    if (j >= kSlots) Barrier::wait(&empty[slot], ((j / kSlots) & 1) ^ 1);
    if constexpr (kSplit) {
      if (writer) skip[slot] = stores ? 0u : 1u;
    }
    Barrier::arrive(&full[slot]);  // release.cta: this thread's stores before it
  }
  // The store warp's thread: waits for unit j; returns whether the consumers stored it.
  template <bool kSplit>
  TL_DEVICE bool take(int j) {
    const int slot = j % kSlots;
    Barrier::wait(&full[slot], (j / kSlots) & 1);
    return !(kSplit && skip[slot] != 0);
  }
  TL_DEVICE void free_tile_buffer() { Barrier::arrive(&c_tile_free); }
  TL_DEVICE void release(int j) { Barrier::arrive(&empty[j % kSlots]); }
};

// Hooks whose calls (those their flags enable) are const run on the kernel parameter itself
// (constant memory, read with LDC); others on a per-warp copy. NOTE: a copy of a hooks struct
// holding arrays indexed at run time (a SymmetricView's bases, a SegmentTiling's firsts) lives in
// local memory: the AG+GEMM hooks' copy put ~200 local loads and stores into the 40-register load
// warp (cuobjdump -sass).
template <class H>
TL_HD constexpr bool const_callable_hooks() {
  constexpr bool waits = !H::kWaits || requires(const H& h, const TileWork& w) {
    h.before_tile_loads(w);
  };
  constexpr bool notifies = !H::kNotifies || requires(const H& h, const TileWork& w) {
    h.after_tile_stored(w);
  };
  return waits && notifies;
}
template <class H>
using HooksInWarp = std::conditional_t<const_callable_hooks<H>(), const H&, H>;

// Optional hook points: work a block does for an op beside its tiles (the grouped mode's gather
// ahead, ops/moe_cuda.hpp). prologue(): every warp of the block, once, after the setup and before
// the roles split (the consumers' registers not yet raised). side_work(): the producer
// warpgroup's warps that load nothing and store nothing (1 to 3; 2 and 3 with a store warp),
// beside the mainloop. Both are const, warp-wide calls; neither may wait for the block's tiles.
template <class H>
concept HooksHavePrologue = requires(const H& h) { h.prologue(); };
template <class H>
concept HooksHaveSideWork = requires(const H& h) { h.side_work(); };

template <class Cfg>
struct SharedStorage {
  // NOTE: first, so the operand ring starts 1024-byte aligned (128-byte swizzle atoms).
  typename Cfg::Mainloop::TensorStorage tensors;
  alignas(16) typename Cfg::Mainloop::PipelineStorage pipeline;
  alignas(16) StorePipeline stored;
  uint32_t split_arrival;  // the split last wave: parts of its tile that arrived before this one
  // The TMA store path's tile (tma_tile_bytes), or the staged path's per-warp buffers
  // (kStageBytesPerWarp each): one launch uses one of them.
  alignas(1024) uint8_t epilogue[Cfg::kEpilogueSmemBytes];
};

// The grouped mode's shared memory: the groups' first tile rows, copied when a block starts (the
// walk's binary searches then read shared memory, not L2).
template <class Cfg>
struct GroupedSharedStorage : SharedStorage<Cfg> {
  int group_first[kGroupedMaxGroups + 1];
  int gather_rows[kTileM];  // a gathered A: the A rows of the tile being loaded (load_gathered_a)
};
template <class Cfg, bool kGrouped>
using SharedStorageOf = std::conditional_t<kGrouped, GroupedSharedStorage<Cfg>, SharedStorage<Cfg>>;

// kAltA: the descriptors of A's second source (GemmArgs::a_alt, tile rows [alt_tile0, alt_tile0 +
// alt_tiles)) and of B; an empty base otherwise, so the other kernels' parameters do not grow.
template <class Cfg, bool kAltA>
struct AltSource {};
template <class Cfg>
struct AltSource<Cfg, true> {
  typename Cfg::Mainloop::Params mainloop_alt;
  int alt_tile0 = 0, alt_tiles = 0, alt_rows = 0;
};

// kTail: C's tensor map for the last columns of a tile whose width is not a multiple of 64 (the TMA
// store path; boxes of tma_tail_cols x the tile's rows, unswizzled; stage_tile_for_tma).
template <bool kTail>
struct CTailMap {};
template <>
struct CTailMap<true> {
  CUtensorMap c_tail_map;
};

// kGrouped: the grouped mode's tile grid over the groups' rows (grouped_gemm.hpp) and A's tensor map
// (boxes of kTileM rows from any row: a group's tile row starts where the group does).
template <bool kGrouped>
struct GroupedRows {};
template <>
struct GroupedRows<true> {
  CUtensorMap a_rows_map;
  DynamicTileGrid groups;  // its `first`: the groups' first tile rows (grouped_gemm.hpp)
  const int* tile_row_order = nullptr;  // the walk's tile-row order (core/grouped_walk.hpp), or null
  // gathered A (load_gathered_a): grouped row -> index (A's row: index / a_row_div); A, row stride
  const int64_t* a_row_index = nullptr;
  int a_row_div = 1;
  const void* a_gather = nullptr;
  int64_t a_gather_ld = 0;
};

template <class Cfg, class Hooks, bool kAltA, bool kGrouped = false>
struct KernelParams : AltSource<Cfg, kAltA>,
                      CTailMap<Cfg::kTmaStore && tma_has_tail(Cfg::kTileN)>,
                      GroupedRows<kGrouped> {
  typename Cfg::Mainloop::Params mainloop;  // TMA descriptors of A and B
  int m = 0, n = 0, k = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  EpilogueMode mode = EpilogueMode::kStore;
  bool staged_store = false;  // kStore with 16-byte aligned C rows: the shared-memory staged path
  bool tma_store = false;     // ... and C local, 16-bit: the TMA store path (c_map)
  CUtensorMap c_map;  // C, boxes of 64 columns x the tile's rows, 128-byte swizzle (tma_store only)
  // A's last tile row where it is ragged: boxes of a_short_rows rows (its rows rounded up to 8;
  // 0: every tile loads CUTLASS's 128-row box). See load_short_a and launch_gemm_config.
  CUtensorMap a_short_map;
  int a_short_rows = 0;
  TileOrder order;
  // The split last wave (gemm.hpp): order.at(i) for i >= order.count() - split.tiles is computed
  // in split.parts parts of K (work_unit).
  GemmSplit split;
  uint32_t* split_flags = nullptr;   // [split.tiles][4]: arrivals, parts written, 2 spare
  float4* split_partials = nullptr;  // [split.tiles][gemm_split_partials][rows * Cfg::kTileN / 4]
  GemmStallReport* stall_report = nullptr;
  Hooks hooks;
};

// The persistent walk: worker `first` of `stride` visits unit first, first + stride, ...
struct PersistentWalk {
  int first, stride, count;
  TL_HD int num_local() const { return first < count ? (count - first + stride - 1) / stride : 0; }
  TL_HD int global(int j) const { return first + j * stride; }
};

// One unit of the walk: a whole tile, or one part of K of a split tile.
struct WorkUnit {
  TileCoord tile;
  int k_begin, k_count;  // k-blocks
  int split;             // the tile's slot in the split workspace; -1: a whole tile
  int part;              // which part of K
  int group = 0;         // the grouped mode's group (tile: its tile in the group's own grid)
};

// Units 0 .. order.count() - split.tiles - 1 are whole tiles in the order; each later tile is
// split.parts units, its parts of K in order.
template <bool kSplit, class P>
TL_DEVICE WorkUnit work_unit(const P& p, int u, int k_tiles) {
  if constexpr (!kSplit) return {p.order.at(u), 0, k_tiles, -1, 0};
  const int whole = p.order.count() - static_cast<int>(p.split.tiles);
  if (u < whole) return {p.order.at(u), 0, k_tiles, -1, 0};
  const int parts = p.split.parts, slot = (u - whole) / parts, part = (u - whole) - slot * parts;
  const int k0 = part * k_tiles / parts, k1 = (part + 1) * k_tiles / parts;
  return {p.order.at(whole + slot), k0, k1 - k0, slot, part};
}

// The tile scheduler: the units of work a block computes (whole tiles in the launch's TileOrder,
// then the parts of K of the split last wave's tiles), the same for every warp of the block, and
// what a hook is told about each (TileWork). The mainloop, the epilogue and the store pipeline take
// their units from it.
template <bool kSplit, class P>
struct TileScheduler {
  const P& p;
  TileGrid grid;
  PersistentWalk walk;
  int k_tiles;

  TL_DEVICE static TileScheduler make(const P& p, int tile_m, int tile_n) {
    return {p, gemm_tile_grid(p.m, p.n, tile_n, tile_m),
            PersistentWalk{static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x),
                           p.order.count() +
                               (kSplit ? static_cast<int>((p.split.parts - 1) * p.split.tiles) : 0)},
            static_cast<int>(ceil_div(p.k, kTileK))};
  }
  TL_DEVICE int units() const { return walk.num_local(); }
  TL_DEVICE WorkUnit unit(int j) const { return work_unit<kSplit>(p, walk.global(j), k_tiles); }
  // Whether the block's last unit is a part of a split tile (the consumers meet the other parts).
  TL_DEVICE bool ends_in_split() const {
    if constexpr (!kSplit) return false;
    return units() > 0 && unit(units() - 1).split >= 0;
  }
  // For the wait hook: the unit's K range; for the notify hook (whole_k): all of K, the stored tile
  // being the sum of its parts.
  TL_DEVICE TileWork work(const WorkUnit& u, bool whole_k) const {
    TileWork w;
    w.tile = u.tile;
    w.region = grid.region(u.tile);
    w.group = 0;
    w.k_begin = whole_k ? 0 : int64_t{u.k_begin} * kTileK;
    w.k_end = whole_k ? p.k : min(int64_t{u.k_begin + u.k_count} * kTileK, int64_t{p.k});
    return w;
  }
};

// The grouped mode's scheduler (grouped_gemm.hpp): the same interface over the groups' tiles, ids
// 0 .. first[groups] * tiles_n - 1 in the walk of core/grouped_walk.hpp (first: the block's
// shared-memory copy of the first-tile-row table; a bad table's negative entry there gives no
// units; p.tile_row_order: the walk's order of the tile rows, or group by group).
template <class P>
struct GroupedTileScheduler {
  const P& p;
  const int* first;
  PersistentWalk walk;
  int k_tiles;
  int tiles_n;

  TL_DEVICE static GroupedTileScheduler make(const P& p, const int* first) {
    const int tiles_n = p.groups.tiles_n();
    return {p, first,
            PersistentWalk{static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x),
                           first[p.groups.num_groups()] * tiles_n},
            static_cast<int>(ceil_div(p.k, kTileK)), tiles_n};
  }
  TL_DEVICE int units() const { return walk.num_local(); }
  TL_DEVICE WorkUnit unit(int j) const {
    const GroupedWalkTile t = grouped_walk_tile(first, p.groups.num_groups(), tiles_n, kGroupedBand,
                                                p.tile_row_order, walk.global(j));
    WorkUnit u{};
    u.tile = TileCoord{t.m, t.n};
    u.k_begin = 0, u.k_count = k_tiles, u.split = -1, u.part = 0, u.group = t.group;
    return u;
  }
  TL_DEVICE bool ends_in_split() const { return false; }
  TL_DEVICE TileWork work(const WorkUnit& u, bool /*whole_k*/) const {
    TileWork w;
    w.tile = u.tile;
    w.region = p.groups.region(GroupTileCoord{u.group, u.tile.m, u.tile.n});
    w.group = u.group;
    w.k_begin = 0;
    w.k_end = p.k;
    return w;
  }
};

// Whether consumer thread t's accumulators hold any of the tile's first `rows` rows (rows of C).
template <int TileM, int TileN, class TiledMma>
TL_DEVICE bool holds_rows_below(const TiledMma& tiled_mma, int t, int rows) {
  using namespace cute;
  Tensor tCcC = tiled_mma.get_thread_slice(t).partition_C(
      make_identity_tensor(make_shape(Int<TileM>{}, Int<TileN>{})));  // -> (row, col) in the tile
  bool any = false;
  CUTE_UNROLL
  for (int i = 0; i < size(tCcC); ++i) any |= get<0>(tCcC(i)) < rows;
  return any;
}

// The parts of a split tile meet (all 256 consumer threads, after their MMAs). Each part but the
// last to arrive writes its accumulators to the workspace and returns false. The last waits for
// them and returns true with the tile's sum in `accum`: it stores the tile. The sum is the fixed
// tree (p0 + p1) + (p2 + p3) (p0 + p1 with two parts, (p0 + p1) + p2 with three). Each of its adds
// has two operands, and a two-operand add gives the same bits either way round, so the last part
// adds from its registers wherever it sits in the tree (it never writes its own partial) and the
// result does not depend on the order of arrival. The last waits only for blocks that have already
// arrived and have nothing left to wait for, so the bound is for faults. A timed-out wait, or an
// arrival count past the parts (a workspace not zero-filled), reports the tile to p.stall_report
// (if set) and traps. `live`: this thread holds rows of C (holds_rows_below); the others neither
// write nor read partials, so a tile of a few rows (small M) moves a few KiB, not 128 KiB a part.
template <class P, class Accum>
TL_DEVICE bool meet_split_parts(const P& p, const WorkUnit& unit, Accum& accum, int t, bool live,
                                uint32_t* arrival) {
  using cutlass::arch::NamedBarrier;
  constexpr auto kBarrier = cutlass::arch::ReservedNamedBarriers::StreamkBarrier0;
  constexpr int kVecs = decltype(cute::size(accum))::value / 4;
  constexpr int kTileVecs = kVecs * 256;  // the tile's fp32 values / 4, over the 256 threads
  const int parts = p.split.parts;
  uint32_t* flags = p.split_flags + 4 * unit.split;
  // this thread's column of the tile's partials: partial q's element i is at
  // col[q * kTileVecs + i * 256]
  float4* col =
      p.split_partials + int64_t{unit.split} * gemm_split_partials(p.split) * kTileVecs + t;
  auto give_up = [&](int why) {  // thread 0: report, then trap
    if (p.stall_report != nullptr) {
      volatile GemmStallReport* r = p.stall_report;
      r->tile_m = unit.tile.m, r->tile_n = unit.tile.n;
      __threadfence_system();
      r->flag = why;
      __threadfence_system();
    }
    __trap();
  };
  if (t == 0) {
    *arrival = atomicAdd(&flags[0], 1u);
    if (*arrival >= static_cast<uint32_t>(parts)) give_up(GemmStallReport::kDirtyWorkspace);
  }
  NamedBarrier::sync(256, kBarrier);
  const bool last = *arrival == static_cast<uint32_t>(parts - 1);
  if (!last) {
    // with two parts only one ever writes: slot 0
    float4* mine = col + (parts == 2 ? 0 : unit.part) * kTileVecs;
    if (live) {
      CUTE_UNROLL
      for (int i = 0; i < kVecs; ++i) {
        mine[i * 256] =
            make_float4(accum(4 * i), accum(4 * i + 1), accum(4 * i + 2), accum(4 * i + 3));
      }
    }
    NamedBarrier::sync(256, kBarrier);  // every thread's stores before thread 0's release
    if (t == 0) {
      ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_device>(flags[1]).fetch_add(
          1, ::cuda::memory_order_release);
    }
    return false;
  }
  if (t == 0) {
    ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_device> written(flags[1]);
    const uint32_t others = static_cast<uint32_t>(parts - 1);
    for (long long polls = 0; written.load(::cuda::memory_order_acquire) < others; ++polls) {
      if (polls == (1ll << 26)) give_up(GemmStallReport::kTimedOut);
      __nanosleep(32);
    }
    flags[0] = 0, flags[1] = 0;  // zero again for the next launch (stream-ordered after this one)
  }
  NamedBarrier::sync(256, kBarrier);  // thread 0's acquire before every thread's loads
  // accum += partial a (+ partial b, added first), a whole column of independent loads at a time
  // (a loop over the partials inside would make 32 round trips of dependent loads).
  auto add_partials = [&](int a, int b) {
    CUTE_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      float4 v = __ldcg(&col[a * kTileVecs + i * 256]);
      if (b >= 0) {
        const float4 w = __ldcg(&col[b * kTileVecs + i * 256]);
        v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
      }
      accum(4 * i) += v.x, accum(4 * i + 1) += v.y;
      accum(4 * i + 2) += v.z, accum(4 * i + 3) += v.w;
    }
  };
  if (!live) return true;  // rows past C: nothing to add, nothing stored
  if (parts == 2) {
    add_partials(0, -1);  // p0 + p1
    return true;
  }
  const int me = unit.part, partner = me ^ 1, other = me < 2 ? 2 : 0;
  if (partner < parts) add_partials(partner, -1);           // this part's pair
  add_partials(other, other + 1 < parts ? other + 1 : -1);  // + the other pair (or p2 alone)
  return true;
}

inline constexpr int64_t kShortBoxMinFill = 8;  // see launch_gemm_config

// The load warp's k-loop for a tile of A's last tile row where it is ragged (M % kTileM rows): as
// CUTLASS's load() (B through its TMA atom), but A through p.a_short_map, whose box holds only the
// row's rows (rounded up to 8), then a complete_tx of the bytes the 128-row box would have added to
// the stage's barrier. A 128-row box there made the TMA zero-fill the rows past M in every stage,
// which cost up to 10% of a launch with two tile rows (192x8192x8192; bench/notes/gemm.md, the
// short A box). The stage's rows past the box keep what an earlier stage left there: they meet only
// accumulator rows past M, which nothing stores or adds. The whole warp calls it; one lane loads.
// load_a_box is its general form: A's box of box_rows rows from row a_row of `map` (kShort: fewer
// than kTileM, the missing bytes completed), B's tile column tile_n of batch l (the grouped mode's
// group).
template <class Cfg, bool kShort, class P, class Inputs>
TL_DEVICE void load_a_box(const P& p, typename Cfg::MainloopPipeline& pipeline,
                          typename Cfg::PipelineState write_state, const Inputs& load_inputs,
                          const CUtensorMap* map, int a_row, int box_rows, int tile_n, int l,
                          int k_begin, int k_count, typename Cfg::Mainloop::TensorStorage& tensors) {
  using namespace cute;
  using Mainloop = typename Cfg::Mainloop;
  constexpr int kRows = Cfg::kTileRows;
  constexpr int kStageElems = kRows * kTileK;
  static_assert(cosize_v<typename Mainloop::SmemLayoutA> % kStageElems == 0,
                "A's stages are kRows x 64 elements each, one after another");
  if (!cute::elect_one_sync()) return;
  auto block_tma_b = p.mainloop.tma_load_b.get_slice(0);
  Tensor sB = make_tensor(make_smem_ptr(tensors.smem_B.data()), typename Mainloop::SmemLayoutB{});
  Tensor tBgB = block_tma_b.partition_S(get<1>(load_inputs)(_, _, tile_n, _, l));  // (TMA,N,K,k)
  Tensor tBsB = block_tma_b.partition_D(sB);                                       // (TMA,N,K,PIPE)
  const uint32_t missing =
      static_cast<uint32_t>((kRows - box_rows) * kTileK * sizeof(typename Cfg::ElementIn));
  for (int kb = k_begin; kb < k_begin + k_count; ++kb, ++write_state) {
    pipeline.producer_acquire(write_state);  // waits for the stage; expects the 128-row box's bytes
    uint64_t* bar = pipeline.producer_get_barrier(write_state);
    const int stage = write_state.index();
    tma_load(tensors.smem_A.data() + stage * kStageElems, map, kb * kTileK, a_row, bar);
    copy(p.mainloop.tma_load_b.with(*bar, uint16_t{0}), tBgB(_, _, _, kb), tBsB(_, _, _, stage));
    if constexpr (kShort) {
      asm volatile("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(
                       static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
                   "r"(missing)
                   : "memory");
    }
  }
}
template <class Cfg, class P, class Inputs>
TL_DEVICE void load_short_a(const P& p, typename Cfg::MainloopPipeline& pipeline,
                            typename Cfg::PipelineState write_state, const Inputs& load_inputs,
                            TileCoord tile, int k_begin, int k_count,
                            typename Cfg::Mainloop::TensorStorage& tensors) {
  load_a_box<Cfg, true>(p, pipeline, write_state, load_inputs, &p.a_short_map,
                        tile.m * Cfg::kTileRows,
                        p.a_short_rows, tile.n, 0, k_begin, k_count, tensors);
}

// The grouped mode's loads where A is gathered (grouped_gemm.hpp), run by all four warps of the
// producer warpgroup (the TMA warp loads nothing else then; the store warp has no tiles to take: a
// gathered launch takes no notify hook). Per tile, warp w writes the A rows of the tile's rows
// [32 w, 32 w + 32) (grouped rows at or past group_end: the group's last row) into its part of
// `rows`; per k-block, each lane copies 8 of the 16-byte chunks of its warp's rows with cp.async
// into the places the 128-byte swizzle of A's stage gives them (chunk c of tile row r at r * 128 +
// (c ^ (r % 8)) * 16: the layout TMA's box would have written), then arrives on the stage's full
// barrier once they have landed (cp.async.mbarrier.arrive.noinc: the barrier expects one such
// arrival from each of the 128 threads besides the leader's, kGatherArrivals), and lane 0 of warp
// 0 arms the stage with B's bytes and loads B with TMA. The stage completes when all of them have
// arrived and B's bytes have landed, in whatever order: no warp waits for another (each only for
// the stage to be free). NOTE: two warps of 16 copies a lane a stage (warps 2 and 3 alone, a
// named barrier a stage before the arm) left the MMAs waiting: a producer of 40 registers issued
// about one instruction every 20 cycles (bench/notes/moe.md).
inline constexpr int kGatherWarps = 4;         // the producer warpgroup's
// A gathered stage's full-barrier arrivals: the leader's arm, and each copying thread's.
inline constexpr uint32_t kGatherArrivals = 1 + kGatherWarps * 32;

template <class Cfg, class P, class Inputs>
TL_DEVICE void load_gathered_a(const P& p, typename Cfg::MainloopPipeline& pipeline,
                               typename Cfg::PipelineState write_state, const Inputs& load_inputs,
                               int warp, int* rows, int64_t a_row, int64_t group_end, int tile_n,
                               int l, int k_count, typename Cfg::Mainloop::TensorStorage& tensors) {
  using namespace cute;
  using Mainloop = typename Cfg::Mainloop;
  using ElementIn = typename Cfg::ElementIn;
  constexpr int kStageElems = kTileM * kTileK;
  constexpr int kChunks = kTileK * int(sizeof(ElementIn)) / 16;  // 16-byte chunks of a row: 8
  constexpr int kRowsPerStep = 32 / kChunks;                      // rows a warp copies at once: 4
  constexpr int kRowsPerWarp = kTileM / kGatherWarps;             // 32
  constexpr int kSteps = kRowsPerWarp / kRowsPerStep;             // 8
  static_assert(kChunks == 8, "a k-block row is one 128-byte swizzle row");
  static_assert(Cfg::kTileRows == kTileM, "the grouped mode's tiles are 128 rows");
  const int lane = cutlass::canonical_lane_idx();
  int* mine = rows + warp * kRowsPerWarp;
  for (int i = lane; i < kRowsPerWarp; i += 32) {
    const int64_t row = min(a_row + warp * kRowsPerWarp + i, group_end - 1);
    mine[i] = static_cast<int>(__ldg(&p.a_row_index[row]) / p.a_row_div);
  }
  __syncwarp();
  const int chunk = lane % kChunks, r0 = lane / kChunks;
  const auto* a = static_cast<const uint8_t*>(p.a_gather);
  const int64_t ld_bytes = p.a_gather_ld * int64_t(sizeof(ElementIn));
  // B's bytes: the stage's TMA bytes less A's box, which the cp.async copies replace
  const uint32_t b_bytes = p.mainloop.tma_transaction_bytes -
                           static_cast<uint32_t>(kTileM * kTileK * sizeof(ElementIn));
  const bool leader = warp == 0 && lane == 0;
  auto block_tma_b = p.mainloop.tma_load_b.get_slice(0);
  Tensor sB = make_tensor(make_smem_ptr(tensors.smem_B.data()), typename Mainloop::SmemLayoutB{});
  Tensor tBgB = block_tma_b.partition_S(get<1>(load_inputs)(_, _, tile_n, _, l));  // (TMA,N,K,k)
  Tensor tBsB = block_tma_b.partition_D(sB);                                       // (TMA,N,K,PIPE)
  for (int kb = 0; kb < k_count; ++kb, ++write_state) {
    pipeline.producer_acquire(write_state);  // not the pipeline's leader: waits for the stage
    uint64_t* bar = pipeline.producer_get_barrier(write_state);
    const int stage = write_state.index();
    const uint32_t stage_base = static_cast<uint32_t>(
        __cvta_generic_to_shared(tensors.smem_A.data() + stage * kStageElems));
    // K's last k-block may end inside it (K is a multiple of 8, a chunk's elements): the chunks
    // past K are zero-filled (a source size of 0), as TMA's box zero-fills them, and read nothing.
    const int col = kb * kTileK + chunk * (16 / int(sizeof(ElementIn)));
    const uint32_t src_bytes = col < p.k ? 16u : 0u;
    const uint8_t* src = a + (src_bytes ? int64_t{col} * int64_t(sizeof(ElementIn)) : 0);
    CUTE_UNROLL
    for (int step = 0; step < kSteps; ++step) {
      const int i = r0 + step * kRowsPerStep, r = warp * kRowsPerWarp + i;
      const uint32_t dst = stage_base + r * 128 + ((chunk ^ (r & 7)) << 4);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst),
                   "l"(src + int64_t{mine[i]} * ld_bytes), "r"(src_bytes)
                   : "memory");
    }
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(
                     static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
                 : "memory");
    if (leader) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                       static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
                   "r"(b_bytes)
                   : "memory");
      copy(p.mainloop.tma_load_b.with(*bar, uint16_t{0}), tBgB(_, _, _, kb), tBsB(_, _, _, stage));
    }
  }
}

// Timeline marks, for bench/diag/gemm_timeline.cu only: a translation unit that defines
// TL_GEMM_TIMELINE (and the tl_gemm_timeline_* functions) before including this header gets per-block
// clock stamps at the points below; everywhere else the marks compile to nothing.
#if defined(TL_GEMM_TIMELINE)
#define TL_GEMM_MARK(slot) tl_gemm_timeline_mark(slot)
#define TL_GEMM_MARK_ADD(slot, v) tl_gemm_timeline_add(slot, v)
#define TL_GEMM_MARK_MAX(slot) tl_gemm_timeline_max(slot)
#define TL_GEMM_CLOCK() clock64()
#else
#define TL_GEMM_MARK(slot) ((void)0)
#define TL_GEMM_MARK_ADD(slot, v) ((void)0)
#define TL_GEMM_MARK_MAX(slot) ((void)0)
#define TL_GEMM_CLOCK() 0ll
#endif

TL_DEVICE TL_INLINE void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// kSplit: the instance for launches that split their last wave (gemm.hpp); the others compile
// without any of it. kGrouped: the grouped mode (grouped_gemm.hpp): its scheduler, A's boxes from
// the groups' rows, B_g by batch, stores clipped to the group.
template <class Cfg, class Hooks, bool kAltA, bool kSplit, bool kGrouped = false>
__global__ void __launch_bounds__(Cfg::kNumThreads, 1)
    gemm_kernel(CUTE_GRID_CONSTANT const KernelParams<Cfg, Hooks, kAltA, kGrouped> p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Mainloop = typename Cfg::Mainloop;
  using MainloopPipeline = typename Cfg::MainloopPipeline;
  using PipelineState = typename Cfg::PipelineState;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int kTileN = Cfg::kTileN;        // this configuration's tile width
  constexpr int kTileRows = Cfg::kTileRows;  // ... and rows

  static_assert(!kGrouped || (!kAltA && !kSplit && !Cfg::kTmaStore && kTileRows == kTileM),
                "the grouped mode has one A, no split, register stores and 128-row tiles");
  static_assert(kTileRows == kTileM || (!kAltA && !kSplit && !Hooks::kWaits && !Hooks::kNotifies),
                "the 256-row tiles are the plain engine's: no hooks, one A, no split");
  using Params = KernelParams<Cfg, Hooks, kAltA, kGrouped>;
  extern __shared__ __align__(1024) uint8_t tl_sm90_gemm_smem[];
  auto& shared = *reinterpret_cast<SharedStorageOf<Cfg, kGrouped>*>(tl_sm90_gemm_smem);

  // ---- the hooks' prologue: first, while the kernel holds no state of its own ------------------
  // NOTE: after the setup (the walk's tables built, the pipeline made) the prologue's copies made
  // ptxas spill 116-192 bytes in the MoE gather-ahead instances, at the launch's 168 registers.
  if constexpr (HooksHavePrologue<Hooks>) {
    HooksInWarp<Hooks> hooks = p.hooks;
    hooks.prologue();
  }

  // ---- setup ---------------------------------------------------------------------------------
  const int thread_idx = threadIdx.x;
  if (threadIdx.x == 0) TL_GEMM_MARK(0);
  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int warp_group_idx = cutlass::canonical_warp_group_idx();
  const int warp_in_group = warp_idx % 4;
  const bool is_producer_group = warp_group_idx == 0;

  if (warp_idx == 0 && cute::elect_one_sync()) {
    Mainloop::prefetch_tma_descriptors(p.mainloop);
    if constexpr (kAltA) Mainloop::prefetch_tma_descriptors(p.mainloop_alt);
    if constexpr (kGrouped) {
      if (p.a_row_index == nullptr) cute::prefetch_tma_descriptor(&p.a_rows_map);
    }
  }

  // The grouped mode's gathered A (load_gathered_a): the producer warpgroup's four warps load, and
  // none is the pipeline's leader (its acquire would arm the stage with A's box too: lane 0 of warp
  // 0 arms it with B's bytes alone, once the copies are counted). Never with a store warp (refused).
  constexpr bool kStoreWarp = Hooks::kNotifies || Cfg::kTmaStore;
  bool gathered = false;
  if constexpr (kGrouped && !kStoreWarp) gathered = p.a_row_index != nullptr;
  typename MainloopPipeline::Params pipe_params;
  if (is_producer_group && (warp_in_group == 0 || gathered)) pipe_params.role = MainloopPipeline::ThreadCategory::Producer;
  if (!is_producer_group) pipe_params.role = MainloopPipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = (thread_idx % 128) == 0 && !gathered;
  if (gathered) pipe_params.num_producers = kGatherArrivals;
  pipe_params.num_consumers = Cfg::kNumMmaThreads;
  pipe_params.transaction_bytes = p.mainloop.tma_transaction_bytes;
  MainloopPipeline pipeline(shared.pipeline, pipe_params, typename Cfg::ClusterShape{});  // inits in warp 0
  if (threadIdx.x == 0) TL_GEMM_MARK(9);
  if (threadIdx.x == 128) TL_GEMM_MARK(10);

  // The store warp (warp 1) takes the consumers' stored tiles: it runs the notify hook, and on the
  // TMA store path it first copies the tile from shared memory to C.
  const bool handoff = kStoreWarp && (Hooks::kNotifies || p.tma_store);  // consumers hand tiles over
  if constexpr (kStoreWarp) {
    if (warp_idx == 1 && cute::elect_one_sync()) {
      shared.stored.init(Cfg::kNumMmaThreads);
      if (p.tma_store) {
        cute::prefetch_tma_descriptor(&p.c_map);
        if constexpr (Cfg::kTmaStore && tma_has_tail(kTileN)) {
          cute::prefetch_tma_descriptor(&p.c_tail_map);
        }
      }
    }
  }

  const auto sched = [&] {
    if constexpr (kGrouped) {
      const int groups = p.groups.num_groups();
      for (int i = threadIdx.x; i <= groups; i += blockDim.x) {
        shared.group_first[i] = p.groups.first[i];  // -1 (a bad table): no tiles
      }
      __syncthreads();
      return GroupedTileScheduler<Params>::make(p, shared.group_first);
    } else {
      return TileScheduler<kSplit, Params>::make(p, kTileRows, kTileN);
    }
  }();
  // NOTE: waiting for the first tile here, in an idle warp, before this barrier (to overlap the
  // setup) measured slower, not faster: the load warp waits below. So did the load warp sending a
  // relaxed read of the signal out at entry and ending the wait with `fence.acquire` after this
  // barrier (bench/notes/gemm.md, designs tried and not kept: the hooks' fixed cost).
  __syncthreads();
  if (threadIdx.x == 0) TL_GEMM_MARK(11);
  const auto problem_mnkl = [&] {
    if constexpr (kGrouped) {
      return make_shape(p.m, p.n, p.k, p.groups.num_groups());  // B_g: batch g
    } else {
      return make_shape(p.m, p.n, p.k, 1);
    }
  }();
  Mainloop mainloop;

  if (is_producer_group) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();

    // ---- load warp: wait hook, then TMA loads of the tile's k-blocks -------------------------
    // (the grouped mode's gathered A: the warpgroup's four warps load instead of warp 0)
    if constexpr (kGrouped && !kStoreWarp) {
      if (gathered) {
        auto load_inputs = mainloop.load_init(problem_mnkl, p.mainloop);
        HooksInWarp<Hooks> hooks = p.hooks;
        PipelineState write_state = cutlass::make_producer_start_state<MainloopPipeline>();
        for (int j = 0; j < sched.units(); ++j) {
          const WorkUnit unit = sched.unit(j);
          if constexpr (Hooks::kWaits) {
            hooks.before_tile_loads(sched.work(unit, false));  // every warp: each reads the rows
            __syncwarp();
            fence_proxy_async_global();  // B's TMA reads through the async proxy
          }
          const int64_t a_row = p.groups.rows.begin(unit.group) + int64_t{unit.tile.m} * kTileM;
          load_gathered_a<Cfg>(p, pipeline, write_state, load_inputs, warp_in_group,
                               shared.gather_rows, a_row, p.groups.rows.end(unit.group),
                               unit.tile.n, unit.group, unit.k_count, shared.tensors);
          write_state.advance(unit.k_count);
          // a warp reads and writes only its own part of `gather_rows`: the next tile's rows
          // overwrite it once every lane of the warp issued this one's
          __syncwarp();
        }
        if (warp_in_group == 0) mainloop.load_tail(pipeline, write_state);
      }
    }
    if (warp_in_group == 0 && !gathered) {
      auto load_inputs = mainloop.load_init(problem_mnkl, p.mainloop);
      auto gA_mkl = get<0>(load_inputs);  // (BLK_M, BLK_K, m, k, l)
      HooksInWarp<Hooks> hooks = p.hooks;
      PipelineState write_state = cutlass::make_producer_start_state<MainloopPipeline>();
      if (cute::elect_one_sync()) TL_GEMM_MARK(1);
      for (int j = 0; j < sched.units(); ++j) {
        const WorkUnit unit = sched.unit(j);
        const TileCoord tile = unit.tile;
        if (j == 0 && cute::elect_one_sync()) TL_GEMM_MARK(14);
        [[maybe_unused]] const long long t_wait = TL_GEMM_CLOCK();
        if constexpr (Hooks::kWaits) {
          hooks.before_tile_loads(sched.work(unit, false));
          __syncwarp();
          // NOTE: the hook's acquire is a generic-proxy access; TMA reads through the async proxy.
          fence_proxy_async_global();
        }
        if (j == 0 && cute::elect_one_sync()) TL_GEMM_MARK(2);
        if (j > 0 && cute::elect_one_sync()) TL_GEMM_MARK_ADD(3, TL_GEMM_CLOCK() - t_wait);
        auto k_tile_iter = [&] {
          if constexpr (kSplit) {
            return cute::make_coord_iterator(idx2crd(unit.k_begin, shape<3>(gA_mkl)),
                                             shape<3>(gA_mkl));
          } else {
            return cute::make_coord_iterator(shape<3>(gA_mkl));
          }
        }();
        bool from_alt = false;
        if constexpr (kAltA) {
          from_alt = tile.m >= p.alt_tile0 && tile.m < p.alt_tile0 + p.alt_tiles;
          if (from_alt) {
            // NOTE: made per tile, not held across the walk: the load warp has 40 registers, and the
            // second set of tensors kept live spilled ~1.4 KiB to local memory.
            auto load_inputs_alt = mainloop.load_init(make_shape(p.alt_rows, p.n, p.k, 1), p.mainloop_alt);
            mainloop.load(p.mainloop_alt, pipeline, write_state, load_inputs_alt,
                          make_coord(tile.m - p.alt_tile0, tile.n, _, 0), k_tile_iter, unit.k_count,
                          cutlass::canonical_lane_idx(), 0u, shared.tensors);
          }
        }
        if constexpr (kGrouped) {
          const int64_t a_row = p.groups.rows.begin(unit.group) + int64_t{tile.m} * kTileM;
          load_a_box<Cfg, false>(p, pipeline, write_state, load_inputs, &p.a_rows_map,
                                 static_cast<int>(a_row), kTileM, tile.n, unit.group, 0,
                                 unit.k_count, shared.tensors);
        } else if (!from_alt && p.a_short_rows != 0 && tile.m == sched.grid.tiles_m() - 1) {
          load_short_a<Cfg>(p, pipeline, write_state, load_inputs, tile, unit.k_begin, unit.k_count,
                            shared.tensors);
        } else if (!from_alt) {
          mainloop.load(p.mainloop, pipeline, write_state, load_inputs,
                        make_coord(tile.m, tile.n, _, 0), k_tile_iter, unit.k_count,
                        cutlass::canonical_lane_idx(), 0u, shared.tensors);
        }
        write_state.advance(unit.k_count);
      }
      mainloop.load_tail(pipeline, write_state);
      if (cute::elect_one_sync()) TL_GEMM_MARK(12);
    }

    // ---- store warp: after every consumer thread stored tile j (into shared memory on the TMA ----
    // path, then copied to C here), run the notify hook
    if constexpr (kStoreWarp) {
      if (warp_in_group == 1 && handoff && cute::elect_one_sync()) {
        [[maybe_unused]] HooksInWarp<Hooks> hooks = p.hooks;
        for (int j = 0; j < sched.units(); ++j) {
          const bool skip = !shared.stored.template take<kSplit>(j);  // another part stores it
          if (j + 1 == sched.units()) TL_GEMM_MARK(7);
          const WorkUnit unit = sched.unit(j);
          const TileCoord tile = unit.tile;
          if constexpr (Cfg::kTmaStore) {
            if (p.tma_store && skip) {
              shared.stored.free_tile_buffer();  // one per unit, as below
            } else if (p.tma_store) {
              // The box clips at C's edges: a ragged tile writes only its region.
              namespace ptx = ::cuda::ptx;
              constexpr int kChunks = tma_full_chunks(kTileN);
              for (int chunk = 0; chunk < kChunks; ++chunk) {
                const int32_t box[2] = {tile.n * kTileN + chunk * kTmaChunkCols,
                                        tile.m * kTileRows};
                ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, &p.c_map, box,
                                          shared.epilogue + chunk * tma_chunk_bytes(kTileRows));
              }
              if constexpr (tma_has_tail(kTileN)) {
                const int32_t box[2] = {tile.n * kTileN + kChunks * kTmaChunkCols,
                                        tile.m * kTileRows};
                ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, &p.c_tail_map, box,
                                          shared.epilogue + kChunks * tma_chunk_bytes(kTileRows));
              }
              ptx::cp_async_bulk_commit_group();
              ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{});  // the buffer is free again
              shared.stored.free_tile_buffer();
              if constexpr (Hooks::kNotifies) {
                ptx::cp_async_bulk_wait_group(ptx::n32_t<0>{});  // the tile is in C ...
                fence_proxy_async_global();  // ... and ordered before the hook's (generic) release
              }
            }
          }
          if constexpr (Hooks::kNotifies) {
            if (!skip) hooks.after_tile_stored(sched.work(unit, true));
          }
          if (j + 1 == sched.units()) TL_GEMM_MARK(8);
          shared.stored.release(j);
        }
      }
    }

    // ---- the warps left: the hooks' side work beside the mainloop ------------------------------
    if constexpr (HooksHaveSideWork<Hooks>) {
      if (!gathered && warp_in_group >= (handoff ? 2 : 1)) {
        HooksInWarp<Hooks> hooks = p.hooks;
        hooks.side_work();
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();

    // ---- consumer warpgroups: wgmma over k, then the epilogue straight from registers -----------
    typename Cfg::TiledMma tiled_mma;
    const int mma_thread_idx = thread_idx - 128;
    PipelineState read_state;
    if (thread_idx == 128) TL_GEMM_MARK(4);
    // One unit; kMeet: the block's last unit, a part of a split tile. NOTE: the split meeting is a
    // separate instance after the loop: inside the loop body it raised the register pressure
    // enough to spill the pipeline state in the mainloop (cuobjdump -sass).
    auto run_unit = [&]<bool kMeet>(int j) {
      const WorkUnit unit = sched.unit(j);
      const TileCoord tile = unit.tile;
      auto accum = partition_fragment_C(tiled_mma, take<0, 2>(typename Cfg::TileShape{}));  // (MMA, MMA_M, MMA_N)
      mainloop.mma(pipeline, read_state, accum, unit.k_count, mma_thread_idx, shared.tensors,
                   p.mainloop);
      mainloop.mma_tail(pipeline, read_state, unit.k_count);
      read_state.advance(unit.k_count);
      bool stores = true;
      if constexpr (kMeet)
        stores = meet_split_parts(
            p, unit, accum, mma_thread_idx,
            holds_rows_below<kTileRows, kTileN>(tiled_mma, mma_thread_idx,
                                                p.m - tile.m * kTileRows),
            &shared.split_arrival);
      if (j == 0 && thread_idx == 128) TL_GEMM_MARK(5);

      auto store_from_registers = [&] {
        // C and its rows: the grouped mode's from the group's first row, clipped to the group
        void* c = p.c;
        int m = p.m;
        if constexpr (kGrouped) {
          const int64_t row0 = p.groups.rows.begin(unit.group);
          c = static_cast<typename Cfg::ElementOut*>(p.c) + row0 * p.ldc;
          m = static_cast<int>(p.groups.rows.end(unit.group) - row0);
        }
        if (p.staged_store) {
          store_tile_staged<kTileRows, kTileN, typename Cfg::ElementOut>(
              c, p.ldc, m, p.n, tile, tiled_mma, mma_thread_idx, accum,
              shared.epilogue + (mma_thread_idx / 32) * kStageBytesPerWarp);
        } else {
          store_tile<kTileRows, kTileN, typename Cfg::ElementOut>(p.mode, c, p.ldc, m, p.n, tile,
                                                                  tiled_mma, mma_thread_idx, accum);
        }
      };
      if constexpr (Cfg::kTmaStore) {
        if (p.tma_store) {
          shared.stored.wait_tile_buffer(j);  // unit j-1's tile read out
          if (stores) {
            stage_tile_for_tma<kTileRows, kTileN, typename Cfg::ElementOut>(
                tiled_mma, mma_thread_idx, accum, shared.epilogue);
            // for the store warp's TMA, after the arrive below
            ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);
          }
        } else if (stores) {
          store_from_registers();
        }
      } else if (stores) {
        store_from_registers();
      }
      if (j + 1 == sched.units() && thread_idx == 128) TL_GEMM_MARK(6);
      if (j + 1 == sched.units() && cutlass::canonical_lane_idx() == 0) TL_GEMM_MARK_MAX(13);
      if (handoff) {
        // NOTE: every thread arrives (release.cta: its own stores before it; the arrives of a warp
        // are aggregated), on the ring's later laps after waiting for its slot to be free. Before,
        // lane 0 arrived for its warp after a __syncwarp: the same time, but the __syncwarp's
        // convergence region put the staged epilogue ~32 KB away from the mainloop (bench/notes/
        // gemm.md, the hooks' cost).
        shared.stored.template commit<kSplit>(j, stores, mma_thread_idx == 0);
      }
    };
    if constexpr (kSplit) {
      const int units = sched.units();
      const bool meets = sched.ends_in_split();
      for (int j = 0; j < units - (meets ? 1 : 0); ++j) run_unit.template operator()<false>(j);
      if (meets) run_unit.template operator()<true>(units - 1);
    } else {
      for (int j = 0; j < sched.units(); ++j) run_unit.template operator()<false>(j);
    }
  }
#endif
}

// C in this device's own memory (not a peer's, not host or managed memory): the TMA store path may
// write it.
inline bool is_local_device_memory(const void* ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();  // not a CUDA allocation: take the generic path
    return false;
  }
  int device = -1;
  TL_SM90_CUDA_CHECK(cudaGetDevice(&device));
  return attr.type == cudaMemoryTypeDevice && attr.device == device;
}

// C's tensor map for the TMA store path: [m, n] row-major (row stride ldc elements), boxes of
// kTmaChunkCols x tile_m in the 128-byte swizzle of stage_tile_for_tma, or (tail_cols > 0) boxes
// of tail_cols x tile_m unswizzled.
template <class ElementOut>
void encode_c_tensor_map(CUtensorMap* map, void* c, int64_t m, int64_t n, int64_t ldc, int tile_m,
                         int tail_cols = 0) {
  const bool tail = tail_cols > 0;
  static_assert(sizeof(ElementOut) == 2);
  const CUtensorMapDataType type = std::is_same_v<ElementOut, __half>
                                       ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(n), static_cast<cuuint64_t>(m)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ldc) * sizeof(ElementOut)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(tail ? tail_cols : kTmaChunkCols),
                             static_cast<cuuint32_t>(tile_m)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = cutlass::call_cuTensorMapEncodeTiled(
      map, type, 2, c, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      tail ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TL_REQUIRE(r == CUDA_SUCCESS, "sm90 gemm: cuTensorMapEncodeTiled for C failed (CUresult "
                                    << static_cast<int>(r) << ")");
}

template <class T> inline constexpr DType kDTypeOf = DType::kF32;
template <> inline constexpr DType kDTypeOf<cutlass::bfloat16_t> = DType::kBF16;
template <> inline constexpr DType kDTypeOf<cutlass::half_t> = DType::kF16;
template <> inline constexpr DType kDTypeOf<__nv_bfloat16> = DType::kBF16;
template <> inline constexpr DType kDTypeOf<__half> = DType::kF16;

// CUTLASS's TMA descriptors of A and B (and the rest of the mainloop's parameters) for `args`.
template <class Cfg>
typename Cfg::Mainloop::Params mainloop_params(const GemmArgs& args) {
  using namespace cute;
  using ElementIn = typename Cfg::ElementIn;
  using Mainloop = typename Cfg::Mainloop;
  const int64_t lda = args.lda ? args.lda : args.k;
  const int64_t ldb = args.ldb ? args.ldb : args.k;
  typename Mainloop::Arguments mainloop_args{
      static_cast<const ElementIn*>(args.a),
      typename Mainloop::StrideA{lda, Int<1>{}, lda * args.m},
      static_cast<const ElementIn*>(args.b),
      typename Mainloop::StrideB{ldb, Int<1>{}, ldb * args.n}};
  const auto problem =
      make_shape(static_cast<int>(args.m), static_cast<int>(args.n), static_cast<int>(args.k), 1);
  return Mainloop::to_underlying_arguments(problem, mainloop_args, nullptr);
}

// Re-encodes `desc`, CUTLASS's TMA descriptor of a K-major operand [rows, k] (row stride ld
// elements; a box is kTileK columns x box_rows rows), with 256-byte L2 promotion
// (gemm_wide_l2_fetch). The geometry below is our reading of CUTLASS's: 16-bit elements as
// UINT16, three dimensions (k, rows, a batch of one), the 128-byte swizzle (the arguments CUTLASS
// passes to cuTensorMapEncodeTiled, printed once from its host code). It is used only if encoding
// it with CUTLASS's own settings gives CUTLASS's bytes exactly, so a CUTLASS that builds
// descriptors differently keeps its own. Returns whether it re-encoded
// (Sm90Gemm.WideL2FetchMatchesCutlass checks that it does).
template <class ElementIn>
bool widen_l2_fetch(const cute::TmaDescriptor* desc, const void* base, int64_t rows, int64_t k,
                    int64_t ld, int box_rows) {
  static_assert(sizeof(cute::TmaDescriptor) == sizeof(CUtensorMap) && sizeof(ElementIn) == 2);
  const CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_UINT16;  // as CUTLASS moves 16-bit types
  constexpr int64_t kBytes = sizeof(ElementIn);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows), 1};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld * kBytes),
                                 static_cast<cuuint64_t>(ld * rows * kBytes)};
  const cuuint32_t box[3] = {kTileK, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  auto encode = [&](CUtensorMap* map, CUtensorMapL2promotion promotion) {
    *map = CUtensorMap{};
    return cutlass::call_cuTensorMapEncodeTiled(
               map, type, 3, const_cast<void*>(base), dims, strides, box, element_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  CUtensorMap same, wide;
  if (!encode(&same, CU_TENSOR_MAP_L2_PROMOTION_L2_128B) ||
      std::memcmp(&same, desc, sizeof(same)) != 0 ||
      !encode(&wide, CU_TENSOR_MAP_L2_PROMOTION_L2_256B)) {
    return false;
  }
  std::memcpy(const_cast<cute::TmaDescriptor*>(desc), &wide, sizeof(wide));
  return true;
}

// Builds the TMA descriptors and launches the engine in configuration Cfg (arguments checked).
template <class Cfg, class Hooks, bool kAltA, bool kSplit>
void launch_gemm_config(const GemmArgs& args, const Hooks& hooks, const GemmWork& work,
                        cudaStream_t stream) {
  using namespace cute;
  using ElementIn = typename Cfg::ElementIn;
  using ElementOut = typename Cfg::ElementOut;
  using Params = KernelParams<Cfg, Hooks, kAltA>;

  const int64_t lda = args.lda ? args.lda : args.k;
  const int64_t ldb = args.ldb ? args.ldb : args.k;

  Params p;
  p.mainloop = mainloop_params<Cfg>(args);
  if (gemm_wide_l2_fetch(args.m)) {
    widen_l2_fetch<ElementIn>(p.mainloop.tma_load_a.get_tma_descriptor(), args.a, args.m, args.k,
                              lda, Cfg::kTileRows);
    widen_l2_fetch<ElementIn>(p.mainloop.tma_load_b.get_tma_descriptor(), args.b, args.n, args.k,
                              ldb, Cfg::kTileN);
  }
  if constexpr (kAltA) {
    // Without a second source, the band is empty and its descriptors repeat A's (they are still
    // prefetched, so they must be valid).
    const bool alt = args.a_alt != nullptr;
    GemmArgs alt_args = args;  // A's band as the whole A, B as it is
    if (alt) {
      alt_args.a = args.a_alt;
      alt_args.lda = args.lda_alt;
      alt_args.m = args.a_alt_rows;
    }
    p.mainloop_alt = mainloop_params<Cfg>(alt_args);
    p.alt_rows = static_cast<int>(alt_args.m);
    p.alt_tile0 = alt ? static_cast<int>(args.a_alt_row0 / kTileM) : 0;
    p.alt_tiles = alt ? static_cast<int>(ceil_div(args.a_alt_rows, kTileM)) : 0;
  }
  p.m = static_cast<int>(args.m);
  p.n = static_cast<int>(args.n);
  p.k = static_cast<int>(args.k);
  p.c = args.c;
  p.ldc = args.ldc ? args.ldc : args.n;
  p.mode = args.epilogue;
  p.staged_store = args.epilogue == EpilogueMode::kStore && reinterpret_cast<uintptr_t>(args.c) % 16 == 0 &&
                   (p.ldc * static_cast<int64_t>(sizeof(ElementOut))) % 16 == 0;
  // The short box: always in the 128- and 160-wide tiles, and in the wider ones where the 128-row
  // boxes would zero-fill more than an eighth of the rows they load (kShortBoxMinFill). A 128-wide
  // tile whose box is half zero-filled runs up to ~1.8x as long: its launches gained 5-38% at
  // ragged M of 448-1088 rows. In the 192- and 256-wide tiles the short box gains at 136-320 rows
  // (136x8192x8192 0.63 -> 0.83 of cuBLAS), but costs ~1% where an eighth or less of the rows is
  // zero-filled (448, 576, 704 rows; bench/notes/gemm.md, the short A box).
  constexpr int64_t kRows = Cfg::kTileRows;
  const int64_t padded = ceil_div(args.m, kRows) * kRows;
  if (const int64_t rows = args.m % kRows;
      rows != 0 && (Cfg::kTileN <= kTileNLean || kShortBoxMinFill * (padded - args.m) > padded)) {
    p.a_short_rows = static_cast<int>((rows + 7) / 8 * 8);
    encode_operand_map<ElementIn>(&p.a_short_map, args.a, args.m, args.k, lda, kTileK,
                                  p.a_short_rows,
                                  gemm_wide_l2_fetch(args.m) ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                                                             : CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                  "A's last tile row");
  }
  if constexpr (Cfg::kTmaStore) {
    p.tma_store = p.staged_store && is_local_device_memory(args.c);
    if (p.tma_store) {
      encode_c_tensor_map<ElementOut>(&p.c_map, args.c, args.m, args.n, p.ldc, Cfg::kTileRows);
    }
    if constexpr (tma_has_tail(Cfg::kTileN)) {
      if (p.tma_store) {
        encode_c_tensor_map<ElementOut>(&p.c_tail_map, args.c, args.m, args.n, p.ldc,
                                        Cfg::kTileRows, tma_tail_cols(Cfg::kTileN));
      }
    }
  }
  const int num_blocks = work.blocks;
  p.order = gemm_tile_order(args, num_blocks);
  p.split = work.split;
  if (work.split.tiles > 0) {
    auto* ws = static_cast<uint8_t*>(args.workspace);
    p.split_flags = reinterpret_cast<uint32_t*>(ws);
    p.split_partials = reinterpret_cast<float4*>(ws + kSplitFlagsRegionBytes);
  }
  p.stall_report = args.stall_report;
  p.hooks = hooks;

  auto* kernel = &gemm_kernel<Cfg, Hooks, kAltA, kSplit>;
  constexpr size_t kSmemBytes = sizeof(SharedStorage<Cfg>);
  // NOTE: on every launch, not once per process: the attribute belongs to the kernel as loaded in the
  // current context, and a virtual world runs each rank in its own green context. Set once, it made
  // the second rank's launch fail (and the first rank's comm program wait forever for it).
  TL_SM90_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  kernel<<<num_blocks, Cfg::kNumThreads, kSmemBytes, stream>>>(p);
  TL_SM90_CUDA_CHECK(cudaGetLastError());
}

// The grouped mode's launch in configuration Cfg (arguments checked): B's descriptor is CUTLASS's
// with the groups as its batch (A's, built alongside, is never read: A comes through a_rows_map).
template <class Cfg, class Hooks>
void launch_grouped_gemm_config(const GroupedGemmArgs& args, const Hooks& hooks, int tile_n,
                                int blocks, cudaStream_t stream) {
  using namespace cute;
  using ElementIn = typename Cfg::ElementIn;
  using ElementOut = typename Cfg::ElementOut;
  using Mainloop = typename Cfg::Mainloop;
  using Params = KernelParams<Cfg, Hooks, false, true>;
  const int64_t lda = args.lda ? args.lda : args.k;
  const int64_t ldb = args.ldb ? args.ldb : args.k;

  Params p;
  typename Mainloop::Arguments mainloop_args{
      static_cast<const ElementIn*>(args.a),
      typename Mainloop::StrideA{lda, Int<1>{}, lda * args.max_rows},
      static_cast<const ElementIn*>(args.b),
      typename Mainloop::StrideB{ldb, Int<1>{}, ldb * args.n}};
  const auto problem = make_shape(static_cast<int>(args.max_rows), static_cast<int>(args.n),
                                  static_cast<int>(args.k), args.groups);
  p.mainloop = Mainloop::to_underlying_arguments(problem, mainloop_args, nullptr);
  if (args.a_row_index != nullptr) {
    p.a_row_index = args.a_row_index;
    p.a_row_div = args.a_row_div;
    p.a_gather = args.a;
    p.a_gather_ld = lda;
    p.a_rows_map = CUtensorMap{};  // not read
  } else {
    encode_operand_map<ElementIn>(&p.a_rows_map, args.a, args.max_rows, args.k, lda, kTileK,
                                  kTileM, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, "A's rows");
  }
  p.groups = DynamicTileGrid{DynamicRowPartition{args.groups, args.offsets}, args.n, kTileM, tile_n,
                             args.first_tile_rows};
  p.tile_row_order = args.tile_row_order;
  p.m = static_cast<int>(args.max_rows);
  p.n = static_cast<int>(args.n);
  p.k = static_cast<int>(args.k);
  p.c = args.c;
  p.ldc = args.ldc ? args.ldc : args.n;
  p.mode = args.epilogue;
  // 16-byte row segments from any group's first row: C's base and row pitch both 16-byte aligned
  p.staged_store = args.epilogue == EpilogueMode::kStore &&
                   reinterpret_cast<uintptr_t>(args.c) % 16 == 0 &&
                   (p.ldc * static_cast<int64_t>(sizeof(ElementOut))) % 16 == 0;
  p.hooks = hooks;

  auto* kernel = &gemm_kernel<Cfg, Hooks, false, false, true>;
  constexpr size_t kSmemBytes = sizeof(GroupedSharedStorage<Cfg>);
  static_assert(kSmemBytes <= 227 * 1024, "the grouped mode's table must fit beside the stages");
  // NOTE: on every launch (see launch_gemm_config)
  TL_SM90_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  kernel<<<blocks, Cfg::kNumThreads, kSmemBytes, stream>>>(p);
  TL_SM90_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail

// Checks the arguments (throws tilelink::Error), builds the TMA descriptors and launches the engine
// with `hooks` on `stream`. ElementIn: cutlass::bfloat16_t | cutlass::half_t; ElementOut:
// __nv_bfloat16 |
// __half | float; they must match args.in_type / args.out_type. kAltA: the instantiation that reads
// GemmArgs::a_alt (a second source for a band of A's rows); without it a_alt is refused.
// The configuration: gemm_tma_store_config (gemm.hpp). At one tile a block there is no next tile to
// overlap, and the fourth stage is worth ~2.7% at 512x8192x8192 (bench/notes/gemm.md, epilogue).
template <class ElementIn, class ElementOut, class Hooks, bool kAltA = false>
void launch_gemm(const GemmArgs& args, const Hooks& hooks, cudaStream_t stream) {
  gemm_check(args);
  TL_REQUIRE(
      args.in_type == detail::kDTypeOf<ElementIn> && args.out_type == detail::kDTypeOf<ElementOut>,
      "sm90 gemm: this instantiation is " << dtype_name(detail::kDTypeOf<ElementIn>) << " -> "
                                          << dtype_name(detail::kDTypeOf<ElementOut>)
                                          << ", the arguments say " << dtype_name(args.in_type)
                                          << " -> " << dtype_name(args.out_type));
  TL_REQUIRE(args.kernel != GemmKernel::kDecode,
             "sm90 gemm: launch_gemm runs the tile engine; the decode kernel is gemm()'s (kernel = "
             "kDecode)");
  TL_REQUIRE(kAltA || args.a_alt == nullptr,
             "sm90 gemm: a_alt (a second A source) needs launch_gemm<In, Out, Hooks, true>");
  // The plain engine's own tiles (kTileNFit, kTileMTall): compiled for NoHooks without a_alt only.
  constexpr bool kPlain = std::is_same_v<Hooks, NoHooks> && !kAltA;
  TL_REQUIRE(kPlain || !gemm_plain_only_tile(args.tile_m, args.tile_n),
             "sm90 gemm: tiles of " << args.tile_m << " x " << args.tile_n
                                    << " are the plain engine's (NoHooks, no a_alt); hooks and a_alt "
                                       "take 128-row tiles 256, 192, 160 or 128 wide");
  if (args.m == 0) return;  // nothing to compute; hooks are not called
  const GemmWork work = gemm_work(args, kPlain);
  GemmArgs resolved = args;  // the tile named, so the tile order does not pick it again
  resolved.tile_n = work.tile_n;
  resolved.tile_m = work.tile_m;
  const bool tma_store =
      sizeof(ElementOut) == 2 && gemm_tma_store_config(args.out_type, work.tiles, work.blocks);
  if constexpr (kPlain) {
    // never split (gemm_work), so one instance each; the tall tile stores from registers (a tile
    // in shared memory would leave room for two stages)
    if (work.tile_m == kTileMTall) {
      using Cfg = detail::GemmConfig<ElementIn, ElementOut, false, kTileNTall, kTileMTall>;
      return detail::launch_gemm_config<Cfg, Hooks, false, false>(resolved, hooks, work, stream);
    }
    if (work.tile_n == kTileNFit) {
      if constexpr (sizeof(ElementOut) == 2) {
        if (tma_store) {
          using Cfg = detail::GemmConfig<ElementIn, ElementOut, true, kTileNFit>;
          return detail::launch_gemm_config<Cfg, Hooks, false, false>(resolved, hooks, work,
                                                                      stream);
        }
      }
      using Cfg = detail::GemmConfig<ElementIn, ElementOut, false, kTileNFit>;
      return detail::launch_gemm_config<Cfg, Hooks, false, false>(resolved, hooks, work, stream);
    }
  }
  auto launch_config = [&]<bool kTmaStore, int kTileNConfig>() {
    using Cfg = detail::GemmConfig<ElementIn, ElementOut, kTmaStore, kTileNConfig>;
    if (work.split.tiles > 0) {
      detail::launch_gemm_config<Cfg, Hooks, kAltA, true>(resolved, hooks, work, stream);
    } else {
      detail::launch_gemm_config<Cfg, Hooks, kAltA, false>(resolved, hooks, work, stream);
    }
  };
  auto launch = [&]<bool kTmaStore>() {
    if (work.tile_n == kTileNNarrow) {
      launch_config.template operator()<kTmaStore, kTileNNarrow>();
    } else if (work.tile_n == kTileNLean) {
      launch_config.template operator()<kTmaStore, kTileNLean>();
    } else if (work.tile_n == kTileNSlim) {
      launch_config.template operator()<kTmaStore, kTileNSlim>();
    } else {
      launch_config.template operator()<kTmaStore, kTileN>();
    }
  };
  if constexpr (sizeof(ElementOut) == 2) {
    if (tma_store) {
      launch.template operator()<true>();
      return;
    }
  }
  launch.template operator()<false>();
}

// The grouped mode (grouped_gemm.hpp) with `hooks`: checks the arguments (throws tilelink::Error) and
// launches on `stream`. ElementIn: cutlass::bfloat16_t | cutlass::half_t; ElementOut the same width
// and kind (__nv_bfloat16 | __half), matching args.in_type / args.out_type. The grid is every SM the
// launch may use (num_sms), or fewer where no table could give that many tiles.
template <class ElementIn, class ElementOut, class Hooks>
void launch_grouped_gemm(const GroupedGemmArgs& args, const Hooks& hooks, cudaStream_t stream) {
  grouped_gemm_check(args);
  TL_REQUIRE(args.a_row_index == nullptr || !Hooks::kNotifies,
             "sm90 grouped gemm: a gathered A (a_row_index) takes no notify hook: the store warp loads A's rows");
  TL_REQUIRE(args.a_row_index == nullptr || !detail::HooksHaveSideWork<Hooks>,
             "sm90 grouped gemm: a gathered A (a_row_index) takes no side work: every producer warp loads A's rows");
  TL_REQUIRE(
      args.in_type == detail::kDTypeOf<ElementIn> && args.out_type == detail::kDTypeOf<ElementOut>,
      "sm90 grouped gemm: this instantiation is "
          << dtype_name(detail::kDTypeOf<ElementIn>) << " -> "
          << dtype_name(detail::kDTypeOf<ElementOut>) << ", the arguments say "
          << dtype_name(args.in_type) << " -> " << dtype_name(args.out_type));
  const int tile_n = grouped_gemm_tile_n(args);
  const int64_t max_tiles = grouped_gemm_max_tiles(args);
  if (max_tiles == 0) return;  // no rows: nothing to compute, hooks are not called
  int sms = args.num_sms;
  if (sms == 0) {
    int dev = 0;
    TL_SM90_CUDA_CHECK(cudaGetDevice(&dev));
    TL_SM90_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  const int blocks = static_cast<int>(max_tiles < sms ? max_tiles : sms);
  if (tile_n == kTileNSlim) {
    detail::launch_grouped_gemm_config<detail::GemmConfig<ElementIn, ElementOut, false, kTileNSlim>,
                                       Hooks>(args, hooks, tile_n, blocks, stream);
  } else {
    detail::launch_grouped_gemm_config<detail::GemmConfig<ElementIn, ElementOut, false, kTileN>,
                                       Hooks>(args, hooks, tile_n, blocks, stream);
  }
}

// The plain engine's instances (every tile of the plain engine's pick) are compiled once, in
// src/compute/sm90/gemm_<in>_<out>.cu; a translation unit that calls launch_gemm with NoHooks links
// to them.
extern template void launch_gemm<cutlass::bfloat16_t, __nv_bfloat16, NoHooks, false>(
    const GemmArgs&, const NoHooks&, cudaStream_t);
extern template void launch_gemm<cutlass::bfloat16_t, float, NoHooks, false>(const GemmArgs&,
                                                                             const NoHooks&,
                                                                             cudaStream_t);
extern template void launch_gemm<cutlass::half_t, __half, NoHooks, false>(const GemmArgs&,
                                                                         const NoHooks&,
                                                                         cudaStream_t);
extern template void launch_gemm<cutlass::half_t, float, NoHooks, false>(const GemmArgs&,
                                                                        const NoHooks&,
                                                                        cudaStream_t);

}  // namespace tilelink::compute::sm90
