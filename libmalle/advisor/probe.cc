#include "libmalle/advisor/probe.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libmalle/base/status_macros.h"

namespace malle::advisor {

absl::Status ValidateProbeOptions(const ProbeOptions& options) {
  if (!(options.min_relative_uncertainty >= 0) ||
      !std::isfinite(options.min_relative_uncertainty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_relative_uncertainty = ", options.min_relative_uncertainty,
                     " must be finite and >= 0"));
  }
  if (options.min_steps_between < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_steps_between = ", options.min_steps_between, " must be >= 0"));
  }
  if (options.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("steps = ", options.steps, " must be >= 1"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProbeDecision> ProposeProbe(const ScalingFit& fit, const ProbeContext& context,
                                           const ProbeOptions& options) {
  if (absl::Status s = ValidateProbeOptions(options); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("options.", s.message()));
  }
  MALLE_ASSIGN_OR_RETURN(std::vector<Prediction> curve,
                         PredictCurve(fit, context.shape, context.min_nodes, context.max_nodes,
                                      context.allowed_sizes));
  ProbeDecision decision;
  if (context.last_probe_step.has_value() &&
      context.step - *context.last_probe_step < options.min_steps_between) {
    decision.reason = absl::StrCat("last probe proposed at step ", *context.last_probe_step,
                                   "; the next is allowed at step ",
                                   *context.last_probe_step + options.min_steps_between);
    return decision;
  }
  // Nearest to the current size first, so that the first maximum wins ties.
  std::stable_sort(curve.begin(), curve.end(), [&](const Prediction& a, const Prediction& b) {
    return std::abs(a.nodes - context.current_nodes) < std::abs(b.nodes - context.current_nodes);
  });
  const Prediction* best = nullptr;
  for (const Prediction& p : curve) {
    if (p.nodes == context.current_nodes) continue;
    if (best == nullptr || p.RelativeUncertainty() > best->RelativeUncertainty()) best = &p;
  }
  if (best == nullptr) {
    decision.reason = "no size other than the current one is allowed";
    return decision;
  }
  const double u = best->RelativeUncertainty();
  if (u < options.min_relative_uncertainty) {
    decision.reason = absl::StrFormat(
        "the widest band (%d nodes) is %.1f%% of its estimate, below the %.1f%% threshold",
        best->nodes, 100 * u, 100 * options.min_relative_uncertainty);
    return decision;
  }
  ProbeRequest request;
  request.nodes = best->nodes;
  request.steps = options.steps;
  request.reason = absl::StrFormat(
      "throughput at %d nodes is %.0f samples/s in [%.0f, %.0f] (band %.0f%% of the estimate, "
      "the widest; threshold %.0f%%)",
      best->nodes, best->samples_per_s, best->lo, best->hi, 100 * u,
      100 * options.min_relative_uncertainty);
  decision.reason = request.reason;
  decision.request = std::move(request);
  return decision;
}

}  // namespace malle::advisor
