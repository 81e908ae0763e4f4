// An abstract machine for the tile programs of an op: every worker of every rank is a list of steps
// (wait on some signals, act, notify some signals). The scheduler runs any enabled step of any
// worker, chosen at random, until all are done or none can move (a deadlock). Signals are monotonic
// flags for one epoch, so if one schedule finishes, every schedule does.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "../support/random.hpp"

namespace tilelink::test {

// A signal: (rank whose heap holds it, field id, slot).
struct Sig {
  int rank = 0;
  int field = 0;
  int64_t slot = 0;
  friend bool operator<(const Sig& a, const Sig& b) {
    return std::tie(a.rank, a.field, a.slot) < std::tie(b.rank, b.field, b.slot);
  }
};

struct Step {
  std::vector<Sig> waits;
  std::function<void()> act;  // may be empty; runs after the waits, before the notifies
  std::vector<Sig> notifies;
};

struct Worker {
  std::string name;
  std::vector<Step> steps;
};

class ProgramSim {
 public:
  void add(Worker w) { workers_.push_back(std::move(w)); }

  // Every signal waited on is notified by some step (a static check, before running).
  std::string unnotified_waits() const {
    std::set<Sig> notified;
    for (const auto& w : workers_)
      for (const auto& s : w.steps) notified.insert(s.notifies.begin(), s.notifies.end());
    for (const auto& w : workers_)
      for (const auto& s : w.steps)
        for (const Sig& g : s.waits)
          if (!notified.count(g)) {
            std::ostringstream os;
            os << w.name << " waits on (rank " << g.rank << ", field " << g.field << ", slot "
               << g.slot << ") that no step notifies";
            return os.str();
          }
    return "";
  }

  // Runs to completion; returns "" or a description of the deadlock.
  std::string run(Rng& rng) {
    std::vector<size_t> pc(workers_.size(), 0);
    std::set<Sig> set;
    for (;;) {
      std::vector<size_t> enabled;
      bool all_done = true;
      for (size_t w = 0; w < workers_.size(); ++w) {
        if (pc[w] == workers_[w].steps.size()) continue;
        all_done = false;
        bool ok = true;
        for (const Sig& g : workers_[w].steps[pc[w]].waits) ok = ok && set.count(g);
        if (ok) enabled.push_back(w);
      }
      if (all_done) return "";
      if (enabled.empty()) {
        std::ostringstream os;
        os << "deadlock:";
        for (size_t w = 0; w < workers_.size(); ++w)
          if (pc[w] < workers_[w].steps.size()) os << " " << workers_[w].name << "@step" << pc[w];
        return os.str();
      }
      size_t w =
          enabled[static_cast<size_t>(rng.uniform(0, static_cast<int64_t>(enabled.size()) - 1))];
      // Run a random number of steps of the chosen worker while they stay enabled.
      for (int burst = rng.uniform_int(1, 4); burst > 0 && pc[w] < workers_[w].steps.size();
           --burst) {
        Step& s = workers_[w].steps[pc[w]];
        bool ok = true;
        for (const Sig& g : s.waits) ok = ok && set.count(g);
        if (!ok) break;
        if (s.act) s.act();
        set.insert(s.notifies.begin(), s.notifies.end());
        ++pc[w];
      }
    }
  }

 private:
  std::vector<Worker> workers_;
};

}  // namespace tilelink::test
