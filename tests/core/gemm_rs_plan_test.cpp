// GemmRsPlan: reduce tiles, channels, staging layout and workspace of fused GEMM + ReduceScatter
// over random ragged shapes, and an abstract run of its tile programs (pull and push) that checks
// deadlock freedom, that every reduce reads only finished partial tiles, and that staging writes
// never collide.
#include "tilelink/ops/gemm_rs_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "../support/refused.hpp"
#include "../support/random.hpp"
#include "program_sim.hpp"
#include "tilelink/comm/reduce_scatter.hpp"
#include "tilelink/core/error.hpp"

namespace tilelink {
namespace {

struct Shape {
  RowPartition rows;
  int64_t n = 1;
  std::vector<int64_t> k;  // K_r
  DType dtype = DType::kBF16;
  GemmRsConfig cfg;
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
  s.n = rng.uniform(1, 96);
  for (int r = 0; r < world; ++r) s.k.push_back(rng.uniform(1, 96));
  s.dtype = rng.pick(std::vector<DType>{DType::kF32, DType::kBF16, DType::kF16});
  s.cfg.mode = rng.coin() ? CommMode::kPull : CommMode::kPush;
  s.cfg.comm_tile_rows = rng.coin(0.1) ? rng.uniform_int(300, 500) : rng.uniform_int(1, 64);
  s.cfg.comm_tile_cols = rng.coin(0.2) ? 512 : rng.uniform_int(1, 48);
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
  os << "] n " << s.n << " " << dtype_name(s.dtype)
     << (s.cfg.mode == CommMode::kPull ? " pull" : " push") << " reduce " << s.cfg.comm_tile_rows
     << "x" << s.cfg.comm_tile_cols << " gemm " << s.cfg.gemm_tile_m << "x" << s.cfg.gemm_tile_n
     << " group " << s.cfg.group_m << " workers " << s.cfg.comm_workers << "+"
     << s.cfg.compute_workers;
  return os.str();
}

std::vector<GemmRsPlan> make_plans(const Shape& s) {
  std::vector<GemmRsPlan> plans;
  for (int r = 0; r < s.rows.world_size; ++r)
    plans.push_back(GemmRsPlan::make(r, s.rows, s.n, s.k[r], s.dtype, s.cfg));
  return plans;
}

// The reduce walk follows the GEMM: with reduce tiles on gemm tile rows and segments made of whole
// groups (the engine's case: 128-row tiles, M = 8192 over 2 or 4 ranks, group_m 16 of 64 tile rows),
// the reduce tiles come in the order the rank's own gemm tiles finish them. The row-major walk did
// not: a worker taking every 16th reduce tile kept one column block and waited for the end of each
// group (bench/notes/fused_ops_cuda.md, the reduce walks the GEMM's order).
TEST(GemmRsPlan, ReduceWalkFollowsTheOwnGemmTiles) {
  for (int world : {2, 4}) {
    for (int group : {1, 4, 16}) {
      if (64 / world % group != 0) continue;
      GemmRsConfig cfg;
      cfg.gemm_tile_m = 128;
      cfg.gemm_tile_n = 256;
      cfg.comm_tile_rows = 128;
      cfg.comm_tile_cols = 512;
      cfg.group_m = group;
      const RowPartition rows = RowPartition::even(8192, world);
      for (int rank = 0; rank < world; ++rank) {
        SCOPED_TRACE(testing::Message() << "world " << world << " group " << group << " rank " << rank);
        const GemmRsPlan p = GemmRsPlan::make(rank, rows, 8192, 4096, DType::kBF16, cfg);
        std::vector<int> finished_at(static_cast<size_t>(p.gemm.num_tiles()));
        for (int i = 0; i < p.compute_order.count(); ++i) finished_at[p.gemm.linear(p.compute_order.at(i))] = i;
        int last = -1;
        for (int i = 0; i < p.rs.count(); ++i) {
          const TileSpan span = p.rs.producer.covering(p.rs.band(i));
          int ready = -1;  // when the last own gemm tile covering reduce tile i finishes
          for (int m = span.m_begin; m < span.m_end; ++m)
            for (int n = span.n_begin; n < span.n_end; ++n) ready = std::max(ready, finished_at[p.gemm.linear({m, n})]);
          ASSERT_GE(ready, last) << "reduce tile " << i << " is ready before the one walked before it";
          last = ready;
        }
      }
    }
  }
}

// Every owner's gemm tiles finish at the same pace through the walk, on every rank: after each
// group of the compute order (segments of whole tile rows), every segment has the same number of
// tiles done. The staggered order finished one owner's tiles only in the last 1/W of a rank's walk.
TEST(GemmRsPlan, EveryOwnersTilesFinishAtAnEvenPace) {
  for (int world : {2, 3, 4, 8}) {
    for (int group : {1, 2, 4, 16}) {
      for (int64_t rows_per_rank : {128, 1024, 4096}) {
        GemmRsConfig cfg;
        cfg.gemm_tile_m = 128;
        cfg.gemm_tile_n = 256;
        cfg.group_m = group;
        const RowPartition rows = RowPartition::even(rows_per_rank * world, world);
        SCOPED_TRACE(testing::Message()
                     << "world " << world << " group " << group << " rows " << rows_per_rank);
        const GemmRsPlan first = GemmRsPlan::make(0, rows, 2048, 1024, DType::kBF16, cfg);
        for (int rank = 1; rank < world; ++rank) {
          const GemmRsPlan p = GemmRsPlan::make(rank, rows, 2048, 1024, DType::kBF16, cfg);
          for (int i = 0; i < p.compute_order.count(); ++i)
            ASSERT_EQ(p.compute_order.at(i), first.compute_order.at(i));
        }
        const TileOrder& o = first.compute_order;
        const int64_t per_group = static_cast<int64_t>(o.group_m) * o.tiles_n;
        std::vector<int64_t> done(static_cast<size_t>(world), 0);
        for (int i = 0; i < o.count(); ++i) {
          ++done[static_cast<size_t>(rows.owner_of_row(first.gemm.region(o.at(i)).row))];
          if ((i + 1) % per_group != 0 && i + 1 != o.count()) continue;
          for (int s = 1; s < world; ++s) {
            ASSERT_EQ(done[s], done[0]) << "after " << i + 1 << " tiles";
          }
        }
      }
    }
  }
}

TEST(GemmRsPlan, ReduceTilesPartitionEachSegmentExactly) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    Shape s = random_shape(rng);
    SCOPED_TRACE(describe(s));
    std::vector<int> reduced(static_cast<size_t>(s.rows.total() * s.n), 0);
    for (const GemmRsPlan& p : make_plans(s)) {
      ASSERT_EQ(p.compute_order.count(), p.gemm.num_tiles());
      // The same banded order on every rank (one band a segment), groups of whole turns.
      ASSERT_EQ(p.compute_order.bands, p.world_size);
      ASSERT_EQ(p.compute_order.start_m, 0);
      ASSERT_EQ(p.compute_order.group_m % p.world_size, 0);
      ASSERT_GE(p.compute_order.group_m, s.cfg.group_m);
      for (int i = 0; i < p.rs.count(); ++i) {
        Rect r = p.rs.band(i);
        ASSERT_FALSE(r.empty()) << "rank " << p.rank << " reduce tile " << i;
        ASSERT_GE(r.row, s.rows.begin(p.rank));
        ASSERT_LE(r.row + r.rows, s.rows.end(p.rank));
        ASSERT_GE(r.col, 0);
        ASSERT_LE(r.col + r.cols, s.n);
        ASSERT_LE(r.rows, s.cfg.comm_tile_rows);
        ASSERT_LE(r.cols, s.cfg.comm_tile_cols);
        for (int64_t a = r.row; a < r.row + r.rows; ++a)
          for (int64_t b = r.col; b < r.col + r.cols; ++b) ++reduced[a * s.n + b];
        // waits_for: exactly the gemm tiles intersecting the region.
        TileSpan span = p.rs.producer.covering(r);
        for (int id = 0; id < p.gemm.num_tiles(); ++id) {
          TileCoord c = p.gemm.coord(id);
          Rect g = p.gemm.region(c);
          bool hit = g.row < r.row + r.rows && r.row < g.row + g.rows && g.col < r.col + r.cols &&
                     r.col < g.col + g.cols;
          bool in =
              c.m >= span.m_begin && c.m < span.m_end && c.n >= span.n_begin && c.n < span.n_end;
          ASSERT_EQ(hit, in) << "reduce tile " << i << " gemm tile " << id;
        }
      }
      // Every output element of the partial produced once by the compute order.
      std::vector<int> produced(static_cast<size_t>(p.m() * p.n), 0);
      for (int i = 0; i < p.compute_order.count(); ++i) {
        Rect g = p.gemm.region(p.compute_order.at(i));
        for (int64_t a = g.row; a < g.row + g.rows; ++a)
          for (int64_t b = g.col; b < g.col + g.cols; ++b) ++produced[a * p.n + b];
      }
      for (int v : produced) {
        ASSERT_EQ(v, 1);
      }
    }
    for (size_t e = 0; e < reduced.size(); ++e) {
      ASSERT_EQ(reduced[e], 1) << "element " << e;
    }
  }
}

TEST(GemmRsPlan, StagingSlotsAndOffsetsAreUniqueAndInRange) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 200; ++iter) {
    Shape s = random_shape(rng);
    s.cfg.mode = CommMode::kPush;
    SCOPED_TRACE(describe(s));
    auto plans = make_plans(s);
    const GemmRsPlan& p0 = plans[0];
    const int world = s.rows.world_size;
    std::set<int> slots;
    for (int src = 0; src < world; ++src)
      for (int t = 0; t < p0.gemm.num_tiles(); ++t) {
        int slot = p0.rs.staged_slot(src, t);
        ASSERT_GE(slot, 0);
        ASSERT_LT(slot, p0.rs.f.staged.count);
        ASSERT_TRUE(slots.insert(slot).second) << "slot " << slot << " repeats";
      }
    // Every (source, row of the owner's segment, column) lands on its own staging element.
    const int64_t staging_elems = p0.rs.f.staging.count / dtype_size(s.dtype);
    for (int owner = 0; owner < world; ++owner) {
      std::vector<char> used(static_cast<size_t>(staging_elems), 0);
      for (int src = 0; src < world; ++src)
        for (int64_t row = s.rows.begin(owner); row < s.rows.end(owner); ++row)
          for (int64_t col = 0; col < s.n; ++col) {
            int64_t off = plans[src].rs.staging_offset_elems(src, row, owner) + col;
            ASSERT_GE(off, 0);
            ASSERT_LT(off, staging_elems) << "src " << src << " row " << row << " owner " << owner;
            ASSERT_FALSE(used[off]) << "staging element " << off << " written twice";
            used[off] = 1;
          }
    }
  }
}

TEST(GemmRsPlan, WorkspaceIsSymmetricAlignedAndDisjoint) {
  TL_SEEDED_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    Shape s = random_shape(rng);
    SCOPED_TRACE(describe(s));
    auto plans = make_plans(s);
    const GemmRsWorkspace& w = plans[0].ws;
    const ReduceScatterFields& f = plans[0].rs.f;
    const int64_t eb = dtype_size(s.dtype), tiles = plans[0].gemm.num_tiles();
    const int world = s.rows.world_size;
    if (s.cfg.mode == CommMode::kPull) {
      ASSERT_EQ(f.tile_done.count, tiles);
      ASSERT_EQ(f.claims.count, 1);
      ASSERT_EQ(f.partial.count, s.rows.total() * s.n * eb);
    } else {
      ASSERT_EQ(f.staged.count, world * tiles);
      ASSERT_EQ(f.staging.count, world * s.rows.max_size() * s.n * eb);
    }
    ASSERT_EQ(w.barrier.count, world);
    struct Span {
      uint64_t b, e;
    };
    std::vector<Span> spans = {{f.tile_done.offset, f.tile_done.offset + f.tile_done.num_bytes()},
                               {f.staged.offset, f.staged.offset + f.staged.num_bytes()},
                               {w.barrier.offset, w.barrier.offset + w.barrier.num_bytes()},
                               {f.claims.offset, f.claims.offset + f.claims.num_bytes()},
                               {f.partial.offset, f.partial.offset + f.partial.num_bytes()},
                               {f.staging.offset, f.staging.offset + f.staging.num_bytes()}};
    for (size_t i = 0; i < spans.size(); ++i) {
      ASSERT_EQ(spans[i].b % 256, 0u);
      ASSERT_LE(spans[i].e, w.num_bytes);
      for (size_t j = 0; j < i; ++j)
        if (spans[i].e > spans[i].b && spans[j].e > spans[j].b) {
          ASSERT_TRUE(spans[i].e <= spans[j].b || spans[j].e <= spans[i].b)
              << "fields " << i << ", " << j;
        }
    }
    for (const GemmRsPlan& p : plans) {
      ASSERT_EQ(p.ws.num_bytes, w.num_bytes);
      for (auto [a, b] : {std::pair{p.rs.f.tile_done, f.tile_done}, std::pair{p.rs.f.staged, f.staged},
                          std::pair{p.ws.barrier, w.barrier}}) {
        ASSERT_EQ(a.offset, b.offset);
        ASSERT_EQ(a.count, b.count);
      }
      ASSERT_EQ(p.rs.f.claims.offset, f.claims.offset);
      ASSERT_EQ(p.rs.f.claims.count, f.claims.count);
      for (auto [a, b] : {std::pair{p.rs.f.partial, f.partial}, std::pair{p.rs.f.staging, f.staging}}) {
        ASSERT_EQ(a.offset, b.offset);
        ASSERT_EQ(a.count, b.count);
      }
    }
  }
}

// The ReduceScatter's program as a simulator step: its waits recorded (field ids kTileDone = 0,
// kStaged = 1); its buffers fake addresses, never read.
struct SimExec {
  test::Step step{};
  int sums = 0;
  static std::byte* fake(int r) { return reinterpret_cast<std::byte*>(uintptr_t(r + 1) << 40); }
  std::byte* local(ByteField) const { return fake(0); }
  std::byte* peer(int r, ByteField) const { return fake(r); }
  template <class Fn>
  void wait_each(int count, Fn&& at, Field<Signal>, uint64_t, SignalField name) {
    for (int w = 0; w < count; ++w) {
      int holder = 0, slot = 0, tile = 0;
      at(w, &holder, &slot, &tile);
      step.waits.push_back({holder, name == SignalField::kTileDone ? 0 : 1, slot});
    }
  }
  template <class Src>
  void sum(int, Src&&, int64_t, void*, int64_t, int64_t, int64_t, DType) {
    ++sums;
  }
};

// The programs of src/ops/cpu/gemm_rs.cpp (the reduce: comm/reduce_scatter.hpp, what every
// backend runs), one epoch, on the abstract machine.
TEST(GemmRsPlan, ProgramsFinishAndReduceOnlyFinishedPartials) {
  TL_SEEDED_RNG(rng);
  enum { kTileDone = 0, kStaged = 1 };
  for (int iter = 0; iter < 300; ++iter) {
    Shape s = random_shape(rng);
    SCOPED_TRACE(describe(s));
    auto plans = make_plans(s);
    const int world = s.rows.world_size;
    const int tiles = plans[0].gemm.num_tiles();
    const bool push = s.cfg.mode == CommMode::kPush;
    const int64_t staging_elems = plans[0].rs.f.staging.count / dtype_size(s.dtype);
    std::vector<std::vector<char>> done(world, std::vector<char>(tiles, 0));  // pull: partial tiles
    // push: staging[owner][element] = 1 + (src, row, col) encoded, 0 if unwritten
    std::vector<std::vector<int64_t>> staging(
        world, std::vector<int64_t>(static_cast<size_t>(staging_elems), 0));
    auto code = [&](int src, int64_t row, int64_t col) {
      return 1 + (src * s.rows.total() + row) * s.n + col;
    };
    std::vector<int> reduced(static_cast<size_t>(s.rows.total() * s.n), 0);
    std::vector<std::string> errors;
    test::ProgramSim sim;
    for (const GemmRsPlan& p : plans) {
      const GemmRsPlan* pp = &p;
      const int r = p.rank, cw = p.config.comm_workers, kw = p.config.compute_workers;
      for (int w = 0; w < kw; ++w) {
        test::Worker wk{"rank " + std::to_string(r) + " compute " + std::to_string(w), {}};
        for (int i = w; i < p.compute_order.count(); i += kw) {
          TileCoord tile = p.compute_order.at(i);
          Rect g = p.gemm.region(tile);
          const int t = p.gemm.linear(tile);
          test::Step st;
          if (!push) {
            st.act = [&, r, t] { done[r][t] = 1; };
            st.notifies.push_back({r, kTileDone, t});
          } else {
            // The owners this tile's rows belong to, walked as compute_push walks them.
            std::set<int> walked, want;
            for (int owner = p.rows.owner_of_row(g.row); owner < world; ++owner) {
              int64_t lo = std::max(g.row, p.rows.begin(owner)),
                      hi = std::min(g.row + g.rows, p.rows.end(owner));
              if (p.rows.begin(owner) >= g.row + g.rows) break;
              if (hi <= lo) continue;
              walked.insert(owner);
            }
            for (int owner = 0; owner < world; ++owner)
              if (std::max(g.row, p.rows.begin(owner)) <
                  std::min(g.row + g.rows, p.rows.end(owner)))
                want.insert(owner);
            ASSERT_EQ(walked, want) << "rank " << r << " gemm tile " << t;
            for (int owner : walked) st.notifies.push_back({owner, kStaged, p.rs.staged_slot(r, t)});
            st.act = [&, pp, r, g, walked] {
              for (int owner : walked)
                for (int64_t row = std::max(g.row, pp->rows.begin(owner));
                     row < std::min(g.row + g.rows, pp->rows.end(owner)); ++row)
                  for (int64_t col = g.col; col < g.col + g.cols; ++col) {
                    int64_t off = pp->rs.staging_offset_elems(r, row, owner) + col;
                    if (off < 0 || off >= staging_elems) {
                      errors.push_back("staging offset out of range");
                      continue;
                    }
                    if (staging[owner][off]) errors.push_back("staging element written twice");
                    staging[owner][off] = code(r, row, col);
                  }
            };
          }
          wk.steps.push_back(std::move(st));
        }
        sim.add(std::move(wk));
      }
      for (int w = 0; w < cw; ++w) {
        test::Worker wk{"rank " + std::to_string(r) + " reduce " + std::to_string(w), {}};
        for (int i = w; i < p.rs.count(); i += cw) {
          // The waits of the ReduceScatter's program itself (comm/reduce_scatter.hpp).
          SimExec x;
          reduce_scatter_item(x, p.rs, i, 1, SimExec::fake(0));
          test::Step st = std::move(x.step);
          EXPECT_EQ(x.sums, 1);
          const Rect reg = p.rs.band(i);
          st.act = [&, pp, r, reg] {
            for (int64_t row = reg.row; row < reg.row + reg.rows; ++row)
              for (int64_t col = reg.col; col < reg.col + reg.cols; ++col) {
                ++reduced[row * pp->n + col];
                for (int src = 0; src < world; ++src) {
                  if (push) {
                    int64_t off = pp->rs.staging_offset_elems(src, row, r) + col;
                    if (staging[r][off] != code(src, row, col))
                      errors.push_back("reduce read an unstaged element");
                  } else if (!done[src]
                                  [pp->gemm.linear({static_cast<int>(row / pp->gemm.tile_m),
                                                    static_cast<int>(col / pp->gemm.tile_n)})]) {
                    errors.push_back("reduce read an unfinished partial tile");
                  }
                }
              }
          };
          wk.steps.push_back(std::move(st));
        }
        sim.add(std::move(wk));
      }
    }
    ASSERT_EQ(sim.unnotified_waits(), "");
    ASSERT_EQ(sim.run(rng), "");
    ASSERT_TRUE(errors.empty()) << errors.front();
    for (size_t e = 0; e < reduced.size(); ++e) {
      ASSERT_EQ(reduced[e], 1) << "element " << e;
    }
  }
}

TEST(GemmRsPlan, RefusesBadInput) {
  RowPartition rows = RowPartition::even(10, 2);
  GemmRsConfig cfg;
  test::expect_refused([&] { GemmRsPlan::make(0, rows, 8, 0, DType::kBF16, cfg); }, "K must be >= 1");
  test::expect_refused([&] { GemmRsPlan::make(0, rows, 0, 8, DType::kBF16, cfg); }, "N must be >= 1");
  test::expect_refused([&] { GemmRsPlan::make(5, rows, 8, 8, DType::kBF16, cfg); }, "rank 5");
  test::expect_refused([&] { GemmRsPlan::make(0, RowPartition::even(0, 2), 8, 8, DType::kBF16, cfg); },
               "M must be >= 1");
  for (int GemmRsConfig::*f :
       {&GemmRsConfig::comm_tile_rows, &GemmRsConfig::comm_tile_cols, &GemmRsConfig::gemm_tile_m,
        &GemmRsConfig::gemm_tile_n, &GemmRsConfig::group_m}) {
    GemmRsConfig bad = cfg;
    bad.*f = 0;
    test::expect_refused([&] { GemmRsPlan::make(0, rows, 8, 8, DType::kBF16, bad); },
                 "must be in [1, 2^20]");
  }
  GemmRsConfig neg = cfg;
  neg.compute_workers = -2;
  test::expect_refused([&] { GemmRsPlan::make(0, rows, 8, 8, DType::kBF16, neg); }, "worker counts");
}

}  // namespace
}  // namespace tilelink
