#include "libmalle/advisor/report.h"

#include <cmath>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "libmalle/advisor/step_sample.h"
#include "libmalle/base/status_macros.h"

namespace malle::advisor {
namespace {

// Band bounds may differ from the point estimate by rounding when a report
// was written by another producer; this much is tolerated.
constexpr double kBandSlack = 1e-9;

absl::Status NonNegative(absl::string_view field, double value) {
  if (!std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, " must be finite and >= 0"));
  }
  return absl::OkStatus();
}

absl::Status Finite(absl::string_view field, double value) {
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, " must be finite"));
  }
  return absl::OkStatus();
}

absl::Status Nodes(absl::string_view field, int64_t value, int64_t lo) {
  if (value < lo || value > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, " must be in [", lo, ", ", kMaxWorldSize, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateReport(const AdvisorReport& r) {
  if (r.step < 0)
    return absl::InvalidArgumentError(absl::StrCat("step = ", r.step, " must be >= 0"));
  for (size_t i = 0; i < r.sizes_observed.size(); ++i) {
    const std::string field = absl::StrCat("sizes_observed[", i, "]");
    MALLE_RETURN_IF_ERROR(Nodes(field, r.sizes_observed[i], 1));
    if (i > 0 && r.sizes_observed[i] <= r.sizes_observed[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(field, " = ", r.sizes_observed[i],
                                                     " must be > the previous size ",
                                                     r.sizes_observed[i - 1]));
    }
  }
  for (size_t i = 0; i < r.curve.size(); ++i) {
    const CurvePoint& p = r.curve[i];
    const std::string path = absl::StrCat("curve[", i, "].");
    MALLE_RETURN_IF_ERROR(Nodes(path + "nodes", p.nodes, 1));
    if (i > 0 && p.nodes <= r.curve[i - 1].nodes) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, "nodes = ", p.nodes, " must be > the previous point's ", r.curve[i - 1].nodes));
    }
    MALLE_RETURN_IF_ERROR(NonNegative(path + "samples_per_s", p.samples_per_s));
    MALLE_RETURN_IF_ERROR(NonNegative(path + "lo", p.lo));
    MALLE_RETURN_IF_ERROR(NonNegative(path + "hi", p.hi));
    MALLE_RETURN_IF_ERROR(NonNegative(path + "efficiency", p.efficiency));
    const double slack = kBandSlack * std::max(1.0, p.samples_per_s);
    if (p.lo > p.samples_per_s + slack) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, "lo = ", p.lo, " must be <= samples_per_s = ", p.samples_per_s));
    }
    if (p.hi < p.samples_per_s - slack) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, "hi = ", p.hi, " must be >= samples_per_s = ", p.samples_per_s));
    }
  }
  const struct {
    absl::string_view name;
    const std::optional<double>& value;
  } costs[] = {{"grow", r.resize_cost_s.grow},
               {"shrink", r.resize_cost_s.shrink},
               {"failure", r.resize_cost_s.failure}};
  for (const auto& c : costs) {
    if (c.value)
      MALLE_RETURN_IF_ERROR(NonNegative(absl::StrCat("resize_cost_s.", c.name), *c.value));
  }
  if (r.marginal_gain.up) MALLE_RETURN_IF_ERROR(Finite("marginal_gain.up", *r.marginal_gain.up));
  if (r.marginal_gain.down) {
    MALLE_RETURN_IF_ERROR(Finite("marginal_gain.down", *r.marginal_gain.down));
  }
  if (r.probe) {
    MALLE_RETURN_IF_ERROR(Nodes("probe.nodes", r.probe->nodes, 1));
    if (r.probe->steps < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("probe.steps = ", r.probe->steps, " must be >= 1"));
    }
  }
  const ModelSummary& m = r.model;
  const struct {
    absl::string_view name;
    double value;
  } params[] = {{"compute_fixed_s", m.compute_fixed_s},
                {"compute_per_sample_s", m.compute_per_sample_s},
                {"network_fixed_s", m.network_fixed_s},
                {"network_per_node_s", m.network_per_node_s},
                {"other_s", m.other_s},
                {"rms_relative_error", m.rms_relative_error}};
  for (const auto& p : params) {
    MALLE_RETURN_IF_ERROR(NonNegative(absl::StrCat("model.", p.name), p.value));
  }
  if (!(m.gamma_lo >= 1 && m.gamma_lo <= m.gamma && m.gamma <= m.gamma_hi && m.gamma_hi <= 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.gamma = ", m.gamma, " with gamma_lo = ", m.gamma_lo, ", gamma_hi = ", m.gamma_hi,
        " must satisfy 1 <= gamma_lo <= gamma <= gamma_hi <= 10"));
  }
  if (m.configurations < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.configurations = ", m.configurations, " must be >= 0"));
  }
  if (m.steps_observed < 0 || m.steps_used < 0 || m.steps_used > m.steps_observed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.steps_used = ", m.steps_used, " must be in [0, steps_observed = ", m.steps_observed,
        "] (and steps_observed >= 0)"));
  }
  MALLE_RETURN_IF_ERROR(Nodes("model.current_nodes", m.current_nodes, 0));
  MALLE_RETURN_IF_ERROR(Nodes("model.efficiency_reference_nodes", m.efficiency_reference_nodes, 0));
  if (m.global_batch < 0 || m.global_batch > kMaxBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.global_batch = ", m.global_batch, " must be in [0, ", kMaxBatch, "]"));
  }
  MALLE_RETURN_IF_ERROR(Nodes("model.logical_workers", m.logical_workers, 0));
  if (!m.fitted && !r.curve.empty()) {
    return absl::InvalidArgumentError("curve must be empty when model.fitted is false");
  }
  return absl::OkStatus();
}

}  // namespace malle::advisor
