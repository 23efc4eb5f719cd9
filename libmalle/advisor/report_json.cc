// JSON form and table of an AdvisorReport (report_json.h).
//
// nlohmann::json is used in this file only. Reading walks the document with
// an explicit path so that every error names where it happened; semantic
// checks (ascending nodes, lo <= estimate <= hi) are ValidateReport's, which
// names fields the same way.
#include "libmalle/advisor/report_json.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "libmalle/advisor/step_sample.h"
#include "libmalle/base/json_path.h"
#include "libmalle/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace malle::advisor {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;  // output keeps the documented key order

constexpr int64_t kMaxStep = std::numeric_limits<int64_t>::max() / 2;

using json_path::Describe;
using json_path::Element;
using json_path::Member;
using json_path::ParseStrictJson;
using json_path::PathError;
using json_path::ReadBool;
using json_path::ReadString;

// Checks that `value` is an object with exactly the keys `keys` (all required).
absl::Status CheckObject(const Json& value, const std::string& path,
                         std::initializer_list<absl::string_view> keys) {
  MALLE_RETURN_IF_ERROR(json_path::CheckKeys(value, path, keys));
  for (absl::string_view key : keys) {
    if (!value.contains(std::string(key)))
      return PathError(Member(path, key), "missing (required)");
  }
  return absl::OkStatus();
}

const Json& At(const Json& object, absl::string_view key) { return object.at(std::string(key)); }

// A finite number >= lo.
absl::StatusOr<double> ReadNumber(const Json& value, const std::string& path, double lo) {
  if (!value.is_number()) {
    return PathError(path, absl::StrCat("expected a number, got ", Describe(value)));
  }
  const double number = value.get<double>();
  if (!std::isfinite(number)) return PathError(path, "expected a finite number");
  if (number < lo) {
    return PathError(path, absl::StrCat("must be >= ", lo, ", got ", Describe(value)));
  }
  return number;
}

// null or a finite number >= lo.
absl::StatusOr<std::optional<double>> ReadOptionalNumber(const Json& value, const std::string& path,
                                                         double lo) {
  if (value.is_null()) return std::optional<double>();
  if (!value.is_number()) {
    return PathError(path, absl::StrCat("expected a number or null, got ", Describe(value)));
  }
  MALLE_ASSIGN_OR_RETURN(double number, ReadNumber(value, path, lo));
  return std::optional<double>(number);
}

// An integer in [lo, hi]; an integral float (2.0) is accepted, 2.5 is not.
absl::StatusOr<int64_t> ReadInt(const Json& value, const std::string& path, int64_t lo,
                                int64_t hi) {
  const std::string range = absl::StrCat("an integer in [", lo, ", ", hi, "]");
  int64_t number = 0;
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) {
      return PathError(path, absl::StrCat("expected ", range, ", got ", Describe(value)));
    }
    number = static_cast<int64_t>(u);
  } else if (value.is_number_integer()) {
    number = value.get<int64_t>();
  } else if (value.is_number_float()) {
    const double d = value.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15) {
      return PathError(path, absl::StrCat("expected ", range, ", got ", Describe(value)));
    }
    number = static_cast<int64_t>(d);
  } else {
    return PathError(path, absl::StrCat("expected ", range, ", got ", Describe(value)));
  }
  if (number < lo || number > hi) {
    return PathError(path, absl::StrCat("expected ", range, ", got ", Describe(value)));
  }
  return number;
}

absl::StatusOr<CurvePoint> ReadCurvePoint(const Json& value, const std::string& path) {
  MALLE_RETURN_IF_ERROR(
      CheckObject(value, path, {"nodes", "samples_per_s", "lo", "hi", "efficiency"}));
  CurvePoint p;
  MALLE_ASSIGN_OR_RETURN(p.nodes,
                         ReadInt(At(value, "nodes"), Member(path, "nodes"), 1, kMaxWorldSize));
  MALLE_ASSIGN_OR_RETURN(p.samples_per_s,
                         ReadNumber(At(value, "samples_per_s"), Member(path, "samples_per_s"), 0));
  MALLE_ASSIGN_OR_RETURN(p.lo, ReadNumber(At(value, "lo"), Member(path, "lo"), 0));
  MALLE_ASSIGN_OR_RETURN(p.hi, ReadNumber(At(value, "hi"), Member(path, "hi"), 0));
  MALLE_ASSIGN_OR_RETURN(p.efficiency,
                         ReadNumber(At(value, "efficiency"), Member(path, "efficiency"), 0));
  return p;
}

constexpr absl::string_view kModelKeys[] = {"fitted",
                                            "compute_fixed_s",
                                            "compute_per_sample_s",
                                            "network_fixed_s",
                                            "network_per_node_s",
                                            "gamma",
                                            "gamma_lo",
                                            "gamma_hi",
                                            "other_s",
                                            "compute_identified",
                                            "network_identified",
                                            "gamma_identified",
                                            "rms_relative_error",
                                            "configurations",
                                            "steps_observed",
                                            "steps_used",
                                            "current_nodes",
                                            "efficiency_reference_nodes",
                                            "global_batch",
                                            "logical_workers"};

absl::StatusOr<ModelSummary> ReadModel(const Json& value, const std::string& path) {
  MALLE_RETURN_IF_ERROR(CheckObject(
      value, path,
      {kModelKeys[0],  kModelKeys[1],  kModelKeys[2],  kModelKeys[3],  kModelKeys[4],
       kModelKeys[5],  kModelKeys[6],  kModelKeys[7],  kModelKeys[8],  kModelKeys[9],
       kModelKeys[10], kModelKeys[11], kModelKeys[12], kModelKeys[13], kModelKeys[14],
       kModelKeys[15], kModelKeys[16], kModelKeys[17], kModelKeys[18], kModelKeys[19]}));
  ModelSummary m;
  auto number = [&](absl::string_view key, double lo, double* out) -> absl::Status {
    MALLE_ASSIGN_OR_RETURN(*out, ReadNumber(At(value, key), Member(path, key), lo));
    return absl::OkStatus();
  };
  auto boolean = [&](absl::string_view key, bool* out) -> absl::Status {
    MALLE_ASSIGN_OR_RETURN(*out, ReadBool(At(value, key), Member(path, key)));
    return absl::OkStatus();
  };
  auto integer = [&](absl::string_view key, int64_t lo, int64_t hi, auto* out) -> absl::Status {
    MALLE_ASSIGN_OR_RETURN(int64_t v, ReadInt(At(value, key), Member(path, key), lo, hi));
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(v);
    return absl::OkStatus();
  };
  MALLE_RETURN_IF_ERROR(boolean("fitted", &m.fitted));
  MALLE_RETURN_IF_ERROR(number("compute_fixed_s", 0, &m.compute_fixed_s));
  MALLE_RETURN_IF_ERROR(number("compute_per_sample_s", 0, &m.compute_per_sample_s));
  MALLE_RETURN_IF_ERROR(number("network_fixed_s", 0, &m.network_fixed_s));
  MALLE_RETURN_IF_ERROR(number("network_per_node_s", 0, &m.network_per_node_s));
  MALLE_RETURN_IF_ERROR(number("gamma", 1, &m.gamma));
  MALLE_RETURN_IF_ERROR(number("gamma_lo", 1, &m.gamma_lo));
  MALLE_RETURN_IF_ERROR(number("gamma_hi", 1, &m.gamma_hi));
  MALLE_RETURN_IF_ERROR(number("other_s", 0, &m.other_s));
  MALLE_RETURN_IF_ERROR(boolean("compute_identified", &m.compute_identified));
  MALLE_RETURN_IF_ERROR(boolean("network_identified", &m.network_identified));
  MALLE_RETURN_IF_ERROR(boolean("gamma_identified", &m.gamma_identified));
  MALLE_RETURN_IF_ERROR(number("rms_relative_error", 0, &m.rms_relative_error));
  MALLE_RETURN_IF_ERROR(integer("configurations", 0, kMaxWorldSize, &m.configurations));
  MALLE_RETURN_IF_ERROR(integer("steps_observed", 0, kMaxStep, &m.steps_observed));
  MALLE_RETURN_IF_ERROR(integer("steps_used", 0, kMaxStep, &m.steps_used));
  MALLE_RETURN_IF_ERROR(integer("current_nodes", 0, kMaxWorldSize, &m.current_nodes));
  MALLE_RETURN_IF_ERROR(
      integer("efficiency_reference_nodes", 0, kMaxWorldSize, &m.efficiency_reference_nodes));
  MALLE_RETURN_IF_ERROR(integer("global_batch", 0, kMaxBatch, &m.global_batch));
  MALLE_RETURN_IF_ERROR(integer("logical_workers", 0, kMaxWorldSize, &m.logical_workers));
  return m;
}

// --- writing -------------------------------------------------------------------------------------

OrderedJson Optional(const std::optional<double>& v) {
  return v ? OrderedJson(*v) : OrderedJson(nullptr);
}

}  // namespace

std::string ReportToJson(const AdvisorReport& r, int indent) {
  OrderedJson j;
  j["version"] = kReportJsonVersion;
  j["job"] = r.job;
  j["step"] = r.step;
  j["sizes_observed"] = r.sizes_observed;
  OrderedJson curve = OrderedJson::array();
  for (const CurvePoint& p : r.curve) {
    OrderedJson point;
    point["nodes"] = p.nodes;
    point["samples_per_s"] = p.samples_per_s;
    point["lo"] = p.lo;
    point["hi"] = p.hi;
    point["efficiency"] = p.efficiency;
    curve.push_back(std::move(point));
  }
  j["curve"] = std::move(curve);
  j["resize_cost_s"] = {{"grow", Optional(r.resize_cost_s.grow)},
                        {"shrink", Optional(r.resize_cost_s.shrink)},
                        {"failure", Optional(r.resize_cost_s.failure)}};
  j["marginal_gain"] = {{"up", Optional(r.marginal_gain.up)},
                        {"down", Optional(r.marginal_gain.down)}};
  if (r.probe) {
    j["probe"] = {
        {"nodes", r.probe->nodes}, {"steps", r.probe->steps}, {"reason", r.probe->reason}};
  } else {
    j["probe"] = nullptr;
  }
  const ModelSummary& m = r.model;
  OrderedJson model;
  model["fitted"] = m.fitted;
  model["compute_fixed_s"] = m.compute_fixed_s;
  model["compute_per_sample_s"] = m.compute_per_sample_s;
  model["network_fixed_s"] = m.network_fixed_s;
  model["network_per_node_s"] = m.network_per_node_s;
  model["gamma"] = m.gamma;
  model["gamma_lo"] = m.gamma_lo;
  model["gamma_hi"] = m.gamma_hi;
  model["other_s"] = m.other_s;
  model["compute_identified"] = m.compute_identified;
  model["network_identified"] = m.network_identified;
  model["gamma_identified"] = m.gamma_identified;
  model["rms_relative_error"] = m.rms_relative_error;
  model["configurations"] = m.configurations;
  model["steps_observed"] = m.steps_observed;
  model["steps_used"] = m.steps_used;
  model["current_nodes"] = m.current_nodes;
  model["efficiency_reference_nodes"] = m.efficiency_reference_nodes;
  model["global_batch"] = m.global_batch;
  model["logical_workers"] = m.logical_workers;
  j["model"] = std::move(model);
  // Replace invalid UTF-8 in the job id or reason instead of throwing.
  return j.dump(indent, ' ', false, OrderedJson::error_handler_t::replace);
}

absl::StatusOr<AdvisorReport> ParseReportJson(absl::string_view text) {
  MALLE_ASSIGN_OR_RETURN(Json doc, ParseStrictJson(text));
  const std::string top;
  MALLE_RETURN_IF_ERROR(CheckObject(doc, top,
                                    {"version", "job", "step", "sizes_observed", "curve",
                                     "resize_cost_s", "marginal_gain", "probe", "model"}));
  MALLE_ASSIGN_OR_RETURN(int64_t version, ReadInt(At(doc, "version"), "version", 0, 1'000'000));
  if (version != kReportJsonVersion) {
    return PathError("version", absl::StrCat("unsupported version ", version, "; expected ",
                                             kReportJsonVersion));
  }
  AdvisorReport r;
  MALLE_ASSIGN_OR_RETURN(r.job, ReadString(At(doc, "job"), "job"));
  MALLE_ASSIGN_OR_RETURN(r.step, ReadInt(At(doc, "step"), "step", 0, kMaxStep));

  const Json& sizes = At(doc, "sizes_observed");
  if (!sizes.is_array()) {
    return PathError("sizes_observed", absl::StrCat("expected an array, got ", Describe(sizes)));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    MALLE_ASSIGN_OR_RETURN(int64_t n,
                           ReadInt(sizes[i], Element("sizes_observed", i), 1, kMaxWorldSize));
    r.sizes_observed.push_back(static_cast<int>(n));
  }

  const Json& curve = At(doc, "curve");
  if (!curve.is_array()) {
    return PathError("curve", absl::StrCat("expected an array, got ", Describe(curve)));
  }
  for (size_t i = 0; i < curve.size(); ++i) {
    MALLE_ASSIGN_OR_RETURN(CurvePoint p, ReadCurvePoint(curve[i], Element("curve", i)));
    r.curve.push_back(p);
  }

  const Json& costs = At(doc, "resize_cost_s");
  MALLE_RETURN_IF_ERROR(CheckObject(costs, "resize_cost_s", {"grow", "shrink", "failure"}));
  MALLE_ASSIGN_OR_RETURN(r.resize_cost_s.grow,
                         ReadOptionalNumber(At(costs, "grow"), "resize_cost_s.grow", 0));
  MALLE_ASSIGN_OR_RETURN(r.resize_cost_s.shrink,
                         ReadOptionalNumber(At(costs, "shrink"), "resize_cost_s.shrink", 0));
  MALLE_ASSIGN_OR_RETURN(r.resize_cost_s.failure,
                         ReadOptionalNumber(At(costs, "failure"), "resize_cost_s.failure", 0));

  const Json& gain = At(doc, "marginal_gain");
  MALLE_RETURN_IF_ERROR(CheckObject(gain, "marginal_gain", {"up", "down"}));
  constexpr double kAnyNumber = -std::numeric_limits<double>::max();
  MALLE_ASSIGN_OR_RETURN(r.marginal_gain.up,
                         ReadOptionalNumber(At(gain, "up"), "marginal_gain.up", kAnyNumber));
  MALLE_ASSIGN_OR_RETURN(r.marginal_gain.down,
                         ReadOptionalNumber(At(gain, "down"), "marginal_gain.down", kAnyNumber));

  const Json& probe = At(doc, "probe");
  if (!probe.is_null()) {
    if (!probe.is_object()) {
      return PathError("probe", absl::StrCat("expected null or an object, got ", Describe(probe)));
    }
    MALLE_RETURN_IF_ERROR(CheckObject(probe, "probe", {"nodes", "steps", "reason"}));
    ProbeRequest request;
    MALLE_ASSIGN_OR_RETURN(int64_t nodes,
                           ReadInt(At(probe, "nodes"), "probe.nodes", 1, kMaxWorldSize));
    request.nodes = static_cast<int>(nodes);
    MALLE_ASSIGN_OR_RETURN(request.steps, ReadInt(At(probe, "steps"), "probe.steps", 1, kMaxStep));
    MALLE_ASSIGN_OR_RETURN(request.reason, ReadString(At(probe, "reason"), "probe.reason"));
    r.probe = std::move(request);
  }

  MALLE_ASSIGN_OR_RETURN(r.model, ReadModel(At(doc, "model"), "model"));
  MALLE_RETURN_IF_ERROR(ValidateReport(r));
  return r;
}

std::string FormatReportTable(const AdvisorReport& r) {
  std::string out =
      absl::StrFormat("Scalability of job \"%s\" at step %d (%d steps recorded, %d used)\n", r.job,
                      r.step, r.model.steps_observed, r.model.steps_used);
  if (!r.model.fitted) {
    absl::StrAppend(&out, "  no model yet: too few steady-state steps\n");
  } else {
    absl::StrAppendFormat(&out, "%5s %11s   %-21s %10s\n", "nodes", "samples/s", "95% band",
                          "efficiency");
    for (const CurvePoint& p : r.curve) {
      std::vector<std::string> notes;
      if (std::binary_search(r.sizes_observed.begin(), r.sizes_observed.end(), p.nodes)) {
        notes.push_back("observed");
      }
      if (p.nodes == r.model.current_nodes) notes.push_back("current");
      if (r.probe && p.nodes == r.probe->nodes) notes.push_back("probe");
      absl::StrAppendFormat(&out, "%5d %11.1f   [%9.1f, %9.1f] %10.2f  %s\n", p.nodes,
                            p.samples_per_s, p.lo, p.hi, p.efficiency, absl::StrJoin(notes, ", "));
    }
  }
  auto seconds = [](const std::optional<double>& v) {
    return v ? absl::StrFormat("%.2f s", *v) : std::string("n/a");
  };
  absl::StrAppendFormat(&out, "resize pause (median): grow %s, shrink %s, failure %s\n",
                        seconds(r.resize_cost_s.grow), seconds(r.resize_cost_s.shrink),
                        seconds(r.resize_cost_s.failure));
  if (r.marginal_gain.up || r.marginal_gain.down) {
    auto gain = [](const std::optional<double>& v) {
      return v ? absl::StrFormat("%.1f samples/s", *v) : std::string("n/a");
    };
    absl::StrAppendFormat(&out, "at %d nodes: one more node gains %s, one fewer loses %s\n",
                          r.model.current_nodes, gain(r.marginal_gain.up),
                          gain(r.marginal_gain.down));
  }
  if (r.model.fitted) {
    const ModelSummary& m = r.model;
    absl::StrAppendFormat(
        &out,
        "model: compute %.4g s + %.4g s/sample%s; network %.4g s + %.4g s/node%s; "
        "gamma %.2f [%.2f, %.2f]%s; other %.4g s; rms error %.1f%%\n",
        m.compute_fixed_s, m.compute_per_sample_s, m.compute_identified ? "" : " (prior)",
        m.network_fixed_s, m.network_per_node_s, m.network_identified ? "" : " (prior)", m.gamma,
        m.gamma_lo, m.gamma_hi, m.gamma_identified ? "" : " (prior)", m.other_s,
        100 * m.rms_relative_error);
  }
  if (r.probe) {
    absl::StrAppendFormat(&out, "probe: %d nodes for %d steps: %s\n", r.probe->nodes,
                          r.probe->steps, r.probe->reason);
  }
  return out;
}

}  // namespace malle::advisor
