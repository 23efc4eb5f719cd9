#include "libmalle/alloc/problem_json.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/alloc/decide.h"
#include "tests/cpp/testing/status_matchers.h"
#include "nlohmann/json.hpp"

namespace malle::alloc {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using Json = nlohmann::json;

// Every field set, none at its default.
constexpr char kFullProblem[] = R"({
  "version": 1,
  "forward_window_s": 90.5,
  "objective": "weighted",
  "resize_cost": "bftrainer",
  "cross_locality_factor": 0.8,
  "reclaim_rate": 2.5e-6,
  "resize_hysteresis": 2,
  "rank_weight_exponent": 1.5,
  "rank_aging_s": 36000,
  "classes": [
    {"id": "fast", "locality": "rack0", "speed": 1.0},
    {"id": "slow", "locality": "rack1", "speed": 0.5}
  ],
  "nodes": [
    {"id": "a0", "class": "fast"},
    {"id": "a1", "class": "fast", "idle_window_s": 30},
    {"id": "b0", "class": "slow", "idle_window_s": null},
    {"id": "b1", "class": "slow", "idle_window_s": 600.25}
  ],
  "jobs": [
    {"id": "resnet", "min_nodes": 1, "max_nodes": 4,
     "throughput": [[0, 0], [1, 5218.8], [2, 10582.5], [4, 20436]],
     "resize_up_s": 18.722, "resize_down_s": 11.031, "weight": 2.0, "remaining_samples": 1.3e8,
     "age_s": 7200.5, "nodes": ["a0", "b0"]},
    {"id": "vgg", "min_nodes": 2, "max_nodes": 4,
     "batch_options": [{"name": "bs256", "throughput": [[2, 2389.2], [4, 4691.7]]},
                       {"name": "bs1024", "throughput": [[2, 2500], [4, 5100.5]]}],
     "current_batch_option": 1, "remaining_samples": 4e6}
  ]
})";

// The smallest problem with one job; error cases patch one piece of it.
constexpr char kSmallProblem[] = R"({
  "version": 1,
  "node_count": 4,
  "jobs": [{"id": "a", "min_nodes": 1, "max_nodes": 4,
            "throughput": [[1, 100], [2, 190], [4, 350]], "nodes": ["n0"]}]
})";

void ExpectCurvesEqual(const Curve& a, const Curve& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].nodes, b[i].nodes) << "breakpoint " << i;
    EXPECT_EQ(a[i].samples_per_s, b[i].samples_per_s) << "breakpoint " << i;
  }
}

void ExpectProblemsEqual(const Problem& a, const Problem& b) {
  EXPECT_EQ(a.forward_window, b.forward_window);
  EXPECT_EQ(a.objective, b.objective);
  EXPECT_EQ(a.resize_cost, b.resize_cost);
  EXPECT_EQ(a.cross_locality_factor, b.cross_locality_factor);
  EXPECT_EQ(a.reclaim_rate, b.reclaim_rate);
  EXPECT_EQ(a.resize_hysteresis, b.resize_hysteresis);
  EXPECT_EQ(a.rank_weight_exponent, b.rank_weight_exponent);
  EXPECT_EQ(a.rank_aging, b.rank_aging);
  ASSERT_EQ(a.classes.size(), b.classes.size());
  for (size_t i = 0; i < a.classes.size(); ++i) {
    EXPECT_EQ(a.classes[i].id, b.classes[i].id);
    EXPECT_EQ(a.classes[i].locality, b.classes[i].locality);
    EXPECT_EQ(a.classes[i].speed, b.classes[i].speed);
  }
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    EXPECT_EQ(a.nodes[i].id, b.nodes[i].id);
    EXPECT_EQ(a.nodes[i].class_id, b.nodes[i].class_id);
    EXPECT_EQ(a.nodes[i].expected_idle, b.nodes[i].expected_idle) << a.nodes[i].id;
  }
  ASSERT_EQ(a.jobs.size(), b.jobs.size());
  for (size_t j = 0; j < a.jobs.size(); ++j) {
    const JobSpec& x = a.jobs[j];
    const JobSpec& y = b.jobs[j];
    EXPECT_EQ(x.id, y.id);
    EXPECT_EQ(x.min_nodes, y.min_nodes);
    EXPECT_EQ(x.max_nodes, y.max_nodes);
    ExpectCurvesEqual(x.throughput, y.throughput);
    ASSERT_EQ(x.batch_options.size(), y.batch_options.size());
    for (size_t o = 0; o < x.batch_options.size(); ++o) {
      EXPECT_EQ(x.batch_options[o].name, y.batch_options[o].name);
      ExpectCurvesEqual(x.batch_options[o].throughput, y.batch_options[o].throughput);
    }
    EXPECT_EQ(x.current_batch_option, y.current_batch_option);
    EXPECT_EQ(x.resize_up_pause, y.resize_up_pause);
    EXPECT_EQ(x.resize_down_pause, y.resize_down_pause);
    EXPECT_EQ(x.weight, y.weight);
    EXPECT_EQ(x.remaining_samples, y.remaining_samples);
    EXPECT_EQ(x.age, y.age);
    EXPECT_EQ(x.current_nodes, y.current_nodes);
  }
}

TEST(ParseProblemJsonTest, ReadsEveryField) {
  ASSERT_OK_AND_ASSIGN(Problem p, ParseProblemJson(kFullProblem));
  EXPECT_EQ(p.forward_window, absl::Milliseconds(90500));
  EXPECT_EQ(p.objective, Objective::kWeighted);
  EXPECT_EQ(p.resize_cost, ResizeCostModel::kBftrainer);
  EXPECT_EQ(p.cross_locality_factor, 0.8);
  EXPECT_EQ(p.reclaim_rate, 2.5e-6);
  EXPECT_EQ(p.resize_hysteresis, 2);
  EXPECT_EQ(p.rank_weight_exponent, 1.5);
  EXPECT_EQ(p.rank_aging, absl::Hours(10));
  ASSERT_EQ(p.classes.size(), 2u);
  EXPECT_EQ(p.classes[1].id, "slow");
  EXPECT_EQ(p.classes[1].locality, "rack1");
  EXPECT_EQ(p.classes[1].speed, 0.5);
  ASSERT_EQ(p.nodes.size(), 4u);
  EXPECT_EQ(p.nodes[0].class_id, "fast");
  EXPECT_EQ(p.nodes[0].expected_idle, absl::InfiniteDuration());  // absent
  EXPECT_EQ(p.nodes[1].expected_idle, absl::Seconds(30));
  EXPECT_EQ(p.nodes[2].expected_idle, absl::InfiniteDuration());  // null
  EXPECT_EQ(p.nodes[3].expected_idle, absl::Milliseconds(600250));
  ASSERT_EQ(p.jobs.size(), 2u);
  const JobSpec& resnet = p.jobs[0];
  EXPECT_EQ(resnet.id, "resnet");
  EXPECT_EQ(resnet.max_nodes, 4);
  ASSERT_EQ(resnet.throughput.size(), 4u);
  EXPECT_EQ(resnet.throughput[1].nodes, 1);
  EXPECT_EQ(resnet.throughput[1].samples_per_s, 5218.8);
  EXPECT_EQ(resnet.resize_up_pause, absl::Seconds(18.722));
  EXPECT_EQ(resnet.resize_down_pause, absl::Seconds(11.031));
  EXPECT_EQ(resnet.weight, 2.0);
  EXPECT_EQ(resnet.remaining_samples, 1.3e8);
  EXPECT_EQ(resnet.age, absl::Milliseconds(7200500));
  EXPECT_THAT(resnet.current_nodes, ElementsAre("a0", "b0"));
  const JobSpec& vgg = p.jobs[1];
  EXPECT_TRUE(vgg.throughput.empty());
  ASSERT_EQ(vgg.batch_options.size(), 2u);
  EXPECT_EQ(vgg.batch_options[1].name, "bs1024");
  EXPECT_EQ(vgg.batch_options[1].throughput[1].samples_per_s, 5100.5);
  EXPECT_EQ(vgg.current_batch_option, 1);
}

TEST(ParseProblemJsonTest, OmittedFieldsTakeTheStructDefaults) {
  ASSERT_OK_AND_ASSIGN(Problem p, ParseProblemJson(R"({"version": 1, "nodes": [{"id": "x"}],
                           "jobs": [{"id": "j", "throughput": [[1, 10]]}]})"));
  const Problem defaults;
  const JobSpec job_defaults;
  EXPECT_EQ(p.forward_window, defaults.forward_window);
  EXPECT_EQ(p.objective, defaults.objective);
  EXPECT_EQ(p.resize_cost, defaults.resize_cost);
  EXPECT_EQ(p.cross_locality_factor, defaults.cross_locality_factor);
  EXPECT_EQ(p.reclaim_rate, defaults.reclaim_rate);
  EXPECT_EQ(p.resize_hysteresis, defaults.resize_hysteresis);
  EXPECT_EQ(p.rank_weight_exponent, defaults.rank_weight_exponent);
  EXPECT_EQ(p.rank_aging, defaults.rank_aging);
  EXPECT_TRUE(p.classes.empty());
  EXPECT_EQ(p.nodes[0].class_id, "");
  EXPECT_EQ(p.nodes[0].expected_idle, absl::InfiniteDuration());
  const JobSpec& job = p.jobs[0];
  EXPECT_EQ(job.min_nodes, job_defaults.min_nodes);
  EXPECT_EQ(job.max_nodes, job_defaults.max_nodes);
  EXPECT_EQ(job.resize_up_pause, job_defaults.resize_up_pause);
  EXPECT_EQ(job.resize_down_pause, job_defaults.resize_down_pause);
  EXPECT_EQ(job.weight, job_defaults.weight);
  EXPECT_EQ(job.remaining_samples, job_defaults.remaining_samples);
  EXPECT_EQ(job.age, job_defaults.age);
  EXPECT_EQ(job.current_batch_option, 0);
  EXPECT_TRUE(job.current_nodes.empty());
}

TEST(ParseProblemJsonTest, NodeCountCreatesDefaultClassNodes) {
  ASSERT_OK_AND_ASSIGN(Problem p, ParseProblemJson(kSmallProblem));
  ASSERT_EQ(p.nodes.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(p.nodes[i].id, "n" + std::to_string(i));
    EXPECT_EQ(p.nodes[i].class_id, "");
    EXPECT_EQ(p.nodes[i].expected_idle, absl::InfiniteDuration());
  }
  ASSERT_OK_AND_ASSIGN(Problem none, ParseProblemJson(R"({"version": 1, "node_count": 0})"));
  EXPECT_TRUE(none.nodes.empty());
}

TEST(ParseProblemJsonTest, IntegralFloatsAreCounts) {
  // Python's json module writes 2.0 for a float count; it is still 2.
  ASSERT_OK_AND_ASSIGN(Problem p, ParseProblemJson(absl::StrReplaceAll(
                                      kSmallProblem, {{"\"node_count\": 4", "\"node_count\": 4.0"},
                                                      {"[2, 190]", "[2.0, 190]"}})));
  EXPECT_EQ(p.nodes.size(), 4u);
  EXPECT_EQ(p.jobs[0].throughput[1].nodes, 2);
}

TEST(ProblemToJsonTest, RoundTripsEveryField) {
  ASSERT_OK_AND_ASSIGN(Problem p, ParseProblemJson(kFullProblem));
  for (int indent : {2, 0, -1}) {
    const std::string text = ProblemToJson(p, indent);
    ASSERT_OK_AND_ASSIGN(Problem q, ParseProblemJson(text));
    ExpectProblemsEqual(p, q);
    EXPECT_EQ(ProblemToJson(q, indent), text);  // a fixed point
  }
  EXPECT_THAT(ProblemToJson(p, -1), Not(HasSubstr("\n")));
}

TEST(ProblemToJsonTest, RoundTripsAProblemBuiltInCpp) {
  Problem p;
  p.forward_window = absl::Minutes(2) + absl::Milliseconds(1);
  p.objective = Objective::kSpeedup;
  for (int i = 0; i < 3; ++i) p.nodes.push_back(Node{"n" + std::to_string(i)});
  p.nodes[1].expected_idle = absl::Seconds(1) / 3;  // not a short decimal
  JobSpec job;
  job.id = "j";
  job.max_nodes = 3;
  job.throughput = {{1, 1.0 / 3}, {3, 0.1 + 0.2}};
  job.resize_up_pause = absl::Milliseconds(17788);
  job.resize_down_pause = absl::Microseconds(11273001);
  job.weight = 1e-3;
  job.current_nodes = {"n2", "n0"};
  p.jobs.push_back(job);
  ASSERT_THAT(ValidateProblem(p), IsOk());
  ASSERT_OK_AND_ASSIGN(Problem q, ParseProblemJson(ProblemToJson(p)));
  ExpectProblemsEqual(p, q);
}

TEST(ProblemToJsonTest, WritesTheDocumentedKeys) {
  ASSERT_OK_AND_ASSIGN(Problem p, ParseProblemJson(kFullProblem));
  const Json out = Json::parse(ProblemToJson(p));
  EXPECT_EQ(out["version"], 1);
  EXPECT_EQ(out["forward_window_s"], 90.5);
  EXPECT_EQ(out["objective"], "weighted");
  EXPECT_EQ(out["resize_cost"], "bftrainer");
  EXPECT_TRUE(out["nodes"][0]["idle_window_s"].is_null());  // unknown
  EXPECT_EQ(out["nodes"][1]["idle_window_s"], 30.0);
  EXPECT_EQ(out["jobs"][0]["throughput"][1], Json::array({1, 5218.8}));
  EXPECT_EQ(out["jobs"][0]["nodes"], Json::array({"a0", "b0"}));
  EXPECT_EQ(out["jobs"][1]["batch_options"][1]["name"], "bs1024");
  EXPECT_EQ(out["reclaim_rate"], 2.5e-6);
  EXPECT_EQ(out["resize_hysteresis"], 2.0);
  EXPECT_EQ(out["rank_weight_exponent"], 1.5);
  EXPECT_EQ(out["jobs"][0]["remaining_samples"], 1.3e8);
  EXPECT_EQ(out["rank_aging_s"], 36000.0);
  EXPECT_EQ(out["jobs"][0]["age_s"], 7200.5);
  // The terms at their defaults (none) are left out, as before they existed.
  ASSERT_OK_AND_ASSIGN(Problem small, ParseProblemJson(kSmallProblem));
  const Json plain = Json::parse(ProblemToJson(small));
  for (const char* key :
       {"reclaim_rate", "resize_hysteresis", "rank_weight_exponent", "rank_aging_s"}) {
    EXPECT_FALSE(plain.contains(key)) << key;
  }
  EXPECT_FALSE(plain["jobs"][0].contains("remaining_samples"));
  EXPECT_FALSE(plain["jobs"][0].contains("age_s"));
}

// The objective terms a JSON problem can carry (docs/allocator.md) change the
// decision as they do from C++: with rank weights the job closer to done
// grows first, and the completion objective reads remaining_samples.
TEST(ParseProblemJsonTest, ObjectiveTermsReachTheDecision) {
  constexpr char kTwo[] = R"({
    "version": 1, "node_count": 2, "objective": "speedup", "forward_window_s": 30,
    "jobs": [
      {"id": "long", "min_nodes": 1, "max_nodes": 2, "throughput": [[1, 10], [2, 18]],
       "remaining_samples": 4000},
      {"id": "short", "min_nodes": 1, "max_nodes": 2, "throughput": [[1, 10], [2, 18]],
       "remaining_samples": 1000}
    ]})";
  auto counts = [](const std::string& text) -> std::vector<int> {
    absl::StatusOr<Problem> p = ParseProblemJson(text);
    EXPECT_THAT(p.status(), IsOk());
    if (!p.ok()) return {};
    absl::StatusOr<Decision> d = Decide(*p, DecideOptions{PolicyKind::kDp});
    EXPECT_THAT(d.status(), IsOk());
    if (!d.ok()) return {};
    std::vector<int> out;
    for (const JobAllocation& j : d->allocation.jobs)
      out.push_back(static_cast<int>(j.nodes.size()));
    return out;
  };
  // Speedup alone: one node each (10 + 10 beats 18).
  EXPECT_THAT(counts(kTwo), ElementsAre(1, 1));
  // Rank weights: the short job weighs 2, the long one 1: 2 x 18 / 10 beats
  // 2 x 1 + 1 x 1.
  const std::string ranked = absl::StrReplaceAll(
      kTwo,
      {{"\"objective\": \"speedup\"", "\"objective\": \"speedup\", \"rank_weight_exponent\": 1"}});
  EXPECT_THAT(counts(ranked), ElementsAre(0, 2));
  const std::string completion =
      absl::StrReplaceAll(kTwo, {{"\"objective\": \"speedup\"", "\"objective\": \"completion\""}});
  // Completion: work over the window as a share of what is left: 540 / 1000
  // for the short job on both nodes beats 300 / 4000 + 300 / 1000.
  EXPECT_THAT(counts(completion), ElementsAre(0, 2));
}

// One bad input and what the error must say (the JSON path first).
struct BadCase {
  const char* name;
  std::string text;
  std::string message;  // expected substring
};

std::string Patch(absl::string_view from, absl::string_view to) {
  std::string text = absl::StrReplaceAll(kSmallProblem, {{from, to}});
  EXPECT_NE(text, kSmallProblem) << "patch did not apply: " << from;
  return text;
}

std::vector<BadCase> BadCases() {
  return {
      {"malformed", R"({"version": 1,)", "malformed JSON: parse error at line 1, column 15"},
      {"malformed_second_line", "{\"version\": 1,\n \"jobs\": [}", "line 2"},
      {"trailing_garbage", R"({"version": 1} x)", "malformed JSON"},
      {"nan_literal", Patch("\"node_count\": 4", "\"node_count\": NaN"), "malformed JSON"},
      {"top_level_array", "[1, 2]", "(top level): expected an object, got an array"},
      {"missing_version", R"({"node_count": 1})", "version: missing (required)"},
      {"version_2", Patch("\"version\": 1", "\"version\": 2"),
       "version: unsupported version 2; this build reads version 1"},
      {"version_string", Patch("\"version\": 1", "\"version\": \"1\""),
       "version: expected an integer format version, got the string \"1\""},
      {"unknown_top_key", Patch("\"node_count\"", "\"nodecount\""),
       "nodecount: unknown key; expected one of version, forward_window_s"},
      {"unknown_job_key", Patch("\"max_nodes\"", "\"maxnodes\""), "jobs[0].maxnodes: unknown key"},
      {"duplicate_key", Patch("\"min_nodes\": 1,", "\"min_nodes\": 1, \"min_nodes\": 2,"),
       "jobs[0].min_nodes: duplicate key"},
      {"non_integer_count", Patch("[2, 190]", "[2.5, 190]"),
       "jobs[0].throughput[1][0]: expected an integer node count, got 2.5"},
      {"negative_count", Patch("[1, 100]", "[-1, 100]"),
       "jobs[0].throughput[0][0]: an integer node count must be in [0, 1000000], got -1"},
      {"string_throughput", Patch("[4, 350]", "[4, \"fast\"]"),
       "jobs[0].throughput[2][1]: expected a throughput (samples/s), got the string \"fast\""},
      {"infinite_throughput", Patch("[4, 350]", "[4, 1e999]"),
       "malformed JSON: number overflow parsing '1e999'"},
      {"negative_throughput", Patch("[4, 350]", "[4, -3]"),
       "jobs[0].throughput[2][1]: throughput must be >= 0, got -3"},
      {"short_pair", Patch("[4, 350]", "[4]"),
       "jobs[0].throughput[2]: expected a [nodes, samples_per_s] pair, got an array of 1"},
      {"point_object", Patch("[4, 350]", "{\"nodes\": 4}"),
       "jobs[0].throughput[2]: expected a [nodes, samples_per_s] pair, got an object"},
      {"throughput_not_array", Patch("[[1, 100], [2, 190], [4, 350]]", "350"),
       "jobs[0].throughput: expected an array, got 350"},
      {"min_nodes_float", Patch("\"min_nodes\": 1", "\"min_nodes\": 1.5"),
       "jobs[0].min_nodes: expected an integer node count, got 1.5"},
      {"min_nodes_null", Patch("\"min_nodes\": 1", "\"min_nodes\": null"),
       "jobs[0].min_nodes: expected an integer node count, got null"},
      {"negative_resize", Patch("\"nodes\": [\"n0\"]", "\"nodes\": [\"n0\"], \"resize_up_s\": -1"),
       "jobs[0].resize_up_s: a duration must be >= 0 seconds, got -1"},
      {"negative_forward_window",
       Patch("\"node_count\": 4",
             "\"node_count\": 4, "
             "\"forward_window_s\": -60"),
       "forward_window_s: a duration must be >= 0 seconds, got -60"},
      {"zero_forward_window",
       Patch("\"node_count\": 4",
             "\"node_count\": 4, "
             "\"forward_window_s\": 0"),
       "forward_window_s: must be > 0 seconds"},
      {"bad_objective", Patch("\"node_count\": 4", "\"node_count\": 4, \"objective\": \"fast\""),
       "objective: expected one of \"throughput\", \"speedup\", \"weighted\", \"completion\", "
       "got the string \"fast\""},
      {"bad_resize_cost", Patch("\"node_count\": 4", "\"node_count\": 4, \"resize_cost\": 1"),
       "resize_cost: expected a string, got 1"},
      {"hysteresis_below_one",
       Patch("\"node_count\": 4", "\"node_count\": 4, \"resize_hysteresis\": 0.5"),
       "resize_hysteresis: must be finite and >= 1, got 0.5"},
      {"hysteresis_string",
       Patch("\"node_count\": 4", "\"node_count\": 4, \"resize_hysteresis\": \"2\""),
       "resize_hysteresis: expected a factor (>= 1), got the string \"2\""},
      {"negative_reclaim_rate",
       Patch("\"node_count\": 4", "\"node_count\": 4, \"reclaim_rate\": -1e-6"),
       "reclaim_rate: must be finite and >= 0, got -1e-06"},
      {"negative_rank_exponent",
       Patch("\"node_count\": 4", "\"node_count\": 4, \"rank_weight_exponent\": -1"),
       "rank_weight_exponent: must be finite and >= 0, got -1"},
      {"rank_aging_zero", Patch("\"node_count\": 4", "\"node_count\": 4, \"rank_aging_s\": 0"),
       "rank_aging_s: must be > 0 (infinite: off), got 0"},
      {"rank_aging_without_weights",
       Patch("\"node_count\": 4", "\"node_count\": 4, \"rank_aging_s\": 3600"),
       "rank_aging_s: is 1h, but rank weights are off (rank_weight_exponent = 0)"},
      {"negative_age", Patch("\"max_nodes\": 4,", "\"max_nodes\": 4, \"age_s\": -5,"),
       "jobs[0].age_s: a duration must be >= 0 seconds, got -5"},
      {"rank_weights_without_work",
       Patch("\"node_count\": 4", "\"node_count\": 4, \"rank_weight_exponent\": 1"),
       "jobs[0] (\"a\").remaining_samples: must be > 0 with rank_weight_exponent > 0"},
      {"completion_without_work",
       Patch("\"node_count\": 4", "\"node_count\": 4, \"objective\": \"completion\""),
       "jobs[0] (\"a\").remaining_samples: must be > 0 for the completion objective"},
      {"negative_remaining",
       Patch("\"nodes\": [\"n0\"]", "\"nodes\": [\"n0\"], \"remaining_samples\": -5"),
       "jobs[0] (\"a\").remaining_samples: must be finite and >= 0, got -5"},
      {"node_id_number", Patch("\"nodes\": [\"n0\"]", "\"nodes\": [0]"),
       "jobs[0].nodes[0]: expected a string, got 0"},
      {"nodes_and_node_count", Patch("\"node_count\": 4", "\"node_count\": 4, \"nodes\": []"),
       "node_count: give either \"nodes\" or \"node_count\", not both"},
      {"negative_node_count", Patch("\"node_count\": 4", "\"node_count\": -4"),
       "node_count: an integer node count must be in [0, 1000000], got -4"},
      {"huge_node_count", Patch("\"node_count\": 4", "\"node_count\": 18446744073709551615"),
       "node_count: an integer node count must be in [0, 1000000]"},
      {"node_without_id", R"({"version": 1, "nodes": [{"id": "a"}, {"class": "x"}]})",
       "nodes[1].id: missing (required)"},
      {"node_idle_negative", R"({"version": 1, "nodes": [{"id": "a", "idle_window_s": -5}]})",
       "nodes[0].idle_window_s: a duration must be >= 0 seconds, got -5"},
      {"node_idle_string", R"({"version": 1, "nodes": [{"id": "a", "idle_window_s": "1h"}]})",
       "nodes[0].idle_window_s: expected a duration in seconds, got the string \"1h\""},
      {"class_unknown_key", R"({"version": 1, "classes": [{"id": "c", "speeed": 2}]})",
       "classes[0].speeed: unknown key; expected one of id, locality, speed"},
      {"batch_option_without_curve",
       Patch("\"throughput\": [[1, 100], [2, 190], [4, 350]]",
             "\"batch_options\": [{\"name\": "
             "\"bs\"}]"),
       "jobs[0].batch_options[0].throughput: missing (required)"},
      // Semantic errors come from ValidateProblem, with the JSON key names.
      {"min_above_max", Patch("\"min_nodes\": 1", "\"min_nodes\": 5"),
       "min_nodes = 5 > max_nodes = 4"},
      {"unknown_current_node", Patch("[\"n0\"]", "[\"n9\"]"),
       "jobs[0] (\"a\").nodes[0]: unknown node \"n9\""},
      {"curve_too_short", Patch(", [4, 350]", ""), "jobs[0] (\"a\").throughput"},
  };
}

TEST(ParseProblemJsonTest, RejectsBadInputNamingThePath) {
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(ParseProblemJson(c.text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(ParseProblemJsonTest, ErrorsStartWithThePath) {
  EXPECT_THAT(
      ParseProblemJson(Patch("[2, 190]", "[2.5, 190]")),
      StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("jobs[0].throughput[1][0]: ")));
}

TEST(ParseDecideOptionsJsonTest, EmptyMeansDefaults) {
  for (const char* text : {"", "  \n", "{}"}) {
    ASSERT_OK_AND_ASSIGN(DecideOptions o, ParseDecideOptionsJson(text));
    const DecideOptions defaults;
    EXPECT_EQ(o.policy, defaults.policy);
    EXPECT_EQ(o.milp.time_limit, defaults.milp.time_limit);
    EXPECT_EQ(o.milp.isolation, defaults.milp.isolation);
    EXPECT_EQ(o.milp.relative_gap, defaults.milp.relative_gap);
    EXPECT_EQ(o.model.horizon_buckets, defaults.model.horizon_buckets);
  }
}

TEST(ParseDecideOptionsJsonTest, ReadsEveryKey) {
  ASSERT_OK_AND_ASSIGN(DecideOptions o, ParseDecideOptionsJson(R"({
      "policy": "equal_share", "time_limit_s": 0.25, "isolation": "in_process",
      "relative_gap": 1e-4, "horizon_buckets": 16})"));
  EXPECT_EQ(o.policy, PolicyKind::kEqualShare);
  EXPECT_EQ(o.milp.time_limit, absl::Milliseconds(250));
  EXPECT_EQ(o.milp.isolation, SolveIsolation::kInProcess);
  EXPECT_EQ(o.milp.relative_gap, 1e-4);
  EXPECT_EQ(o.model.horizon_buckets, 16);
}

TEST(ParseDecideOptionsJsonTest, RejectsBadOptionsNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"policy": "best"})", "policy: unknown policy \"best\"; expected one of milp"},
      {R"({"policy": 1})", "policy: expected a string, got 1"},
      {R"({"time_limit_s": 0})", "time_limit_s: must be > 0 seconds, got 0"},
      {R"({"time_limit_s": -1})", "time_limit_s: a duration must be >= 0 seconds"},
      {R"({"time_limit_s": "1s"})", "time_limit_s: expected a duration in seconds"},
      {R"({"isolation": "thread"})", "isolation: expected one of \"fork\", \"in_process\""},
      {R"({"relative_gap": -0.1})", "relative_gap: must be >= 0"},
      {R"({"horizon_buckets": 0})", "horizon_buckets: an integer bucket count must be in [1, "},
      {R"({"horizon_buckets": 2.5})", "horizon_buckets: expected an integer bucket count, got 2.5"},
      {R"({"time_limit": 1})", "time_limit: unknown key; expected one of policy, time_limit_s"},
      {R"({"policy": "dp", "policy": "milp"})", "policy: duplicate key"},
      {R"([])", "(top level): expected an object, got an array"},
      {R"({"policy": )", "malformed JSON"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    EXPECT_THAT(ParseDecideOptionsJson(text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  }
}

// DecisionToJson on a hand-made decision: every kind of change, batch option
// names, solver detail. Independent of the policies.
TEST(DecisionToJsonTest, WritesEveryFieldAndChange) {
  ASSERT_OK_AND_ASSIGN(Problem p, ParseProblemJson(R"({
      "version": 1, "node_count": 8,
      "jobs": [
        {"id": "grows", "max_nodes": 8, "throughput": [[1, 1], [8, 8]], "nodes": ["n0"]},
        {"id": "shrinks", "max_nodes": 8, "throughput": [[1, 1], [8, 8]], "nodes": ["n1", "n2"]},
        {"id": "starts", "max_nodes": 8, "throughput": [[1, 1], [8, 8]]},
        {"id": "stops", "max_nodes": 8, "throughput": [[1, 1], [8, 8]], "nodes": ["n3"]},
        {"id": "same", "max_nodes": 8, "nodes": ["n4"],
         "batch_options": [{"name": "bs64", "throughput": [[1, 1], [8, 8]]},
                           {"name": "bs128", "throughput": [[1, 2], [8, 9]]}]}
      ]})"));
  Decision d;
  d.policy = PolicyKind::kDp;
  d.objective = 42.5;
  d.current_objective = 40;
  d.result.reason = "dp: optimal";
  d.result.answered_by = "dp";
  d.result.optimal = true;
  d.result.solve_time = absl::Microseconds(1500);
  d.result.rows = 3;
  d.result.columns = 7;
  d.result.branch_nodes = 11;
  d.result.best_bound = 43;
  d.allocation.jobs = {
      {"grows", {"n0", "n5"}, 1, 0, 2.0, 240.0}, {"shrinks", {"n1"}, 2, 0, 1.0, 120.0},
      {"starts", {"n2"}, 0, 0, 1.0, 100.0},      {"stops", {}, 1, 0, 0.0, 0.0},
      {"same", {"n4"}, 1, 1, 2.0, 200.0},
  };
  d.allocation.idle_nodes = {"n3", "n6", "n7"};

  const Json out = Json::parse(DecisionToJson(p, d));
  EXPECT_EQ(out["version"], 1);
  EXPECT_EQ(out["policy"], "dp");
  EXPECT_EQ(out["reason"], "dp: optimal");
  EXPECT_EQ(out["objective"], 42.5);
  EXPECT_EQ(out["current_objective"], 40.0);
  EXPECT_EQ(out["optimal"], true);
  EXPECT_EQ(out["fell_back"], false);
  EXPECT_EQ(out["answered_by"], "dp");
  EXPECT_DOUBLE_EQ(out["solve_ms"].get<double>(), 1.5);
  EXPECT_EQ(out["solver"],
            (Json{{"rows", 3}, {"columns", 7}, {"branch_nodes", 11}, {"best_bound", 43.0}}));
  ASSERT_EQ(out["jobs"].size(), 5u);
  std::vector<std::string> changes;
  for (const Json& job : out["jobs"]) changes.push_back(job["change"].get<std::string>());
  EXPECT_THAT(changes, ElementsAre("grow", "shrink", "start", "stop", "same"));
  const Json& grows = out["jobs"][0];
  EXPECT_EQ(grows["id"], "grows");
  EXPECT_EQ(grows["nodes"], Json::array({"n0", "n5"}));
  EXPECT_EQ(grows["count"], 2);
  EXPECT_EQ(grows["previous_count"], 1);
  EXPECT_EQ(grows["samples_per_s"], 2.0);
  EXPECT_EQ(grows["value"], 240.0);
  EXPECT_FALSE(grows.contains("batch_option"));  // the job has no options
  EXPECT_EQ(out["jobs"][3]["nodes"], Json::array());
  EXPECT_EQ(out["jobs"][4]["batch_option"], "bs128");
  EXPECT_EQ(out["idle_nodes"], Json::array({"n3", "n6", "n7"}));
  EXPECT_THAT(DecisionToJson(p, d, -1), Not(HasSubstr("\n")));
}

// The whole path a malle-alloc user takes: JSON in, Decide, JSON out.
TEST(DecisionToJsonTest, DescribesADecidedProblem) {
  ASSERT_OK_AND_ASSIGN(Problem p, ParseProblemJson(R"({
      "version": 1, "node_count": 6,
      "jobs": [
        {"id": "a", "min_nodes": 1, "max_nodes": 4, "throughput": [[1, 100], [4, 400]],
         "nodes": ["n0"]},
        {"id": "b", "min_nodes": 2, "max_nodes": 2, "throughput": [[2, 150]]}
      ]})"));
  for (const char* policy : {"dp", "greedy", "equal_share", "static"}) {
    SCOPED_TRACE(policy);
    ASSERT_OK_AND_ASSIGN(DecideOptions options,
                         ParseDecideOptionsJson(absl::StrCat(R"({"policy": ")", policy, "\"}")));
    ASSERT_OK_AND_ASSIGN(Decision d, Decide(p, options));
    const Json out = Json::parse(DecisionToJson(p, d));
    EXPECT_EQ(out["policy"], policy);
    EXPECT_FALSE(out["reason"].get<std::string>().empty());
    ASSERT_EQ(out["jobs"].size(), 2u);
    EXPECT_EQ(out["jobs"][0]["id"], "a");
    EXPECT_EQ(out["jobs"][0]["previous_count"], 1);
    int held = 0;
    for (const Json& job : out["jobs"]) {
      EXPECT_EQ(job["count"], job["nodes"].size());
      held += job["count"].get<int>();
    }
    EXPECT_EQ(held + static_cast<int>(out["idle_nodes"].size()), 6);
  }
  // 6 nodes, a: 4 and b: 2 is the optimum; the exact policy finds it.
  ASSERT_OK_AND_ASSIGN(DecideOptions dp, ParseDecideOptionsJson(R"({"policy": "dp"})"));
  ASSERT_OK_AND_ASSIGN(Decision d, Decide(p, dp));
  const Json out = Json::parse(DecisionToJson(p, d));
  EXPECT_EQ(out["jobs"][0]["count"], 4);
  EXPECT_EQ(out["jobs"][0]["change"], "grow");
  EXPECT_EQ(out["jobs"][1]["count"], 2);
  EXPECT_EQ(out["jobs"][1]["change"], "start");
  EXPECT_EQ(out["idle_nodes"], Json::array());
  EXPECT_EQ(out["jobs"][0]["nodes"][0], "n0");  // keeps the node it held
  EXPECT_EQ(out["optimal"], true);
}

}  // namespace
}  // namespace malle::alloc
