#include "libmalle/alloc/count_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/alloc/decide.h"
#include "libmalle/alloc/dp.h"
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

Problem SingleClass(int nodes) {
  Problem p;
  p.forward_window = absl::Seconds(100);
  for (int i = 0; i < nodes; ++i) p.nodes.push_back(Node{absl::StrCat("n", i)});
  return p;
}

// The policy's options, the MILP solved in this process.
DecideOptions InProcess(PolicyKind policy) {
  DecideOptions o;
  o.policy = policy;
  o.milp.isolation = SolveIsolation::kInProcess;
  return o;
}

TEST(CompileCountModelTest, SingleClassHandCheckedValues) {
  Problem p = SingleClass(4);
  JobSpec a = Job("a", 1, 3, {{0, 0}, {1, 10}, {2, 18}, {4, 30}});
  a.resize_up_pause = absl::Seconds(10);
  a.resize_down_pause = absl::Seconds(5);
  a.current_nodes = {"n0", "n1"};
  p.jobs = {a};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_EQ(m.pools.size(), 1u);
  EXPECT_EQ(m.pools[0].capacity, 4);
  EXPECT_DOUBLE_EQ(m.pools[0].horizon_s, 100);
  const JobModel& j = m.jobs[0];
  EXPECT_EQ(j.current_nodes, 2);
  EXPECT_DOUBLE_EQ(j.current_samples_per_s, 18);
  ASSERT_EQ(j.options.size(), 4u);  // 0, 1, 2, 3 nodes
  // Lost-work model: shrink to 1 -> 10 * (100 - 5); stay -> 18 * 100; grow
  // to 3 (interpolated 24/s) -> 24 * (100 - 10); stop -> 0.
  EXPECT_DOUBLE_EQ(j.options[0].value, 0);
  EXPECT_DOUBLE_EQ(j.options[1].value, 950);
  EXPECT_DOUBLE_EQ(j.options[2].value, 1800);
  EXPECT_DOUBLE_EQ(j.options[3].value, 24 * 90);
  EXPECT_EQ(j.current_option, 2);

  p.resize_cost = ResizeCostModel::kBftrainer;
  ASSERT_OK_AND_ASSIGN(CountModel b, CompileCountModel(p));
  // BFTrainer: rate(new) * T - rate(current) * pause.
  EXPECT_DOUBLE_EQ(b.jobs[0].options[0].value, -18 * 5);
  EXPECT_DOUBLE_EQ(b.jobs[0].options[1].value, 1000 - 18 * 5);
  EXPECT_DOUBLE_EQ(b.jobs[0].options[2].value, 1800);
  EXPECT_DOUBLE_EQ(b.jobs[0].options[3].value, 2400 - 18 * 10);
}

TEST(CompileCountModelTest, ObjectivesScaleValues) {
  Problem p = SingleClass(2);
  JobSpec a = Job("a", 2, 2, {{1, 10}, {2, 16}});
  a.weight = 3;
  p.jobs = {a};
  p.objective = Objective::kWeighted;
  ASSERT_OK_AND_ASSIGN(CountModel w, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(w.jobs[0].options[1].value, 3 * 16 * 100);
  p.objective = Objective::kSpeedup;
  ASSERT_OK_AND_ASSIGN(CountModel s, CompileCountModel(p));
  // Per-node rate at min_nodes = 8/s, so 16/s counts as speedup 2, weight 3.
  EXPECT_DOUBLE_EQ(s.jobs[0].options[1].value, 3 * 2 * 100);
}

// The completion objective on a hand-checked instance: 3 nodes, two linear
// jobs (10 samples/s per node, 10 s start-up pause, window 100 s), a with
// 1,000 samples left, b with 6,000. Work in the window is 900 per node,
// counted as a share of what is left and capped at all of it:
// a: 0.9, 1, 1 at 1..3 nodes; b: 0.15, 0.30, 0.45. Best: a on 1 node, b on
// 2 (0.9 + 0.3 = 1.2; a on 2 and b on 1 is 1.15). The throughput objective
// values every split of the 3 nodes alike (2,700 samples).
TEST(CompileCountModelTest, CompletionObjectiveValuesShareOfRemainingWork) {
  Problem p = SingleClass(3);
  JobSpec a = Job("a", 1, 3, {{0, 0}, {3, 30}});
  a.resize_up_pause = absl::Seconds(10);
  a.remaining_samples = 1000;
  JobSpec b = a;
  b.id = "b";
  b.remaining_samples = 6000;
  p.jobs = {a, b};
  p.objective = Objective::kCompletion;
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_EQ(m.jobs[0].options.size(), 4u);
  EXPECT_DOUBLE_EQ(m.jobs[0].options[1].value, 0.9);
  EXPECT_DOUBLE_EQ(m.jobs[0].options[2].value, 1.0);
  EXPECT_DOUBLE_EQ(m.jobs[0].options[3].value, 1.0);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[1].value, 0.15);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[2].value, 0.30);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[3].value, 0.45);
  for (PolicyKind policy : {PolicyKind::kDp, PolicyKind::kMilp}) {
    ASSERT_OK_AND_ASSIGN(Decision d, Decide(p, InProcess(policy)));
    EXPECT_NEAR(d.objective, 1.2, 1e-12) << PolicyName(policy);
    EXPECT_EQ(d.allocation.jobs[0].nodes.size(), 1u) << PolicyName(policy);
    EXPECT_EQ(d.allocation.jobs[1].nodes.size(), 2u) << PolicyName(policy);
  }
  // Weight 2 on b doubles its shares: a on 1 node and b on 2 is 0.9 + 0.6.
  p.jobs[1].weight = 2;
  ASSERT_OK_AND_ASSIGN(Decision d, Decide(p, DecideOptions{PolicyKind::kDp}));
  EXPECT_NEAR(d.objective, 1.5, 1e-12);

  // The objective needs the remaining work.
  p.jobs[1].remaining_samples = 0;
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("jobs[1] (\"b\").remaining_samples: must be > 0 for the "
                                 "completion objective")));
  p.jobs[1].remaining_samples = -1;
  p.objective = Objective::kThroughput;
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("jobs[1] (\"b\").remaining_samples: must be finite and >= 0")));
}

// Rank weights on a hand-checked instance: 2 nodes, speedup objective,
// window 100 s, no pauses. a: 10 and 19 samples/s on 1 and 2 nodes, 10,000
// samples left (1,000 node-s at its rate on 1 node); b: 10 and 16, 2,000
// left (200 node-s). Speedups: a 1 and 1.9, b 1 and 1.6, so options are
// worth 100 x speedup: (a, b) = (2, 0) 190, (1, 1) 200, (0, 2) 160.
// Exponent 1: b has less work left, rank 2 (weight 2), a rank 1: (1, 1)
// 100 + 200 = 300, (0, 2) 2 x 160 = 320, b takes both nodes. Exponent 0.5:
// b weighs sqrt(2): (1, 1) 100 + 141.42 = 241.42 beats (0, 2) 226.27.
TEST(CompileCountModelTest, RankWeightsFavourTheJobClosestToDone) {
  Problem p = SingleClass(2);
  p.objective = Objective::kSpeedup;
  JobSpec a = Job("a", 1, 2, {{0, 0}, {1, 10}, {2, 19}});
  a.remaining_samples = 10000;
  JobSpec b = Job("b", 1, 2, {{0, 0}, {1, 10}, {2, 16}});
  b.remaining_samples = 2000;
  p.jobs = {a, b};
  auto best = [](const Problem& problem) {
    DecideOptions o;
    o.policy = PolicyKind::kDp;
    absl::StatusOr<Decision> d = Decide(problem, o);
    EXPECT_THAT(d.status(), IsOk());
    return std::make_pair(d->allocation.jobs[0].nodes.size(), d->allocation.jobs[1].nodes.size());
  };
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[0].options[2].value, 190);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[2].value, 160);
  EXPECT_EQ(best(p), std::make_pair(size_t{1}, size_t{1}));

  p.rank_weight_exponent = 1;
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[0].options[1].value, 100);
  EXPECT_DOUBLE_EQ(m.jobs[0].options[2].value, 190);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[1].value, 200);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[2].value, 320);
  for (PolicyKind policy : {PolicyKind::kDp, PolicyKind::kMilp}) {
    ASSERT_OK_AND_ASSIGN(Decision d, Decide(p, InProcess(policy)));
    EXPECT_NEAR(d.objective, 320, 1e-9) << PolicyName(policy);
    EXPECT_EQ(d.allocation.jobs[0].nodes.size(), 0u) << PolicyName(policy);
    EXPECT_EQ(d.allocation.jobs[1].nodes.size(), 2u) << PolicyName(policy);
  }

  p.rank_weight_exponent = 0.5;
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[1].options[2].value, std::sqrt(2.0) * 160);
  EXPECT_EQ(best(p), std::make_pair(size_t{1}, size_t{1}));

  // The work credited is capped at what is left: with 1,200 samples left, b
  // on 2 nodes trains 1,600 in the window but is credited 1,200, speedup
  // units 1,200 / 10 = 120, weight 2: 240, and (1, 1) = 100 + 200 wins.
  p.rank_weight_exponent = 1;
  p.jobs[1].remaining_samples = 1200;
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[1].options[1].value, 200);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[2].value, 240);
  EXPECT_EQ(best(p), std::make_pair(size_t{1}, size_t{1}));

  // Work left is compared in time, not samples: a 10x faster job with 5x the
  // samples left (1,000 node-s vs 2,000) ranks as the shorter one.
  p.jobs[1].remaining_samples = 2000;
  p.jobs[0].throughput = {{0, 0}, {1, 100}, {2, 190}};
  p.jobs[0].remaining_samples = 100000;
  p.jobs[1].remaining_samples = 20000;
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[0].options[1].value, 200);  // speedup 1 x 100 s x weight 2
  EXPECT_DOUBLE_EQ(m.jobs[1].options[1].value, 100);

  // Equal work left: the earlier job ranks as the shorter (weight 2).
  p.jobs[0] = a;
  p.jobs[1] = a;
  p.jobs[1].id = "a2";
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[0].options[1].value, 200);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[1].value, 100);

  // Bad input.
  p.rank_weight_exponent = -1;
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank_weight_exponent: must be finite and >= 0, got -1")));
  p.rank_weight_exponent = 1;
  p.jobs[1].remaining_samples = 0;
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("jobs[1] (\"a2\").remaining_samples: must be > 0 with "
                                 "rank_weight_exponent > 0")));
  p.jobs[1].remaining_samples = 1;
  p.objective = Objective::kThroughput;
  p.jobs[1].throughput = {{0, 0}, {1, 0}, {2, 10}};
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("throughput at min_nodes is 0, so the work left cannot be "
                                 "ranked")));
}

// A job's staying as it is is credited the whole window, not capped at the
// work it has left: it frees its nodes when it finishes and the decision
// its finish triggers gives them on. Same instance, b on n0 with 200
// samples left (20 node-s, still the shorter: weight 2): staying on 1 node
// 10 x 100 s / 10 x 2 = 200 (capped, it would be 200 samples / 10 x 2 =
// 40); growing to 2 is capped: 200 / 10 x 2 = 40. a on n1: 100. a taking
// both nodes (190) no longer beats b keeping its node (200 + 100).
TEST(CompileCountModelTest, StayingIsNotCappedByTheWorkLeft) {
  Problem p = SingleClass(2);
  p.objective = Objective::kSpeedup;
  p.rank_weight_exponent = 1;
  JobSpec a = Job("a", 1, 2, {{0, 0}, {1, 10}, {2, 19}});
  a.remaining_samples = 10000;
  JobSpec b = Job("b", 1, 2, {{0, 0}, {1, 10}, {2, 16}});
  b.remaining_samples = 200;
  b.current_nodes = {"n0"};
  p.jobs = {a, b};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[1].options[m.jobs[1].current_option].value, 200);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[2].value, 40);
  EXPECT_DOUBLE_EQ(m.jobs[0].options[1].value, 100);
  EXPECT_DOUBLE_EQ(m.jobs[0].options[2].value, 190);
  for (PolicyKind policy : {PolicyKind::kDp, PolicyKind::kMilp}) {
    ASSERT_OK_AND_ASSIGN(Decision d, Decide(p, InProcess(policy)));
    EXPECT_NEAR(d.objective, 300, 1e-9) << PolicyName(policy);
    EXPECT_THAT(d.allocation.jobs[1].nodes, ElementsAre("n0")) << PolicyName(policy);
  }
}

// Aging (Problem::rank_aging) on the same instance: a has 1,000 node-s of
// work left, b 200. A job's work ranks as work / (1 + age / rank_aging).
// a aged 3 x rank_aging: 1,000 / 4 = 250 > 200, b still ranks shorter
// (weight 2) and takes both nodes (320, as without aging). a aged 4 x:
// 1,000 / 5 = 200, a tie, which the earlier job (a) wins: weight 2 for a,
// options a (1) 200, (2) 380, and a takes both nodes (380 > 100 + 200). b
// aged too, as long: both divided by 5, b shorter again.
TEST(CompileCountModelTest, AgingRanksALongJobThatWaitedAsShorter) {
  Problem p = SingleClass(2);
  p.objective = Objective::kSpeedup;
  p.rank_weight_exponent = 1;
  p.rank_aging = absl::Hours(10);
  JobSpec a = Job("a", 1, 2, {{0, 0}, {1, 10}, {2, 19}});
  a.remaining_samples = 10000;
  JobSpec b = Job("b", 1, 2, {{0, 0}, {1, 10}, {2, 16}});
  b.remaining_samples = 2000;
  p.jobs = {a, b};
  auto nodes_of_a = [](const Problem& problem) {  // the DP's and the MILP's, which agree
    std::vector<size_t> counts;
    for (PolicyKind policy : {PolicyKind::kDp, PolicyKind::kMilp}) {
      absl::StatusOr<Decision> d = Decide(problem, InProcess(policy));
      EXPECT_THAT(d.status(), IsOk());
      counts.push_back(d.ok() ? d->allocation.jobs[0].nodes.size() : 99);
    }
    EXPECT_EQ(counts[0], counts[1]);
    return counts[0];
  };

  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));  // both aged 0
  EXPECT_DOUBLE_EQ(m.jobs[0].options[2].value, 190);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[2].value, 320);

  p.jobs[0].age = absl::Hours(30);
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[0].options[2].value, 190);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[2].value, 320);
  EXPECT_EQ(nodes_of_a(p), 0u);

  p.jobs[0].age = absl::Hours(40);
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[0].options[1].value, 200);
  EXPECT_DOUBLE_EQ(m.jobs[0].options[2].value, 380);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[1].value, 100);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[2].value, 160);
  EXPECT_EQ(nodes_of_a(p), 2u);

  p.jobs[1].age = absl::Hours(40);
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[0].options[2].value, 190);
  EXPECT_DOUBLE_EQ(m.jobs[1].options[2].value, 320);

  // Off (infinite), the ages do not count.
  p.rank_aging = absl::InfiniteDuration();
  p.jobs[1].age = absl::ZeroDuration();
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[1].options[2].value, 320);

  // Bad input.
  p.rank_aging = absl::ZeroDuration();
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank_aging: must be > 0 (infinite: off), got 0")));
  p.rank_aging = absl::Hours(10);
  p.rank_weight_exponent = 0;
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank_aging: is 10h, but rank weights are off "
                                 "(rank_weight_exponent = 0)")));
  p.rank_weight_exponent = 1;
  p.jobs[1].age = absl::Seconds(-1);
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("jobs[1] (\"b\").age: must be >= 0, got -1s")));
  p.jobs[1].age = absl::InfiniteDuration();
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("jobs[1] (\"b\").age: must be finite")));
}

// Reclaim hazard and hysteresis on a hand-checked instance: 2 nodes, a
// linear job (10 samples/s per node, 10 s up, 5 s down), window 100 s, lost
// work. Without either, starting on n nodes is worth 10 n (100 - 10).
TEST(CompileCountModelTest, ReclaimRateAndHysteresisPriceResizes) {
  Problem p = SingleClass(2);
  JobSpec a = Job("a", 1, 2, {{0, 0}, {2, 20}});
  a.resize_up_pause = absl::Seconds(10);
  a.resize_down_pause = absl::Seconds(5);
  p.jobs = {a};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  EXPECT_DOUBLE_EQ(m.jobs[0].options[1].value, 900);
  EXPECT_DOUBLE_EQ(m.jobs[0].options[2].value, 1800);
  // 0.001 reclaims per node-second: on n nodes a forced shrink within the
  // window has probability 1 - exp(-0.1 n) and costs 10 n x 5 s.
  p.reclaim_rate = 0.001;
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  EXPECT_NEAR(m.jobs[0].options[1].value, 900 - 50 * (1 - std::exp(-0.1)), 1e-9);
  EXPECT_NEAR(m.jobs[0].options[2].value, 1800 - 100 * (1 - std::exp(-0.2)), 1e-9);
  // Hysteresis 2: the start is charged 20 s; the reclaim cost stays at 5 s.
  p.resize_hysteresis = 2;
  ASSERT_OK_AND_ASSIGN(m, CompileCountModel(p));
  EXPECT_NEAR(m.jobs[0].options[1].value, 800 - 50 * (1 - std::exp(-0.1)), 1e-9);
  EXPECT_NEAR(m.jobs[0].options[2].value, 1600 - 100 * (1 - std::exp(-0.2)), 1e-9);
  p.resize_hysteresis = 0.5;
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("resize_hysteresis: must be finite and >= 1, got 0.5")));
  p.resize_hysteresis = 1;
  p.reclaim_rate = -1;
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("reclaim_rate: must be finite and >= 0, got -1")));
}

TEST(CompileCountModelTest, ShortIdleWindowsBoundTheValue) {
  Problem p = SingleClass(2);
  p.nodes[1].expected_idle = absl::Seconds(30);  // bucket 12.5 s -> 25 s
  JobSpec a = Job("a", 1, 2, {{1, 10}, {2, 20}});
  a.resize_up_pause = absl::Seconds(40);
  p.jobs = {a};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_EQ(m.pools.size(), 2u);
  EXPECT_DOUBLE_EQ(m.pools[0].horizon_s, 100);
  EXPECT_DOUBLE_EQ(m.pools[1].horizon_s, 25);
  ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
  // The short node is reclaimed before the 40 s start-up pays off: using it
  // is worth 20 * (25 - 40) < 0, the long node alone 10 * 60.
  EXPECT_DOUBLE_EQ(r.solution.objective, 600);
  EXPECT_THAT(r.solution.per_pool[0], ElementsAre(1, 0));
}

TEST(CompileCountModelTest, RejectsBadProblemAndOptions) {
  Problem p = SingleClass(1);
  p.jobs = {Job("a", 2, 1, {{1, 1}})};
  EXPECT_THAT(CompileCountModel(p).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("min_nodes = 2 > max_nodes = 1")));
  p.jobs = {Job("a", 1, 1, {{1, 1}})};
  CountModelOptions o;
  o.horizon_buckets = 0;
  EXPECT_THAT(CompileCountModel(p, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("horizon_buckets")));
}

TEST(CheckSolutionTest, NamesTheViolation) {
  Problem p = SingleClass(3);
  JobSpec a = Job("a", 1, 3, {{1, 1}, {3, 3}});
  a.current_nodes = {"n0"};
  p.jobs = {a, Job("b", 1, 3, {{1, 1}, {3, 3}})};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  CountSolution s = CurrentSolution(m);
  EXPECT_THAT(CheckSolution(m, s), IsOk());
  CountSolution over = s;
  over.option = {3, 2};  // 3 + 2 nodes on 3
  over.per_pool = {{3}, {2}};
  over.objective = SolutionObjective(m, over.option);
  EXPECT_THAT(CheckSolution(m, over),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("over-subscribed")));
  CountSolution mismatch = s;
  mismatch.per_pool[0] = {2};
  EXPECT_THAT(CheckSolution(m, mismatch),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("shrinks to 1 but takes nodes of pool 0")));
  CountSolution wrong_objective = s;
  wrong_objective.objective += 1;
  EXPECT_THAT(CheckSolution(m, wrong_objective),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("objective")));
}

// ---------------------------------------------------------------------------
// Brute force straight from the Problem's semantics (no count model): every
// assignment of nodes to jobs, valued as docs/allocator.md defines it.

struct Brute {
  const Problem& p;
  double T;
  std::vector<int> owner;  // node -> job or -1 (current)

  double ClassSpeed(int node) const {
    if (p.classes.empty()) return 1.0;
    for (const NodeClass& c : p.classes) {
      if (c.id == p.nodes[node].class_id || (p.nodes[node].class_id.empty())) return c.speed;
    }
    return 1.0;
  }
  std::string Locality(int node) const {
    for (const NodeClass& c : p.classes) {
      if (c.id == p.nodes[node].class_id) return c.locality;
    }
    return "";
  }
  double Horizon(int node) const {
    return std::min(T, absl::ToDoubleSeconds(p.nodes[node].expected_idle));
  }
  // Throughput factor of a node set: slowest node, locality penalty.
  double Factor(const std::vector<int>& set) const {
    double speed = 1e300;
    std::set<std::string> groups;
    for (int i : set) {
      speed = std::min(speed, ClassSpeed(i));
      groups.insert(Locality(i));
    }
    return speed * (groups.size() > 1 ? p.cross_locality_factor : 1.0);
  }
  double Scale(const JobSpec& j) const {
    const Curve& c0 = j.batch_options.empty() ? j.throughput : j.batch_options[0].throughput;
    switch (p.objective) {
      case Objective::kThroughput:
        return 1;
      case Objective::kWeighted:
        return j.weight;
      case Objective::kSpeedup:
        return j.weight * j.min_nodes / Interpolate(c0, j.min_nodes);
      case Objective::kCompletion:
        return j.weight / j.remaining_samples;
    }
    return 1;
  }
  // Value of job `j` holding exactly `set`; nullopt if not allowed.
  std::optional<double> Value(int j, const std::vector<int>& set) const {
    const JobSpec& job = p.jobs[j];
    std::vector<int> cur;
    for (size_t i = 0; i < p.nodes.size(); ++i) {
      if (owner[i] == j) cur.push_back(static_cast<int>(i));
    }
    const bool superset = std::includes(set.begin(), set.end(), cur.begin(), cur.end());
    const bool subset = std::includes(cur.begin(), cur.end(), set.begin(), set.end());
    if (!superset && !subset) return std::nullopt;  // migration
    const int n = static_cast<int>(set.size());
    const int c = static_cast<int>(cur.size());
    if (n != 0 && (n < job.min_nodes || n > job.max_nodes)) return std::nullopt;
    std::vector<const Curve*> curves;
    if (job.batch_options.empty()) {
      curves.push_back(&job.throughput);
    } else {
      for (const BatchOption& b : job.batch_options) curves.push_back(&b.throughput);
    }
    const double rate_cur = (c >= job.min_nodes && c <= job.max_nodes)
                                ? Interpolate(*curves[job.current_batch_option], c) * Factor(cur)
                                : 0.0;
    const double up = absl::ToDoubleSeconds(job.resize_up_pause);
    const double down = absl::ToDoubleSeconds(job.resize_down_pause);
    if (n == 0) {
      return (c > 0 && p.resize_cost == ResizeCostModel::kBftrainer) ? -Scale(job) * rate_cur * down
                                                                     : 0.0;
    }
    double h = T;
    for (int i : set) h = std::min(h, Horizon(i));
    double best = -1e300;
    for (size_t b = 0; b < curves.size(); ++b) {
      const double eff = Interpolate(*curves[b], n) * Factor(set);
      double v;
      if (n == c && static_cast<int>(b) == job.current_batch_option) {
        v = eff * h;
      } else {
        const double pause = (n > c || n == c) ? up : down;
        v = p.resize_cost == ResizeCostModel::kLostWork ? eff * (h - pause) : eff * h - rate_cur * pause;
      }
      best = std::max(best, v * Scale(job));
    }
    return best;
  }
  double Solve() const {
    const int num_nodes = static_cast<int>(p.nodes.size());
    const int num_jobs = static_cast<int>(p.jobs.size());
    std::vector<int> assign(num_nodes, -1);  // -1 = idle
    double best = -std::numeric_limits<double>::infinity();
    while (true) {
      double total = 0;
      bool ok = true;
      for (int j = 0; j < num_jobs && ok; ++j) {
        std::vector<int> set;
        for (int i = 0; i < num_nodes; ++i) {
          if (assign[i] == j) set.push_back(i);
        }
        auto v = Value(j, set);
        if (!v) ok = false; else total += *v;
      }
      if (ok) best = std::max(best, total);
      int i = 0;
      for (; i < num_nodes; ++i) {
        if (++assign[i] < num_jobs) break;
        assign[i] = -1;
      }
      if (i == num_nodes) break;
    }
    return best;
  }
};

Problem RandomClassProblem(std::mt19937& rng) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem p;
  p.forward_window = absl::Seconds(80);
  p.resize_cost = uni(0, 1) ? ResizeCostModel::kLostWork : ResizeCostModel::kBftrainer;
  p.objective = static_cast<Objective>(uni(0, 2));
  p.cross_locality_factor = uni(0, 1) ? 1.0 : 0.75;
  const int num_classes = uni(1, 3);
  const double speeds[] = {1.0, 0.5, 0.8};
  for (int c = 0; c < num_classes; ++c) {
    p.classes.push_back({absl::StrCat("c", c), absl::StrCat("rack", uni(0, 1)), speeds[uni(0, 2)]});
  }
  const int num_nodes = uni(2, 5);
  // Windows that are multiples of the bucket (80 s / 8) or beyond the window,
  // so bucketing does not round and the brute force needs no bucketing.
  const double windows[] = {1e9, 40, 20, 60, 100};
  for (int i = 0; i < num_nodes; ++i) {
    Node n{absl::StrCat("n", i), absl::StrCat("c", uni(0, num_classes - 1))};
    const double w = windows[uni(0, 4)];
    if (w < 1e9) n.expected_idle = absl::Seconds(w);
    p.nodes.push_back(n);
  }
  const int num_jobs = uni(1, 3);
  std::vector<int> free_nodes(num_nodes);
  for (int i = 0; i < num_nodes; ++i) free_nodes[i] = i;
  std::shuffle(free_nodes.begin(), free_nodes.end(), rng);
  for (int j = 0; j < num_jobs; ++j) {
    const int min = uni(1, 2);
    const int max = uni(min, 4);
    auto random_curve = [&]() {
      Curve c;
      double r = 0;
      for (int n = 0; n <= max; ++n) {
        if (n > 0 && n < max && n != min && uni(0, 1)) continue;  // sparse breakpoints
        c.push_back({n, r});
        r += uni(0, 20);  // non-concave, sometimes flat
      }
      return c;
    };
    JobSpec job = Job(absl::StrCat("j", j), min, max, {});
    if (uni(0, 3) == 0) {
      job.batch_options = {{"small", random_curve()}, {"large", random_curve()}};
      job.current_batch_option = uni(0, 1);
    } else {
      job.throughput = random_curve();
    }
    if (p.objective == Objective::kSpeedup) {
      auto fix = [&](Curve& c) {
        for (Breakpoint& b : c) b.samples_per_s += b.nodes;  // positive at min
      };
      fix(job.throughput);
      for (BatchOption& b : job.batch_options) fix(b.throughput);
    }
    job.resize_up_pause = absl::Seconds(uni(0, 50));
    job.resize_down_pause = absl::Seconds(uni(0, 30));
    job.weight = uni(1, 3);
    const int held = std::min<int>(uni(0, max), free_nodes.size());
    for (int k = 0; k < held; ++k) {
      job.current_nodes.push_back(p.nodes[free_nodes.back()].id);
      free_nodes.pop_back();
    }
    p.jobs.push_back(job);
  }
  return p;
}

TEST(CountModelBruteForceTest, DpEqualsBruteForceOnTinyClassInstances) {
  std::mt19937 rng(20261122);
  int multi_pool = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const Problem p = RandomClassProblem(rng);
    ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
    multi_pool += !m.single_pool();
    Brute brute{p, absl::ToDoubleSeconds(p.forward_window), {}};
    brute.owner.assign(p.nodes.size(), -1);
    for (size_t j = 0; j < p.jobs.size(); ++j) {
      for (const std::string& id : p.jobs[j].current_nodes) {
        for (size_t i = 0; i < p.nodes.size(); ++i) {
          if (p.nodes[i].id == id) brute.owner[i] = static_cast<int>(j);
        }
      }
    }
    const double expected = brute.Solve();
    ASSERT_OK_AND_ASSIGN(PolicyResult r, SolveDp(m));
    ASSERT_THAT(CheckSolution(m, r.solution), IsOk());
    ASSERT_NEAR(r.solution.objective, expected, 1e-9 * std::max(1.0, std::abs(expected)))
        << "instance " << iter;
    // The current allocation is always feasible and never better than optimal.
    const CountSolution current = CurrentSolution(m);
    ASSERT_THAT(CheckSolution(m, current), IsOk());
    ASSERT_LE(current.objective, r.solution.objective + 1e-9 * std::abs(expected));
  }
  EXPECT_GT(multi_pool, 200);  // most instances exercise classes/windows
}

TEST(JobVectorValueTest, EnforcesKeepAndReleaseRules) {
  Problem p;
  p.forward_window = absl::Seconds(10);
  p.classes = {{"fast", "", 1.0}, {"slow", "", 0.5}};
  p.nodes = {Node{"f0", "fast"}, Node{"f1", "fast"}, Node{"s0", "slow"}};
  JobSpec a = Job("a", 1, 3, {{1, 10}, {3, 30}});
  a.current_nodes = {"s0"};
  p.jobs = {a};
  ASSERT_OK_AND_ASSIGN(CountModel m, CompileCountModel(p));
  ASSERT_EQ(m.pools.size(), 2u);  // fast, slow
  // Growing must keep the slow node: {fast 1, slow 1} ok, {fast 2} is a migration.
  EXPECT_TRUE(JobVectorValue(m.jobs[0], std::vector<int>{1, 1}).has_value());
  EXPECT_FALSE(JobVectorValue(m.jobs[0], std::vector<int>{1, 0}).has_value());
  EXPECT_FALSE(JobVectorValue(m.jobs[0], std::vector<int>{2, 0}).has_value());
  // Value of {fast 1, slow 1}: 20/s at the slow node's speed 0.5, 10 s.
  EXPECT_DOUBLE_EQ(*JobVectorValue(m.jobs[0], std::vector<int>{1, 1}), 20 * 0.5 * 10);
  EXPECT_DOUBLE_EQ(*JobVectorValue(m.jobs[0], std::vector<int>{0, 0}), 0);
}

}  // namespace
// Two pools of 2 nodes (fast "f", slow "s"). Job a holds f0 and s0 and
// shrinks to 1 node; job b grows from nothing to 3 nodes on any pool. b
// needs a's released node: the flow must release a's node where b can use
// it, and b's 3 nodes = 1 free f + 1 free s + the one a releases.
TEST(PlaceOptionsTest, ShrinkingJobReleasesWhereTheGrowerNeedsIt) {
  Problem p;
  p.classes = {NodeClass{"f", "", 1.0}, NodeClass{"s", "", 0.5}};
  p.nodes = {Node{"f0", "f"}, Node{"f1", "f"}, Node{"s0", "s"}, Node{"s1", "s"}};
  JobSpec a;
  a.id = "a";
  a.min_nodes = 1;
  a.max_nodes = 2;
  a.throughput = {{1, 10.0}, {2, 20.0}};
  a.current_nodes = {"f0", "s0"};
  JobSpec b = a;
  b.id = "b";
  b.max_nodes = 3;
  b.throughput = {{1, 10.0}, {3, 30.0}};
  b.current_nodes = {};
  p.jobs = {a, b};
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
  ASSERT_EQ(model.pools.size(), 2u);
  // a at 1 node on the pattern of both pools (speed 0.5), b at 3 on both.
  auto find = [&](int j, int nodes) {
    const JobModel& job = model.jobs[j];
    for (size_t o = 0; o < job.options.size(); ++o) {
      if (job.options[o].nodes == nodes && job.patterns[job.options[o].pattern].pools.size() == 2) {
        return static_cast<int>(o);
      }
    }
    return -1;
  };
  const int a1 = find(0, 1), b3 = find(1, 3);
  ASSERT_GE(a1, 0);
  ASSERT_GE(b3, 0);
  ASSERT_OK_AND_ASSIGN(CountSolution s, PlaceOptions(model, {a1, b3}));
  EXPECT_THAT(CheckSolution(model, s), IsOk());
  EXPECT_EQ(s.per_pool[0][0] + s.per_pool[0][1], 1);
  EXPECT_EQ(s.per_pool[1][0] + s.per_pool[1][1], 3);
  EXPECT_EQ(s.per_pool[0][0] + s.per_pool[1][0], 2);  // pool f full
  EXPECT_EQ(s.per_pool[0][1] + s.per_pool[1][1], 2);  // pool s full
  // a keeping both nodes (stay) leaves b only 2: no placement.
  const int a_stay = model.jobs[0].current_option;
  EXPECT_EQ(PlaceOptions(model, {a_stay, b3}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(PlaceOptions(model, {a_stay}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace malle::alloc
