#include "libmalle/sim/engine.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/base/testing/status_matchers.h"

namespace malle::sim {
namespace {

using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

// Rows "time,node,idle"; the trace ends at the last row's time.
IdleTrace Trace(const std::string& rows) {
  auto t = ParseIdleTrace(absl::StrCat("time,node,idle\n", rows), "t.csv");
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

MixJob Job(const std::string& name, int min, int max, double work, double per_node = 10) {
  MixJob j;
  j.name = name;
  j.submit_time = absl::FromUnixSeconds(0);
  j.min_nodes = min;
  j.max_nodes = max;
  j.work_samples = work;
  j.rescale_up = absl::Seconds(10);
  j.rescale_down = absl::Seconds(5);
  for (int n = 0; n <= max; ++n) j.throughput.push_back({n, per_node * n});
  return j;
}

SimOptions Dp() {
  SimOptions o;
  o.decide.policy = alloc::PolicyKind::kDp;
  o.record_events = true;
  return o;
}

// n0 idle from 0, n1 idle from 100, end at 1000.
constexpr char kGrow[] = "0,n0,1\n0,n1,0\n100,n1,1\n1000,n0,1\n";

TEST(EngineTest, GrowChargesOldRateTimesPause) {
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9)}, Dp()));
  // Start at 0 is free (r(0) = 0); the grow at 100 costs 10/s x 10 s.
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 10 * 100 + 20 * 900 - 100);
  EXPECT_DOUBLE_EQ(r.jobs[0].ideal_samples, 19000);
  EXPECT_DOUBLE_EQ(r.summary.efficiency, 18900.0 / 19000);
  EXPECT_DOUBLE_EQ(r.summary.idle_node_hours, 1900.0 / 3600);
  EXPECT_DOUBLE_EQ(r.summary.used_node_hours, 1900.0 / 3600);
  EXPECT_DOUBLE_EQ(r.summary.utilisation, 1.0);
  EXPECT_EQ(r.summary.resizes, 2);
  EXPECT_EQ(r.summary.decisions, 2);
  EXPECT_EQ(r.jobs[0].first_start, absl::FromUnixSeconds(0));
}

TEST(EngineTest, PauseAccountingStopsTheJob) {
  SimOptions o = Dp();
  o.accounting = Accounting::kPause;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9)}, o));
  // 10 s start-up pause, then 10 s grow pause at 100.
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 10 * 90 + 20 * 890);
}

TEST(EngineTest, ReclaimForcesAShrink) {
  ASSERT_OK_AND_ASSIGN(
      SimResult r,
      Simulate(Trace("0,n0,1\n0,n1,1\n500,n1,0\n1000,n0,1\n"), {Job("j", 1, 2, 1e9)}, Dp()));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 500 + 10 * 500 - 20 * 5);
  EXPECT_EQ(r.summary.reclaims, 1);
  EXPECT_EQ(r.summary.preemptions, 0);
  EXPECT_DOUBLE_EQ(r.summary.idle_node_hours, 1500.0 / 3600);
}

TEST(EngineTest, ReclaimBelowMinPreemptsAndTheJobResumesWithItsProgress) {
  ASSERT_OK_AND_ASSIGN(
      SimResult r, Simulate(Trace("0,n0,1\n0,n1,1\n500,n1,0\n700,n1,1\n1000,n0,1\n"),
                            {Job("j", 2, 2, 1e9)}, Dp()));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 500 - 20 * 5 + 20 * 300);
  EXPECT_EQ(r.summary.preemptions, 1);
  EXPECT_EQ(r.jobs[0].resizes, 2);  // start, restart
  EXPECT_DOUBLE_EQ(r.summary.used_node_hours, (2 * 500 + 2 * 300) / 3600.0);
}

TEST(EngineTest, FinishedJobFreesItsNodesForTheNext) {
  MixJob first = Job("first", 2, 2, 5000);  // 20/s: done at t = 250
  MixJob second = Job("second", 2, 2, 1e9);
  second.submit_time = absl::FromUnixSeconds(1);
  ASSERT_OK_AND_ASSIGN(SimResult r,
                       Simulate(Trace("0,n0,1\n0,n1,1\n1000,n0,1\n"), {first, second}, Dp()));
  EXPECT_EQ(r.summary.jobs_finished, 1);
  EXPECT_EQ(r.jobs[0].finish, absl::FromUnixSeconds(250));
  EXPECT_DOUBLE_EQ(r.jobs[0].samples_done, 5000);
  EXPECT_EQ(r.jobs[1].first_start, absl::FromUnixSeconds(250));
  EXPECT_DOUBLE_EQ(r.jobs[1].samples_done, 20 * 750);
}

TEST(EngineTest, DebounceCoalescesDecisions) {
  SimOptions o = Dp();
  o.debounce = absl::Seconds(200);
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9)}, o));
  EXPECT_EQ(r.summary.decisions, 1);  // at t = 200, for the events at 0 and 100
  EXPECT_EQ(r.jobs[0].first_start, absl::FromUnixSeconds(200));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 800);
}

TEST(EngineTest, SameInputsSameEvents) {
  auto run = [] {
    auto r = Simulate(Trace("0,n0,1\n0,n1,1\n0,n2,1\n300,n1,0\n400,n1,1\n900,n2,0\n1000,n0,1\n"),
                      {Job("a", 1, 3, 1e9), Job("b", 1, 2, 4000, 15)}, Dp());
    std::string s;
    for (EventRecord& e : r->events) {
      e.decision_ms = 0;
    }
    return EventsToCsv(r->events) + JobsToCsv(r->jobs);
  };
  EXPECT_EQ(run(), run());
}

TEST(EngineTest, EveryPolicyRuns) {
  for (alloc::PolicyKind k : {alloc::PolicyKind::kMilp, alloc::PolicyKind::kDp,
                              alloc::PolicyKind::kGreedy, alloc::PolicyKind::kEqualShare,
                              alloc::PolicyKind::kStatic}) {
    SimOptions o;
    o.decide.policy = k;
    ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9)}, o));
    EXPECT_EQ(r.summary.policy, alloc::PolicyName(k));
    EXPECT_GT(r.summary.samples_trained, 0);
  }
}

TEST(EngineTest, LearnedCurvesOnlySeeObservedSizes) {
  SimOptions o = Dp();
  o.curves = CurveMode::kLearned;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9)}, o));
  // Linear true curve: the linear guess is right, so the result matches oracle.
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 18900);
}

TEST(EngineTest, BadOptionsNameTheField) {
  SimOptions o = Dp();
  o.max_waiting = -1;
  EXPECT_THAT(Simulate(Trace(kGrow), {}, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_waiting")));
  o = Dp();
  o.forward_window = absl::ZeroDuration();
  EXPECT_THAT(Simulate(Trace(kGrow), {}, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("forward_window")));
  EXPECT_THAT(Simulate(IdleTrace{}, {}, Dp()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("trace")));
}

TEST(EngineRealData, HpoMixOnSummit) {
  const std::string dir = MALLE_SHARED_DATA_DIR;
  if (access((dir + "/summit-idle-2021-02.csv.gz").c_str(), R_OK) != 0) {
    GTEST_SKIP() << dir << " is absent";
  }
  ASSERT_OK_AND_ASSIGN(IdleTrace trace, LoadIdleTrace(dir + "/summit-idle-2021-02.csv.gz"));
  ASSERT_OK_AND_ASSIGN(JobMix mix, LoadJobMix(dir + "/jobs-hpo-shufflenet-10.csv"));
  SimOptions o;
  o.decide.policy = alloc::PolicyKind::kDp;
  o.skip_snapshots = 999;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(trace, mix.jobs, o));
  std::printf("hpo-10 on Summit (dp): %s", SummariesToCsv({r.summary}).c_str());
  EXPECT_EQ(r.summary.jobs_submitted, 10);
  EXPECT_GT(r.summary.samples_trained, 0);
  EXPECT_GT(r.summary.efficiency, 0);
  EXPECT_LE(r.summary.efficiency, 1.0 + 1e-12);
}

}  // namespace
}  // namespace malle::sim

namespace malle::sim {
namespace {

// Regression: with many jobs, one decision can shrink a job and give its
// node to a job listed before it; the engine once lost track of the new
// holder and later handed the allocator a busy node. The first hour of
// BFTrainer's Summit replay with the 1,001-job mix crossed that path.
TEST(EngineRealData, ImageNetMixKeepsNodeOwnershipConsistent) {
  const std::string dir = MALLE_SHARED_DATA_DIR;
  if (access((dir + "/summit-idle-2021-02.csv.gz").c_str(), R_OK) != 0) {
    GTEST_SKIP() << dir << " is absent";
  }
  ASSERT_OK_AND_ASSIGN(IdleTrace trace, LoadIdleTrace(dir + "/summit-idle-2021-02.csv.gz"));
  ASSERT_OK_AND_ASSIGN(JobMix mix, LoadJobMix(dir + "/jobs-imagenet-1001.csv"));
  SimOptions o;
  o.decide.policy = alloc::PolicyKind::kDp;
  o.skip_snapshots = 999;  // BFTrainer's replay start, where the bug showed
  absl::Time start = trace.events.front().time;
  for (size_t i = 1, distinct = 0; i < trace.events.size() && distinct < 999; ++i) {
    if (trace.events[i].time != trace.events[i - 1].time) {
      ++distinct;
      start = trace.events[i].time;
    }
  }
  o.end = start + absl::Hours(1);
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(trace, mix.jobs, o));
  EXPECT_GT(r.summary.resizes, 0);
  EXPECT_LE(r.summary.used_node_hours, r.summary.idle_node_hours + 1e-9);
}

}  // namespace
}  // namespace malle::sim
