// Engine pieces that need no peers: the advisor's per-step timing split
// (SampleOfStep, pure) and option checks. The engine itself runs in
// elastic_trainer_test (threads) and elastic_trainer_process_test
// (processes), and under Python in tests/python.
#include "libmalle/elastic/engine.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::elastic {
namespace {

using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

double S(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// A step of 40 ms: 2 ms waiting for data, the optimizer begins at 30 ms, the
// last bucket was launched at 25 ms (so the backward waited 5 ms for it), a
// boundary of 10 ms that changed nothing, 12 ms since the previous step ended.
StepTimes Step() {
  StepTimes t;
  t.data_wait = absl::Milliseconds(2);
  t.sync = absl::Milliseconds(30);
  t.reduced = absl::Milliseconds(30);
  t.end = absl::Milliseconds(40);
  t.last_hook = absl::Milliseconds(25);
  t.since_prev_end = absl::Milliseconds(12);
  t.boundary = absl::Milliseconds(10);
  return t;
}

TEST(SampleOfStepTest, TheBoundaryIsCommunicationBetweenRanksOnly) {
  // Two ranks: the boundary waits for the slowest peer, exposed communication.
  advisor::StepSample two = SampleOfStep(Step(), 2, false);
  EXPECT_NEAR(S(two.comm), 0.005 + 0.010, 1e-9);
  EXPECT_NEAR(S(two.compute), 0.030 - 0.002 - 0.005, 1e-9);
  EXPECT_NEAR(S(two.optimizer), 0.010, 1e-9);
  EXPECT_NEAR(S(two.total), 0.040 + 0.012, 1e-9);
  EXPECT_LE(S(two.data_wait + two.compute + two.comm + two.optimizer), S(two.total));
  EXPECT_OK(advisor::Validate([&] {
    advisor::StepSample s = two;
    s.step = 1, s.logical_workers = 4, s.local_batch = 8, s.global_batch = 16;
    return s;
  }()));
  // One rank: no peer to wait for; the boundary stays in the rest.
  advisor::StepSample one = SampleOfStep(Step(), 1, false);
  EXPECT_NEAR(S(one.comm), 0.005, 1e-9);
  EXPECT_NEAR(S(one.compute), S(two.compute), 1e-9);
  // No previous step end (the first step in this process, or after a redone
  // step): the boundary is still part of the step's total.
  StepTimes first = Step();
  first.since_prev_end.reset();
  advisor::StepSample s0 = SampleOfStep(first, 2, false);
  EXPECT_NEAR(S(s0.comm), 0.015, 1e-9);
  EXPECT_NEAR(S(s0.total), 0.040 + 0.010, 1e-9);
}

TEST(SampleOfStepTest, AResizePauseIsMeasuredApartAndDeterministicModeTimesTheRows) {
  StepTimes t = Step();
  t.boundary = absl::ZeroDuration();
  t.resize_pause = absl::Milliseconds(8);
  t.since_prev_end = absl::Milliseconds(20);  // 8 ms of it was the resize
  advisor::StepSample s = SampleOfStep(t, 2, false);
  EXPECT_NEAR(S(s.total), 0.040 + 0.012, 1e-9);
  EXPECT_NEAR(S(s.resize_pause), 0.008, 1e-9);
  t.reduced = absl::Milliseconds(36);  // the rows' allreduce took 6 ms
  advisor::StepSample d = SampleOfStep(t, 2, true);
  EXPECT_NEAR(S(d.comm), 0.006, 1e-9);
  EXPECT_NEAR(S(d.compute), 0.030 - 0.002 - 0.006, 1e-9);
  EXPECT_NEAR(S(d.optimizer), 0.004, 1e-9);
}

TEST(EngineOptionsTest, BadOptionsAreNamed) {
  struct Case {
    std::function<void(EngineOptions&)> edit;
    std::string want;
  };
  const Case cases[] = {
      {[](EngineOptions& o) { o.logical_workers = -1; }, "logical_workers: must be a positive integer"},
      {[](EngineOptions& o) { o.lr_scaling = "linear"; }, "lr_scaling: only without logical workers"},
      {[](EngineOptions& o) { o.logical_workers = 0; }, "lr_scaling: must be 'linear' or 'sqrt'"},
      {[](EngineOptions& o) { o.logical_workers = 0, o.lr_scaling = "sqrt", o.deterministic = true; },
       "deterministic: needs logical_workers"},
      {[](EngineOptions& o) { o.bucket_bytes = 0; }, "bucket_bytes: must be positive"},
      {[](EngineOptions& o) { o.backend = "mpi"; }, "backend: must be 'gloo' or 'nccl', got 'mpi'"},
      {[](EngineOptions& o) { o.min_nodes = 3, o.max_nodes = 2; }, "min_nodes/max_nodes"},
      {[](EngineOptions& o) { o.ranks_per_node = 0; }, "ranks_per_node: must be in [1, 1024]"},
  };
  for (const Case& c : cases) {
    EngineOptions o;
    o.logical_workers = 4;
    c.edit(o);
    EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.want))) << c.want;
  }
  EngineOptions ok;
  ok.logical_workers = 4;
  EXPECT_OK(ok.Validate());
}

}  // namespace
}  // namespace malle::elastic
