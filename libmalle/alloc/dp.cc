#include "libmalle/alloc/dp.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace malle::alloc {
namespace {

constexpr double kUnreachable = -std::numeric_limits<double>::infinity();

// Options of `job` in the order the DP tries them: the current allocation
// first, so that among equally good answers the DP keeps the job where it is.
std::vector<int> OptionOrder(const JobModel& job) {
  std::vector<int> order;
  order.push_back(job.current_option);
  for (int o = 0; o < static_cast<int>(job.options.size()); ++o) {
    if (o != job.current_option) order.push_back(o);
  }
  return order;
}

// to[k] = max(to[k], from[k] + value) for k < count, pick[k] = o where the
// new value is strictly better: the DP's inner loop (the replay of a year
// at 36,036 jobs spent 78 % of its time here). Contiguous memory without a
// branch, which the compiler vectorises; on x86-64 it is also built for
// AVX2 and the loader picks that where the CPU has it (4 doubles a step
// instead of SSE2's 2). The same adds and compares either way, so the same
// answers to the bit.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx2", "default")))
#endif
void Relax(const double* from, double value, int o, int count, double* to, int32_t* pick) {
  for (int k = 0; k < count; ++k) {
    const double candidate = from[k] + value;
    const bool better = candidate > to[k];
    to[k] = better ? candidate : to[k];
    pick[k] = better ? o : pick[k];
  }
}

PolicyResult SolveSinglePool(const CountModel& model) {
  const int num_jobs = static_cast<int>(model.jobs.size());
  const int num_pools = static_cast<int>(model.pools.size());
  int capacity = num_pools == 0 ? 0 : model.pools[0].capacity;
  // Each job's largest count (its options never exceed max_nodes; the
  // options decide, so that a model built otherwise stays exact).
  std::vector<int> largest(num_jobs, 0);
  long long demand = 0;
  for (int j = 0; j < num_jobs; ++j) {
    for (const Option& o : model.jobs[j].options) largest[j] = std::max(largest[j], o.nodes);
    demand += largest[j];
  }
  capacity = static_cast<int>(std::min<long long>(capacity, demand));

  // best[c]: best value of the jobs so far using at most c nodes. Only a
  // band of c matters per job: above the counts the jobs so far can take
  // together (hi), best[c] = best[hi]; below what the capacity less the
  // counts of the jobs still to come leaves (lo), no allocation of every
  // job ends at the capacity from there. The answer, best[capacity] after
  // the last job, reads only the bands, and they are narrow where the pool
  // is large for its jobs (~50,000 nodes, 1,000 jobs: a third of the
  // capacity on average instead of all of it).
  std::vector<int> lo(num_jobs), hi(num_jobs);
  {
    long long before = 0, after = demand;
    for (int j = 0; j < num_jobs; ++j) {
      before += largest[j];
      after -= largest[j];
      hi[j] = static_cast<int>(std::min<long long>(capacity, before));
      lo[j] = static_cast<int>(std::max<long long>(0, capacity - after));
    }
  }
  std::vector<double> best(capacity + 1, 0.0), next(capacity + 1);
  // choice: per job, the option of each c in its band [lo, hi].
  std::vector<size_t> row_start(num_jobs + 1, 0);
  for (int j = 0; j < num_jobs; ++j) row_start[j + 1] = row_start[j] + (hi[j] - lo[j] + 1);
  std::vector<int32_t> choice(row_start[num_jobs]);
  int prev_hi = 0;  // best is valid on [.., prev_hi] and constant above it
  for (int j = 0; j < num_jobs; ++j) {
    const JobModel& job = model.jobs[j];
    const int first = lo[j], last = hi[j];
    // best above the previous band's top, as far as this job reads it.
    std::fill(best.begin() + prev_hi + 1, best.begin() + last + 1, best[prev_hi]);
    int32_t* row = choice.data() + row_start[j];  // row[c - first], c in [first, last]
    std::fill(next.begin() + first, next.begin() + last + 1, kUnreachable);
    std::fill(row, row + (last - first + 1), 0);
    // Option by option (in OptionOrder, so that the first of equally good
    // options wins, as before), each over every capacity of the band it fits.
    for (const int o : OptionOrder(job)) {
      const int n = job.options[o].nodes;
      const double value = job.options[o].value;
      const int from_c = std::max(first, n);
      const double* from = best.data() + from_c - n;
      double* to = next.data() + from_c;
      Relax(from, value, o, last - from_c + 1, to, row + (from_c - first));
    }
    best.swap(next);
    prev_hi = last;
  }
  CountSolution solution;
  solution.option.assign(num_jobs, 0);
  solution.per_pool.assign(num_jobs, std::vector<int>(num_pools, 0));
  int c = capacity;
  for (int j = num_jobs - 1; j >= 0; --j) {
    c = std::min(c, hi[j]);  // above the band, the band's top decides
    const int o = choice[row_start[j] + (c - lo[j])];
    solution.option[j] = o;
    const int n = model.jobs[j].options[o].nodes;
    if (num_pools > 0) solution.per_pool[j][0] = n;
    c -= n;
  }
  solution.objective = SolutionObjective(model, solution.option);
  PolicyResult result;
  result.solution = std::move(solution);
  result.optimal = true;
  return result;
}

struct Candidate {
  int64_t offset;  // mixed-radix encoding of the per-pool vector
  double value;
  int option;
  std::vector<int> per_pool;
};

absl::StatusOr<PolicyResult> SolveMultiPool(const CountModel& model, const DpOptions& options) {
  const int num_jobs = static_cast<int>(model.jobs.size());
  const int num_pools = static_cast<int>(model.pools.size());
  std::vector<int64_t> stride(num_pools);
  int64_t states = 1;
  for (int p = 0; p < num_pools; ++p) {
    stride[p] = states;
    states *= model.pools[p].capacity + 1;
    if (states > options.max_states) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "dp: %d pools with capacities up to pool %d already give more than max_states = %d "
          "states; use the milp policy",
          num_pools, p, options.max_states));
    }
  }
  if (states * std::max(1, num_jobs) > 40'000'000) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "dp: %d states x %d jobs exceeds the DP table limit; use the milp policy", states,
        num_jobs));
  }

  // Every per-pool vector each job may take, with its best option.
  std::vector<std::vector<Candidate>> candidates(num_jobs);
  long long enumerated = 0;  // vectors looked at, over all jobs
  for (int j = 0; j < num_jobs; ++j) {
    const JobModel& job = model.jobs[j];
    std::vector<int> x(num_pools, 0);
    // Odometer over x with sum(x) <= max_nodes.
    while (true) {
      if (++enumerated > options.max_work / states) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "dp: %d states x more than %d per-pool vectors (%d of %d jobs enumerated) exceed "
            "max_work = %d steps; use the milp policy",
            states, enumerated - 1, j, num_jobs, options.max_work));
      }
      int option = 0;
      if (auto v = JobVectorValue(job, x, &option)) {
        int64_t offset = 0;
        for (int p = 0; p < num_pools; ++p) offset += x[p] * stride[p];
        candidates[j].push_back({offset, *v, option, x});
        if (static_cast<long long>(candidates[j].size()) > options.max_vectors_per_job) {
          return absl::ResourceExhaustedError(absl::StrFormat(
              "dp: job %d has more than max_vectors_per_job = %d per-pool vectors; use the "
              "milp policy",
              j, options.max_vectors_per_job));
        }
      }
      int p = 0;
      int sum = 0;
      for (int v : x) sum += v;
      for (; p < num_pools; ++p) {
        if (x[p] < model.pools[p].capacity && sum < job.max_nodes) {
          ++x[p];
          break;
        }
        sum -= x[p];
        x[p] = 0;
      }
      if (p == num_pools) break;
    }
    // Current allocation first: ties keep the job where it is.
    std::stable_sort(candidates[j].begin(), candidates[j].end(),
                     [&](const Candidate& a, const Candidate& b) {
                       return (a.option == job.current_option) > (b.option == job.current_option);
                     });
  }

  // dp over "used" vectors: value[u] = best value of jobs so far using
  // exactly u nodes from each pool.
  std::vector<double> value(states, kUnreachable), next(states);
  value[0] = 0.0;
  std::vector<int32_t> choice(static_cast<size_t>(num_jobs) * states, -1);
  std::vector<int> digits(num_pools);
  for (int j = 0; j < num_jobs; ++j) {
    std::fill(next.begin(), next.end(), kUnreachable);
    int32_t* row = &choice[static_cast<size_t>(j) * states];
    for (int64_t u = 0; u < states; ++u) {
      if (value[u] == kUnreachable) continue;
      int64_t rest = u;
      for (int p = 0; p < num_pools; ++p) {
        digits[p] = static_cast<int>(rest % (model.pools[p].capacity + 1));
        rest /= model.pools[p].capacity + 1;
      }
      for (size_t k = 0; k < candidates[j].size(); ++k) {
        const Candidate& cand = candidates[j][k];
        bool fits = true;
        for (int p = 0; p < num_pools && fits; ++p) {
          fits = digits[p] + cand.per_pool[p] <= model.pools[p].capacity;
        }
        if (!fits) continue;
        const int64_t target = u + cand.offset;
        const double v = value[u] + cand.value;
        if (v > next[target]) {
          next[target] = v;
          row[target] = static_cast<int32_t>(k);
        }
      }
    }
    value.swap(next);
  }
  int64_t best_state = 0;
  for (int64_t u = 0; u < states; ++u) {
    if (value[u] > value[best_state]) best_state = u;
  }
  CountSolution solution;
  solution.option.assign(num_jobs, 0);
  solution.per_pool.assign(num_jobs, std::vector<int>(num_pools, 0));
  int64_t u = best_state;
  for (int j = num_jobs - 1; j >= 0; --j) {
    const Candidate& cand = candidates[j][choice[static_cast<size_t>(j) * states + u]];
    solution.option[j] = cand.option;
    solution.per_pool[j] = cand.per_pool;
    u -= cand.offset;
  }
  solution.objective = SolutionObjective(model, solution.option);
  PolicyResult result;
  result.solution = std::move(solution);
  result.optimal = true;
  return result;
}

}  // namespace

absl::StatusOr<PolicyResult> SolveDp(const CountModel& model, const DpOptions& options) {
  const absl::Time start = absl::Now();
  PolicyResult result;
  if (model.pools.size() <= 1) {
    result = SolveSinglePool(model);
  } else {
    auto multi = SolveMultiPool(model, options);
    if (!multi.ok()) return multi.status();
    result = *std::move(multi);
  }
  result.solve_time = absl::Now() - start;
  result.reason = absl::StrFormat("dp: optimal over %d jobs and %d pool(s) in %.2f ms",
                                  model.jobs.size(), model.pools.size(),
                                  absl::ToDoubleMilliseconds(result.solve_time));
  return result;
}

}  // namespace malle::alloc
