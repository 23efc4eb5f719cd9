#include "libmalle/advisor/advisor.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/advisor/report_json.h"
#include "tests/cpp/testing/status_matchers.h"
#include "tests/cpp/advisor/synthetic_job.h"

namespace malle::advisor {
namespace {

using ::malle::advisor::testing::kCommHeavy;
using ::malle::advisor::testing::kComputeBound;
using ::malle::advisor::testing::kOverlapped;
using ::malle::advisor::testing::kShape;
using ::malle::advisor::testing::Outliers;
using ::malle::advisor::testing::SyntheticJob;
using ::malle::advisor::testing::TrueModel;
using ::malle::advisor::testing::TrueThroughput;
using ::malle::testing::IsOk;
using ::malle::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

AdvisorOptions Options(int max_nodes = 16) {
  AdvisorOptions o;
  o.job_id = "synthetic";
  o.min_nodes = 1;
  o.max_nodes = max_nodes;
  return o;
}

std::unique_ptr<Advisor> Make(const AdvisorOptions& options) {
  absl::StatusOr<std::unique_ptr<Advisor>> advisor = Advisor::Create(options);
  EXPECT_TRUE(advisor.ok()) << advisor.status();
  return std::move(advisor).value();
}

// Every kind of outlier the advisor must shrug off.
Outliers Dirty() {
  Outliers o;
  o.slow_every = 20;  // a 5x slow step every 20 steps
  o.slow_after_resize = 3;
  o.warmup_steps = 5;
  o.pause = absl::Seconds(15);
  return o;
}

struct EndToEndCase {
  std::string name;
  TrueModel model;
  std::vector<int> sizes;   // run in this order, 120 steps each
  std::vector<int> unseen;  // predicted within 10%
};

void PrintTo(const EndToEndCase& c, std::ostream* os) { *os << c.name; }

class EndToEndTest : public ::testing::TestWithParam<EndToEndCase> {};

TEST_P(EndToEndTest, LearnsTheCurveFromNoisyStepsWithOutliers) {
  const EndToEndCase& c = GetParam();
  std::unique_ptr<Advisor> advisor = Make(Options(32));
  SyntheticJob job(c.model, kShape, /*seed=*/42);
  for (int n : c.sizes) job.Run(advisor.get(), n, 120, Dirty());
  const AdvisorReport r = advisor->Report();
  ASSERT_TRUE(r.model.fitted);
  EXPECT_THAT(ValidateReport(r), IsOk());
  ASSERT_EQ(r.curve.size(), 32u);
  for (const CurvePoint& p : r.curve) {
    const double truth = TrueThroughput(c.model, kShape, p.nodes);
    EXPECT_LE(p.lo, truth) << "n = " << p.nodes;
    EXPECT_GE(p.hi, truth) << "n = " << p.nodes;
  }
  for (int n : c.unseen) {
    const double truth = TrueThroughput(c.model, kShape, n);
    EXPECT_NEAR(r.curve[n - 1].samples_per_s / truth, 1.0, 0.10) << "n = " << n;
  }
  for (int n : c.sizes) {
    const double truth = TrueThroughput(c.model, kShape, n);
    EXPECT_NEAR(r.curve[n - 1].samples_per_s / truth, 1.0, 0.03) << "observed n = " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, EndToEndTest,
    ::testing::Values(EndToEndCase{"ComputeBound", kComputeBound, {1, 2, 4}, {3, 8, 16}},
                      EndToEndCase{"CommHeavy", kCommHeavy, {2, 4, 8}, {1, 3, 6, 16}},
                      EndToEndCase{"Overlapped", kOverlapped, {1, 2, 4, 8}, {3, 6, 16}}),
    [](const ::testing::TestParamInfo<EndToEndCase>& info) { return info.param.name; });

// The same noise with and without outliers: slow steps, slow steps after
// each resize and warm-up steps move the curve by less than 2%.
TEST(AdvisorTest, OutliersMoveTheFitByLessThanTwoPercent) {
  for (const TrueModel& m : {kComputeBound, kCommHeavy, kOverlapped}) {
    std::unique_ptr<Advisor> clean = Make(Options());
    std::unique_ptr<Advisor> dirty = Make(Options());
    SyntheticJob clean_job(m, kShape, /*seed=*/7);
    SyntheticJob dirty_job(m, kShape, /*seed=*/7);
    for (int n : {1, 2, 4, 8}) {
      clean_job.Run(clean.get(), n, 120, Outliers{});
      dirty_job.Run(dirty.get(), n, 120, Dirty());
    }
    const AdvisorReport a = clean->Report();
    const AdvisorReport b = dirty->Report();
    ASSERT_EQ(a.curve.size(), b.curve.size());
    for (size_t i = 0; i < a.curve.size(); ++i) {
      EXPECT_NEAR(b.curve[i].samples_per_s / a.curve[i].samples_per_s, 1.0, 0.02)
          << "n = " << a.curve[i].nodes << ", gamma " << m.gamma;
    }
  }
}

// Without the median the same slow steps would be visible: the test above can fail.
TEST(AdvisorTest, SlowStepsWouldMoveAMeanBasedEstimate) {
  SyntheticJob job(kComputeBound, kShape, /*seed=*/7);
  double mean = 0;
  for (int i = 0; i < 100; ++i) {
    mean += absl::ToDoubleSeconds(job.Sample(4, i % 20 == 19 ? 5.0 : 1.0).total) / 100;
  }
  EXPECT_GT(mean / testing::TrueStep(kComputeBound, kShape, 4), 1.15);
}

TEST(AdvisorTest, SkipsWarmupAndTheFirstStepsOfEveryGeneration) {
  AdvisorOptions o = Options();
  o.skip_steps_after_resize = 3;
  std::unique_ptr<Advisor> advisor = Make(o);
  SyntheticJob job(kComputeBound, kShape, /*seed=*/1);
  job.Run(advisor.get(), 1, 20, Outliers{});  // 17 used
  job.Run(advisor.get(), 2, 20, Outliers{});  // flagged resize: 17 used
  // A size change the layer did not flag is a new generation too.
  for (int i = 0; i < 20; ++i) ASSERT_THAT(advisor->Record(job.Sample(4)), IsOk());  // 17 used
  // Steps flagged warm-up are skipped wherever they are.
  for (int i = 0; i < 5; ++i) {
    StepSample s = job.Sample(4);
    s.warmup = true;
    ASSERT_THAT(advisor->Record(s), IsOk());
  }
  const AdvisorReport r = advisor->Report();
  EXPECT_EQ(r.model.steps_observed, 65);
  EXPECT_EQ(r.model.steps_used, 51);
  EXPECT_THAT(r.sizes_observed, ElementsAre(1, 2, 4));
  EXPECT_EQ(r.step, 64);
  EXPECT_EQ(r.model.current_nodes, 4);
}

TEST(AdvisorTest, ResizeCostsPerDirection) {
  std::unique_ptr<Advisor> advisor = Make(Options());
  SyntheticJob job(kComputeBound, kShape, /*seed=*/3);
  auto run = [&](int n, double pause_s, bool failure) {
    Outliers o;
    o.pause = absl::Seconds(pause_s);
    o.failure = failure;
    job.Run(advisor.get(), n, 15, o);
  };
  run(1, 0, false);   // start
  run(2, 10, false);  // grow
  run(4, 12, false);  // grow
  run(2, 5, false);   // shrink
  run(8, 14, false);  // grow
  run(7, 30, true);   // failure
  const AdvisorReport r = advisor->Report();
  ASSERT_TRUE(r.resize_cost_s.grow.has_value());
  ASSERT_TRUE(r.resize_cost_s.shrink.has_value());
  ASSERT_TRUE(r.resize_cost_s.failure.has_value());
  EXPECT_DOUBLE_EQ(*r.resize_cost_s.grow, 12);
  EXPECT_DOUBLE_EQ(*r.resize_cost_s.shrink, 5);
  EXPECT_DOUBLE_EQ(*r.resize_cost_s.failure, 30);
}

TEST(AdvisorTest, NoModelBeforeEnoughSteadySteps) {
  std::unique_ptr<Advisor> advisor = Make(Options());
  AdvisorReport r = advisor->Report();
  EXPECT_FALSE(r.model.fitted);
  EXPECT_TRUE(r.curve.empty());
  EXPECT_FALSE(r.probe.has_value());
  EXPECT_THAT(ValidateReport(r), IsOk());
  EXPECT_THAT(advisor->Fit(), StatusIs(absl::StatusCode::kFailedPrecondition));

  SyntheticJob job(kComputeBound, kShape, /*seed=*/3);
  job.Run(advisor.get(), 2, 12, Outliers{});  // 9 steady steps < min_samples_per_config = 10
  r = advisor->Report();
  EXPECT_FALSE(r.model.fitted);
  EXPECT_EQ(r.model.steps_observed, 12);
  job.Run(advisor.get(), 2, 1, Outliers{});
  r = advisor->Report();
  EXPECT_TRUE(r.model.fitted);
  EXPECT_EQ(r.curve.size(), 16u);
  EXPECT_THAT(r.sizes_observed, ElementsAre(2));
  EXPECT_EQ(r.model.efficiency_reference_nodes, 2);
  EXPECT_DOUBLE_EQ(r.curve[1].efficiency, 1.0);
}

TEST(AdvisorTest, RejectsAnInvalidSampleAndKeepsItsState) {
  std::unique_ptr<Advisor> advisor = Make(Options());
  StepSample s;
  s.world_size = 0;
  EXPECT_THAT(advisor->Record(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world_size = 0")));
  EXPECT_EQ(advisor->Report().model.steps_observed, 0);
}

TEST(AdvisorTest, MarginalGainsAtTheCurrentSize) {
  std::unique_ptr<Advisor> advisor = Make(Options(8));
  SyntheticJob job(kComputeBound, kShape, /*seed=*/5);
  for (int n : {1, 2, 4}) job.Run(advisor.get(), n, 80, Outliers{});
  AdvisorReport r = advisor->Report();
  ASSERT_TRUE(r.marginal_gain.up.has_value());
  ASSERT_TRUE(r.marginal_gain.down.has_value());
  EXPECT_DOUBLE_EQ(*r.marginal_gain.up, r.curve[4].samples_per_s - r.curve[3].samples_per_s);
  EXPECT_DOUBLE_EQ(*r.marginal_gain.down, r.curve[3].samples_per_s - r.curve[2].samples_per_s);
  // 4 -> 5 nodes does not reduce the busiest rank's 4 logical workers: hardly any gain.
  EXPECT_LT(*r.marginal_gain.up, 0.1 * *r.marginal_gain.down);
  job.Run(advisor.get(), 8, 20, Outliers{});
  r = advisor->Report();
  EXPECT_FALSE(r.marginal_gain.up.has_value());  // at max_nodes
  EXPECT_TRUE(r.marginal_gain.down.has_value());
}

TEST(AdvisorTest, ProposesAProbeThenWaitsTheInterval) {
  AdvisorOptions o = Options();
  o.probe.min_steps_between = 200;
  std::unique_ptr<Advisor> advisor = Make(o);
  SyntheticJob job(kComputeBound, kShape, /*seed=*/9);
  job.Run(advisor.get(), 1, 50, Outliers{});
  job.Run(advisor.get(), 2, 50, Outliers{});
  AdvisorReport r = advisor->Report();
  ASSERT_TRUE(r.probe.has_value());
  EXPECT_EQ(r.probe->nodes, 16);
  EXPECT_FALSE(advisor->Report().probe.has_value());  // same step: rate-limited
  job.Run(advisor.get(), 2, 199, Outliers{});
  EXPECT_FALSE(advisor->Report().probe.has_value());  // 199 steps later
  job.Run(advisor.get(), 2, 1, Outliers{});
  EXPECT_TRUE(advisor->Report().probe.has_value());  // 200 steps later
}

TEST(AdvisorTest, MemoryIsBoundedByTheWindow) {
  AdvisorOptions o = Options();
  o.window = 32;
  o.max_configurations = 2;
  std::unique_ptr<Advisor> advisor = Make(o);
  SyntheticJob job(kComputeBound, kShape, /*seed=*/11);
  job.Run(advisor.get(), 2, 3000, Outliers{});
  job.Run(advisor.get(), 4, 100, Outliers{});
  job.Run(advisor.get(), 8, 100, Outliers{});  // evicts the least recently updated: 2
  const std::vector<Observation> obs = advisor->Observations();
  ASSERT_EQ(obs.size(), 2u);
  EXPECT_EQ(obs[0].nodes, 4);
  EXPECT_EQ(obs[1].nodes, 8);
  EXPECT_EQ(obs[0].steps, 32);
}

// On a rank that runs fewer logical workers than the busiest one, the
// compute phase is shorter and the communication phase includes the wait;
// the model must still describe the busiest rank.
TEST(AdvisorTest, LearnsFromARankThatIsNotTheBusiest) {
  const JobShape shape{384, 12};
  AdvisorOptions o = Options(12);
  std::unique_ptr<Advisor> advisor = Make(o);
  SyntheticJob job(kComputeBound, shape, /*seed=*/13);
  job.Run(advisor.get(), 1, 100, Outliers{});
  job.Run(advisor.get(), 2, 100, Outliers{});
  job.Run(advisor.get(), 5, 100, Outliers{}, /*workers=*/2);  // busiest runs 3
  job.Run(advisor.get(), 4, 100, Outliers{});
  const AdvisorReport r = advisor->Report();
  ASSERT_TRUE(r.model.fitted);
  for (int n : {5, 6, 12}) {
    const double truth = TrueThroughput(kComputeBound, shape, n);
    EXPECT_NEAR(r.curve[n - 1].samples_per_s / truth, 1.0, n == 5 ? 0.03 : 0.10) << "n = " << n;
  }
}

TEST(AdvisorTest, RecordDoesNotWaitForReports) {
  std::unique_ptr<Advisor> advisor = Make(Options());
  std::atomic<bool> done{false};
  std::atomic<bool> reporting{false};
  std::thread trainer([&] {
    // Records only once reports are being made, so the two really overlap (2,000
    // records take about a millisecond: they could all be over before the first report).
    while (!reporting) std::this_thread::yield();
    SyntheticJob job(kComputeBound, kShape, /*seed=*/17);
    for (int n : {1, 2, 4, 8}) job.Run(advisor.get(), n, 500, Outliers{});
    done = true;
  });
  int reports = 0;
  do {
    reporting = true;
    const AdvisorReport r = advisor->Report();
    EXPECT_THAT(ValidateReport(r), IsOk());
    ++reports;
  } while (!done);
  trainer.join();
  EXPECT_GT(reports, 0);
  const AdvisorReport r = advisor->Report();
  EXPECT_EQ(r.model.steps_observed, 2000);
  EXPECT_THAT(r.sizes_observed, ElementsAre(1, 2, 4, 8));
  EXPECT_THAT(ParseReportJson(ReportToJson(r)), IsOk());
}

struct BadOptionsCase {
  std::string name;
  void (*mutate)(AdvisorOptions&);
  std::string message;
};

void PrintTo(const BadOptionsCase& c, std::ostream* os) { *os << c.name; }

class BadOptionsTest : public ::testing::TestWithParam<BadOptionsCase> {};

TEST_P(BadOptionsTest, CreateNamesTheOption) {
  AdvisorOptions o = Options();
  GetParam().mutate(o);
  EXPECT_THAT(Advisor::Create(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Options, BadOptionsTest,
    ::testing::Values(
        BadOptionsCase{"MinNodes", [](AdvisorOptions& o) { o.min_nodes = 0; }, "min_nodes = 0"},
        BadOptionsCase{"MaxNodes", [](AdvisorOptions& o) { o.max_nodes = 0; },
                       "max_nodes = 0 must be in [min_nodes = 1"},
        BadOptionsCase{"AllowedSize",
                       [](AdvisorOptions& o) {
                         o.allowed_sizes = {2, 17};
                       },
                       "allowed_sizes[1] = 17"},
        BadOptionsCase{"Skip", [](AdvisorOptions& o) { o.skip_steps_after_resize = -1; },
                       "skip_steps_after_resize = -1"},
        BadOptionsCase{"Window", [](AdvisorOptions& o) { o.window = 0; }, "window = 0"},
        BadOptionsCase{"MinSamples", [](AdvisorOptions& o) { o.min_samples_per_config = 100; },
                       "min_samples_per_config = 100 must be in [1, window = 64]"},
        BadOptionsCase{"Configurations", [](AdvisorOptions& o) { o.max_configurations = 0; },
                       "max_configurations = 0"},
        BadOptionsCase{"Fit", [](AdvisorOptions& o) { o.fit.z = -1; }, "fit.z = -1"},
        BadOptionsCase{"Probe", [](AdvisorOptions& o) { o.probe.steps = 0; }, "probe.steps = 0"}),
    [](const ::testing::TestParamInfo<BadOptionsCase>& info) { return info.param.name; });

}  // namespace
}  // namespace malle::advisor
