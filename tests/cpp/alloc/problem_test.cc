#include "libmalle/alloc/problem.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::alloc {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

Problem ValidProblem() {
  Problem p;
  p.classes = {{"fast", "rack0", 1.0}, {"slow", "rack1", 0.5}};
  for (int i = 0; i < 4; ++i) {
    p.nodes.push_back(Node{absl::StrCat("n", i), i < 2 ? "fast" : "slow"});
  }
  JobSpec a;
  a.id = "resnet";
  a.min_nodes = 1;
  a.max_nodes = 4;
  a.throughput = {{0, 0}, {1, 100}, {2, 190}, {4, 350}};
  a.current_nodes = {"n0"};
  JobSpec b = a;
  b.id = "vgg";
  b.current_nodes = {"n2", "n3"};
  p.jobs = {a, b};
  return p;
}

TEST(InterpolateTest, LinearBetweenBreakpointsAndExactAtThem) {
  const Curve curve = {{1, 100}, {2, 190}, {4, 350}};
  EXPECT_DOUBLE_EQ(Interpolate(curve, 1), 100);
  EXPECT_DOUBLE_EQ(Interpolate(curve, 2), 190);
  EXPECT_DOUBLE_EQ(Interpolate(curve, 3), 270);
  EXPECT_DOUBLE_EQ(Interpolate(curve, 4), 350);
  EXPECT_DOUBLE_EQ(Interpolate(curve, 0), 0);  // outside the range
  EXPECT_DOUBLE_EQ(Interpolate(curve, 5), 0);
  EXPECT_DOUBLE_EQ(Interpolate(Curve{{3, 42}}, 3), 42);
}

TEST(ObjectiveNameTest, EveryNameParsesBackAndOthersAreRefused) {
  for (Objective o : {Objective::kThroughput, Objective::kSpeedup, Objective::kWeighted,
                      Objective::kCompletion}) {
    absl::StatusOr<Objective> back = ParseObjectiveName(ObjectiveName(o));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, o);
  }
  EXPECT_THAT(ParseObjectiveName("fast").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("objective: unknown objective \"fast\"; expected one of "
                                 "throughput, speedup, weighted, completion")));
}

TEST(ValidateProblemTest, AcceptsAValidProblem) { EXPECT_THAT(ValidateProblem(ValidProblem()), IsOk()); }

struct BadCase {
  std::string name;
  std::function<void(Problem&)> corrupt;
  std::string expected;  // substring of the error, naming the field
};

class ValidateProblemBadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ValidateProblemBadInputTest, RejectsWithTheFieldNamed) {
  Problem p = ValidProblem();
  GetParam().corrupt(p);
  EXPECT_THAT(ValidateProblem(p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().expected)));
}

const double kNaN = std::numeric_limits<double>::quiet_NaN();

INSTANTIATE_TEST_SUITE_P(
    Cases, ValidateProblemBadInputTest,
    ::testing::Values(
        BadCase{"MinGreaterThanMax", [](Problem& p) { p.jobs[1].min_nodes = 5; },
                "jobs[1] (\"vgg\"): min_nodes = 5 > max_nodes = 4"},
        BadCase{"MinZero", [](Problem& p) { p.jobs[0].min_nodes = 0; },
                "jobs[0] (\"resnet\").min_nodes: must be >= 1"},
        BadCase{"NegativeThroughput",
                [](Problem& p) { p.jobs[0].throughput[2].samples_per_s = -1; },
                "jobs[0] (\"resnet\").throughput[2]: samples_per_s must be finite and >= 0"},
        BadCase{"NanThroughput", [](Problem& p) { p.jobs[0].throughput[1].samples_per_s = kNaN; },
                "throughput[1]: samples_per_s must be finite"},
        BadCase{"UnsortedBreakpoints",
                [](Problem& p) { std::swap(p.jobs[1].throughput[1], p.jobs[1].throughput[2]); },
                "jobs[1] (\"vgg\").throughput[2]: breakpoints must have strictly increasing nodes"},
        BadCase{"DuplicateBreakpoint", [](Problem& p) { p.jobs[0].throughput[2].nodes = 1; },
                "strictly increasing nodes; 1 follows 1"},
        BadCase{"CurveTooShort", [](Problem& p) { p.jobs[0].max_nodes = 8; },
                "breakpoints cover nodes [0, 4] but the job needs [min_nodes, max_nodes] = [1, 8]"},
        BadCase{"EmptyCurve", [](Problem& p) { p.jobs[0].throughput.clear(); },
                "jobs[0] (\"resnet\").throughput: has no breakpoints"},
        BadCase{"DuplicateJobId", [](Problem& p) { p.jobs[1].id = "resnet"; },
                "jobs[1].id: duplicate job id \"resnet\""},
        BadCase{"EmptyJobId", [](Problem& p) { p.jobs[0].id = ""; },
                "jobs[0].id: must not be empty"},
        BadCase{"DuplicateNodeId", [](Problem& p) { p.nodes[3].id = "n0"; },
                "nodes[3].id: duplicate node id \"n0\""},
        // Node entries are named only when they fail (ValidateProblem).
        BadCase{"EmptyNodeId", [](Problem& p) { p.nodes[2].id = ""; },
                "nodes[2].id: must not be empty"},
        BadCase{"NodeIdWithControlCharacter", [](Problem& p) { p.nodes[1].id = "n\t1"; },
                "nodes[1].id: contains a control character"},
        BadCase{"UnknownClass", [](Problem& p) { p.nodes[1].class_id = "gpu"; },
                "nodes[1].class: unknown class \"gpu\""},
        BadCase{"ZeroSpeed", [](Problem& p) { p.classes[1].speed = 0; },
                "classes[1].speed: must be finite and > 0"},
        BadCase{"DuplicateClass", [](Problem& p) { p.classes[1].id = "fast"; },
                "classes[1].id: duplicate class id"},
        BadCase{"NegativeWindow", [](Problem& p) { p.nodes[0].expected_idle = absl::Seconds(-1); },
                "nodes[0].expected_idle: must be >= 0"},
        BadCase{"NegativePause",
                [](Problem& p) { p.jobs[1].resize_down_pause = absl::Seconds(-2); },
                "jobs[1] (\"vgg\").resize_down_pause: must be >= 0"},
        BadCase{"InfinitePause",
                [](Problem& p) { p.jobs[1].resize_up_pause = absl::InfiniteDuration(); },
                "resize_up_pause: must be finite"},
        BadCase{"NegativeWeight", [](Problem& p) { p.jobs[0].weight = -1; },
                "jobs[0] (\"resnet\").weight: must be finite and >= 0"},
        BadCase{"UnknownCurrentNode", [](Problem& p) { p.jobs[0].current_nodes = {"n9"}; },
                "jobs[0] (\"resnet\").current_nodes[0]: unknown node \"n9\""},
        BadCase{"NodeHeldTwice",
                [](Problem& p) {
                  p.jobs[1].current_nodes = {"n2", "n0"};
                },
                "jobs[1] (\"vgg\").current_nodes[1]: node \"n0\" is also held by job \"resnet\""},
        BadCase{"NodeListedTwice",
                [](Problem& p) {
                  p.jobs[1].current_nodes = {"n2", "n2"};
                },
                "node \"n2\" listed twice"},
        BadCase{"MoreCurrentThanMax",
                [](Problem& p) {
                  p.jobs[1].max_nodes = 1;
                  p.jobs[1].throughput = {{1, 10}};
                },
                "jobs[1] (\"vgg\").current_nodes: holds 2 nodes, more than max_nodes = 1"},
        BadCase{"ZeroWindow", [](Problem& p) { p.forward_window = absl::ZeroDuration(); },
                "forward_window: must be finite and > 0"},
        BadCase{"CrossFactor", [](Problem& p) { p.cross_locality_factor = 1.5; },
                "cross_locality_factor: must be in (0, 1]"},
        BadCase{"CurveAndBatchOptions",
                [](Problem& p) {
                  p.jobs[0].batch_options = {{"bs256", p.jobs[0].throughput}};
                },
                "jobs[0] (\"resnet\").throughput: must be empty when batch_options are given"},
        BadCase{"BatchOptionOutOfRange",
                [](Problem& p) {
                  p.jobs[0].batch_options = {{"bs256", p.jobs[0].throughput}};
                  p.jobs[0].throughput.clear();
                  p.jobs[0].current_batch_option = 1;
                },
                "jobs[0] (\"resnet\").current_batch_option: must be in [0, 0], got 1"},
        BadCase{"BatchOptionCurveBad",
                [](Problem& p) {
                  p.jobs[0].batch_options = {{"bs256", p.jobs[0].throughput},
                                             {"bs512", {{1, 5}}}};
                  p.jobs[0].throughput.clear();
                },
                "jobs[0] (\"resnet\").batch_options[1].throughput: breakpoints cover nodes [1, 1]"},
        BadCase{"SpeedupNeedsRateAtMin",
                [](Problem& p) {
                  p.objective = Objective::kSpeedup;
                  p.jobs[0].throughput[1].samples_per_s = 0;
                },
                "throughput at min_nodes is 0, so the speedup objective is undefined"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(ValidateProblemTest, ClassMayBeOmittedWithOneClassOrNone) {
  Problem p = ValidProblem();
  p.classes.resize(1);
  for (Node& n : p.nodes) n.class_id.clear();
  EXPECT_THAT(ValidateProblem(p), IsOk());
  p.classes.clear();
  EXPECT_THAT(ValidateProblem(p), IsOk());
  p.nodes[0].class_id = "default";
  EXPECT_THAT(ValidateProblem(p), IsOk());
}

}  // namespace
}  // namespace malle::alloc
