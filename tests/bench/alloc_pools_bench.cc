// alloc_pools_bench: allocation decisions on several node pools (speed
// classes x locality groups x idle-window buckets), the MILP against every
// heuristic and the DP, in one run.
//
// For every N (idle nodes) x J (jobs) it builds --reps instances: J jobs drawn
// without replacement (seeded) from the 1,001-job ImageNet mix; N nodes, each
// of one of 2 speed classes (1.0 and --slow_speed) in one of 2 locality
// groups (cross-locality factor --cross_locality), each with no forecast or,
// with probability --short_share, an idle window of one of --short_windows x
// T_fwd (the main scheduler's reservations): 4 classes x (1 + short windows)
// pools. The current allocation is the greedy answer on a slightly different
// instance (N' = N +- 10 % nodes of the same mix, nobody running), realised
// to node ids; nodes gone since then are lost by their jobs. On each instance
// it times, back to back: SolveMilp (forked child, relative gap --gap, time
// limit --milp_time_limit_s; by decomposition unless --milp_decomposition=false),
// greedy, equal share, static and the DP (which
// refuses beyond its state limit). Decision latency = CompileCountModel +
// solve. It reports the MILP's proven gap (CBC's bound), whether its answer
// is ever below the best heuristic's, and the targets.
//
//   build/sim/tests/bench/alloc_pools_bench --nodes=4734 --jobs=100 --reps=20
//
// With --problems=FILE,... it solves those problems instead (problem JSON, as
// `sim_bench --dump_unproven` writes the decisions a replay could not prove),
// with the same MILP flags, heuristics and DP: one row, no target lines.
//
// A program, not a test: prints one table and the targets next to what was
// measured; exits 0, or 1 if a measurement could not be taken, 2 for bad flags.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/dp.h"
#include "libmalle/alloc/heuristics.h"
#include "libmalle/alloc/milp.h"
#include "libmalle/alloc/problem.h"
#include "libmalle/alloc/problem_json.h"
#include "libmalle/alloc/realize.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/sim/job_mix.h"

ABSL_FLAG(std::string, nodes, "4734,50000", "idle node counts N, comma-separated");
ABSL_FLAG(std::string, jobs, "100,1000", "job counts J, comma-separated (<= jobs in --mix)");
ABSL_FLAG(int, reps, 20, "instances per (N, J)");
ABSL_FLAG(int, first_rep, 0,
          "index of the first instance (instances first_rep .. first_rep + reps - 1; the same "
          "index gives the same instance, so one can be profiled alone)");
ABSL_FLAG(double, t_fwd_s, 120, "forward window T_fwd, seconds");
ABSL_FLAG(double, slow_speed, 0.85, "speed of the slow class (the fast one is 1)");
ABSL_FLAG(double, cross_locality, 0.9, "throughput factor of a job spanning both groups");
ABSL_FLAG(std::string, short_windows, "0.5,0.75",
          "idle windows of nodes with a forecast, as fractions of T_fwd, comma-separated");
ABSL_FLAG(double, short_share, 0.3, "share of nodes with a forecast");
ABSL_FLAG(double, gap, 1e-4, "MILP relative gap (CBC stops when it proves this)");
ABSL_FLAG(double, milp_time_limit_s, 5, "MILP time limit, seconds");
ABSL_FLAG(bool, milp_fork, true, "solve the MILP in a forked child (the default)");
ABSL_FLAG(std::string, milp_pools, "per_pool",
          "multi-pool formulation: union (pool-union rows, placed by a flow) or per_pool "
          "(an integer per job and pool)");
ABSL_FLAG(bool, milp_pricing, false,
          "solve by pricing (column generation, then CBC on the pieces reduced costs keep)");
ABSL_FLAG(bool, milp_decomposition, true,
          "several pools: branch-and-price on the decomposition by job (the default); false: CBC "
          "on the count formulation (--milp_pools, --milp_pricing)");
ABSL_FLAG(std::string, milp_local_search, "true",
          "decomposition: the local search over modes after the root: true, false, or both "
          "(each instance solved both ways, back to back, one row each)");
ABSL_FLAG(bool, milp_twins, true,
          "decomposition: search jobs the model cannot tell apart in one order only "
          "(MilpOptions::decomposition_twins)");
ABSL_FLAG(int, milp_cut_rounds, -1,
          "decomposition: rounds of MIR cuts on the pools' capacities at the root "
          "(MilpOptions::decomposition_cut_rounds; -1: its default, 0: none)");
ABSL_FLAG(bool, print_reasons, false, "print every MILP answer's reason (stderr), not only notes");
ABSL_FLAG(bool, dp, true, "also run the DP (it refuses beyond its state limit)");
ABSL_FLAG(std::string, problems, "",
          "problem JSON files, comma-separated: solve these instead of generated instances");
ABSL_FLAG(uint64_t, seed, 1, "seed for job sampling, node classes and the current state");
ABSL_FLAG(std::string, mix, MALLE_SHARED_DATA_DIR "/jobs-imagenet-1001.csv", "job mix CSV");

namespace {

namespace alloc = malle::alloc;
using alloc::CountModel;
using alloc::PolicyResult;
using alloc::Problem;
using malle::sim::MixJob;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

absl::StatusOr<std::vector<int>> ParseInts(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": every entry must be an integer >= 1, got '", part, "'"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty list"));
  return out;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * v.size()));
  return v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
}

std::string Ms(double ms) {
  if (std::isnan(ms)) return "-";
  return ms < 10 ? absl::StrFormat("%.2f", ms) : absl::StrFormat("%.0f", ms);
}

std::string P50P99(const std::vector<double>& v) {
  if (v.empty()) return "-";
  return absl::StrCat(Ms(Percentile(v, 0.5)), " / ", Ms(Percentile(v, 0.99)));
}

// N nodes of the 4 classes; a share of them with a short forecast window.
void AddNodes(Problem& p, int n, const std::string& prefix, std::mt19937_64& rng,
              const std::vector<double>& windows) {
  auto uniform = [&rng] { return (rng() >> 11) * 0x1.0p-53; };
  const double share = absl::GetFlag(FLAGS_short_share);
  for (int i = 0; i < n; ++i) {
    alloc::Node node;
    node.id = absl::StrCat(prefix, i);
    node.class_id = p.classes[rng() % p.classes.size()].id;
    if (!windows.empty() && uniform() < share) {
      node.expected_idle = p.forward_window * windows[rng() % windows.size()];
    }
    p.nodes.push_back(std::move(node));
  }
}

Problem BaseProblem(const std::vector<MixJob>& mix, const std::vector<int>& picked) {
  Problem p;
  p.forward_window = absl::Seconds(absl::GetFlag(FLAGS_t_fwd_s));
  p.objective = alloc::Objective::kThroughput;
  p.resize_cost = alloc::ResizeCostModel::kBftrainer;
  p.cross_locality_factor = absl::GetFlag(FLAGS_cross_locality);
  const double slow = absl::GetFlag(FLAGS_slow_speed);
  for (const char* group : {"g0", "g1"}) {
    p.classes.push_back({absl::StrCat(group, "-fast"), group, 1.0});
    p.classes.push_back({absl::StrCat(group, "-slow"), group, slow});
  }
  for (int k : picked) p.jobs.push_back(malle::sim::ToJobSpec(mix[k]));
  return p;
}

absl::StatusOr<Problem> MakeInstance(const std::vector<MixJob>& mix, int n, int j, int rep,
                                     const std::vector<double>& windows) {
  std::seed_seq seq{static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)), static_cast<uint64_t>(n),
                    static_cast<uint64_t>(j), static_cast<uint64_t>(rep), uint64_t{7}};
  std::mt19937_64 rng(seq);
  auto uniform = [&rng] { return (rng() >> 11) * 0x1.0p-53; };
  std::vector<int> index(mix.size());
  for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<int>(i);
  for (int i = 0; i < j; ++i) std::swap(index[i], index[i + rng() % (index.size() - i)]);
  index.resize(j);

  // The previous event: N' nodes, nobody running; greedy decides.
  const int prior_n = std::max(1, static_cast<int>(std::lround(n * (0.9 + 0.2 * uniform()))));
  Problem prior = BaseProblem(mix, index);
  AddNodes(prior, prior_n, "p", rng, windows);
  MALLE_ASSIGN_OR_RETURN(CountModel prior_model, alloc::CompileCountModel(prior));
  MALLE_ASSIGN_OR_RETURN(PolicyResult prior_result, alloc::SolveGreedy(prior_model));
  MALLE_ASSIGN_OR_RETURN(alloc::Allocation held,
                         alloc::Realize(prior, prior_model, prior_result.solution));

  // Now: a random subset of the old nodes is still idle, plus fresh ones.
  std::vector<int> order(prior_n);
  for (int i = 0; i < prior_n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  const int kept = std::min(n, prior_n);
  std::vector<bool> still(prior_n, false);
  Problem now = BaseProblem(mix, index);
  for (int k = 0; k < kept; ++k) {
    still[order[k]] = true;
    now.nodes.push_back(prior.nodes[order[k]]);
  }
  AddNodes(now, n - kept, "q", rng, windows);
  for (int job = 0; job < j; ++job) {
    for (const std::string& id : held.jobs[job].nodes) {
      int old = 0;
      if (!absl::SimpleAtoi(absl::string_view(id).substr(1), &old)) {
        return absl::InternalError(absl::StrCat("unexpected node id ", id));
      }
      if (still[old]) now.jobs[job].current_nodes.push_back(id);
    }
  }
  return now;
}

absl::StatusOr<Problem> LoadProblem(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  absl::StatusOr<Problem> p = alloc::ParseProblemJson(text);
  if (!p.ok()) {
    return absl::Status(p.status().code(), absl::StrCat(path, ": ", p.status().message()));
  }
  return p;
}

// The instance of rep k: generated, or the k-th of --problems.
using InstanceSource = std::function<absl::StatusOr<Problem>(int rep)>;

struct Row {
  int n = 0, j = 0;
  std::string label;         // "N x J", or what --problems gave
  std::string variant;       // "" or "ls" / "no-ls" (--milp_local_search=both)
  bool local_search = true;  // MilpOptions::decomposition_local_search
  int min_pools = 1 << 30, max_pools = 0;
  std::vector<double> milp_ms, greedy_ms, equal_ms, static_ms, dp_ms;
  int proven = 0, fell_back = 0, reps = 0;
  double max_gap = 0;       // CBC's proven relative gap, over all reps
  int below_heuristic = 0;  // MILP answers below the best heuristic's
  double min_gain = kNaN;   // min (MILP - best heuristic) / |best heuristic|
  double sum_gain = 0;
  int dp_refused = 0, dp_disagree = 0;
  int milp_cols = 0, milp_rows = 0;
  std::vector<double> objectives;  // the MILP's, per instance
  std::vector<std::string> notes;
};

void Note(Row& row, const std::string& note) {
  if (row.notes.size() < 6 &&
      std::find(row.notes.begin(), row.notes.end(), note) == row.notes.end()) {
    row.notes.push_back(note);
  }
}

// Every row has the same N x J; each instance is solved by every row's MILP
// variant back to back, the heuristics and the DP once (their figures go to
// every row).
absl::Status RunConfig(const InstanceSource& instance, int first, int reps,
                       std::vector<Row>& rows) {
  alloc::MilpOptions mo;
  mo.time_limit = absl::Seconds(absl::GetFlag(FLAGS_milp_time_limit_s));
  mo.relative_gap = absl::GetFlag(FLAGS_gap);
  if (!absl::GetFlag(FLAGS_milp_fork)) mo.isolation = alloc::SolveIsolation::kInProcess;
  mo.pools = absl::GetFlag(FLAGS_milp_pools) == "per_pool" ? alloc::MilpOptions::Pools::kPerPoolCounts
                                                           : alloc::MilpOptions::Pools::kUnionRows;
  mo.pricing = absl::GetFlag(FLAGS_milp_pricing);
  mo.decomposition = absl::GetFlag(FLAGS_milp_decomposition);
  mo.decomposition_twins = absl::GetFlag(FLAGS_milp_twins);
  if (absl::GetFlag(FLAGS_milp_cut_rounds) >= 0) {
    mo.decomposition_cut_rounds = absl::GetFlag(FLAGS_milp_cut_rounds);
  }
  for (int rep = first; rep < first + reps; ++rep) {
    MALLE_ASSIGN_OR_RETURN(Problem problem, instance(rep));
    auto timed = [&](auto solve) -> absl::StatusOr<std::pair<PolicyResult, double>> {
      const absl::Time t0 = absl::Now();
      MALLE_ASSIGN_OR_RETURN(CountModel model, alloc::CompileCountModel(problem));
      absl::StatusOr<PolicyResult> r = solve(model);
      const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
      if (!r.ok()) return r.status();
      return std::make_pair(*std::move(r), ms);
    };
    MALLE_ASSIGN_OR_RETURN(CountModel model, alloc::CompileCountModel(problem));
    const int pools = static_cast<int>(model.pools.size());
    std::vector<std::pair<PolicyResult, double>> milps;
    for (Row& row : rows) {
      mo.decomposition_local_search = row.local_search;
      MALLE_ASSIGN_OR_RETURN(auto milp,
                             timed([&](const CountModel& m) { return alloc::SolveMilp(m, mo); }));
      milps.push_back(std::move(milp));
    }
    MALLE_ASSIGN_OR_RETURN(auto greedy,
                           timed([](const CountModel& m) { return alloc::SolveGreedy(m); }));
    MALLE_ASSIGN_OR_RETURN(auto equal,
                           timed([](const CountModel& m) { return alloc::SolveEqualShare(m); }));
    MALLE_ASSIGN_OR_RETURN(auto fixed,
                           timed([](const CountModel& m) { return alloc::SolveStatic(m); }));
    std::optional<absl::StatusOr<std::pair<PolicyResult, double>>> dp;
    if (absl::GetFlag(FLAGS_dp)) dp = timed([](const CountModel& c) { return alloc::SolveDp(c); });
    for (size_t v = 0; v < rows.size(); ++v) {
      Row& row = rows[v];
      const auto& milp = milps[v];
      row.min_pools = std::min(row.min_pools, pools);
      row.max_pools = std::max(row.max_pools, pools);
      ++row.reps;
      row.milp_ms.push_back(milp.second);
      row.greedy_ms.push_back(greedy.second);
      row.equal_ms.push_back(equal.second);
      row.static_ms.push_back(fixed.second);
      const PolicyResult& m = milp.first;
      row.milp_cols = std::max(row.milp_cols, m.columns);
      row.milp_rows = std::max(row.milp_rows, m.rows);
      const double obj = m.solution.objective;
      if (m.fell_back) {
        ++row.fell_back;
        Note(row, m.reason);
      } else {
        const double gap = (m.best_bound - obj) / std::max(std::fabs(obj), 1e-12);
        row.max_gap = std::max(row.max_gap, gap);
        if (m.optimal && gap <= absl::GetFlag(FLAGS_gap) * (1 + 1e-9)) {
          ++row.proven;
        } else {
          Note(row, m.reason);
        }
      }
      const double best_h =
          std::max({greedy.first.solution.objective, equal.first.solution.objective,
                    fixed.first.solution.objective});
      const double gain = (obj - best_h) / std::max(std::fabs(best_h), 1e-12);
      row.min_gain = std::isnan(row.min_gain) ? gain : std::min(row.min_gain, gain);
      row.sum_gain += gain;
      row.objectives.push_back(obj);
      if (obj < best_h - 1e-9 * std::max(1.0, std::fabs(best_h))) ++row.below_heuristic;
      if (dp.has_value()) {
        if (!dp->ok()) {
          ++row.dp_refused;
          Note(row, absl::StrCat("dp: ", dp->status().message()));
        } else {
          row.dp_ms.push_back((*dp)->second);
          const double d = (*dp)->first.solution.objective;
          if (obj < d - absl::GetFlag(FLAGS_gap) * std::max(1.0, std::fabs(d))) ++row.dp_disagree;
        }
      }
      std::cerr << absl::StrFormat(
          "  %s rep %d%s: %d nodes x %d jobs, %d pools, MILP %.1f ms (%s), objective %.9g, "
          "greedy %.1f ms\n",
          row.label, rep, row.variant.empty() ? "" : absl::StrCat(" ", row.variant),
          model.total_nodes, static_cast<int>(problem.jobs.size()), pools, milp.second,
          m.fell_back ? "fell back"
          : m.optimal ? "proven"
                      : "limit",
          obj, greedy.second);
      if (absl::GetFlag(FLAGS_print_reasons)) std::cerr << "    " << m.reason << "\n";
    }
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Time start = absl::Now();
  auto nodes = ParseInts("nodes", absl::GetFlag(FLAGS_nodes));
  auto jobs = ParseInts("jobs", absl::GetFlag(FLAGS_jobs));
  for (const auto* l : {&nodes, &jobs}) {
    if (!l->ok()) {
      std::cerr << l->status().message() << "\n";
      return 2;
    }
  }
  std::vector<double> windows;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_short_windows), ',', absl::SkipEmpty())) {
    double w = 0;
    if (!absl::SimpleAtod(part, &w) || !(w > 0 && w < 1)) {
      std::cerr << "--short_windows: every entry must be in (0, 1), got '" << part << "'\n";
      return 2;
    }
    windows.push_back(w);
  }
  if (absl::GetFlag(FLAGS_reps) < 1 || absl::GetFlag(FLAGS_first_rep) < 0 ||
      !(absl::GetFlag(FLAGS_gap) >= 0) || !(absl::GetFlag(FLAGS_milp_time_limit_s) > 0)) {
    std::cerr << "--reps must be >= 1, --first_rep >= 0, --gap >= 0 and --milp_time_limit_s > 0\n";
    return 2;
  }
  auto mix = malle::sim::LoadJobMix(absl::GetFlag(FLAGS_mix), {/*strict=*/true});
  if (!mix.ok()) {
    std::cerr << "cannot load the job mix: " << mix.status() << "\n";
    return 1;
  }
  for (int j : *jobs) {
    if (j > static_cast<int>(mix->jobs.size())) {
      std::cerr << "--jobs: " << j << " is more than the " << mix->jobs.size()
                << " jobs in the mix\n";
      return 2;
    }
  }
  std::cout << absl::StrFormat(
      "alloc_pools_bench: multi-pool allocation decisions, MILP vs heuristics vs DP\n"
      "%s"
      "  jobs: sampled without replacement from %s (seed %d); T_fwd %.0f s; %d reps\n"
      "  nodes: 2 locality groups x 2 speed classes (1, %.2f; cross-locality factor %.2f); %.0f%% "
      "of nodes with an idle window of %s x T_fwd\n"
      "  objective: throughput, bftrainer resize cost; current state: greedy on N +-10%% nodes\n"
      "  MILP: %s, %s, relative gap %.0e, time limit %.2f s, started from the best of the "
      "current allocation and the heuristics; latency = compile + solve\n"
      "  machine: %u hardware threads; p99 is nearest-rank (with < 100 reps it is the max)\n",
      absl::GetFlag(FLAGS_problems).empty()
          ? ""
          : absl::StrCat("  instances: the problems of --problems=", absl::GetFlag(FLAGS_problems),
                         " (the flags below on jobs and nodes do not apply)\n"),
      absl::GetFlag(FLAGS_mix), static_cast<int>(absl::GetFlag(FLAGS_seed)),
      absl::GetFlag(FLAGS_t_fwd_s), absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_slow_speed),
      absl::GetFlag(FLAGS_cross_locality), 100 * absl::GetFlag(FLAGS_short_share),
      absl::GetFlag(FLAGS_short_windows),
      absl::GetFlag(FLAGS_milp_decomposition)
          ? absl::StrCat("decomposition (branch-and-price; local search over modes: ",
                         absl::GetFlag(FLAGS_milp_local_search), ")")
          : absl::StrCat("CBC on the count formulation (", absl::GetFlag(FLAGS_milp_pools),
                         absl::GetFlag(FLAGS_milp_pricing) ? ", pricing" : "", ")"),
      absl::GetFlag(FLAGS_milp_fork) ? "forked child" : "in process", absl::GetFlag(FLAGS_gap),
      absl::GetFlag(FLAGS_milp_time_limit_s), std::thread::hardware_concurrency());
  // Warm-up (untimed): the first fork and CBC's first solve.
  {
    auto p = MakeInstance(mix->jobs, 64, std::min<int>(4, mix->jobs.size()), 0, windows);
    if (p.ok()) {
      auto model = alloc::CompileCountModel(*p);
      if (model.ok()) (void)alloc::SolveMilp(*model);
    }
  }
  std::vector<Row> rows;
  bool ok = true;
  const std::string ls = absl::GetFlag(FLAGS_milp_local_search);
  std::vector<std::pair<std::string, bool>> variants;
  if (ls == "true") {
    variants = {{"", true}};
  } else if (ls == "false") {
    variants = {{"", false}};
  } else if (ls == "both") {
    variants = {{"no-ls", false}, {"ls", true}};
  } else {
    std::cerr << "--milp_local_search must be true, false or both, got '" << ls << "'\n";
    return 2;
  }
  std::vector<std::string> files =
      absl::StrSplit(absl::GetFlag(FLAGS_problems), ',', absl::SkipEmpty());
  auto run_group = [&](std::vector<Row>& group, const InstanceSource& instance, int first,
                       int reps) {
    absl::Status s = RunConfig(instance, first, reps, group);
    if (!s.ok()) {
      std::cerr << group.front().label << ": " << s << "\n";
      for (Row& row : group) Note(row, absl::StrCat("FAILED: ", s.message()));
      ok = false;
    }
  };
  // One (N, J) or one list of files: a group of rows, one per MILP variant.
  auto make_group = [&](int n, int j, const std::string& label) {
    std::vector<Row> group;
    for (const auto& [name, on] : variants) {
      Row row;
      row.n = n;
      row.j = j;
      row.label = label;
      row.variant = name;
      row.local_search = on;
      group.push_back(std::move(row));
    }
    return group;
  };
  std::vector<std::vector<Row>> groups;
  if (!files.empty()) {
    std::vector<Row> group = make_group(0, 0, absl::StrCat(files.size(), " problem files"));
    run_group(
        group, [&files](int rep) { return LoadProblem(files[rep]); }, 0,
        static_cast<int>(files.size()));
    groups.push_back(std::move(group));
  } else {
    for (int n : *nodes) {
      for (int j : *jobs) {
        std::vector<Row> group = make_group(n, j, absl::StrCat(n, " x ", j));
        run_group(
            group, [&](int rep) { return MakeInstance(mix->jobs, n, j, rep, windows); },
            absl::GetFlag(FLAGS_first_rep), absl::GetFlag(FLAGS_reps));
        groups.push_back(std::move(group));
      }
    }
  }
  for (std::vector<Row>& group : groups) {
    // With two variants: how often the second's answer is better / worse.
    if (group.size() == 2 && group[0].objectives.size() == group[1].objectives.size()) {
      int better = 0, worse = 0;
      for (size_t i = 0; i < group[0].objectives.size(); ++i) {
        const double a = group[0].objectives[i], b = group[1].objectives[i];
        const double tol = 1e-9 * std::max(1.0, std::fabs(a));
        better += b > a + tol;
        worse += b < a - tol;
      }
      Note(group[1],
           absl::StrFormat("answer vs %s on the same instances: %d better, %d worse, "
                           "%d equal",
                           group[0].variant, better, worse,
                           static_cast<int>(group[0].objectives.size()) - better - worse));
    }
    for (Row& row : group) rows.push_back(std::move(row));
  }
  const std::string header = absl::StrFormat(
      "%-19s | %-6s | %-15s | %-13s | %-9s | %-22s | %-13s | %-13s | %-13s | %-15s | %-11s",
      "N x J", "pools", "MILP p50/p99", "proven<=gap", "max gap", "MILP vs best heur.", "greedy",
      "equal_share", "static", "DP", "MILP c/r");
  std::cout << "\n" << header << "\n" << std::string(header.size(), '-') << "\n";
  for (const Row& r : rows) {
    std::string dp = P50P99(r.dp_ms);
    if (r.dp_refused > 0) dp = absl::StrCat(dp, " R", r.dp_refused, "/", r.reps);
    std::cout << absl::StrFormat(
        "%-19s | %-6s | %-15s | %-13s | %-9.1e | %-22s | %-13s | %-13s | %-13s | %-15s | %-11s\n",
        absl::StrCat(r.label, r.variant.empty() ? "" : absl::StrCat(" ", r.variant)),
        absl::StrCat(r.min_pools, "-", r.max_pools), P50P99(r.milp_ms),
        absl::StrCat(r.proven, "/", r.reps, r.fell_back ? absl::StrCat(" fb", r.fell_back) : ""),
        r.max_gap,
        absl::StrFormat("%+.2e min %+.2e", r.reps ? r.sum_gain / r.reps : kNaN, r.min_gain),
        P50P99(r.greedy_ms), P50P99(r.equal_ms), P50P99(r.static_ms), dp,
        absl::StrCat(r.milp_cols, "/", r.milp_rows));
  }
  std::cout
      << "  ms (p50 / p99); proven<=gap: MILP answers proved within --gap (fb: fell "
         "back); max gap: largest proven (bound - objective) / objective; MILP vs best "
         "heur.: (MILP - best of greedy, equal_share, static) / best, mean and min; DP R k/n: "
         "refused (state limit) in k of n\n";
  for (const Row& r : rows) {
    for (const std::string& note : r.notes)
      std::cout << "  note " << r.label << (r.variant.empty() ? "" : absl::StrCat(" ", r.variant))
                << ": " << note << "\n";
  }
  std::cout << "\ntargets:\n";
  for (const Row& r : rows) {
    if (r.reps == 0) continue;
    const double p99 = Percentile(r.milp_ms, 0.99);
    const bool pools_ok = r.min_pools >= 8;
    const bool never_worse = r.below_heuristic == 0;
    const bool gap_ok = r.proven == r.reps;
    std::string what;
    double limit = 0;
    if (r.n == 4734 && r.j == 100) {
      limit = 200;
    } else if (r.j == 1000) {
      limit = 1000;
    } else if (r.n >= 40000 && r.j == 100) {
      limit = 200;
    }
    if (limit == 0) continue;
    std::cout << absl::StrFormat(
        "  %d nodes x %d jobs%s, %d-%d pools: MILP p99 %s ms < %.0f ms %s; gap <= %.0e proven "
        "%d/%d %s; never below the best heuristic (%d below) %s%s\n",
        r.n, r.j, r.variant.empty() ? "" : absl::StrCat(" (", r.variant, ")"), r.min_pools,
        r.max_pools, Ms(p99), limit, p99 < limit ? "MET" : "MISSED", absl::GetFlag(FLAGS_gap),
        r.proven, r.reps, gap_ok ? "MET" : "MISSED", r.below_heuristic,
        never_worse ? "MET" : "MISSED",
        pools_ok ? "" : " (fewer than 8 pools: not the target's instance)");
  }
  std::cout << absl::StrFormat("\nran in %.0f s%s\n", absl::ToDoubleSeconds(absl::Now() - start),
                               ok ? "" : "; SOME MEASUREMENTS FAILED (see notes)");
  return ok ? 0 : 1;
}
