#include "libmalle/alloc/dp.h"

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/alloc/oracles.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::alloc {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::StatusIs;
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

std::vector<int> Counts(const CountModel& m, const PolicyResult& r) {
  std::vector<int> n;
  for (size_t j = 0; j < m.jobs.size(); ++j) n.push_back(m.jobs[j].options[r.solution.option[j]].nodes);
  return n;
}

TEST(DpTest, PrefersTheBetterScalingJob) {
  Problem p = Nodes(4);
  // a scales linearly; b saturates after 1 node.
  p.jobs = {Job("a", 1, 4, {{1, 10}, {4, 40}}), Job("b", 1, 4, {{1, 15}, {2, 16}, {4, 17}})};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
  EXPECT_TRUE(r.optimal);
  EXPECT_THAT(Counts(m, r), ElementsAre(3, 1));
  EXPECT_DOUBLE_EQ(r.solution.objective, (30 + 15) * 10);
  EXPECT_THAT(CheckSolution(m, r.solution), IsOk());
}

TEST(DpTest, NonConcaveCurveTakesAllOrNothing) {
  Problem p = Nodes(4);
  // a is worthless until it has 4 nodes (e.g. a model that only fits on 4).
  p.jobs = {Job("a", 1, 4, {{1, 0}, {3, 0}, {4, 100}}), Job("b", 1, 4, {{1, 20}, {4, 35}})};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
  EXPECT_THAT(Counts(m, r), ElementsAre(4, 0));
}

TEST(DpTest, JobTakesAllNodes) {
  Problem p = Nodes(5);
  p.jobs = {Job("a", 5, 5, {{5, 50}})};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
  EXPECT_THAT(Counts(m, r), ElementsAre(5));
}

TEST(DpTest, MinAboveAvailableNodesLeavesJobStopped) {
  Problem p = Nodes(3);
  p.jobs = {Job("big", 4, 8, {{4, 400}, {8, 800}}), Job("small", 1, 2, {{1, 1}, {2, 2}})};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  EXPECT_EQ(m.jobs[0].options.size(), 1u);  // only "stop": 4 nodes cannot exist
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
  EXPECT_THAT(Counts(m, r), ElementsAre(0, 2));
}

TEST(DpTest, ZeroNodesAndZeroJobs) {
  Problem p = Nodes(0);
  p.jobs = {Job("a", 1, 2, {{1, 1}, {2, 2}})};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
  EXPECT_THAT(Counts(m, r), ElementsAre(0));
  EXPECT_DOUBLE_EQ(r.solution.objective, 0);

  Problem empty = Nodes(3);
  ASSERT_OK_AND_ASSIGN(CountModel e, CompileCountModel(empty));
  ASSERT_OK_AND_ASSIGN(PolicyResult r2, SolveDp(e));
  EXPECT_TRUE(r2.solution.option.empty());
}

TEST(DpTest, TiesKeepTheCurrentAllocation) {
  Problem p = Nodes(1);
  // One node, two identical jobs, no resize cost: giving the node to a is
  // exactly as good as leaving it with b. The DP must not move it.
  JobSpec b = Job("b", 1, 1, {{1, 10}});
  b.current_nodes = {"n0"};
  JobSpec a = Job("a", 1, 1, {{1, 10}});
  for (bool b_first : {true, false}) {
    p.jobs = b_first ? std::vector<JobSpec>{b, a} : std::vector<JobSpec>{a, b};
    ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
    ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
    EXPECT_DOUBLE_EQ(r.solution.objective, 100);
    const int bi = b_first ? 0 : 1;
    EXPECT_EQ(r.solution.option[bi], m.jobs[bi].current_option) << "b_first=" << b_first;
  }
}

TEST(DpTest, ResizeCostCanMakeStayingBest) {
  Problem p = Nodes(4);
  JobSpec a = Job("a", 1, 4, {{1, 10}, {4, 40}});
  a.current_nodes = {"n0", "n1"};
  a.resize_up_pause = absl::Seconds(6);  // growing to 4: 40 * (10 - 6) = 160 < 20 * 10
  p.jobs = {a};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
  EXPECT_THAT(Counts(m, r), ElementsAre(2));
  p.jobs[0].resize_up_pause = absl::Seconds(4);  // 40 * 6 = 240 > 200
  ASSERT_OK_AND_ASSIGN(CountModel m2, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r2, SolveDp(m2));
  EXPECT_THAT(Counts(m2, r2), ElementsAre(4));
}

TEST(DpTest, BatchOptionChoiceIsPartOfTheOptimum) {
  Problem p = Nodes(4);
  JobSpec a = Job("a", 1, 4, {});
  a.batch_options = {{"bs256", {{1, 10}, {4, 25}}}, {"bs1024", {{1, 8}, {4, 30}}}};
  p.jobs = {a};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
  const Option& chosen = m.jobs[0].options[r.solution.option[0]];
  EXPECT_EQ(chosen.nodes, 4);
  EXPECT_EQ(chosen.batch_option, 1);
  EXPECT_DOUBLE_EQ(r.solution.objective, 300);
}

// The single-pool DP computes each job's row only over the counts that can
// still matter (at most what the jobs so far can take, at least what the
// capacity less the jobs still to come leaves). Random pools from 1 node to
// more than every job together could take, against the exhaustive search:
// an off-by-one at either end of the band, or a wrong count read above it,
// gives a worse objective or an allocation that does not fit.
TEST(DpTest, SinglePoolEqualsExhaustiveSearchAtEveryCapacity) {
  std::mt19937 rng(20261128);
  int below_demand = 0, above_demand = 0;
  for (int rep = 0; rep < 300; ++rep) {
    const int num_jobs = 2 + static_cast<int>(rng() % 4);
    std::vector<JobSpec> jobs;
    int demand = 0;
    for (int j = 0; j < num_jobs; ++j) {
      const int min = 1 + static_cast<int>(rng() % 2);
      const int max = min + static_cast<int>(rng() % 3);
      demand += max;
      JobSpec job = Job(absl::StrCat("j", j), min, max,
                        testing::CurveThrough(rng, testing::RandomBreakpoints(rng, min, max),
                                              10.0 + rng() % 20, rng() % 2 == 0));
      job.resize_up_pause = absl::Seconds(rng() % 6);
      job.resize_down_pause = absl::Seconds(rng() % 4);
      jobs.push_back(job);
    }
    const int capacity = 1 + static_cast<int>(rng() % (demand + 2));
    (capacity < demand ? below_demand : above_demand)++;
    Problem p = Nodes(capacity);
    // Some jobs hold nodes (their options then carry resize costs).
    int next_node = 0;
    for (JobSpec& job : jobs) {
      const int hold = static_cast<int>(rng() % (job.max_nodes + 1));
      for (int k = 0; k < hold && next_node < capacity; ++k) {
        job.current_nodes.push_back(absl::StrCat("n", next_node++));
      }
    }
    p.jobs = jobs;
    ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
    ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
    const testing::Exhaustive oracle = testing::ExhaustiveSearch(m);
    EXPECT_NEAR(r.solution.objective, oracle.best, 1e-9 * std::max(1.0, std::abs(oracle.best)))
        << "rep " << rep << ": " << num_jobs << " jobs, demand " << demand << ", capacity "
        << capacity;
    EXPECT_THAT(CheckSolution(m, r.solution), IsOk()) << "rep " << rep;
  }
  // Both sides of the band were exercised.
  EXPECT_GT(below_demand, 50);
  EXPECT_GT(above_demand, 20);
}

// The textbook single-pool DP the fast one must equal to the bit: every
// count from 0 to the capacity, each option in turn (the current one first,
// then by index), a pick per count replaced only by a strictly better value.
// `ties`: jobs on the way back where another option was worth as much.
std::vector<int> PlainKnapsack(const CountModel& m, int* ties) {
  const int capacity = m.pools[0].capacity;
  std::vector<std::vector<double>> best(m.jobs.size() + 1, std::vector<double>(capacity + 1));
  std::vector<std::vector<int>> pick(m.jobs.size(), std::vector<int>(capacity + 1, 0));
  for (size_t j = 0; j < m.jobs.size(); ++j) {
    const JobModel& job = m.jobs[j];
    std::vector<int> order = {job.current_option};
    for (int o = 0; o < static_cast<int>(job.options.size()); ++o) {
      if (o != job.current_option) order.push_back(o);
    }
    std::vector<double>& next = best[j + 1];
    std::fill(next.begin(), next.end(), -std::numeric_limits<double>::infinity());
    for (int o : order) {
      for (int c = job.options[o].nodes; c <= capacity; ++c) {
        const double candidate = best[j][c - job.options[o].nodes] + job.options[o].value;
        if (candidate > next[c]) {
          next[c] = candidate;
          pick[j][c] = o;
        }
      }
    }
  }
  std::vector<int> option(m.jobs.size());
  int c = capacity;
  for (int j = static_cast<int>(m.jobs.size()) - 1; j >= 0; --j) {
    option[j] = pick[j][c];
    int as_good = 0;
    for (const Option& o : m.jobs[j].options) {
      as_good += o.nodes <= c && best[j][c - o.nodes] + o.value == best[j + 1][c];
    }
    *ties += as_good > 1;
    c -= m.jobs[j].options[option[j]].nodes;
  }
  return option;
}

// The fast DP keeps no pick per count (it finds each job's option again
// from the values on the way back), relaxes several options in one pass,
// skips options a cheaper earlier one is worth at least as much as, and
// reads only a band of counts. None of that may change which option it
// picks, ties included: models with a handful of values (many ties and
// dominated options), sums that round, the current option anywhere, and
// options out of count order.
TEST(DpTest, SinglePoolPicksWhatThePlainKnapsackPicks) {
  std::mt19937 rng(20261129);
  int ties = 0;
  for (int rep = 0; rep < 400; ++rep) {
    CountModel m;
    const int num_jobs = 1 + static_cast<int>(rng() % 7);
    int demand = 0;
    for (int j = 0; j < num_jobs; ++j) {
      JobModel job;
      job.options.push_back(Option{});  // stop
      if (rng() % 3 == 0) job.options[0].value = -0.5 * (rng() % 3);
      const int min = 1 + static_cast<int>(rng() % 3);
      const int max = min + static_cast<int>(rng() % 12);
      for (int n = min; n <= max; ++n) {
        if (rng() % 5 == 0) continue;  // not every count is an option
        Option o;
        o.nodes = n;
        o.pattern = 0;
        // Few distinct values (ties, dominated options); every other model
        // in tenths, whose sums round.
        o.value = rep % 2 == 0 ? 0.5 * (rng() % 6) : 0.1 * (rng() % 40) + 0.7;
        job.options.push_back(o);
      }
      if (rep % 5 == 0) std::shuffle(job.options.begin() + 1, job.options.end(), rng);
      job.current_option = static_cast<int>(rng() % job.options.size());
      demand += max;
      m.jobs.push_back(std::move(job));
    }
    Pool pool;
    pool.capacity = 1 + static_cast<int>(rng() % (demand + 3));
    m.pools.push_back(pool);
    m.total_nodes = pool.capacity;
    ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
    const std::vector<int> plain = PlainKnapsack(m, &ties);
    EXPECT_EQ(r.solution.option, plain) << "rep " << rep;
    EXPECT_EQ(r.solution.objective, SolutionObjective(m, plain)) << "rep " << rep;
  }
  EXPECT_GT(ties, 100);
}

TEST(DpTest, MultiPoolRefusesHugeStateSpaces) {
  Problem p;
  p.forward_window = absl::Seconds(10);
  for (int c = 0; c < 6; ++c) p.classes.push_back({absl::StrCat("c", c), "", 1.0 - 0.1 * c});
  for (int i = 0; i < 120; ++i) p.nodes.push_back(Node{absl::StrCat("n", i), absl::StrCat("c", i % 6)});
  p.jobs = {Job("a", 1, 4, {{1, 1}, {4, 4}})};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  EXPECT_THAT(SolveDp(m).status(), StatusIs(absl::StatusCode::kResourceExhausted));
}

// Three pools of 60 nodes (226,981 states, within max_states) and 100
// jobs of up to 64 nodes, each with ~45,000 per-pool vectors: ~1e12 DP
// steps, hours. Refused at once, naming the limit; a small instance of
// the same shape is still solved.
TEST(DpTest, MultiPoolRefusesTooMuchWork) {
  Problem p;
  p.forward_window = absl::Seconds(10);
  for (int c = 0; c < 3; ++c) p.classes.push_back({absl::StrCat("c", c), "", 1.0 - 0.1 * c});
  for (int i = 0; i < 180; ++i) {
    p.nodes.push_back(Node{absl::StrCat("n", i), absl::StrCat("c", i % 3)});
  }
  for (int j = 0; j < 100; ++j) {
    p.jobs.push_back(Job(absl::StrCat("j", j), 1, 64, {{1, 1}, {64, 40}}));
  }
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  const absl::Time t0 = absl::Now();
  EXPECT_THAT(SolveDp(m).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_work")));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  p.jobs.resize(3);
  for (JobSpec& j : p.jobs) j.max_nodes = 4;
  p.nodes.resize(12);
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
  EXPECT_TRUE(r.optimal);
}

}  // namespace
}  // namespace malle::alloc
