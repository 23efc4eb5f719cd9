#include "libmalle/alloc/milp.h"

#include <sys/types.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/dp.h"
#include "libmalle/alloc/heuristics.h"
#include "libmalle/alloc/problem.h"
#include "tests/cpp/alloc/oracles.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::alloc {
namespace {

using ::malle::testing::IsOk;
using ::testing::HasSubstr;

// MILP and DP agree when their objectives are within this (relative).
constexpr double kTolerance = 1e-6;

double Rel(double a, double b) { return std::fabs(a - b) / std::max(1.0, std::fabs(b)); }

// A throughput curve over [lo, hi]: 2-4 breakpoints, sometimes concave
// (diminishing returns), sometimes not (random values; a bump or a dip).
Curve RandomCurve(std::mt19937& rng, int lo, int hi, double per_node) {
  const std::vector<int> xs = testing::RandomBreakpoints(rng, lo, hi);
  const bool concave = rng() % 2 == 0;
  return testing::CurveThrough(rng, xs, per_node, concave);
}

struct GenOptions {
  int max_nodes = 40;
  int max_jobs = 8;
  bool multi_pool = false;
};

// A random Problem exercising the edge cases the DP and MILP must agree on.
Problem RandomProblem(std::mt19937& rng, const GenOptions& g) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Problem p;
  p.forward_window = absl::Seconds(60 + rng() % 240);
  p.objective = static_cast<Objective>(rng() % 3);
  p.resize_cost = static_cast<ResizeCostModel>(rng() % 2);

  int num_nodes = rng() % 10 == 0 ? 0 : 1 + static_cast<int>(rng() % g.max_nodes);
  if (g.multi_pool) {
    const int classes = 2 + rng() % 2;
    for (int c = 0; c < classes; ++c) {
      p.classes.push_back(NodeClass{absl::StrCat("c", c), absl::StrCat("rack", rng() % 2),
                                    c == 0 ? 1.0 : 0.5 + 0.5 * u(rng)});
    }
    p.cross_locality_factor = rng() % 2 == 0 ? 1.0 : 0.7 + 0.3 * u(rng);
  }
  for (int i = 0; i < num_nodes; ++i) {
    Node node{absl::StrCat("n", i)};
    if (g.multi_pool) {
      node.class_id = p.classes[rng() % p.classes.size()].id;
      if (rng() % 3 == 0) node.expected_idle = p.forward_window * (0.2 + 0.7 * u(rng));
    }
    p.nodes.push_back(node);
  }
  std::vector<int> free_nodes(num_nodes);
  for (int i = 0; i < num_nodes; ++i) free_nodes[i] = i;
  std::shuffle(free_nodes.begin(), free_nodes.end(), rng);

  const int num_jobs = 1 + static_cast<int>(rng() % g.max_jobs);
  const double magnitude = std::pow(10.0, rng() % 6);  // samples/s per node: 1 .. 1e5
  for (int j = 0; j < num_jobs; ++j) {
    if (j > 0 && rng() % 6 == 0) {  // a tie: an identical copy of the previous job
      JobSpec copy = p.jobs.back();
      copy.id = absl::StrCat("j", j);
      copy.current_nodes.clear();
      p.jobs.push_back(copy);
      continue;
    }
    JobSpec job;
    job.id = absl::StrCat("j", j);
    const int kind = rng() % 10;
    if (kind == 0) {  // may take every node (and more)
      job.min_nodes = 1;
      job.max_nodes = std::max(1, num_nodes + static_cast<int>(rng() % 3));
    } else if (kind == 1) {  // cannot start: needs more nodes than exist
      job.min_nodes = num_nodes + 1 + rng() % 3;
      job.max_nodes = job.min_nodes + rng() % 4;
    } else {
      job.min_nodes = 1 + rng() % 4;
      job.max_nodes = job.min_nodes + rng() % 12;
    }
    const double per_node = magnitude * (0.5 + u(rng));
    if (rng() % 4 == 0) {
      const int options = 2 + rng() % 2;
      for (int b = 0; b < options; ++b) {
        job.batch_options.push_back({absl::StrCat("bs", 256 << b),
                                     RandomCurve(rng, job.min_nodes, job.max_nodes, per_node)});
      }
      job.current_batch_option = rng() % options;
    } else {
      job.throughput = RandomCurve(rng, job.min_nodes, job.max_nodes, per_node);
    }
    job.resize_up_pause = absl::Seconds(rng() % 40);
    job.resize_down_pause = absl::Seconds(rng() % 20);
    job.weight = 0.5 + 2.0 * u(rng);
    // Current nodes: none, below min (must stop or grow), within range.
    if (!free_nodes.empty() && rng() % 3 != 0) {
      const int want = 1 + rng() % std::min<int>(job.max_nodes, free_nodes.size());
      for (int k = 0; k < want; ++k) {
        job.current_nodes.push_back(p.nodes[free_nodes.back()].id);
        free_nodes.pop_back();
      }
    }
    p.jobs.push_back(job);
  }
  return p;
}

// Solves `problem` with the DP and the MILP and checks that they agree.
void ExpectAgrees(const Problem& problem, const MilpOptions& options, const std::string& label) {
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(problem));
  ASSERT_OK_AND_ASSIGN(PolicyResult dp, SolveDp(model));
  ASSERT_OK_AND_ASSIGN(PolicyResult milp, SolveMilp(model, options));
  EXPECT_LE(Rel(milp.solution.objective, dp.solution.objective), kTolerance)
      << label << ": milp " << milp.solution.objective << " dp " << dp.solution.objective
      << " reason: " << milp.reason;
  EXPECT_THAT(CheckSolution(model, milp.solution), IsOk()) << label;
  EXPECT_FALSE(milp.fell_back) << label << ": " << milp.reason;
  EXPECT_TRUE(milp.optimal) << label << ": " << milp.reason;
  EXPECT_GE(milp.best_bound, milp.solution.objective - 1e-9 * std::fabs(milp.solution.objective))
      << label;
  EXPECT_GT(milp.columns, 0) << label;
}

// One pool: the decomposition (the default) and CBC on the segment
// formulation (decomposition = false), each against the DP.
TEST(MilpTest, SinglePoolMatchesDpOnRandomProblems) {
  for (const bool decomposition : {true, false}) {
    std::mt19937 rng(20240601);
    MilpOptions options;
    EXPECT_TRUE(options.decomposition);  // the default
    options.decomposition = decomposition;
    options.isolation = SolveIsolation::kInProcess;
    options.time_limit = absl::Seconds(10);  // never the reason to disagree
    for (int i = 0; i < 1000; ++i) {
      const Problem problem = RandomProblem(rng, {});
      const std::string label =
          absl::StrCat(decomposition ? "decomposition" : "cbc", " instance ", i);
      ExpectAgrees(problem, options, label);
      ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(problem));
      ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveMilp(model, options));
      if (model.jobs.size() > 0 && r.optimal && !r.fell_back) {
        EXPECT_EQ(r.reason.find("decomposition:") != std::string::npos, decomposition)
            << label << ": " << r.reason;
      }
      if (::testing::Test::HasFailure()) return;  // one report is enough
    }
  }
}

TEST(MilpTest, OptionFormulationMatchesDpOnRandomProblems) {
  // One binary per option (segments = false): what several pools use, kept
  // correct on one pool too.
  std::mt19937 rng(20240602);
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.time_limit = absl::Seconds(10);
  options.segments = false;
  for (int i = 0; i < 300; ++i) {
    const Problem problem = RandomProblem(rng, {});
    ExpectAgrees(problem, options, absl::StrCat("instance ", i));
    if (::testing::Test::HasFailure()) break;
  }
}

// Many jobs of a few models that differ in their resize pauses and current
// counts, as in the ImageNet mixes: what the count and stay chains of the
// segment formulation order (milp.cc). Some jobs are exact copies, some run
// at the same count as a sibling, some at none.
Problem NearCopies(std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Problem p;
  p.forward_window = absl::Seconds(60 + rng() % 240);
  p.objective = static_cast<Objective>(rng() % 3);
  p.resize_cost = static_cast<ResizeCostModel>(rng() % 2);
  const int num_nodes = 20 + static_cast<int>(rng() % 60);
  for (int i = 0; i < num_nodes; ++i) p.nodes.push_back(Node{absl::StrCat("n", i)});
  int next_free = 0;
  const int models = 1 + static_cast<int>(rng() % 3);
  std::vector<JobSpec> base;
  for (int m = 0; m < models; ++m) {
    JobSpec job;
    job.min_nodes = 1 + rng() % 2;
    job.max_nodes = job.min_nodes + 4 + rng() % 12;
    job.throughput = RandomCurve(rng, job.min_nodes, job.max_nodes, 100.0 * (0.5 + u(rng)));
    base.push_back(job);
  }
  const int num_jobs = 4 + static_cast<int>(rng() % 10);
  const int shared_count = 1 + static_cast<int>(rng() % 6);
  for (int j = 0; j < num_jobs; ++j) {
    JobSpec job = base[rng() % base.size()];
    job.id = absl::StrCat("j", j);
    job.resize_up_pause = absl::Milliseconds(10000 + rng() % 20000);
    job.resize_down_pause = absl::Milliseconds(5000 + rng() % 15000);
    if (rng() % 5 == 0 && j > 0) {
      job.resize_up_pause = p.jobs.back().resize_up_pause;
      job.resize_down_pause = p.jobs.back().resize_down_pause;
    }
    const int r = rng() % 4;
    int want = r == 0 ? 0 : r == 1 ? shared_count : static_cast<int>(rng() % (job.max_nodes + 1));
    want = std::min({want, job.max_nodes, num_nodes - next_free});
    for (int k = 0; k < want; ++k) job.current_nodes.push_back(p.nodes[next_free++].id);
    p.jobs.push_back(job);
  }
  return p;
}

TEST(MilpTest, SinglePoolMatchesDpOnNearCopies) {
  std::mt19937 rng(20240603);
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.time_limit = absl::Seconds(10);
  for (int i = 0; i < 500; ++i) {
    const Problem problem = NearCopies(rng);
    ExpectAgrees(problem, options, absl::StrCat("instance ", i));
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(MilpTest, SinglePoolMatchesDpInForkedChild) {
  std::mt19937 rng(777);
  MilpOptions options;
  options.time_limit = absl::Seconds(10);
  for (int i = 0; i < 50; ++i) {
    const Problem problem = RandomProblem(rng, {});
    ExpectAgrees(problem, options, absl::StrCat("forked instance ", i));
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(MilpTest, MultiPoolMatchesDpOnRandomProblems) {
  std::mt19937 rng(4242);
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.time_limit = absl::Seconds(10);
  GenOptions g;
  g.multi_pool = true;
  g.max_nodes = 10;
  g.max_jobs = 4;
  int multi = 0;
  for (int i = 0; i < 200; ++i) {
    const Problem problem = RandomProblem(rng, g);
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(problem));
    multi += model.single_pool() ? 0 : 1;
    ExpectAgrees(problem, options, absl::StrCat("multi-pool instance ", i));
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(multi, 150);  // the generator really makes several pools
}

// The decomposition's search changes the LPs it solves as the fixing
// grows: columns and jobs (those left one stop or stay option) leave the
// master, options leave a node's subtree. The optimum must not change:
// against the DP on random multi-pool problems, on which all of that
// happens (the detail in the reason says how often).
TEST(MilpTest, DecompositionMatchesDpWhileTheMasterShrinks) {
  std::mt19937 rng(2811);
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.time_limit = absl::Seconds(10);
  options.relative_gap = 1e-9;
  GenOptions g;
  g.multi_pool = true;
  g.max_nodes = 10;
  g.max_jobs = 4;
  int jobs_out = 0, rebuilt = 0, node_fixed = 0;
  for (int i = 0; i < 300; ++i) {
    const Problem problem = RandomProblem(rng, g);
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(problem));
    if (model.single_pool()) continue;
    ASSERT_OK_AND_ASSIGN(PolicyResult dp, SolveDp(model));
    ASSERT_OK_AND_ASSIGN(PolicyResult milp, SolveMilp(model, options));
    EXPECT_LE(Rel(milp.solution.objective, dp.solution.objective), kTolerance)
        << "instance " << i << ": milp " << milp.solution.objective << " dp "
        << dp.solution.objective << " reason: " << milp.reason;
    EXPECT_TRUE(milp.optimal) << "instance " << i << ": " << milp.reason;
    EXPECT_THAT(CheckSolution(model, milp.solution), IsOk()) << "instance " << i;
    jobs_out += milp.reason.find(" 0 jobs out of the master") == std::string::npos &&
                milp.reason.find("jobs out of the master") != std::string::npos;
    rebuilt += milp.reason.find("(0 rebuilds") == std::string::npos &&
               milp.reason.find("rebuilds") != std::string::npos;
    node_fixed += milp.reason.find(" 0 options fixed at nodes") == std::string::npos &&
                  milp.reason.find("options fixed at nodes") != std::string::npos;
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(jobs_out, 0);
  EXPECT_GT(rebuilt, 0);
  EXPECT_GT(node_fixed, 0);
}

// MIR cuts on the pools' capacities (internal::PoolCut) at the root, on
// pools large enough for their right-hand sides to exceed 0: the proven
// optimum is the DP's, with and without cuts, and cuts were kept (dual > 0)
// on many instances. No local search and a gap of 1e-9, so that the search
// branches from the cut root.
TEST(MilpTest, CutsKeepTheDpOptimum) {
  std::mt19937 rng(2812);
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.time_limit = absl::Seconds(10);
  options.relative_gap = 1e-9;
  options.decomposition_local_search = false;
  GenOptions g;
  g.multi_pool = true;
  g.max_nodes = 24;
  g.max_jobs = 6;
  int kept = 0, solved = 0;
  for (int i = 0; i < 150; ++i) {
    const Problem problem = RandomProblem(rng, g);
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(problem));
    if (model.single_pool()) continue;
    absl::StatusOr<PolicyResult> dp = SolveDp(model);
    if (!dp.ok()) continue;  // beyond the DP's state limit
    ++solved;
    for (int rounds : {0, 40}) {
      options.decomposition_cut_rounds = rounds;
      ASSERT_OK_AND_ASSIGN(PolicyResult milp, SolveMilp(model, options));
      EXPECT_LE(Rel(milp.solution.objective, dp->solution.objective), kTolerance)
          << "instance " << i << " rounds " << rounds << ": milp " << milp.solution.objective
          << " dp " << dp->solution.objective << " reason: " << milp.reason;
      EXPECT_TRUE(milp.optimal) << "instance " << i << ": " << milp.reason;
      EXPECT_GE(milp.best_bound, dp->solution.objective -
                                     kTolerance * std::max(1.0, std::fabs(dp->solution.objective)))
          << "instance " << i << " rounds " << rounds << ": " << milp.reason;
      EXPECT_THAT(CheckSolution(model, milp.solution), IsOk()) << "instance " << i;
      if (rounds > 0 && milp.reason.find(" cuts in ") != std::string::npos) {
        kept += milp.reason.find("; 0 cuts in ") == std::string::npos;
      }
    }
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(solved, 60);
  EXPECT_GT(kept, 10);
}

// Rank weights (Problem::rank_weight_exponent) only change option values,
// so the MILP must still equal the DP, on one pool and on several. Work left
// is random with ties (copies keep the copied amount) and amounts small
// enough for the finishing cap to bind; every other instance ages the
// ranking (Problem::rank_aging, random ages from a generator of its own).
TEST(MilpTest, RankWeightsMatchDpOnRandomProblems) {
  std::mt19937 rng(2727);
  std::mt19937 aging_rng(27);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.time_limit = absl::Seconds(10);
  GenOptions multi;
  multi.multi_pool = true;
  multi.max_nodes = 10;
  multi.max_jobs = 4;
  int capped = 0;
  for (int i = 0; i < 400; ++i) {
    Problem problem = RandomProblem(rng, i < 300 ? GenOptions{} : multi);
    problem.rank_weight_exponent = std::vector<double>{0.5, 1, 2}[rng() % 3];
    for (size_t j = 0; j < problem.jobs.size(); ++j) {
      JobSpec& job = problem.jobs[j];
      if (j > 0 && rng() % 4 == 0) {
        job.remaining_samples = problem.jobs[j - 1].remaining_samples;
        continue;
      }
      const Curve& c = job.batch_options.empty() ? job.throughput : job.batch_options[0].throughput;
      // Between a tenth of and twice what the job trains at max size in the window.
      const double window_work =
          c.back().samples_per_s * absl::ToDoubleSeconds(problem.forward_window);
      job.remaining_samples = std::max(1.0, window_work * (0.1 + 1.9 * u(rng)));
      capped += job.remaining_samples < window_work ? 1 : 0;
    }
    if (i % 2 == 1) {
      problem.rank_aging = absl::Seconds(10 + 990 * u(aging_rng));
      for (JobSpec& job : problem.jobs) job.age = absl::Seconds(std::floor(3000 * u(aging_rng)));
    }
    ExpectAgrees(problem, options, absl::StrCat("rank-weighted instance ", i));
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(capped, 100);  // the cap really binds on some
}

// Eight pools (2 speeds x 2 locality groups x 2 idle-window buckets), a few
// jobs: the MILP's optimum equals an exhaustive search over every way of
// splitting every pool's nodes among the jobs, valued by JobVectorValue
// (the count model's rules), independent of the DP.
// Every multi-pool method: the decomposition (branch-and-price, the
// default), pool-union rows solved by pricing, the same rows with CBC on
// the whole model, per-pool counts.
struct Formulation {
  const char* name;
  MilpOptions::Pools pools;
  bool pricing;
  bool decomposition;
};
class MultiPoolExhaustiveTest : public ::testing::TestWithParam<Formulation> {};

TEST_P(MultiPoolExhaustiveTest, MatchesExhaustiveSearchWithEightPools) {
  std::mt19937 rng(8080);
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.time_limit = absl::Seconds(10);
  options.pools = GetParam().pools;
  options.pricing = GetParam().pricing;
  options.decomposition = GetParam().decomposition;
  int eight = 0;
  for (int i = 0; i < 60; ++i) {
    // Every objective, a weight per job, curves concave or not.
    const Problem p = testing::EightPools(rng, {/*objectives=*/3, /*weights=*/true, std::nullopt});
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
    eight += model.pools.size() == 8;

    // Exhaustive: pool by pool, every split of its capacity among the jobs.
    const testing::Exhaustive exhaustive = testing::ExhaustiveSearch(model);
    const double best = exhaustive.best;
    const long long leaves = exhaustive.leaves;
    ASSERT_TRUE(std::isfinite(best)) << "instance " << i;  // stopping everyone is allowed
    ASSERT_OK_AND_ASSIGN(PolicyResult milp, SolveMilp(model, options));
    EXPECT_LE(Rel(milp.solution.objective, best), 1e-9)
        << "instance " << i << ": milp " << milp.solution.objective << " exhaustive " << best
        << " over " << leaves << " splits; " << milp.reason;
    EXPECT_TRUE(milp.optimal) << "instance " << i << ": " << milp.reason;
    EXPECT_FALSE(milp.fell_back) << "instance " << i << ": " << milp.reason;
    EXPECT_THAT(CheckSolution(model, milp.solution), IsOk());
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(eight, 40);  // most instances really have eight pools
}

INSTANTIATE_TEST_SUITE_P(
    Formulations, MultiPoolExhaustiveTest,
    ::testing::Values(
        Formulation{"decomposition", MilpOptions::Pools::kPerPoolCounts, false, true},
        Formulation{"union_pricing", MilpOptions::Pools::kUnionRows, true, false},
        Formulation{"union_whole", MilpOptions::Pools::kUnionRows, false, false},
        Formulation{"per_pool", MilpOptions::Pools::kPerPoolCounts, false, false}),
    [](const ::testing::TestParamInfo<Formulation>& info) { return info.param.name; });

// The MILP's start is the best of the current allocation and the baselines'
// answers: with no time to search, the answer is still at least the best
// heuristic's, on one pool and on several.
TEST(MilpTest, NeverWorseThanTheBestHeuristic) {
  std::mt19937 rng(99);
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.time_limit = absl::Milliseconds(1);
  for (bool multi : {false, true}) {
    GenOptions g;
    g.multi_pool = multi;
    g.max_nodes = multi ? 10 : 40;
    for (int i = 0; i < 200; ++i) {
      const Problem problem = RandomProblem(rng, g);
      ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(problem));
      ASSERT_OK_AND_ASSIGN(PolicyResult milp, SolveMilp(model, options));
      for (auto* solve : {&SolveGreedy, &SolveEqualShare, &SolveStatic}) {
        ASSERT_OK_AND_ASSIGN(PolicyResult h, solve(model));
        EXPECT_GE(milp.solution.objective,
                  h.solution.objective - 1e-9 * std::max(1.0, std::fabs(h.solution.objective)))
            << (multi ? "multi" : "single") << "-pool instance " << i << ": " << milp.reason
            << " vs " << h.reason;
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(MilpTest, NoJobsAndNoNodes) {
  Problem p;
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveMilp(model, {}));
  EXPECT_TRUE(r.solution.option.empty());
  EXPECT_EQ(r.solution.objective, 0.0);

  JobSpec job;
  job.id = "a";
  job.throughput = {{1, 10.0}, {4, 30.0}};
  job.max_nodes = 4;
  p.jobs.push_back(job);
  ASSERT_OK_AND_ASSIGN(model, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(r, SolveMilp(model, {}));
  ASSERT_EQ(r.solution.option.size(), 1u);
  EXPECT_EQ(r.solution.option[0], 0);
  EXPECT_FALSE(r.fell_back) << r.reason;
}

// Idle nodes and no job (every job done, or none submitted yet): the master
// LP has the pools' rows and no column. Clp's dual simplex crashed on it
// (SIGSEGV): in process that killed the caller, forked it fell back to the
// DP with "solver crashed" (seen at the end of the demo).
TEST(MilpTest, IdleNodesAndNoJobs) {
  Problem p;
  for (int i = 0; i < 4; ++i) p.nodes.push_back(Node{absl::StrCat("n", i)});
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
  for (SolveIsolation isolation : {SolveIsolation::kInProcess, SolveIsolation::kFork}) {
    MilpOptions o;
    o.isolation = isolation;
    ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveMilp(model, o));
    EXPECT_TRUE(r.solution.option.empty());
    EXPECT_EQ(r.solution.objective, 0.0);
    EXPECT_TRUE(r.optimal) << r.reason;
    EXPECT_FALSE(r.fell_back) << r.reason;
  }
}

// Four jobs with distinct curves on 12 nodes: the answer is known from the
// DP, the faults must not change it.
Problem FaultProblem() {
  std::mt19937 rng(99);
  Problem p;
  for (int i = 0; i < 12; ++i) p.nodes.push_back(Node{absl::StrCat("n", i)});
  for (int j = 0; j < 4; ++j) {
    JobSpec job;
    job.id = absl::StrCat("j", j);
    job.min_nodes = 1;
    job.max_nodes = 8;
    job.throughput = RandomCurve(rng, 1, 8, 100.0 * (j + 1));
    p.jobs.push_back(job);
  }
  p.jobs[0].current_nodes = {"n0", "n1"};
  return p;
}

bool NoChildLeft() {
  errno = 0;
  return waitpid(-1, nullptr, WNOHANG) == -1 && errno == ECHILD;
}

void ExpectFaultFallsBack(MilpFault fault, const std::string& cause) {
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(FaultProblem()));
  ASSERT_OK_AND_ASSIGN(PolicyResult dp, SolveDp(model));
  MilpOptions options;
  options.fault = fault;
  options.time_limit = absl::Milliseconds(200);
  options.kill_grace = absl::Milliseconds(200);
  const absl::Time t0 = absl::Now();
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveMilp(model, options));
  const absl::Duration took = absl::Now() - t0;
  EXPECT_TRUE(r.fell_back);
  EXPECT_THAT(r.reason, HasSubstr(cause));
  EXPECT_THAT(r.reason, HasSubstr("answered by dp"));
  EXPECT_EQ(r.answered_by, "dp");
  EXPECT_NEAR(r.solution.objective, dp.solution.objective, 1e-9);
  EXPECT_THAT(CheckSolution(model, r.solution), IsOk());
  EXPECT_LT(took, absl::Seconds(2));  // time_limit + kill_grace, plus slack
  EXPECT_TRUE(NoChildLeft()) << "the solver child was not reaped";
}

TEST(MilpTest, CrashFallsBackToDp) {
  ExpectFaultFallsBack(MilpFault::kCrash, "solver crashed (signal 11)");
}

TEST(MilpTest, HangIsKilledAndFallsBackToDp) {
  const absl::Time t0 = absl::Now();
  ExpectFaultFallsBack(MilpFault::kHang, "solver hung");
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(400));  // it waited for the deadline
}

TEST(MilpTest, GarbageFallsBackToDp) { ExpectFaultFallsBack(MilpFault::kGarbage, "garbage"); }

TEST(MilpTest, FaultsAreIgnoredInProcess) {
  // Only the forked child can misbehave safely; in process the hook is a no-op.
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(FaultProblem()));
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.fault = MilpFault::kCrash;
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveMilp(model, options));
  EXPECT_FALSE(r.fell_back) << r.reason;
  EXPECT_TRUE(r.optimal);
}

// Many jobs with non-concave curves (a bump at their current size, from the
// resize pause): hard enough that 1 ms is too little for CBC.
Problem LargeProblem(int jobs, int nodes, unsigned seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.resize_cost = ResizeCostModel::kLostWork;
  for (int i = 0; i < nodes; ++i) p.nodes.push_back(Node{absl::StrCat("n", i)});
  int next = 0;
  for (int j = 0; j < jobs; ++j) {
    JobSpec job;
    job.id = absl::StrCat("j", j);
    job.min_nodes = 1 + rng() % 4;
    job.max_nodes = 64;
    job.throughput = RandomCurve(rng, job.min_nodes, job.max_nodes, 1e4);
    job.resize_up_pause = absl::Seconds(10 + rng() % 30);
    job.resize_down_pause = absl::Seconds(5);
    const int held = rng() % 3 == 0 ? 0 : job.min_nodes + rng() % 4;
    for (int k = 0; k < held && next < nodes; ++k)
      job.current_nodes.push_back(absl::StrCat("n", next++));
    if (static_cast<int>(job.current_nodes.size()) < job.min_nodes) job.current_nodes.clear();
    p.jobs.push_back(job);
  }
  return p;
}

TEST(MilpTest, ShortTimeLimitReturnsIncumbentOrDpAnswer) {
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(LargeProblem(400, 1500, 3)));
  ASSERT_OK_AND_ASSIGN(PolicyResult dp, SolveDp(model));
  for (SolveIsolation isolation : {SolveIsolation::kInProcess, SolveIsolation::kFork}) {
    MilpOptions options;
    options.isolation = isolation;
    options.time_limit = absl::Milliseconds(1);
    ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveMilp(model, options));
    EXPECT_THAT(CheckSolution(model, r.solution), IsOk()) << r.reason;
    if (r.fell_back) {
      EXPECT_NEAR(r.solution.objective, dp.solution.objective,
                  1e-9 * std::fabs(dp.solution.objective));
    } else if (!r.optimal) {
      EXPECT_LE(r.solution.objective, dp.solution.objective * (1 + 1e-9)) << r.reason;
      EXPECT_GE(r.best_bound, dp.solution.objective * (1 - kTolerance)) << r.reason;
      EXPECT_THAT(r.reason, HasSubstr("time limit"));
    } else {
      EXPECT_LE(Rel(r.solution.objective, dp.solution.objective), kTolerance) << r.reason;
    }
  }
  EXPECT_TRUE(NoChildLeft());
}

// The limit runs from `started`: what went before the solve (here 10 s, as
// if the decision had waited that long) is taken off the solver's time, down
// to 1 ms, in which it answers with its start, and the reason says so. With
// `started` left at its default the solver has (nearly) the whole limit.
TEST(MilpTest, TheLimitRunsFromStarted) {
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(LargeProblem(400, 1500, 3)));
  for (SolveIsolation isolation : {SolveIsolation::kInProcess, SolveIsolation::kFork}) {
    MilpOptions options;
    options.isolation = isolation;
    options.time_limit = absl::Seconds(1);
    options.started = absl::Now() - absl::Seconds(10);
    ASSERT_OK_AND_ASSIGN(PolicyResult late, SolveMilp(model, options));
    EXPECT_THAT(CheckSolution(model, late.solution), IsOk()) << late.reason;
    EXPECT_THAT(late.reason, HasSubstr("(the solver had 1ms of the limit's 1s: 10")) << late.reason;
    EXPECT_LT(late.solve_time, absl::Seconds(1)) << late.reason;

    options.started = absl::InfinitePast();
    ASSERT_OK_AND_ASSIGN(PolicyResult now, SolveMilp(model, options));
    EXPECT_THAT(now.reason, ::testing::Not(HasSubstr("the solver had"))) << now.reason;
    EXPECT_GE(now.solution.objective, late.solution.objective * (1 - 1e-9)) << now.reason;

    // A start in the future does not lengthen the limit: 1 ms is not
    // enough to prove this model (10 s would be).
    options.time_limit = absl::Milliseconds(1);
    options.started = absl::Now() + absl::Seconds(10);
    ASSERT_OK_AND_ASSIGN(PolicyResult future, SolveMilp(model, options));
    EXPECT_THAT(CheckSolution(model, future.solution), IsOk()) << future.reason;
    EXPECT_THAT(future.reason, HasSubstr("time limit 1ms")) << future.reason;
  }
  EXPECT_TRUE(NoChildLeft());
}

// The DP's answer as the start: same optimum, and CBC accepts every start.
// The generator's identical copies make the DP's answer break the ordering
// rows of identical jobs now and then (the DP breaks ties its own way);
// BuildFormulation reorders them, else CBC would ignore the start.
TEST(MilpTest, DpStartAgreesWithDpOnRandomProblems) {
  std::mt19937 rng(8080);
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.time_limit = absl::Seconds(10);
  options.dp_start = true;
  GenOptions multi;
  multi.multi_pool = true;
  multi.max_nodes = 10;
  multi.max_jobs = 4;
  for (int i = 0; i < 400; ++i) {
    const Problem problem = RandomProblem(rng, i < 300 ? GenOptions{} : multi);
    const std::string label = absl::StrCat("dp-start instance ", i);
    ExpectAgrees(problem, options, label);
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(problem));
    ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveMilp(model, options));
    EXPECT_THAT(r.reason, HasSubstr("started from the dp's answer")) << label;
    EXPECT_THAT(r.reason, ::testing::Not(HasSubstr("ignored"))) << label;
    if (::testing::Test::HasFailure()) break;
  }
}

// Groups of identical jobs (the ordering rows apply to them) whose curves
// are flat over a range (options the formulation leaves out as dominated):
// the DP's answer must still be a start CBC accepts. With 1 ms CBC cannot
// finish, so a rejected start would leave it without an incumbent and the
// DP fallback would answer.
TEST(MilpTest, DpStartIsAcceptedWithIdenticalJobsAndPlateaus) {
  Problem p;
  p.resize_cost = ResizeCostModel::kLostWork;
  for (int i = 0; i < 1500; ++i) p.nodes.push_back(Node{absl::StrCat("n", i)});
  std::mt19937 rng(5);
  for (int j = 0; j < 450; ++j) {
    if (j % 3 != 0) {  // two identical copies of every third job
      JobSpec copy = p.jobs.back();
      copy.id = absl::StrCat("j", j);
      p.jobs.push_back(copy);
      continue;
    }
    JobSpec job;
    job.id = absl::StrCat("j", j);
    job.min_nodes = 1;
    job.max_nodes = 32;
    const double r1 = 1000.0 * (1 + rng() % 50);
    const int flat_from = 4 + rng() % 8;
    job.throughput = {{1, r1}, {flat_from, r1 * flat_from * 0.9}, {flat_from + 8, r1 * flat_from * 0.9},
                      {32, r1 * (flat_from + 10) * 0.8}};
    job.resize_up_pause = absl::Seconds(10 + rng() % 20);
    p.jobs.push_back(job);
  }
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult dp, SolveDp(model));
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.time_limit = absl::Milliseconds(1);
  options.dp_start = true;
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveMilp(model, options));
  EXPECT_FALSE(r.fell_back) << r.reason;
  EXPECT_THAT(r.reason, HasSubstr("started from the dp's answer"));
  EXPECT_THAT(CheckSolution(model, r.solution), IsOk());
  EXPECT_LE(Rel(r.solution.objective, dp.solution.objective), kTolerance) << r.reason;

  // Without the DP's start the same 1 ms gives at best CBC's incumbent from
  // the current allocation (all stopped here), or the fallback.
  options.dp_start = false;
  ASSERT_OK_AND_ASSIGN(PolicyResult plain, SolveMilp(model, options));
  EXPECT_THAT(plain.reason, ::testing::Not(HasSubstr("started from the dp's answer")));
  EXPECT_LE(plain.solution.objective, dp.solution.objective * (1 + 1e-9));
}

TEST(MilpTest, DpStartFallbackReusesTheDp) {
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(FaultProblem()));
  ASSERT_OK_AND_ASSIGN(PolicyResult dp, SolveDp(model));
  MilpOptions options;
  options.dp_start = true;
  options.fault = MilpFault::kCrash;
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveMilp(model, options));
  EXPECT_TRUE(r.fell_back);
  EXPECT_THAT(r.reason, HasSubstr("answered by dp"));
  EXPECT_EQ(r.answered_by, "dp");
  EXPECT_NEAR(r.solution.objective, dp.solution.objective, 1e-9);
  EXPECT_TRUE(NoChildLeft());
}

TEST(MilpTest, ConcurrentCallersGetCorrectAnswers) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 8;
  std::vector<CountModel> models;
  std::vector<double> expected;
  std::mt19937 rng(31337);
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(RandomProblem(rng, {})));
    ASSERT_OK_AND_ASSIGN(PolicyResult dp, SolveDp(m));
    models.push_back(std::move(m));
    expected.push_back(dp.solution.objective);
  }
  std::vector<double> got(models.size(), std::nan(""));
  std::vector<std::string> reasons(models.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        const int i = t * kPerThread + k;
        MilpOptions options;
        // Mix both isolations: they share the one lock.
        options.isolation = k % 2 == 0 ? SolveIsolation::kFork : SolveIsolation::kInProcess;
        options.time_limit = absl::Seconds(10);
        absl::StatusOr<PolicyResult> r = SolveMilp(models[i], options);
        if (r.ok()) {
          got[i] = r->solution.objective;
          reasons[i] = r->reason;
        } else {
          reasons[i] = r.status().ToString();
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (size_t i = 0; i < models.size(); ++i) {
    EXPECT_LE(Rel(got[i], expected[i]), kTolerance) << "model " << i << ": " << reasons[i];
    EXPECT_THAT(reasons[i], HasSubstr("milp: optimal")) << "model " << i;
  }
  EXPECT_TRUE(NoChildLeft());
}

}  // namespace
}  // namespace malle::alloc
