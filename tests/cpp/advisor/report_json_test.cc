#include "libmalle/advisor/report_json.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/advisor/advisor.h"
#include "tests/cpp/testing/status_matchers.h"
#include "nlohmann/json.hpp"
#include "tests/cpp/advisor/synthetic_job.h"

namespace malle::advisor {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Every field set, none at its default.
AdvisorReport Full() {
  AdvisorReport r;
  r.job = "resnet-\"50\"";
  r.step = 123456789012;
  r.sizes_observed = {1, 2, 4};
  r.curve = {{1, 410.25, 401.5, 418.75, 1.0},
             {2, 790.125, 760.0, 821.5, 0.963},
             {4, 1500.0, 1300.0, 1700.0, 0.914},
             {8, 2600.5, 1900.0, 3300.0, 0.792}};
  r.resize_cost_s.grow = 12.5;
  r.resize_cost_s.shrink = 8.25;
  r.resize_cost_s.failure = std::nullopt;
  r.marginal_gain.up = 120.5;
  r.marginal_gain.down = -3.0;  // losing a node may speed a job up
  r.probe = ProbeRequest{8, 30, "throughput at 8 nodes is uncertain"};
  ModelSummary& m = r.model;
  m.fitted = true;
  m.compute_fixed_s = 0.0101;
  m.compute_per_sample_s = 0.000801;
  m.network_fixed_s = 0.0199;
  m.network_per_node_s = 0.00401;
  m.gamma = 1.25;
  m.gamma_lo = 1.0;
  m.gamma_hi = 3.0;
  m.other_s = 0.0102;
  m.compute_identified = true;
  m.network_identified = true;
  m.gamma_identified = false;
  m.rms_relative_error = 0.0123;
  m.configurations = 3;
  m.steps_observed = 400;
  m.steps_used = 180;
  m.current_nodes = 4;
  m.efficiency_reference_nodes = 1;
  m.global_batch = 512;
  m.logical_workers = 16;
  return r;
}

void ExpectEqual(const AdvisorReport& a, const AdvisorReport& b) {
  EXPECT_EQ(a.job, b.job);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.sizes_observed, b.sizes_observed);
  ASSERT_EQ(a.curve.size(), b.curve.size());
  for (size_t i = 0; i < a.curve.size(); ++i) {
    EXPECT_EQ(a.curve[i].nodes, b.curve[i].nodes) << i;
    EXPECT_EQ(a.curve[i].samples_per_s, b.curve[i].samples_per_s) << i;
    EXPECT_EQ(a.curve[i].lo, b.curve[i].lo) << i;
    EXPECT_EQ(a.curve[i].hi, b.curve[i].hi) << i;
    EXPECT_EQ(a.curve[i].efficiency, b.curve[i].efficiency) << i;
  }
  EXPECT_EQ(a.resize_cost_s.grow, b.resize_cost_s.grow);
  EXPECT_EQ(a.resize_cost_s.shrink, b.resize_cost_s.shrink);
  EXPECT_EQ(a.resize_cost_s.failure, b.resize_cost_s.failure);
  EXPECT_EQ(a.marginal_gain.up, b.marginal_gain.up);
  EXPECT_EQ(a.marginal_gain.down, b.marginal_gain.down);
  ASSERT_EQ(a.probe.has_value(), b.probe.has_value());
  if (a.probe) {
    EXPECT_EQ(a.probe->nodes, b.probe->nodes);
    EXPECT_EQ(a.probe->steps, b.probe->steps);
    EXPECT_EQ(a.probe->reason, b.probe->reason);
  }
  const ModelSummary& x = a.model;
  const ModelSummary& y = b.model;
  EXPECT_EQ(x.fitted, y.fitted);
  EXPECT_EQ(x.compute_fixed_s, y.compute_fixed_s);
  EXPECT_EQ(x.compute_per_sample_s, y.compute_per_sample_s);
  EXPECT_EQ(x.network_fixed_s, y.network_fixed_s);
  EXPECT_EQ(x.network_per_node_s, y.network_per_node_s);
  EXPECT_EQ(x.gamma, y.gamma);
  EXPECT_EQ(x.gamma_lo, y.gamma_lo);
  EXPECT_EQ(x.gamma_hi, y.gamma_hi);
  EXPECT_EQ(x.other_s, y.other_s);
  EXPECT_EQ(x.compute_identified, y.compute_identified);
  EXPECT_EQ(x.network_identified, y.network_identified);
  EXPECT_EQ(x.gamma_identified, y.gamma_identified);
  EXPECT_EQ(x.rms_relative_error, y.rms_relative_error);
  EXPECT_EQ(x.configurations, y.configurations);
  EXPECT_EQ(x.steps_observed, y.steps_observed);
  EXPECT_EQ(x.steps_used, y.steps_used);
  EXPECT_EQ(x.current_nodes, y.current_nodes);
  EXPECT_EQ(x.efficiency_reference_nodes, y.efficiency_reference_nodes);
  EXPECT_EQ(x.global_batch, y.global_batch);
  EXPECT_EQ(x.logical_workers, y.logical_workers);
}

TEST(ReportJsonTest, RoundTripsEveryField) {
  const AdvisorReport r = Full();
  ASSERT_THAT(ValidateReport(r), IsOk());
  for (int indent : {-1, 2}) {
    ASSERT_OK_AND_ASSIGN(AdvisorReport back, ParseReportJson(ReportToJson(r, indent)));
    ExpectEqual(r, back);
  }
}

TEST(ReportJsonTest, RoundTripsAnAdvisorsReport) {
  AdvisorOptions o;
  o.min_nodes = 1;
  o.max_nodes = 8;
  o.job_id = "synthetic";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Advisor> advisor, Advisor::Create(o));
  testing::SyntheticJob job(testing::kComputeBound, testing::kShape, /*seed=*/1);
  testing::Outliers outliers;
  outliers.pause = absl::Seconds(7);
  for (int n : {1, 2, 4}) job.Run(advisor.get(), n, 40, outliers);
  const AdvisorReport r = advisor->Report();
  ASSERT_TRUE(r.model.fitted);
  ASSERT_OK_AND_ASSIGN(AdvisorReport back, ParseReportJson(ReportToJson(r)));
  ExpectEqual(r, back);
}

TEST(ReportJsonTest, WritesTheDocumentedKeys) {
  const Json j = Json::parse(ReportToJson(Full()));
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  std::sort(keys.begin(), keys.end());
  EXPECT_THAT(keys, ElementsAre("curve", "job", "marginal_gain", "model", "probe", "resize_cost_s",
                                "sizes_observed", "step", "version"));
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["curve"][1]["nodes"], 2);
  EXPECT_EQ(j["curve"][1]["samples_per_s"], 790.125);
  EXPECT_TRUE(j["resize_cost_s"]["failure"].is_null());
  EXPECT_EQ(j["resize_cost_s"]["grow"], 12.5);
  EXPECT_EQ(j["marginal_gain"]["down"], -3.0);
  EXPECT_EQ(j["probe"]["nodes"], 8);
  EXPECT_EQ(j["model"]["gamma"], 1.25);
  // A report without a probe writes null.
  AdvisorReport r = Full();
  r.probe.reset();
  EXPECT_TRUE(Json::parse(ReportToJson(r))["probe"].is_null());
  // One line by default (a control message).
  EXPECT_EQ(ReportToJson(Full()).find('\n'), std::string::npos);
}

struct MalformedCase {
  std::string name;
  void (*patch)(Json&);
  std::string message;  // must appear in the error
};

void PrintTo(const MalformedCase& c, std::ostream* os) { *os << c.name; }

class MalformedTest : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(MalformedTest, IsRejectedNamingTheField) {
  Json j = Json::parse(ReportToJson(Full()));
  GetParam().patch(j);
  EXPECT_THAT(ParseReportJson(j.dump()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, MalformedTest,
    ::testing::Values(
        MalformedCase{"Version", [](Json& j) { j["version"] = 2; },
                      "version: unsupported version 2"},
        MalformedCase{"MissingJob", [](Json& j) { j.erase("job"); }, "job: missing (required)"},
        MalformedCase{"JobNotString", [](Json& j) { j["job"] = 5; }, "job: expected a string"},
        MalformedCase{"UnknownTopLevelKey", [](Json& j) { j["jobs"] = 1; },
                      "jobs: unknown key; expected one of version, job, step"},
        MalformedCase{"NegativeStep", [](Json& j) { j["step"] = -1; },
                      "step: expected an integer in [0, "},
        MalformedCase{"FractionalStep", [](Json& j) { j["step"] = 1.5; },
                      "step: expected an integer"},
        MalformedCase{"SizesNotArray", [](Json& j) { j["sizes_observed"] = 4; },
                      "sizes_observed: expected an array, got 4"},
        MalformedCase{"SizeZero", [](Json& j) { j["sizes_observed"][1] = 0; },
                      "sizes_observed[1]: expected an integer in [1, 100000], got 0"},
        MalformedCase{"SizesNotAscending", [](Json& j) { j["sizes_observed"][2] = 2; },
                      "sizes_observed[2] = 2 must be > the previous size 2"},
        MalformedCase{"CurveNotArray", [](Json& j) { j["curve"] = Json::object(); },
                      "curve: expected an array, got an object"},
        MalformedCase{"CurvePointMissingLo", [](Json& j) { j["curve"][2].erase("lo"); },
                      "curve[2].lo: missing (required)"},
        MalformedCase{"CurvePointUnknownKey", [](Json& j) { j["curve"][0]["mid"] = 1; },
                      "curve[0].mid: unknown key"},
        MalformedCase{"CurveLoString", [](Json& j) { j["curve"][1]["lo"] = "x"; },
                      "curve[1].lo: expected a number, got the string \"x\""},
        MalformedCase{"CurveNegativeThroughput",
                      [](Json& j) { j["curve"][1]["samples_per_s"] = -5; },
                      "curve[1].samples_per_s: must be >= 0"},
        MalformedCase{"CurveLoAboveEstimate", [](Json& j) { j["curve"][3]["lo"] = 3000; },
                      "curve[3].lo = 3000 must be <= samples_per_s = 2600.5"},
        MalformedCase{"CurveHiBelowEstimate", [](Json& j) { j["curve"][3]["hi"] = 2000; },
                      "curve[3].hi = 2000 must be >= samples_per_s"},
        MalformedCase{"CurveNodesNotAscending", [](Json& j) { j["curve"][1]["nodes"] = 1; },
                      "curve[1].nodes = 1 must be > the previous point's 1"},
        MalformedCase{"CurveNegativeEfficiency", [](Json& j) { j["curve"][0]["efficiency"] = -1; },
                      "curve[0].efficiency: must be >= 0"},
        MalformedCase{"ResizeCostNegative", [](Json& j) { j["resize_cost_s"]["grow"] = -1; },
                      "resize_cost_s.grow: must be >= 0"},
        MalformedCase{"ResizeCostString", [](Json& j) { j["resize_cost_s"]["shrink"] = "5"; },
                      "resize_cost_s.shrink: expected a number or null"},
        MalformedCase{"ResizeCostMissing", [](Json& j) { j["resize_cost_s"].erase("failure"); },
                      "resize_cost_s.failure: missing (required)"},
        MalformedCase{"ResizeCostNotObject", [](Json& j) { j["resize_cost_s"] = 3; },
                      "resize_cost_s: expected an object"},
        MalformedCase{"GainString", [](Json& j) { j["marginal_gain"]["up"] = "a lot"; },
                      "marginal_gain.up: expected a number or null"},
        MalformedCase{"GainUnknownKey", [](Json& j) { j["marginal_gain"]["sideways"] = 1; },
                      "marginal_gain.sideways: unknown key"},
        MalformedCase{"ProbeArray", [](Json& j) { j["probe"] = Json::array(); },
                      "probe: expected null or an object, got an array"},
        MalformedCase{"ProbeNodesZero", [](Json& j) { j["probe"]["nodes"] = 0; },
                      "probe.nodes: expected an integer in [1, 100000], got 0"},
        MalformedCase{"ProbeStepsZero", [](Json& j) { j["probe"]["steps"] = 0; },
                      "probe.steps: expected an integer in [1, "},
        MalformedCase{"ProbeReasonNumber", [](Json& j) { j["probe"]["reason"] = 5; },
                      "probe.reason: expected a string"},
        MalformedCase{"ModelMissing", [](Json& j) { j.erase("model"); },
                      "model: missing (required)"},
        MalformedCase{"ModelMissingGamma", [](Json& j) { j["model"].erase("gamma"); },
                      "model.gamma: missing (required)"},
        MalformedCase{"ModelGammaBelowOne", [](Json& j) { j["model"]["gamma"] = 0.5; },
                      "model.gamma: must be >= 1"},
        MalformedCase{"ModelGammaOutsideRange", [](Json& j) { j["model"]["gamma"] = 3.5; },
                      "model.gamma = 3.5 with gamma_lo = 1, gamma_hi = 3 must satisfy"},
        MalformedCase{"ModelFittedString", [](Json& j) { j["model"]["fitted"] = "yes"; },
                      "model.fitted: expected true or false"},
        MalformedCase{"ModelNegativeParameter",
                      [](Json& j) { j["model"]["network_per_node_s"] = -1; },
                      "model.network_per_node_s: must be >= 0"},
        MalformedCase{"ModelStepsUsedAboveObserved",
                      [](Json& j) { j["model"]["steps_used"] = 401; },
                      "model.steps_used = 401 must be in [0, steps_observed = 400]"},
        MalformedCase{"ModelUnknownKey", [](Json& j) { j["model"]["delta"] = 0; },
                      "model.delta: unknown key"},
        MalformedCase{"CurveWithoutModel", [](Json& j) { j["model"]["fitted"] = false; },
                      "curve must be empty when model.fitted is false"}),
    [](const ::testing::TestParamInfo<MalformedCase>& info) { return info.param.name; });

TEST(ReportJsonTest, RejectsMalformedTextAndDuplicateKeys) {
  EXPECT_THAT(ParseReportJson("{\"version\": 1,"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed JSON")));
  EXPECT_THAT(ParseReportJson("[]"), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("(top level): expected an object")));
  std::string text = ReportToJson(Full());
  text.insert(1, "\"step\": 3, ");
  EXPECT_THAT(ParseReportJson(text),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step: duplicate key")));
  text = ReportToJson(Full());
  const size_t at = text.find("\"gamma\":");
  text.insert(at, "\"gamma\": 2, ");
  EXPECT_THAT(ParseReportJson(text), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("model.gamma: duplicate key")));
}

TEST(ReportJsonTest, FormatsAReadableTable) {
  const std::string table = FormatReportTable(Full());
  EXPECT_THAT(table, HasSubstr("Scalability of job \"resnet-\"50\"\" at step 123456789012"));
  EXPECT_THAT(table,
              HasSubstr("    2       790.1   [    760.0,     821.5]       0.96  observed\n"));
  EXPECT_THAT(
      table,
      HasSubstr("    4      1500.0   [   1300.0,    1700.0]       0.91  observed, current\n"));
  EXPECT_THAT(table, HasSubstr("    8      2600.5   [   1900.0,    3300.0]       0.79  probe\n"));
  EXPECT_THAT(table, HasSubstr("resize pause (median): grow 12.50 s, shrink 8.25 s, failure n/a"));
  EXPECT_THAT(table, HasSubstr("one more node gains 120.5 samples/s, one fewer loses -3.0"));
  EXPECT_THAT(table, HasSubstr("gamma 1.25 [1.00, 3.00] (prior)"));
  EXPECT_THAT(table, HasSubstr("probe: 8 nodes for 30 steps"));
  AdvisorReport empty;
  EXPECT_THAT(FormatReportTable(empty), HasSubstr("no model yet"));
}

}  // namespace
}  // namespace malle::advisor
