#include "libmalle/alloc/count_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "libmalle/base/status_macros.h"

namespace malle::alloc {
namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Curves of a job, one per batch option (one curve without options).
std::vector<const Curve*> JobCurves(const JobSpec& job) {
  std::vector<const Curve*> curves;
  if (job.batch_options.empty()) {
    curves.push_back(&job.throughput);
  } else {
    for (const BatchOption& b : job.batch_options) curves.push_back(&b.throughput);
  }
  return curves;
}

// The objective's per-job multiplier.
double JobScale(const Problem& problem, const JobSpec& job) {
  switch (problem.objective) {
    case Objective::kThroughput:
      return 1.0;
    case Objective::kWeighted:
      return job.weight;
    case Objective::kCompletion:
      return job.weight / job.remaining_samples;  // > 0: ValidateProblem
    case Objective::kSpeedup: {
      // Speedup relative to linear scaling from min_nodes: a job counts as
      // much as another when both run at the same multiple of their smallest
      // size's per-node rate, whatever their absolute samples/s.
      const double at_min = Interpolate(*JobCurves(job)[0], job.min_nodes);
      return job.weight * job.min_nodes / at_min;  // at_min > 0: ValidateProblem
    }
  }
  return 1.0;
}

// Per job, rank^exponent (Problem::rank_weight_exponent): rank = 1 + the
// jobs with more work left in node-seconds at their per-node rate at
// min_nodes, divided by 1 + age / rank_aging when aging is on; ties rank by
// problem order, the later job counting as the larger. All ones when the
// exponent is 0. O(jobs log jobs).
std::vector<double> RankWeights(const Problem& problem) {
  const size_t n = problem.jobs.size();
  std::vector<double> weights(n, 1.0);
  if (problem.rank_weight_exponent <= 0) return weights;
  std::vector<double> left(n);
  for (size_t j = 0; j < n; ++j) {
    // > 0: ValidateProblem checks the rate and the remaining samples.
    left[j] = WorkLeftNodeSeconds(problem.jobs[j], problem.jobs[j].remaining_samples);
    if (problem.rank_aging != absl::InfiniteDuration()) {  // > 0: ValidateProblem
      left[j] /= 1.0 + absl::FDivDuration(problem.jobs[j].age, problem.rank_aging);
    }
  }
  // Largest work first; of equal ones, the later job first. Then the k-th in
  // this order (k = 0, 1, ...) has k jobs ranked above it: rank k + 1.
  std::vector<size_t> order(n);
  for (size_t j = 0; j < n; ++j) order[j] = j;
  std::sort(order.begin(), order.end(), [&left](size_t a, size_t b) {
    return left[a] != left[b] ? left[a] > left[b] : a > b;
  });
  for (size_t k = 0; k < n; ++k) {
    weights[order[k]] = std::pow(static_cast<double>(k + 1), problem.rank_weight_exponent);
  }
  return weights;
}

bool IsSubset(const std::vector<int>& sorted_small, const std::vector<int>& sorted_big) {
  return std::includes(sorted_big.begin(), sorted_big.end(), sorted_small.begin(),
                       sorted_small.end());
}

// Dinic's maximum flow on a small graph (jobs + pools + 2 vertices).
class MaxFlow {
 public:
  explicit MaxFlow(int vertices) : adj_(vertices), level_(vertices), next_(vertices) {}

  // Returns the index of the forward arc.
  int AddArc(int from, int to, long long capacity) {
    adj_[from].push_back(static_cast<int>(arcs_.size()));
    arcs_.push_back({to, capacity});
    adj_[to].push_back(static_cast<int>(arcs_.size()));
    arcs_.push_back({from, 0});
    return static_cast<int>(arcs_.size()) - 2;
  }

  long long Run(int s, int t) {
    long long total = 0;
    while (Levels(s, t)) {
      std::fill(next_.begin(), next_.end(), 0);
      while (long long pushed = Push(s, t, std::numeric_limits<long long>::max())) total += pushed;
    }
    return total;
  }

  // Flow on the forward arc `arc` (its reverse arc's residual capacity).
  long long Flow(int arc) const { return arcs_[arc ^ 1].capacity; }

 private:
  struct Arc {
    int to;
    long long capacity;  // residual
  };

  bool Levels(int s, int t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::vector<int> queue = {s};
    level_[s] = 0;
    for (size_t head = 0; head < queue.size(); ++head) {
      for (int a : adj_[queue[head]]) {
        if (arcs_[a].capacity > 0 && level_[arcs_[a].to] < 0) {
          level_[arcs_[a].to] = level_[queue[head]] + 1;
          queue.push_back(arcs_[a].to);
        }
      }
    }
    return level_[t] >= 0;
  }

  // Depth at most 3 on the graphs built here (source, job, pool, sink).
  long long Push(int v, int t, long long limit) {
    if (v == t) return limit;
    for (int& i = next_[v]; i < static_cast<int>(adj_[v].size()); ++i) {
      Arc& arc = arcs_[adj_[v][i]];
      if (arc.capacity <= 0 || level_[arc.to] != level_[v] + 1) continue;
      if (long long pushed = Push(arc.to, t, std::min(limit, arc.capacity))) {
        arc.capacity -= pushed;
        arcs_[adj_[v][i] ^ 1].capacity += pushed;
        return pushed;
      }
    }
    return 0;
  }

  std::vector<std::vector<int>> adj_;
  std::vector<Arc> arcs_;
  std::vector<int> level_;
  std::vector<int> next_;
};

}  // namespace

absl::StatusOr<CountModel> CompileCountModel(const Problem& problem,
                                             const CountModelOptions& options) {
  MALLE_RETURN_IF_ERROR(ValidateProblem(problem));
  if (options.horizon_buckets < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CountModelOptions.horizon_buckets: must be >= 1, got ", options.horizon_buckets));
  }
  CountModel model;
  const double window = Seconds(problem.forward_window);
  model.forward_window_s = window;
  model.total_nodes = static_cast<int>(problem.nodes.size());

  // Classes and locality groups.
  std::vector<NodeClass> classes = problem.classes;
  if (classes.empty()) classes.push_back(NodeClass{"default", "", 1.0});
  absl::flat_hash_map<std::string, int> class_index;
  std::vector<int> class_locality(classes.size());
  for (size_t c = 0; c < classes.size(); ++c) {
    class_index[classes[c].id] = static_cast<int>(c);
    auto it = std::find(model.localities.begin(), model.localities.end(), classes[c].locality);
    if (it == model.localities.end()) {
      model.localities.push_back(classes[c].locality);
      class_locality[c] = static_cast<int>(model.localities.size()) - 1;
    } else {
      class_locality[c] = static_cast<int>(it - model.localities.begin());
    }
  }

  // Pools: (class, bucketed horizon). Ordered by class, then longest horizon
  // first, so that pool indices do not depend on node order.
  const double bucket = window / options.horizon_buckets;
  std::vector<int> node_pool(problem.nodes.size());
  {
    std::map<std::pair<int, double>, std::vector<int>> by_key;
    for (size_t i = 0; i < problem.nodes.size(); ++i) {
      const Node& node = problem.nodes[i];
      const int c = node.class_id.empty() ? 0 : class_index.at(node.class_id);
      double h = window;
      if (node.expected_idle < problem.forward_window) {
        // Rounded down: a node is never valued for longer than it stays.
        h = std::floor(Seconds(node.expected_idle) / bucket) * bucket;
      }
      by_key[{c, -h}].push_back(static_cast<int>(i));
    }
    for (auto& [key, nodes] : by_key) {
      Pool pool;
      pool.class_index = key.first;
      pool.locality = class_locality[key.first];
      pool.speed = classes[key.first].speed;
      pool.horizon_s = -key.second;
      pool.capacity = static_cast<int>(nodes.size());
      for (int i : nodes) node_pool[i] = static_cast<int>(model.pools.size());
      pool.nodes = std::move(nodes);
      model.pools.push_back(std::move(pool));
    }
  }
  const int num_pools = static_cast<int>(model.pools.size());

  // Candidate patterns, shared by all jobs: every (speed floor, horizon
  // floor, locality) combination, deduplicated by the pool set it admits.
  std::vector<Pattern> patterns;
  {
    std::vector<double> speeds, horizons;
    for (const Pool& p : model.pools) {
      speeds.push_back(p.speed);
      horizons.push_back(p.horizon_s);
    }
    std::sort(speeds.begin(), speeds.end());
    speeds.erase(std::unique(speeds.begin(), speeds.end()), speeds.end());
    std::sort(horizons.begin(), horizons.end());
    horizons.erase(std::unique(horizons.begin(), horizons.end()), horizons.end());
    std::vector<int> groups = {-1};
    if (problem.cross_locality_factor < 1.0 && model.localities.size() > 1) {
      for (size_t g = 0; g < model.localities.size(); ++g) groups.push_back(static_cast<int>(g));
    }
    std::map<std::vector<int>, bool> seen;
    for (double s : speeds) {
      for (double h : horizons) {
        for (int g : groups) {
          Pattern pat;
          for (int p = 0; p < num_pools; ++p) {
            const Pool& pool = model.pools[p];
            if (pool.speed >= s && pool.horizon_s >= h && (g < 0 || pool.locality == g)) {
              pat.pools.push_back(p);
            }
          }
          if (pat.pools.empty() || seen[pat.pools]) continue;
          seen[pat.pools] = true;
          pat.speed = model.pools[pat.pools[0]].speed;
          pat.horizon_s = model.pools[pat.pools[0]].horizon_s;
          bool one_group = true;
          for (int p : pat.pools) {
            pat.speed = std::min(pat.speed, model.pools[p].speed);
            pat.horizon_s = std::min(pat.horizon_s, model.pools[p].horizon_s);
            one_group = one_group && model.pools[p].locality == model.pools[pat.pools[0]].locality;
          }
          pat.locality = one_group ? model.pools[pat.pools[0]].locality : -1;
          pat.factor = pat.speed * (one_group ? 1.0 : problem.cross_locality_factor);
          patterns.push_back(std::move(pat));
        }
      }
    }
  }

  // Each pattern's nodes; no option has more than the largest pattern holds.
  std::vector<int> pattern_capacity(patterns.size(), 0);
  int largest_pattern = 0;
  for (size_t k = 0; k < patterns.size(); ++k) {
    for (int p : patterns[k].pools) pattern_capacity[k] += model.pools[p].capacity;
    largest_pattern = std::max(largest_pattern, pattern_capacity[k]);
  }
  int most_nodes = 0;
  for (const JobSpec& spec : problem.jobs) {
    most_nodes = std::max(most_nodes, std::min(spec.max_nodes, largest_pattern));
  }
  // Per pattern and count, the chance that a reclaim hits one of n nodes
  // within the pattern's horizon, 1 - exp(-rate n h): the same for every
  // job, so computed once (its expm1 was 6 % of a DP replay with hazards).
  std::vector<std::vector<double>> reclaim_hit(patterns.size());
  if (problem.reclaim_rate > 0) {
    for (size_t k = 0; k < patterns.size(); ++k) {
      if (patterns[k].horizon_s < window) continue;
      reclaim_hit[k].resize(most_nodes + 1);
      for (int n = 0; n <= most_nodes; ++n) {
        reclaim_hit[k][n] = -std::expm1(-problem.reclaim_rate * n * patterns[k].horizon_s);
      }
    }
  }

  // Views into `problem`: no copy of every node id per decision.
  absl::flat_hash_map<absl::string_view, int> node_index;
  node_index.reserve(problem.nodes.size());
  for (size_t i = 0; i < problem.nodes.size(); ++i) node_index[problem.nodes[i].id] = i;

  const std::vector<double> rank_weights = RankWeights(problem);
  for (size_t job_index = 0; job_index < problem.jobs.size(); ++job_index) {
    const JobSpec& spec = problem.jobs[job_index];
    JobModel job;
    job.min_nodes = spec.min_nodes;
    job.max_nodes = std::min(spec.max_nodes, model.total_nodes);
    job.requested_max_nodes = spec.max_nodes;
    job.current_batch_option = spec.current_batch_option;
    job.current_per_pool.assign(num_pools, 0);
    for (const std::string& id : spec.current_nodes) {
      ++job.current_per_pool[node_pool[node_index.at(id)]];
    }
    job.current_nodes = static_cast<int>(spec.current_nodes.size());
    std::vector<int> current_pools;
    for (int p = 0; p < num_pools; ++p) {
      if (job.current_per_pool[p] > 0) current_pools.push_back(p);
    }
    const std::vector<const Curve*> curves = JobCurves(spec);
    const double scale = JobScale(problem, spec) * rank_weights[job_index];
    // Completion and rank weights: no job is worth more than finishing it.
    const double work_cap =
        problem.objective == Objective::kCompletion || problem.rank_weight_exponent > 0
            ? spec.remaining_samples
            : std::numeric_limits<double>::infinity();
    const double up = Seconds(spec.resize_up_pause) * problem.resize_hysteresis;
    const double down = Seconds(spec.resize_down_pause) * problem.resize_hysteresis;
    // The forced shrink a reclaim causes is not the policy's choice: its
    // expected cost is charged at the pause as it is.
    const double reclaim_down = Seconds(spec.resize_down_pause);
    const int cur = job.current_nodes;
    if (cur >= spec.min_nodes && cur <= spec.max_nodes) {
      double speed = model.pools[current_pools[0]].speed;
      bool one_group = true;
      for (int p : current_pools) {
        speed = std::min(speed, model.pools[p].speed);
        one_group = one_group && model.pools[p].locality == model.pools[current_pools[0]].locality;
      }
      job.current_samples_per_s = Interpolate(*curves[spec.current_batch_option], cur) * speed *
                                  (one_group ? 1.0 : problem.cross_locality_factor);
    }

    Option stop;
    if (cur > 0 && problem.resize_cost == ResizeCostModel::kBftrainer) {
      stop.value = -scale * job.current_samples_per_s * down;
    }
    if (cur > 0) stop.value -= spec.stop_penalty;
    job.options.reserve(
        1 + patterns.size() * static_cast<size_t>(std::max(0, job.max_nodes - job.min_nodes + 1)));
    job.options.push_back(stop);

    // Each batch option's curve at every count the job may take, once (not
    // once per pattern: Interpolate was a sixth of compiling).
    const int lowest = job.min_nodes;  // >= 1: ValidateProblem
    const int highest = std::min(job.max_nodes, largest_pattern);
    std::vector<std::vector<double>> at(curves.size());
    for (size_t b = 0; b < curves.size(); ++b) {
      at[b].resize(std::max(0, highest - lowest + 1));
      for (int n = lowest; n <= highest; ++n) at[b][n - lowest] = Interpolate(*curves[b], n);
    }
    for (size_t pattern_k = 0; pattern_k < patterns.size(); ++pattern_k) {
      const Pattern& pat = patterns[pattern_k];
      const int capacity = pattern_capacity[pattern_k];
      int current_inside = 0;  // current nodes the pattern lets the job keep
      for (int p : pat.pools) current_inside += job.current_per_pool[p];
      const bool keeps_all = IsSubset(current_pools, pat.pools);
      const int pattern_index = static_cast<int>(job.patterns.size());
      bool used = false;
      for (int n = job.min_nodes; n <= std::min(job.max_nodes, capacity); ++n) {
        // Growing (or staying) keeps every current node, so they must all be
        // admitted; shrinking only releases, so n must fit in what is kept.
        if (n >= cur && !keeps_all) continue;
        if (n < cur && n > current_inside) continue;
        Option best;
        bool have = false;
        for (size_t b = 0; b < curves.size(); ++b) {
          const double eff = at[b][n - lowest] * pat.factor;
          const bool unchanged = n == cur && static_cast<int>(b) == spec.current_batch_option;
          double value;
          if (unchanged) {
            // Not capped: a job that keeps its nodes and finishes within the
            // window frees them then, and the decision its finish triggers
            // gives them on; capped, a job with a second left would be worth
            // a second and lose its nodes to any other (stopped, it pays a
            // park and waits).
            value = eff * pat.horizon_s;
          } else {
            const bool grows = n > cur || (n == cur && static_cast<int>(b) != spec.current_batch_option);
            const double pause = grows ? up : down;
            value =
                problem.resize_cost == ResizeCostModel::kLostWork
                    ? std::min(eff * (pat.horizon_s - pause), work_cap)
                    : std::min(eff * pat.horizon_s, work_cap) - job.current_samples_per_s * pause;
          }
          if (problem.reclaim_rate > 0 && pat.horizon_s >= window) {
            // Expected cost of a forced shrink within the window (nodes with
            // a shorter forecast are valued until it instead).
            value -= eff * reclaim_down * reclaim_hit[pattern_k][n];
          }
          value *= scale;
          if (!have || value > best.value) {
            have = true;
            best.nodes = n;
            best.pattern = pattern_index;
            best.batch_option = static_cast<int>(b);
            best.samples_per_s = eff;
            best.value = value;
          }
        }
        job.options.push_back(best);
        used = true;
      }
      if (used) job.patterns.push_back(pat);
    }

    // The option describing the current allocation: same count and batch
    // option, pattern admitting the current pools, highest value (the
    // pattern whose floors equal the current nodes' attributes).
    double best_value = 0;
    for (size_t o = 1; o < job.options.size(); ++o) {
      const Option& opt = job.options[o];
      if (opt.nodes != cur || opt.batch_option != spec.current_batch_option) continue;
      if (job.current_option == 0 || opt.value > best_value) {
        job.current_option = static_cast<int>(o);
        best_value = opt.value;
      }
    }
    model.jobs.push_back(std::move(job));
  }
  return model;
}

std::optional<double> JobVectorValue(const JobModel& job, absl::Span<const int> per_pool,
                                     int* option_index) {
  if (per_pool.size() != job.current_per_pool.size()) return std::nullopt;
  int n = 0;
  for (int x : per_pool) {
    if (x < 0) return std::nullopt;
    n += x;
  }
  const int cur = job.current_nodes;
  for (size_t p = 0; p < per_pool.size(); ++p) {
    if (n >= cur && per_pool[p] < job.current_per_pool[p]) return std::nullopt;
    if (n <= cur && per_pool[p] > job.current_per_pool[p]) return std::nullopt;
  }
  if (n == 0) {
    if (option_index != nullptr) *option_index = 0;
    return job.options[0].value;
  }
  std::optional<double> best;
  for (size_t o = 1; o < job.options.size(); ++o) {
    const Option& opt = job.options[o];
    if (opt.nodes != n) continue;
    const std::vector<int>& allowed = job.patterns[opt.pattern].pools;
    bool fits = true;
    for (size_t p = 0; p < per_pool.size() && fits; ++p) {
      if (per_pool[p] > 0 && !std::binary_search(allowed.begin(), allowed.end(), static_cast<int>(p))) {
        fits = false;
      }
    }
    if (fits && (!best || opt.value > *best)) {
      best = opt.value;
      if (option_index != nullptr) *option_index = static_cast<int>(o);
    }
  }
  return best;
}

double SolutionObjective(const CountModel& model, absl::Span<const int> option) {
  double total = 0;
  for (size_t j = 0; j < model.jobs.size() && j < option.size(); ++j) {
    total += model.jobs[j].options[option[j]].value;
  }
  return total;
}

absl::Status CheckSolution(const CountModel& model, const CountSolution& solution) {
  const size_t num_jobs = model.jobs.size();
  const size_t num_pools = model.pools.size();
  if (solution.option.size() != num_jobs || solution.per_pool.size() != num_jobs) {
    return absl::FailedPreconditionError(
        absl::StrFormat("solution has %d options and %d per-pool rows for %d jobs",
                        solution.option.size(), solution.per_pool.size(), num_jobs));
  }
  std::vector<int> used(num_pools, 0);
  for (size_t j = 0; j < num_jobs; ++j) {
    const JobModel& job = model.jobs[j];
    const int o = solution.option[j];
    if (o < 0 || o >= static_cast<int>(job.options.size())) {
      return absl::FailedPreconditionError(
          absl::StrFormat("job %d: option %d out of range [0, %d)", j, o, job.options.size()));
    }
    const std::vector<int>& x = solution.per_pool[j];
    if (x.size() != num_pools) {
      return absl::FailedPreconditionError(
          absl::StrFormat("job %d: %d per-pool counts for %d pools", j, x.size(), num_pools));
    }
    const Option& opt = job.options[o];
    int n = 0;
    for (size_t p = 0; p < num_pools; ++p) {
      if (x[p] < 0) {
        return absl::FailedPreconditionError(absl::StrFormat("job %d: pool %d count %d < 0", j, p, x[p]));
      }
      n += x[p];
      used[p] += x[p];
      if (x[p] > 0) {
        if (opt.pattern < 0 ||
            !std::binary_search(job.patterns[opt.pattern].pools.begin(),
                                job.patterns[opt.pattern].pools.end(), static_cast<int>(p))) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "job %d: draws %d nodes from pool %d outside its option's pattern", j, x[p], p));
        }
      }
      if (opt.nodes >= job.current_nodes && x[p] < job.current_per_pool[p]) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "job %d: grows to %d but drops nodes of pool %d (%d < %d held)", j, opt.nodes, p,
            x[p], job.current_per_pool[p]));
      }
      if (opt.nodes <= job.current_nodes && x[p] > job.current_per_pool[p]) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "job %d: shrinks to %d but takes nodes of pool %d (%d > %d held)", j, opt.nodes, p,
            x[p], job.current_per_pool[p]));
      }
    }
    if (n != opt.nodes) {
      return absl::FailedPreconditionError(
          absl::StrFormat("job %d: per-pool counts sum to %d, option has %d nodes", j, n, opt.nodes));
    }
  }
  for (size_t p = 0; p < num_pools; ++p) {
    if (used[p] > model.pools[p].capacity) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pool %d over-subscribed: %d nodes assigned, capacity %d", p, used[p],
          model.pools[p].capacity));
    }
  }
  const double expected = SolutionObjective(model, solution.option);
  if (std::abs(expected - solution.objective) > 1e-9 * std::max(1.0, std::abs(expected))) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "solution objective %.17g differs from its options' values %.17g", solution.objective,
        expected));
  }
  return absl::OkStatus();
}

absl::StatusOr<CountSolution> PlaceOptions(const CountModel& model, absl::Span<const int> option) {
  const int num_jobs = static_cast<int>(model.jobs.size());
  const int num_pools = static_cast<int>(model.pools.size());
  if (static_cast<int>(option.size()) != num_jobs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PlaceOptions: %d options for %d jobs", option.size(), num_jobs));
  }
  CountSolution s;
  s.option.assign(option.begin(), option.end());
  s.per_pool.assign(num_jobs, std::vector<int>(num_pools, 0));
  // A growing (or staying) job keeps its held nodes: placed up front. The
  // rest of every job's count is a flow: source -> job (its count left) ->
  // pool (its pattern's pools; a shrinking job only its own nodes in them)
  // -> sink (the pool's nodes not held by a growing job).
  std::vector<long long> pool_left(num_pools);
  for (int p = 0; p < num_pools; ++p) pool_left[p] = model.pools[p].capacity;
  const int source = num_jobs + num_pools, sink = source + 1;
  MaxFlow flow(sink + 1);
  std::vector<std::vector<std::pair<int, int>>> arcs(num_jobs);  // (pool, arc)
  long long demand = 0;
  for (int j = 0; j < num_jobs; ++j) {
    const JobModel& job = model.jobs[j];
    const int o = option[j];
    if (o < 0 || o >= static_cast<int>(job.options.size())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "PlaceOptions: job %d: option %d out of range [0, %d)", j, o, job.options.size()));
    }
    const Option& opt = job.options[o];
    if (opt.nodes == 0) continue;
    const bool grows = opt.nodes >= job.current_nodes;
    int left = opt.nodes;
    if (grows) {
      for (int p = 0; p < num_pools; ++p) {
        s.per_pool[j][p] = job.current_per_pool[p];
        pool_left[p] -= job.current_per_pool[p];
        left -= job.current_per_pool[p];
      }
    }
    if (left == 0) continue;
    demand += left;
    flow.AddArc(source, j, left);
    for (int p : job.patterns[opt.pattern].pools) {
      const long long cap = grows ? left : job.current_per_pool[p];
      if (cap > 0) arcs[j].emplace_back(p, flow.AddArc(j, num_jobs + p, cap));
    }
  }
  for (int p = 0; p < num_pools; ++p) {
    if (pool_left[p] < 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pool %d: growing jobs hold %d nodes more than it has", p, -pool_left[p]));
    }
    if (pool_left[p] > 0) flow.AddArc(num_jobs + p, sink, pool_left[p]);
  }
  const long long placed = flow.Run(source, sink);
  if (placed != demand) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the chosen options need %d more nodes than the pools can place", demand - placed));
  }
  for (int j = 0; j < num_jobs; ++j) {
    for (const auto& [p, arc] : arcs[j]) s.per_pool[j][p] += static_cast<int>(flow.Flow(arc));
  }
  s.objective = SolutionObjective(model, s.option);
  return s;
}

CountSolution CurrentSolution(const CountModel& model) {
  CountSolution s;
  for (const JobModel& job : model.jobs) {
    s.option.push_back(job.current_option);
    if (job.current_option != 0) {
      s.per_pool.push_back(job.current_per_pool);
    } else {
      s.per_pool.push_back(std::vector<int>(model.pools.size(), 0));
    }
  }
  s.objective = SolutionObjective(model, s.option);
  return s;
}

}  // namespace malle::alloc
