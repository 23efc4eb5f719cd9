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
#include <vector>

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
