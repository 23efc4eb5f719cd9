#include "libmalle/advisor/scaling_model.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "tests/cpp/advisor/synthetic_job.h"

namespace malle::advisor {
namespace {

using ::malle::advisor::testing::kCommHeavy;
using ::malle::advisor::testing::kComputeBound;
using ::malle::advisor::testing::kOverlapped;
using ::malle::advisor::testing::kShape;
using ::malle::advisor::testing::TrueModel;
using ::malle::advisor::testing::TrueObservation;
using ::malle::advisor::testing::TrueThroughput;
using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

// Observations at `sizes` with a deterministic error of up to +-0.8% per size
// (the median of a window is never exact), the same at a size whatever the
// other sizes are.
std::vector<Observation> Observe(const TrueModel& m, const std::vector<int>& sizes) {
  std::vector<Observation> obs;
  for (int n : sizes) {
    const double jitter = 0.004 * static_cast<double>((n * 7919) % 5 - 2);
    obs.push_back(TrueObservation(m, kShape, n, jitter));
  }
  return obs;
}

struct AccuracyCase {
  std::string name;
  TrueModel model;
  std::vector<int> observed;
  std::vector<int> unseen;  // predicted within 10% of the truth
};

void PrintTo(const AccuracyCase& c, std::ostream* os) { *os << c.name; }

class AccuracyTest : public ::testing::TestWithParam<AccuracyCase> {};

TEST_P(AccuracyTest, PredictsUnseenSizesAndBandContainsTruth) {
  const AccuracyCase& c = GetParam();
  ASSERT_OK_AND_ASSIGN(ScalingFit fit, FitScalingModel(Observe(c.model, c.observed)));
  for (int n : c.unseen) {
    const Prediction p = Predict(fit, kShape, n);
    const double truth = TrueThroughput(c.model, kShape, n);
    EXPECT_NEAR(p.samples_per_s / truth, 1.0, 0.10) << "n = " << n;
  }
  for (int n = 1; n <= 32; ++n) {
    const Prediction p = Predict(fit, kShape, n);
    const double truth = TrueThroughput(c.model, kShape, n);
    EXPECT_LE(p.lo, truth) << "n = " << n;
    EXPECT_GE(p.hi, truth) << "n = " << n;
    EXPECT_LE(p.lo, p.samples_per_s) << "n = " << n;
    EXPECT_GE(p.hi, p.samples_per_s) << "n = " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, AccuracyTest,
    ::testing::Values(AccuracyCase{"ComputeBoundFrom124", kComputeBound, {1, 2, 4}, {3, 6, 8, 16}},
                      AccuracyCase{"ComputeBoundFrom24", kComputeBound, {2, 4}, {1, 3, 8, 16}},
                      AccuracyCase{"ComputeBoundFrom148", kComputeBound, {1, 4, 8}, {2, 16, 32}},
                      AccuracyCase{"CommHeavyFrom124", kCommHeavy, {1, 2, 4}, {3, 8, 16}},
                      AccuracyCase{"CommHeavyFrom28", kCommHeavy, {2, 8}, {1, 4, 16}},
                      AccuracyCase{"OverlappedFrom1248", kOverlapped, {1, 2, 4, 8}, {3, 6, 16, 32}},
                      AccuracyCase{"OverlappedFrom12816", kOverlapped, {1, 2, 8, 16}, {4, 12, 32}}),
    [](const ::testing::TestParamInfo<AccuracyCase>& info) { return info.param.name; });

TEST(ScalingModelTest, RecoversParametersFromExactObservations) {
  std::vector<Observation> exact;
  for (int n : {1, 2, 4, 8, 16}) exact.push_back(TrueObservation(kOverlapped, kShape, n));
  ASSERT_OK_AND_ASSIGN(ScalingFit fit, FitScalingModel(exact));
  EXPECT_TRUE(fit.gamma_identified);
  EXPECT_TRUE(fit.compute_identified());
  EXPECT_TRUE(fit.network_identified());
  EXPECT_DOUBLE_EQ(fit.gamma(), 2.0);  // on the grid
  EXPECT_NEAR(fit.compute.intercept, kOverlapped.a, 1e-6);
  EXPECT_NEAR(fit.compute.slope, kOverlapped.b, 1e-9);
  EXPECT_NEAR(fit.candidates.front().network.intercept, kOverlapped.c, 1e-6);
  EXPECT_NEAR(fit.candidates.front().network.slope, kOverlapped.d, 1e-6);
  EXPECT_NEAR(fit.other_s, kOverlapped.e, 1e-9);
  EXPECT_LT(fit.rms_relative_error, 1e-6);
  EXPECT_EQ(fit.observed_nodes, (std::vector<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(fit.steps, 5 * 64);
}

// With measurement error gamma is known to a range, which contains the truth.
TEST(ScalingModelTest, GammaRangeContainsTruth) {
  for (const TrueModel& m : {kComputeBound, kOverlapped}) {
    ASSERT_OK_AND_ASSIGN(ScalingFit fit, FitScalingModel(Observe(m, {1, 2, 4, 8, 16})));
    EXPECT_TRUE(fit.gamma_identified);
    EXPECT_LE(fit.gamma_lo(), m.gamma);
    EXPECT_GE(fit.gamma_hi(), m.gamma);
    EXPECT_LE(fit.gamma_hi() - fit.gamma_lo(), 1.5) << "gamma " << m.gamma;
    EXPECT_NEAR(fit.compute.slope, m.b, 0.05 * m.b);
    EXPECT_LT(fit.rms_relative_error, 0.02);
  }
}

// The band at unseen sizes narrows as observations at more sizes arrive.
TEST(ScalingModelTest, BandShrinksAsSizesAreAdded) {
  const std::vector<std::vector<int>> stages = {{4}, {2, 4}, {1, 2, 4}, {1, 2, 4, 8}};
  for (const TrueModel& m : {kComputeBound, kCommHeavy, kOverlapped}) {
    std::vector<double> width16, mean_width;
    for (const std::vector<int>& sizes : stages) {
      ASSERT_OK_AND_ASSIGN(ScalingFit fit, FitScalingModel(Observe(m, sizes)));
      width16.push_back(Predict(fit, kShape, 16).RelativeUncertainty());
      double sum = 0;
      for (int n = 1; n <= 16; ++n) sum += Predict(fit, kShape, n).RelativeUncertainty();
      mean_width.push_back(sum / 16);
    }
    SCOPED_TRACE(absl::StrCat("gamma ", m.gamma, " d ", m.d,
                              ": width at 16 = ", absl::StrJoin(width16, ", "),
                              "; mean = ", absl::StrJoin(mean_width, ", ")));
    // A new size may widen the band a little when its point disagrees with
    // the others by more than their standard errors (the covariance is scaled
    // by the reduced chi^2), never by much.
    for (size_t i = 1; i < stages.size(); ++i) {
      EXPECT_LE(mean_width[i], mean_width[i - 1] * 1.1) << "stage " << i;
      EXPECT_LE(width16[i], width16[i - 1] * 1.1) << "stage " << i;
    }
    EXPECT_LT(mean_width.back(), mean_width.front() / 3);
    EXPECT_LT(width16.back(), 0.6 * width16.front());
  }
}

// One observed size cannot identify the network term (nor the compute
// term's split): the band is wide, yet contains the truth.
TEST(ScalingModelTest, OneSizeGivesWideBandContainingTruth) {
  for (const TrueModel& m : {kComputeBound, kCommHeavy, kOverlapped}) {
    for (int size : {1, 4}) {
      SCOPED_TRACE(absl::StrCat("gamma ", m.gamma, " d ", m.d, " observed at ", size));
      ASSERT_OK_AND_ASSIGN(ScalingFit fit, FitScalingModel(Observe(m, {size})));
      EXPECT_FALSE(fit.network_identified());
      EXPECT_FALSE(fit.compute_identified());
      EXPECT_FALSE(fit.gamma_identified);
      for (int n : {1, 2, 3, 8, 16}) {
        const Prediction p = Predict(fit, kShape, n);
        const double truth = TrueThroughput(m, kShape, n);
        EXPECT_LE(p.lo, truth) << "n = " << n;
        EXPECT_GE(p.hi, truth) << "n = " << n;
        if (n != size) {
          EXPECT_GT(p.RelativeUncertainty(), 0.3) << "n = " << n;
        }
      }
      // At the observed size the measurement itself is known well.
      EXPECT_LT(Predict(fit, kShape, size).RelativeUncertainty(), 0.1);
      EXPECT_GT(Predict(fit, kShape, 16).RelativeUncertainty(), 0.6);
    }
  }
}

// A configuration measured on a bad day (25% slow) among six moves the fit
// by less than 2%; without the Huber weights (huber_k huge) it moves more.
TEST(ScalingModelTest, HuberBoundsTheInfluenceOfAnOutlierConfiguration) {
  const std::vector<int> sizes = {1, 2, 3, 4, 6, 8};
  std::vector<Observation> clean;
  for (int n : sizes) clean.push_back(TrueObservation(kComputeBound, kShape, n));
  std::vector<Observation> dirty = clean;
  dirty[3].compute_s *= 1.25;  // n = 4
  dirty[3].network_s *= 1.25;
  dirty[3].step_s = dirty[3].compute_s + dirty[3].network_s + dirty[3].other_s;

  FitOptions no_huber;
  no_huber.huber_k = 1e9;
  ASSERT_OK_AND_ASSIGN(ScalingFit clean_fit, FitScalingModel(clean));
  ASSERT_OK_AND_ASSIGN(ScalingFit robust_fit, FitScalingModel(dirty));
  ASSERT_OK_AND_ASSIGN(ScalingFit plain_fit, FitScalingModel(dirty, no_huber));
  double worst_robust = 0, worst_plain = 0;
  for (int n = 1; n <= 16; ++n) {
    const double reference = Predict(clean_fit, kShape, n).samples_per_s;
    worst_robust = std::max(
        worst_robust, std::fabs(Predict(robust_fit, kShape, n).samples_per_s / reference - 1));
    worst_plain = std::max(worst_plain,
                           std::fabs(Predict(plain_fit, kShape, n).samples_per_s / reference - 1));
  }
  EXPECT_LT(worst_robust, 0.02);
  EXPECT_GT(worst_plain, 0.02);
}

TEST(ScalingModelTest, ParametersStayNonNegative) {
  // Compute time that falls with the batch (nonsense, e.g. a noisy
  // neighbour at the small size) would need a negative slope.
  std::vector<Observation> obs = Observe(kComputeBound, {1, 2, 4});
  obs[0].compute_s = 0.05;  // 512 samples
  obs[1].compute_s = 0.10;  // 256 samples
  obs[2].compute_s = 0.20;  // 128 samples
  ASSERT_OK_AND_ASSIGN(ScalingFit fit, FitScalingModel(obs));
  EXPECT_GE(fit.compute.intercept, 0);
  EXPECT_DOUBLE_EQ(fit.compute.slope, 0);  // flat fits better than proportional
  for (const NetworkCandidate& c : fit.candidates) {
    EXPECT_GE(c.network.intercept, 0);
    EXPECT_GE(c.network.slope, 0);
  }
}

// The busiest rank runs ceil(L / n) logical workers: with L = 16 on 5 nodes
// it runs 4, as on 4 nodes, so compute time does not improve from 4 to 5.
TEST(ScalingModelTest, ModelsTheBusiestRanksBatch) {
  ASSERT_OK_AND_ASSIGN(ScalingFit fit, FitScalingModel(Observe(kComputeBound, {1, 2, 4, 8})));
  const Prediction p4 = Predict(fit, kShape, 4);
  const Prediction p5 = Predict(fit, kShape, 5);
  EXPECT_DOUBLE_EQ(p4.compute_s, p5.compute_s);
  EXPECT_LT(p5.samples_per_s, p4.samples_per_s);  // same compute, more communication
  EXPECT_NEAR(p5.samples_per_s / TrueThroughput(kComputeBound, kShape, 5), 1.0, 0.03);
}

TEST(ScalingModelTest, BandIsTightAtObservedSizes) {
  ASSERT_OK_AND_ASSIGN(ScalingFit fit, FitScalingModel(Observe(kComputeBound, {1, 2, 4, 8})));
  for (int n : {1, 2, 4, 8}) EXPECT_LT(Predict(fit, kShape, n).RelativeUncertainty(), 0.08) << n;
}

struct BadObservationCase {
  std::string name;
  void (*mutate)(Observation&);
  std::string message;
};

void PrintTo(const BadObservationCase& c, std::ostream* os) { *os << c.name; }

class BadObservationTest : public ::testing::TestWithParam<BadObservationCase> {};

TEST_P(BadObservationTest, IsRejectedNamingTheField) {
  std::vector<Observation> obs = Observe(kComputeBound, {1, 2});
  GetParam().mutate(obs[1]);
  EXPECT_THAT(FitScalingModel(obs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, BadObservationTest,
    ::testing::Values(BadObservationCase{"Nodes", [](Observation& o) { o.nodes = 0; },
                                         "observations[1].nodes = 0 must be in [1, "},
                      BadObservationCase{"LocalBatch", [](Observation& o) { o.local_batch = 0; },
                                         "observations[1].local_batch = 0 must be finite and > 0"},
                      BadObservationCase{"SlowestBatch",
                                         [](Observation& o) { o.slowest_batch = -3; },
                                         "observations[1].slowest_batch"},
                      BadObservationCase{"Compute", [](Observation& o) { o.compute_s = -1; },
                                         "observations[1].compute_s = -1 must be finite and >= 0"},
                      BadObservationCase{"Network",
                                         [](Observation& o) { o.network_s = std::nan(""); },
                                         "observations[1].network_s"},
                      BadObservationCase{"Step", [](Observation& o) { o.step_s = 0; },
                                         "observations[1].step_s = 0 must be finite and > 0"},
                      BadObservationCase{"NetworkSe", [](Observation& o) { o.network_se_s = -0.1; },
                                         "observations[1].network_se_s"},
                      BadObservationCase{"Steps", [](Observation& o) { o.steps = 0; },
                                         "observations[1].steps = 0 must be >= 1"}),
    [](const ::testing::TestParamInfo<BadObservationCase>& info) { return info.param.name; });

TEST(ScalingModelTest, RejectsEmptyInputAndBadOptions) {
  EXPECT_THAT(FitScalingModel({}), StatusIs(absl::StatusCode::kFailedPrecondition));
  const std::vector<Observation> obs = Observe(kComputeBound, {1, 2});
  FitOptions o;
  o.max_gamma = 12;
  EXPECT_THAT(FitScalingModel(obs, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("options.max_gamma = 12 must be in [1, 10]")));
  o = FitOptions{};
  o.prior_gamma = 0.5;
  EXPECT_THAT(FitScalingModel(obs, o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("options.prior_gamma")));
  o = FitOptions{};
  o.prior_network_ratio = 2;  // above prior_max_network_ratio = 1
  EXPECT_THAT(FitScalingModel(obs, o), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("options.prior_network_ratio")));
  o = FitOptions{};
  o.min_relative_error = 1;
  EXPECT_THAT(FitScalingModel(obs, o), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("options.min_relative_error")));
}

TEST(ScalingModelTest, PredictCurveCoversTheRangeOrTheGivenSizes) {
  ASSERT_OK_AND_ASSIGN(ScalingFit fit, FitScalingModel(Observe(kComputeBound, {1, 2, 4})));
  ASSERT_OK_AND_ASSIGN(std::vector<Prediction> curve, PredictCurve(fit, kShape, 2, 5));
  ASSERT_EQ(curve.size(), 4u);
  EXPECT_EQ(curve.front().nodes, 2);
  EXPECT_EQ(curve.back().nodes, 5);
  const std::vector<int> sizes = {8, 2, 4, 2};
  ASSERT_OK_AND_ASSIGN(curve, PredictCurve(fit, kShape, 1, 8, sizes));
  ASSERT_EQ(curve.size(), 3u);
  EXPECT_EQ(curve[0].nodes, 2);
  EXPECT_EQ(curve[2].nodes, 8);
  EXPECT_THAT(PredictCurve(fit, kShape, 3, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("min_nodes = 3")));
  const std::vector<int> outside = {9};
  EXPECT_THAT(PredictCurve(fit, kShape, 1, 8, outside),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sizes[0] = 9")));
  EXPECT_THAT(PredictCurve(fit, JobShape{0, 16}, 1, 8),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape.global_batch")));
  EXPECT_THAT(PredictCurve(ScalingFit{}, kShape, 1, 8),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace malle::advisor
