// AllocatorState: the allocator's decisions as pure functions of (state,
// message, now). Nodes, jobs and agents are scripted message by message; the
// policy is the exact DP.
#include "libmalle/control/state/allocator_state.h"

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/advisor/report_json.h"
#include "nlohmann/json.hpp"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::control {
namespace {

using ::malle::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

// A report of `job` at `step`, 100 samples/s on one node, global batch `batch`.
AdvisorReport ReportAt(const std::string& job, int64_t step, int64_t batch) {
  advisor::AdvisorReport r;
  r.job = job;
  r.step = step;
  r.sizes_observed = {1};
  advisor::CurvePoint p;
  p.nodes = 1;
  p.samples_per_s = 100;
  p.lo = 90;
  p.hi = 110;
  p.efficiency = 1;
  r.curve = {p};
  r.model.fitted = true;
  r.model.configurations = 1;
  r.model.current_nodes = 1;
  r.model.efficiency_reference_nodes = 1;
  r.model.global_batch = batch;
  return AdvisorReport{job, advisor::ReportToJson(r)};
}

// A report of a job measured at 100 samples/s on one node.
AdvisorReport RichReport() { return ReportAt("rich", 50, 0); }

class AllocatorStateTest : public ::testing::Test {
 protected:
  Envelope From(const std::string& sender, Message m, absl::Time ts = kT0) {
    Envelope e;
    e.sender = sender;
    e.seq = ++seq_;
    e.ts = ts;
    e.message = std::move(m);
    return e;
  }
  static std::string Agent(const std::string& node) { return "agent." + node; }

  absl::StatusOr<Applied> Register(const std::string& node, absl::Time now = kT0,
                                   const std::string& agent = "") {
    NodeRegister r;
    r.node = node;
    r.agent = agent.empty() ? Agent(node) : agent;
    return state_.Apply(From(r.agent, r, now), now);
  }
  absl::StatusOr<Applied> Submit(const std::string& job, int min, int max, absl::Time now = kT0) {
    JobSubmit s;
    s.job = job;
    s.command = {"python", "train.py"};
    s.min_nodes = min;
    s.max_nodes = max;
    return state_.Apply(From("client", s, now), now);
  }
  AllocationPlan DecideAndAdopt(absl::Time now = kT0) {
    alloc::DecideOptions o;
    o.policy = alloc::PolicyKind::kDp;
    absl::StatusOr<alloc::Decision> d = alloc::Decide(state_.BuildProblem(now), o);
    EXPECT_OK(d.status());
    return state_.Adopt(*d, now, "dp");
  }
  const JobRecord& Job(const std::string& id) { return state_.jobs().at(id); }
  // What the agent of `node` says it runs (phase since `since`), at `now`.
  absl::Status Heartbeat(const std::string& node, absl::Time now, std::optional<std::string> job = {},
                         RankPhase phase = RankPhase::kTraining, std::optional<absl::Time> since = {}) {
    AgentHeartbeat h;
    h.node = node;
    if (job) h.running = RunningRank{*job, node + "-m", 100, phase, since.value_or(now)};
    return state_.Apply(From(Agent(node), h, now), now).status();
  }

  AllocatorState state_;
  uint64_t seq_ = 0;
};

TEST_F(AllocatorStateTest, AJobStartsOnTheNodesAndTheyShareWithALaterJob) {
  for (const char* n : {"n0", "n1", "n2", "n3"}) ASSERT_OK(Register(n).status());
  ASSERT_OK_AND_ASSIGN(Applied a, Submit("a", 1, 4));
  EXPECT_TRUE(a.needs_decision);
  EXPECT_TRUE(a.journal);
  AllocationPlan p1 = DecideAndAdopt();
  EXPECT_EQ(p1.plan, 1);
  EXPECT_EQ(Job("a").phase, JobPhase::kRunning);
  EXPECT_THAT(Job("a").nodes, ElementsAre("n0", "n1", "n2", "n3"));
  ASSERT_THAT(p1.launches, SizeIs(1));
  EXPECT_EQ(p1.launches[0].runtime_id, "a.i1");
  EXPECT_EQ(p1.launches[0].bootstrap_node, "n0");
  EXPECT_THAT(p1.assignments, SizeIs(4));

  // A second job: with the concave prior its first node is worth more than
  // a's fourth, so a gives up nodes; a keeps its incarnation and bootstrap.
  ASSERT_OK(Submit("b", 1, 4).status());
  AllocationPlan p2 = DecideAndAdopt();
  EXPECT_EQ(p2.plan, 2);
  EXPECT_EQ(Job("a").nodes.size() + Job("b").nodes.size(), 4u);
  EXPECT_GE(Job("b").nodes.size(), 1u);
  EXPECT_GE(Job("a").nodes.size(), 1u);
  EXPECT_EQ(Job("a").RuntimeId(), "a.i1");
  EXPECT_EQ(Job("b").RuntimeId(), "b.i1");
  // No node is given twice.
  std::set<std::string> seen;
  for (const Assignment& as : p2.assignments) EXPECT_TRUE(seen.insert(as.node).second);
}

// Held node time: productive while the rank is a member where the plan wants
// it; starting, warming and draining otherwise (the demo's case: a joiner
// still warming when its job completes holds the node without training).
TEST_F(AllocatorStateTest, HeldTimeIsSplitIntoProductiveStartingWarmingAndDraining) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Register("n1").status());
  ASSERT_OK(Submit("a", 1, 2).status());
  DecideAndAdopt(kT0);  // a on n0 and n1 from t=0
  ASSERT_THAT(Job("a").nodes, ElementsAre("n0", "n1"));
  const absl::Time t = kT0;
  // n0: rank started at 1 s (starting 0..1), a member at 3 s (warming 1..3).
  ASSERT_OK(Heartbeat("n0", t + absl::Seconds(1), "a.i1", RankPhase::kStarting));
  ASSERT_OK(Heartbeat("n0", t + absl::Seconds(4), "a.i1", RankPhase::kTraining, t + absl::Seconds(3)));
  // n1: its rank starts at 2 s and is still warming at 10 s.
  ASSERT_OK(Heartbeat("n1", t + absl::Seconds(2), "a.i1", RankPhase::kStarting));
  // The same phase again changes nothing that was accounted.
  ASSERT_OK(Heartbeat("n1", t + absl::Seconds(6), "a.i1", RankPhase::kStarting, t + absl::Seconds(2)));
  HeldSeconds h = state_.HeldOf("a", t + absl::Seconds(10));
  EXPECT_DOUBLE_EQ(h.starting, 1 + 2);      // n0 0..1, n1 0..2
  EXPECT_DOUBLE_EQ(h.warming, 2 + 8);       // n0 1..3, n1 2..10
  EXPECT_DOUBLE_EQ(h.productive, 7);        // n0 3..10
  EXPECT_DOUBLE_EQ(h.draining, 0);
  EXPECT_DOUBLE_EQ(h.held(), 20);           // two nodes for 10 s
  // a completes at 10 s; the plan frees both nodes at 10.2 s. n0's member
  // finishes (draining until its heartbeat without a rank at 11 s), n1's
  // warming joiner drains until 10.5 s.
  JobComplete done;
  done.job = "a";
  ASSERT_OK(state_.Apply(From("a.m0", done), t + absl::Seconds(10)).status());
  DecideAndAdopt(t + absl::Milliseconds(10200));
  ASSERT_OK(Heartbeat("n1", t + absl::Milliseconds(10500)));
  ASSERT_OK(Heartbeat("n0", t + absl::Seconds(11)));
  h = state_.HeldOf("a", t + absl::Seconds(20));
  EXPECT_DOUBLE_EQ(h.productive, 7);
  EXPECT_DOUBLE_EQ(h.warming, 10);
  EXPECT_NEAR(h.draining, 1.0 + 0.5, 1e-9);  // n0 10..11, n1 10..10.5: ended jobs drain
  const HeldSeconds total = state_.HeldTotal(t + absl::Seconds(20));
  EXPECT_DOUBLE_EQ(total.held(), h.held());  // nothing held after that
  nlohmann::json status = nlohmann::json::parse(state_.StatusJson(t + absl::Seconds(20)));
  EXPECT_NEAR(status["held"]["held_idle_node_s"].get<double>(), h.idle(), 1e-9);
  EXPECT_NEAR(status["held"]["held_idle_pct"].get<double>(), 100 * h.idle() / h.held(), 1e-9);
  EXPECT_EQ(status["jobs"][0]["held_nodes"], 0);
}

TEST_F(AllocatorStateTest, ANewIncarnationNeverBootstrapsOnADrainingNode) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Register("n1").status());
  ASSERT_OK(Submit("old", 1, 1).status());
  DecideAndAdopt();
  ASSERT_THAT(Job("old").nodes, ElementsAre("n0"));
  // n0 still runs old's rank (it is finishing) when old completes and b starts on both nodes.
  ASSERT_OK(Heartbeat("n0", kT0 + absl::Seconds(1), "old.i1"));
  JobComplete done;
  done.job = "old";
  ASSERT_OK(state_.Apply(From("old.m0", done), kT0 + absl::Seconds(2)).status());
  ASSERT_OK(Submit("b", 2, 2, kT0 + absl::Seconds(2)).status());
  AllocationPlan p = DecideAndAdopt(kT0 + absl::Seconds(2));
  ASSERT_THAT(Job("b").nodes, ElementsAre("n0", "n1"));
  ASSERT_THAT(p.launches, SizeIs(1));
  EXPECT_EQ(p.launches[0].bootstrap_node, "n1");  // not n0, whose old rank still drains
  // n0's time counts for the job whose rank drains there (from old's end at
  // 2 s), n1's as b's start.
  EXPECT_DOUBLE_EQ(state_.HeldOf("old", kT0 + absl::Seconds(3)).draining, 1);
  EXPECT_DOUBLE_EQ(state_.HeldOf("old", kT0 + absl::Seconds(3)).productive, 1);  // 1..2 s
  EXPECT_DOUBLE_EQ(state_.HeldOf("b", kT0 + absl::Seconds(3)).starting, 1);
}

TEST_F(AllocatorStateTest, AShrinkingJobGivesBackItsWarmingNodeNotItsMember) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Register("n1").status());
  ASSERT_OK(Submit("a", 1, 2).status());
  DecideAndAdopt();
  ASSERT_THAT(Job("a").nodes, ElementsAre("n0", "n1"));
  // n0's rank trains, n1's warms up; then b comes and a shrinks to one node.
  // (Left to itself the policy releases n0: equal windows, lower index first.)
  ASSERT_OK(Heartbeat("n0", kT0 + absl::Seconds(1), "a.i1", RankPhase::kTraining));
  ASSERT_OK(Heartbeat("n1", kT0 + absl::Seconds(1), "a.i1", RankPhase::kStarting));
  ASSERT_OK(Submit("b", 1, 1, kT0 + absl::Seconds(2)).status());
  DecideAndAdopt(kT0 + absl::Seconds(2));
  EXPECT_THAT(Job("a").nodes, ElementsAre("n0"));  // the member stays
  EXPECT_THAT(Job("b").nodes, ElementsAre("n1"));
}

// Before its first member trains, an incarnation's bootstrap node is what
// its other ranks wait for: a shrink gives back a joiner's node instead.
TEST_F(AllocatorStateTest, AShrinkKeepsTheBootstrapNodeOfAnIncarnationThatHasNotFormed) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Register("n1").status());
  ASSERT_OK(Submit("a", 1, 2).status());
  AllocationPlan p1 = DecideAndAdopt();
  ASSERT_THAT(Job("a").nodes, ElementsAre("n0", "n1"));
  ASSERT_EQ(p1.launches[0].bootstrap_node, "n0");
  // Both ranks still warm up when b comes; left to itself the policy releases n0.
  ASSERT_OK(Heartbeat("n0", kT0 + absl::Seconds(1), "a.i1", RankPhase::kStarting));
  ASSERT_OK(Heartbeat("n1", kT0 + absl::Seconds(1), "a.i1", RankPhase::kStarting));
  ASSERT_OK(Submit("b", 1, 1, kT0 + absl::Seconds(2)).status());
  DecideAndAdopt(kT0 + absl::Seconds(2));
  EXPECT_THAT(Job("a").nodes, ElementsAre("n0"));
  EXPECT_THAT(Job("b").nodes, ElementsAre("n1"));
  EXPECT_EQ(Job("a").RuntimeId(), "a.i1");
}

TEST_F(AllocatorStateTest, ARunningJobIsNotStoppedForAnotherButWaitersAre) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Submit("first", 1, 1).status());
  DecideAndAdopt();
  ASSERT_EQ(Job("first").phase, JobPhase::kRunning);
  // A job worth 100x more per node: without the stop penalty it would take n0.
  ASSERT_OK(Submit("rich", 1, 1).status());
  ASSERT_OK_AND_ASSIGN(Applied r, state_.Apply(From("rich.m0", RichReport()), kT0));
  EXPECT_TRUE(r.needs_decision);  // its curve is 100x the prior
  DecideAndAdopt();
  EXPECT_THAT(Job("first").nodes, ElementsAre("n0"));
  EXPECT_EQ(Job("rich").phase, JobPhase::kQueued);
}

// --- parking (issue 22) ---------------------------------------------------------------------------

JobSaved Saved(const std::string& job, const std::string& runtime_id, int64_t step, double write_s,
               SaveKind kind = SaveKind::kPark) {
  return JobSaved{job, runtime_id, kind, step, 1 << 20, absl::Milliseconds(std::llround(write_s * 1e3))};
}

nlohmann::json JobStatusOf(const AllocatorState& state, const std::string& job, absl::Time now) {
  const nlohmann::json status = nlohmann::json::parse(state.StatusJson(now));
  for (const nlohmann::json& j : status["jobs"]) {
    if (j["job"] == job) return j;
  }
  return nullptr;
}

// The SIGTERM / preemption case: the plan still gives the job its nodes when
// its last member parks and exits 0. That exit is not the job's success; the
// job is queued with its state parked, and starts again (a new incarnation)
// only once no rank of it runs any more.
TEST_F(AllocatorStateTest, AParkQueuesTheJobAndTheRankExitingZeroAfterItIsNotSuccess) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Register("n1").status());
  ASSERT_OK(Submit("a", 1, 2).status());
  DecideAndAdopt();
  ASSERT_THAT(Job("a").nodes, ElementsAre("n0", "n1"));
  ASSERT_OK(Heartbeat("n0", kT0 + absl::Seconds(1), "a.i1"));
  ASSERT_OK(Heartbeat("n1", kT0 + absl::Seconds(1), "a.i1", RankPhase::kStarting));

  const absl::Time t_park = kT0 + absl::Seconds(5);
  ASSERT_OK_AND_ASSIGN(Applied parked, state_.Apply(From("rank.n0-m", Saved("a", "a.i1", 40, 0.5)), t_park));
  EXPECT_TRUE(parked.needs_decision);
  EXPECT_TRUE(parked.journal);
  EXPECT_THAT(parked.what, HasSubstr("parked at step 40"));
  EXPECT_EQ(Job("a").phase, JobPhase::kQueued);
  EXPECT_TRUE(Job("a").parked);
  EXPECT_THAT(Job("a").nodes, IsEmpty());
  EXPECT_FALSE(state_.nodes().at("n0").planned.has_value());
  EXPECT_EQ(Job("a").step, 40);
  EXPECT_EQ(state_.parks(), 1);

  // The parked rank exits 0 by itself (its agent did not ask it to).
  RankExit exit0{"n0", "a.i1", "n0-m", 0, 0, RankExitCause::kExited};
  ASSERT_OK(state_.Apply(From(Agent("n0"), exit0), t_park + absl::Seconds(1)).status());
  EXPECT_EQ(Job("a").phase, JobPhase::kQueued) << Job("a").message;

  // n1 still runs a rank of a.i1: the job is not started again until it ends.
  for (const alloc::JobSpec& j : state_.BuildProblem(t_park + absl::Seconds(1)).jobs) {
    EXPECT_NE(j.id, "a") << "started while a rank of it still runs";
  }
  RankExit stopped{"n1", "a.i1", "n1-m", 0, 15, RankExitCause::kStopped};
  ASSERT_OK_AND_ASSIGN(Applied freed, state_.Apply(From(Agent("n1"), stopped), t_park + absl::Seconds(2)));
  EXPECT_TRUE(freed.needs_decision);
  const nlohmann::json st = JobStatusOf(state_, "a", t_park + absl::Seconds(2));
  EXPECT_EQ(st["phase"], "parked");
  EXPECT_EQ(st["step"], 40);
  EXPECT_EQ(st["parks"], 1);
  EXPECT_EQ(st["park"]["step"], 40);
  EXPECT_DOUBLE_EQ(st["park"]["park_s"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(st["park"]["unpark_s"].get<double>(), 0.5);  // estimated: as long as the write
  EXPECT_EQ(st["park"]["unpark_measured"], false);
  EXPECT_DOUBLE_EQ(st["saved"]["age_s"].get<double>(), 2.0);

  // Resumed: a new incarnation; the unpark is measured up to its first member training.
  AllocationPlan p = DecideAndAdopt(t_park + absl::Seconds(2));
  EXPECT_EQ(Job("a").phase, JobPhase::kRunning);
  EXPECT_FALSE(Job("a").parked);
  ASSERT_THAT(p.launches, SizeIs(1));
  EXPECT_EQ(p.launches[0].runtime_id, "a.i2");
  ASSERT_OK(Heartbeat(Job("a").nodes[0], t_park + absl::Seconds(9), "a.i2", RankPhase::kTraining,
                      t_park + absl::Seconds(8)));
  ASSERT_TRUE(Job("a").UnparkSeconds().has_value());
  EXPECT_DOUBLE_EQ(*Job("a").UnparkSeconds(), 6.0);
  EXPECT_EQ(JobStatusOf(state_, "a", t_park + absl::Seconds(9))["phase"], "running");
}

TEST_F(AllocatorStateTest, AParkOfAnOlderIncarnationOrASnapshotChangesNoPhase) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Submit("a", 1, 1).status());
  DecideAndAdopt();
  ASSERT_EQ(Job("a").RuntimeId(), "a.i1");
  ASSERT_OK_AND_ASSIGN(Applied snap,
                       state_.Apply(From("rank.m", Saved("a", "a.i1", 20, 0.1, SaveKind::kSnapshot)), kT0));
  EXPECT_FALSE(snap.journal);
  EXPECT_FALSE(snap.needs_decision);
  EXPECT_EQ(Job("a").phase, JobPhase::kRunning);
  EXPECT_FALSE(Job("a").ParkSeconds().has_value());  // a snapshot is no park
  nlohmann::json st = JobStatusOf(state_, "a", kT0 + absl::Seconds(3));
  EXPECT_EQ(st["saved"]["kind"], "snapshot");
  EXPECT_EQ(st["saved"]["step"], 20);
  EXPECT_DOUBLE_EQ(st["saved"]["age_s"].get<double>(), 3.0);
  EXPECT_EQ(st["park"], nullptr);

  ASSERT_OK_AND_ASSIGN(Applied old, state_.Apply(From("rank.m", Saved("a", "a.i0", 7, 2.0)), kT0));
  EXPECT_THAT(old.what, HasSubstr("not its current incarnation"));
  EXPECT_EQ(Job("a").phase, JobPhase::kRunning);
  EXPECT_THAT(Job("a").nodes, ElementsAre("n0"));
  EXPECT_FALSE(Job("a").parked);
  ASSERT_TRUE(Job("a").ParkSeconds().has_value());
  EXPECT_DOUBLE_EQ(*Job("a").ParkSeconds(), 2.0);  // the cost is still a measurement

  // An unknown or ended job's park is refused naming it.
  EXPECT_THAT(state_.Apply(From("rank.m", Saved("nope", "nope.i1", 1, 0.1)), kT0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  ASSERT_OK(state_.Apply(From("a.m", JobComplete{"a", JobStatus::kSucceeded, 10, 10, ""}), kT0).status());
  EXPECT_THAT(state_.Apply(From("rank.m", Saved("a", "a.i1", 1, 0.1)), kT0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("has ended")));
}

// A job that has parked is priced at its measured park + unpark cost: the
// rich job of ARunningJobIsNotStoppedForAnotherButWaitersAre now gets the node.
TEST_F(AllocatorStateTest, AJobThatCanParkIsPricedAtItsMeasuredCostNotTheFlatPenalty) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Submit("first", 1, 1).status());
  DecideAndAdopt();
  alloc::Problem before = state_.BuildProblem(kT0);
  ASSERT_THAT(before.jobs, SizeIs(1));
  EXPECT_GT(before.jobs[0].stop_penalty, 100.0);  // never parked: it would lose everything
  // It parked once (0.25 s) and runs again.
  ASSERT_OK(state_.Apply(From("rank.m", Saved("first", "first.i1", 40, 0.25)), kT0).status());
  DecideAndAdopt(kT0 + absl::Seconds(1));
  ASSERT_EQ(Job("first").RuntimeId(), "first.i2");
  alloc::Problem p = state_.BuildProblem(kT0 + absl::Seconds(1));
  ASSERT_THAT(p.jobs, SizeIs(1));
  // 1 sample/s (the prior at one node) x (0.25 s park + 0.25 s unpark).
  EXPECT_DOUBLE_EQ(p.jobs[0].stop_penalty, 0.5);

  ASSERT_OK(Submit("rich", 1, 1, kT0 + absl::Seconds(1)).status());
  ASSERT_OK(state_.Apply(From("rich.m0", RichReport()), kT0 + absl::Seconds(1)).status());
  DecideAndAdopt(kT0 + absl::Seconds(1));
  EXPECT_THAT(Job("rich").nodes, ElementsAre("n0"));
  EXPECT_EQ(Job("first").phase, JobPhase::kQueued);
  // A parked job's start pays its unpark.
  for (const alloc::JobSpec& j : state_.BuildProblem(kT0 + absl::Seconds(1)).jobs) {
    if (j.id == "first") EXPECT_GE(j.resize_up_pause, absl::Milliseconds(250));
  }
}

TEST_F(AllocatorStateTest, ReplayKeepsAParkedJobParked) {
  std::vector<Envelope> log;
  auto apply = [&](Envelope e, absl::Time now) {
    ASSERT_OK_AND_ASSIGN(Applied a, state_.Apply(e, now));
    if (a.journal) log.push_back(std::move(e));
  };
  for (const char* n : {"n0", "n1"}) {
    NodeRegister r;
    r.node = n;
    r.agent = Agent(n);
    apply(From(r.agent, r), kT0);
  }
  JobSubmit s;
  s.job = "a";
  s.command = {"x"};
  s.max_nodes = 2;
  apply(From("client", s), kT0);
  AllocationPlan p1 = DecideAndAdopt();
  const size_t before_park = log.size();
  apply(From("rank.m", Saved("a", "a.i1", 40, 0.5)), kT0 + absl::Seconds(1));
  apply(From(Agent("n0"), RankExit{"n0", "a.i1", "m", 0, 0, RankExitCause::kExited}), kT0 + absl::Seconds(2));
  ASSERT_EQ(Job("a").phase, JobPhase::kQueued);

  AllocatorState replayed;
  for (size_t i = 0; i < log.size(); ++i) {
    const absl::Time at = i < before_park ? kT0 : i == before_park ? kT0 + absl::Seconds(1) : kT0 + absl::Seconds(2);
    ASSERT_OK(replayed.Apply(log[i], at).status());
    if (i + 1 == before_park) ASSERT_OK(replayed.Restore(p1));
  }
  const JobRecord& a = replayed.jobs().at("a");
  EXPECT_EQ(a.phase, JobPhase::kQueued);
  EXPECT_TRUE(a.parked);
  EXPECT_THAT(a.nodes, IsEmpty());
  EXPECT_EQ(a.step, 40);
  EXPECT_EQ(replayed.parks(), 1);
  const absl::Time now = kT0 + absl::Seconds(3);
  EXPECT_EQ(JobStatusOf(replayed, "a", now), JobStatusOf(state_, "a", now));
}

TEST_F(AllocatorStateTest, ASecondAgentForALiveNodeIsRefusedUntilTheFirstIsSilent) {
  ASSERT_OK(Register("n0").status());
  EXPECT_THAT(Register("n0", kT0 + absl::Seconds(1), "agent.intruder"),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("already registered by agent 'agent.n0'")));
  // The same agent again is idempotent.
  ASSERT_OK_AND_ASSIGN(Applied again, Register("n0", kT0 + absl::Seconds(2)));
  EXPECT_FALSE(again.needs_decision);
  EXPECT_FALSE(again.journal);
  // After the heartbeat timeout (15 s) of silence another agent may take over.
  const absl::Time later = kT0 + absl::Seconds(2) + absl::Seconds(16);
  ASSERT_OK(Register("n0", later, "agent.replacement").status());
  EXPECT_EQ(state_.nodes().at("n0").agent, "agent.replacement");
}

TEST_F(AllocatorStateTest, AgentsSpeakOnlyForTheirOwnNodes) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Register("n1").status());
  NodeReclaim r{"n1", absl::Seconds(5), "not mine"};
  EXPECT_THAT(state_.Apply(From(Agent("n0"), r), kT0),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("belongs to agent 'agent.n1'")));
  NodeRegister forged;
  forged.node = "n2";
  forged.agent = "agent.n2";
  EXPECT_THAT(state_.Apply(From("agent.n0", forged), kT0),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("must be the sender")));
  EXPECT_THAT(state_.Apply(From(Agent("n9"), AgentHeartbeat{"n9", std::nullopt}), kT0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("n9")));
}

TEST_F(AllocatorStateTest, BadRequestsAreRefusedWithTheReason) {
  ASSERT_OK(Submit("a", 1, 2).status());
  EXPECT_THAT(Submit("a", 1, 2), StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("job 'a' already exists")));
  EXPECT_THAT(state_.Apply(From("client", JobCancel{"zz", "x"}), kT0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'zz'")));
  AllocationPlan plan;
  EXPECT_THAT(state_.Apply(From("client", plan), kT0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only the allocator")));
  AdvisorReport bad{"a", R"({"version":1})"};
  EXPECT_THAT(state_.Apply(From("a.m0", bad), kT0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("advisor_report of job 'a'")));
  ASSERT_OK(state_.Apply(From("client", JobCancel{"a", "user"}), kT0).status());
  EXPECT_EQ(Job("a").phase, JobPhase::kCancelled);
  EXPECT_THAT(state_.Apply(From("client", JobCancel{"a", "again"}), kT0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("has ended (cancelled)")));
}

TEST_F(AllocatorStateTest, AReclaimedNodeIsEmptiedByTheNextPlan) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Register("n1").status());
  ASSERT_OK(Submit("a", 1, 2).status());
  DecideAndAdopt();
  ASSERT_THAT(Job("a").nodes, ElementsAre("n0", "n1"));
  ASSERT_OK_AND_ASSIGN(Applied r, state_.Apply(From(Agent("n1"), NodeReclaim{"n1", absl::Seconds(10), "main job"}), kT0));
  EXPECT_TRUE(r.needs_decision);
  EXPECT_EQ(state_.nodes().at("n1").phase, NodePhase::kReclaiming);
  EXPECT_EQ(state_.nodes().at("n1").reclaim_deadline, kT0 + absl::Seconds(10));
  alloc::Problem p = state_.BuildProblem(kT0);
  ASSERT_THAT(p.nodes, SizeIs(1));
  AllocationPlan plan = DecideAndAdopt();
  EXPECT_THAT(Job("a").nodes, ElementsAre("n0"));
  // The reclaimed node is still listed, with no job, until its agent leaves.
  ASSERT_THAT(plan.assignments, SizeIs(2));
  EXPECT_EQ(plan.assignments[1].node, "n1");
  EXPECT_FALSE(plan.assignments[1].job.has_value());
  ASSERT_OK(state_.Apply(From(Agent("n1"), NodeLeave{"n1", "reclaimed"}), kT0).status());
  EXPECT_THAT(DecideAndAdopt().assignments, SizeIs(1));
}

// The reclaim rate the objective prices (reclaim_hazard): the main
// scheduler's reclaims per node-second offered, from the allocator's own
// history, and rebuilt the same by a replay of the same messages.
TEST(ReclaimHistoryTest, ReclaimsPerOfferedNodeSecond) {
  AllocatorStateOptions o;
  o.reclaim_hazard = true;
  o.heartbeat_timeout = absl::Hours(10);
  std::vector<std::pair<Envelope, absl::Time>> log;
  uint64_t seq = 0;
  auto message = [&](const std::string& sender, Message m, absl::Time at) {
    Envelope e;
    e.sender = sender;
    e.seq = ++seq;
    e.ts = at;
    e.message = std::move(m);
    log.emplace_back(e, at);
  };
  for (const char* n : {"n0", "n1"}) {
    NodeRegister r;
    r.node = n;
    r.agent = absl::StrCat("agent.", n);
    message(r.agent, r, kT0);
  }
  // n1 is reclaimed after 100 s and leaves at 110 s; n0 stays.
  message("agent.n1", NodeReclaim{"n1", absl::Seconds(10), "main job"}, kT0 + absl::Seconds(100));
  message("agent.n1", NodeLeave{"n1", "reclaimed"}, kT0 + absl::Seconds(110));
  // A node withdrawn by its operator is no reclaim.
  NodeRegister r2;
  r2.node = "n2";
  r2.agent = "agent.n2";
  message("agent.n2", r2, kT0 + absl::Seconds(200));
  message("agent.n2", NodeLeave{"n2", "operator"}, kT0 + absl::Seconds(250));
  for (int replay = 0; replay < 2; ++replay) {
    AllocatorState state(o);
    for (const auto& [e, at] : log) ASSERT_OK(state.Apply(e, at).status());
    const absl::Time now = kT0 + absl::Seconds(300);
    // Offered: n0 300 s, n1 100 s (until its reclaim), n2 50 s.
    EXPECT_EQ(state.reclaims_seen(), 1);
    EXPECT_DOUBLE_EQ(state.ReclaimRate(now), 1.0 / 450);
    EXPECT_DOUBLE_EQ(state.BuildProblem(now).reclaim_rate, 1.0 / 450);
    const nlohmann::json status = nlohmann::json::parse(state.StatusJson(now));
    EXPECT_EQ(status["reclaims"]["seen"], 1);
    EXPECT_DOUBLE_EQ(status["reclaims"]["per_node_hour"].get<double>(), 3600.0 / 450);
  }
  // Off (the default): the problem carries no rate.
  AllocatorState plain;
  for (const auto& [e, at] : log) ASSERT_OK(plain.Apply(e, at).status());
  EXPECT_EQ(plain.BuildProblem(kT0 + absl::Seconds(300)).reclaim_rate, 0);
}

TEST_F(AllocatorStateTest, JobsEndByCompletionByAnExitZeroOrByRepeatedCrashes) {
  for (const char* n : {"n0", "n1", "n2"}) ASSERT_OK(Register(n).status());
  ASSERT_OK(Submit("done", 1, 1).status());
  ASSERT_OK(Submit("exits", 1, 1).status());
  ASSERT_OK(Submit("crashes", 1, 1).status());
  DecideAndAdopt();
  for (const char* j : {"done", "exits", "crashes"}) ASSERT_THAT(Job(j).nodes, SizeIs(1)) << j;
  ASSERT_OK(state_.Apply(From("done.m", JobComplete{"done", JobStatus::kSucceeded, 10, 640, ""}), kT0).status());
  EXPECT_EQ(Job("done").phase, JobPhase::kSucceeded);
  EXPECT_EQ(Job("done").samples, 640);

  const std::string exits_node = Job("exits").nodes[0];
  // A rank that left on request does not end the job; one that exits 0 by itself does.
  RankExit left{exits_node, "exits.i1", "m1", 0, 0, RankExitCause::kLeft};
  ASSERT_OK(state_.Apply(From(Agent(exits_node), left), kT0).status());
  EXPECT_EQ(Job("exits").phase, JobPhase::kRunning);
  RankExit ended{exits_node, "exits.i1", "m1", 0, 0, RankExitCause::kExited};
  ASSERT_OK_AND_ASSIGN(Applied a, state_.Apply(From(Agent(exits_node), ended), kT0));
  EXPECT_TRUE(a.needs_decision);
  EXPECT_EQ(Job("exits").phase, JobPhase::kSucceeded);
  // An exit of an older incarnation is ignored.
  const std::string crash_node = Job("crashes").nodes[0];
  RankExit stale{crash_node, "crashes.i0", "m0", 1, 0, RankExitCause::kExited};
  ASSERT_OK(state_.Apply(From(Agent(crash_node), stale), kT0).status());
  EXPECT_EQ(Job("crashes").rank_failures, 0);
  for (int i = 1; i <= 3; ++i) {
    RankExit crash{crash_node, "crashes.i1", absl::StrCat("m", i), 0, 11, RankExitCause::kExited};
    ASSERT_OK(state_.Apply(From(Agent(crash_node), crash), kT0).status());
    EXPECT_EQ(Job("crashes").rank_failures, i);
  }
  EXPECT_EQ(Job("crashes").phase, JobPhase::kFailed);
  EXPECT_THAT(Job("crashes").message, HasSubstr("signal 11"));
  // Ended jobs hold no node after the next plan.
  AllocationPlan p = DecideAndAdopt();
  EXPECT_THAT(p.launches, IsEmpty());
  for (const Assignment& as : p.assignments) EXPECT_FALSE(as.job.has_value()) << as.node;
}

// The chaos campaign's case: kill -9 of a rank now and then, the job
// recovering and training on in between, must not fail the job; a program
// that crashes again before committing any step still fails after three.
TEST_F(AllocatorStateTest, OnlyRankFailuresInARowWithoutProgressFailAJob) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Submit("a", 1, 1).status());
  DecideAndAdopt();
  auto crash = [&](int i) {
    RankExit c{"n0", "a.i1", absl::StrCat("m", i), 0, 9, RankExitCause::kExited};
    return state_.Apply(From(Agent("n0"), c), kT0 + absl::Seconds(i)).status();
  };
  auto progress = [&](int64_t step, int i) {
    return state_.Apply(From("a.m", Saved("a", "a.i1", step, 0.1, SaveKind::kSnapshot)),
                        kT0 + absl::Seconds(i)).status();
  };
  ASSERT_OK(crash(1));
  ASSERT_OK(progress(10, 2));
  ASSERT_OK(crash(3));
  ASSERT_OK(progress(20, 4));
  ASSERT_OK(crash(5));
  ASSERT_OK(progress(30, 6));
  ASSERT_OK(crash(7));
  EXPECT_EQ(Job("a").phase, JobPhase::kRunning);
  EXPECT_EQ(Job("a").rank_failures, 4);
  EXPECT_EQ(Job("a").failures_in_a_row, 1);
  ASSERT_OK(crash(8));
  ASSERT_OK(progress(30, 9));  // no new step
  ASSERT_OK(crash(10));
  EXPECT_EQ(Job("a").phase, JobPhase::kFailed);
  EXPECT_EQ(Job("a").rank_failures, 6);
  EXPECT_THAT(Job("a").message, HasSubstr("3 rank failures with no step committed between them (at step 30)"));
}

// The chaos campaign's second run: the allocator, killed and restarted from its
// journal, failed a job the live service had kept, because the snapshots that
// had ended its runs of failures were not journaled. They are when they do.
TEST_F(AllocatorStateTest, AReplayCountsRankFailuresInARowAsTheLiveServiceDid) {
  std::vector<Envelope> journal;
  auto apply = [&](Envelope e, absl::Time now) {
    absl::StatusOr<Applied> a = state_.Apply(e, now);
    ASSERT_OK(a.status());
    if (a->journal) journal.push_back(e);
  };
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Submit("a", 1, 1).status());
  AllocationPlan plan = DecideAndAdopt();
  for (int i = 1; i <= 6; ++i) {
    apply(From(Agent("n0"), RankExit{"n0", "a.i1", absl::StrCat("m", i), 0, 9, RankExitCause::kExited}),
          kT0 + absl::Seconds(2 * i));
    apply(From("a.m", Saved("a", "a.i1", 10 * i, 0.1, SaveKind::kSnapshot)), kT0 + absl::Seconds(2 * i + 1));
  }
  ASSERT_EQ(Job("a").phase, JobPhase::kRunning);
  ASSERT_EQ(Job("a").failures_in_a_row, 1);
  AllocatorState replayed;
  NodeRegister r{"n0", Agent("n0")};
  ASSERT_OK(replayed.Apply(From(Agent("n0"), r), kT0).status());
  JobSubmit sub;
  sub.job = "a";
  sub.command = {"python", "train.py"};
  sub.min_nodes = sub.max_nodes = 1;
  ASSERT_OK(replayed.Apply(From("client", sub), kT0).status());
  ASSERT_OK(replayed.Restore(plan));
  for (const Envelope& e : journal) ASSERT_OK(replayed.Apply(e, e.ts).status());
  EXPECT_EQ(replayed.jobs().at("a").phase, JobPhase::kRunning);
  EXPECT_EQ(replayed.jobs().at("a").failures_in_a_row, 1);
  EXPECT_EQ(replayed.jobs().at("a").rank_failures, 6);
}

TEST_F(AllocatorStateTest, SilentAgentsAreWithdrawn) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Register("n1").status());
  ASSERT_OK(state_.Apply(From(Agent("n1"), AgentHeartbeat{"n1", std::nullopt}), kT0 + absl::Seconds(10))
                .status());
  EXPECT_THAT(state_.Expire(kT0 + absl::Seconds(14)), IsEmpty());
  std::vector<std::string> gone = state_.Expire(kT0 + absl::Seconds(16));
  ASSERT_THAT(gone, SizeIs(1));
  EXPECT_THAT(gone[0], HasSubstr("n0"));
  EXPECT_EQ(state_.nodes().at("n0").phase, NodePhase::kGone);
  EXPECT_THAT(state_.BuildProblem(kT0 + absl::Seconds(16)).nodes, SizeIs(1));
  // TouchAll (after a restart) gives every live agent a full timeout again.
  state_.TouchAll(kT0 + absl::Seconds(100));
  EXPECT_THAT(state_.Expire(kT0 + absl::Seconds(110)), IsEmpty());
}

// --- incarnations no rank holds (issue 26's chaos campaign, the demo under load) -----------------

// The demo's case: the bootstrap node is reclaimed while its rank is still
// warming up (stopped at once: not a member); the job's other ranks are
// joiners that would wait for a leader that never comes, and, 60 s later,
// exit 1 three times: the job failed. Now the incarnation is lost after
// heartbeat_timeout (15 s), its joiners are stopped by the next plan, and a
// new incarnation starts with a new bootstrap.
TEST_F(AllocatorStateTest, ABootstrapThatEndsBeforeTheJobFormedLosesTheIncarnation) {
  for (const char* n : {"n0", "n1", "n2"}) ASSERT_OK(Register(n).status());
  ASSERT_OK(Submit("a", 1, 3).status());
  AllocationPlan p1 = DecideAndAdopt();
  ASSERT_THAT(Job("a").nodes, ElementsAre("n0", "n1", "n2"));
  ASSERT_EQ(p1.launches[0].bootstrap_node, "n0");
  const absl::Time t = kT0;
  for (const char* n : {"n0", "n1", "n2"}) ASSERT_OK(Heartbeat(n, t + absl::Seconds(1), "a.i1", RankPhase::kStarting));
  EXPECT_THAT(state_.Expire(t + absl::Seconds(1)), IsEmpty());
  // n0 is reclaimed: the next plan moves a off it; its warming rank is stopped.
  ASSERT_OK(state_.Apply(From(Agent("n0"), NodeReclaim{"n0", absl::Seconds(5), "main job"}), t + absl::Seconds(2))
                .status());
  DecideAndAdopt(t + absl::Seconds(2));
  ASSERT_THAT(Job("a").nodes, ElementsAre("n1", "n2"));
  ASSERT_EQ(Job("a").RuntimeId(), "a.i1");
  ASSERT_OK(state_.Apply(From(Agent("n0"), RankExit{"n0", "a.i1", "n0-m", 0, 9, RankExitCause::kStopped}),
                         t + absl::Seconds(2))
                .status());
  ASSERT_OK(state_.Apply(From(Agent("n0"), NodeLeave{"n0", "reclaimed"}), t + absl::Seconds(3)).status());
  // The joiners on n1 and n2 keep warming (waiting for the bootstrap).
  for (int s = 5; s <= 15; s += 5) {
    for (const char* n : {"n1", "n2"}) ASSERT_OK(Heartbeat(n, t + absl::Seconds(s), "a.i1", RankPhase::kStarting));
    EXPECT_THAT(state_.Expire(t + absl::Seconds(s)), IsEmpty()) << s;
  }
  EXPECT_EQ(Job("a").phase, JobPhase::kRunning);
  for (const char* n : {"n1", "n2"}) ASSERT_OK(Heartbeat(n, t + absl::Seconds(17), "a.i1", RankPhase::kStarting));
  std::vector<std::string> changed = state_.Expire(t + absl::Seconds(17));
  ASSERT_THAT(changed, SizeIs(1));
  EXPECT_THAT(changed[0], HasSubstr("incarnation a.i1 lost (its bootstrap rank ended"));
  EXPECT_EQ(Job("a").phase, JobPhase::kQueued);
  EXPECT_THAT(Job("a").nodes, IsEmpty());
  EXPECT_EQ(state_.lost_incarnations(), 1);
  // Not restarted while its joiners still run: the plan takes their nodes away.
  AllocationPlan p2 = DecideAndAdopt(t + absl::Seconds(17));
  EXPECT_THAT(p2.launches, IsEmpty());
  for (const Assignment& as : p2.assignments) EXPECT_FALSE(as.job.has_value()) << as.node;
  for (const char* n : {"n1", "n2"}) {
    ASSERT_OK(state_.Apply(From(Agent(n), RankExit{n, "a.i1", std::string(n) + "-m", 0, 9, RankExitCause::kStopped}),
                           t + absl::Seconds(18))
                  .status());
  }
  AllocationPlan p3 = DecideAndAdopt(t + absl::Seconds(18));
  ASSERT_THAT(p3.launches, SizeIs(1));
  EXPECT_EQ(p3.launches[0].runtime_id, "a.i2");
  EXPECT_EQ(Job("a").phase, JobPhase::kRunning);
  EXPECT_EQ(Job("a").rank_failures, 0);  // stopped joiners are not failures
}

// The chaos campaign's case: every member dies (their agents were killed) and
// the nodes, still planned for the job, run joiners of the incarnation.
TEST_F(AllocatorStateTest, AnIncarnationWhoseMembersAllDiedIsReplaced) {
  for (const char* n : {"n0", "n1"}) ASSERT_OK(Register(n).status());
  ASSERT_OK(Submit("a", 1, 2).status());
  DecideAndAdopt();
  const absl::Time t = kT0;
  for (const char* n : {"n0", "n1"}) ASSERT_OK(Heartbeat(n, t + absl::Seconds(1), "a.i1", RankPhase::kTraining));
  EXPECT_THAT(state_.Expire(t + absl::Seconds(1)), IsEmpty());
  EXPECT_TRUE(Job("a").formed);
  for (const char* n : {"n0", "n1"}) {
    ASSERT_OK(state_.Apply(From(Agent(n), RankExit{n, "a.i1", std::string(n) + "-m", 0, 9, RankExitCause::kExited}),
                           t + absl::Seconds(2))
                  .status());
  }
  EXPECT_EQ(Job("a").rank_failures, 2);
  for (int s = 3; s <= 16; ++s) {
    for (const char* n : {"n0", "n1"}) ASSERT_OK(Heartbeat(n, t + absl::Seconds(s), "a.i1", RankPhase::kStarting));
    EXPECT_THAT(state_.Expire(t + absl::Seconds(s)), IsEmpty()) << s;
  }
  for (const char* n : {"n0", "n1"}) ASSERT_OK(Heartbeat(n, t + absl::Seconds(17), "a.i1", RankPhase::kStarting));
  std::vector<std::string> changed = state_.Expire(t + absl::Seconds(17));
  ASSERT_THAT(changed, SizeIs(1));
  EXPECT_THAT(changed[0], HasSubstr("incarnation a.i1 lost (every member of it is gone)"));
  EXPECT_EQ(Job("a").phase, JobPhase::kQueued);
  EXPECT_THAT(JobStatusOf(state_, "a", t + absl::Seconds(17))["message"].get<std::string>(),
              HasSubstr("from the job's newest saved state"));
}

// What must not be taken for a lost incarnation: a bootstrap that warms up
// for a long time, joiners warming while a member trains, and the moment of a
// hand-over (the old member gone, the joiner not yet reported training).
TEST_F(AllocatorStateTest, AWarmingBootstrapOrOneTrainingMemberKeepsTheIncarnation) {
  for (const char* n : {"n0", "n1"}) ASSERT_OK(Register(n).status());
  ASSERT_OK(Submit("a", 1, 2).status());
  DecideAndAdopt();
  const absl::Time t = kT0;
  for (int s = 1; s <= 60; ++s) {  // the bootstrap warms up for a minute
    for (const char* n : {"n0", "n1"}) ASSERT_OK(Heartbeat(n, t + absl::Seconds(s), "a.i1", RankPhase::kStarting));
    ASSERT_THAT(state_.Expire(t + absl::Seconds(s)), IsEmpty()) << s;
  }
  for (int s = 61; s <= 100; ++s) {  // n0 trains, n1 still warms
    ASSERT_OK(Heartbeat("n0", t + absl::Seconds(s), "a.i1", RankPhase::kTraining));
    ASSERT_OK(Heartbeat("n1", t + absl::Seconds(s), "a.i1", RankPhase::kStarting));
    ASSERT_THAT(state_.Expire(t + absl::Seconds(s)), IsEmpty()) << s;
  }
  // Hand-over: n0's member left; n1's joiner is reported training 5 s later.
  for (int s = 101; s <= 130; ++s) {
    ASSERT_OK(Heartbeat("n0", t + absl::Seconds(s)));
    ASSERT_OK(Heartbeat("n1", t + absl::Seconds(s), "a.i1", s < 106 ? RankPhase::kStarting : RankPhase::kTraining));
    ASSERT_THAT(state_.Expire(t + absl::Seconds(s)), IsEmpty()) << s;
  }
  EXPECT_EQ(Job("a").phase, JobPhase::kRunning);
  EXPECT_EQ(Job("a").RuntimeId(), "a.i1");
  EXPECT_EQ(state_.lost_incarnations(), 0);
}

TEST_F(AllocatorStateTest, ReplayingMessagesAndPlansRebuildsTheSameState) {
  std::vector<Envelope> log;
  auto apply = [&](Envelope e) {
    ASSERT_OK(state_.Apply(e, kT0).status());
    log.push_back(std::move(e));
  };
  for (const char* n : {"n0", "n1", "n2"}) {
    NodeRegister r;
    r.node = n;
    r.agent = Agent(n);
    apply(From(r.agent, r));
  }
  JobSubmit s;
  s.job = "a";
  s.command = {"x"};
  s.max_nodes = 3;
  apply(From("client", s));
  AllocationPlan p1 = DecideAndAdopt();
  s.job = "b";
  apply(From("client", s));
  AllocationPlan p2 = DecideAndAdopt();

  AllocatorState replayed;
  for (const Envelope& e : log) {
    ASSERT_OK(replayed.Apply(e, kT0).status());
    if (&e == &log[3]) ASSERT_OK(replayed.Restore(p1));
  }
  ASSERT_OK(replayed.Restore(p2));
  // Equal but for what describes the solve itself (a replay does not solve).
  auto state_only = [](const std::string& status) {
    nlohmann::json j = nlohmann::json::parse(status);
    j["last_decision"].erase("solve_ms");
    j["last_decision"].erase("objective");
    return j.dump();
  };
  EXPECT_EQ(state_only(replayed.StatusJson(kT0)), state_only(state_.StatusJson(kT0)));
  EXPECT_EQ(replayed.next_plan_id(), 3);
  AllocationPlan unknown = p2;
  unknown.assignments.push_back({"n9", std::nullopt});
  EXPECT_THAT(replayed.Restore(unknown), StatusIs(absl::StatusCode::kNotFound, HasSubstr("n9")));
}

TEST_F(AllocatorStateTest, StatusNamesEveryNodeAndJob) {
  ASSERT_OK(Register("n0").status());
  ASSERT_OK(Submit("a", 1, 1).status());
  DecideAndAdopt();
  nlohmann::json s = nlohmann::json::parse(state_.StatusJson(kT0));
  ASSERT_EQ(s["nodes"].size(), 1u);
  EXPECT_EQ(s["nodes"][0]["planned"], "a");
  EXPECT_EQ(s["jobs"][0]["phase"], "running");
  EXPECT_EQ(s["jobs"][0]["runtime_id"], "a.i1");
  EXPECT_EQ(s["last_decision"]["plan"], 1);
  EXPECT_EQ(s["last_decision"]["policy"], "dp");
}

// A report of job `job` at `step`, running on `current` nodes, with the
// measured curve `points` (nodes -> samples/s) and an optional probe request.
AdvisorReport ReportOf(const std::string& job, int64_t step, int current,
                       std::vector<std::pair<int, double>> points,
                       std::optional<advisor::ProbeRequest> probe = std::nullopt) {
  advisor::AdvisorReport r;
  r.job = job;
  r.step = step;
  for (const auto& [n, rate] : points) {
    r.sizes_observed.push_back(n);
    advisor::CurvePoint p;
    p.nodes = n;
    p.samples_per_s = rate;
    p.lo = 0.9 * rate;
    p.hi = 1.1 * rate;
    p.efficiency = rate / (n * points[0].second);
    r.curve.push_back(p);
  }
  r.model.fitted = true;
  r.model.configurations = static_cast<int>(points.size());
  r.model.current_nodes = current;
  r.model.efficiency_reference_nodes = 1;
  r.probe = std::move(probe);
  return AdvisorReport{job, advisor::ReportToJson(r)};
}

advisor::ProbeRequest Probe(int nodes, int64_t steps) {
  return advisor::ProbeRequest{nodes, steps, "uncertain at this size"};
}

// A job that measured itself slower on 2 nodes than on 1 runs on 1 node of
// 2; its probe at 2 nodes is granted from the spare node, held across
// decisions until a report at 2 nodes shows the steps done, then the policy
// takes the node back. A second request within the cooldown is not granted.
TEST_F(AllocatorStateTest, ProbesAreGrantedFromSpareNodesAndEndWhenDone) {
  for (const char* n : {"n0", "n1"}) ASSERT_OK(Register(n).status());
  ASSERT_OK(Submit("p", 1, 2).status());
  DecideAndAdopt();
  ASSERT_OK(state_.Apply(From("p.m0", ReportOf("p", 10, 2, {{1, 100}, {2, 60}})), kT0).status());
  DecideAndAdopt();
  ASSERT_THAT(Job("p").nodes, SizeIs(1)) << "the policy keeps the better size";
  const std::string home = Job("p").nodes[0];

  ASSERT_OK_AND_ASSIGN(Applied a, state_.Apply(From("p.m0", ReportOf("p", 20, 1, {{1, 100}, {2, 60}},
                                                                        Probe(2, 30))),
                                                kT0 + absl::Seconds(1)));
  EXPECT_TRUE(a.needs_decision);
  AllocationPlan granted = DecideAndAdopt(kT0 + absl::Seconds(1));
  EXPECT_THAT(Job("p").nodes, ElementsAre("n0", "n1"));
  EXPECT_THAT(granted.reason, HasSubstr("probe granted: p at 2 nodes for 30 steps"));
  ASSERT_TRUE(Job("p").probe.has_value());

  // Another event: the policy alone would shrink p again; the probe holds.
  AllocationPlan held = DecideAndAdopt(kT0 + absl::Seconds(2));
  EXPECT_THAT(Job("p").nodes, SizeIs(2));
  EXPECT_THAT(held.reason, HasSubstr("probe of p at 2 nodes held"));

  // The steps count from the first report at 2 nodes (step 40): done at 70.
  ASSERT_OK(state_.Apply(From("p.m0", ReportOf("p", 40, 2, {{1, 100}, {2, 60}})), kT0 + absl::Seconds(3))
                .status());
  ASSERT_OK_AND_ASSIGN(a, state_.Apply(From("p.m0", ReportOf("p", 69, 2, {{1, 100}, {2, 60}})),
                                       kT0 + absl::Seconds(4)));
  EXPECT_TRUE(Job("p").probe.has_value());
  ASSERT_OK_AND_ASSIGN(a, state_.Apply(From("p.m0", ReportOf("p", 70, 2, {{1, 100}, {2, 61}})),
                                       kT0 + absl::Seconds(5)));
  EXPECT_TRUE(a.needs_decision);
  EXPECT_THAT(a.what, HasSubstr("probe at 2 nodes done"));
  EXPECT_FALSE(Job("p").probe.has_value());
  DecideAndAdopt(kT0 + absl::Seconds(5));
  EXPECT_THAT(Job("p").nodes, ElementsAre(home));

  // Within probe_cooldown (5 min): asked again, not granted; after it, granted.
  ASSERT_OK(state_.Apply(From("p.m0", ReportOf("p", 80, 1, {{1, 100}, {2, 61}}, Probe(2, 30))),
                         kT0 + absl::Seconds(6))
                .status());
  AllocationPlan refused = DecideAndAdopt(kT0 + absl::Seconds(6));
  EXPECT_THAT(Job("p").nodes, SizeIs(1));
  EXPECT_THAT(refused.reason, ::testing::Not(HasSubstr("probe")));
  state_.TouchAll(kT0 + absl::Minutes(6));  // the agents' heartbeats
  DecideAndAdopt(kT0 + absl::Minutes(6));
  EXPECT_THAT(Job("p").nodes, SizeIs(2));
  // A probe that never reports back ends after max_probe (10 min).
  state_.TouchAll(kT0 + absl::Minutes(17));
  AllocationPlan ended = DecideAndAdopt(kT0 + absl::Minutes(17));
  EXPECT_THAT(ended.reason, HasSubstr("probe of p at 2 nodes ended after 10m"));
  EXPECT_THAT(Job("p").nodes, SizeIs(1));
}

TEST_F(AllocatorStateTest, ProbesNeverTakeNodesFromOtherJobsOrLeaveTheRange) {
  for (const char* n : {"n0", "n1"}) ASSERT_OK(Register(n).status());
  ASSERT_OK(Submit("p", 1, 2).status());
  ASSERT_OK(Submit("q", 1, 1).status());
  DecideAndAdopt();
  ASSERT_THAT(Job("p").nodes, SizeIs(1));
  ASSERT_THAT(Job("q").nodes, SizeIs(1));
  // No spare node: the request waits (the policy gave q the other node).
  ASSERT_OK(state_.Apply(From("p.m0", ReportOf("p", 20, 1, {{1, 1}, {2, 1.2}}, Probe(2, 30))), kT0).status());
  AllocationPlan plan = DecideAndAdopt();
  EXPECT_THAT(Job("q").nodes, SizeIs(1));
  EXPECT_THAT(Job("p").nodes, SizeIs(1));
  EXPECT_THAT(plan.reason, ::testing::Not(HasSubstr("probe")));
  // A request beyond max_nodes is dropped, and the log line says why.
  ASSERT_OK_AND_ASSIGN(Applied a, state_.Apply(From("q.m0", ReportOf("q", 20, 1, {{1, 1}}, Probe(3, 30))),
                                                kT0));
  EXPECT_THAT(a.what, HasSubstr("probe at 3 nodes ignored: outside 1..1"));
  EXPECT_FALSE(Job("q").probe_request.has_value());
  // q ends: its node is spare, p's pending request is granted.
  ASSERT_OK(state_.Apply(From("client", JobCancel{"q", "done"}), kT0).status());
  plan = DecideAndAdopt(kT0 + absl::Seconds(1));
  EXPECT_THAT(Job("p").nodes, SizeIs(2));
  // With probes off, nothing is granted.
  AllocatorStateOptions off;
  off.honour_probes = false;
  AllocatorState plain(off);
  auto decide = [&plain](absl::Time now) {
    alloc::DecideOptions o;
    o.policy = alloc::PolicyKind::kDp;
    absl::StatusOr<alloc::Decision> d = alloc::Decide(plain.BuildProblem(now), o);
    EXPECT_OK(d.status());
    return plain.Adopt(*d, now, "dp");
  };
  ASSERT_OK(plain.Apply(From("agent.n0", NodeRegister{"n0", "agent.n0"}), kT0).status());
  ASSERT_OK(plain.Apply(From("agent.n1", NodeRegister{"n1", "agent.n1"}), kT0).status());
  JobSubmit submit;
  submit.job = "p";
  submit.command = {"python", "train.py"};
  submit.max_nodes = 2;
  ASSERT_OK(plain.Apply(From("client", submit), kT0).status());
  decide(kT0);
  ASSERT_OK(plain.Apply(From("p.m0", ReportOf("p", 20, 1, {{1, 100}, {2, 60}}, Probe(2, 30))), kT0).status());
  EXPECT_THAT(decide(kT0).reason, ::testing::Not(HasSubstr("probe")));
  EXPECT_THAT(plain.jobs().at("p").nodes, SizeIs(1));
}

TEST(CurveTest, PriorIsConcaveAndReportsExtendByTheNearestRate) {
  alloc::Curve prior = PriorCurve(1, 8, 10, 0.1);
  EXPECT_DOUBLE_EQ(alloc::Interpolate(prior, 1), 10);
  EXPECT_NEAR(alloc::Interpolate(prior, 8), 80 / 1.7, 1e-9);
  EXPECT_LT(alloc::Interpolate(prior, 8) - alloc::Interpolate(prior, 7),
            alloc::Interpolate(prior, 2) - alloc::Interpolate(prior, 1));
  alloc::Curve c = CurveFromPoints({{2, 30}, {3, 40}}, 1, 6);
  EXPECT_DOUBLE_EQ(alloc::Interpolate(c, 1), 15);   // 2's per-node rate
  EXPECT_DOUBLE_EQ(alloc::Interpolate(c, 3), 40);
  EXPECT_NEAR(alloc::Interpolate(c, 6), 80, 1e-9);  // 3's per-node rate
}

// The objective terms reach the problem: hysteresis as it is, and rank
// weights with each job's work left from its total_steps and its reports; a
// job that did not say counts as the longest.
TEST(ObjectiveTermsTest, WorkLeftComesFromTotalStepsAndTheReports) {
  AllocatorStateOptions o;
  o.objective = alloc::Objective::kSpeedup;
  o.resize_hysteresis = 2;
  o.rank_weight_exponent = 1;
  ASSERT_OK(o.Validate());
  AllocatorState state(o);
  uint64_t seq = 0;
  auto apply = [&](const std::string& sender, Message m) {
    Envelope e;
    e.sender = sender;
    e.seq = ++seq;
    e.ts = kT0;
    e.message = std::move(m);
    return state.Apply(e, kT0).status();
  };
  NodeRegister r;
  r.node = "n0";
  r.agent = "agent.n0";
  ASSERT_OK(apply(r.agent, r));
  for (const char* id : {"long", "short", "unsaid"}) {
    JobSubmit s;
    s.job = id;
    s.command = {"python", "train.py"};
    s.min_nodes = 1;
    s.max_nodes = 2;
    if (std::string(id) != "unsaid") s.total_steps = 1000;
    ASSERT_OK(apply("client", s));
  }
  // Before any report the global batch is unknown: no job's work is known.
  alloc::Problem p = state.BuildProblem(kT0);
  EXPECT_EQ(p.resize_hysteresis, 2);
  EXPECT_EQ(p.rank_weight_exponent, 1);
  ASSERT_THAT(p.jobs, SizeIs(3));
  EXPECT_OK(alloc::ValidateProblem(p));
  EXPECT_EQ(AllocatorState::RemainingSamples(state.jobs().at("long")), 0);

  ASSERT_OK(apply("long.m0", ReportAt("long", 100, 32)));    // 900 steps x 32
  ASSERT_OK(apply("short.m0", ReportAt("short", 500, 32)));  // 500 steps x 32
  ASSERT_OK(apply("unsaid.m0", ReportAt("unsaid", 5, 32)));  // no total_steps
  p = state.BuildProblem(kT0);
  ASSERT_OK(alloc::ValidateProblem(p));
  std::map<std::string, double> left;
  for (const alloc::JobSpec& j : p.jobs) left[j.id] = j.remaining_samples;
  EXPECT_DOUBLE_EQ(left["long"], 900 * 32);
  EXPECT_DOUBLE_EQ(left["short"], 500 * 32);
  // Twice the longest known (in node-seconds at one node, 100 samples/s) + 1 s.
  EXPECT_DOUBLE_EQ(left["unsaid"], (2 * 900 * 32 / 100.0 + 1) * 100);
  // The one node goes to the job closest to done (weight 3 of 1..3; each
  // could use the whole window).
  alloc::DecideOptions d;
  d.policy = alloc::PolicyKind::kDp;
  ASSERT_OK_AND_ASSIGN(alloc::Decision decision, alloc::Decide(p, d));
  for (const alloc::JobAllocation& j : decision.allocation.jobs) {
    EXPECT_EQ(j.nodes.size(), j.job_id == "short" ? 1u : 0u) << j.job_id;
  }
  // A job past its declared length still has one step.
  ASSERT_OK(apply("short.m0", ReportAt("short", 1200, 32)));
  EXPECT_DOUBLE_EQ(AllocatorState::RemainingSamples(state.jobs().at("short")), 32);
  // The status document says what the allocator knows.
  const nlohmann::json status = nlohmann::json::parse(state.StatusJson(kT0));
  for (const auto& j : status["jobs"]) {
    if (j["job"] == "long") {
      EXPECT_EQ(j["total_steps"], 1000);
      EXPECT_EQ(j["remaining_samples"], 900 * 32);
    }
    if (j["job"] == "unsaid") EXPECT_TRUE(j["remaining_samples"].is_null());
  }
}

// Aging reaches the problem: each job's age counts from the JobSubmit the
// allocator applied, and with it the job that waited longer ranks first.
// "old" (submitted at kT0, 900 steps x 32 left = 288 node-s at 100/s) and
// "new" (kT0 + 1 h, 700 x 32 = 224 node-s), decided at kT0 + 2 h: without
// aging "new" is shorter and takes the one node; aged over 1 h, "old" ranks
// as 288 / 3 = 96 and "new" as 224 / 2 = 112, and "old" takes it.
TEST_F(AllocatorStateTest, AgingCountsFromTheJobSubmit) {
  AllocatorStateOptions o;
  o.objective = alloc::Objective::kSpeedup;
  o.rank_weight_exponent = 1;
  auto holder = [&](const AllocatorStateOptions& options) {
    state_ = AllocatorState(options);
    const absl::Time submitted[] = {kT0, kT0 + absl::Hours(1)};
    const char* ids[] = {"old", "new"};
    for (int k = 0; k < 2; ++k) {
      JobSubmit s;
      s.job = ids[k];
      s.command = {"python", "train.py"};
      s.min_nodes = 1;
      s.max_nodes = 1;
      s.total_steps = 1000;
      EXPECT_OK(state_.Apply(From("client", s, submitted[k]), submitted[k]).status());
    }
    const absl::Time now = kT0 + absl::Hours(2);
    EXPECT_OK(Register("n0", now).status());  // now: an agent silent since kT0 is withdrawn
    EXPECT_OK(state_.Apply(From("old.m0", ReportAt("old", 100, 32), now), now).status());
    EXPECT_OK(state_.Apply(From("new.m0", ReportAt("new", 300, 32), now), now).status());
    alloc::Problem p = state_.BuildProblem(now);
    EXPECT_OK(alloc::ValidateProblem(p));
    std::map<std::string, absl::Duration> age;
    for (const alloc::JobSpec& j : p.jobs) age[j.id] = j.age;
    EXPECT_EQ(age["old"], absl::Hours(2));
    EXPECT_EQ(age["new"], absl::Hours(1));
    EXPECT_EQ(p.rank_aging, options.rank_aging);
    DecideAndAdopt(now);
    return Job("old").nodes.empty() ? (Job("new").nodes.empty() ? "" : "new") : "old";
  };
  EXPECT_EQ(holder(o), "new");
  o.rank_aging = absl::Hours(1);
  ASSERT_OK(o.Validate());
  EXPECT_EQ(holder(o), "old");
}

TEST(OptionsTest, BadOptionsNameTheField) {
  AllocatorStateOptions o;
  o.heartbeat_timeout = absl::ZeroDuration();
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("heartbeat_timeout")));
  o = {};
  o.default_serial_fraction = 2;
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("default_serial_fraction")));
  o = {};
  o.max_probe = absl::ZeroDuration();
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_probe")));
  o = {};
  o.probe_cooldown = -absl::Seconds(1);
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("probe_cooldown")));
  o = {};
  o.max_rank_failures = 0;
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_rank_failures")));
  o = {};
  o.resize_hysteresis = 0.5;
  EXPECT_THAT(o.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("resize_hysteresis")));
  o = {};
  o.rank_weight_exponent = -1;
  EXPECT_THAT(o.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank_weight_exponent")));
  o = {};
  o.rank_weight_exponent = 1;
  o.rank_aging = absl::ZeroDuration();
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("rank_aging must be > 0 (infinite: off), got 0")));
  o = {};
  o.rank_aging = absl::Hours(1);
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("rank_aging is 1h, but rank weights are off")));
  o = {};
  o.objective = alloc::Objective::kCompletion;
  EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("completion")));
}

}  // namespace
}  // namespace malle::control
