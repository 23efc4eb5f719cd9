#include "libmalle/alloc/internal/decomposition.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/milp.h"
#include "libmalle/alloc/problem.h"
#include "tests/cpp/alloc/oracles.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::alloc::internal {
namespace {

using ::malle::testing::IsOk;

constexpr double kInf = std::numeric_limits<double>::infinity();

double Rel(double a, double b) { return std::fabs(a - b) / std::max(1.0, std::fabs(b)); }

// Eight pools, 2-3 jobs, every curve concave or not (oracles.h).
Problem EightPools(std::mt19937& rng, bool concave) {
  return testing::EightPools(rng, {/*objectives=*/2, /*weights=*/false, concave});
}

using testing::Exhaustive;
Exhaustive Search(const CountModel& model) { return testing::ExhaustiveSearch(model); }

std::vector<double> RandomPrices(std::mt19937& rng, const CountModel& model, double magnitude) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> pi(model.pools.size());
  for (double& v : pi) v = rng() % 4 == 0 ? 0.0 : magnitude * u(rng);
  return pi;
}

double LargestValue(const CountModel& model) {
  double largest = 1;
  for (const JobModel& job : model.jobs) {
    for (const Option& o : job.options) largest = std::max(largest, std::fabs(o.value));
  }
  return largest;
}

// L(pi) bounds the optimum from above for every pi >= 0: the proof every
// answer of the decomposition rests on.
TEST(DecompositionTest, LagrangianBoundHoldsForAnyPrices) {
  std::mt19937 rng(2701);
  int instances = 0;
  for (int i = 0; i < 40; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(EightPools(rng, rng() % 2 == 0)));
    if (model.pools.size() < 2) continue;
    ++instances;
    const Exhaustive opt = Search(model);
    ASSERT_TRUE(std::isfinite(opt.best));
    JobPricer pricer(model);
    const double magnitude = LargestValue(model);
    for (int k = 0; k < 30; ++k) {
      // Prices from none to far above any node's worth.
      const std::vector<double> pi = RandomPrices(rng, model, magnitude * (k % 3) / 2.0);
      const double bound = LagrangianBound(model, pricer, pi);
      EXPECT_GE(bound, opt.best - 1e-9 * std::max(1.0, std::fabs(opt.best)))
          << "instance " << i << " prices #" << k;
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(instances, 30);
}

// Every per-pool vector a job may take for option o (the count model's
// rules: sum = nodes, pattern pools only, keep when growing, release only
// when shrinking, within capacities).
void ForEachSplit(const CountModel& model, const JobModel& job, int o,
                  const std::function<void(const std::vector<int>&)>& visit) {
  const int num_pools = static_cast<int>(model.pools.size());
  const Option& opt = job.options[o];
  std::vector<int> x(num_pools, 0);
  std::function<void(int, int)> rec = [&](int p, int left) {
    if (p == num_pools) {
      if (left == 0) visit(x);
      return;
    }
    const std::vector<int>& pools = job.patterns[opt.pattern].pools;
    const bool in = std::binary_search(pools.begin(), pools.end(), p);
    const int held = job.current_per_pool[p];
    int lo = 0, hi = in ? model.pools[p].capacity : 0;
    if (opt.nodes >= job.current_nodes) lo = held;
    if (opt.nodes <= job.current_nodes) hi = std::min(hi, held);
    for (int v = lo; v <= std::min(hi, left); ++v) {
      x[p] = v;
      rec(p + 1, left - v);
    }
    x[p] = 0;
  };
  rec(0, opt.nodes);
}

// Scores charge each option its cheapest split, and Split returns it.
TEST(DecompositionTest, ScoresChargeTheCheapestSplit) {
  std::mt19937 rng(2702);
  int checked = 0;
  for (int i = 0; i < 25; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(EightPools(rng, false)));
    JobPricer pricer(model);
    const std::vector<double> pi = RandomPrices(rng, model, LargestValue(model) / 4);
    std::vector<double> score;
    for (int j = 0; j < static_cast<int>(model.jobs.size()); ++j) {
      const JobModel& job = model.jobs[j];
      pricer.Scores(j, pi, PoolsByPrice(pi), score);
      ASSERT_EQ(score.size(), job.options.size());
      EXPECT_DOUBLE_EQ(score[0], job.options[0].value);
      for (int o = 1; o < static_cast<int>(job.options.size()); ++o) {
        double cheapest = kInf;
        ForEachSplit(model, job, o, [&](const std::vector<int>& x) {
          double cost = 0;
          for (size_t p = 0; p < x.size(); ++p) cost += pi[p] * x[p];
          cheapest = std::min(cheapest, cost);
        });
        const double expected = job.options[o].value - cheapest;
        EXPECT_NEAR(score[o], expected, 1e-9 * std::max(1.0, std::fabs(expected)))
            << "instance " << i << " job " << j << " option " << o;
        const std::vector<int> x = pricer.Split(j, o, pi, PoolsByPrice(pi));
        double cost = 0;
        int n = 0;
        for (size_t p = 0; p < x.size(); ++p) {
          cost += pi[p] * x[p];
          n += x[p];
        }
        EXPECT_EQ(n, job.options[o].nodes);
        EXPECT_NEAR(cost, cheapest, 1e-9 * std::max(1.0, cheapest));
        std::optional<double> v = JobVectorValue(job, x);
        ASSERT_TRUE(v.has_value()) << "instance " << i << " job " << j << " option " << o
                                   << ": the split breaks the count model's rules";
        EXPECT_GE(*v, job.options[o].value - 1e-9 * std::max(1.0, std::fabs(*v)));
        ++checked;
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
  EXPECT_GT(checked, 500);
}

// With every job's mode (pattern and direction) fixed to the optimum's and
// values concave in the count, the flow finds the optimum's value.
TEST(DecompositionTest, FlowRoundIsExactOnTheOptimumsModes) {
  std::mt19937 rng(2703);
  int exact = 0;
  for (int i = 0; i < 40; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(EightPools(rng, /*concave=*/true)));
    const Exhaustive opt = Search(model);
    JobPricer pricer(model);
    std::vector<Mode> modes;
    for (size_t j = 0; j < model.jobs.size(); ++j) {
      const JobModel& job = model.jobs[j];
      const int o = opt.options[j];
      modes.push_back({job.options[o].pattern, OptionDirection(job, o)});
    }
    std::optional<CountSolution> s = FlowRound(model, pricer, modes);
    ASSERT_TRUE(s.has_value()) << "instance " << i;
    EXPECT_THAT(CheckSolution(model, *s), IsOk()) << "instance " << i;
    EXPECT_LE(Rel(s->objective, opt.best), 1e-9)
        << "instance " << i << ": flow " << s->objective << " exhaustive " << opt.best;
    exact += Rel(s->objective, opt.best) <= 1e-9;
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_EQ(exact, 40);
}

// For any modes (not only the optimum's), with values concave in the count,
// the flow finds the best allocation that keeps every job in its mode, by
// an enumeration of the modes' options and PlaceOptions; no allocation when
// none exists. The flow's greedy (the source arcs by value, augmenting
// paths that never reduce earlier amounts) rests on the polymatroid
// argument in decomposition.cc; this checks it, ties and re-routing
// included.
TEST(DecompositionTest, FlowRoundIsExactOnAnyModes) {
  std::mt19937 rng(2707);
  int compared = 0, refused = 0;
  for (int i = 0; i < 60; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(EightPools(rng, /*concave=*/true)));
    JobPricer pricer(model);
    const int num_jobs = static_cast<int>(model.jobs.size());
    // Each job's mode: that of a random option; the options in that mode.
    std::vector<Mode> modes(num_jobs);
    std::vector<std::vector<int>> in_mode(num_jobs);
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = model.jobs[j];
      modes[j] = OptionMode(job, static_cast<int>(rng() % job.options.size()));
      for (int o = 0; o < static_cast<int>(job.options.size()); ++o) {
        const Mode m = OptionMode(job, o);
        if (m.direction == modes[j].direction &&
            (m.direction == Direction::kStop || m.pattern == modes[j].pattern)) {
          in_mode[j].push_back(o);
        }
      }
    }
    double best = -kInf;
    std::vector<int> pick(num_jobs);
    std::function<void(int)> rec = [&](int j) {
      if (j == num_jobs) {
        absl::StatusOr<CountSolution> placed = PlaceOptions(model, pick);
        if (placed.ok()) best = std::max(best, placed->objective);
        return;
      }
      for (int o : in_mode[j]) {
        pick[j] = o;
        rec(j + 1);
      }
    };
    rec(0);
    std::optional<CountSolution> s = FlowRound(model, pricer, modes);
    if (!std::isfinite(best)) {
      EXPECT_FALSE(s.has_value()) << "instance " << i << ": no allocation in these modes";
      ++refused;
      continue;
    }
    ASSERT_TRUE(s.has_value()) << "instance " << i << ": the best in these modes is " << best;
    EXPECT_THAT(CheckSolution(model, *s), IsOk()) << "instance " << i;
    for (int j = 0; j < num_jobs; ++j) {
      EXPECT_NE(std::find(in_mode[j].begin(), in_mode[j].end(), s->option[j]), in_mode[j].end())
          << "instance " << i << " job " << j << " left its mode";
    }
    EXPECT_LE(Rel(s->objective, best), 1e-9)
        << "instance " << i << ": flow " << s->objective << " enumeration " << best;
    ++compared;
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(compared, 30);
  EXPECT_GT(refused, 0);
}

// Modes whose smallest counts cannot all be placed: no allocation.
TEST(DecompositionTest, FlowRoundRefusesModesThatDoNotFit) {
  Problem p;
  p.forward_window = absl::Seconds(100);
  p.nodes = {Node{"a"}, Node{"b"}};
  for (const char* id : {"x", "y"}) {
    JobSpec job;
    job.id = id;
    job.min_nodes = 2;
    job.max_nodes = 2;
    job.throughput = {{2, 10.0}};
    p.jobs.push_back(job);
  }
  p.classes = {NodeClass{"c0", "g", 1.0}, NodeClass{"c1", "g", 0.5}};
  p.nodes[0].class_id = "c0";
  p.nodes[1].class_id = "c1";
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
  ASSERT_EQ(model.pools.size(), 2u);
  JobPricer pricer(model);
  // Both jobs up (from 0) in the pattern holding both pools: 4 nodes > 2.
  const int both = model.jobs[0].options.back().pattern;
  ASSERT_EQ(model.jobs[0].patterns[both].pools.size(), 2u);
  std::vector<Mode> modes = {{both, Direction::kUp}, {both, Direction::kUp}};
  EXPECT_FALSE(FlowRound(model, pricer, modes).has_value());
  modes[1] = {};
  std::optional<CountSolution> one = FlowRound(model, pricer, modes);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->option[1], 0);
  EXPECT_DOUBLE_EQ(one->objective, 10.0 * 0.5 * 100);  // the slow node sets the pace
}

// A hand-checked instance: pool A (2 nodes, speed 1), pool B (2 nodes,
// speed 0.5), one rack; job 1 makes 100 samples/s per node (max 2), job 2
// 60 (max 4); window 100 s, no pauses. Job 1 on A and job 2 on B (valued at
// B's speed): (200 + 60) x 100 = 26,000; the other way round 12,000 +
// 10,000; everyone on A and B at speed 0.5 less still.
TEST(DecompositionTest, HandCheckedTwoPools) {
  Problem p;
  p.forward_window = absl::Seconds(100);
  p.resize_cost = ResizeCostModel::kLostWork;
  p.classes = {NodeClass{"fast", "rack", 1.0}, NodeClass{"slow", "rack", 0.5}};
  p.nodes = {Node{"a0", "fast"}, Node{"a1", "fast"}, Node{"b0", "slow"}, Node{"b1", "slow"}};
  JobSpec one;
  one.id = "one";
  one.min_nodes = 1;
  one.max_nodes = 2;
  one.throughput = {{1, 100.0}, {2, 200.0}};
  JobSpec two = one;
  two.id = "two";
  two.max_nodes = 4;
  two.throughput = {{1, 60.0}, {4, 240.0}};
  p.jobs = {one, two};
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
  ASSERT_EQ(model.pools.size(), 2u);
  const int fast = model.pools[0].speed == 1.0 ? 0 : 1;
  DecompositionSettings settings;
  settings.relative_gap = 1e-9;
  ASSERT_OK_AND_ASSIGN(DecompositionResult r, SolveByDecomposition(model, CurrentSolution(model), settings));
  EXPECT_TRUE(r.proven) << r.detail;
  EXPECT_DOUBLE_EQ(r.solution.objective, 26000.0);
  EXPECT_NEAR(r.bound, 26000.0, 1e-6);
  EXPECT_EQ(r.solution.per_pool[0][fast], 2);
  EXPECT_EQ(r.solution.per_pool[0][1 - fast], 0);
  EXPECT_EQ(r.solution.per_pool[1][fast], 0);
  EXPECT_EQ(r.solution.per_pool[1][1 - fast], 2);
  EXPECT_THAT(CheckSolution(model, r.solution), IsOk());
  // The public entry point gives the same (the decomposition is its default
  // with several pools).
  MilpOptions options;
  options.isolation = SolveIsolation::kInProcess;
  options.relative_gap = 1e-9;
  ASSERT_OK_AND_ASSIGN(PolicyResult milp, SolveMilp(model, options));
  EXPECT_TRUE(milp.optimal) << milp.reason;
  EXPECT_DOUBLE_EQ(milp.solution.objective, 26000.0);
  EXPECT_THAT(milp.reason, ::testing::HasSubstr("decomposition"));
}

// Pool prices from the flow: one pool of 3 nodes, job a makes 10 samples/s
// per node (up to 3), job b 5 (up to 3); window 100 s, no pauses, nobody
// running. Both up: b must get its smallest count (1), a the other 2, worth
// (20 + 5) x 100 = 2,500; one more node would go to a: 1,000 (its third).
TEST(DecompositionTest, FlowRoundPricesThePools) {
  Problem p;
  p.forward_window = absl::Seconds(100);
  p.resize_cost = ResizeCostModel::kLostWork;
  p.nodes = {Node{"n0"}, Node{"n1"}, Node{"n2"}};
  for (auto [id, rate] : {std::make_pair("a", 10.0), std::make_pair("b", 5.0)}) {
    JobSpec job;
    job.id = id;
    job.min_nodes = 1;
    job.max_nodes = 3;
    job.throughput = {{1, rate}, {3, 3 * rate}};
    job.resize_up_pause = absl::ZeroDuration();
    job.resize_down_pause = absl::ZeroDuration();
    p.jobs.push_back(job);
  }
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
  ASSERT_EQ(model.pools.size(), 1u);
  JobPricer pricer(model);
  std::vector<Mode> modes = {{0, Direction::kUp}, {0, Direction::kUp}};
  std::vector<double> prices;
  std::optional<CountSolution> s = FlowRound(model, pricer, modes, &prices);
  ASSERT_TRUE(s.has_value());
  EXPECT_DOUBLE_EQ(s->objective, 2500.0);
  EXPECT_EQ(model.jobs[0].options[s->option[0]].nodes, 2);
  EXPECT_EQ(model.jobs[1].options[s->option[1]].nodes, 1);
  ASSERT_EQ(prices.size(), 1u);
  EXPECT_NEAR(prices[0], 1000.0, 1e-9);
  // Only a, up: it takes all 3 nodes, its largest option (the model has no
  // option beyond the nodes there are), so no job could use one more: 0.
  modes[1] = {};
  s = FlowRound(model, pricer, modes, &prices);
  ASSERT_TRUE(s.has_value());
  EXPECT_DOUBLE_EQ(s->objective, 3000.0);
  EXPECT_EQ(prices[0], 0.0);
  // Only b, at 1 node: nodes are left over, they are worth nothing.
  modes = {{}, {0, Direction::kUp}};
  s = FlowRound(model, pricer, modes, &prices);
  ASSERT_TRUE(s.has_value());
  EXPECT_DOUBLE_EQ(s->objective, 1500.0);
  EXPECT_EQ(prices[0], 0.0);
}

// ImproveModes on a hand-checked instance: one job on 2 of 4 nodes, 10
// samples/s per node, a 10 s pause to grow, window 100 s (lost work).
// Staying is worth 20 x 100 = 2,000; growing to 4 is worth 40 x 90 =
// 3,600, the best. From the stay the search switches to "up" and the flow
// gives it all 4 nodes. With the up mode's bound at 2,000 (not above the
// start) it is not tried.
TEST(DecompositionTest, ImproveModesSwitchesAndRespectsBounds) {
  Problem p;
  p.forward_window = absl::Seconds(100);
  p.resize_cost = ResizeCostModel::kLostWork;
  p.nodes = {Node{"n0"}, Node{"n1"}, Node{"n2"}, Node{"n3"}};
  JobSpec job;
  job.id = "j";
  job.min_nodes = 1;
  job.max_nodes = 4;
  job.throughput = {{1, 10.0}, {4, 40.0}};
  job.resize_up_pause = absl::Seconds(10);
  job.resize_down_pause = absl::Seconds(5);
  job.current_nodes = {"n0", "n1"};
  p.jobs = {job};
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
  JobPricer pricer(model);
  const CountSolution start = CurrentSolution(model);
  ASSERT_DOUBLE_EQ(start.objective, 2000.0);
  int flows = 0;
  CountSolution better = ImproveModes(model, pricer, start, {}, {}, absl::InfiniteFuture(), &flows);
  EXPECT_DOUBLE_EQ(better.objective, 3600.0);
  EXPECT_EQ(model.jobs[0].options[better.option[0]].nodes, 4);
  EXPECT_THAT(CheckSolution(model, better), IsOk());
  EXPECT_GE(flows, 1);
  // The same search with the up mode bounded at the start's value.
  std::vector<std::vector<ModeCandidate>> candidates = {{{{0, Direction::kUp}, 2000.0}}};
  flows = 0;
  CountSolution kept =
      ImproveModes(model, pricer, start, candidates, {}, absl::InfiniteFuture(), &flows);
  EXPECT_DOUBLE_EQ(kept.objective, 2000.0);
  EXPECT_EQ(flows, 0);
  // Bounded above the start, it is tried.
  candidates[0][0].bound = 3600.0;
  CountSolution tried = ImproveModes(model, pricer, start, candidates, {}, absl::InfiniteFuture());
  EXPECT_DOUBLE_EQ(tried.objective, 3600.0);
  // A deadline already past: the start.
  CountSolution late = ImproveModes(model, pricer, start, {}, {}, absl::Now() - absl::Seconds(1));
  EXPECT_DOUBLE_EQ(late.objective, 2000.0);
}

// On random eight-pool instances, from the current allocation: never worse
// than the start, always a valid allocation, never above the exhaustive
// optimum; and it reaches the optimum on some of them (it is a local
// search, not exact).
TEST(DecompositionTest, ImproveModesNeverWorseAndValid) {
  std::mt19937 rng(2705);
  int gained = 0, optimal = 0;
  for (int i = 0; i < 40; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(EightPools(rng, i % 2 == 0)));
    const Exhaustive opt = Search(model);
    JobPricer pricer(model);
    const CountSolution start = CurrentSolution(model);
    CountSolution s = ImproveModes(model, pricer, start, {}, {}, absl::InfiniteFuture());
    EXPECT_THAT(CheckSolution(model, s), IsOk()) << "instance " << i;
    EXPECT_GE(s.objective, start.objective - 1e-9 * std::max(1.0, std::fabs(start.objective)))
        << "instance " << i;
    EXPECT_LE(s.objective, opt.best + 1e-9 * std::max(1.0, std::fabs(opt.best)))
        << "instance " << i;
    gained += s.objective > start.objective + 1e-9 * std::max(1.0, std::fabs(start.objective));
    optimal += Rel(s.objective, opt.best) <= 1e-9;
  }
  EXPECT_GT(gained, 0);
  EXPECT_GT(optimal, 0);
}

// The search with and without the local search: the same proven optima.
TEST(DecompositionTest, LocalSearchKeepsTheOptimum) {
  std::mt19937 rng(2706);
  for (int i = 0; i < 30; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(EightPools(rng, i % 2 == 1)));
    const Exhaustive opt = Search(model);
    for (bool ls : {false, true}) {
      DecompositionSettings settings;
      settings.relative_gap = 1e-9;
      settings.local_search = ls;
      ASSERT_OK_AND_ASSIGN(DecompositionResult r,
                           SolveByDecomposition(model, CurrentSolution(model), settings));
      EXPECT_TRUE(r.proven) << "instance " << i << " ls " << ls << ": " << r.detail;
      EXPECT_LE(Rel(r.solution.objective, opt.best), 1e-9)
          << "instance " << i << " ls " << ls << ": " << r.solution.objective << " vs " << opt.best;
      EXPECT_THAT(CheckSolution(model, r.solution), IsOk());
    }
  }
}

// The fixing at branch nodes (by each node's own bound, for its subtree)
// and the master's rebuild without the columns the fixing took out change
// which columns the LPs see, never the proven optimum: against the
// exhaustive search, on instances where both happen (the detail says how
// often), with a gap of 1e-9 so that the search branches. (Jobs leaving
// the master: milp_test, DecompositionMatchesDpWhileTheMasterShrinks.)
TEST(DecompositionTest, NodeFixingAndRebuildsKeepTheOptimum) {
  std::mt19937 rng(2708);
  int fixed = 0, rebuilt = 0;
  for (int i = 0; i < 60; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(EightPools(rng, i % 3 == 0)));
    const Exhaustive opt = Search(model);
    DecompositionSettings settings;
    settings.relative_gap = 1e-9;
    ASSERT_OK_AND_ASSIGN(DecompositionResult r,
                         SolveByDecomposition(model, CurrentSolution(model), settings));
    EXPECT_TRUE(r.proven) << "instance " << i << ": " << r.detail;
    EXPECT_LE(Rel(r.solution.objective, opt.best), 1e-9)
        << "instance " << i << ": " << r.solution.objective << " vs " << opt.best << "; "
        << r.detail;
    EXPECT_GE(r.bound, opt.best - 1e-9 * std::max(1.0, std::fabs(opt.best))) << "instance " << i;
    EXPECT_THAT(CheckSolution(model, r.solution), IsOk());
    fixed += r.detail.find(" 0 options fixed at nodes") == std::string::npos;
    rebuilt += r.detail.find("(0 rebuilds") == std::string::npos;
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(fixed, 0);
  EXPECT_GT(rebuilt, 0);
}

// An exact solve (gap 1e-9) without the local search, which would find most
// optima at the root: the search has to branch, which is what twins change.
absl::StatusOr<DecompositionResult> SolveExactly(const CountModel& model, bool twins) {
  DecompositionSettings settings;
  settings.relative_gap = 1e-9;
  settings.twins = twins;
  settings.local_search = false;
  // Without cuts: a MIR cut on the pool (at most 3 of the six 2-node jobs
  // on 7 nodes) proves TwinsPickHowManyNotWhich's instance at the root,
  // and what is measured here is the branching.
  settings.cut_rounds = 0;
  return SolveByDecomposition(model, CurrentSolution(model), settings);
}

// Jobs the model cannot tell apart are searched in one order only: a branch
// on one twin's count bounds the others'. Three identical jobs (waiting, or
// two of them holding a node each in one pool) and one other on eight
// pools: with and without, proven and equal to the exhaustive search, and
// decisions were implied for twins. (How much less it searches:
// TwinsPickHowManyNotWhich.)
TEST(DecompositionTest, TwinsKeepTheOptimum) {
  std::mt19937 rng(2709);
  int implied = 0;
  for (int i = 0; i < 12; ++i) {
    Problem p = EightPools(rng, i % 2 == 1);
    p.jobs.resize(std::min<size_t>(p.jobs.size(), 2));
    p.jobs[0].current_nodes.clear();
    for (const char* id : {"twin1", "twin2"}) {
      JobSpec twin = p.jobs[0];
      twin.id = id;
      p.jobs.push_back(twin);
    }
    // Every other instance, two of the three run, on one node each of the
    // same pool (twins that stay or move; the third waits alone).
    std::string held;
    for (const Node& n : p.nodes) {
      if (absl::EndsWith(n.id, "-l1")) held = n.id.substr(0, n.id.size() - 1);
    }
    if (i % 2 == 0 && !held.empty()) {
      for (JobSpec& job : p.jobs) job.current_nodes.clear();
      p.jobs[0].current_nodes = {held + "0"};
      p.jobs[2].current_nodes = {held + "1"};
    }
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
    const Exhaustive opt = Search(model);
    for (bool twins : {false, true}) {
      ASSERT_OK_AND_ASSIGN(DecompositionResult r, SolveExactly(model, twins));
      EXPECT_TRUE(r.proven) << "instance " << i << " twins " << twins << ": " << r.detail;
      EXPECT_LE(Rel(r.solution.objective, opt.best), 1e-9)
          << "instance " << i << " twins " << twins << ": " << r.solution.objective << " vs "
          << opt.best << "; " << r.detail;
      EXPECT_GE(r.bound, opt.best - 1e-9 * std::max(1.0, std::fabs(opt.best)));
      EXPECT_THAT(CheckSolution(model, r.solution), IsOk());
      if (twins) {
        EXPECT_THAT(r.detail, ::testing::HasSubstr("1 groups of twins")) << "instance " << i;
        implied += r.detail.find(", 0 decisions implied for twins") == std::string::npos;
      } else {
        EXPECT_THAT(r.detail, ::testing::HasSubstr("0 groups of twins")) << "instance " << i;
      }
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(implied, 0);
}

// The case twins are for: six identical jobs that run on exactly two nodes,
// one pool of seven. The LP runs three and a half of them; without twins
// the search must rule out every way of picking which three run, with them
// only how many.
TEST(DecompositionTest, TwinsPickHowManyNotWhich) {
  Problem p;
  p.forward_window = absl::Seconds(100);
  p.classes = {NodeClass{"c", "rack", 1.0}};
  for (int k = 0; k < 7; ++k) p.nodes.push_back(Node{absl::StrCat("n", k), "c"});
  for (int j = 0; j < 6; ++j) {
    JobSpec job;
    job.id = absl::StrCat("j", j);
    job.min_nodes = 2;
    job.max_nodes = 2;
    job.throughput = {{2, 30.0}};
    p.jobs.push_back(job);
  }
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
  const Exhaustive opt = Search(model);
  EXPECT_NEAR(opt.best, 9000.0, 1e-6);  // three run: 3 x 30 samples/s x 100 s
  long long nodes[2] = {0, 0};
  for (bool twins : {false, true}) {
    ASSERT_OK_AND_ASSIGN(DecompositionResult r, SolveExactly(model, twins));
    EXPECT_TRUE(r.proven) << r.detail;
    EXPECT_LE(Rel(r.solution.objective, opt.best), 1e-9) << r.detail;
    int running = 0;
    for (const auto& per_pool : r.solution.per_pool) running += per_pool[0] > 0;
    EXPECT_EQ(running, 3) << r.detail;
    nodes[twins] = r.branch_nodes;
  }
  EXPECT_LT(2 * nodes[1], nodes[0]);
}

// Every (option, split) job j may take, the stop option (no nodes) first.
std::vector<std::pair<int, std::vector<int>>> JobChoices(const CountModel& model, int j) {
  const JobModel& job = model.jobs[j];
  std::vector<std::pair<int, std::vector<int>>> out = {
      {0, std::vector<int>(model.pools.size(), 0)}};
  for (int o = 1; o < static_cast<int>(job.options.size()); ++o) {
    ForEachSplit(model, job, o, [&](const std::vector<int>& x) { out.emplace_back(o, x); });
  }
  return out;
}

// Calls visit(choice index per job) for every allocation: one choice per
// job, the splits within the pools' capacities together.
void ForEachAllocation(const CountModel& model,
                       const std::vector<std::vector<std::pair<int, std::vector<int>>>>& choices,
                       const std::function<void(const std::vector<int>&)>& visit) {
  const int num_jobs = static_cast<int>(model.jobs.size());
  std::vector<int> left(model.pools.size()), pick(num_jobs, 0);
  for (size_t p = 0; p < left.size(); ++p) left[p] = model.pools[p].capacity;
  std::function<void(int)> rec = [&](int j) {
    if (j == num_jobs) {
      visit(pick);
      return;
    }
    for (size_t c = 0; c < choices[j].size(); ++c) {
      const std::vector<int>& x = choices[j][c].second;
      bool fits = true;
      for (size_t p = 0; p < x.size(); ++p) fits = fits && x[p] <= left[p];
      if (!fits) continue;
      for (size_t p = 0; p < x.size(); ++p) left[p] -= x[p];
      pick[j] = static_cast<int>(c);
      rec(j + 1);
      for (size_t p = 0; p < x.size(); ++p) left[p] += x[p];
    }
  };
  rec(0);
}

// A MIR cut on a random pool set (every pool in a third of the draws) over
// random jobs and patterns, with a random divisor (nullopt when the room is
// a multiple of it). Jobs exact in the set (ExactIn) are mostly counted,
// others sometimes, with a random shift of either sign. `counted_jobs`
// (optional) counts the counted jobs, `exact_jobs` those exact in S.
std::optional<PoolCut> RandomCut(std::mt19937& rng, const CountModel& model,
                                 int* counted_jobs = nullptr, int* exact_jobs = nullptr) {
  const int num_pools = static_cast<int>(model.pools.size());
  std::vector<char> in_set(num_pools, 0);
  in_set[rng() % num_pools] = 1;
  const bool all = rng() % 3 == 0;
  for (char& in : in_set) in = all || in || rng() % 2 == 0;
  std::vector<PoolCut::Member> members;
  std::vector<PoolCut::Counted> counted;
  for (int j = 0; j < static_cast<int>(model.jobs.size()); ++j) {
    const bool exact = ExactIn(model, j, in_set);
    if (rng() % 4 < (exact ? 3u : 1u)) {
      counted.push_back({j, static_cast<int>(rng() % 9) - 4});
      if (counted_jobs != nullptr) ++*counted_jobs;
      if (exact_jobs != nullptr) *exact_jobs += exact;
      continue;
    }
    if (rng() % 3 == 0) continue;
    PoolCut::Member m{j, std::vector<char>(model.jobs[j].patterns.size(), 0), 0.0};
    for (char& k : m.patterns) k = rng() % 3 != 0;
    members.push_back(std::move(m));
  }
  static constexpr double kDivisors[] = {0.7, 1.5, 2.0, 2.5, 3.0, 4.0, 5.5};
  return MirCut(model, in_set, std::move(members), kDivisors[rng() % 7], std::move(counted));
}

// The MIR cuts on pool sets (PoolCut) hold for every allocation: random
// sets, jobs, patterns and divisors against every allocation of small
// eight-pool instances; many of them are tight on some allocation.
TEST(DecompositionTest, PoolCutsHoldForEveryAllocation) {
  std::mt19937 rng(2711);
  long long allocations = 0;
  int cuts = 0, tight = 0, counted_jobs = 0, exact_jobs = 0;
  for (int i = 0; i < 40; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(EightPools(rng, i % 2 == 0)));
    // Three jobs on eight pools can have ~10^6 allocations: two here.
    model.jobs.resize(std::min<size_t>(model.jobs.size(), 2));
    std::vector<PoolCut> drawn;
    for (int k = 0; k < 25; ++k) {
      if (std::optional<PoolCut> cut = RandomCut(rng, model, &counted_jobs, &exact_jobs)) {
        drawn.push_back(*std::move(cut));
      }
    }
    std::vector<std::vector<std::pair<int, std::vector<int>>>> choices;
    for (int j = 0; j < static_cast<int>(model.jobs.size()); ++j) {
      choices.push_back(JobChoices(model, j));
    }
    std::vector<double> most(drawn.size(), -kInf);
    ForEachAllocation(model, choices, [&](const std::vector<int>& pick) {
      ++allocations;
      for (size_t c = 0; c < drawn.size(); ++c) {
        double lhs = 0;
        for (size_t j = 0; j < pick.size(); ++j) {
          const auto& [o, x] = choices[j][pick[j]];
          lhs += drawn[c].Coefficient(model, static_cast<int>(j), o, x);
        }
        most[c] = std::max(most[c], lhs);
      }
    });
    for (size_t c = 0; c < drawn.size(); ++c) {
      EXPECT_LE(most[c], drawn[c].rhs + 1e-9)
          << "instance " << i << " cut " << c << " (delta " << drawn[c].delta << ", kappa "
          << drawn[c].kappa << ")";
      tight += most[c] > drawn[c].rhs - 1e-9;
      ++cuts;
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(cuts, 500);
  EXPECT_GT(tight, cuts / 10) << "the cuts should touch the allocations, not float above them";
  EXPECT_GT(allocations, 10000);
  EXPECT_GT(exact_jobs, 200);
  EXPECT_GT(counted_jobs - exact_jobs, 200);
}

// With cut terms (random cuts, random duals) the pricer still charges each
// option its cheapest split: value - pi . x - sum_c mu_c coefficient_c(x),
// against every split; Split returns one that costs that.
TEST(DecompositionTest, ScoresWithCutTermsChargeTheCheapestSplit) {
  std::mt19937 rng(2712);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int checked = 0, with_terms = 0, with_net = 0;
  for (int i = 0; i < 30; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(EightPools(rng, false)));
    JobPricer pricer(model);
    const double magnitude = LargestValue(model) / 4;
    const std::vector<double> pi = RandomPrices(rng, model, magnitude);
    std::vector<PoolCut> cuts;
    std::vector<double> mu;
    for (int k = 0; k < 4; ++k) {
      if (std::optional<PoolCut> cut = RandomCut(rng, model)) {
        cuts.push_back(*std::move(cut));
        mu.push_back(rng() % 4 == 0 ? 0.0 : magnitude * u(rng));
      }
    }
    std::vector<double> score;
    std::vector<JobCutTerms> all_terms;
    CutTerms(model, cuts, mu, all_terms);
    for (int j = 0; j < static_cast<int>(model.jobs.size()); ++j) {
      const JobCutTerms& terms = all_terms[j];
      with_terms += !terms.add.empty();
      with_net += !terms.net.empty();
      auto cost = [&](int o, const std::vector<int>& x) {
        double v = 0;
        for (size_t p = 0; p < x.size(); ++p) v += pi[p] * x[p];
        for (size_t c = 0; c < cuts.size(); ++c) v += mu[c] * cuts[c].Coefficient(model, j, o, x);
        return v;
      };
      const JobModel& job = model.jobs[j];
      pricer.Scores(j, pi, PoolsByPrice(pi), score, &terms);
      const std::vector<int> none(model.pools.size(), 0);
      EXPECT_NEAR(score[0], job.options[0].value - cost(0, none), 1e-9 * magnitude);
      EXPECT_NEAR(pricer.StopScore(j, &terms), score[0], 1e-9 * magnitude);
      for (int o = 1; o < static_cast<int>(job.options.size()); ++o) {
        double cheapest = kInf;
        ForEachSplit(model, job, o,
                     [&](const std::vector<int>& x) { cheapest = std::min(cheapest, cost(o, x)); });
        EXPECT_NEAR(score[o], job.options[o].value - cheapest,
                    1e-9 * std::max(magnitude, std::fabs(cheapest)))
            << "instance " << i << " job " << j << " option " << o;
        const std::vector<int> x = pricer.Split(j, o, pi, PoolsByPrice(pi), &terms);
        EXPECT_NEAR(cost(o, x), cheapest, 1e-9 * std::max(magnitude, std::fabs(cheapest)))
            << "instance " << i << " job " << j << " option " << o;
        EXPECT_TRUE(JobVectorValue(job, x).has_value());
        ++checked;
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
  EXPECT_GT(checked, 500);
  EXPECT_GT(with_terms, 20);
  EXPECT_GT(with_net, 20);
}

// A hand-checked MIR cut: one pool of 6 nodes; job 3 holds one (and may
// stay or stop), jobs 0-2 wait and may start on 1 or 2. Room b = 5. The LP
// point starts jobs 0 and 1 on 2 nodes and half of job 2 on 2. Divisor 2
// (job 2's step): b / 2 = 2.5, f = 0.5, kappa = 1; a start on 2 nodes has
// F(2 / 2) = 1, one on 1 node F(1 / 2) = 0, and the cut reads
// (jobs starting on 2) - (nodes released) <= 2; at the point 1 + 1 + 0.5 =
// 2.5: violated by 0.5.
// A job of a one-pool model holding `held` nodes, with the options of
// `counts` (and stopping), each worth 1000 per node.
JobModel OnePoolJob(int held, const std::vector<int>& counts) {
  JobModel job;
  job.min_nodes = counts.front();
  job.max_nodes = counts.back();
  job.current_per_pool = {held};
  job.current_nodes = held;
  Pattern pattern;
  pattern.horizon_s = 100;
  pattern.pools = {0};
  job.patterns = {pattern};
  job.options.push_back(Option{});
  for (int n : counts) {
    job.options.push_back(Option{n, 0, 0, 10.0 * n, 1000.0 * n});
    if (n == held) job.current_option = static_cast<int>(job.options.size()) - 1;
  }
  return job;
}

CountModel OnePool(int capacity, std::vector<JobModel> jobs) {
  CountModel model;
  model.pools.resize(1);
  model.pools[0].capacity = capacity;
  model.total_nodes = capacity;
  model.jobs = std::move(jobs);
  return model;
}

TEST(DecompositionTest, HandCheckedMirCut) {
  const CountModel model = OnePool(
      6, {OnePoolJob(0, {1, 2}), OnePoolJob(0, {1, 2}), OnePoolJob(0, {1, 2}), OnePoolJob(1, {1})});
  LpPoint point;
  point.grow = {{1.0}, {1.0}, {0.5}, {0.0}};
  point.add = {{{2.0}}, {{2.0}}, {{1.0}}, {{0.0}}};
  point.freed = {{0.0}, {0.0}, {0.0}, {0.0}};
  point.steps = {{{0, 2, 1.0}}, {{0, 2, 1.0}}, {{0, 2, 0.5}}, {}};
  point.uses = {{{2, 0, 1.0}}, {{2, 0, 1.0}}, {{2, 0, 0.5}, {0, -1, 0.5}}, {{1, 0, 1.0}}};
  const std::vector<PoolCut> cuts = SeparatePoolCuts(model, point, 1e-3);
  ASSERT_EQ(cuts.size(), 1u);
  const PoolCut& cut = cuts[0];
  EXPECT_DOUBLE_EQ(cut.delta, 2.0);
  EXPECT_DOUBLE_EQ(cut.fraction, 0.5);
  EXPECT_DOUBLE_EQ(cut.kappa, 1.0);
  EXPECT_DOUBLE_EQ(cut.rhs, 2.0);
  EXPECT_TRUE(cut.members.empty());  // every pattern lies inside S: exact terms
  ASSERT_EQ(cut.counted.size(), 4u);  // ... and every job's count sets its term
  for (const PoolCut::Counted& e : cut.counted) EXPECT_EQ(e.shift, 0);
  // Starting on 2 nodes: F(1) = 1; on 1 node: F(0.5) = 0; job 3 stopping
  // frees 1.
  EXPECT_DOUBLE_EQ(cut.Coefficient(model, 0, 2, {2}), 1.0);
  EXPECT_DOUBLE_EQ(cut.Coefficient(model, 0, 1, {1}), 0.0);
  EXPECT_DOUBLE_EQ(cut.Coefficient(model, 0, 0, {0}), 0.0);
  EXPECT_DOUBLE_EQ(cut.Coefficient(model, 3, 0, {0}), -1.0);
  EXPECT_DOUBLE_EQ(cut.Coefficient(model, 3, 1, {1}), 0.0);
  // Tight on both best fills: three start on 2 with job 3 stopped (1 + 1 +
  // 1 - 1), or two on 2 and one on 1 with job 3 staying (1 + 1 + 0 + 0).
  EXPECT_DOUBLE_EQ(3 * cut.Coefficient(model, 0, 2, {2}) + cut.Coefficient(model, 3, 0, {0}),
                   cut.rhs);
  // Below the violation threshold: none.
  EXPECT_TRUE(SeparatePoolCuts(model, point, 0.6).empty());
}

// A hand-checked cut on a full pool, where the room b = 0 gives no MIR cut
// unless a shrinking job is complemented (PoolCut::counted). One pool of 4
// nodes, all held by job 0 (it may stay on 4, shrink to 2, or stop); job 1
// waits and may start on 4 only. The LP point shrinks job 0 to 2 with
// weight 0.6 (frees 1.2) and starts job 1 with weight 0.3 (adds 1.2): the
// row "added - released <= 0" holds, but no allocation starts job 1 unless
// job 0 stops. Job 0's heaviest column releases 2: shifted by 2, b = 2;
// divisor 4 (job 1's step): b / 4 = 0.5, f = 0.5, rhs 0; job 1 starting:
// F(4 / 4) = 1; job 0 on 2: F(0) = 0, on 4: F(2 / 4) = 0, stopping:
// F(-2 / 4) = -1. The cut reads "job 1 starts only if job 0 stops"; at the
// point 0.3 > 0.
TEST(DecompositionTest, HandCheckedCutOnAFullPoolComplementsTheShrinkingJob) {
  const CountModel model = OnePool(4, {OnePoolJob(4, {2, 4}), OnePoolJob(0, {4})});
  LpPoint point;
  point.grow = {{0.0}, {0.3}};
  point.add = {{{0.0}}, {{1.2}}};
  point.freed = {{1.2}, {0.0}};
  point.steps = {{}, {{0, 4, 0.3}}};
  point.uses = {{{2, 0, 0.6}, {4, 0, 0.4}}, {{4, 0, 0.3}, {0, -1, 0.7}}};
  const std::vector<PoolCut> cuts = SeparatePoolCuts(model, point, 1e-3);
  ASSERT_EQ(cuts.size(), 1u);
  const PoolCut& cut = cuts[0];
  EXPECT_DOUBLE_EQ(cut.delta, 4.0);
  EXPECT_DOUBLE_EQ(cut.fraction, 0.5);
  EXPECT_DOUBLE_EQ(cut.rhs, 0.0);
  ASSERT_EQ(cut.counted.size(), 2u);
  EXPECT_EQ(cut.counted[0].shift, 2);
  EXPECT_EQ(cut.counted[1].shift, 0);
  EXPECT_DOUBLE_EQ(cut.Coefficient(model, 1, 1, {4}), 1.0);
  EXPECT_DOUBLE_EQ(cut.Coefficient(model, 1, 0, {0}), 0.0);
  EXPECT_DOUBLE_EQ(cut.Coefficient(model, 0, 1, {2}), 0.0);
  EXPECT_DOUBLE_EQ(cut.Coefficient(model, 0, 2, {4}), 0.0);
  EXPECT_DOUBLE_EQ(cut.Coefficient(model, 0, 0, {0}), -1.0);
  EXPECT_DOUBLE_EQ(cut.Coefficient(model, 0, -1, {0}), -1.0);  // the artificial column
  // Its share of the pricing at dual 5: 5 F((count - current + shift) / 4)
  // off every option of either job, the stop option too.
  JobPricer pricer(model);
  const std::vector<double> pi = {0.0};
  std::vector<JobCutTerms> all_terms;
  CutTerms(model, {cut}, {5.0}, all_terms);
  for (int j = 0; j < 2; ++j) {
    const JobCutTerms& terms = all_terms[j];
    ASSERT_EQ(terms.net.size(), 1u);
    EXPECT_TRUE(terms.keep.empty() && terms.add.empty() && terms.inside.empty());
    std::vector<double> score;
    pricer.Scores(j, pi, PoolsByPrice(pi), score, &terms);
    for (int o = 0; o < static_cast<int>(model.jobs[j].options.size()); ++o) {
      const int n = model.jobs[j].options[o].nodes;
      EXPECT_DOUBLE_EQ(score[o],
                       model.jobs[j].options[o].value - 5.0 * cut.Coefficient(model, j, o, {n}));
    }
  }
}

// Cuts at the root change the bound the search starts from, never the
// proven optimum: against the exhaustive search, with and without cuts, a
// gap of 1e-9 and no local search (so that the root is often fractional
// and cuts are separated).
TEST(DecompositionTest, CutsKeepTheOptimum) {
  std::mt19937 rng(2713);
  int with_cuts = 0;
  for (int i = 0; i < 60; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(EightPools(rng, i % 3 == 0)));
    const Exhaustive opt = Search(model);
    for (int rounds : {0, 40}) {
      DecompositionSettings settings;
      settings.relative_gap = 1e-9;
      settings.local_search = false;
      settings.cut_rounds = rounds;
      ASSERT_OK_AND_ASSIGN(DecompositionResult r,
                           SolveByDecomposition(model, CurrentSolution(model), settings));
      EXPECT_TRUE(r.proven) << "instance " << i << " rounds " << rounds << ": " << r.detail;
      EXPECT_LE(Rel(r.solution.objective, opt.best), 1e-9)
          << "instance " << i << " rounds " << rounds << ": " << r.solution.objective << " vs "
          << opt.best << "; " << r.detail;
      EXPECT_GE(r.bound, opt.best - 1e-9 * std::max(1.0, std::fabs(opt.best)))
          << "instance " << i << " rounds " << rounds << ": " << r.detail;
      EXPECT_THAT(CheckSolution(model, r.solution), IsOk());
      if (rounds > 0) with_cuts += !absl::StrContains(r.detail, "; 0 cuts in 0 rounds");
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(with_cuts, 5);
}

// Never worse than the start, and the bound is never below the answer, on
// random instances with a deadline already past.
TEST(DecompositionTest, PastDeadlineReturnsTheStart) {
  std::mt19937 rng(2704);
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(EightPools(rng, false)));
    const CountSolution start = CurrentSolution(model);
    DecompositionSettings settings;
    settings.deadline = absl::Now() - absl::Seconds(1);
    ASSERT_OK_AND_ASSIGN(DecompositionResult r, SolveByDecomposition(model, start, settings));
    EXPECT_GE(r.solution.objective, start.objective - 1e-9 * std::max(1.0, std::fabs(start.objective)));
    EXPECT_GE(r.bound, r.solution.objective);
    EXPECT_TRUE(std::isfinite(r.bound)) << "no LP solved: the bound at zero prices";
    EXPECT_FALSE(r.proven);
    EXPECT_THAT(CheckSolution(model, r.solution), IsOk());
  }
}

}  // namespace
}  // namespace malle::alloc::internal
