#include "libmalle/alloc/decide.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::alloc {
namespace {

using ::malle::testing::IsOkAndHolds;
using ::malle::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

JobSpec Job(const std::string& id, int min, int max, Curve curve) {
  JobSpec j;
  j.id = id;
  j.min_nodes = min;
  j.max_nodes = max;
  j.throughput = std::move(curve);
  return j;
}

Problem Small() {
  Problem p;
  p.forward_window = absl::Seconds(100);
  for (int i = 0; i < 6; ++i) p.nodes.push_back(Node{absl::StrCat("n", i)});
  JobSpec a = Job("alexnet", 1, 4, {{0, 0}, {1, 7115.3}, {2, 13071.7}, {4, 21066.1}});
  a.current_nodes = {"n0", "n1"};
  a.resize_up_pause = absl::Seconds(17.8);
  a.resize_down_pause = absl::Seconds(11.3);
  JobSpec v = Job("vgg16", 1, 4, {{0, 0}, {1, 1193.3}, {2, 2389.2}, {4, 4691.7}});
  v.resize_up_pause = absl::Seconds(17.5);
  p.jobs = {a, v};
  return p;
}

TEST(PolicyNameTest, RoundTripsAndRejectsUnknown) {
  for (PolicyKind k : {PolicyKind::kMilp, PolicyKind::kDp, PolicyKind::kGreedy,
                       PolicyKind::kEqualShare, PolicyKind::kStatic}) {
    EXPECT_THAT(ParsePolicyName(PolicyName(k)), IsOkAndHolds(k));
  }
  EXPECT_THAT(ParsePolicyName("simplex"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown policy \"simplex\"; expected one of milp, dp")));
}

TEST(DecideTest, EveryPolicyReturnsARealisedAllocationWithAReason) {
  const Problem p = Small();
  for (PolicyKind k : {PolicyKind::kMilp, PolicyKind::kDp, PolicyKind::kGreedy,
                       PolicyKind::kEqualShare, PolicyKind::kStatic}) {
    DecideOptions o;
    o.policy = k;
    ASSERT_OK_AND_ASSIGN(Decision d, Decide(p, o));
    EXPECT_EQ(d.policy, k);
    ASSERT_EQ(d.allocation.jobs.size(), 2u);
    int used = 0;
    for (const JobAllocation& j : d.allocation.jobs) used += j.nodes.size();
    EXPECT_EQ(used + d.allocation.idle_nodes.size(), 6u) << PolicyName(k);
    EXPECT_THAT(d.result.reason, HasSubstr(std::string(PolicyName(k))));
    EXPECT_THAT(d.result.reason, HasSubstr("keeping the current allocation"));
    EXPECT_FALSE(d.result.fell_back) << PolicyName(k);
    EXPECT_EQ(d.result.answered_by, PolicyName(k));
  }
}

TEST(DecideTest, ExactPoliciesAgreeAndBeatKeepingTheCurrentAllocation) {
  const Problem p = Small();
  DecideOptions o;
  o.policy = PolicyKind::kDp;
  ASSERT_OK_AND_ASSIGN(Decision dp, Decide(p, o));
  o.policy = PolicyKind::kMilp;
  ASSERT_OK_AND_ASSIGN(Decision milp, Decide(p, o));
  EXPECT_NEAR(dp.objective, milp.objective, 1e-6 * dp.objective);
  EXPECT_GE(dp.objective, dp.current_objective);
  // Both jobs grow to 4 would need 8 nodes; alexnet keeps its 2 and grows.
  EXPECT_THAT(dp.allocation.jobs[0].nodes.size() + dp.allocation.jobs[1].nodes.size(), 6u);
  EXPECT_THAT(dp.allocation.jobs[0].nodes[0], "n0");
}

TEST(DecideTest, InvalidProblemIsInvalidArgument) {
  Problem p = Small();
  p.jobs[1].id = "alexnet";
  EXPECT_THAT(Decide(p).status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("jobs[1].id: duplicate job id \"alexnet\"")));
}

Problem SixPools() {
  Problem p;
  p.forward_window = absl::Seconds(10);
  for (int c = 0; c < 6; ++c) p.classes.push_back({absl::StrCat("c", c), "", 1.0 - 0.1 * c});
  for (int i = 0; i < 120; ++i) {
    p.nodes.push_back(Node{absl::StrCat("n", i), absl::StrCat("c", i % 6)});
  }
  p.jobs = {Job("a", 1, 4, {{1, 1}, {4, 4}})};
  return p;
}

// Six pools of 20 nodes: 21^6 states, beyond the DP's limit; the MILP
// (exact too) answers for it, and says so.
TEST(DecideTest, DpTooLargeIsAnsweredByTheMilp) {
  DecideOptions o;
  o.policy = PolicyKind::kDp;
  ASSERT_OK_AND_ASSIGN(Decision d, Decide(SixPools(), o));
  EXPECT_TRUE(d.result.fell_back);
  EXPECT_THAT(d.result.reason, HasSubstr("dp could not answer"));
  EXPECT_THAT(d.result.reason, HasSubstr("max_states"));
  EXPECT_THAT(d.result.reason, HasSubstr("the milp answered"));
  EXPECT_EQ(d.result.answered_by, "milp");
  EXPECT_EQ(d.allocation.jobs[0].nodes.size(), 4u);
  // The four fastest nodes (class c0): the MILP's optimum, which greedy
  // need not find.
  for (const std::string& n : d.allocation.jobs[0].nodes) {
    const int i = std::stoi(n.substr(1));
    EXPECT_EQ(i % 6, 0) << n;
  }
}

// Three pools of 25 nodes and eight jobs of up to 10 nodes: 26^3 states x
// ~2,300 per-pool vectors, ~4e7 DP steps (about 0.1 s). Within DpOptions'
// own limits, so the DP answers it; beyond the DP policy's, so Decide asks
// the MILP, which answers such problems in milliseconds, and says so.
TEST(DecideTest, DpPolicyHandsAMultiPoolProblemBeyondItsWorkToTheMilp) {
  Problem p;
  p.forward_window = absl::Seconds(100);
  for (int c = 0; c < 3; ++c) p.classes.push_back({absl::StrCat("c", c), "", 1.0 - 0.2 * c});
  for (int i = 0; i < 75; ++i) {
    p.nodes.push_back(Node{absl::StrCat("n", i), absl::StrCat("c", i % 3)});
  }
  for (int j = 0; j < 8; ++j) {
    p.jobs.push_back(Job(absl::StrCat("j", j), 1, 10,
                         {{1, 100.0 + j}, {4, 350.0 + 3 * j}, {10, 700.0 + 10 * j}}));
  }
  ASSERT_OK_AND_ASSIGN(CountModel model, CompileCountModel(p));
  ASSERT_EQ(model.pools.size(), 3u);
  ASSERT_OK_AND_ASSIGN(PolicyResult exact, SolveDp(model, DpOptions{}));

  DecideOptions o;
  o.policy = PolicyKind::kDp;
  ASSERT_OK_AND_ASSIGN(Decision d, Decide(p, o));
  EXPECT_TRUE(d.result.fell_back);
  EXPECT_THAT(d.result.reason, HasSubstr("max_work"));
  EXPECT_THAT(d.result.reason, HasSubstr("the milp answered"));
  EXPECT_EQ(d.result.answered_by, "milp");
  EXPECT_NEAR(d.objective, exact.solution.objective, 1e-6 * exact.solution.objective);
}

// When the MILP cannot answer either (it crashes, and its own fallback is
// the same DP), greedy's answer is the answer (the MILP's start here), and
// answered_by says so.
TEST(DecideTest, DpAndMilpBothUnableFallToGreedy) {
  DecideOptions o;
  o.policy = PolicyKind::kDp;
  o.milp.fault = MilpFault::kCrash;
  o.milp.dp_start = false;
  ASSERT_OK_AND_ASSIGN(Decision d, Decide(SixPools(), o));
  EXPECT_TRUE(d.result.fell_back);
  EXPECT_THAT(d.result.reason, HasSubstr("could not answer"));
  EXPECT_THAT(d.result.reason, HasSubstr("greedy"));
  EXPECT_EQ(d.result.answered_by, "greedy") << d.result.reason;
  EXPECT_EQ(d.allocation.jobs[0].nodes.size(), 4u);
}

// The MILP's limit bounds the decision: what went before the solve is taken
// off it. A decision that began 10 s ago leaves the MILP 1 ms of its 1 s,
// and the reason says so; one that begins now leaves it (nearly) all.
TEST(DecideTest, TheMilpGetsWhatIsLeftOfTheDecisionsTime) {
  DecideOptions o;
  ASSERT_EQ(o.milp.time_limit, absl::Seconds(1));
  o.started = absl::Now() - absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(Decision late, Decide(Small(), o));
  EXPECT_THAT(late.result.reason, HasSubstr("(the solver had 1ms of the limit's 1s: 10"));
  EXPECT_EQ(late.allocation.jobs.size(), 2u);

  o.policy = PolicyKind::kDp;  // beyond the DP: the MILP answers, in what is left
  ASSERT_OK_AND_ASSIGN(Decision dp, Decide(SixPools(), o));
  EXPECT_THAT(dp.result.reason, HasSubstr("dp could not answer"));
  EXPECT_THAT(dp.result.reason, HasSubstr("(the solver had 1ms of the limit's 1s"));

  o.policy = PolicyKind::kMilp;
  o.started = absl::InfinitePast();  // now
  ASSERT_OK_AND_ASSIGN(Decision now, Decide(Small(), o));
  EXPECT_THAT(now.result.reason, Not(HasSubstr("the solver had")));
  EXPECT_EQ(now.result.answered_by, "milp");
}

// Two nodes, a live slow job on one of them and a fast job that wants both:
// without a penalty the exact policies stop the slow job (its throughput is
// worth less than the fast job's second node); with one they keep it.
TEST(DecideTest, StopPenaltyKeepsALiveJobRunning) {
  Problem p;
  p.forward_window = absl::Seconds(100);
  p.nodes = {Node{"n0"}, Node{"n1"}};
  JobSpec slow = Job("slow", 1, 1, {{0, 0}, {1, 10}});
  slow.current_nodes = {"n0"};
  JobSpec fast = Job("fast", 1, 2, {{0, 0}, {1, 100}, {2, 200}});
  fast.current_nodes = {"n1"};
  p.jobs = {slow, fast};
  for (PolicyKind k : {PolicyKind::kMilp, PolicyKind::kDp}) {
    DecideOptions o;
    o.policy = k;
    ASSERT_OK_AND_ASSIGN(Decision stopped, Decide(p, o));
    EXPECT_THAT(stopped.allocation.jobs[0].nodes, ::testing::IsEmpty()) << PolicyName(k);
    EXPECT_THAT(stopped.allocation.jobs[1].nodes, ::testing::UnorderedElementsAre("n0", "n1")) << PolicyName(k);
    Problem kept = p;
    kept.jobs[0].stop_penalty = 1e6;
    ASSERT_OK_AND_ASSIGN(Decision d, Decide(kept, o));
    EXPECT_THAT(d.allocation.jobs[0].nodes, ElementsAre("n0")) << PolicyName(k);
    EXPECT_THAT(d.allocation.jobs[1].nodes, ElementsAre("n1")) << PolicyName(k);
  }
  // The penalty only counts for a job that holds nodes: a queued job may wait.
  Problem queued = p;
  queued.jobs[0].current_nodes.clear();
  queued.jobs[1].current_nodes.clear();
  queued.jobs[0].stop_penalty = 1e6;
  ASSERT_OK_AND_ASSIGN(Decision q, Decide(queued, DecideOptions{}));
  EXPECT_THAT(q.allocation.jobs[0].nodes, ::testing::IsEmpty());
  Problem bad = p;
  bad.jobs[1].stop_penalty = -1;
  EXPECT_THAT(Decide(bad, DecideOptions{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stop_penalty")));
}

}  // namespace
}  // namespace malle::alloc
