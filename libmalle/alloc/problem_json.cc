// JSON forms of a Problem, a Decision and DecideOptions (problem_json.h).
//
// nlohmann::json is used in this file only. Reading walks the document with
// an explicit JSON path, so that every error says where it happened
// (`jobs[3].throughput[1][0]: ...`); semantic checks that do not depend on
// the JSON form (min <= max, curves cover the range, node ids exist) are left
// to ValidateProblem, which names the field the same way.
#include "libmalle/alloc/problem_json.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libmalle/base/json_path.h"
#include "libmalle/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace malle::alloc {
namespace {

using Json = nlohmann::json;
// Output keeps the documented key order (docs/allocator-json.md).
using OrderedJson = nlohmann::ordered_json;

// Upper bound of every count (node counts, node_count, horizon buckets): far
// above any real cluster, low enough that a typo cannot allocate gigabytes.
constexpr int64_t kMaxCount = 1'000'000;

using json_path::CheckKeys;
using json_path::Describe;
using json_path::Element;
using json_path::Member;
using json_path::ParseStrictJson;
using json_path::PathError;
using json_path::ReadBool;
using json_path::ReadString;


const Json* Find(const Json& object, absl::string_view key) {
  auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

absl::Status CheckArray(const Json& value, const std::string& path) {
  if (!value.is_array()) {
    return PathError(path, absl::StrCat("expected an array, got ", Describe(value)));
  }
  return absl::OkStatus();
}

// A finite number. (JSON has no NaN or Infinity literals and the parser
// refuses 1e999; the check guards documents built in memory.)
absl::StatusOr<double> ReadNumber(const Json& value, const std::string& path,
                                  absl::string_view what) {
  if (!value.is_number()) {
    return PathError(path, absl::StrCat("expected ", what, ", got ", Describe(value)));
  }
  const double number = value.get<double>();
  if (!std::isfinite(number)) {
    return PathError(path, absl::StrCat("expected ", what, ", got a non-finite number"));
  }
  return number;
}

// An integer in [lo, hi]. A float with an integral value (2.0, as Python's
// json module writes a float) is accepted; 2.5 is not.
absl::StatusOr<int> ReadInt(const Json& value, const std::string& path, absl::string_view what,
                            int64_t lo, int64_t hi) {
  const std::string expected = absl::StrCat("expected ", what, ", got ", Describe(value));
  double number = 0;
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    number = u > static_cast<uint64_t>(hi) ? static_cast<double>(hi) + 1 : static_cast<double>(u);
  } else if (value.is_number_integer()) {
    number = static_cast<double>(value.get<int64_t>());
  } else if (value.is_number_float()) {
    number = value.get<double>();
    if (!std::isfinite(number) || number != std::floor(number)) return PathError(path, expected);
  } else {
    return PathError(path, expected);
  }
  if (number < static_cast<double>(lo) || number > static_cast<double>(hi)) {
    return PathError(
        path, absl::StrFormat("%s must be in [%d, %d], got %s", what, lo, hi, Describe(value)));
  }
  return static_cast<int>(number);
}

// Seconds as a non-negative finite number.
absl::StatusOr<absl::Duration> ReadSeconds(const Json& value, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(double seconds, ReadNumber(value, path, "a duration in seconds"));
  if (seconds < 0) {
    return PathError(path, absl::StrCat("a duration must be >= 0 seconds, got ", Describe(value)));
  }
  return absl::Seconds(seconds);
}

// Chooses `value` among `names` (a table of this JSON format, not of the
// enums: the spelling on the wire must not change when an enum does).
template <class Enum, size_t N>
absl::StatusOr<Enum> ReadName(const Json& value, const std::string& path,
                              const std::pair<absl::string_view, Enum> (&names)[N]) {
  MALLE_ASSIGN_OR_RETURN(std::string name, ReadString(value, path));
  std::vector<std::string> quoted;
  for (const auto& [candidate, e] : names) {
    if (candidate == name) return e;
    quoted.push_back(absl::StrCat("\"", candidate, "\""));
  }
  return PathError(path, absl::StrCat("expected one of ", absl::StrJoin(quoted, ", "), ", got ",
                                      Describe(value)));
}

constexpr std::pair<absl::string_view, Objective> kObjectiveNames[] = {
    {"throughput", Objective::kThroughput},
    {"speedup", Objective::kSpeedup},
    {"weighted", Objective::kWeighted},
    {"completion", Objective::kCompletion},
};
constexpr std::pair<absl::string_view, ResizeCostModel> kResizeCostNames[] = {
    {"lost_work", ResizeCostModel::kLostWork},
    {"bftrainer", ResizeCostModel::kBftrainer},
};
constexpr std::pair<absl::string_view, SolveIsolation> kIsolationNames[] = {
    {"fork", SolveIsolation::kFork},
    {"in_process", SolveIsolation::kInProcess},
};

template <class Enum, size_t N>
std::string NameOf(const std::pair<absl::string_view, Enum> (&names)[N], Enum e) {
  for (const auto& [name, candidate] : names) {
    if (candidate == e) return std::string(name);
  }
  return "unknown";
}

absl::StatusOr<Curve> ReadCurve(const Json& value, const std::string& path) {
  MALLE_RETURN_IF_ERROR(CheckArray(value, path));
  Curve curve;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string point_path = Element(path, i);
    const Json& point = value[i];
    if (!point.is_array() || point.size() != 2) {
      return PathError(point_path,
                       absl::StrCat("expected a [nodes, samples_per_s] pair, got ",
                                    point.is_array() ? absl::StrCat("an array of ", point.size())
                                                     : Describe(point)));
    }
    Breakpoint bp;
    MALLE_ASSIGN_OR_RETURN(
        bp.nodes, ReadInt(point[0], Element(point_path, 0), "an integer node count", 0, kMaxCount));
    MALLE_ASSIGN_OR_RETURN(
        bp.samples_per_s, ReadNumber(point[1], Element(point_path, 1), "a throughput (samples/s)"));
    if (bp.samples_per_s < 0) {
      return PathError(Element(point_path, 1),
                       absl::StrCat("throughput must be >= 0, got ", Describe(point[1])));
    }
    curve.push_back(bp);
  }
  return curve;
}

absl::StatusOr<NodeClass> ReadClass(const Json& value, const std::string& path) {
  MALLE_RETURN_IF_ERROR(CheckKeys(value, path, {"id", "locality", "speed"}));
  NodeClass node_class;
  const Json* id = Find(value, "id");
  if (id == nullptr) return PathError(Member(path, "id"), "missing (required)");
  MALLE_ASSIGN_OR_RETURN(node_class.id, ReadString(*id, Member(path, "id")));
  if (const Json* locality = Find(value, "locality")) {
    MALLE_ASSIGN_OR_RETURN(node_class.locality, ReadString(*locality, Member(path, "locality")));
  }
  if (const Json* speed = Find(value, "speed")) {
    MALLE_ASSIGN_OR_RETURN(node_class.speed,
                           ReadNumber(*speed, Member(path, "speed"), "a speed factor"));
  }
  return node_class;
}

absl::StatusOr<Node> ReadNode(const Json& value, const std::string& path) {
  MALLE_RETURN_IF_ERROR(CheckKeys(value, path, {"id", "class", "idle_window_s"}));
  Node node;
  const Json* id = Find(value, "id");
  if (id == nullptr) return PathError(Member(path, "id"), "missing (required)");
  MALLE_ASSIGN_OR_RETURN(node.id, ReadString(*id, Member(path, "id")));
  if (const Json* class_id = Find(value, "class")) {
    MALLE_ASSIGN_OR_RETURN(node.class_id, ReadString(*class_id, Member(path, "class")));
  }
  // Absent or null: the backfill forecast does not know (infinite).
  if (const Json* idle = Find(value, "idle_window_s"); idle != nullptr && !idle->is_null()) {
    MALLE_ASSIGN_OR_RETURN(node.expected_idle, ReadSeconds(*idle, Member(path, "idle_window_s")));
  }
  return node;
}

absl::StatusOr<BatchOption> ReadBatchOption(const Json& value, const std::string& path) {
  MALLE_RETURN_IF_ERROR(CheckKeys(value, path, {"name", "throughput"}));
  BatchOption option;
  const Json* name = Find(value, "name");
  if (name == nullptr) return PathError(Member(path, "name"), "missing (required)");
  MALLE_ASSIGN_OR_RETURN(option.name, ReadString(*name, Member(path, "name")));
  const Json* throughput = Find(value, "throughput");
  if (throughput == nullptr) return PathError(Member(path, "throughput"), "missing (required)");
  MALLE_ASSIGN_OR_RETURN(option.throughput, ReadCurve(*throughput, Member(path, "throughput")));
  return option;
}

absl::StatusOr<JobSpec> ReadJob(const Json& value, const std::string& path) {
  MALLE_RETURN_IF_ERROR(CheckKeys(value, path,
                                  {"id", "min_nodes", "max_nodes", "throughput", "batch_options",
                                   "current_batch_option", "resize_up_s", "resize_down_s", "weight",
                                   "stop_penalty", "remaining_samples", "age_s", "nodes"}));
  JobSpec job;
  const Json* id = Find(value, "id");
  if (id == nullptr) return PathError(Member(path, "id"), "missing (required)");
  MALLE_ASSIGN_OR_RETURN(job.id, ReadString(*id, Member(path, "id")));
  if (const Json* v = Find(value, "min_nodes")) {
    MALLE_ASSIGN_OR_RETURN(job.min_nodes, ReadInt(*v, Member(path, "min_nodes"),
                                                  "an integer node count", 0, kMaxCount));
  }
  if (const Json* v = Find(value, "max_nodes")) {
    MALLE_ASSIGN_OR_RETURN(job.max_nodes, ReadInt(*v, Member(path, "max_nodes"),
                                                  "an integer node count", 0, kMaxCount));
  }
  if (const Json* v = Find(value, "throughput")) {
    MALLE_ASSIGN_OR_RETURN(job.throughput, ReadCurve(*v, Member(path, "throughput")));
  }
  if (const Json* v = Find(value, "batch_options")) {
    const std::string options_path = Member(path, "batch_options");
    MALLE_RETURN_IF_ERROR(CheckArray(*v, options_path));
    for (size_t i = 0; i < v->size(); ++i) {
      MALLE_ASSIGN_OR_RETURN(BatchOption option,
                             ReadBatchOption((*v)[i], Element(options_path, i)));
      job.batch_options.push_back(std::move(option));
    }
  }
  if (const Json* v = Find(value, "current_batch_option")) {
    MALLE_ASSIGN_OR_RETURN(job.current_batch_option,
                           ReadInt(*v, Member(path, "current_batch_option"),
                                   "an integer index into batch_options", 0, kMaxCount));
  }
  if (const Json* v = Find(value, "resize_up_s")) {
    MALLE_ASSIGN_OR_RETURN(job.resize_up_pause, ReadSeconds(*v, Member(path, "resize_up_s")));
  }
  if (const Json* v = Find(value, "resize_down_s")) {
    MALLE_ASSIGN_OR_RETURN(job.resize_down_pause, ReadSeconds(*v, Member(path, "resize_down_s")));
  }
  if (const Json* v = Find(value, "weight")) {
    MALLE_ASSIGN_OR_RETURN(job.weight, ReadNumber(*v, Member(path, "weight"), "a weight"));
  }
  if (const Json* v = Find(value, "stop_penalty")) {
    MALLE_ASSIGN_OR_RETURN(job.stop_penalty,
                           ReadNumber(*v, Member(path, "stop_penalty"), "a penalty"));
  }
  if (const Json* v = Find(value, "remaining_samples")) {
    MALLE_ASSIGN_OR_RETURN(job.remaining_samples,
                           ReadNumber(*v, Member(path, "remaining_samples"), "a sample count"));
  }
  if (const Json* v = Find(value, "age_s")) {
    MALLE_ASSIGN_OR_RETURN(job.age, ReadSeconds(*v, Member(path, "age_s")));
  }
  if (const Json* v = Find(value, "nodes")) {
    const std::string nodes_path = Member(path, "nodes");
    MALLE_RETURN_IF_ERROR(CheckArray(*v, nodes_path));
    for (size_t i = 0; i < v->size(); ++i) {
      MALLE_ASSIGN_OR_RETURN(std::string node, ReadString((*v)[i], Element(nodes_path, i)));
      job.current_nodes.push_back(std::move(node));
    }
  }
  return job;
}

// ValidateProblem names fields as the C++ structs do (`nodes[2].expected_idle`,
// `jobs[0] ("a").current_nodes[1]`); a JSON user knows them by their keys.
// Rewrites the field part of the message (before the first ": ").
absl::Status ToJsonNames(const absl::Status& status) {
  if (status.ok()) return status;
  std::string message(status.message());
  const size_t colon = message.find(": ");
  std::string field = message.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : message.substr(colon);
  constexpr std::pair<const char*, const char*> kRenames[] = {
      {".current_nodes", ".nodes"},
      {".expected_idle", ".idle_window_s"},
      {".resize_up_pause", ".resize_up_s"},
      {".resize_down_pause", ".resize_down_s"},
      {".age", ".age_s"},
  };
  for (const auto& [from, to] : kRenames) {
    const size_t at = field.rfind(from);
    if (at != std::string::npos) field.replace(at, std::strlen(from), to);
  }
  if (field == "forward_window") field = "forward_window_s";
  if (field == "rank_aging") field = "rank_aging_s";
  return absl::Status(status.code(), absl::StrCat(field, rest));
}

absl::StatusOr<Problem> ReadProblem(const Json& document) {
  MALLE_RETURN_IF_ERROR(
      CheckKeys(document, "",
                {"version", "forward_window_s", "objective", "resize_cost", "cross_locality_factor",
                 "reclaim_rate", "resize_hysteresis", "rank_weight_exponent", "rank_aging_s",
                 "classes", "nodes", "node_count", "jobs"}));
  const Json* version = Find(document, "version");
  if (version == nullptr) {
    return PathError("version", absl::StrCat("missing (required); expected ", kProblemJsonVersion));
  }
  MALLE_ASSIGN_OR_RETURN(int v, ReadInt(*version, "version", "an integer format version", 0,
                                        std::numeric_limits<int>::max()));
  if (v != kProblemJsonVersion) {
    return PathError("version",
                     absl::StrFormat("unsupported version %d; this build reads version %d", v,
                                     kProblemJsonVersion));
  }

  Problem problem;
  if (const Json* f = Find(document, "forward_window_s")) {
    MALLE_ASSIGN_OR_RETURN(problem.forward_window, ReadSeconds(*f, "forward_window_s"));
  }
  if (const Json* f = Find(document, "objective")) {
    MALLE_ASSIGN_OR_RETURN(problem.objective, ReadName(*f, "objective", kObjectiveNames));
  }
  if (const Json* f = Find(document, "resize_cost")) {
    MALLE_ASSIGN_OR_RETURN(problem.resize_cost, ReadName(*f, "resize_cost", kResizeCostNames));
  }
  if (const Json* f = Find(document, "cross_locality_factor")) {
    MALLE_ASSIGN_OR_RETURN(problem.cross_locality_factor,
                           ReadNumber(*f, "cross_locality_factor", "a throughput factor"));
  }
  if (const Json* f = Find(document, "reclaim_rate")) {
    MALLE_ASSIGN_OR_RETURN(
        problem.reclaim_rate,
        ReadNumber(*f, "reclaim_rate", "a rate (reclaims per idle node-second)"));
  }
  if (const Json* f = Find(document, "resize_hysteresis")) {
    MALLE_ASSIGN_OR_RETURN(problem.resize_hysteresis,
                           ReadNumber(*f, "resize_hysteresis", "a factor (>= 1)"));
  }
  if (const Json* f = Find(document, "rank_weight_exponent")) {
    MALLE_ASSIGN_OR_RETURN(problem.rank_weight_exponent,
                           ReadNumber(*f, "rank_weight_exponent", "an exponent (>= 0)"));
  }
  if (const Json* f = Find(document, "rank_aging_s"); f != nullptr && !f->is_null()) {
    MALLE_ASSIGN_OR_RETURN(problem.rank_aging, ReadSeconds(*f, "rank_aging_s"));
  }
  if (const Json* f = Find(document, "classes")) {
    MALLE_RETURN_IF_ERROR(CheckArray(*f, "classes"));
    for (size_t i = 0; i < f->size(); ++i) {
      MALLE_ASSIGN_OR_RETURN(NodeClass c, ReadClass((*f)[i], Element("classes", i)));
      problem.classes.push_back(std::move(c));
    }
  }
  const Json* nodes = Find(document, "nodes");
  const Json* node_count = Find(document, "node_count");
  if (nodes != nullptr && node_count != nullptr) {
    return PathError("node_count", "give either \"nodes\" or \"node_count\", not both");
  }
  if (nodes != nullptr) {
    MALLE_RETURN_IF_ERROR(CheckArray(*nodes, "nodes"));
    for (size_t i = 0; i < nodes->size(); ++i) {
      MALLE_ASSIGN_OR_RETURN(Node node, ReadNode((*nodes)[i], Element("nodes", i)));
      problem.nodes.push_back(std::move(node));
    }
  }
  if (node_count != nullptr) {
    MALLE_ASSIGN_OR_RETURN(
        int count, ReadInt(*node_count, "node_count", "an integer node count", 0, kMaxCount));
    for (int i = 0; i < count; ++i) problem.nodes.push_back(Node{absl::StrCat("n", i)});
  }
  if (const Json* f = Find(document, "jobs")) {
    MALLE_RETURN_IF_ERROR(CheckArray(*f, "jobs"));
    for (size_t i = 0; i < f->size(); ++i) {
      MALLE_ASSIGN_OR_RETURN(JobSpec job, ReadJob((*f)[i], Element("jobs", i)));
      problem.jobs.push_back(std::move(job));
    }
  }
  if (problem.forward_window == absl::ZeroDuration()) {
    return PathError("forward_window_s", "must be > 0 seconds, got 0");
  }
  MALLE_RETURN_IF_ERROR(ToJsonNames(ValidateProblem(problem)));
  return problem;
}

absl::StatusOr<DecideOptions> ReadDecideOptions(const Json& document) {
  MALLE_RETURN_IF_ERROR(CheckKeys(
      document, "", {"policy", "time_limit_s", "isolation", "relative_gap", "horizon_buckets"}));
  DecideOptions options;
  if (const Json* f = Find(document, "policy")) {
    MALLE_ASSIGN_OR_RETURN(std::string name, ReadString(*f, "policy"));
    // Its error already reads "policy: unknown policy ...; expected one of ...".
    MALLE_ASSIGN_OR_RETURN(options.policy, ParsePolicyName(name));
  }
  if (const Json* f = Find(document, "time_limit_s")) {
    MALLE_ASSIGN_OR_RETURN(absl::Duration limit, ReadSeconds(*f, "time_limit_s"));
    if (limit <= absl::ZeroDuration()) {
      return PathError("time_limit_s", absl::StrCat("must be > 0 seconds, got ", Describe(*f)));
    }
    options.milp.time_limit = limit;
  }
  if (const Json* f = Find(document, "isolation")) {
    MALLE_ASSIGN_OR_RETURN(options.milp.isolation, ReadName(*f, "isolation", kIsolationNames));
  }
  if (const Json* f = Find(document, "relative_gap")) {
    MALLE_ASSIGN_OR_RETURN(options.milp.relative_gap,
                           ReadNumber(*f, "relative_gap", "a relative gap (e.g. 1e-4)"));
    if (options.milp.relative_gap < 0) {
      return PathError("relative_gap", absl::StrCat("must be >= 0, got ", Describe(*f)));
    }
  }
  if (const Json* f = Find(document, "horizon_buckets")) {
    MALLE_ASSIGN_OR_RETURN(options.model.horizon_buckets,
                           ReadInt(*f, "horizon_buckets", "an integer bucket count", 1, kMaxCount));
  }
  return options;
}

// --- writing -------------------------------------------------------------------------------------

OrderedJson CurveToJson(const Curve& curve) {
  OrderedJson points = OrderedJson::array();
  for (const Breakpoint& bp : curve) {
    points.push_back(OrderedJson::array({bp.nodes, bp.samples_per_s}));
  }
  return points;
}

// Seconds; an infinite duration (unknown idle window) is null.
OrderedJson SecondsToJson(absl::Duration d) {
  if (d == absl::InfiniteDuration() || d == -absl::InfiniteDuration()) return nullptr;
  return absl::ToDoubleSeconds(d);
}

std::string Dump(const OrderedJson& value, int indent) {
  // Replace: a node or job id that is not valid UTF-8 must not make dump() throw.
  return value.dump(indent < 0 ? -1 : indent, ' ', false, Json::error_handler_t::replace);
}

absl::string_view ChangeName(int previous, int now) {
  if (previous == now) return "same";
  if (previous == 0) return "start";
  if (now == 0) return "stop";
  return now > previous ? "grow" : "shrink";
}

}  // namespace

absl::StatusOr<Problem> ParseProblemJson(absl::string_view text) {
  MALLE_ASSIGN_OR_RETURN(Json document, ParseStrictJson(text));
  try {
    return ReadProblem(document);
  } catch (const Json::exception& e) {  // every access above is checked; this is a bug
    return absl::InternalError(absl::StrCat("reading the problem JSON: ", e.what()));
  }
}

std::string ProblemToJson(const Problem& problem, int indent) {
  OrderedJson out;
  out["version"] = kProblemJsonVersion;
  out["forward_window_s"] = SecondsToJson(problem.forward_window);
  out["objective"] = NameOf(kObjectiveNames, problem.objective);
  out["resize_cost"] = NameOf(kResizeCostNames, problem.resize_cost);
  out["cross_locality_factor"] = problem.cross_locality_factor;
  // The objective terms, when not at their defaults (no term).
  if (problem.reclaim_rate != 0) out["reclaim_rate"] = problem.reclaim_rate;
  if (problem.resize_hysteresis != 1) out["resize_hysteresis"] = problem.resize_hysteresis;
  if (problem.rank_weight_exponent != 0) {
    out["rank_weight_exponent"] = problem.rank_weight_exponent;
  }
  if (problem.rank_aging != absl::InfiniteDuration()) {
    out["rank_aging_s"] = SecondsToJson(problem.rank_aging);
  }
  OrderedJson classes = OrderedJson::array();
  for (const NodeClass& c : problem.classes) {
    classes.push_back(OrderedJson{{"id", c.id}, {"locality", c.locality}, {"speed", c.speed}});
  }
  out["classes"] = std::move(classes);
  OrderedJson nodes = OrderedJson::array();
  for (const Node& n : problem.nodes) {
    nodes.push_back(OrderedJson{
        {"id", n.id}, {"class", n.class_id}, {"idle_window_s", SecondsToJson(n.expected_idle)}});
  }
  out["nodes"] = std::move(nodes);
  OrderedJson jobs = OrderedJson::array();
  for (const JobSpec& j : problem.jobs) {
    OrderedJson job;
    job["id"] = j.id;
    job["min_nodes"] = j.min_nodes;
    job["max_nodes"] = j.max_nodes;
    job["throughput"] = CurveToJson(j.throughput);
    OrderedJson options = OrderedJson::array();
    for (const BatchOption& o : j.batch_options) {
      options.push_back(OrderedJson{{"name", o.name}, {"throughput", CurveToJson(o.throughput)}});
    }
    job["batch_options"] = std::move(options);
    job["current_batch_option"] = j.current_batch_option;
    job["resize_up_s"] = SecondsToJson(j.resize_up_pause);
    job["resize_down_s"] = SecondsToJson(j.resize_down_pause);
    job["weight"] = j.weight;
    if (j.stop_penalty != 0) job["stop_penalty"] = j.stop_penalty;
    if (j.remaining_samples != 0) job["remaining_samples"] = j.remaining_samples;
    if (j.age != absl::ZeroDuration()) job["age_s"] = SecondsToJson(j.age);
    job["nodes"] = j.current_nodes;
    jobs.push_back(std::move(job));
  }
  out["jobs"] = std::move(jobs);
  return Dump(out, indent);
}

std::string DecisionToJson(const Problem& problem, const Decision& decision, int indent) {
  const PolicyResult& result = decision.result;
  OrderedJson out;
  out["version"] = kProblemJsonVersion;
  out["policy"] = std::string(PolicyName(decision.policy));
  out["reason"] = result.reason;
  out["objective"] = decision.objective;
  out["current_objective"] = decision.current_objective;
  out["optimal"] = result.optimal;
  out["fell_back"] = result.fell_back;
  out["answered_by"] = result.answered_by;
  out["solve_ms"] = absl::ToDoubleMilliseconds(result.solve_time);
  out["solver"] = OrderedJson{{"rows", result.rows},
                              {"columns", result.columns},
                              {"branch_nodes", result.branch_nodes},
                              {"best_bound", result.best_bound}};
  OrderedJson jobs = OrderedJson::array();
  const std::vector<JobAllocation>& allocations = decision.allocation.jobs;
  for (size_t i = 0; i < allocations.size(); ++i) {
    const JobAllocation& a = allocations[i];
    const int count = static_cast<int>(a.nodes.size());
    OrderedJson job;
    job["id"] = a.job_id;
    job["nodes"] = a.nodes;
    job["count"] = count;
    job["previous_count"] = a.previous_nodes;
    job["change"] = std::string(ChangeName(a.previous_nodes, count));
    // Allocation::jobs follows Problem::jobs; the id check guards a caller
    // that pairs a decision with another problem.
    if (i < problem.jobs.size() && problem.jobs[i].id == a.job_id) {
      const std::vector<BatchOption>& options = problem.jobs[i].batch_options;
      if (!options.empty()) {
        job["batch_option"] =
            a.batch_option >= 0 && a.batch_option < static_cast<int>(options.size())
                ? OrderedJson(options[a.batch_option].name)
                : OrderedJson(a.batch_option);
      }
    }
    job["samples_per_s"] = a.samples_per_s;
    job["value"] = a.value;
    jobs.push_back(std::move(job));
  }
  out["jobs"] = std::move(jobs);
  out["idle_nodes"] = decision.allocation.idle_nodes;
  return Dump(out, indent);
}

absl::StatusOr<DecideOptions> ParseDecideOptionsJson(absl::string_view text) {
  // Nothing at all means "all defaults" (the CLI and the binding may pass "").
  if (text.find_first_not_of(" \t\r\n") == absl::string_view::npos) return DecideOptions{};
  MALLE_ASSIGN_OR_RETURN(Json document, ParseStrictJson(text));
  try {
    return ReadDecideOptions(document);
  } catch (const Json::exception& e) {
    return absl::InternalError(absl::StrCat("reading the options JSON: ", e.what()));
  }
}

}  // namespace malle::alloc
