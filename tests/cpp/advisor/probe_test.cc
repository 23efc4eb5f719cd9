#include "libmalle/advisor/probe.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "tests/cpp/advisor/synthetic_job.h"

namespace malle::advisor {
namespace {

using ::malle::advisor::testing::kComputeBound;
using ::malle::advisor::testing::kShape;
using ::malle::advisor::testing::TrueObservation;
using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

ScalingFit FitAt(const std::vector<int>& sizes) {
  std::vector<Observation> obs;
  for (int n : sizes) obs.push_back(TrueObservation(kComputeBound, kShape, n));
  absl::StatusOr<ScalingFit> fit = FitScalingModel(obs);
  EXPECT_TRUE(fit.ok()) << fit.status();
  return *fit;
}

ProbeContext Context(int current, int64_t step = 1000) {
  ProbeContext c;
  c.shape = kShape;
  c.min_nodes = 1;
  c.max_nodes = 16;
  c.current_nodes = current;
  c.step = step;
  return c;
}

// The size with the widest band, found by brute force over the range.
int MostUncertain(const ScalingFit& fit, const ProbeContext& c) {
  int best = 0;
  double widest = -1;
  for (int n = c.min_nodes; n <= c.max_nodes; ++n) {
    if (n == c.current_nodes) continue;
    if (!c.allowed_sizes.empty() &&
        std::find(c.allowed_sizes.begin(), c.allowed_sizes.end(), n) == c.allowed_sizes.end()) {
      continue;
    }
    const double u = Predict(fit, c.shape, n).RelativeUncertainty();
    if (u > widest) {
      widest = u;
      best = n;
    }
  }
  return best;
}

struct ProposeCase {
  std::string name;
  std::vector<int> observed;
  int current;
  std::vector<int> allowed;
  int expected;  // the size the probe goes to
};

void PrintTo(const ProposeCase& c, std::ostream* os) { *os << c.name; }

class ProposeTest : public ::testing::TestWithParam<ProposeCase> {};

TEST_P(ProposeTest, ProbesTheMostUncertainAllowedSize) {
  const ProposeCase& pc = GetParam();
  const ScalingFit fit = FitAt(pc.observed);
  ProbeContext c = Context(pc.current);
  c.allowed_sizes = pc.allowed;
  ASSERT_OK_AND_ASSIGN(ProbeDecision d, ProposeProbe(fit, c));
  ASSERT_TRUE(d.request.has_value()) << d.reason;
  EXPECT_EQ(d.request->nodes, pc.expected);
  EXPECT_EQ(d.request->nodes, MostUncertain(fit, c));
  EXPECT_EQ(d.request->steps, ProbeOptions{}.steps);
  EXPECT_THAT(d.request->reason, HasSubstr("widest"));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ProposeTest,
    ::testing::Values(
        // Observed small sizes: the far end is the least known.
        ProposeCase{"FarEnd", {1, 2}, 2, {}, 16},
        // Running at the most uncertain size already: the next most uncertain one.
        ProposeCase{"NotTheCurrentSize", {1, 2}, 16, {}, 15},
        // Only powers of two are allowed.
        ProposeCase{"AllowedOnly", {1, 2}, 2, {1, 2, 4, 8}, 8},
        // One size observed at 8: on 1 node the batch is 8x larger and the
        // split of compute time into fixed and per-sample parts is unknown.
        ProposeCase{"OneSize", {8}, 8, {1, 2, 4, 8, 16}, 1}),
    [](const ::testing::TestParamInfo<ProposeCase>& info) { return info.param.name; });

TEST(ProbeTest, NoProbeWhenTheCurveIsKnownWell) {
  const ScalingFit fit = FitAt({1, 2, 4, 8, 12, 16});
  ASSERT_OK_AND_ASSIGN(ProbeDecision d, ProposeProbe(fit, Context(8)));
  EXPECT_FALSE(d.request.has_value());
  EXPECT_THAT(d.reason, HasSubstr("below the 25.0% threshold"));
  // The same fit with a threshold below its widest band does probe.
  ProbeOptions eager;
  eager.min_relative_uncertainty = 0.001;
  ASSERT_OK_AND_ASSIGN(d, ProposeProbe(fit, Context(8), eager));
  EXPECT_TRUE(d.request.has_value());
}

TEST(ProbeTest, AtMostOneProbePerInterval) {
  const ScalingFit fit = FitAt({1, 2});
  ProbeContext c = Context(2, /*step=*/1200);
  c.last_probe_step = 1000;
  ASSERT_OK_AND_ASSIGN(ProbeDecision d, ProposeProbe(fit, c));
  EXPECT_FALSE(d.request.has_value());
  EXPECT_THAT(d.reason, HasSubstr("next is allowed at step 1500"));
  c.step = 1500;
  ASSERT_OK_AND_ASSIGN(d, ProposeProbe(fit, c));
  EXPECT_TRUE(d.request.has_value()) << d.reason;
}

TEST(ProbeTest, NothingToProbeWhenOnlyTheCurrentSizeIsAllowed) {
  const ScalingFit fit = FitAt({1, 2});
  ProbeContext c = Context(2);
  c.allowed_sizes = {2};
  ASSERT_OK_AND_ASSIGN(ProbeDecision d, ProposeProbe(fit, c));
  EXPECT_FALSE(d.request.has_value());
  EXPECT_THAT(d.reason, HasSubstr("no size other than the current one"));
}

TEST(ProbeTest, RejectsBadOptionsAndContext) {
  const ScalingFit fit = FitAt({1, 2});
  ProbeOptions o;
  o.steps = 0;
  EXPECT_THAT(ProposeProbe(fit, Context(2), o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("options.steps = 0")));
  o = ProbeOptions{};
  o.min_steps_between = -1;
  EXPECT_THAT(ProposeProbe(fit, Context(2), o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("options.min_steps_between")));
  ProbeContext c = Context(2);
  c.max_nodes = 0;
  EXPECT_THAT(ProposeProbe(fit, c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_nodes = 0")));
  c = Context(2);
  c.allowed_sizes = {32};
  EXPECT_THAT(ProposeProbe(fit, c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sizes[0] = 32")));
}

}  // namespace
}  // namespace malle::advisor
