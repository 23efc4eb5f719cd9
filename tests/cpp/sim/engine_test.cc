#include "libmalle/sim/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::sim {
namespace {

using ::malle::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

// Rows "time,node,idle"; the trace ends at the last row's time.
IdleTrace Trace(const std::string& rows) {
  auto t = ParseIdleTrace(absl::StrCat("time,node,idle\n", rows), "t.csv");
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

// A job with a linear curve, `per_node` samples/s per node, 10 s up pause
// and 5 s down pause, submitted at Unix time 0.
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

absl::Time T(int64_t s) { return absl::FromUnixSeconds(s); }

// "time kind job before->after" for every event of `kind`.
std::vector<std::string> EventsOf(const SimResult& r, const std::string& kind) {
  std::vector<std::string> out;
  for (const EventRecord& e : r.events) {
    if (e.kind != kind) continue;
    out.push_back(absl::StrCat(absl::ToUnixSeconds(e.time), " ", e.job, e.node, " ",
                               e.nodes_before, "->", e.nodes_after));
  }
  return out;
}

// n0 idle from 0, n1 idle from 100, end at 1000.
constexpr char kGrow[] = "0,n0,1\n0,n1,0\n100,n1,1\n1000,n0,1\n";
// n0 and n1 idle from 0 to 1000.
constexpr char kTwoNodes[] = "0,n0,1\n0,n1,1\n1000,n0,1\n";

TEST(EngineTest, JobAloneFinishesAtTheComputedTime) {
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kTwoNodes), {Job("j", 1, 2, 5000)}, Dp()));
  // Starts on both nodes at 0 (free), 20/s: 5000 samples at t = 250.
  EXPECT_EQ(r.jobs[0].first_start, T(0));
  EXPECT_EQ(r.jobs[0].finish, T(250));
  EXPECT_DOUBLE_EQ(r.jobs[0].samples_done, 5000);
  EXPECT_DOUBLE_EQ(r.jobs[0].node_seconds, 500);
  EXPECT_DOUBLE_EQ(r.jobs[0].ideal_samples, 5000);
  EXPECT_EQ(r.summary.jobs_submitted, 1);
  EXPECT_EQ(r.summary.jobs_finished, 1);
  EXPECT_DOUBLE_EQ(r.summary.efficiency, 1.0);
  EXPECT_DOUBLE_EQ(r.summary.idle_node_hours, 2000.0 / 3600);
  EXPECT_DOUBLE_EQ(r.summary.used_node_hours, 500.0 / 3600);
  EXPECT_DOUBLE_EQ(r.summary.utilisation, 0.25);
  EXPECT_THAT(EventsOf(r, "finish"), ElementsAre("250 j 2->0"));

  // Pause accounting: the 10 s start-up pause delays the finish to 260 and
  // the node-time held during it is lost.
  SimOptions o = Dp();
  o.accounting = Accounting::kPause;
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kTwoNodes), {Job("j", 1, 2, 5000)}, o));
  EXPECT_EQ(r.jobs[0].finish, T(260));
  EXPECT_DOUBLE_EQ(r.jobs[0].ideal_samples, 5200);
  EXPECT_DOUBLE_EQ(r.summary.efficiency, 5000.0 / 5200);
}

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
  EXPECT_EQ(r.jobs[0].first_start, T(0));
  EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("0 j 0->1", "100 j 1->2"));
}

TEST(EngineTest, PauseAccountingStopsTheJob) {
  SimOptions o = Dp();
  o.accounting = Accounting::kPause;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9)}, o));
  // 10 s start-up pause, then 10 s grow pause at 100.
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 10 * 90 + 20 * 890);
  EXPECT_DOUBLE_EQ(r.jobs[0].ideal_samples, 19000);
  EXPECT_DOUBLE_EQ(r.summary.efficiency, (10 * 90 + 20 * 890) / 19000.0);
  EXPECT_EQ(r.summary.resizes, 2);
}

TEST(EngineTest, ReclaimForcesAShrink) {
  ASSERT_OK_AND_ASSIGN(
      SimResult r,
      Simulate(Trace("0,n0,1\n0,n1,1\n500,n1,0\n1000,n0,1\n"), {Job("j", 1, 2, 1e9)}, Dp()));
  // The forced shrink at 500 costs r(2) x 5 s.
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 500 + 10 * 500 - 20 * 5);
  EXPECT_EQ(r.summary.reclaims, 1);
  EXPECT_EQ(r.summary.preemptions, 0);
  EXPECT_EQ(r.summary.resizes, 1);  // the start; a reclaim is not a policy resize
  EXPECT_DOUBLE_EQ(r.summary.idle_node_hours, 1500.0 / 3600);
  EXPECT_DOUBLE_EQ(r.summary.used_node_hours, 1500.0 / 3600);
  EXPECT_THAT(EventsOf(r, "reclaim"), ElementsAre("500 jn1 2->1"));
}

// The losses split by cause: the grow at 100 (policy) costs 10/s x 10 s, the
// reclaim at 500 (forced) r(2) x 5 s.
TEST(EngineTest, LossesSplitIntoResizesAndReclaims) {
  ASSERT_OK_AND_ASSIGN(SimResult r,
                       Simulate(Trace("0,n0,1\n0,n1,0\n100,n1,1\n500,n1,0\n1000,n0,1\n"),
                                {Job("j", 1, 2, 1e9)}, Dp()));
  EXPECT_DOUBLE_EQ(r.summary.lost_to_resizes, 100);
  EXPECT_DOUBLE_EQ(r.summary.lost_to_reclaims, 100);
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 10 * 100 + 20 * 400 + 10 * 500 - 200);
}

TEST(EngineTest, NodesReclaimedAtOneTimeAreOneShrink) {
  ASSERT_OK_AND_ASSIGN(
      SimResult r,
      Simulate(Trace("0,n0,1\n0,n1,1\n0,n2,1\n500,n1,0\n500,n2,0\n1000,n0,1\n"),
               {Job("j", 1, 3, 1e9)}, Dp()));
  // One down pause at the old size: r(3) x 5 s, not r(3) x 5 + r(2) x 5.
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 30 * 500 - 30 * 5 + 10 * 500);
  EXPECT_EQ(r.summary.reclaims, 2);
  EXPECT_EQ(r.jobs[0].reclaims, 2);
  EXPECT_THAT(EventsOf(r, "reclaim"), ElementsAre("500 jn1 3->2", "500 jn2 2->1"));
}

TEST(EngineTest, ReclaimBelowMinPreemptsAndTheJobResumesWithItsProgress) {
  constexpr char kTrace[] = "0,n0,1\n0,n1,1\n500,n1,0\n700,n1,1\n1000,n0,1\n";
  const SimOptions free = [] {
    SimOptions o = Dp();
    o.preemption.mode = PreemptionCost::kFree;
    return o;
  }();
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kTrace), {Job("j", 2, 2, 1e9)}, free));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 500 - 20 * 5 + 20 * 300);
  EXPECT_EQ(r.summary.preemptions, 1);
  EXPECT_EQ(r.jobs[0].preemptions, 1);
  EXPECT_EQ(r.jobs[0].resizes, 2);  // start, restart
  EXPECT_EQ(r.jobs[0].first_start, T(0));
  EXPECT_DOUBLE_EQ(r.summary.used_node_hours, (2 * 500 + 2 * 300) / 3600.0);
  EXPECT_DOUBLE_EQ(r.jobs[0].ideal_samples, 20 * 800);
  EXPECT_THAT(EventsOf(r, "preempt"), ElementsAre("500 j 1->0"));
  EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("0 j 0->2", "700 j 0->2"));

  // The job needs 15,900 samples in all: preempted with 9,900 done, it
  // finishes 300 s after its restart, not 795 s after.
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kTrace), {Job("j", 2, 2, 15900)}, free));
  EXPECT_EQ(r.jobs[0].finish, T(1000));
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kTrace), {Job("j", 2, 2, 15000)}, free));
  EXPECT_EQ(r.jobs[0].finish, T(955));
  EXPECT_DOUBLE_EQ(r.jobs[0].samples_done, 15000);
}

// What a preemption costs under each PreemptionCost mode, by hand. Two
// nodes idle from 0; n1 is reclaimed at 550 (the 2-node job falls below
// min_nodes: r(2) x 5 s = 100 samples for the forced shrink, then the stop)
// and comes back at 700 (restart on 2 nodes, free in BFTrainer's
// accounting); the replay ends at 1000. r(2) = 20 samples/s.
// Park 1 s + 100 MB / 50 MB/s = 3 s; unpark 0.5 s + 100 MB / 200 MB/s = 1 s;
// a snapshot's copy 100 MB / 100 MB/s = 1 s, every 1 s / 0.01 = 100 s.
constexpr char kPreempt[] = "0,n0,1\n0,n1,1\n550,n1,0\n700,n1,1\n1000,n0,1\n";

SimOptions PreemptionCase(PreemptionCost mode) {
  SimOptions o = Dp();
  o.preemption.mode = mode;
  o.preemption.state_bytes = 100e6;
  o.preemption.write_bytes_per_s = 50e6;
  o.preemption.read_bytes_per_s = 200e6;
  o.preemption.copy_bytes_per_s = 100e6;
  o.preemption.park_fixed = absl::Seconds(1);
  o.preemption.unpark_fixed = absl::Seconds(0.5);
  return o;
}

TEST(EngineTest, PreemptionCostFreeKeepsTheProgress) {
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kPreempt), {Job("j", 2, 2, 1e9)},
                                             PreemptionCase(PreemptionCost::kFree)));
  EXPECT_EQ(r.summary.preemptions, 1);
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 550 - 100 + 20 * 300);
  EXPECT_DOUBLE_EQ(r.summary.lost_to_preemptions, 0);
  EXPECT_DOUBLE_EQ(r.summary.lost_to_snapshots, 0);
  EXPECT_THAT(r.summary.preemption_cost, ::testing::StartsWith("free"));
}

TEST(EngineTest, PreemptionCostParkChargesParkAndUnpark) {
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kPreempt), {Job("j", 2, 2, 1e9)},
                                             PreemptionCase(PreemptionCost::kPark)));
  // Parks at the old size (20/s x 3 s), unparks at the new one (20/s x 1 s).
  EXPECT_DOUBLE_EQ(r.summary.lost_to_preemptions, 20 * 3 + 20 * 1);
  EXPECT_DOUBLE_EQ(r.jobs[0].lost_to_preemptions, 80);
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 550 - 100 + 20 * 300 - 80);
  EXPECT_DOUBLE_EQ(r.summary.lost_to_snapshots, 0);  // every stop announced: no snapshots
  EXPECT_DOUBLE_EQ(r.jobs[0].ideal_samples, 20 * 850);
  EXPECT_DOUBLE_EQ(r.summary.efficiency, (20 * 850 - 100 - 80) / (20.0 * 850));
  EXPECT_EQ(r.summary.preemption_cost, "park (100 MB state: park 3.00 s, unpark 1.00 s)");

  // With the pause accounting the unpark pauses the job (after its 10 s up
  // pause): 10..550 and 711..1000 trained, the park still lost.
  SimOptions o = PreemptionCase(PreemptionCost::kPark);
  o.accounting = Accounting::kPause;
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kPreempt), {Job("j", 2, 2, 1e9)}, o));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 540 - 60 + 20 * 289);
  EXPECT_DOUBLE_EQ(r.summary.lost_to_preemptions, 80);
}

TEST(EngineTest, PreemptionCostSnapshotLosesTheProgressSinceTheLastSnapshot) {
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kPreempt), {Job("j", 2, 2, 1e9)},
                                             PreemptionCase(PreemptionCost::kSnapshot)));
  // Snapshots at 100..500 (5 copies x 20/s x 1 s = 100): 9,900 done at the
  // one of 500. At 550: 11,000 - 100 (copies) - 100 (shrink) = 10,800, back
  // to 9,900 (900 lost). Unpark at 700 (20), then snapshots at 800, 900,
  // 1000 (60) and 300 s at 20/s.
  EXPECT_DOUBLE_EQ(r.summary.lost_to_snapshots, 100 + 60);
  EXPECT_DOUBLE_EQ(r.summary.lost_to_preemptions, 900 + 20);
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 9900 - 20 + 6000 - 60);
  EXPECT_THAT(r.summary.preemption_cost, HasSubstr("a snapshot every 100.0 s"));

  // A fixed interval of 400 s: one snapshot (at 400, 7,980 done), 2,920 lost.
  SimOptions o = PreemptionCase(PreemptionCost::kSnapshot);
  o.preemption.snapshot_interval = absl::Seconds(400);
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kPreempt), {Job("j", 2, 2, 1e9)}, o));
  EXPECT_DOUBLE_EQ(r.summary.lost_to_preemptions, (20 * 550 - 20 - 100) - 7980 + 20);
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 7980 - 20 + 6000);  // next snapshot at 1100

  // Stopped before its first snapshot, the job loses everything and has
  // nothing to read back (no unpark).
  o.preemption.snapshot_interval = absl::Seconds(600);
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kPreempt), {Job("j", 2, 2, 1e9)}, o));
  EXPECT_DOUBLE_EQ(r.summary.lost_to_preemptions, 20 * 550 - 100);
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 300);
}

TEST(EngineTest, PreemptionCostRestartLosesEverything) {
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kPreempt), {Job("j", 2, 2, 1e9)},
                                             PreemptionCase(PreemptionCost::kRestart)));
  EXPECT_DOUBLE_EQ(r.summary.lost_to_preemptions, 20 * 550 - 100);
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 300);
  EXPECT_DOUBLE_EQ(r.summary.efficiency, 6000 / (20.0 * 850));
  // A job of 12,000 samples: 10,900 done at 550, all lost; it needs 600 s
  // from the restart at 700 and does not finish by 1000.
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kPreempt), {Job("j", 2, 2, 12000)},
                                   PreemptionCase(PreemptionCost::kRestart)));
  EXPECT_EQ(r.jobs[0].finish, absl::InfiniteFuture());
  ASSERT_OK_AND_ASSIGN(
      r, Simulate(Trace(kPreempt), {Job("j", 2, 2, 12000)}, PreemptionCase(PreemptionCost::kPark)));
  EXPECT_EQ(r.jobs[0].finish, T(700 + (12000 - 10900 + 80) / 20));
}

TEST(EngineTest, PreemptionCostIsParkByDefaultWithDocumentedParameters) {
  const PreemptionCostOptions p;
  EXPECT_EQ(p.mode, PreemptionCost::kPark);
  // 250 MB at 125 MB/s + 1 s; 250 MB at 1 GB/s + 1 s; copy 0.25 s -> 25 s.
  EXPECT_EQ(p.ParkTime(), absl::Seconds(3));
  EXPECT_EQ(p.UnparkTime(), absl::Seconds(1.25));
  EXPECT_EQ(p.SnapshotInterval(), absl::Seconds(25));
  EXPECT_EQ(*ParsePreemptionCost("snapshot"), PreemptionCost::kSnapshot);
  EXPECT_THAT(ParsePreemptionCost("parked").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'parked' is not one of free, park, snapshot, restart")));
}

TEST(EngineTest, FinishedJobFreesItsNodesForTheNext) {
  MixJob first = Job("first", 2, 2, 5000);  // 20/s: done at t = 250
  MixJob second = Job("second", 2, 2, 1e9);
  second.submit_time = T(1);
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kTwoNodes), {first, second}, Dp()));
  EXPECT_EQ(r.summary.jobs_finished, 1);
  EXPECT_EQ(r.jobs[0].finish, T(250));
  EXPECT_DOUBLE_EQ(r.jobs[0].samples_done, 5000);
  EXPECT_EQ(r.jobs[1].submit, T(1));
  EXPECT_EQ(r.jobs[1].first_start, T(250));
  EXPECT_DOUBLE_EQ(r.jobs[1].samples_done, 20 * 750);
}

// Concave curves: r(1..4) = 10, 15, 18, 20.
MixJob Concave(const std::string& name, double work) {
  MixJob j = Job(name, 1, 4, work);
  j.throughput = {{0, 0}, {1, 10}, {2, 15}, {3, 18}, {4, 20}};
  return j;
}

TEST(EngineTest, TwoJobsShareNodesUnderDp) {
  constexpr char kFour[] = "0,n0,1\n0,n1,1\n0,n2,1\n0,n3,1\n1000,n0,1\n";
  ASSERT_OK_AND_ASSIGN(SimResult r,
                       Simulate(Trace(kFour), {Concave("a", 4500), Concave("b", 1e9)}, Dp()));
  // 2 + 2 (15 + 15 = 30/s) beats 3 + 1 (28) and 4 + 0 (20). `a` is done at
  // 300; `b` then grows to 4 nodes paying r(2) x 10 s.
  EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("0 a 0->2", "0 b 0->2", "300 b 2->4"));
  EXPECT_EQ(r.jobs[0].finish, T(300));
  EXPECT_DOUBLE_EQ(r.jobs[1].samples_done, 15 * 300 + 20 * 700 - 15 * 10);
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 4500 + 15 * 300 + 20 * 700 - 15 * 10);
  EXPECT_DOUBLE_EQ(r.summary.efficiency, 22850.0 / 23000);
  EXPECT_DOUBLE_EQ(r.jobs[0].node_seconds, 600);
  EXPECT_DOUBLE_EQ(r.jobs[1].node_seconds, 600 + 2800);
  EXPECT_DOUBLE_EQ(r.summary.utilisation, 1.0);
}

TEST(EngineTest, DebounceCoalescesDecisions) {
  SimOptions o = Dp();
  o.debounce = absl::Seconds(200);
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9)}, o));
  EXPECT_EQ(r.summary.decisions, 1);  // at t = 200, for the events at 0 and 100
  EXPECT_EQ(r.jobs[0].first_start, T(200));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 800);

  // 50 s: one decision at 50 (events at 0), one at 150 (the event at 100).
  o.debounce = absl::Seconds(50);
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9)}, o));
  EXPECT_EQ(r.summary.decisions, 2);
  EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("50 j 0->1", "150 j 1->2"));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 10 * 100 + 20 * 850 - 10 * 10);

  // No debounce: every timestamp with an event decides (0 and 100).
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9)}, Dp()));
  EXPECT_EQ(r.summary.decisions, 2);
}

TEST(EngineTest, NodeHoursAndTimeline) {
  SimOptions o = Dp();
  o.timeline_step = absl::Seconds(250);
  // n0 idle 0-1000, n1 100-400, n2 200-1000; no jobs.
  ASSERT_OK_AND_ASSIGN(
      SimResult r,
      Simulate(Trace("0,n0,1\n0,n1,0\n0,n2,0\n100,n1,1\n200,n2,1\n400,n1,0\n1000,n0,1\n"), {},
               o));
  EXPECT_DOUBLE_EQ(r.summary.idle_node_hours, (1000 + 300 + 800) / 3600.0);
  EXPECT_DOUBLE_EQ(r.summary.used_node_hours, 0);
  EXPECT_DOUBLE_EQ(r.summary.utilisation, 0);
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 0);
  EXPECT_DOUBLE_EQ(r.summary.efficiency, 0);
  EXPECT_EQ(r.summary.decisions, 0);  // nothing to decide without jobs
  std::vector<int> idle;
  for (const TimelineSample& s : r.timeline) idle.push_back(s.idle_nodes);
  EXPECT_THAT(idle, ElementsAre(1, 3, 2, 2));
  EXPECT_EQ(r.timeline[1].time, T(250));
}

TEST(EngineTest, TimelineCountsRunningAndWaitingJobs) {
  SimOptions o = Dp();
  o.timeline_step = absl::Seconds(400);
  MixJob late = Job("late", 1, 1, 1e9);
  late.submit_time = T(10);
  ASSERT_OK_AND_ASSIGN(SimResult r,
                       Simulate(Trace("0,n0,1\n1000,n0,1\n"), {Job("a", 1, 1, 1e9), late}, o));
  ASSERT_EQ(r.timeline.size(), 3u);  // 0, 400, 800
  EXPECT_EQ(r.timeline[0].running_jobs, 1);
  EXPECT_EQ(r.timeline[0].waiting_jobs, 0);
  EXPECT_EQ(r.timeline[1].running_jobs, 1);
  EXPECT_EQ(r.timeline[1].waiting_jobs, 1);
  EXPECT_EQ(r.timeline[1].used_nodes, 1);
}

TEST(EngineTest, WaitingJobsAreConsideredFifoBySubmitTime) {
  SimOptions o = Dp();
  o.max_waiting = 1;
  o.debounce = absl::Seconds(10);
  MixJob later = Job("later", 1, 1, 1e9);
  later.submit_time = T(5);
  MixJob earlier = Job("earlier", 1, 1, 1e9);
  // Listed second in the mix but submitted first: it is the one considered.
  ASSERT_OK_AND_ASSIGN(SimResult r,
                       Simulate(Trace("0,n0,1\n1000,n0,1\n"), {later, earlier}, o));
  EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("10 earlier 0->1"));

  o.max_waiting = 0;  // waiting jobs are never considered: nothing runs
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace("0,n0,1\n1000,n0,1\n"), {later, earlier}, o));
  EXPECT_EQ(r.summary.resizes, 0);
  EXPECT_EQ(r.summary.jobs_submitted, 2);
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 0);
}

TEST(EngineTest, MaxJobsKeepsTheFirstUnfinishedJobsInPlay) {
  // Three one-node jobs on three nodes, submitted at 0, 1 and 2; `a` is done
  // at t = 100 (10 samples/s). With max_jobs = 2 only `a` and `b` are in
  // play (BFTrainer's maxJ): `c` waits for `a` to finish although a node is
  // free; without the limit it starts at once.
  auto job = [](const std::string& name, int64_t submit, double work) {
    MixJob j = Job(name, 1, 1, work);
    j.submit_time = T(submit);
    return j;
  };
  const std::vector<MixJob> jobs = {job("a", 0, 1000), job("b", 1, 1e9), job("c", 2, 1e9)};
  constexpr char kThree[] = "0,n0,1\n0,n1,1\n0,n2,1\n1000,n0,1\n";
  SimOptions o = Dp();
  o.max_jobs = 2;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kThree), jobs, o));
  EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("0 a 0->1", "1 b 0->1", "100 c 0->1"));
  EXPECT_EQ(r.jobs[0].finish, T(100));

  o.max_jobs = 0;
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kThree), jobs, o));
  EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("0 a 0->1", "1 b 0->1", "2 c 0->1"));
}

TEST(EngineTest, MaxJobsCountsPreemptedJobsAsInPlay) {
  // `a` is preempted at t = 50 (its node is reclaimed) and waits; it stays
  // in play, so with max_jobs = 1 `b` cannot take the other node.
  MixJob a = Job("a", 1, 1, 1e9);
  MixJob b = Job("b", 1, 1, 1e9);
  b.submit_time = T(1);
  SimOptions o = Dp();
  o.max_jobs = 1;
  ASSERT_OK_AND_ASSIGN(
      SimResult r, Simulate(Trace("0,n0,1\n0,n1,0\n50,n0,0\n50,n1,1\n1000,n1,1\n"), {a, b}, o));
  EXPECT_THAT(EventsOf(r, "preempt"), ElementsAre("50 a 0->0"));
  EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("0 a 0->1", "50 a 0->1"));
  EXPECT_EQ(r.jobs[1].first_start, absl::InfiniteFuture());
}

TEST(EngineTest, OnDecisionSeesEveryProblemAndAnswer) {
  SimOptions o = Dp();
  int calls = 0;
  std::vector<size_t> jobs_seen;
  o.on_decision = [&](const alloc::Problem& p, const alloc::Decision& d, absl::Duration took) {
    ++calls;
    jobs_seen.push_back(p.jobs.size());
    EXPECT_EQ(d.policy, alloc::PolicyKind::kDp);
    EXPECT_EQ(d.allocation.jobs.size(), p.jobs.size());
    EXPECT_GE(took, absl::ZeroDuration());
  };
  MixJob later = Job("later", 1, 2, 1e9);
  later.submit_time = T(50);
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9), later}, o));
  EXPECT_EQ(calls, r.summary.decisions);
  // t = 0: j alone; t = 50: later arrives; t = 100: n1 becomes idle.
  EXPECT_THAT(jobs_seen, ElementsAre(1, 2, 2));
}

TEST(EngineTest, SkipSnapshotsAndAlignedSubmitTimes) {
  // Event times 0, 10, 20 (the trace ends at 1000); skipping one starts at 10.
  constexpr char kTrace[] = "0,n0,1\n10,n1,1\n20,n1,0\n1000,n0,1\n";
  SimOptions o = Dp();
  o.skip_snapshots = 1;
  MixJob j = Job("j", 1, 2, 1e9);
  j.submit_time = T(5000);
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kTrace), {j}, o));
  // n0's idle state at 0 is applied before the start; the job arrives at
  // the replay start (aligned), starts on both nodes, loses n1 at 20.
  EXPECT_EQ(r.jobs[0].submit, T(10));
  EXPECT_EQ(r.jobs[0].first_start, T(10));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 10 - 20 * 5 + 10 * 980);
  EXPECT_DOUBLE_EQ(r.summary.idle_node_hours, (2 * 10 + 980) / 3600.0);
  EXPECT_EQ(r.events.front().time, T(10));

  o.end = T(500);
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kTrace), {j}, o));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 10 - 20 * 5 + 10 * 480);

  // Without alignment the job arrives at 5000, after the trace.
  o = Dp();
  o.skip_snapshots = 1;
  o.align_submit_times = false;
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kTrace), {j}, o));
  EXPECT_EQ(r.summary.jobs_submitted, 0);
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 0);

  // The row at 1000 repeats n0's state: 3 distinct event times (0, 10, 20).
  o.skip_snapshots = 3;
  EXPECT_THAT(Simulate(Trace(kTrace), {j}, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("skip_snapshots")));
  o.skip_snapshots = 2;  // starts at 20
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kTrace), {j}, o));
  EXPECT_DOUBLE_EQ(r.summary.idle_node_hours, 980 / 3600.0);
  o.start = T(1000);  // nothing left to replay
  EXPECT_THAT(Simulate(Trace(kTrace), {j}, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("start")));
}

TEST(EngineTest, SameInputsSameEvents) {
  auto run = [] {
    auto r = Simulate(Trace("0,n0,1\n0,n1,1\n0,n2,1\n300,n1,0\n400,n1,1\n900,n2,0\n1000,n0,1\n"),
                      {Job("a", 1, 3, 1e9), Job("b", 1, 2, 4000, 15)}, Dp());
    EXPECT_TRUE(r.ok()) << r.status();
    for (EventRecord& e : r->events) e.decision_ms = 0;
    return EventsToCsv(r->events) + JobsToCsv(r->jobs);
  };
  const std::string first = run();
  EXPECT_GT(first.size(), 500u);
  EXPECT_EQ(first, run());
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

TEST(EngineTest, LearnedCurveOfALinearJobMatchesOracle) {
  SimOptions o = Dp();
  o.curves = CurveMode::kLearned;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9)}, o));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 18900);
}

TEST(EngineTest, LearnedCurvesOnlySeeObservedSizes) {
  // `b` runs alone on n0 from 0 (5/s on one node); at 100 n1 appears and
  // `a` (10/s, one node at most) arrives. b's true curve is super-linear:
  // 30/s on two nodes.
  MixJob b = Job("b", 1, 2, 1e9);
  b.throughput = {{0, 0}, {1, 5}, {2, 30}};
  MixJob a = Job("a", 1, 1, 1e9);
  a.submit_time = T(100);
  // Oracle: growing b is worth 30 x 120 - 5 x 10 = 3550 > 5 x 120 + 10 x 120.
  ASSERT_OK_AND_ASSIGN(SimResult oracle, Simulate(Trace(kGrow), {b, a}, Dp()));
  EXPECT_THAT(EventsOf(oracle, "resize"), ElementsAre("0 b 0->1", "100 b 1->2"));
  EXPECT_DOUBLE_EQ(oracle.summary.samples_trained, 5 * 100 + 30 * 900 - 5 * 10);
  // Learned: b has only run on one node, so two nodes look like 10/s
  // (1150 < 1800): the node goes to `a`, and b stays under-allocated.
  SimOptions o = Dp();
  o.curves = CurveMode::kLearned;
  ASSERT_OK_AND_ASSIGN(SimResult learned, Simulate(Trace(kGrow), {b, a}, o));
  EXPECT_THAT(EventsOf(learned, "resize"), ElementsAre("0 b 0->1", "100 a 0->1"));
  EXPECT_DOUBLE_EQ(learned.summary.samples_trained, 5 * 1000 + 10 * 900);
}

TEST(EngineTest, NeverRunJobIsAssumedLinearFromMinNodes) {
  // b: 5/s on one node, 30/s on two; a: 10/s per node. Both wait at 0.
  MixJob b = Job("b", 1, 2, 1e9);
  b.throughput = {{0, 0}, {1, 5}, {2, 30}};
  ASSERT_OK_AND_ASSIGN(SimResult oracle,
                       Simulate(Trace(kTwoNodes), {Job("a", 1, 2, 1e9), b}, Dp()));
  EXPECT_THAT(EventsOf(oracle, "resize"), ElementsAre("0 b 0->2"));
  SimOptions o = Dp();
  o.curves = CurveMode::kLearned;
  ASSERT_OK_AND_ASSIGN(SimResult learned,
                       Simulate(Trace(kTwoNodes), {Job("a", 1, 2, 1e9), b}, o));
  EXPECT_THAT(EventsOf(learned, "resize"), ElementsAre("0 a 0->2"));
}

// b (5/s on one node, 30/s on two) runs alone on both nodes from 0; a (10/s
// per node) arrives at 100. Oracle and learned curves (b measured 30/s on two
// nodes) keep b; the linear assumption sees b as 5/s per node, 10/s on two,
// and hands both nodes to a.
TEST(EngineTest, LinearCurvesIgnoreWhatTheJobMeasured) {
  MixJob a = Job("a", 1, 2, 1e9);
  a.submit_time = T(100);
  MixJob b = Job("b", 1, 2, 1e9);
  b.throughput = {{0, 0}, {1, 5}, {2, 30}};
  SimOptions o = Dp();
  o.align_submit_times = false;
  for (CurveMode mode : {CurveMode::kOracle, CurveMode::kLearned}) {
    o.curves = mode;
    ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kTwoNodes), {a, b}, o));
    EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("0 b 0->2"));
  }
  o.curves = CurveMode::kLinear;
  ASSERT_OK_AND_ASSIGN(SimResult linear, Simulate(Trace(kTwoNodes), {a, b}, o));
  EXPECT_THAT(EventsOf(linear, "resize"), ElementsAre("0 b 0->2", "100 b 2->0", "100 a 0->2"));
}

TEST(EngineTest, OracleForecastAvoidsANodeReclaimedBeforeThePausePaysOff) {
  // n1 is idle for 5 s only (100-105); growing onto it costs a 10 s pause.
  constexpr char kShort[] = "0,n0,1\n0,n1,0\n100,n1,1\n105,n1,0\n1000,n0,1\n";
  SimOptions o = Dp();
  o.resize_cost = alloc::ResizeCostModel::kLostWork;
  ASSERT_OK_AND_ASSIGN(SimResult blind, Simulate(Trace(kShort), {Job("j", 1, 2, 1e9)}, o));
  EXPECT_THAT(EventsOf(blind, "resize"), ElementsAre("0 j 0->1", "100 j 1->2"));
  EXPECT_EQ(blind.summary.reclaims, 1);
  EXPECT_DOUBLE_EQ(blind.summary.samples_trained, 10 * 100 + 20 * 5 + 10 * 895 - 100 - 100);

  o.forecast = ForecastMode::kOracle;
  ASSERT_OK_AND_ASSIGN(SimResult oracle, Simulate(Trace(kShort), {Job("j", 1, 2, 1e9)}, o));
  EXPECT_THAT(EventsOf(oracle, "resize"), ElementsAre("0 j 0->1"));
  EXPECT_EQ(oracle.summary.reclaims, 0);
  EXPECT_DOUBLE_EQ(oracle.summary.samples_trained, 10 * 1000);
  EXPECT_DOUBLE_EQ(oracle.summary.efficiency, 1.0);
}

// The forecast splits the idle nodes into pools by horizon; a DP too
// small for them (max_work 1) cannot answer, the MILP does (the same
// decisions: both exact), and the replay counts and says so.
TEST(EngineTest, DecisionsTheDpCannotAnswerAreCountedAndWarned) {
  constexpr char kShort[] = "0,n0,1\n0,n1,0\n100,n1,1\n105,n1,0\n1000,n0,1\n";
  SimOptions o = Dp();
  o.resize_cost = alloc::ResizeCostModel::kLostWork;
  o.forecast = ForecastMode::kOracle;
  ASSERT_OK_AND_ASSIGN(SimResult dp, Simulate(Trace(kShort), {Job("j", 1, 2, 1e9)}, o));
  EXPECT_EQ(dp.summary.decisions_fell_back, 0);
  for (const std::string& w : dp.summary.warnings) EXPECT_THAT(w, Not(HasSubstr("fallback")));
  o.decide.dp.max_work = 1;
  ASSERT_OK_AND_ASSIGN(SimResult small, Simulate(Trace(kShort), {Job("j", 1, 2, 1e9)}, o));
  EXPECT_THAT(EventsOf(small, "resize"), ElementsAre("0 j 0->1"));
  EXPECT_DOUBLE_EQ(small.summary.samples_trained, dp.summary.samples_trained);
  EXPECT_GT(small.summary.decisions_fell_back, 0);
  EXPECT_LE(small.summary.decisions_fell_back, small.summary.decisions);
  EXPECT_THAT(small.summary.first_fallback_reason, HasSubstr("max_work"));
  EXPECT_THAT(small.summary.warnings,
              Contains(AllOf(HasSubstr(absl::StrCat(small.summary.decisions_fell_back, " of ",
                                                    small.summary.decisions, " decisions")),
                             HasSubstr("the milp answered"))));
}

TEST(EngineTest, EstimatedForecastLearnsFromPastFragments) {
  // n0 idle throughout; n1 idle for 5 s every 10 s (40 fragments).
  std::string rows = "0,n0,1\n0,n1,0\n";
  for (int k = 1; k <= 40; ++k) absl::StrAppend(&rows, 10 * k, ",n1,1\n", 10 * k + 5, ",n1,0\n");
  absl::StrAppend(&rows, "1000,n0,1\n");
  SimOptions o = Dp();
  o.resize_cost = alloc::ResizeCostModel::kLostWork;
  ASSERT_OK_AND_ASSIGN(SimResult blind, Simulate(Trace(rows), {Job("j", 1, 2, 1e9)}, o));
  EXPECT_EQ(blind.summary.resizes, 41);  // start + 40 grows
  EXPECT_EQ(blind.summary.reclaims, 40);
  // Estimated: no forecast until 32 fragments were seen; from the 33rd
  // appearance on, n1 is expected to stay 5 s and is not worth the pause.
  o.forecast = ForecastMode::kEstimated;
  ASSERT_OK_AND_ASSIGN(SimResult est, Simulate(Trace(rows), {Job("j", 1, 2, 1e9)}, o));
  EXPECT_EQ(est.summary.resizes, 33);
  EXPECT_EQ(est.summary.reclaims, 32);
  EXPECT_GT(est.summary.samples_trained, blind.summary.samples_trained);
}

TEST(EngineTest, CsvWriters) {
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kTwoNodes), {Job("j", 1, 2, 5000)}, Dp()));
  const std::string events = EventsToCsv(r.events);
  std::vector<std::string> lines = absl::StrSplit(events, '\n');
  EXPECT_EQ(lines[0], "time,kind,job,node,nodes_before,nodes_after,idle_nodes,used_nodes,decision_ms");
  EXPECT_THAT(lines, ::testing::Contains("0,resize,j,,0,2,2,2,0"));
  EXPECT_THAT(lines, ::testing::Contains("250,finish,j,,2,0,2,0,0"));
  EXPECT_THAT(lines, ::testing::Contains("0,idle,,n1,0,0,2,0,0"));
  EXPECT_EQ(JobsToCsv(r.jobs),
            "name,submit,first_start,finish,work_samples,samples_done,node_seconds,"
            "ideal_samples,resizes,preemptions,reclaims\n"
            "j,0,0,250,5000,5000,500,5000,1,0,0\n");
  Summary s;
  s.policy = "dp";
  s.samples_trained = 1.5;
  s.jobs_finished = 2;
  const std::string summaries = SummariesToCsv({s});
  EXPECT_THAT(summaries,
              HasSubstr("\ndp,1.5,0,0,0,0,0,2,0,0,0,0,0,0,0,0,0,nan,nan,nan,,0,0,0,nan,nan\n"));
  EXPECT_THAT(summaries, HasSubstr(",reclaims,decisions,decisions_fell_back,decision_p50_ms,"));
  EXPECT_THAT(summaries, HasSubstr(",wall_s,jct_mean_s,jct_median_s,makespan_s,preemption_cost,"
                                   "lost_to_preemptions,lost_to_snapshots,stops,jct_p95_s,"
                                   "jct_max_s\n"));
  // The mode's name, not its description (which has commas).
  EXPECT_THAT(SummariesToCsv({r.summary}), HasSubstr(",park,"));
  // Unstarted jobs leave first_start and finish empty.
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kTwoNodes), {Job("big", 3, 3, 5000)}, Dp()));
  EXPECT_THAT(JobsToCsv(r.jobs), HasSubstr("\nbig,0,,,5000,0,0,0,0,0,0\n"));
}

// Two nodes idle 0..1000, one-node jobs at 10 samples/s: a (100 s of work)
// and b (300 s) start at 0; c, submitted at 50, waits for a's node and runs
// 100..150. JCTs 100, 300, 100; the last finish is at 300.
TEST(EngineTest, JobCompletionTimesAndMakespan) {
  MixJob c = Job("c", 1, 1, 500);
  c.submit_time = T(50);
  const std::vector<MixJob> jobs = {Job("a", 1, 1, 1000), Job("b", 1, 1, 3000), c};
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kTwoNodes), jobs, Dp()));
  EXPECT_EQ(r.summary.jobs_finished, 3);
  EXPECT_EQ(r.jobs[2].finish, T(150));
  EXPECT_DOUBLE_EQ(r.summary.jct_mean_s, 500.0 / 3);
  EXPECT_DOUBLE_EQ(r.summary.jct_median_s, 100);
  EXPECT_DOUBLE_EQ(r.summary.makespan_s, 300);
  // The CSV carries the tail too (nearest-rank p95 of 100, 100, 300; max).
  EXPECT_THAT(SummariesToCsv({r.summary}), EndsWith(",300,300\n"));

  // A job that never finishes: JCTs of the finished ones only (even count:
  // the median is the mean of the middle two), and no makespan.
  MixJob d = Job("d", 1, 1, 1e9);
  d.submit_time = T(40);
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kTwoNodes), {jobs[0], jobs[1], d}, Dp()));
  EXPECT_EQ(r.summary.jobs_finished, 2);  // d takes a's node at 100 and keeps it
  EXPECT_DOUBLE_EQ(r.summary.jct_mean_s, 200);
  EXPECT_DOUBLE_EQ(r.summary.jct_median_s, 200);
  EXPECT_TRUE(std::isnan(r.summary.makespan_s));

  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kTwoNodes), {Job("big", 3, 3, 5000)}, Dp()));
  EXPECT_TRUE(std::isnan(r.summary.jct_mean_s));
  EXPECT_TRUE(std::isnan(r.summary.jct_median_s));
}

// Tail JCT, samples per node-hour, the active-period figures and the
// decision latencies (same run as above: a 0..100, b 0..300, c 100..150).
TEST(EngineTest, ActivePeriodContentionAndTail) {
  MixJob c = Job("c", 1, 1, 500);
  c.submit_time = T(50);
  const std::vector<MixJob> jobs = {Job("a", 1, 1, 1000), Job("b", 1, 1, 3000), c};
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kTwoNodes), jobs, Dp()));
  EXPECT_DOUBLE_EQ(r.summary.jct_p95_s, 300);  // nearest rank of {100, 100, 300}
  EXPECT_DOUBLE_EQ(r.summary.jct_max_s, 300);
  // 4,500 samples on 100 + 300 + 50 node-seconds.
  EXPECT_DOUBLE_EQ(r.summary.samples_per_node_hour, 4500 / (450 / 3600.0));
  // Jobs present 0..300; 2 idle nodes all along; a, b and c could use 3
  // nodes from 50 to 100 only.
  EXPECT_DOUBLE_EQ(r.summary.active_hours, 300 / 3600.0);
  EXPECT_DOUBLE_EQ(r.summary.active_idle_node_hours, 600 / 3600.0);
  EXPECT_DOUBLE_EQ(r.summary.active_utilisation, 0.75);
  EXPECT_DOUBLE_EQ(r.summary.contended_fraction, 50.0 / 300);
  EXPECT_THAT(r.summary.warnings, ::testing::IsEmpty());
  EXPECT_GT(r.summary.decision_p50_ms, 0);
  EXPECT_LE(r.summary.decision_p50_ms, r.summary.decision_p99_ms);
  EXPECT_LE(r.summary.decision_p99_ms, r.summary.decision_max_ms);
}

TEST(EngineTest, WarnsWhenNothingCompetesOrJobsAreRarelyThere) {
  // One job on two idle nodes: it never wants more than there are.
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kTwoNodes), {Job("j", 1, 2, 5000)}, Dp()));
  EXPECT_DOUBLE_EQ(r.summary.contended_fraction, 0);
  EXPECT_THAT(r.summary.warnings,
              ElementsAre(HasSubstr("the policies hardly competed: the jobs present could use "
                                    "more nodes than were idle during 0.0% of their time")));
  // Done at 25 s of a 1,000-s replay: the whole-replay utilisation says little.
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kTwoNodes), {Job("k", 1, 2, 500)}, Dp()));
  EXPECT_THAT(r.summary.warnings,
              ::testing::Contains(HasSubstr("jobs were present during 2.5% of the replay only")));
  // Nothing finished.
  ASSERT_OK_AND_ASSIGN(r, Simulate(Trace(kTwoNodes), {Job("big", 3, 3, 5000)}, Dp()));
  EXPECT_THAT(r.summary.warnings, ::testing::Contains(HasSubstr("no job finished")));
}

// The reclaim hazard the policy is told: reclaims of idle nodes per idle
// node-second of the history. n0 flips idle/busy every 10 s from 0 to 800
// (40 reclaims, 400 idle node-seconds); the replay starts at 800.
TEST(EngineTest, ReclaimHazardFromTheHistory) {
  std::string rows;
  for (int t = 0; t < 800; t += 20) {
    absl::StrAppend(&rows, t, ",n0,1\n", t + 10, ",n0,0\n");
  }
  absl::StrAppend(&rows, "0,n1,0\n800,n0,1\n800,n1,1\n1000,n0,1\n");
  // Rows must be in time order: n1's initial state goes with time 0.
  std::vector<std::string> lines = absl::StrSplit(rows, '\n', absl::SkipEmpty());
  std::stable_sort(lines.begin(), lines.end(), [](const std::string& a, const std::string& b) {
    return std::stoi(a) < std::stoi(b);
  });
  const IdleTrace trace = Trace(absl::StrCat(absl::StrJoin(lines, "\n"), "\n"));
  auto rates = [&](bool hazard) {
    std::vector<double> seen;
    SimOptions o = Dp();
    o.skip_snapshots = 80;  // times 0, 10, ..., 790 skipped
    o.reclaim_hazard = hazard;
    o.on_decision = [&seen](const alloc::Problem& p, const alloc::Decision&, absl::Duration) {
      seen.push_back(p.reclaim_rate);
    };
    absl::StatusOr<SimResult> r = Simulate(trace, {Job("j", 1, 2, 1e9)}, o);
    EXPECT_TRUE(r.ok()) << r.status();
    return seen;
  };
  EXPECT_THAT(rates(true), ElementsAre(40.0 / 400));
  EXPECT_THAT(rates(false), ElementsAre(0.0));
}

// Rank weights end to end (alloc::Problem::rank_weight_exponent), by hand:
// 2 nodes from 0 to 1000 s, two jobs at 0, 10 samples/s on 1 node and 18 on
// 2, long L (4,000 samples) and short S (1,000); speedup objective, 30-s
// window. Without weights (1, 1) is worth 30 + 30 = 60 against 1.8 x 30 = 54
// for one job on both: S finishes at 100 s, L grows then (paying 10/s x 10 s
// of up pause: 3,100 left at 18/s) and finishes at 100 + 3100 / 18. With
// exponent 1, S (100 node-s left against L's 400) weighs 2: S on both nodes
// is worth 2 x 54 = 108 > 30 + 60, so S finishes at 1000 / 18 and L starts
// then on both (a start is free) and finishes 4000 / 18 later. The mean JCT
// falls from 186.1 s to 166.7 s, the last finish moves from 272.2 s to
// 277.8 s: finishing the short job first, what rank weights are for.
TEST(EngineTest, RankWeightsFinishTheShortJobFirst) {
  std::vector<MixJob> jobs = {Job("L", 1, 2, 4000), Job("S", 1, 2, 1000)};
  for (MixJob& j : jobs) j.throughput = {{0, 0}, {1, 10}, {2, 18}};
  SimOptions o = Dp();
  o.objective = alloc::Objective::kSpeedup;
  o.forward_window = absl::Seconds(30);
  ASSERT_OK_AND_ASSIGN(SimResult plain, Simulate(Trace(kTwoNodes), jobs, o));
  EXPECT_EQ(plain.jobs[1].finish, T(100));
  EXPECT_NEAR(absl::ToDoubleSeconds(plain.jobs[0].finish - T(0)), 100 + 3100.0 / 18, 1e-6);
  EXPECT_NEAR(plain.summary.jct_mean_s, (100 + 100 + 3100.0 / 18) / 2, 1e-6);

  o.rank_weight_exponent = 1;
  ASSERT_OK_AND_ASSIGN(SimResult ranked, Simulate(Trace(kTwoNodes), jobs, o));
  EXPECT_THAT(EventsOf(ranked, "resize"), ElementsAre("0 S 0->2", "55 L 0->2"));
  EXPECT_NEAR(absl::ToDoubleSeconds(ranked.jobs[1].finish - T(0)), 1000.0 / 18, 1e-6);
  EXPECT_NEAR(absl::ToDoubleSeconds(ranked.jobs[0].finish - T(0)), 5000.0 / 18, 1e-6);
  EXPECT_NEAR(ranked.summary.jct_mean_s, (1000.0 / 18 + 5000.0 / 18) / 2, 1e-6);
  EXPECT_LT(ranked.summary.jct_mean_s, plain.summary.jct_mean_s);

  o.rank_weight_exponent = -0.5;
  EXPECT_THAT(Simulate(Trace(kTwoNodes), jobs, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank_weight_exponent: must be finite and >= 0, got -0.5")));
}

// A job about to finish keeps its node. One node idle from 0 to 1000 s; S1
// (1,000 samples at 10/s) at 0, S2 (the same) at 99 s, when S1 has a second
// left; speedup objective, rank weights, 120-s window. S1 ranks first (10
// node-s left against 100). Were its staying capped at what it has left, it
// would be worth 1 s x weight 2 against S2's 120 s x 1, and be stopped at 99
// s (parked, resumed after S2: done at 209 s). Staying is credited the whole
// window (its finish frees the node for the next decision): S1 is done at
// 100 s and S2 at 200 s, no preemption.
TEST(EngineTest, AJobAboutToFinishKeepsItsNode) {
  std::vector<MixJob> jobs = {Job("S1", 1, 1, 1000), Job("S2", 1, 1, 1000)};
  jobs[1].submit_time = absl::FromUnixSeconds(99);
  SimOptions o = Dp();
  o.objective = alloc::Objective::kSpeedup;
  o.rank_weight_exponent = 1;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace("0,n0,1\n1000,n0,1\n"), jobs, o));
  EXPECT_THAT(EventsOf(r, "finish"), ElementsAre("100 S1 1->0", "200 S2 1->0"));
  EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("0 S1 0->1", "100 S2 0->1"));
  EXPECT_EQ(r.summary.stops, 0);
}

// Aging (SimOptions::rank_aging) end to end, by hand: one node idle from 0
// to 1000 s; jobs of 10 samples/s on their one node: L (3,000 samples, 300
// node-s) and S1 (1,000) at 0, S2 (1,000) at 90; speedup objective, rank
// weights, a 5-s window (so no job's credit is capped by its work left).
// Without aging the shorter job always goes first: S1 0-100, S2 100-200, L
// 200-500 (JCTs 100, 110, 500). Aged over 20 s, at 100 s L ranks as 300 /
// (1 + 100 / 20) = 50 and S2 as 100 / (1 + 10 / 20) = 66.7, so L runs
// 100-400 and S2 400-500: the longest JCT falls from 500 to 410 s, the mean
// rises from 236.7 to 303.3 s (the trade aging makes). Aged over 100 s, L
// ranks as 150 at 100 s, S2 as 90.9: the order without aging.
TEST(EngineTest, AgingLetsTheLongJobThatWaitedGoFirst) {
  std::vector<MixJob> jobs = {Job("L", 1, 1, 3000), Job("S1", 1, 1, 1000), Job("S2", 1, 1, 1000)};
  jobs[2].submit_time = absl::FromUnixSeconds(90);
  SimOptions o = Dp();
  o.objective = alloc::Objective::kSpeedup;
  o.forward_window = absl::Seconds(5);
  o.rank_weight_exponent = 1;
  constexpr char kOneNode[] = "0,n0,1\n1000,n0,1\n";
  ASSERT_OK_AND_ASSIGN(SimResult plain, Simulate(Trace(kOneNode), jobs, o));
  EXPECT_THAT(EventsOf(plain, "finish"), ElementsAre("100 S1 1->0", "200 S2 1->0", "500 L 1->0"));
  EXPECT_NEAR(plain.summary.jct_max_s, 500, 1e-6);

  o.rank_aging = absl::Seconds(20);
  ASSERT_OK_AND_ASSIGN(SimResult aged, Simulate(Trace(kOneNode), jobs, o));
  EXPECT_THAT(EventsOf(aged, "finish"), ElementsAre("100 S1 1->0", "400 L 1->0", "500 S2 1->0"));
  EXPECT_NEAR(aged.summary.jct_max_s, 410, 1e-6);
  EXPECT_NEAR(aged.summary.jct_mean_s, (100 + 400 + 410) / 3.0, 1e-6);
  EXPECT_NEAR(plain.summary.jct_mean_s, (100 + 110 + 500) / 3.0, 1e-6);

  o.rank_aging = absl::Seconds(100);
  ASSERT_OK_AND_ASSIGN(SimResult mild, Simulate(Trace(kOneNode), jobs, o));
  EXPECT_THAT(EventsOf(mild, "finish"), ElementsAre("100 S1 1->0", "200 S2 1->0", "500 L 1->0"));

  o.rank_aging = absl::ZeroDuration();
  EXPECT_THAT(Simulate(Trace(kOneNode), jobs, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank_aging: must be > 0 (infinite: off), got 0")));
  o.rank_aging = absl::Seconds(20);
  o.rank_weight_exponent = 0;
  EXPECT_THAT(Simulate(Trace(kOneNode), jobs, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank_aging: is 20s, but rank weights are off")));
}

// The target "at least as good as every baseline on samples per node-hour,
// mean and p95 JCT and efficiency" cannot be met by any schedule, in
// general. Two identical jobs on two nodes, r(1) = 10/s, r(2) = 18/s, 1,000
// samples each. Equal share runs each on one node: both done at 100 s, 10
// samples per node-second, the most any schedule can have (r(n)/n <= 10, and
// = 10 only at one node without a pause). Static runs them one after the
// other on two nodes: 55.6 s and 111.1 s, mean 83.3 s, 9 per node-second.
// A schedule with equal share's samples per node-hour keeps both jobs on one
// node all along, so each takes >= 1,000 / 10 = 100 s: its mean JCT is >=
// 100 s > static's 83.3 s. Each baseline dominates neither; no schedule is at
// least as good as both.
TEST(EngineTest, NoScheduleBeatsStaticAndEqualShareAtOnce) {
  std::vector<MixJob> jobs = {Job("a", 1, 2, 1000), Job("b", 1, 2, 1000)};
  for (MixJob& j : jobs) j.throughput = {{0, 0}, {1, 10}, {2, 18}};
  auto run = [&](alloc::PolicyKind k) {
    SimOptions o;
    o.decide.policy = k;
    absl::StatusOr<SimResult> r = Simulate(Trace(kTwoNodes), jobs, o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->summary : Summary{};
  };
  const Summary equal = run(alloc::PolicyKind::kEqualShare);
  const Summary fixed = run(alloc::PolicyKind::kStatic);
  EXPECT_EQ(equal.jobs_finished, 2);
  EXPECT_DOUBLE_EQ(equal.jct_mean_s, 100);
  EXPECT_DOUBLE_EQ(equal.jct_p95_s, 100);
  EXPECT_DOUBLE_EQ(equal.samples_per_node_hour, 10 * 3600);
  EXPECT_DOUBLE_EQ(equal.efficiency, 1);
  EXPECT_EQ(fixed.jobs_finished, 2);
  EXPECT_NEAR(fixed.jct_mean_s, (1000.0 / 18 + 2000.0 / 18) / 2, 1e-6);
  EXPECT_NEAR(fixed.jct_p95_s, 2000.0 / 18, 1e-6);
  EXPECT_NEAR(fixed.samples_per_node_hour, 9 * 3600, 1e-6);
  EXPECT_DOUBLE_EQ(fixed.efficiency, 1);

  // The bound: the most samples per node-hour any schedule can have, and the
  // least mean JCT of a schedule that has it (every job on its most
  // efficient size all along, from its arrival at 0).
  double best_per_node = 0, least_mean_jct = 0;
  for (const MixJob& j : jobs) {
    int best_n = 0;
    double best = 0;
    for (const auto& [n, rate] : j.throughput) {
      if (n > 0 && rate / n > best) best = rate / n, best_n = n;
    }
    best_per_node = std::max(best_per_node, best);
    least_mean_jct += j.work_samples / (best * best_n) / jobs.size();
  }
  EXPECT_DOUBLE_EQ(equal.samples_per_node_hour, best_per_node * 3600);
  EXPECT_GT(least_mean_jct, fixed.jct_mean_s);

  EXPECT_THAT(WorseUserFigures(fixed, equal), ElementsAre("samples/nh", "JCT p95"));
  EXPECT_THAT(WorseUserFigures(equal, fixed), ElementsAre("JCT mean"));
  EXPECT_FALSE(DominatedOnUserFigures(fixed, equal));
  EXPECT_FALSE(DominatedOnUserFigures(equal, fixed));
  EXPECT_FALSE(DominatedOnUserFigures(equal, equal));

  // Our policies land on one side or the other, dominated by neither.
  for (alloc::PolicyKind k : {alloc::PolicyKind::kDp, alloc::PolicyKind::kMilp}) {
    const Summary ours = run(k);
    EXPECT_FALSE(DominatedOnUserFigures(ours, equal)) << alloc::PolicyName(k);
    EXPECT_FALSE(DominatedOnUserFigures(ours, fixed)) << alloc::PolicyName(k);
    EXPECT_FALSE(WorseUserFigures(ours, equal).empty() && WorseUserFigures(ours, fixed).empty())
        << alloc::PolicyName(k);
  }

  // A policy worse on one figure and no better on any is dominated; NaN (no
  // job finished) is worse than any figure.
  Summary worse = equal;
  worse.jct_p95_s = 101;
  EXPECT_TRUE(DominatedOnUserFigures(worse, equal));
  EXPECT_THAT(WorseUserFigures(worse, equal), ElementsAre("JCT p95"));
  worse.jct_mean_s = std::nan("");
  EXPECT_THAT(WorseUserFigures(worse, equal), ElementsAre("JCT mean", "JCT p95"));
  EXPECT_THAT(WorseUserFigures(equal, worse), ::testing::IsEmpty());
}

TEST(EngineTest, HandBuiltTraceWithoutEnd) {
  IdleTrace t;
  t.nodes = {"a", "b"};
  t.events = {{T(0), 0, true}, {T(0), 1, true}, {T(100), 1, false}};
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(t, {Job("j", 1, 2, 1e9)}, Dp()));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 20 * 100);
}

// Two classes over the trace's nodes in order: n0 in the first, n1 in the
// second.
SimOptions TwoClasses(double speed0, const std::string& group0, double speed1,
                      const std::string& group1, double cross_locality_factor = 1.0) {
  SimOptions o = Dp();
  o.node_classes = {{{"a", group0, speed0}, 0.5}, {{"b", group1, speed1}, 0.5}};
  o.cross_locality_factor = cross_locality_factor;
  return o;
}

TEST(EngineTest, NodeClassesSetTheRate) {
  // n0 at speed 1, n1 at 0.75: on both, 20/s x 0.75 = 15/s beats 10/s on
  // n0 alone, so the DP runs the job on both for 1,000 s (the start is free).
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kTwoNodes), {Job("j", 1, 2, 1e9)},
                                             TwoClasses(1.0, "g", 0.75, "g")));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 15000);
  EXPECT_DOUBLE_EQ(r.jobs[0].ideal_samples, 15000);
  EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("0 j 0->2"));

  // At 0.4 the slow node would bring the job down to 8/s: it runs on n0
  // alone (the allocator sees the classes too).
  ASSERT_OK_AND_ASSIGN(
      r, Simulate(Trace(kTwoNodes), {Job("j", 1, 2, 1e9)}, TwoClasses(1.0, "g", 0.4, "g")));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 10000);
  EXPECT_THAT(EventsOf(r, "resize"), ElementsAre("0 j 0->1"));

  // Two locality groups: spanning them costs the factor, 20 x 0.8 = 16/s.
  ASSERT_OK_AND_ASSIGN(
      r, Simulate(Trace(kTwoNodes), {Job("j", 1, 2, 1e9)}, TwoClasses(1.0, "g0", 1.0, "g1", 0.8)));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 16000);
  EXPECT_DOUBLE_EQ(r.jobs[0].node_seconds, 2000);
}

TEST(EngineTest, NodeClassesChargeAShrinkAtTheRateBeforeIt) {
  // 15/s on n0 (speed 1) and n1 (0.75) until n1 is reclaimed at 500, then
  // 10/s; the forced shrink costs the rate before it (15/s) x the 5 s down
  // pause (BFTrainer's accounting).
  ASSERT_OK_AND_ASSIGN(
      SimResult r, Simulate(Trace("0,n0,1\n0,n1,1\n500,n1,0\n1000,n0,1\n"), {Job("j", 1, 2, 1e9)},
                            TwoClasses(1.0, "g", 0.75, "g")));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 15 * 500 + 10 * 500 - 15 * 5);
  EXPECT_DOUBLE_EQ(r.summary.lost_to_reclaims, 75);

  // Reclaimed below min_nodes: the park is charged at the rate before too
  // (the default park cost's time x 15/s, not x 20/s).
  SimOptions o = TwoClasses(1.0, "g", 0.75, "g");
  o.preemption.mode = PreemptionCost::kPark;
  ASSERT_OK_AND_ASSIGN(
      r, Simulate(Trace("0,n0,1\n0,n1,1\n500,n1,0\n1000,n0,1\n"), {Job("j", 2, 2, 1e9)}, o));
  EXPECT_EQ(r.summary.preemptions, 1);
  EXPECT_DOUBLE_EQ(r.jobs[0].lost_to_preemptions,
                   15 * absl::ToDoubleSeconds(o.preemption.ParkTime()));
}

TEST(EngineTest, BadNodeClassesNameTheProblem) {
  auto fails_on = [](const SimOptions& o, const std::string& what) {
    EXPECT_THAT(Simulate(Trace(kTwoNodes), {Job("j", 1, 2, 1e9)}, o).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(what)));
  };
  SimOptions o = TwoClasses(1.0, "g", 0.5, "g");
  o.node_classes[1].share = 0.4;
  fails_on(o, "node_classes: the shares must sum to 1, they sum to 0.9");
  o = TwoClasses(1.0, "g", 0.5, "g");
  o.node_classes[1].share = 0;
  fails_on(o, "node_classes[1] (b).share: must be finite and > 0");
  o = TwoClasses(1.0, "g", 0.0, "g");
  fails_on(o, "node_classes[1] (b).speed: must be finite and > 0");
  o = TwoClasses(1.0, "g", 0.5, "g");
  o.node_classes[1].node_class.id = "a";
  fails_on(o, "node_classes[1].id: \"a\" names two classes");
  o.node_classes[1].node_class.id = "";
  fails_on(o, "node_classes[1].id: must not be empty");
  fails_on(TwoClasses(1.0, "g0", 1.0, "g1", 1.5), "cross_locality_factor: must be in (0, 1]");
  fails_on(TwoClasses(1.0, "g0", 1.0, "g1", 0.0), "cross_locality_factor");
}

TEST(EngineTest, ParseNodeClassShares) {
  ASSERT_OK_AND_ASSIGN(std::vector<NodeClassShare> c,
                       ParseNodeClassShares("fast:r0:1:0.25,slow:r1:0.85:0.75"));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].node_class.id, "fast");
  EXPECT_EQ(c[0].node_class.locality, "r0");
  EXPECT_DOUBLE_EQ(c[0].node_class.speed, 1.0);
  EXPECT_DOUBLE_EQ(c[0].share, 0.25);
  EXPECT_EQ(c[1].node_class.id, "slow");
  EXPECT_EQ(c[1].node_class.locality, "r1");
  EXPECT_DOUBLE_EQ(c[1].node_class.speed, 0.85);
  EXPECT_DOUBLE_EQ(c[1].share, 0.75);
  EXPECT_THAT(
      ParseNodeClassShares("fast:r0:1:1,slow:r1:0.85").status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("item 2 'slow:r1:0.85': expected id:locality:speed:share, got 3")));
  EXPECT_THAT(
      ParseNodeClassShares("fast:r0:quick:1").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("speed 'quick' is not a number")));
  EXPECT_THAT(ParseNodeClassShares("fast:r0:1:").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("share '' is not a number")));
  EXPECT_THAT(ParseNodeClassShares(":r0:1:1").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty id")));
}

TEST(EngineTest, BadOptionsNameTheField) {
  auto fails_on = [](const SimOptions& o, const std::string& field) {
    EXPECT_THAT(Simulate(Trace(kGrow), {Job("j", 1, 2, 1e9)}, o).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field)));
  };
  SimOptions o = Dp();
  o.max_waiting = -1;
  fails_on(o, "max_waiting");
  o = Dp();
  o.debounce = absl::Seconds(-1);
  fails_on(o, "debounce");
  o = Dp();
  o.forward_window = absl::ZeroDuration();
  fails_on(o, "forward_window");
  o.forward_window = absl::InfiniteDuration();
  fails_on(o, "forward_window");
  o = Dp();
  o.timeline_step = absl::ZeroDuration();
  fails_on(o, "timeline_step");
  o = Dp();
  o.start = T(500);
  o.end = T(500);
  fails_on(o, "start");
  o = Dp();
  o.skip_snapshots = -1;
  fails_on(o, "skip_snapshots");
  o = Dp();
  o.learned_warmup = absl::Seconds(-1);
  fails_on(o, "learned_warmup");
  o = Dp();
  o.max_jobs = -1;
  fails_on(o, "max_jobs");
  o = Dp();
  o.preemption.mode = static_cast<PreemptionCost>(7);
  fails_on(o, "preemption.mode");
  o = Dp();
  o.preemption.state_bytes = -1;
  fails_on(o, "preemption.state_bytes");
  o = Dp();
  o.preemption.write_bytes_per_s = 0;
  fails_on(o, "preemption.write_bytes_per_s");
  o = Dp();
  o.preemption.read_bytes_per_s = std::nan("");
  fails_on(o, "preemption.read_bytes_per_s");
  o = Dp();
  o.preemption.copy_bytes_per_s = -5;
  fails_on(o, "preemption.copy_bytes_per_s");
  o = Dp();
  o.preemption.park_fixed = absl::Seconds(-1);
  fails_on(o, "preemption.park_fixed");
  o = Dp();
  o.preemption.unpark_fixed = absl::InfiniteDuration();
  fails_on(o, "preemption.unpark_fixed");
  o = Dp();
  o.preemption.snapshot_interval = absl::Seconds(-1);
  fails_on(o, "preemption.snapshot_interval");
  o = Dp();
  o.preemption.snapshot_budget = 0;
  fails_on(o, "preemption.snapshot_budget");
  o = Dp();
  o.preemption.mode = PreemptionCost::kSnapshot;
  o.preemption.state_bytes = 0;  // the adaptive interval would be 0
  fails_on(o, "preemption.snapshot_interval");
  EXPECT_THAT(Simulate(IdleTrace{}, {}, Dp()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("trace")));
  IdleTrace bad;
  bad.nodes = {"a"};
  bad.events = {{T(0), 0, true}, {T(10), 1, false}};
  EXPECT_THAT(Simulate(bad, {}, Dp()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("trace: events[1].node")));
  bad.events = {{T(10), 0, true}, {T(0), 0, false}};
  EXPECT_THAT(Simulate(bad, {}, Dp()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("earlier")));
  // An empty mix is fine: nothing is trained.
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(Trace(kGrow), {}, Dp()));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 0);
  EXPECT_EQ(r.summary.jobs_submitted, 0);
}

// A synthetic machine of `nodes` nodes over `days` days: each node is idle
// for `fragments` stretches of 1 to 30 minutes (about 10 % idle with 10 a
// day), times on whole minutes like Summit's snapshots.
IdleTrace SyntheticTrace(int nodes, double days, int fragments) {
  IdleTrace t;
  for (int n = 0; n < nodes; ++n) t.nodes.push_back(absl::StrCat("c", n));
  uint64_t x = 12345;
  auto next = [&x]() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  const int64_t span = static_cast<int64_t>(days * 86400) / 60;  // minutes
  struct Change {
    int64_t minute;
    int node;
    bool idle;
  };
  std::vector<Change> changes;
  for (int n = 0; n < nodes; ++n) {
    std::vector<std::pair<int64_t, int64_t>> frags;
    for (int k = 0; k < fragments; ++k) {
      const int64_t from = static_cast<int64_t>(next() % span);
      frags.push_back({from, std::min(span, from + 1 + static_cast<int64_t>(next() % 30))});
    }
    std::sort(frags.begin(), frags.end());
    int64_t last_end = -1;
    for (const auto& [from, to] : frags) {
      if (from <= last_end) continue;  // overlaps (or touches) the previous one
      changes.push_back({from, n, true});
      changes.push_back({to, n, false});
      last_end = to;
    }
  }
  std::stable_sort(changes.begin(), changes.end(),
                   [](const Change& a, const Change& b) { return a.minute < b.minute; });
  for (const Change& c : changes) t.events.push_back({T(1600000000 + 60 * c.minute), c.node, c.idle});
  t.start = t.events.front().time;
  t.end = T(1600000000 + 60 * span);
  return t;
}

TEST(EngineSpeed, SyntheticMachineWithManyJobs) {
  const IdleTrace trace = SyntheticTrace(4600, 1, 10);
  std::vector<MixJob> jobs;
  for (int k = 0; k < 200; ++k) {
    MixJob j = Concave(absl::StrCat("j", k), 2e5);
    j.submit_time = T(k * 300);
    jobs.push_back(j);
  }
  SimOptions o = Dp();
  o.record_events = false;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(trace, jobs, o));
  std::printf("synthetic: %zu events, %d decisions, %.2f s (%.0f events/s)\n",
              trace.events.size(), r.summary.decisions, r.summary.wall_s,
              trace.events.size() / std::max(1e-9, r.summary.wall_s));
  EXPECT_EQ(r.summary.jobs_submitted, 200);
  EXPECT_GT(r.summary.jobs_finished, 0);
  EXPECT_LE(r.summary.used_node_hours, r.summary.idle_node_hours + 1e-9);
  EXPECT_LE(r.summary.efficiency, 1.0 + 1e-12);
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

absl::Time ReplayStart(const IdleTrace& trace, int skip) {
  absl::Time start = trace.events.front().time;
  for (size_t i = 1, distinct = 0; i < trace.events.size() && distinct < static_cast<size_t>(skip);
       ++i) {
    if (trace.events[i].time != trace.events[i - 1].time) {
      ++distinct;
      start = trace.events[i].time;
    }
  }
  return start;
}

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
  o.end = ReplayStart(trace, 999) + absl::Hours(1);
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(trace, mix.jobs, o));
  EXPECT_GT(r.summary.resizes, 0);
  EXPECT_LE(r.summary.used_node_hours, r.summary.idle_node_hours + 1e-9);
}

// Summit's first half hour at BFTrainer's start with 4 node classes (2 racks x
// speeds 1 and 0.85) and the oracle forecast: every decision has several
// pools, and every policy must answer each one with nodes it may use.
TEST(EngineRealData, NodeClassesAndForecastPoolsUnderEveryPolicy) {
  const std::string dir = MALLE_SHARED_DATA_DIR;
  if (access((dir + "/summit-idle-2021-02.csv.gz").c_str(), R_OK) != 0) {
    GTEST_SKIP() << dir << " is absent";
  }
  ASSERT_OK_AND_ASSIGN(IdleTrace trace, LoadIdleTrace(dir + "/summit-idle-2021-02.csv.gz"));
  ASSERT_OK_AND_ASSIGN(JobMix mix, LoadJobMix(dir + "/jobs-imagenet-1001.csv"));
  ASSERT_OK_AND_ASSIGN(
      std::vector<NodeClassShare> classes,
      ParseNodeClassShares("f0:r0:1:0.25,s0:r0:0.85:0.25,f1:r1:1:0.25,s1:r1:0.85:0.25"));
  for (alloc::PolicyKind k :
       {alloc::PolicyKind::kMilp, alloc::PolicyKind::kDp, alloc::PolicyKind::kGreedy,
        alloc::PolicyKind::kEqualShare, alloc::PolicyKind::kStatic}) {
    SimOptions o;
    o.decide.policy = k;
    o.decide.milp.isolation = alloc::SolveIsolation::kInProcess;
    o.forecast = ForecastMode::kOracle;
    o.node_classes = classes;
    o.cross_locality_factor = 0.9;
    o.skip_snapshots = 999;
    o.end = ReplayStart(trace, 999) + absl::Minutes(30);
    o.record_events = false;
    ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(trace, mix.jobs, o));
    SCOPED_TRACE(alloc::PolicyName(k));
    EXPECT_GT(r.summary.decisions, 10);
    EXPECT_GT(r.summary.samples_trained, 0);
    EXPECT_LE(r.summary.used_node_hours, r.summary.idle_node_hours + 1e-9);
    EXPECT_LE(r.summary.efficiency, 1.0 + 1e-12);
    if (k == alloc::PolicyKind::kMilp) {
      EXPECT_EQ(r.summary.decisions_fell_back, 0) << r.summary.first_fallback_reason;
    }
    if (k == alloc::PolicyKind::kGreedy) {
      // The same replay with every node at speed 1 trains more: half the
      // nodes run at 0.85, and jobs across the racks at 0.9.
      SimOptions plain = o;
      plain.node_classes.clear();
      ASSERT_OK_AND_ASSIGN(SimResult p, Simulate(trace, mix.jobs, plain));
      EXPECT_GT(p.summary.samples_trained, r.summary.samples_trained);
    }
  }
}

// The full 15-day replay (tens of seconds): run with
//   engine_test --gtest_also_run_disabled_tests --gtest_filter='*FullImageNet*'
TEST(EngineRealData, DISABLED_FullImageNetReplay) {
  const std::string dir = MALLE_SHARED_DATA_DIR;
  if (access((dir + "/summit-idle-2021-02.csv.gz").c_str(), R_OK) != 0) {
    GTEST_SKIP() << dir << " is absent";
  }
  const absl::Time t0 = absl::Now();
  ASSERT_OK_AND_ASSIGN(IdleTrace trace, LoadIdleTrace(dir + "/summit-idle-2021-02.csv.gz"));
  ASSERT_OK_AND_ASSIGN(JobMix mix, LoadJobMix(dir + "/jobs-imagenet-1001.csv"));
  std::printf("load: %.2f s, %zu events, %zu jobs\n", absl::ToDoubleSeconds(absl::Now() - t0),
              trace.events.size(), mix.jobs.size());
  SimOptions o;
  o.decide.policy = alloc::PolicyKind::kDp;
  o.skip_snapshots = 999;
  o.record_events = false;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(trace, mix.jobs, o));
  std::printf("%s", SummariesToCsv({r.summary}).c_str());
  EXPECT_EQ(r.summary.jobs_submitted, 1001);
  EXPECT_LT(r.summary.wall_s, 60);
}

}  // namespace
}  // namespace malle::sim
