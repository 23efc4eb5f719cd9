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
// An option is left out where one tried before it takes no more nodes and is
// worth at least as much. That one is never picked: best[] never decreases
// with the count (it is the best of at most c nodes), so the earlier option
// offers at least as much at every count, and only a strictly better value
// replaces an earlier one. The answers stay the same to the bit. (With rank
// weights a job's work left caps what it can gain, and the reclaim hazard
// grows with the count, so the larger counts of a job about to finish are
// worth less than a smaller one: 13 % of the DP's work over the first 300
// hours of a year of Theta.)
std::vector<int> RelaxOrder(const JobModel& job) {
  const int num_options = static_cast<int>(job.options.size());
  std::vector<int> order;
  order.reserve(num_options);
  const Option& current = job.options[job.current_option];
  order.push_back(job.current_option);
  // The options after the current one come by index. While their counts
  // ascend, the best of those kept so far is the best with at most this
  // count; otherwise every kept one is compared.
  bool ascending = true;
  int last_nodes = -1;
  double best_before = kUnreachable;
  for (int o = 0; o < num_options; ++o) {
    if (o == job.current_option) continue;
    const Option& option = job.options[o];
    ascending = ascending && option.nodes >= last_nodes;
    last_nodes = option.nodes;
    bool dominated = current.nodes <= option.nodes && current.value >= option.value;
    if (!dominated && ascending) {
      dominated = best_before >= option.value;
    } else if (!dominated) {
      for (const int k : order) {
        const Option& kept = job.options[k];
        if (kept.nodes <= option.nodes && kept.value >= option.value) {
          dominated = true;
          break;
        }
      }
    }
    if (dominated) continue;
    order.push_back(o);
    best_before = std::max(best_before, option.value);
  }
  return order;
}

// to[k] = max(to[k], from[k] + value) for k < count, where the new value is
// strictly better: the DP's inner loop (with the group below, a third of a
// year of Theta's replay with rank weights). Contiguous memory without a
// branch, which the compiler vectorises; on x86-64 it is also built for AVX2
// and the loader picks that where the CPU has it (4 doubles a step instead
// of SSE2's 2). The same adds and compares either way, so the same answers
// to the bit.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx2", "default")))
#endif
void Relax(const double* from, double value, int count, double* to) {
  for (int k = 0; k < count; ++k) {
    const double candidate = from[k] + value;
    to[k] = candidate > to[k] ? candidate : to[k];
  }
}

// Relax for kGroup options at once, in their order at each k: to[k] is
// loaded and stored once per group instead of once per option. The same
// compares in the same order as kGroup calls of Relax, so the same values
// to the bit.
constexpr int kGroup = 4;

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx2", "default")))
#endif
void RelaxGroup(const double* const* from, const double* value, int count, double* to) {
  const double* f[kGroup];
  double v[kGroup];
  for (int g = 0; g < kGroup; ++g) {
    f[g] = from[g];
    v[g] = value[g];
  }
  for (int k = 0; k < count; ++k) {
    double t = to[k];
#pragma GCC unroll 16
    for (int g = 0; g < kGroup; ++g) {
      const double candidate = f[g][k] + v[g];
      t = candidate > t ? candidate : t;
    }
    to[k] = t;
  }
}

// to[c - first] = max over `order`'s options o of best[c - n_o] + value_o,
// for c in [first, last] (options relax only the counts they fit in).
void RelaxJob(const JobModel& job, const std::vector<int>& order, const double* best, int first,
              int last, double* to) {
  size_t i = 0;
  for (; i + kGroup <= order.size(); i += kGroup) {
    // Each option's head alone (in order), then the band all of the group
    // reach, in one pass.
    int start = first;
    for (int g = 0; g < kGroup; ++g) start = std::max(start, job.options[order[i + g]].nodes);
    start = std::min(start, last + 1);
    const double* from[kGroup];
    double value[kGroup];
    for (int g = 0; g < kGroup; ++g) {
      const Option& option = job.options[order[i + g]];
      const int n = option.nodes;
      value[g] = option.value;
      const int from_c = std::max(first, n);
      if (from_c < start) {
        Relax(best + from_c - n, value[g], start - from_c, to + (from_c - first));
      }
      from[g] = start <= last ? best + start - n : nullptr;
    }
    if (start <= last) RelaxGroup(from, value, last - start + 1, to + (start - first));
  }
  for (; i < order.size(); ++i) {
    const Option& option = job.options[order[i]];
    const int from_c = std::max(first, option.nodes);
    if (from_c > last) continue;
    Relax(best + from_c - option.nodes, option.value, last - from_c + 1, to + (from_c - first));
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
  // table: per job, best[c] after it for each c in its band [lo, hi]. Only
  // values are kept; the walk back finds each job's option again from them
  // (a pick per c cost the inner loop a blend and the shuffles narrowing
  // its mask, for each option at each c).
  std::vector<size_t> row_start(num_jobs + 1, 0);
  for (int j = 0; j < num_jobs; ++j) row_start[j + 1] = row_start[j] + (hi[j] - lo[j] + 1);
  // Kept between decisions on this thread: a fresh table is fresh pages,
  // which the kernel zeroes on first touch (a fifth of a replay of Mira's
  // ~50,000 nodes was page faults). Every row is filled before it is read.
  thread_local std::vector<double> table;
  thread_local std::vector<double> best;
  table.resize(row_start[num_jobs]);
  best.assign(capacity + 1, 0.0);
  std::vector<std::vector<int>> orders(num_jobs);
  int prev_hi = 0;  // best is valid on [.., prev_hi] and constant above it
  for (int j = 0; j < num_jobs; ++j) {
    const int first = lo[j], last = hi[j];
    // best above the previous band's top, as far as this job reads it.
    std::fill(best.begin() + prev_hi + 1, best.begin() + last + 1, best[prev_hi]);
    double* row = table.data() + row_start[j];  // row[c - first], c in [first, last]
    std::fill(row, row + (last - first + 1), kUnreachable);
    orders[j] = RelaxOrder(model.jobs[j]);
    RelaxJob(model.jobs[j], orders[j], best.data(), first, last, row);
    std::copy(row, row + (last - first + 1), best.begin() + first);
    prev_hi = last;
  }
  CountSolution solution;
  solution.option.assign(num_jobs, 0);
  solution.per_pool.assign(num_jobs, std::vector<int>(num_pools, 0));
  int c = capacity;
  for (int j = num_jobs - 1; j >= 0; --j) {
    c = std::min(c, hi[j]);  // above the band, the band's top decides
    // The option the forward pass took at c: the first in its order whose
    // value from the row before equals the best, computed with the same add,
    // as only a strictly better value replaced an earlier one. Option 0
    // where no option reaches c.
    const double reached = table[row_start[j] + (c - lo[j])];
    int o = 0;
    if (reached != kUnreachable) {
      for (const int candidate : orders[j]) {
        const Option& option = model.jobs[j].options[candidate];
        if (option.nodes > c) continue;
        const int at = c - option.nodes;
        const double before =
            j == 0 ? 0.0 : table[row_start[j - 1] + (std::min(at, hi[j - 1]) - lo[j - 1])];
        if (before + option.value == reached) {
          o = candidate;
          break;
        }
      }
    }
    solution.option[j] = o;
    const int n = model.jobs[j].options[o].nodes;
    if (num_pools > 0) solution.per_pool[j][0] = n;
    c -= n;
  }
  solution.objective = SolutionObjective(model, solution.option);
  // A table beyond 64 MB (a pool of ~50,000 nodes with a thousand jobs) is
  // not kept for the next decision.
  constexpr size_t kKeepDoubles = size_t{8} << 20;
  if (table.capacity() > kKeepDoubles) std::vector<double>().swap(table);
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
  result.answered_by = "dp";
  result.reason = absl::StrFormat("dp: optimal over %d jobs and %d pool(s) in %.2f ms",
                                  model.jobs.size(), model.pools.size(),
                                  absl::ToDoubleMilliseconds(result.solve_time));
  return result;
}

}  // namespace malle::alloc
