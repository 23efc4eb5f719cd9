// What the allocator's randomized tests (milp_test, decomposition_test) share:
// the generator of throughput curves, so that both explore the same kind of
// instance, and the exhaustive search they check the solvers against.
#ifndef MALLE_TESTS_CPP_ALLOC_ORACLES_H_
#define MALLE_TESTS_CPP_ALLOC_ORACLES_H_

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/problem.h"

namespace malle::alloc::testing {

// 2-4 sorted node counts in [lo, hi]: lo, hi and up to two in between.
inline std::vector<int> RandomBreakpoints(std::mt19937& rng, int lo, int hi) {
  std::vector<int> xs = {lo, hi};
  const int extra = static_cast<int>(rng() % 3);
  for (int i = 0; i < extra && hi - lo > 1; ++i) xs.push_back(lo + 1 + rng() % (hi - lo - 1));
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  return xs;
}

// A curve through `xs` of about `per_node` samples/s a node: concave
// (diminishing returns) or not (random values; a bump or a dip).
inline Curve CurveThrough(std::mt19937& rng, const std::vector<int>& xs, double per_node, bool concave) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Curve curve;
  double slope = per_node;
  double y = per_node * xs.front() * (0.5 + u(rng));
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i > 0) {
      if (concave) {
        slope *= 0.3 + 0.7 * u(rng);
        y += slope * (xs[i] - xs[i - 1]);
      } else {
        y = per_node * xs[i] * (0.2 + 1.3 * u(rng));
      }
    }
    curve.push_back({xs[i], y});
  }
  return curve;
}

// Eight pools (2 racks x 2 speeds x a long and a short idle window), 2-3
// jobs, some holding nodes: small enough to search exhaustively.
struct EightPoolsOptions {
  int objectives = 2;           // the objective is drawn among the first `objectives`
  bool weights = false;         // a weight drawn for every job
  std::optional<bool> concave;  // every curve concave or not; nullopt: drawn per curve
};
inline Problem EightPools(std::mt19937& rng, const EightPoolsOptions& o) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Problem p;
  p.forward_window = absl::Seconds(100 + rng() % 200);
  p.objective = static_cast<Objective>(rng() % o.objectives);
  p.resize_cost = static_cast<ResizeCostModel>(rng() % 2);
  p.cross_locality_factor = 0.7 + 0.3 * u(rng);
  int index = 0;
  for (const char* rack : {"rackA", "rackB"}) {
    for (double speed : {1.0, 0.6 + 0.3 * u(rng)}) {
      const std::string cls = absl::StrCat(rack, "-", index++);
      p.classes.push_back(NodeClass{cls, rack, speed});
      // One or two nodes with no forecast, one reclaimed within the window.
      const int long_nodes = 1 + static_cast<int>(rng() % 2);
      for (int k = 0; k < long_nodes; ++k) p.nodes.push_back(Node{absl::StrCat(cls, "-l", k), cls});
      p.nodes.push_back(Node{absl::StrCat(cls, "-s"), cls, p.forward_window * (0.15 + 0.6 * u(rng))});
    }
  }
  std::vector<int> free_nodes(p.nodes.size());
  for (size_t k = 0; k < free_nodes.size(); ++k) free_nodes[k] = static_cast<int>(k);
  std::shuffle(free_nodes.begin(), free_nodes.end(), rng);
  const int num_jobs = 2 + static_cast<int>(rng() % 2);
  for (int j = 0; j < num_jobs; ++j) {
    JobSpec job;
    job.id = absl::StrCat("j", j);
    job.min_nodes = 1 + static_cast<int>(rng() % 2);
    job.max_nodes = job.min_nodes + static_cast<int>(rng() % 4);
    const double per_node = 100 * (0.5 + u(rng));
    const std::vector<int> xs = RandomBreakpoints(rng, job.min_nodes, job.max_nodes);
    const bool concave = o.concave ? *o.concave : rng() % 2 == 0;
    job.throughput = CurveThrough(rng, xs, per_node, concave);
    job.resize_up_pause = absl::Seconds(rng() % 40);
    job.resize_down_pause = absl::Seconds(rng() % 20);
    if (o.weights) job.weight = 0.5 + 2.0 * u(rng);
    if (rng() % 2 == 0) {
      const int want = 1 + static_cast<int>(rng() % job.max_nodes);
      for (int k = 0; k < want && !free_nodes.empty(); ++k) {
        job.current_nodes.push_back(p.nodes[free_nodes.back()].id);
        free_nodes.pop_back();
      }
    }
    p.jobs.push_back(job);
  }
  return p;
}

// The optimum by exhaustive search over every split of every pool's nodes
// among the jobs (valued by JobVectorValue, the count model's rules), the
// option each job takes in it, and how many splits were valued.
struct Exhaustive {
  double best = -std::numeric_limits<double>::infinity();
  std::vector<int> options;
  long long leaves = 0;
};
inline Exhaustive ExhaustiveSearch(const CountModel& model) {
  const int num_jobs = static_cast<int>(model.jobs.size());
  const int num_pools = static_cast<int>(model.pools.size());
  std::vector<std::vector<int>> x(num_jobs, std::vector<int>(num_pools, 0));
  Exhaustive out;
  std::function<void(int, int, int)> split = [&](int pool, int job, int left) {
    if (pool == num_pools) {
      ++out.leaves;
      double total = 0;
      std::vector<int> options(num_jobs);
      for (int j = 0; j < num_jobs; ++j) {
        const std::optional<double> v = JobVectorValue(model.jobs[j], x[j], &options[j]);
        if (!v) return;
        total += *v;
      }
      if (total > out.best) {
        out.best = total;
        out.options = options;
      }
      return;
    }
    if (job == num_jobs) {
      split(pool + 1, 0, pool + 1 < num_pools ? model.pools[pool + 1].capacity : 0);
      return;
    }
    for (int take = 0; take <= left; ++take) {
      x[job][pool] = take;
      split(pool, job + 1, left - take);
    }
    x[job][pool] = 0;
  };
  split(0, 0, model.pools[0].capacity);
  return out;
}

}  // namespace malle::alloc::testing

#endif  // MALLE_TESTS_CPP_ALLOC_ORACLES_H_
