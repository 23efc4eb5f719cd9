// AdvisorReport: what the Job Profiling Advisor knows about a job's scaling,
// as plain data (the Advisor makes it; report_json.h carries it to the
// allocator).
//
//   AdvisorReport r = advisor->Report();
//   for (const CurvePoint& p : r.curve) Use(p.nodes, p.samples_per_s, p.lo, p.hi);
//   if (r.probe) Ask(r.probe->nodes, r.probe->steps);
//   MALLE_RETURN_IF_ERROR(ValidateReport(r));
//
// Thread-safety: plain structs; ValidateReport is pure and thread-safe.
#ifndef MALLE_ADVISOR_REPORT_H_
#define MALLE_ADVISOR_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "libmalle/advisor/probe.h"

namespace malle::advisor {

// One point of the predicted scalability curve.
struct CurvePoint {
  int nodes = 0;
  double samples_per_s = 0;  // point estimate
  double lo = 0;             // about 95% band (scaling_model.h says how)
  double hi = 0;
  // Per-node throughput relative to the smallest observed size:
  // (X(n) / n) / (X(r) / r), r = ModelSummary::efficiency_reference_nodes,
  // both from the model. The smallest observed size is the reference because
  // its throughput is measured, not extrapolated; sizes below it may exceed 1.
  double efficiency = 0;
};

// Median resize pause per direction in seconds; nullopt: never measured.
struct ResizeCosts {
  std::optional<double> grow;
  std::optional<double> shrink;
  std::optional<double> failure;
};

// At the current size n: up = X(n + 1) - X(n) (samples/s gained by one more
// node), down = X(n) - X(n - 1) (samples/s lost by one node fewer), from the
// point estimates; nullopt outside [min_nodes, max_nodes] or without a model.
struct MarginalGain {
  std::optional<double> up;
  std::optional<double> down;
};

// The fitted model (scaling_model.h) and how much data it rests on.
struct ModelSummary {
  bool fitted = false;              // false: not enough steady-state steps yet; the curve is empty
  double compute_fixed_s = 0;       // a
  double compute_per_sample_s = 0;  // b
  double network_fixed_s = 0;       // c
  double network_per_node_s = 0;    // d
  double gamma = 1;
  double gamma_lo = 1;  // plausible range of gamma
  double gamma_hi = 1;
  double other_s = 0;  // e
  bool compute_identified = false;
  bool network_identified = false;
  bool gamma_identified = false;
  double rms_relative_error = 0;       // fitted vs measured step time over configurations
  int configurations = 0;              // aggregated configurations in the fit
  int64_t steps_observed = 0;          // samples recorded
  int64_t steps_used = 0;              // steady-state samples in the fit
  int current_nodes = 0;               // 0: unknown
  int efficiency_reference_nodes = 0;  // 0: no model
  int64_t global_batch = 0;            // the shape the curve is for; 0: unknown
  int logical_workers = 0;
};

struct AdvisorReport {
  std::string job;                  // may be empty
  int64_t step = 0;                 // last recorded step
  std::vector<int> sizes_observed;  // ascending, distinct, each >= 1
  std::vector<CurvePoint> curve;    // ascending nodes
  ResizeCosts resize_cost_s;
  MarginalGain marginal_gain;
  std::optional<ProbeRequest> probe;
  ModelSummary model;
};

// Checks every field; InvalidArgument names it the way the JSON does, e.g.
// `curve[2].lo = 510 must be <= samples_per_s = 500`.
absl::Status ValidateReport(const AdvisorReport& report);

}  // namespace malle::advisor

#endif  // MALLE_ADVISOR_REPORT_H_
