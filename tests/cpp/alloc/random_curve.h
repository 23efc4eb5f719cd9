// Random throughput curves for the allocator's randomized tests (milp_test,
// decomposition_test): the same generator, so that both explore the same kind
// of instance.
#ifndef MALLE_TESTS_CPP_ALLOC_RANDOM_CURVE_H_
#define MALLE_TESTS_CPP_ALLOC_RANDOM_CURVE_H_

#include <algorithm>
#include <random>
#include <vector>

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

}  // namespace malle::alloc::testing

#endif  // MALLE_TESTS_CPP_ALLOC_RANDOM_CURVE_H_
