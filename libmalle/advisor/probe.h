// ProposeProbe: whether the job should briefly run at another size to learn
// its scaling curve there.
//
// The advisor learns only at sizes the job actually runs. A probe asks the
// allocator to run the job for `steps` steps at the size where the model's
// throughput band is widest relative to its point estimate, which is where
// one more measured size improves the curve most (the band narrows around
// every observed size). A probe is proposed only when that relative width is
// at least `min_relative_uncertainty` (a narrower band would not change an
// allocation decision) and at most once every `min_steps_between` steps (each
// probe costs two resizes). The request is advice: an allocator may ignore
// it, and nothing in the advisor waits for it.
//
//   ProbeContext ctx{shape, /*min_nodes=*/1, /*max_nodes=*/16, {}, /*current_nodes=*/4,
//                    /*step=*/1200, /*last_probe_step=*/std::nullopt};
//   MALLE_ASSIGN_OR_RETURN(ProbeDecision d, ProposeProbe(fit, ctx, {}));
//   if (d.request) Send(d.request->nodes, d.request->steps);
//   else Log(d.reason);
//
// Thread-safety: pure; thread-safe.
#ifndef MALLE_ADVISOR_PROBE_H_
#define MALLE_ADVISOR_PROBE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libmalle/advisor/scaling_model.h"

namespace malle::advisor {

struct ProbeOptions {
  // Propose only when (hi - lo) / samples_per_s at the chosen size is at least this.
  double min_relative_uncertainty = 0.25;
  // At most one probe per this many training steps (>= 0).
  int64_t min_steps_between = 500;
  // Steps to run at the probe size (>= 1). Should cover the steps skipped
  // after a resize plus the samples a configuration needs to enter the fit
  // (AdvisorOptions::skip_steps_after_resize + min_samples_per_config).
  int64_t steps = 30;
};

// What the decision depends on besides the fit: the job's range and where it is now.
struct ProbeContext {
  JobShape shape;
  int min_nodes = 1;
  int max_nodes = 1;
  std::vector<int> allowed_sizes;  // empty: every size in [min_nodes, max_nodes]
  int current_nodes = 0;           // never proposed (the job already runs there); 0: unknown
  int64_t step = 0;                // now
  std::optional<int64_t> last_probe_step;  // when the last probe was proposed
};

struct ProbeRequest {
  int nodes = 0;
  int64_t steps = 0;
  std::string reason;
};

struct ProbeDecision {
  std::optional<ProbeRequest> request;  // nullopt: no probe now
  std::string reason;                   // why (also when there is no request)
};

// OK or InvalidArgument naming the bad option (`steps = 0 must be >= 1`).
absl::Status ValidateProbeOptions(const ProbeOptions& options);

// Chooses the candidate size (allowed, in range, not current) with the
// largest relative uncertainty; among equal ones the nearest to the current
// size (cheapest to reach), then the smallest. InvalidArgument on a bad
// context or options. Pure; never blocks.
absl::StatusOr<ProbeDecision> ProposeProbe(const ScalingFit& fit, const ProbeContext& context,
                                           const ProbeOptions& options = {});

}  // namespace malle::advisor

#endif  // MALLE_ADVISOR_PROBE_H_
