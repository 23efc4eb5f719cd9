#include "libmalle/alloc/realize.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/alloc/dp.h"
#include "libmalle/alloc/heuristics.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::alloc {
namespace {

using ::malle::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

JobSpec Job(const std::string& id, int min, int max, Curve curve) {
  JobSpec j;
  j.id = id;
  j.min_nodes = min;
  j.max_nodes = max;
  j.throughput = std::move(curve);
  return j;
}

TEST(RealizeTest, ShrinkGivesUpShortestWindowsGrowTakesLongestAndKeepsOrder) {
  Problem p;
  p.forward_window = absl::Seconds(10);
  // All windows >= the forward window: one pool, but the windows still
  // decide which nodes go first.
  const int windows[] = {500, 20, 300, 40, 1000, 60};
  for (int i = 0; i < 6; ++i) {
    p.nodes.push_back(Node{absl::StrCat("n", i), "", absl::Seconds(windows[i])});
  }
  JobSpec shrink = Job("shrink", 1, 4, {{1, 1}, {4, 4}});
  shrink.current_nodes = {"n0", "n1", "n2"};  // windows 500, 20, 300
  JobSpec grow = Job("grow", 1, 4, {{1, 1}, {4, 4}});
  grow.current_nodes = {"n3"};
  p.jobs = {shrink, grow};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  const CountSolution s = PlaceCounts(m, std::vector<int>{1, 3});
  ASSERT_OK_AND_ASSIGN(Allocation a, Realize(p, m, s));
  ASSERT_EQ(a.jobs.size(), 2u);
  EXPECT_THAT(a.jobs[0].nodes, ElementsAre("n0"));  // kept the 500 s node
  EXPECT_EQ(a.jobs[0].previous_nodes, 3);
  // grow keeps n3 first, then the longest free windows: n4 (1000), n2 (300).
  EXPECT_THAT(a.jobs[1].nodes, ElementsAre("n3", "n4", "n2"));
  EXPECT_THAT(a.idle_nodes, ElementsAre("n1", "n5"));
}

TEST(RealizeTest, EveryNodeExactlyOnceOnRandomDecisions) {
  Problem p;
  p.forward_window = absl::Seconds(60);
  p.classes = {{"x", "r0", 1.0}, {"y", "r1", 0.7}};
  for (int i = 0; i < 12; ++i) {
    p.nodes.push_back(Node{absl::StrCat("n", i), i % 3 ? "x" : "y", absl::Seconds(10 * (i + 1))});
  }
  for (int j = 0; j < 4; ++j) {
    JobSpec job = Job(absl::StrCat("j", j), 1, 5, {{1, 10.0 + j}, {5, 40.0 + 3 * j}});
    for (int k = 0; k < j; ++k) job.current_nodes.push_back(absl::StrCat("n", 3 * j + k));
    p.jobs.push_back(job);
  }
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveGreedy(m));
  ASSERT_OK_AND_ASSIGN(Allocation a, Realize(p, m, r.solution));
  std::multiset<std::string> seen(a.idle_nodes.begin(), a.idle_nodes.end());
  for (size_t j = 0; j < a.jobs.size(); ++j) {
    EXPECT_EQ(static_cast<int>(a.jobs[j].nodes.size()),
              m.jobs[j].options[r.solution.option[j]].nodes);
    seen.insert(a.jobs[j].nodes.begin(), a.jobs[j].nodes.end());
  }
  EXPECT_EQ(seen.size(), p.nodes.size());
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), p.nodes.size());
}

TEST(RealizeTest, RejectsAnInvalidSolution) {
  Problem p;
  p.forward_window = absl::Seconds(10);
  p.nodes = {Node{"n0"}};
  p.jobs = {Job("a", 1, 1, {{1, 1}}), Job("b", 1, 1, {{1, 1}})};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  CountSolution both;
  both.option = {1, 1};
  both.per_pool = {{1}, {1}};
  both.objective = SolutionObjective(m, both.option);
  EXPECT_THAT(Realize(p, m, both).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace malle::alloc
