// The count formulation (milp.h), its solve in a forked child, and the
// fallback to the DP.
//
// Formulation. For job j and each option o in jobs[j].options, a binary
// y[j,o]; the objective is sum value(o) * y[j,o], every coefficient scaled by
// one common factor so that the largest is 1e3 (values are samples over the
// window and reach 1e9; CBC's absolute tolerances assume moderate numbers).
//   choice:    sum_o y[j,o] = 1                                   per job
// Single pool (or none), the multiple-choice knapsack:
//   capacity:  sum_{j,o} nodes(o) y[j,o] <= capacity              (0 if no pool)
// Several pools: integer x[j,p] in [0, min(capacity_p, max_nodes_j)] for each
// pool p that some pattern of j admits or that j holds nodes of (0 if no
// pattern admits p), and per job:
//   (a) count:    sum_p x[j,p] - sum_o nodes(o) y[j,o] = 0
//   (b) pattern:  x[j,p] - sum_{o: p in pattern(o)} nodes(o) y[j,o] <= 0
//   (c) keep:     x[j,p] - cur[j,p] sum_{o: nodes(o) >= cur_j} y[j,o] >= 0   (cur[j,p] > 0)
//   (d) release:  x[j,p] - sum_{o: nodes(o) > cur_j} nodes(o) y[j,o] <= cur[j,p]  (cur_j > 0)
//   capacity:     sum_j x[j,p] <= capacity_p                        per pool
// (b) is left out where every running option admits p (then (a) implies it).
// These are the rules of count_model.h; CheckSolution verifies every answer.
//
// Isolation. With SolveIsolation::kFork the MipModel is built here, then a
// child is forked that only runs SolveWithCbc and writes a fixed binary
// record to a pipe. The parent waits with poll() until time_limit +
// kill_grace, SIGKILLs the child by pid if it is late, and always reaps it.
// A crash, a hang, a short or malformed record all become a fallback to the
// DP with the cause in `reason`.
#include "libmalle/alloc/milp.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libmalle/alloc/dp.h"
#include "libmalle/alloc/heuristics.h"
#include "libmalle/alloc/internal/cbc_solver.h"
#include "libmalle/alloc/internal/decomposition.h"
#include "libmalle/base/check.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"

namespace malle::alloc {
namespace {

using internal::CbcSettings;
using internal::MipModel;
using internal::MipResult;

constexpr double kInf = std::numeric_limits<double>::infinity();
// Largest |objective coefficient| after scaling.
constexpr double kObjectiveScaleTarget = 1e3;

// A run of job options with consecutive node counts [first, last], one
// pattern and batch option, whose values lie on one line (see
// BuildSegmentFormulation).
struct Piece {
  int first = 0, last = 0;    // node counts
  std::vector<int> options;   // option index for first, first + 1, ..., last
  double value_first = 0.0;   // value at `first`
  double slope = 0.0;         // value per node above `first`
  int z = -1;                 // binary: the job's count lies in this piece
  int d = -1;                 // integer in [0, last - first]: nodes above first (-1 if first == last)
  int pattern = -1;           // the options' pattern (-1 for the zero piece)
};

struct Formulation {
  MipModel mip;
  double scale = 1.0;               // objective coefficient = value * scale
  std::vector<std::vector<int>> y;  // y[j][o]: column of job j's option o (option formulation)
  std::vector<std::vector<int>> x;  // x[j][p]: column, or -1 (multi-pool only)
  std::vector<std::vector<Piece>> pieces;  // per job (segment formulation; then y is empty)
  // Several pools without x: the per-pool split comes from PlaceOptions.
  bool placed_by_flow = false;
  int union_rows = 0;  // rows of the pool-union formulation
};

// With one pool, an option that uses more nodes than another option of the
// same job for no more value is never needed: the smaller one is feasible
// whenever the larger one is. Leaving such columns out shrinks the model and
// the tree without changing the optimum. The current option is always kept
// (it carries the start). With several pools a smaller option may be
// infeasible where a larger one is not (keep/release rules), so all stay.
std::vector<bool> NeededOptions(const CountModel& model, const JobModel& job) {
  std::vector<bool> needed(job.options.size(), true);
  if (!model.single_pool()) return needed;
  std::vector<int> order(job.options.size());
  for (size_t o = 0; o < order.size(); ++o) order[o] = static_cast<int>(o);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return job.options[a].nodes < job.options[b].nodes;
  });
  double best_below = -kInf;  // best value with fewer nodes than the current group
  double best_here = -kInf;   // best value with exactly `nodes` nodes
  int nodes = -1;
  for (int o : order) {
    const Option& opt = job.options[o];
    if (opt.nodes != nodes) {
      best_below = std::max(best_below, best_here);
      best_here = -kInf;
      nodes = opt.nodes;
    }
    if (opt.value <= best_below && o != job.current_option && o != 0) needed[o] = false;
    best_here = std::max(best_here, opt.value);
  }
  return needed;
}

// Jobs with equal keys (same options, values, patterns and current nodes)
// are interchangeable in every solution.
std::string IdenticalJobKey(const JobModel& job) {
  std::string key;
  auto put = [&key](const void* data, size_t size) {
    key.append(static_cast<const char*>(data), size);
  };
  for (const Option& o : job.options) {
    put(&o.nodes, sizeof(o.nodes));
    put(&o.value, sizeof(o.value));
    put(&o.batch_option, sizeof(o.batch_option));
    const std::vector<int>& pools =
        o.pattern >= 0 ? job.patterns[o.pattern].pools : std::vector<int>{};
    const int size = static_cast<int>(pools.size());
    put(&size, sizeof(size));
    if (size > 0) put(pools.data(), pools.size() * sizeof(int));
  }
  put(job.current_per_pool.data(), job.current_per_pool.size() * sizeof(int));
  put(&job.current_option, sizeof(job.current_option));
  return key;
}

// Job j's pool columns x[j,p], one for every pool that some running option
// (or piece) admits (`admitted_by[p]` > 0) or that the job holds nodes of,
// bounded by the pool's capacity and the job's maximum (0 where no option
// admits the pool: the job must leave it). Registers them in f.x and
// `pool_cols` and appends them to the count row (`cols`, coefficient 1).
void AddPoolCountColumns(const CountModel& model, int j, const std::vector<int>& admitted_by,
                         Formulation& f, std::vector<std::vector<int>>& pool_cols,
                         std::vector<int>& cols, std::vector<double>& vals) {
  const JobModel& job = model.jobs[j];
  for (size_t p = 0; p < model.pools.size(); ++p) {
    if (admitted_by[p] == 0 && job.current_per_pool[p] == 0) continue;
    const int ub = admitted_by[p] == 0 ? 0 : std::min(model.pools[p].capacity, job.max_nodes);
    const int xc = f.mip.AddCol(0, ub, 0.0, /*integer=*/true);
    f.x[j][p] = xc;
    pool_cols[p].push_back(xc);
    cols.push_back(xc);
    vals.push_back(1.0);
  }
}

// `start`: the first incumbent (nullptr: the current allocation), or no
// start at all when `use_start` is false.
Formulation BuildFormulation(const CountModel& model, bool use_start, const CountSolution* start) {
  Formulation f;
  double largest = 0.0;
  for (const JobModel& job : model.jobs) {
    for (const Option& o : job.options) largest = std::max(largest, std::fabs(o.value));
  }
  if (largest > 0.0) f.scale = kObjectiveScaleTarget / largest;

  const int num_jobs = static_cast<int>(model.jobs.size());
  const int num_pools = static_cast<int>(model.pools.size());
  MipModel& mip = f.mip;
  mip.maximize = true;
  f.y.resize(num_jobs);
  for (int j = 0; j < num_jobs; ++j) {
    const JobModel& job = model.jobs[j];
    const std::vector<bool> needed = NeededOptions(model, job);
    std::vector<int> cols;
    for (size_t o = 0; o < job.options.size(); ++o) {
      if (!needed[o]) {
        f.y[j].push_back(-1);
        continue;
      }
      f.y[j].push_back(mip.AddCol(0, 1, job.options[o].value * f.scale, /*integer=*/true));
      cols.push_back(f.y[j].back());
    }
    mip.AddRow(cols, std::vector<double>(cols.size(), 1.0), 1, 1);
  }

  if (model.single_pool()) {
    std::vector<int> cols;
    std::vector<double> nodes;
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = model.jobs[j];
      for (size_t o = 0; o < job.options.size(); ++o) {
        if (job.options[o].nodes == 0 || f.y[j][o] < 0) continue;
        cols.push_back(f.y[j][o]);
        nodes.push_back(job.options[o].nodes);
      }
    }
    mip.AddRow(cols, nodes, -kInf, model.pools.empty() ? 0 : model.pools[0].capacity);
  } else {
    std::vector<std::vector<int>> pool_cols(num_pools);
    f.x.assign(num_jobs, std::vector<int>(num_pools, -1));
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = model.jobs[j];
      const int cur = job.current_nodes;
      // Which pools each option admits, and whether every running option
      // admits a pool.
      std::vector<int> admitted_by(num_pools, 0);
      int running = 0;
      for (const Option& o : job.options) {
        if (o.nodes == 0) continue;
        ++running;
        for (int p : job.patterns[o.pattern].pools) ++admitted_by[p];
      }
      std::vector<int> count_cols;
      std::vector<double> count_vals;
      AddPoolCountColumns(model, j, admitted_by, f, pool_cols, count_cols, count_vals);
      // (a)
      for (size_t o = 0; o < job.options.size(); ++o) {
        if (job.options[o].nodes == 0) continue;
        count_cols.push_back(f.y[j][o]);
        count_vals.push_back(-job.options[o].nodes);
      }
      mip.AddRow(count_cols, count_vals, 0, 0);
      for (int p = 0; p < num_pools; ++p) {
        const int xc = f.x[j][p];
        if (xc < 0) continue;
        // (b)
        if (admitted_by[p] > 0 && admitted_by[p] < running) {
          std::vector<int> cols = {xc};
          std::vector<double> vals = {1.0};
          for (size_t o = 0; o < job.options.size(); ++o) {
            const Option& opt = job.options[o];
            if (opt.nodes == 0) continue;
            const std::vector<int>& pools = job.patterns[opt.pattern].pools;
            if (!std::binary_search(pools.begin(), pools.end(), p)) continue;
            cols.push_back(f.y[j][o]);
            vals.push_back(-opt.nodes);
          }
          mip.AddRow(cols, vals, -kInf, 0);
        }
        const int held = job.current_per_pool[p];
        // (c)
        if (held > 0) {
          std::vector<int> cols = {xc};
          std::vector<double> vals = {1.0};
          for (size_t o = 0; o < job.options.size(); ++o) {
            if (job.options[o].nodes < cur) continue;
            cols.push_back(f.y[j][o]);
            vals.push_back(-held);
          }
          mip.AddRow(cols, vals, 0, kInf);
        }
        // (d)
        if (cur > 0) {
          std::vector<int> cols = {xc};
          std::vector<double> vals = {1.0};
          for (size_t o = 0; o < job.options.size(); ++o) {
            if (job.options[o].nodes <= cur) continue;
            cols.push_back(f.y[j][o]);
            vals.push_back(-job.options[o].nodes);
          }
          mip.AddRow(cols, vals, -kInf, held);
        }
      }
    }
    for (int p = 0; p < num_pools; ++p) {
      mip.AddRow(pool_cols[p], std::vector<double>(pool_cols[p].size(), 1.0), -kInf,
                 model.pools[p].capacity);
    }
  }

  // Identical jobs (same options, values, patterns and current nodes) are
  // interchangeable: any solution stays optimal with their choices swapped.
  // Jobs of one model submitted many times (HPO trials, the ImageNet mixes)
  // make this common, and branch-and-bound would otherwise explore every
  // permutation of them. Order them: count(a) >= count(b) for consecutive
  // identical jobs. Their current counts are equal, so the start obeys it.
  std::map<std::string, std::vector<int>> kinds;  // identical jobs, in index order
  {
    std::map<std::string, int> last_of_kind;
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = model.jobs[j];
      std::string key = IdenticalJobKey(job);
      kinds[key].push_back(j);
      auto [it, first] = last_of_kind.emplace(std::move(key), j);
      if (first) continue;
      const int prev = it->second;
      it->second = j;
      std::vector<int> cols;
      std::vector<double> vals;
      for (size_t o = 0; o < job.options.size(); ++o) {
        if (job.options[o].nodes == 0 || f.y[j][o] < 0) continue;
        cols.push_back(f.y[prev][o]);
        vals.push_back(job.options[o].nodes);
        cols.push_back(f.y[j][o]);
        vals.push_back(-job.options[o].nodes);
      }
      if (!cols.empty()) mip.AddRow(cols, vals, 0, kInf);
    }
  }

  if (use_start) {
    // Keeping every job where it is obeys every rule, so CBC starts with an
    // incumbent and a time limit can never leave it with nothing.
    CountSolution current = start != nullptr ? *start : CurrentSolution(model);
    if (start != nullptr) {
      // A given start may use an option left out as dominated (a DP breaks
      // ties its own way): the best kept option with no more nodes is worth
      // at least as much and needs no more capacity (one pool only, the only
      // case where options are left out).
      for (int j = 0; j < num_jobs; ++j) {
        const JobModel& job = model.jobs[j];
        const int o = current.option[j];
        if (f.y[j][o] >= 0) continue;
        int best = 0;
        for (size_t k = 0; k < job.options.size(); ++k) {
          if (f.y[j][k] < 0 || job.options[k].nodes > job.options[o].nodes) continue;
          const Option& b = job.options[best];
          const Option& c = job.options[k];
          if (c.value > b.value || (c.value == b.value && c.nodes < b.nodes)) {
            best = static_cast<int>(k);
          }
        }
        current.option[j] = best;
        if (num_pools == 1) current.per_pool[j][0] = job.options[best].nodes;
      }
      // Identical jobs are interchangeable; the ordering rows above want
      // non-increasing counts in index order.
      for (const auto& [key, group] : kinds) {
        if (group.size() < 2) continue;
        std::vector<std::pair<int, std::vector<int>>> choices;
        for (int j : group) choices.emplace_back(current.option[j], current.per_pool[j]);
        const JobModel& job = model.jobs[group[0]];
        std::stable_sort(choices.begin(), choices.end(), [&job](const auto& a, const auto& b) {
          return job.options[a.first].nodes > job.options[b.first].nodes;
        });
        for (size_t k = 0; k < group.size(); ++k) {
          current.option[group[k]] = choices[k].first;
          current.per_pool[group[k]] = std::move(choices[k].second);
        }
      }
    }
    mip.start.assign(mip.num_cols(), 0.0);
    for (int j = 0; j < num_jobs; ++j) {
      mip.start[f.y[j][current.option[j]]] = 1.0;
      if (f.x.empty()) continue;
      for (int p = 0; p < num_pools; ++p) {
        if (f.x[j][p] >= 0) mip.start[f.x[j][p]] = current.per_pool[j][p];
      }
    }
  }
  return f;
}

// Segment formulation (one pool). A job's options are grouped into pieces:
// runs of consecutive node counts (same pattern and batch option) whose
// values lie on one line; the current count is always a piece of its own
// (it carries no resize cost, so its value is off the line), and so is 0.
// Per piece s of job j a binary z[j,s] and, if it spans more than one count,
// an integer d[j,s] in [0, last_s - first_s]:
//   choice:    sum_s z[j,s] = 1                                   per job
//   link:      d[j,s] - (last_s - first_s) z[j,s] <= 0            per piece
//   capacity:  sum_{j,s} first_s z[j,s] + d[j,s] <= capacity
//   objective: sum value(first_s) z[j,s] + slope_s d[j,s]
// The job's count is first_s + d[j,s] of its chosen piece. This is the
// multiple-choice knapsack with its linear runs merged: the LP bound is the
// same (the concave envelope of each job's values), but once every job's
// piece is fixed the LP is a continuous knapsack with unit weights, integer
// piece lengths and an integer capacity, whose optimum is integral. Branching
// only decides pieces, not counts, which is what removes the long proofs of
// the option formulation (docs/allocator.md; docs/benchmarks.md has the
// figures). Values are collinear within kCollinearTolerance times the
// largest |value| of the model; the objective CBC sees differs from the true
// one by at most that per job, and the answer's objective is recomputed from
// the options.
constexpr double kCollinearTolerance = 1e-10;

// `split_shrinks`: a piece below the current count never straddles a sum
// of the job's held nodes over a subset of its held pools inside the
// piece's pattern (the pool-union rows need it for jobs holding nodes of
// several pools: a shrinking job's least use of a union T of pools is
// max(0, n - c) with c such a sum, linear only on either side of c).
std::vector<Piece> JobPieces(const JobModel& job, double tolerance, bool split_shrinks) {
  std::map<std::pair<int, int>, std::vector<int>> groups;  // (pattern, batch) -> options
  std::vector<Piece> pieces;
  for (size_t o = 0; o < job.options.size(); ++o) {
    const Option& opt = job.options[o];
    if (opt.nodes == 0) {
      Piece zero;
      zero.options = {static_cast<int>(o)};
      zero.value_first = opt.value;
      pieces.push_back(std::move(zero));
      continue;
    }
    groups[{opt.pattern, opt.batch_option}].push_back(static_cast<int>(o));
  }
  for (auto& [key, opts] : groups) {
    std::stable_sort(opts.begin(), opts.end(), [&job](int a, int b) {
      return job.options[a].nodes < job.options[b].nodes;
    });
    auto nodes = [&job](int o) { return job.options[o].nodes; };
    auto value = [&job](int o) { return job.options[o].value; };
    std::vector<int> sums = {0};  // subset sums of held counts inside the pattern
    if (split_shrinks) {
      for (int p : job.patterns[key.first].pools) {
        const int held = job.current_per_pool[p];
        if (held == 0) continue;
        const size_t before = sums.size();
        for (size_t k = 0; k < before; ++k) sums.push_back(sums[k] + held);
      }
    }
    // True if a shrinking piece from `first` to `last` would straddle a sum.
    auto straddles = [&](int first, int last) {
      if (!split_shrinks || first >= job.current_nodes) return false;
      for (int c : sums) {
        if (first < c && c < last) return true;
      }
      return false;
    };
    size_t i = 0;
    while (i < opts.size()) {
      Piece piece;
      piece.pattern = key.first;
      piece.options = {opts[i]};
      piece.first = piece.last = nodes(opts[i]);
      piece.value_first = value(opts[i]);
      size_t k = i + 1;
      // Extend while the next count is adjacent, neither end is the current
      // count, and every value of the run stays on the line through its ends.
      while (k < opts.size() && nodes(opts[k]) == piece.last + 1 &&
             nodes(opts[k]) != job.current_nodes && piece.first != job.current_nodes &&
             !straddles(piece.first, nodes(opts[k]))) {
        const double slope = (value(opts[k]) - piece.value_first) / (nodes(opts[k]) - piece.first);
        bool collinear = true;
        for (size_t m = i + 1; m < k && collinear; ++m) {
          const double line = piece.value_first + slope * (nodes(opts[m]) - piece.first);
          collinear = std::fabs(line - value(opts[m])) <= tolerance;
        }
        if (!collinear) break;
        piece.options.push_back(opts[k]);
        piece.last = nodes(opts[k]);
        piece.slope = slope;
        ++k;
      }
      pieces.push_back(std::move(piece));
      i = k;
    }
  }
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const Piece& a, const Piece& b) { return a.first < b.first; });
  return pieces;
}

// A job's best value at each node count, leaving out option `skip` (-1: none).
std::map<int, double> BestValueByCount(const JobModel& job, int skip) {
  std::map<int, double> best;
  for (size_t o = 0; o < job.options.size(); ++o) {
    if (static_cast<int>(o) == skip) continue;
    const Option& opt = job.options[o];
    auto [it, fresh] = best.emplace(opt.nodes, opt.value);
    if (!fresh) it->second = std::max(it->second, opt.value);
  }
  return best;
}

// The best option of `job` with `count` nodes other than `skip` (-1: none);
// -1 if there is none.
int BestOptionAt(const JobModel& job, int count, int skip) {
  int chosen = -1;
  for (size_t o = 0; o < job.options.size(); ++o) {
    if (static_cast<int>(o) == skip || job.options[o].nodes != count) continue;
    if (chosen < 0 || job.options[o].value > job.options[chosen].value) chosen = static_cast<int>(o);
  }
  return chosen;
}

// Splits `group` (taken in order) into chains by first fit: each job joins the
// first chain whose last job `a` it may follow (`follows(a, job)`). Appends
// the chains of two or more jobs to `out`.
void FirstFitChains(const std::vector<int>& group, const std::function<bool(int, int)>& follows,
                    std::vector<std::vector<int>>* out) {
  std::vector<std::vector<int>> fitted;
  for (int b : group) {
    auto chain = std::find_if(fitted.begin(), fitted.end(),
                              [&](const std::vector<int>& c) { return follows(c.back(), b); });
    if (chain == fitted.end()) {
      fitted.push_back({b});
    } else {
      chain->push_back(b);
    }
  }
  for (std::vector<int>& chain : fitted) {
    if (chain.size() >= 2) out->push_back(std::move(chain));
  }
}

// Several pools, segment formulation: per job an integer x[j,p] for every
// pool some piece admits (or the job holds nodes of), linked to the job's
// count, sum_s first_s z[j,s] + d[j,s] (`count[j]`), by the rules of
// count_model.h, as in BuildFormulation with n(o) y[j,o] replaced by the
// piece's count (exactly one piece is chosen, and the current count is a
// piece of its own, so "grows" and "shrinks" are known per piece):
//   (a) count:    sum_p x[j,p] - count_j = 0
//   (b) pattern:  x[j,p] - sum_{s: p in pattern(s)} count_s <= 0
//   (c) keep:     x[j,p] - cur[j,p] sum_{s: first_s >= cur_j} z[j,s] >= 0    (cur[j,p] > 0)
//   (d) release:  x[j,p] - sum_{s: first_s > cur_j} count_s <= cur[j,p]       (cur_j > 0)
//   capacity:     sum_j x[j,p] <= capacity_p
// With the pieces fixed, what is left is a flow of jobs' counts into pools
// with integer bounds, whose LP optimum is integral: the search branches on
// pieces only.
void AddPoolRows(const CountModel& model,
                 const std::vector<std::vector<std::pair<int, double>>>& count, Formulation& f) {
  MipModel& mip = f.mip;
  const int num_jobs = static_cast<int>(model.jobs.size());
  const int num_pools = static_cast<int>(model.pools.size());
  std::vector<std::vector<int>> pool_cols(num_pools);
  f.x.assign(num_jobs, std::vector<int>(num_pools, -1));
  for (int j = 0; j < num_jobs; ++j) {
    const JobModel& job = model.jobs[j];
    const int cur = job.current_nodes;
    // A piece's count terms.
    auto piece_terms = [](const Piece& piece, std::vector<int>& cols, std::vector<double>& vals,
                          double sign) {
      if (piece.first > 0) {
        cols.push_back(piece.z);
        vals.push_back(sign * piece.first);
      }
      if (piece.d >= 0) {
        cols.push_back(piece.d);
        vals.push_back(sign);
      }
    };
    std::vector<int> admitted_by(num_pools, 0);
    int running = 0;
    for (const Piece& piece : f.pieces[j]) {
      if (piece.pattern < 0) continue;
      ++running;
      for (int p : job.patterns[piece.pattern].pools) ++admitted_by[p];
    }
    std::vector<int> a_cols;
    std::vector<double> a_vals;
    AddPoolCountColumns(model, j, admitted_by, f, pool_cols, a_cols, a_vals);
    for (const auto& [col, coef] : count[j]) {
      a_cols.push_back(col);
      a_vals.push_back(-coef);
    }
    mip.AddRow(a_cols, a_vals, 0, 0);  // (a)
    for (int p = 0; p < num_pools; ++p) {
      const int xc = f.x[j][p];
      if (xc < 0) continue;
      if (admitted_by[p] > 0 && admitted_by[p] < running) {  // (b)
        std::vector<int> cols = {xc};
        std::vector<double> vals = {1.0};
        for (const Piece& piece : f.pieces[j]) {
          if (piece.pattern < 0) continue;
          const std::vector<int>& pools = job.patterns[piece.pattern].pools;
          if (std::binary_search(pools.begin(), pools.end(), p)) piece_terms(piece, cols, vals, -1);
        }
        mip.AddRow(cols, vals, -kInf, 0);
      }
      const int held = job.current_per_pool[p];
      if (held > 0) {  // (c)
        std::vector<int> cols = {xc};
        std::vector<double> vals = {1.0};
        for (const Piece& piece : f.pieces[j]) {
          if (piece.first < cur) continue;
          cols.push_back(piece.z);
          vals.push_back(-held);
        }
        mip.AddRow(cols, vals, 0, kInf);
      }
      if (cur > 0) {  // (d)
        std::vector<int> cols = {xc};
        std::vector<double> vals = {1.0};
        for (const Piece& piece : f.pieces[j]) {
          if (piece.first > cur) piece_terms(piece, cols, vals, -1);
        }
        mip.AddRow(cols, vals, -kInf, held);
      }
    }
  }
  for (int p = 0; p < num_pools; ++p) {
    mip.AddRow(pool_cols[p], std::vector<double>(pool_cols[p].size(), 1.0), -kInf,
               model.pools[p].capacity);
  }
}

// Several pools, pool-union formulation (MilpOptions::Pools::kUnionRows).
// Once every job's option is fixed, placing the counts is a transportation
// problem: job j sends n_j nodes to pools, at least l[j,p] and at most
// u[j,p] to pool p (a growing job: l = its held nodes, u unbounded inside
// its pattern; a shrinking one: l = 0, u = its held nodes inside its
// pattern), pool p takes at most cap_p. By max-flow/min-cut (with the lower
// bounds moved out) a placement exists iff for every set T of pools
//   sum_j max(l_j(T), n_j - u_j(not T)) <= cap(T).
// Subtracting every job's held nodes in T from both sides:
//   sum_{growing j, pattern_j within T} (n_j - cur_j)
//     - sum_{other j} (cur_j(T) - max(0, n_j - cur_j(A_j \ T))) <= free(T)
// (A_j: the held pools inside the shrinking job's pattern; a growing job
// whose pattern leaves T contributes 0, a stopped job -cur_j(T)): growth
// into T is bounded by T's free nodes plus what is released in T. Both
// free(T) and the released nodes grow with T, while the growth term changes
// only when T takes in a whole pattern: the rows for T = unions of growing
// pieces' patterns imply all others. Each row is linear in (z, d) of a
// piece, except max(0, n - c) across a shrinking piece that straddles c,
// which is why jobs holding nodes of several pools get unit shrink pieces.
// Returns false (nothing added) beyond `limit` unions or 64 pools.
bool AddUnionRows(const CountModel& model, int limit, Formulation& f) {
  const int num_pools = static_cast<int>(model.pools.size());
  if (num_pools > 64) return false;
  auto mask_of = [](const std::vector<int>& pools) {
    uint64_t m = 0;
    for (int p : pools) m |= uint64_t{1} << p;
    return m;
  };
  std::vector<uint64_t> masks;
  for (size_t j = 0; j < model.jobs.size(); ++j) {
    const JobModel& job = model.jobs[j];
    for (const Piece& piece : f.pieces[j]) {
      if (piece.pattern >= 0 && piece.last > job.current_nodes) {
        masks.push_back(mask_of(job.patterns[piece.pattern].pools));
      }
    }
  }
  std::sort(masks.begin(), masks.end());
  masks.erase(std::unique(masks.begin(), masks.end()), masks.end());
  std::vector<uint64_t> unions;
  {
    absl::flat_hash_set<uint64_t> seen;
    for (uint64_t m : masks) {
      const size_t before = unions.size();
      if (seen.insert(m).second) unions.push_back(m);
      for (size_t k = 0; k < before; ++k) {
        if (seen.insert(unions[k] | m).second) unions.push_back(unions[k] | m);
      }
      if (static_cast<int>(unions.size()) > limit) return false;
    }
  }
  std::sort(unions.begin(), unions.end());
  auto in = [](uint64_t mask, int p) { return (mask >> p) & 1; };
  for (uint64_t t : unions) {
    double free_nodes = 0;
    for (int p = 0; p < num_pools; ++p) {
      if (in(t, p)) free_nodes += model.pools[p].capacity;
    }
    std::vector<int> cols;
    std::vector<double> vals;
    bool grows = false;
    auto put = [&](int col, double v) {
      if (col < 0 || v == 0) return;
      cols.push_back(col);
      vals.push_back(v);
      grows = grows || v > 0;
    };
    for (size_t j = 0; j < model.jobs.size(); ++j) {
      const JobModel& job = model.jobs[j];
      const int cur = job.current_nodes;
      double cur_t = 0;
      uint64_t held = 0;
      for (int p = 0; p < num_pools; ++p) {
        if (job.current_per_pool[p] == 0) continue;
        held |= uint64_t{1} << p;
        if (in(t, p)) cur_t += job.current_per_pool[p];
      }
      free_nodes -= cur_t;
      for (const Piece& piece : f.pieces[j]) {
        if (piece.pattern < 0) {
          put(piece.z, -cur_t);  // stopped: releases all it holds
          continue;
        }
        const uint64_t pattern = mask_of(job.patterns[piece.pattern].pools);
        if (piece.first >= cur) {  // grows or stays: keeps its nodes
          if ((pattern & ~t) == 0) {
            put(piece.z, piece.first - cur);
            put(piece.d, 1.0);
          }
          continue;
        }
        // Shrinks: uses at least max(0, n - c) nodes of T.
        double c = 0;
        for (int p = 0; p < num_pools; ++p) {
          if (in(held & pattern & ~t, p)) c += job.current_per_pool[p];
        }
        if (c == 0 || piece.first >= c) {
          put(piece.z, piece.first - c - cur_t);
          put(piece.d, 1.0);
        } else {
          MALLE_CHECK(piece.last <= c) << "a shrinking piece straddles a pool-union threshold";
          put(piece.z, -cur_t);
        }
      }
    }
    // Without growth into T the row holds by itself (free(T) >= 0).
    if (!grows) continue;
    f.mip.AddRow(cols, vals, -kInf, free_nodes);
    ++f.union_rows;
  }
  f.placed_by_flow = true;
  return true;
}

// Identical jobs (same options, values, patterns and current nodes per pool)
// are interchangeable in every solution: rows count(a) >= count(b) for
// consecutive ones, and the groups (in index order) for the start.
void IdenticalJobRows(const CountModel& model,
                      const std::vector<std::vector<std::pair<int, double>>>& count, Formulation& f,
                      std::vector<std::vector<int>>* groups) {
  std::map<std::string, std::vector<int>> kinds;
  for (int j = 0; j < static_cast<int>(model.jobs.size()); ++j) {
    kinds[IdenticalJobKey(model.jobs[j])].push_back(j);
  }
  for (auto& [key, group] : kinds) {
    if (group.size() < 2) continue;
    for (size_t k = 1; k < group.size(); ++k) {
      std::vector<int> cols;
      std::vector<double> vals;
      for (const auto& [col, coef] : count[group[k - 1]]) {
        cols.push_back(col);
        vals.push_back(coef);
      }
      for (const auto& [col, coef] : count[group[k]]) {
        cols.push_back(col);
        vals.push_back(-coef);
      }
      if (!cols.empty()) f.mip.AddRow(cols, vals, 0, kInf);
    }
    groups->push_back(std::move(group));
  }
}

Formulation BuildSegmentFormulation(const CountModel& model, bool use_start,
                                    const CountSolution* start, const MilpOptions& options) {
  Formulation f;
  double largest = 0.0;
  for (const JobModel& job : model.jobs) {
    for (const Option& o : job.options) largest = std::max(largest, std::fabs(o.value));
  }
  if (largest > 0.0) f.scale = kObjectiveScaleTarget / largest;
  const double tolerance = kCollinearTolerance * largest;

  const int num_jobs = static_cast<int>(model.jobs.size());
  MipModel& mip = f.mip;
  mip.maximize = true;
  // Per job, the count as (column, coefficient) terms.
  std::vector<std::vector<std::pair<int, double>>> count(num_jobs);
  std::vector<int> cap_cols;
  std::vector<double> cap_vals;
  const bool multi = !model.single_pool();
  const bool try_unions = multi && options.pools == MilpOptions::Pools::kUnionRows;
  for (int j = 0; j < num_jobs; ++j) {
    int held_pools = 0;
    for (int c : model.jobs[j].current_per_pool) held_pools += c > 0 ? 1 : 0;
    f.pieces.push_back(JobPieces(model.jobs[j], tolerance, try_unions && held_pools > 1));
    std::vector<int> choice;
    for (Piece& piece : f.pieces.back()) {
      piece.z = mip.AddCol(0, 1, piece.value_first * f.scale, /*integer=*/true);
      choice.push_back(piece.z);
      if (piece.first > 0) count[j].emplace_back(piece.z, piece.first);
      if (piece.last > piece.first) {
        piece.d = mip.AddCol(0, piece.last - piece.first, piece.slope * f.scale, /*integer=*/true);
        count[j].emplace_back(piece.d, 1.0);
        mip.AddRow({piece.d, piece.z}, {1.0, -static_cast<double>(piece.last - piece.first)},
                   -kInf, 0);
      }
    }
    mip.AddRow(choice, std::vector<double>(choice.size(), 1.0), 1, 1);
    for (const auto& [col, coef] : count[j]) {
      cap_cols.push_back(col);
      cap_vals.push_back(coef);
    }
  }
  if (multi) {
    if (!try_unions || !AddUnionRows(model, options.max_union_rows, f)) AddPoolRows(model, count, f);
  } else {
    mip.AddRow(cap_cols, cap_vals, -kInf, model.pools.empty() ? 0 : model.pools[0].capacity);
  }

  // Ordered jobs. With one pool, take two jobs a, b that can run at the same
  // counts, and let v_a(n), v_b(n) be their best values at n nodes. If
  // v_a - v_b does not decrease with n, giving a the larger of two counts is
  // never worse: for n < m, v_a(m) + v_b(n) >= v_a(n) + v_b(m). So whenever
  // such jobs hold counts in the wrong order, swapping them (same capacity)
  // loses nothing, and some optimum has count(a) >= count(b). Jobs of one
  // model that differ only in their resize pauses (the ImageNet mixes, HPO
  // trials) are such pairs, and they are what makes branch-and-bound explore
  // near-equal permutations; identical jobs are the case v_a = v_b. Chains:
  // sort the jobs with one count set by v(max) - v(0), decreasing, and link
  // consecutive jobs where the condition holds (it then holds along the
  // chain, since differences add), so the chain's counts are non-increasing.
  std::vector<std::vector<int>> chains;
  std::vector<std::vector<int>> stay_chains;
  std::vector<std::vector<int>> identical;  // several pools only
  if (multi) {
    // With several pools a swap may break the keep/release rules; only
    // identical jobs (same options and current nodes per pool) are ordered.
    IdenticalJobRows(model, count, f, &identical);
  } else {
    std::map<std::vector<int>, std::vector<int>> by_counts;  // count set -> jobs
    std::vector<std::map<int, double>> best(num_jobs);      // count -> best value
    for (int j = 0; j < num_jobs; ++j) {
      best[j] = BestValueByCount(model.jobs[j], /*skip=*/-1);
      std::vector<int> counts;
      for (const auto& [n, v] : best[j]) counts.push_back(n);
      by_counts[counts].push_back(j);
    }
    auto spread = [&best](int j) { return best[j].rbegin()->second - best[j].begin()->second; };
    for (auto& [counts, group] : by_counts) {
      if (group.size() < 2) continue;
      std::stable_sort(group.begin(), group.end(),
                       [&](int a, int b) { return spread(a) > spread(b); });
      FirstFitChains(
          group,
          [&](int a, int b) {
            double previous = -kInf;
            for (auto ia = best[a].begin(), ib = best[b].begin(); ia != best[a].end(); ++ia, ++ib) {
              const double diff = ia->second - ib->second;
              if (diff < previous - tolerance) return false;
              previous = std::max(previous, diff);
            }
            return true;
          },
          &chains);
    }
    // Stay chains. For jobs a, b outside the count chains that both run now
    // at their current option (value s_a, s_b), let w(y) be a job's best value
    // at y nodes other than by staying. If a staying while b moves to y is
    // never better than the swap (a moves to y, b stays): w_a(y) + s_b >=
    // s_a + w_b(y) for every y, then some optimum has "a stays => b stays".
    // Chained like the count chains (the differences add), sorted by what a
    // job loses by moving, least first: the stayers of a chain are a suffix.
    std::vector<bool> in_chain(num_jobs, false);
    for (const std::vector<int>& chain : chains) {
      for (int j : chain) in_chain[j] = true;
    }
    std::map<std::vector<int>, std::vector<int>> by_moves;  // move count set -> jobs
    std::vector<std::map<int, double>> moves(num_jobs);      // count -> best value by moving
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = model.jobs[j];
      if (in_chain[j] || job.current_option == 0) continue;
      moves[j] = BestValueByCount(job, job.current_option);
      std::vector<int> counts;
      for (const auto& [n, v] : moves[j]) counts.push_back(n);
      by_moves[counts].push_back(j);
    }
    auto stay_value = [&model](int j) {
      return model.jobs[j].options[model.jobs[j].current_option].value;
    };
    for (auto& [counts, group] : by_moves) {
      if (group.size() < 2) continue;
      auto loss = [&](int j) {
        double sum = 0;
        for (const auto& [n, v] : moves[j]) sum += stay_value(j) - v;
        return sum;
      };
      std::stable_sort(group.begin(), group.end(), [&](int a, int b) { return loss(a) < loss(b); });
      FirstFitChains(
          group,
          [&](int a, int b) {
            for (auto ia = moves[a].begin(), ib = moves[b].begin(); ia != moves[a].end(); ++ia, ++ib) {
              if (ia->second + stay_value(b) < stay_value(a) + ib->second - tolerance) return false;
            }
            return true;
          },
          &stay_chains);
    }
    auto stay_column = [&f, &model](int j) {
      for (const Piece& piece : f.pieces[j]) {
        if (piece.options.size() == 1 && piece.options[0] == model.jobs[j].current_option) {
          return piece.z;
        }
      }
      return -1;
    };
    for (const std::vector<int>& chain : stay_chains) {
      for (size_t k = 1; k < chain.size(); ++k) {
        const int a = stay_column(chain[k - 1]), b = stay_column(chain[k]);
        MALLE_CHECK(a >= 0 && b >= 0) << "the current option is a piece of its own";
        mip.AddRow({b, a}, {1.0, -1.0}, 0, kInf);
      }
    }
    for (const std::vector<int>& chain : chains) {
      for (size_t k = 1; k < chain.size(); ++k) {
        std::vector<int> cols;
        std::vector<double> vals;
        for (const auto& [col, coef] : count[chain[k - 1]]) {
          cols.push_back(col);
          vals.push_back(coef);
        }
        for (const auto& [col, coef] : count[chain[k]]) {
          cols.push_back(col);
          vals.push_back(-coef);
        }
        if (!cols.empty()) mip.AddRow(cols, vals, 0, kInf);
      }
    }
  }

  if (use_start) {
    CountSolution first = start != nullptr ? *start : CurrentSolution(model);
    // Identical jobs: their (option, per-pool counts) in non-increasing
    // count order, as the rows want.
    for (const std::vector<int>& group : identical) {
      std::vector<std::pair<int, std::vector<int>>> choices;
      for (int j : group) choices.emplace_back(first.option[j], first.per_pool[j]);
      const JobModel& job = model.jobs[group[0]];
      std::stable_sort(choices.begin(), choices.end(), [&job](const auto& a, const auto& b) {
        return job.options[a.first].nodes > job.options[b.first].nodes;
      });
      for (size_t k = 0; k < group.size(); ++k) {
        first.option[group[k]] = choices[k].first;
        first.per_pool[group[k]] = std::move(choices[k].second);
      }
    }
    // Along a chain the counts must not increase: hand the chain's counts out
    // in decreasing order, each job at its best option for its count (by the
    // argument above, worth at least as much).
    for (const std::vector<int>& chain : chains) {
      std::vector<int> counts;
      for (int j : chain) counts.push_back(model.jobs[j].options[first.option[j]].nodes);
      std::sort(counts.begin(), counts.end(), std::greater<int>());
      for (size_t k = 0; k < chain.size(); ++k) {
        const JobModel& job = model.jobs[chain[k]];
        // Exists: the chain's jobs share their count set.
        first.option[chain[k]] = BestOptionAt(job, counts[k], /*skip=*/-1);
      }
    }
    // Along a stay chain the stayers must be a suffix: the movers' options
    // (as counts) go to the chain's first jobs, in their order.
    for (const std::vector<int>& chain : stay_chains) {
      std::vector<int> moved;
      for (int j : chain) {
        if (first.option[j] != model.jobs[j].current_option) {
          moved.push_back(model.jobs[j].options[first.option[j]].nodes);
        }
      }
      for (size_t k = 0; k < chain.size(); ++k) {
        const JobModel& job = model.jobs[chain[k]];
        if (k >= moved.size()) {
          first.option[chain[k]] = job.current_option;
          continue;
        }
        // Exists: the chain's jobs share their move count set.
        first.option[chain[k]] = BestOptionAt(job, moved[k], job.current_option);
      }
    }
    mip.start.assign(mip.num_cols(), 0.0);
    for (int j = 0; j < num_jobs; ++j) {
      for (const Piece& piece : f.pieces[j]) {
        const auto at = std::find(piece.options.begin(), piece.options.end(), first.option[j]);
        if (at == piece.options.end()) continue;
        mip.start[piece.z] = 1.0;
        if (piece.d >= 0) mip.start[piece.d] = static_cast<double>(at - piece.options.begin());
        break;
      }
      if (f.x.empty()) continue;
      for (size_t p = 0; p < model.pools.size(); ++p) {
        if (f.x[j][p] >= 0) mip.start[f.x[j][p]] = first.per_pool[j][p];
      }
    }
  }
  return f;
}

// Pricing (MilpOptions::pricing), for the segment formulation with a start.
// Most pieces of most jobs are far from any good answer, and CBC's cost
// grows with the columns (its LP, its strong branching). Exact in three
// steps, all on a restricted model (a subset of the pieces, every row):
//   1. Column generation: solve the restricted LP, price every piece left
//      out with its duals (r = value - y . column, r_z + max(0, r_d) L for a
//      piece of length L), add each job's best positive one, repeat until
//      none is left. The LP is then the full model's LP: its value UB bounds
//      every answer.
//   2. Price and branch: CBC on the generated pieces, from the start; its
//      incumbent LB (>= the start's).
//   3. Reduced-cost fixing: with the final duals, any answer that uses piece
//      k is worth at most UB + r_z(k) (every other term of the dual bound is
//      <= 0), so pieces with UB + r_z < LB appear in no answer better than
//      LB. CBC on the pieces left, from LB's answer: its optimum is the full
//      model's, its bound a bound of the full model.
// Step 3 is skipped when LB is already within the gap of UB. Returns the
// answer over the full model's columns.
absl::StatusOr<MipResult> SolveByPricing(const Formulation& f, const CbcSettings& settings) {
  const auto t0 = absl::Now();
  const MipModel& m = f.mip;
  MALLE_CHECK(m.maximize && !m.start.empty());
  const int n = m.num_cols();
  // Blocks: a piece's z (and d); per job.
  struct Block {
    int job, z, d;
    double d_ub;
  };
  std::vector<Block> blocks;
  for (size_t j = 0; j < f.pieces.size(); ++j) {
    for (const Piece& piece : f.pieces[j]) {
      blocks.push_back({static_cast<int>(j), piece.z, piece.d,
                        piece.d >= 0 ? m.col_ub[piece.d] : 0.0});
    }
  }
  // Column-major copy of the rows, for pricing.
  std::vector<std::vector<std::pair<int, double>>> col_rows(n);
  for (int r = 0; r < m.num_rows(); ++r) {
    for (int k = m.row_start[r]; k < m.row_start[r + 1]; ++k) {
      col_rows[m.col_index[k]].emplace_back(r, m.value[k]);
    }
  }
  auto reduced = [&](const std::vector<double>& y, int c) {
    double r = m.obj[c];
    for (const auto& [row, v] : col_rows[c]) r -= y[row] * v;
    return r;
  };
  std::vector<char> in(blocks.size(), 0);
  for (size_t b = 0; b < blocks.size(); ++b) {
    const Block& k = blocks[b];
    if (m.start[k.z] != 0.0 || (k.d >= 0 && m.start[k.d] != 0.0)) in[b] = 1;
    if (f.pieces[k.job].front().z == k.z) in[b] = 1;  // the zero piece: always feasible
  }
  auto columns_of = [&](const std::vector<char>& chosen) {
    std::vector<int> cols;
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (!chosen[b]) continue;
      cols.push_back(blocks[b].z);
      if (blocks[b].d >= 0) cols.push_back(blocks[b].d);
    }
    return cols;
  };
  // The model restricted to `cols`, built from the column-major copy.
  auto sub_model = [&](const std::vector<int>& cols) {
    MipModel sub;
    sub.maximize = true;
    std::vector<std::vector<std::pair<int, double>>> rows(m.num_rows());
    for (size_t i = 0; i < cols.size(); ++i) {
      const int c = cols[i];
      sub.AddCol(m.col_lb[c], m.col_ub[c], m.obj[c], m.is_integer[c] != 0);
      for (const auto& [r, v] : col_rows[c]) rows[r].emplace_back(static_cast<int>(i), v);
    }
    for (int r = 0; r < m.num_rows(); ++r) {
      sub.row_lb.push_back(m.row_lb[r]);
      sub.row_ub.push_back(m.row_ub[r]);
      for (const auto& [c, v] : rows[r]) {
        sub.col_index.push_back(c);
        sub.value.push_back(v);
      }
      sub.row_start.push_back(static_cast<int>(sub.col_index.size()));
    }
    return sub;
  };
  auto to_full = [&](const std::vector<int>& cols, const std::vector<double>& x) {
    std::vector<double> full(n, 0.0);
    for (size_t i = 0; i < cols.size(); ++i) full[cols[i]] = x[i];
    return full;
  };

  // 1. Column generation.
  std::vector<double> y;
  double ub = 0;
  int rounds = 0;
  for (;; ++rounds) {
    if (absl::Now() - t0 > settings.time_limit) {
      return absl::DeadlineExceededError("pricing: column generation ran out of time");
    }
    const std::vector<int> cols = columns_of(in);
    MALLE_ASSIGN_OR_RETURN(internal::LpResult lp, internal::SolveLpWithClp(sub_model(cols)));
    if (!lp.optimal) return absl::InternalError("pricing: restricted LP not solved");
    y = std::move(lp.row_duals);
    ub = lp.objective;
    const double tol = 1e-9 * std::max(1.0, std::fabs(ub));
    // Each job's kPerRound best positive pieces: many at once, since every
    // round re-solves the LP.
    constexpr size_t kPerRound = 8;
    std::vector<std::vector<std::pair<double, int>>> best(f.pieces.size());
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (in[b]) continue;
      const Block& k = blocks[b];
      double score = reduced(y, k.z);
      if (k.d >= 0) score += std::max(0.0, reduced(y, k.d)) * k.d_ub;
      if (score > tol) best[k.job].emplace_back(-score, static_cast<int>(b));
    }
    bool added = false;
    for (auto& job_best : best) {
      const size_t take = std::min(kPerRound, job_best.size());
      std::partial_sort(job_best.begin(), job_best.begin() + take, job_best.end());
      for (size_t i = 0; i < take; ++i) in[job_best[i].second] = 1;
      added = added || take > 0;
    }
    if (!added) break;
  }

  // 2. Price and branch.
  MipResult out;
  const double gap = settings.relative_gap;
  auto solve_on = [&](const std::vector<char>& chosen, const std::vector<double>& start,
                      absl::Duration limit) -> absl::StatusOr<std::pair<std::vector<int>, MipResult>> {
    const std::vector<int> cols = columns_of(chosen);
    internal::MipModel sub = sub_model(cols);
    for (int c : cols) sub.start.push_back(start[c]);
    CbcSettings s = settings;
    s.time_limit = std::max(limit, absl::Milliseconds(1));
    MALLE_ASSIGN_OR_RETURN(MipResult r, internal::SolveWithCbc(sub, s));
    return std::make_pair(cols, std::move(r));
  };
  // CBC's own clock starts after its root LP: each solve gets a share of
  // what is left, with a margin for that.
  const absl::Duration left1 = settings.time_limit - (absl::Now() - t0);
  MALLE_ASSIGN_OR_RETURN(auto first, solve_on(in, m.start, left1 * 0.4));
  std::vector<double> incumbent = m.start;
  double lb = 0;
  for (int c = 0; c < n; ++c) lb += m.obj[c] * m.start[c];
  if (!first.second.x.empty() && first.second.objective > lb) {
    incumbent = to_full(first.first, first.second.x);
    lb = first.second.objective;
  }
  const int generated = static_cast<int>(std::count(in.begin(), in.end(), 1));
  if (ub - lb <= gap * std::max(std::fabs(lb), 1e-12)) {
    out.status = MipResult::Status::kOptimal;
    out.x = incumbent;
    out.objective = lb;
    out.best_bound = std::max(ub, lb);
    out.branch_nodes = first.second.branch_nodes;
    out.detail = absl::StrFormat(
        "pricing: %d of %d pieces in %d rounds, proven by the LP bound; start accepted", generated,
        blocks.size(), rounds);
    return out;
  }

  // 3. Reduced-cost fixing, then CBC on what is left.
  std::vector<char> keep = in;
  const double slack = 1e-9 * std::max(1.0, std::fabs(ub));
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (!keep[b] && ub + reduced(y, blocks[b].z) >= lb - slack) keep[b] = 1;
  }
  const int kept = static_cast<int>(std::count(keep.begin(), keep.end(), 1));
  const absl::Duration left2 = (settings.time_limit - (absl::Now() - t0)) * 0.8;
  MALLE_ASSIGN_OR_RETURN(auto second, solve_on(keep, incumbent, left2));
  MipResult& r = second.second;
  out.status = r.status;
  out.branch_nodes = first.second.branch_nodes + r.branch_nodes;
  if (!r.x.empty() && r.objective >= lb) {
    out.x = to_full(second.first, r.x);
    out.objective = r.objective;
  } else {
    out.x = incumbent;
    out.objective = lb;
    if (out.status == MipResult::Status::kLimitNoSolution) {
      out.status = MipResult::Status::kLimitWithSolution;
    }
  }
  // The restricted model's bound holds for the full model (step 3); the LP
  // bound always does.
  out.best_bound = std::max(std::min(r.x.empty() ? ub : r.best_bound, ub), out.objective);
  out.detail = absl::StrFormat(
      "pricing: %d of %d pieces in %d rounds, %d kept by reduced costs; %s", generated,
      blocks.size(), rounds, kept, r.detail);
  return out;
}

// The count solution a column vector stands for (not yet checked).
CountSolution Extract(const CountModel& model, const Formulation& f, const std::vector<double>& x) {
  CountSolution s;
  const size_t num_pools = model.pools.size();
  for (size_t j = 0; j < model.jobs.size(); ++j) {
    const JobModel& job = model.jobs[j];
    if (!f.pieces.empty()) {
      const Piece* chosen = &f.pieces[j][0];
      for (const Piece& piece : f.pieces[j]) {
        if (x[piece.z] > x[chosen->z]) chosen = &piece;
      }
      const long above = chosen->d >= 0 ? std::lround(x[chosen->d]) : 0;
      const int o = chosen->options[std::clamp<long>(above, 0, chosen->options.size() - 1)];
      s.option.push_back(o);
      s.per_pool.push_back(std::vector<int>(num_pools, 0));
      if (f.placed_by_flow) continue;
      if (num_pools == 1) s.per_pool.back()[0] = job.options[o].nodes;
      if (!f.x.empty()) {
        for (size_t p = 0; p < num_pools; ++p) {
          if (f.x[j][p] >= 0) s.per_pool.back()[p] = static_cast<int>(std::lround(x[f.x[j][p]]));
        }
      }
      continue;
    }
    int best = 0;  // option 0 (stop) always has a column
    for (size_t o = 1; o < job.options.size(); ++o) {
      if (f.y[j][o] >= 0 && x[f.y[j][o]] > x[f.y[j][best]]) best = static_cast<int>(o);
    }
    s.option.push_back(best);
    std::vector<int> per_pool(num_pools, 0);
    if (f.x.empty()) {
      if (num_pools == 1) per_pool[0] = job.options[best].nodes;
    } else {
      for (size_t p = 0; p < num_pools; ++p) {
        if (f.x[j][p] >= 0) per_pool[p] = static_cast<int>(std::lround(x[f.x[j][p]]));
      }
    }
    s.per_pool.push_back(std::move(per_pool));
  }
  s.objective = SolutionObjective(model, s.option);
  return s;
}

// Decomposition (MilpOptions::decomposition): the whole solve, for the child.
// The answer travels as x = (option, per-pool counts) per job.
absl::StatusOr<MipResult> SolveDecomposed(const CountModel& model, const CountSolution& start,
                                          const MilpOptions& options, absl::Time deadline) {
  internal::DecompositionSettings ds;
  ds.deadline = deadline;
  ds.relative_gap = options.relative_gap;
  ds.local_search = options.decomposition_local_search;
  ds.local_search_share = options.decomposition_local_search_share;
  ds.twins = options.decomposition_twins;
  ds.cut_rounds = options.decomposition_cut_rounds;
  MALLE_ASSIGN_OR_RETURN(internal::DecompositionResult d,
                         internal::SolveByDecomposition(model, start, ds));
  MipResult r;
  r.status = d.proven ? MipResult::Status::kOptimal : MipResult::Status::kLimitWithSolution;
  r.objective = d.solution.objective;
  r.best_bound = d.bound;
  r.branch_nodes = d.branch_nodes;
  r.detail = std::move(d.detail);
  r.solved_rows = d.master_rows;
  r.solved_columns = d.master_columns;
  for (size_t j = 0; j < model.jobs.size(); ++j) {
    r.x.push_back(d.solution.option[j]);
    for (int c : d.solution.per_pool[j]) r.x.push_back(c);
  }
  return r;
}

// The allocation SolveDecomposed encoded; InvalidArgument when the record
// does not have its shape.
absl::StatusOr<CountSolution> DecodeDecomposed(const CountModel& model, const std::vector<double>& x) {
  const size_t num_pools = model.pools.size();
  if (x.size() != model.jobs.size() * (1 + num_pools)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "decomposition returned %d values for %d jobs x (1 + %d pools)", x.size(),
        model.jobs.size(), num_pools));
  }
  CountSolution s;
  size_t k = 0;
  for (size_t j = 0; j < model.jobs.size(); ++j) {
    const double o = x[k++];
    if (!(o >= 0 && o < static_cast<double>(model.jobs[j].options.size()))) {
      return absl::InvalidArgumentError(absl::StrFormat("decomposition: job %d option %g", j, o));
    }
    s.option.push_back(static_cast<int>(o));
    s.per_pool.emplace_back();
    for (size_t p = 0; p < num_pools; ++p) s.per_pool.back().push_back(static_cast<int>(x[k++]));
  }
  s.objective = SolutionObjective(model, s.option);
  return s;
}

// --- The child and its record ---------------------------------------------
//
// Record: header, then n_x doubles, then `detail_len` bytes, then the magic
// again. Native byte order: parent and child are the same binary.

constexpr uint32_t kRecordMagic = 0x4d494c50;  // "MILP"

struct RecordHeader {
  uint32_t magic;
  int32_t status_code;  // absl::StatusCode of SolveWithCbc; 0 = OK
  int32_t mip_status;   // MipResult::Status
  int32_t solved_rows;
  int32_t solved_columns;
  int32_t reserved;
  double objective;
  double best_bound;
  int64_t branch_nodes;
  uint64_t n_x;
  uint64_t detail_len;
};

std::string EncodeRecord(const absl::StatusOr<MipResult>& r) {
  RecordHeader h{};
  h.magic = kRecordMagic;
  std::string detail;
  std::vector<double> xs;
  if (r.ok()) {
    h.mip_status = static_cast<int32_t>(r->status);
    h.objective = r->objective;
    h.best_bound = r->best_bound;
    h.branch_nodes = r->branch_nodes;
    h.solved_rows = r->solved_rows;
    h.solved_columns = r->solved_columns;
    xs = r->x;
    detail = r->detail;
  } else {
    h.status_code = static_cast<int32_t>(r.status().code());
    detail = std::string(r.status().message());
  }
  h.n_x = xs.size();
  h.detail_len = detail.size();
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out.append(reinterpret_cast<const char*>(xs.data()), xs.size() * sizeof(double));
  out.append(detail);
  out.append(reinterpret_cast<const char*>(&kRecordMagic), sizeof(kRecordMagic));
  return out;
}

absl::StatusOr<MipResult> DecodeRecord(const std::string& bytes) {
  const auto garbage = [&](const char* what) {
    return absl::DataLossError(
        absl::StrFormat("solver returned garbage (%d bytes, %s)", bytes.size(), what));
  };
  RecordHeader h;
  if (bytes.size() < sizeof(h) + sizeof(kRecordMagic)) return garbage("too short");
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kRecordMagic) return garbage("bad magic");
  if (h.n_x > bytes.size() / sizeof(double) || h.detail_len > bytes.size() ||
      sizeof(h) + h.n_x * sizeof(double) + h.detail_len + sizeof(kRecordMagic) != bytes.size()) {
    return garbage("length mismatch");
  }
  uint32_t tail;
  std::memcpy(&tail, bytes.data() + bytes.size() - sizeof(tail), sizeof(tail));
  if (tail != kRecordMagic) return garbage("bad trailer");
  const char* p = bytes.data() + sizeof(h);
  std::string detail(p + h.n_x * sizeof(double), h.detail_len);
  if (h.status_code != 0) {
    if (h.status_code < 0 || h.status_code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
      return garbage("bad status code");
    }
    return absl::Status(static_cast<absl::StatusCode>(h.status_code), detail);
  }
  if (h.mip_status < 0 || h.mip_status > static_cast<int>(MipResult::Status::kOther)) {
    return garbage("bad solver status");
  }
  MipResult r;
  r.status = static_cast<MipResult::Status>(h.mip_status);
  r.objective = h.objective;
  r.best_bound = h.best_bound;
  r.branch_nodes = h.branch_nodes;
  r.solved_rows = h.solved_rows;
  r.solved_columns = h.solved_columns;
  r.x.resize(h.n_x);
  // (No copy of nothing: memcpy from or to null is undefined even for 0
  // bytes, and an empty vector's data() may be null; UBSan saw it.)
  if (h.n_x > 0) std::memcpy(r.x.data(), p, h.n_x * sizeof(double));
  r.detail = std::move(detail);
  return r;
}

bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Runs in the forked child: no logging, no locks, no return.
using SolveFn = std::function<absl::StatusOr<MipResult>()>;

[[noreturn]] void ChildMain(int fd, const SolveFn& solve, MilpFault fault) {
  switch (fault) {
    case MilpFault::kNone:
      break;
    case MilpFault::kCrash: {
      // No core file: the test provokes this on purpose.
      struct rlimit no_core = {0, 0};
      setrlimit(RLIMIT_CORE, &no_core);
      signal(SIGSEGV, SIG_DFL);
      raise(SIGSEGV);
      _exit(3);  // not reached
    }
    case MilpFault::kHang:
      for (;;) pause();
    case MilpFault::kGarbage: {
      char junk[512];
      uint32_t state = static_cast<uint32_t>(getpid()) * 2654435761u + 1;
      for (char& c : junk) {
        state = state * 1664525u + 1013904223u;
        c = static_cast<char>(state >> 24);
      }
      WriteAll(fd, junk, sizeof(junk));
      _exit(0);
    }
  }
  const std::string record = EncodeRecord(solve());
  _exit(WriteAll(fd, record.data(), record.size()) ? 0 : 2);
}

// Solves in a forked child. Errors: the child's own SolveWithCbc error, or
// Unavailable/DataLoss/DeadlineExceeded describing what went wrong with it.
absl::StatusOr<MipResult> SolveForked(const SolveFn& solve, const MilpOptions& options) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe2 failed: ", std::strerror(errno)));
  }
  const absl::Time deadline = absl::Now() + options.time_limit + options.kill_grace;
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::UnavailableError(absl::StrCat("fork failed: ", std::strerror(err)));
  }
  if (pid == 0) {
    close(fds[0]);
    ChildMain(fds[1], solve, options.fault);
  }
  close(fds[1]);

  std::string bytes;
  bool timed_out = false;
  absl::Status io_error;
  char buf[1 << 16];
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    struct pollfd pfd = {fds[0], POLLIN, 0};
    // Capped so that an infinite time limit cannot overflow the int.
    const double ms = std::ceil(absl::ToDoubleMilliseconds(std::min(left, absl::Minutes(1))));
    const int ready = poll(&pfd, 1, std::max(static_cast<int>(ms), 1));
    if (ready < 0) {
      if (errno == EINTR) continue;
      io_error = absl::UnavailableError(absl::StrCat("poll failed: ", std::strerror(errno)));
      break;
    }
    if (ready == 0) continue;  // re-check the deadline
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      io_error = absl::UnavailableError(absl::StrCat("read failed: ", std::strerror(errno)));
      break;
    }
    if (n == 0) break;  // EOF: the child closed its end (exited)
    bytes.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timed_out || !io_error.ok()) kill(pid, SIGKILL);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) {
      return absl::InternalError(absl::StrCat("waitpid failed: ", std::strerror(errno)));
    }
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrFormat("solver hung (killed after %s)",
                        absl::FormatDuration(options.time_limit + options.kill_grace)));
  }
  MALLE_RETURN_IF_ERROR(io_error);
  if (WIFSIGNALED(wstatus)) {
    return absl::UnavailableError(absl::StrFormat("solver crashed (signal %d)", WTERMSIG(wstatus)));
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return absl::UnavailableError(
        absl::StrFormat("solver exited with status %d", WEXITSTATUS(wstatus)));
  }
  return DecodeRecord(bytes);
}

// Serialises CBC: it is not known to be reentrant, and a forked solve per
// caller would only multiply memory for no gain on the allocator's cores.
absl::StatusOr<MipResult> SolveSerialised(const SolveFn& solve, const MilpOptions& options) {
  static absl::Mutex mu;
  absl::MutexLock lock(&mu);
  if (options.isolation == SolveIsolation::kInProcess) return solve();
  return SolveForked(solve, options);
}

}  // namespace

absl::StatusOr<PolicyResult> SolveMilp(const CountModel& model, const MilpOptions& options) {
  if (!(options.decomposition_local_search_share >= 0 &&
        options.decomposition_local_search_share <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MilpOptions::decomposition_local_search_share must be in [0, 1], got %g",
                        options.decomposition_local_search_share));
  }
  const absl::Time start = absl::Now();
  const absl::Time started = options.started == absl::InfinitePast() ? start : options.started;
  // The DP's answer as the start (dp_start), kept for the fallback too.
  std::optional<absl::StatusOr<PolicyResult>> dp;
  if (options.use_mip_start && options.dp_start) dp = SolveDp(model, options.fallback);
  const bool dp_started = dp.has_value() && dp->ok();
  // The first incumbent: the best of the DP's answer (dp_start), the current
  // allocation and, with heuristic_start, the baselines' answers. CBC never
  // returns worse than it (and if it did, the start would be the answer).
  std::optional<CountSolution> start_solution;
  std::string start_name;
  if (options.use_mip_start) {
    auto consider = [&](CountSolution s, const char* name) {
      if (!start_solution || s.objective > start_solution->objective) {
        start_solution = std::move(s);
        start_name = name;
      }
    };
    if (dp_started) consider((*dp)->solution, "dp");
    consider(CurrentSolution(model), "current allocation");
    if (options.heuristic_start) {
      for (auto [solve, name] :
           {std::make_pair(&SolveGreedy, "greedy"), std::make_pair(&SolveEqualShare, "equal_share"),
            std::make_pair(&SolveStatic, "static")}) {
        absl::StatusOr<PolicyResult> h = solve(model);
        if (h.ok() && CheckSolution(model, h->solution).ok()) consider(h->solution, name);
      }
    }
  }
  const CountSolution* first = start_solution ? &*start_solution : nullptr;
  const bool decompose = options.decomposition && options.segments && options.use_mip_start;
  Formulation f;
  if (!decompose) {
    f = options.segments ? BuildSegmentFormulation(model, options.use_mip_start, first, options)
                         : BuildFormulation(model, options.use_mip_start, first);
  }
  // What is left of the limit goes to the solver (whole milliseconds, so
  // that the reason reads cleanly), at least 1 ms; the decomposition gets it
  // as a deadline, so that forking and its setup count too.
  // A `started` in the future gives the solver the limit, not more.
  const absl::Time now = absl::Now();
  const absl::Duration spent = std::max(absl::ZeroDuration(), now - started);
  const absl::Duration solver_limit = std::max(
      absl::Floor(options.time_limit - spent, absl::Milliseconds(1)), absl::Milliseconds(1));
  const absl::Time deadline = now + solver_limit;
  MilpOptions solver_options = options;  // the child's kill deadline: its limit + kill_grace
  solver_options.time_limit = solver_limit;
  CbcSettings settings;
  settings.time_limit = solver_limit;
  settings.relative_gap = options.relative_gap;

  const bool pricing = options.pricing && options.segments && options.use_mip_start;
  absl::StatusOr<MipResult> solved = SolveSerialised(
      [&]() -> absl::StatusOr<MipResult> {
        if (decompose) return SolveDecomposed(model, *start_solution, options, deadline);
        if (pricing) return SolveByPricing(f, settings);
        return internal::SolveWithCbc(f.mip, settings);
      },
      solver_options);
  // The decomposition reports in the model's units, CBC in the formulation's.
  const double bound_scale = decompose ? 1.0 : f.scale;

  std::string cause;  // why the DP must answer; empty when the MILP does
  PolicyResult result;
  result.answered_by = "milp";
  if (!solved.ok()) {
    cause = std::string(solved.status().message());
  } else if (solved->status != MipResult::Status::kOptimal &&
             solved->status != MipResult::Status::kLimitWithSolution) {
    cause = absl::StrCat("solver status ", internal::MipStatusName(solved->status), " (",
                         solved->detail, ")");
  } else if (decompose) {
    absl::StatusOr<CountSolution> decoded = DecodeDecomposed(model, solved->x);
    if (decoded.ok()) {
      result.solution = *std::move(decoded);
      const absl::Status check = CheckSolution(model, result.solution);
      if (!check.ok()) cause = absl::StrCat("solver answer rejected: ", check.message());
    } else {
      cause = std::string(decoded.status().message());
    }
  } else if (solved->x.size() != static_cast<size_t>(f.mip.num_cols())) {
    cause = absl::StrFormat("solver returned %d values for %d columns", solved->x.size(),
                            f.mip.num_cols());
  } else {
    result.solution = Extract(model, f, solved->x);
    if (f.placed_by_flow) {
      // The union rows guarantee a placement (AddUnionRows); not finding
      // one would be a bug in them, reported as such and answered safely.
      absl::StatusOr<CountSolution> placed = PlaceOptions(model, result.solution.option);
      if (placed.ok()) {
        result.solution = *std::move(placed);
      } else {
        cause = absl::StrCat("solver answer cannot be placed on the pools: ",
                             placed.status().message());
      }
    }
    const absl::Status check = cause.empty() ? CheckSolution(model, result.solution) : absl::OkStatus();
    if (!check.ok()) cause = absl::StrCat("solver answer rejected: ", check.message());
  }

  // Two answers differ in earnest only beyond the pieces' collinearity and
  // the solver's arithmetic: both "below the DP" guards use this tolerance
  // (relative to the objective), the time-limit one also the solver's gap.
  constexpr double kBelowDpTolerance = 1e-9;
  bool use_start = false;  // the answer is the start (CBC's is worse)
  if (cause.empty() && start_solution &&
      result.solution.objective <
          start_solution->objective -
              kBelowDpTolerance * std::max(1.0, std::fabs(start_solution->objective))) {
    // Only possible when CBC rejected the start (it reports why in its
    // detail): the start is better, so it is the answer.
    cause = absl::StrCat("answer below its start, the ", start_name, "'s (", solved->detail, ")");
    use_start = true;
  }
  if (cause.empty() && solved->status != MipResult::Status::kOptimal && model.single_pool() &&
      !dp_started && !use_start) {
    // Stopped at the time limit with an unproven incumbent. On one pool the
    // DP is exact and polynomial (tens to hundreds of ms): an incumbent
    // below its answer is not worth returning (seen at 1,000 jobs, where the
    // search can stop far from the optimum).
    // Below by more than the solver's own tolerance (the relative gap, or the
    // pieces' collinearity tolerance per job).
    dp = SolveDp(model, options.fallback);
    const double slack =
        std::max(options.relative_gap, kBelowDpTolerance) * std::max(1.0, std::fabs(result.solution.objective));
    if (dp->ok() && (*dp)->solution.objective > result.solution.objective + slack) {
      cause = absl::StrFormat("time limit %s reached with incumbent %.6g below the dp's %.6g",
                              absl::FormatDuration(options.time_limit), result.solution.objective,
                              (*dp)->solution.objective);
    }
  }
  if (cause.empty()) {
    const MipResult& mr = *solved;
    result.best_bound = std::max(mr.best_bound / bound_scale, result.solution.objective);
    result.branch_nodes = mr.branch_nodes;
    if (mr.status == MipResult::Status::kOptimal) {
      result.optimal = true;
      result.reason = absl::StrFormat("milp: optimal, objective %.6g (%d branch nodes)",
                                      result.solution.objective, mr.branch_nodes);
    } else {
      const double obj = result.solution.objective;
      const double gap = (result.best_bound - obj) / std::max(std::fabs(obj), 1e-12);
      result.reason = absl::StrFormat(
          "milp: time limit %s reached; incumbent %.6g, bound %.6g (gap %.3g%%)",
          absl::FormatDuration(options.time_limit), obj, result.best_bound, 100.0 * gap);
    }
    if (start_solution && start_name != "current allocation") {
      absl::StrAppend(&result.reason, "; started from the ", start_name, "'s answer");
    }
    if (decompose) absl::StrAppend(&result.reason, "; ", mr.detail);
    // A start CBC refused is a bug in the start (it obeys every rule by
    // construction): say so rather than lose it.
    if (const size_t at = mr.detail.find("start ignored"); at != std::string::npos) {
      absl::StrAppend(&result.reason, "; cbc: ", mr.detail.substr(at));
    }
  } else {
    if (!use_start && !dp.has_value()) dp = SolveDp(model, options.fallback);
    if (use_start || (!dp->ok() && start_solution)) {
      // The start is worth more than CBC's answer, or the DP cannot answer
      // (a multi-pool model beyond its limits): the start is the answer.
      result = PolicyResult{};
      result.answered_by = start_name;
      result.solution = *start_solution;
      result.fell_back = true;
      result.reason = absl::StrCat(
          "milp: ", cause,
          use_start ? "" : absl::StrCat("; the dp cannot answer (", dp->status().message(), ")"),
          "; answered by its start, the ", start_name, "'s answer");
    } else if (!dp->ok()) {
      return absl::Status(
          dp->status().code(),
          absl::StrCat(dp->status().message(), " (the dp was the fallback of milp: ", cause, ")"));
    } else {
      result = **std::move(dp);
      result.fell_back = true;
      result.reason = absl::StrCat("milp: ", cause, "; answered by dp: ", result.reason);
    }
    if (solved.ok()) result.branch_nodes = solved->branch_nodes;
    MALLE_LOG(WARNING) << result.reason;
  }
  result.rows = f.mip.num_rows();
  result.columns = f.mip.num_cols();
  if (solved.ok() && solved->solved_rows > 0) {
    result.rows = solved->solved_rows;
    result.columns = solved->solved_columns;
  }
  if (solver_limit < options.time_limit * 0.9) {
    absl::StrAppend(&result.reason, " (the solver had ", absl::FormatDuration(solver_limit),
                    " of the limit's ", absl::FormatDuration(options.time_limit), ": ",
                    absl::FormatDuration(absl::Trunc(spent, absl::Microseconds(100))),
                    " went before it)");
  }
  result.solve_time = absl::Now() - start;
  return result;
}

}  // namespace malle::alloc
