// AgGemmPlan: the mappings, orders and workspace of fused AllGather + GEMM over random ragged
// shapes, and an abstract run of its tile programs (as the CPU backend and the CUDA kernels walk
// them) that checks deadlock freedom and that every gemm tile reads only rows that have arrived.
#include "tilelink/ops/ag_gemm_plan.hpp"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "../support/refused.hpp"
#include "../support/random.hpp"
#include "program_sim.hpp"
#include "tilelink/comm/allgather.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink {
namespace {

struct Shape {
  RowPartition rows;
  std::vector<int64_t> n;  // N_r
  int64_t k = 1;
  DType dtype = DType::kBF16;
  AgGemmConfig cfg;
};

Shape random_shape(test::Rng& rng) {
  Shape s;
  int world = rng.uniform_int(1, 8);
  int64_t m = rng.coin(0.1) ? rng.uniform_int(1, 3) : rng.uniform(1, 300);
  if (rng.coin(0.4)) {
    s.rows = RowPartition::even(m, world);
  } else {
    auto c = rng.uneven_counts(m, world);
    s.rows = RowPartition::from_counts(c);
  }
  for (int r = 0; r < world; ++r) s.n.push_back(rng.uniform(1, 96));
  s.k = rng.uniform(1, 96);
  s.dtype = rng.pick(std::vector<DType>{DType::kF32, DType::kBF16, DType::kF16});
  s.cfg.mode = rng.coin() ? CommMode::kPull : CommMode::kPush;
  s.cfg.comm_tile_rows = rng.coin(0.1) ? rng.uniform_int(300, 500) : rng.uniform_int(1, 64);
  s.cfg.gemm_tile_m = rng.uniform_int(1, 64);
  s.cfg.gemm_tile_n = rng.uniform_int(1, 48);
  s.cfg.group_m = rng.uniform_int(1, 4);
  s.cfg.comm_workers = rng.uniform_int(1, 3);
  s.cfg.compute_workers = rng.uniform_int(1, 3);
  return s;
}

std::string describe(const Shape& s) {
  std::ostringstream os;
  os << "world " << s.rows.world_size << " counts [";
  for (int r = 0; r < s.rows.world_size; ++r) os << (r ? " " : "") << s.rows.size(r);
  os << "] k " << s.k << " " << dtype_name(s.dtype)
     << (s.cfg.mode == CommMode::kPull ? " pull" : " push") << " comm_rows " << s.cfg.comm_tile_rows
     << " gemm " << s.cfg.gemm_tile_m << "x" << s.cfg.gemm_tile_n << " group " << s.cfg.group_m
     << " workers " << s.cfg.comm_workers << "+" << s.cfg.compute_workers;
  return os.str();
}

std::vector<AgGemmPlan> make_plans(const Shape& s) {
  std::vector<AgGemmPlan> plans;
  for (int r = 0; r < s.rows.world_size; ++r)
    plans.push_back(AgGemmPlan::make(r, s.rows, s.n[r], s.k, s.dtype, s.cfg));
  return plans;
}

TEST(AgGemmPlan, ComputeOrderProducesEveryOutputElementOnce) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    Shape s = random_shape(rng);
    SCOPED_TRACE(describe(s));
    for (const AgGemmPlan& p : make_plans(s)) {
      ASSERT_EQ(p.m(), s.rows.total());
      ASSERT_EQ(p.compute_order.count(), p.gemm.num_tiles());
      ASSERT_EQ(p.compute_order.at(0).m,
                first_tile_row_of_segment(s.rows, p.rank, s.cfg.gemm_tile_m));
      std::vector<int> produced(static_cast<size_t>(p.m() * p.n), 0);
      for (int i = 0; i < p.compute_order.count(); ++i) {
        Rect r = p.gemm.region(p.compute_order.at(i));
        ASSERT_FALSE(r.empty());
        ASSERT_LE(r.row + r.rows, p.m());
        ASSERT_LE(r.col + r.cols, p.n);
        for (int64_t a = r.row; a < r.row + r.rows; ++a)
          for (int64_t b = r.col; b < r.col + r.cols; ++b) ++produced[a * p.n + b];
      }
      for (size_t e = 0; e < produced.size(); ++e) {
        ASSERT_EQ(produced[e], 1) << "rank " << p.rank << " element " << e;
      }
      // Local first: if a gemm tile row starts inside the rank's segment, the walk starts there.
      int64_t row0 = p.gemm.region(p.compute_order.at(0)).row;
      bool some_row_starts_inside = false;
      for (int m = 0; m < p.gemm.tiles_m(); ++m) {
        int64_t b = static_cast<int64_t>(m) * p.gemm.tile_m;
        some_row_starts_inside |= b >= s.rows.begin(p.rank) && b < s.rows.end(p.rank);
      }
      if (some_row_starts_inside) {
        ASSERT_GE(row0, s.rows.begin(p.rank));
        ASSERT_LT(row0, s.rows.end(p.rank));
      }
    }
  }
}

TEST(AgGemmPlan, WaitsForCoversExactlyTheRowsATileReads) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    Shape s = random_shape(rng);
    SCOPED_TRACE(describe(s));
    for (const AgGemmPlan& p : make_plans(s)) {
      for (int id = 0; id < p.gemm.num_tiles(); ++id) {
        TileCoord t = p.gemm.coord(id);
        Rect r = p.gemm.region(t);
        IdRange w = p.waits_for(t);
        ASSERT_GE(w.begin, 0);
        ASSERT_LE(w.end, p.ag.tiles.num_tiles());
        // Every row the tile reads lies in a waited tile; every waited tile holds a row it reads.
        for (int64_t row = r.row; row < r.row + r.rows; ++row) {
          int ct = p.ag.tiles.tile_of_row(row);
          ASSERT_TRUE(ct >= w.begin && ct < w.end) << "tile " << id << " row " << row;
        }
        for (int ct = w.begin; ct < w.end; ++ct) {
          RowRange rr = p.ag.tiles.rows_of(ct);
          ASSERT_TRUE(rr.begin < r.row + r.rows && r.row < rr.end)
              << "tile " << id << " waits on comm tile " << ct << " it does not read";
        }
      }
    }
  }
}

TEST(AgGemmPlan, CommOrdersVisitEveryTileOnceOwnFirst) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    Shape s = random_shape(rng);
    SCOPED_TRACE(describe(s));
    for (const AgGemmPlan& p : make_plans(s)) {
      const int n_tiles = p.ag.tiles.num_tiles(), own = p.ag.tiles.tiles_of(p.rank);
      std::vector<int> seen(static_cast<size_t>(n_tiles), 0);
      for (int i = 0; i < n_tiles; ++i) {
        int t = p.ag.pull_tile_at(i);
        ASSERT_GE(t, 0);
        ASSERT_LT(t, n_tiles);
        ++seen[t];
        if (i < own) {
          ASSERT_EQ(p.ag.tiles.rank_of(t), p.rank) << "pull step " << i << " is not an own tile";
        }
      }
      for (int v : seen) {
        ASSERT_EQ(v, 1);
      }
      // Push: every (peer, own tile) once, to itself first.
      AllGatherPlan push = p.ag;
      push.mode = CommMode::kPush;
      ASSERT_EQ(push.count(), own * p.world_size);
      std::set<std::pair<int, int>> pushed;
      for (int i = 0; i < push.count(); ++i) {
        int peer = -1, t = -1;
        push.push_at(i, &peer, &t);
        ASSERT_GE(peer, 0);
        ASSERT_LT(peer, p.world_size);
        ASSERT_EQ(p.ag.tiles.rank_of(t), p.rank);
        ASSERT_TRUE(pushed.insert({peer, t}).second) << "push step " << i << " repeats";
        if (i < own) {
          ASSERT_EQ(peer, p.rank);
        }
      }
      ASSERT_EQ(static_cast<int>(pushed.size()), own * p.world_size);
    }
  }
}

TEST(AgGemmPlan, WorkspaceIsSymmetricAlignedAndDisjoint) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    Shape s = random_shape(rng);
    SCOPED_TRACE(describe(s));
    auto plans = make_plans(s);
    const AgGemmWorkspace& w0 = plans[0].ws;
    const AllGatherFields& f0 = plans[0].ag.f;
    ASSERT_EQ(f0.tile_ready.count, plans[0].ag.tiles.num_tiles());
    ASSERT_EQ(w0.barrier.count, s.rows.world_size);
    ASSERT_EQ(f0.gathered.count, s.rows.total() * s.k * dtype_size(s.dtype));
    struct Span {
      uint64_t b, e;
    };
    std::vector<Span> spans = {
        {f0.tile_ready.offset, f0.tile_ready.offset + f0.tile_ready.num_bytes()},
        {w0.barrier.offset, w0.barrier.offset + w0.barrier.num_bytes()},
        {f0.gathered.offset, f0.gathered.offset + f0.gathered.num_bytes()}};
    for (size_t i = 0; i < spans.size(); ++i) {
      ASSERT_EQ(spans[i].b % 256, 0u);
      ASSERT_LE(spans[i].e, w0.num_bytes);
      for (size_t j = 0; j < i; ++j) {
        ASSERT_TRUE(spans[i].e <= spans[j].b || spans[j].e <= spans[i].b);
      }
    }
    for (const AgGemmPlan& p : plans) {
      ASSERT_EQ(p.ws.num_bytes, w0.num_bytes) << "rank " << p.rank;
      ASSERT_EQ(p.ag.f.tile_ready.offset, f0.tile_ready.offset);
      ASSERT_EQ(p.ag.f.tile_ready.count, f0.tile_ready.count);
      ASSERT_EQ(p.ws.barrier.offset, w0.barrier.offset);
      ASSERT_EQ(p.ws.barrier.count, w0.barrier.count);
      ASSERT_EQ(p.ag.f.gathered.offset, f0.gathered.offset);
      ASSERT_EQ(p.ag.f.gathered.count, f0.gathered.count);
    }
  }
}

// The AllGather's program as the simulator's steps: an executor (comm/allgather.hpp) whose
// buffers are fake addresses that encode (rank, buffer, row), so each move can be checked.
// Each item of the program (wait, move, notify) becomes one step.
constexpr int kTileReady = 0;
struct SimExec {
  int rank = 0;
  int64_t row_bytes = 1;
  test::Step cur{};
  std::vector<Copy2D> moves{};
  // Rank r's gathered buffer at (r + 1) << 40, its rows A_r at (r + 1 + kMaxWorldSize) << 40.
  static std::byte* gathered_of(int r) { return reinterpret_cast<std::byte*>(uintptr_t(r + 1) << 40); }
  static const void* rows_of(int r) { return reinterpret_cast<const void*>(uintptr_t(r + 1 + kMaxWorldSize) << 40); }
  std::byte* local(ByteField) const { return gathered_of(rank); }
  std::byte* peer(int r, ByteField) const { return gathered_of(r); }
  void barrier(Field<Signal>, uint64_t) {}
  void wait(int owner, Field<Signal>, int slot, uint64_t, WaitSite site) {
    EXPECT_EQ(site.field, SignalField::kTileReady);
    cur.waits.push_back({owner, kTileReady, slot});
  }
  void pull(int, const Copy2D& c) { moves.push_back(c); }
  void push(int, const Copy2D& c) { moves.push_back(c); }
  void notify_local(Field<Signal>, int slot, uint64_t) { cur.notifies.push_back({rank, kTileReady, slot}); }
  void notify_peer(int peer, Field<Signal>, int slot, uint64_t) { cur.notifies.push_back({peer, kTileReady, slot}); }
};

// The programs of comm/allgather.hpp (what every executor runs) and of the compute side, one epoch,
// on the abstract machine. `have[r][t]`: comm tile t's rows sit in rank r's gathered buffer.
TEST(AgGemmPlan, ProgramsFinishAndReadOnlyArrivedRows) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    Shape s = random_shape(rng);
    SCOPED_TRACE(describe(s));
    auto plans = make_plans(s);
    const int world = s.rows.world_size, n_tiles = plans[0].ag.tiles.num_tiles();
    std::vector<std::vector<char>> have(world, std::vector<char>(n_tiles, 0));
    std::vector<std::vector<int>> produced(world);
    std::vector<std::string> errors;
    test::ProgramSim sim;
    // Decodes a fake address: (rank, is A_r, row) of the buffer it points into.
    auto decode = [&](const void* ptr, int64_t rb, int* r, bool* own_rows, int64_t* row) {
      const uintptr_t v = reinterpret_cast<uintptr_t>(ptr);
      const int slot = static_cast<int>(v >> 40) - 1;
      *own_rows = slot >= kMaxWorldSize;
      *r = *own_rows ? slot - kMaxWorldSize : slot;
      *row = static_cast<int64_t>(v & ((uintptr_t(1) << 40) - 1)) / rb;
      if (*own_rows) *row += s.rows.begin(*r);  // A_r's row 0 is global row begin(r)
    };
    for (const AgGemmPlan& p : plans) {
      const int r = p.rank, cw = p.config.comm_workers, kw = p.config.compute_workers;
      produced[r].assign(static_cast<size_t>(p.m() * p.n), 0);
      for (int w = 0; w < cw; ++w) {
        test::Worker wk{"rank " + std::to_string(r) + " comm " + std::to_string(w), {}};
        for (int i = w; i < p.ag.count(); i += cw) {
          SimExec x{r, p.ag.row_bytes};
          allgather_item(x, p.ag, i, 1, SimExec::rows_of(r));
          test::Step st = std::move(x.cur);
          const AgGemmPlan* pp = &p;
          st.act = [&, pp, moves = x.moves] {
            for (const Copy2D& c : moves) {
              int src_rank = 0, dst_rank = 0;
              bool src_own = false, dst_own = false;
              int64_t src_row = 0, dst_row = 0;
              decode(c.src, pp->ag.row_bytes, &src_rank, &src_own, &src_row);
              decode(c.dst, pp->ag.row_bytes, &dst_rank, &dst_own, &dst_row);
              if (dst_own || src_row != dst_row || c.row_bytes != pp->ag.row_bytes) {
                errors.push_back("a move that is not rows into a gathered buffer");
                continue;
              }
              if (src_own && src_rank != pp->rank) errors.push_back("a move from another rank's A");
              for (int64_t row = dst_row; row < dst_row + c.rows; ++row) {
                const int t = pp->ag.tiles.tile_of_row(row);
                if (!src_own && !have[src_rank][t])
                  errors.push_back("rank " + std::to_string(pp->rank) + " moved row " + std::to_string(row) +
                                   " from rank " + std::to_string(src_rank) + " before it arrived there");
                if (src_own && pp->ag.tiles.rank_of(t) != pp->rank) errors.push_back("own rows of another rank");
                have[dst_rank][t] = 1;
              }
            }
          };
          wk.steps.push_back(std::move(st));
        }
        sim.add(std::move(wk));
      }
      for (int w = 0; w < kw; ++w) {
        test::Worker wk{"rank " + std::to_string(r) + " compute " + std::to_string(w), {}};
        for (int i = w; i < p.compute_order.count(); i += kw) {
          TileCoord tile = p.compute_order.at(i);
          test::Step st;
          IdRange waits = p.waits_for(tile);
          for (int t = waits.begin; t < waits.end; ++t) st.waits.push_back({r, kTileReady, t});
          const AgGemmPlan* pp = &p;
          st.act = [&, pp, r, tile] {
            Rect reg = pp->gemm.region(tile);
            for (int64_t row = reg.row; row < reg.row + reg.rows; ++row)
              if (!have[r][pp->ag.tiles.tile_of_row(row)])
                errors.push_back("rank " + std::to_string(r) + " read row " + std::to_string(row) +
                                 " before it arrived");
            for (int64_t a = reg.row; a < reg.row + reg.rows; ++a)
              for (int64_t b = reg.col; b < reg.col + reg.cols; ++b) ++produced[r][a * pp->n + b];
          };
          wk.steps.push_back(std::move(st));
        }
        sim.add(std::move(wk));
      }
    }
    ASSERT_EQ(sim.unnotified_waits(), "");
    ASSERT_EQ(sim.run(rng), "");
    ASSERT_TRUE(errors.empty()) << errors.front();
    for (int r = 0; r < world; ++r) {
      for (int t = 0; t < n_tiles; ++t) {
        ASSERT_TRUE(have[r][t]) << "rank " << r << " never got tile " << t;
      }
      for (int v : produced[r]) {
        ASSERT_EQ(v, 1);
      }
    }
  }
}

TEST(AgGemmPlan, RefusesBadInput) {
  RowPartition rows = RowPartition::even(10, 2);
  AgGemmConfig cfg;
  test::expect_refused([&] { AgGemmPlan::make(0, rows, 8, 0, DType::kBF16, cfg); }, "K must be >= 1");
  test::expect_refused([&] { AgGemmPlan::make(0, rows, 0, 8, DType::kBF16, cfg); }, "N must be >= 1");
  test::expect_refused([&] { AgGemmPlan::make(2, rows, 8, 8, DType::kBF16, cfg); }, "rank 2");
  test::expect_refused([&] { AgGemmPlan::make(-1, rows, 8, 8, DType::kBF16, cfg); }, "rank -1");
  test::expect_refused([&] { AgGemmPlan::make(0, RowPartition::even(0, 2), 8, 8, DType::kBF16, cfg); },
               "M must be >= 1");
  for (int AgGemmConfig::*f : {&AgGemmConfig::comm_tile_rows, &AgGemmConfig::gemm_tile_m,
                               &AgGemmConfig::gemm_tile_n, &AgGemmConfig::group_m}) {
    AgGemmConfig bad = cfg;
    bad.*f = 0;
    test::expect_refused([&] { AgGemmPlan::make(0, rows, 8, 8, DType::kBF16, bad); },
                 "must be in [1, 2^20]");
  }
  AgGemmConfig neg = cfg;
  neg.comm_workers = -1;
  test::expect_refused([&] { AgGemmPlan::make(0, rows, 8, 8, DType::kBF16, neg); }, "worker counts");
}

}  // namespace
}  // namespace tilelink
