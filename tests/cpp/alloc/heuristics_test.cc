#include "libmalle/alloc/heuristics.h"

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/alloc/dp.h"
#include "tests/cpp/alloc/oracles.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::alloc {
namespace {

using ::malle::testing::IsOk;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

JobSpec Job(const std::string& id, int min, int max, Curve curve) {
  JobSpec j;
  j.id = id;
  j.min_nodes = min;
  j.max_nodes = max;
  j.throughput = std::move(curve);
  return j;
}

Problem Nodes(int n) {
  Problem p;
  p.forward_window = absl::Seconds(10);
  for (int i = 0; i < n; ++i) p.nodes.push_back(Node{absl::StrCat("n", i)});
  return p;
}

std::vector<int> Counts(const CountModel& m, const CountSolution& s) {
  std::vector<int> n;
  for (size_t j = 0; j < m.jobs.size(); ++j) n.push_back(m.jobs[j].options[s.option[j]].nodes);
  return n;
}

TEST(GreedyTest, FollowsMarginalGain) {
  Problem p = Nodes(4);
  p.jobs = {Job("a", 1, 4, {{1, 10}, {4, 40}}), Job("b", 1, 4, {{1, 15}, {2, 16}, {4, 17}})};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveGreedy(m));
  EXPECT_THAT(Counts(m, r.solution), ElementsAre(3, 1));
  EXPECT_THAT(CheckSolution(m, r.solution), IsOk());
  EXPECT_THAT(r.reason, HasSubstr("greedy: 2 of 2 jobs running on 4 of 4 nodes"));
}

TEST(GreedyTest, IsNotOptimalOnNonConcaveCurves) {
  Problem p = Nodes(4);
  // a pays off only at 4 nodes; greedy's one-node-at-a-time view misses it.
  p.jobs = {Job("a", 1, 4, {{1, 1}, {3, 3}, {4, 100}}), Job("b", 1, 4, {{1, 20}, {4, 35}})};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult greedy, SolveGreedy(m));
  ASSERT_OK_AND_ASSIGN(PolicyResult dp, SolveDp(m));
  EXPECT_THAT(Counts(m, dp.solution), ElementsAre(4, 0));
  EXPECT_LT(greedy.solution.objective, dp.solution.objective);
}

// Greedy's rule, as a scan: every round, the job whose next step (its
// smallest runnable size when stopped, else the next count it has an option
// for) gains most per node and still fits, the lowest index among equals;
// steps that gain nothing are not taken.
std::vector<int> ScanGreedy(const CountModel& m) {
  const int num_jobs = static_cast<int>(m.jobs.size());
  std::vector<std::vector<std::optional<double>>> value(num_jobs);
  for (int j = 0; j < num_jobs; ++j) {
    value[j].resize(m.jobs[j].max_nodes + 1);
    for (const Option& o : m.jobs[j].options) {
      if (!value[j][o.nodes] || o.value > *value[j][o.nodes]) value[j][o.nodes] = o.value;
    }
  }
  std::vector<int> totals(num_jobs, 0);
  int remaining = m.total_nodes;
  while (remaining > 0) {
    int best = -1, best_step = 0;
    double best_gain = 0;
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = m.jobs[j];
      int target = totals[j] == 0 ? job.min_nodes : totals[j] + 1;
      while (target <= job.max_nodes && !value[j][target]) ++target;
      if (target > job.max_nodes || target - totals[j] > remaining) continue;
      const double gain =
          (*value[j][target] - value[j][totals[j]].value_or(0.0)) / (target - totals[j]);
      if (gain > best_gain) {
        best_gain = gain;
        best = j;
        best_step = target - totals[j];
      }
    }
    if (best < 0) break;
    totals[best] += best_step;
    remaining -= best_step;
  }
  return totals;
}

// SolveGreedy keeps every job's next step in a heap instead of scanning the
// jobs for each node. Random pools (some jobs twice, so that gains tie; some
// flat, so that a step gains nothing; some minimums larger than what is left
// at the end) must give the scan's counts.
TEST(GreedyTest, HeapTakesTheScansSteps) {
  std::mt19937 rng(1128);
  int ties = 0, flat = 0;
  for (int rep = 0; rep < 400; ++rep) {
    Problem p = Nodes(1 + static_cast<int>(rng() % 40));
    const int num_jobs = 1 + static_cast<int>(rng() % 8);
    for (int j = 0; j < num_jobs; ++j) {
      if (j > 0 && rng() % 4 == 0) {  // a twin of the previous job: equal gains
        p.jobs.push_back(p.jobs.back());
        p.jobs.back().id = absl::StrCat("j", j);
        ++ties;
        continue;
      }
      if (rng() % 5 == 0) {  // flat above its minimum: more nodes gain exactly 0
        p.jobs.push_back(Job(absl::StrCat("j", j), 1, 4, {{1, 7}, {4, 7}}));
        ++flat;
        continue;
      }
      const int min = 1 + static_cast<int>(rng() % 5);
      const int max = min + static_cast<int>(rng() % 8);
      p.jobs.push_back(Job(absl::StrCat("j", j), min, max,
                           testing::CurveThrough(rng, testing::RandomBreakpoints(rng, min, max),
                                                 5.0 + rng() % 10, rng() % 2 == 0)));
    }
    ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
    ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveGreedy(m));
    EXPECT_EQ(Counts(m, r.solution), ScanGreedy(m)) << "rep " << rep;
    EXPECT_THAT(CheckSolution(m, r.solution), IsOk()) << "rep " << rep;
  }
  EXPECT_GT(ties, 50);
  EXPECT_GT(flat, 50);
}

TEST(EqualShareTest, AdmitsInOrderThenDealsRoundRobin) {
  Problem p = Nodes(7);
  const Curve c = {{1, 1}, {8, 8}};
  p.jobs = {Job("a", 1, 4, c), Job("huge", 7, 8, c), Job("b", 2, 3, c), Job("c", 1, 8, c)};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveEqualShare(m));
  // a=1, huge does not fit after a, b=2, c=1 -> 3 left: a, b, c get one each.
  EXPECT_THAT(Counts(m, r.solution), ElementsAre(2, 0, 3, 2));
}

TEST(StaticTest, RigidJobsKeepTheirSizeOrStop) {
  Problem p = Nodes(6);
  const Curve c = {{1, 1}, {4, 4}};
  JobSpec running = Job("running", 1, 2, c);
  running.current_nodes = {"n0", "n1"};
  JobSpec damaged = Job("damaged", 1, 3, c);
  damaged.current_nodes = {"n2", "n3"};  // lost one of its 3 nodes
  JobSpec waiting = Job("waiting", 1, 4, c);
  JobSpec fits = Job("fits", 1, 3, c);
  p.jobs = {running, damaged, waiting, fits};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveStatic(m));
  // 4 free after "running" keeps 2: damaged (3) starts again first, then
  // waiting (4) no longer fits, fits (3) neither.
  EXPECT_THAT(Counts(m, r.solution), ElementsAre(2, 3, 0, 0));
  EXPECT_THAT(CheckSolution(m, r.solution), IsOk());
}

TEST(PlaceCountsTest, GrowsInHomeGroupOnFastNodesAndShrinksShortWindowsFirst) {
  Problem p;
  p.forward_window = absl::Seconds(80);
  p.cross_locality_factor = 0.5;
  p.classes = {{"a-fast", "rackA", 1.0}, {"a-slow", "rackA", 0.5}, {"b-fast", "rackB", 1.0}};
  p.nodes = {Node{"a0", "a-fast"}, Node{"a1", "a-fast"}, Node{"s0", "a-slow"},
             Node{"b0", "b-fast"}, Node{"b1", "b-fast"}, Node{"b2", "b-fast"}};
  p.nodes[4].expected_idle = absl::Seconds(20);
  JobSpec grow = Job("grow", 1, 3, {{1, 10}, {3, 30}});
  grow.current_nodes = {"a0"};
  JobSpec shrink = Job("shrink", 1, 3, {{1, 10}, {3, 30}});
  shrink.current_nodes = {"b0", "b1", "b2"};
  p.jobs = {grow, shrink};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  const CountSolution s = PlaceCounts(m, std::vector<int>{2, 2});
  ASSERT_THAT(CheckSolution(m, s), IsOk());
  // Pools: a-fast, a-slow, b-fast (long), b-fast (20 s).
  ASSERT_EQ(m.pools.size(), 4u);
  EXPECT_THAT(s.per_pool[0], ElementsAre(2, 0, 0, 0));  // grew on a1, same rack, fast
  EXPECT_THAT(s.per_pool[1], ElementsAre(0, 0, 2, 0));  // released the 20 s node
}

TEST(PlaceCountsTest, StopsAJobThatCannotReachItsMinimum) {
  Problem p = Nodes(3);
  JobSpec a = Job("a", 1, 3, {{1, 1}, {3, 3}});
  a.current_nodes = {"n0", "n1"};
  JobSpec b = Job("b", 3, 3, {{3, 3}});
  p.jobs = {a, b};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  const CountSolution s = PlaceCounts(m, std::vector<int>{2, 3});  // asks for 5 of 3
  ASSERT_THAT(CheckSolution(m, s), IsOk());
  EXPECT_THAT(Counts(m, s), ElementsAre(2, 0));
}

}  // namespace
}  // namespace malle::alloc
