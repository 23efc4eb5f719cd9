// Engine pieces that need no peers: the advisor's per-step timing split
// (SampleOfStep, pure), option checks, and what a loader is given (BatchKeys,
// the steps of epochs) on a one-rank job. The engine itself runs in
// elastic_trainer_test (threads) and elastic_trainer_process_test
// (processes), and under Python in tests/python.
#include "libmalle/elastic/engine.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/group_options.h"
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

// Options for the one-rank jobs below: flat buckets after the backward, no
// advisor; `logical_workers` 0 is follow mode.
EngineOptions Plain(int logical_workers) {
  EngineOptions o;
  o.use_reducer = false;
  o.advisor = false;
  o.logical_workers = logical_workers;
  return o;
}

// A one-rank job over an in-memory store, with a model of one parameter.
struct OneRankJob {
  std::unique_ptr<Engine> engine;
  at::Tensor w;
  Engine* operator->() { return engine.get(); }
};

OneRankJob OneRank(const std::string& job, EngineOptions o, DataOptions d) {
  OneRankJob j;
  auto engine = Engine::Create(comm::ControlStore::InMemory(), comm::testing::GroupOptions(job, "m0", 1), o);
  EXPECT_OK(engine.status());
  if (!engine.ok()) return j;
  j.engine = *std::move(engine);
  j.w = at::zeros({3}).set_requires_grad(true);
  EXPECT_OK(j.engine->SetModel({{"w", j.w}}, {}));
  EXPECT_OK(j.engine->SetData(d));
  return j;
}

// Runs the step the engine planned and commits it.
void RunStep(OneRankJob& j, const StepPlan& plan) {
  Engine& e = *j.engine;
  for (size_t i = 0; i < plan.workers.size(); ++i) {
    e.BeginMicroBatch(i);
    j.w.sum().backward();
    ASSERT_OK(e.EndMicroBatch());
  }
  absl::StatusOr<bool> ok = e.Synchronize();
  ASSERT_OK(ok.status());
  ASSERT_TRUE(*ok);
  ASSERT_OK(e.Commit());
}

std::vector<std::pair<uint64_t, std::vector<int64_t>>> Keys(const StepPlan& plan) {
  std::vector<std::pair<uint64_t, std::vector<int64_t>>> out;
  for (const WorkerPlan& w : plan.workers) out.emplace_back(w.data_seed, w.indices);
  return out;
}

TEST(BatchKeysTest, AreThePlansOfTheStepsThatFollowAndSayWhenTheyStopFollowing) {
  for (const bool follow : {false, true}) {
    SCOPED_TRACE(follow ? "follow mode" : "logical workers");
    EngineOptions o = Plain(follow ? 0 : 3);
    if (follow) o.lr_scaling = "linear";
    DataOptions d;
    d.num_samples = 50;
    d.batch_size = 4;
    d.steps = 5;
    OneRankJob e = OneRank(follow ? "keys-follow" : "keys-l3", o, d);
    ASSERT_NE(e.engine, nullptr);
    absl::StatusOr<std::optional<StepPlan>> first = e->NextStep();
    ASSERT_OK(first.status());
    ASSERT_TRUE(first->has_value());
    absl::StatusOr<BatchKeys> keys = e->KeysFrom(**first);
    ASSERT_OK(keys.status());
    // What the keys serve, micro-batch after micro-batch, is what each plan says.
    std::vector<std::pair<uint64_t, std::vector<int64_t>>> served;
    while (std::optional<WorkerPlan> w = keys->Next()) served.emplace_back(w->data_seed, w->indices);
    const size_t per_step = (*first)->workers.size();
    ASSERT_EQ(served.size(), 5 * per_step);
    std::optional<StepPlan> plan = **first;
    for (int64_t s = 0; s < 5; ++s) {
      ASSERT_TRUE(plan.has_value());
      ASSERT_EQ(plan->step, s);
      if (s > 0) EXPECT_TRUE(keys->Follows(*plan, e->position())) << "step " << s;
      const auto want = Keys(*plan);
      EXPECT_EQ(std::vector(served.begin() + s * per_step, served.begin() + (s + 1) * per_step), want)
          << "step " << s;
      RunStep(e, *plan);
      absl::StatusOr<std::optional<StepPlan>> next = e->NextStep();
      ASSERT_OK(next.status());
      plan = *next;
    }
    EXPECT_FALSE(plan.has_value());
  }
}

TEST(BatchKeysTest, DoNotFollowARedoneStepOrAnotherSize) {
  const EngineOptions o = Plain(2);
  DataOptions d;
  d.num_samples = 50;
  d.batch_size = 4;
  d.steps = 4;
  OneRankJob e = OneRank("keys-redo", o, d);
  ASSERT_NE(e.engine, nullptr);
  absl::StatusOr<std::optional<StepPlan>> p0 = e->NextStep();
  ASSERT_OK(p0.status());
  absl::StatusOr<BatchKeys> keys = e->KeysFrom(**p0);
  ASSERT_OK(keys.status());
  EXPECT_FALSE(keys->Follows(**p0, e->position())) << "the same step again is a redo";
  StepPlan skipped = **p0;
  skipped.step += 2;
  EXPECT_FALSE(keys->Follows(skipped, e->position())) << "a step skipped";
  StepPlan resized = **p0;
  resized.step += 1;
  resized.size = 2;
  resized.workers.resize(1);
  EXPECT_FALSE(keys->Follows(resized, e->position())) << "another membership";
  StepPlan next = **p0;
  next.step += 1;
  EXPECT_TRUE(keys->Follows(next, e->position()));
  EXPECT_FALSE(keys->Follows(next, e->position())) << "once per step";
}

TEST(DataOptionsTest, DropLastFalseAddsTheTailStepAndNeedsEpochs) {
  const EngineOptions o = Plain(2);
  DataOptions d;
  d.num_samples = 50;  // one epoch = 50 / (2 x 4) = 6.25 steps
  d.batch_size = 4;
  d.epochs = 1;
  EXPECT_EQ(OneRank("drop-1", o, d)->total_steps(), 6);
  d.drop_last = false;
  EXPECT_EQ(OneRank("drop-2", o, d)->total_steps(), 7);
  d.num_samples = 48;  // exactly 6 steps: no tail to add
  EXPECT_EQ(OneRank("drop-3", o, d)->total_steps(), 6);
  d.epochs.reset();
  d.steps = 5;
  auto e = Engine::Create(comm::ControlStore::InMemory(), comm::testing::GroupOptions("drop-4", "m0", 1), o);
  ASSERT_OK(e.status());
  EXPECT_THAT((*e)->SetData(d), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("drop_last=False")));
}

}  // namespace
}  // namespace malle::elastic
