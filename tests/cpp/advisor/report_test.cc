#include "libmalle/advisor/report.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::advisor {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

AdvisorReport Valid() {
  AdvisorReport r;
  r.job = "j";
  r.step = 100;
  r.sizes_observed = {1, 2};
  r.curve = {{1, 100, 95, 105, 1.0}, {2, 190, 170, 210, 0.95}};
  r.model.fitted = true;
  r.model.steps_observed = 100;
  r.model.steps_used = 60;
  r.model.current_nodes = 2;
  r.model.efficiency_reference_nodes = 1;
  r.model.global_batch = 64;
  r.model.logical_workers = 2;
  return r;
}

struct InvalidCase {
  std::string name;
  void (*mutate)(AdvisorReport&);
  std::string message;
};

void PrintTo(const InvalidCase& c, std::ostream* os) { *os << c.name; }

class InvalidReportTest : public ::testing::TestWithParam<InvalidCase> {};

TEST(ReportTest, AcceptsAConsistentReportAndAnEmptyOne) {
  EXPECT_THAT(ValidateReport(Valid()), IsOk());
  EXPECT_THAT(ValidateReport(AdvisorReport{}), IsOk());
}

TEST_P(InvalidReportTest, NamesTheField) {
  AdvisorReport r = Valid();
  GetParam().mutate(r);
  EXPECT_THAT(ValidateReport(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, InvalidReportTest,
    ::testing::Values(
        InvalidCase{"Step", [](AdvisorReport& r) { r.step = -1; }, "step = -1 must be >= 0"},
        InvalidCase{"Size", [](AdvisorReport& r) { r.sizes_observed = {0}; },
                    "sizes_observed[0] = 0 must be in [1, 100000]"},
        InvalidCase{"CurveNaN", [](AdvisorReport& r) { r.curve[1].hi = std::nan(""); },
                    "curve[1].hi = nan must be finite and >= 0"},
        InvalidCase{"CurveLo", [](AdvisorReport& r) { r.curve[0].lo = 101; },
                    "curve[0].lo = 101 must be <= samples_per_s = 100"},
        InvalidCase{"Cost", [](AdvisorReport& r) { r.resize_cost_s.failure = -2; },
                    "resize_cost_s.failure = -2"},
        InvalidCase{"Gain", [](AdvisorReport& r) { r.marginal_gain.down = INFINITY; },
                    "marginal_gain.down = inf must be finite"},
        InvalidCase{"ProbeSteps",
                    [](AdvisorReport& r) {
                      r.probe = ProbeRequest{2, 0, ""};
                    },
                    "probe.steps = 0 must be >= 1"},
        InvalidCase{"Gamma", [](AdvisorReport& r) { r.model.gamma_hi = 11; },
                    "1 <= gamma_lo <= gamma <= gamma_hi <= 10"},
        InvalidCase{"Batch", [](AdvisorReport& r) { r.model.global_batch = -1; },
                    "model.global_batch = -1"},
        InvalidCase{"Unfitted", [](AdvisorReport& r) { r.model.fitted = false; },
                    "curve must be empty when model.fitted is false"}),
    [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

}  // namespace
}  // namespace malle::advisor
