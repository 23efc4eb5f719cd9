// Advisor: the Job Profiling Advisor. Every elastic job runs one in-process;
// it turns the steps the job trains into a scalability curve with honest
// uncertainty, resize costs and probe requests, so users never supply
// scalability curves.
//
// Record() takes one StepSample per step. Steps during warm-up, and the first
// `skip_steps_after_resize` steps after the start and after every resize, are
// not steady state and are skipped (their resize pause is kept). The others go
// into a bounded window per configuration (world size, local batch, global
// batch, logical workers): memory and refit cost do not grow with the number
// of steps. Report() aggregates each window by a robust mean (each phase
// averaged over the steps whose wall time is within 3 MADs of the median: a
// 5x slow step is dropped whole, clean noise averages), fits the model
// (scaling_model.h), predicts the curve over [min_nodes, max_nodes] and
// proposes a probe (probe.h).
//
//   AdvisorOptions options;
//   options.job_id = "resnet";
//   options.min_nodes = 1;
//   options.max_nodes = 16;
//   MALLE_ASSIGN_OR_RETURN(std::unique_ptr<Advisor> advisor, Advisor::Create(options));
//   for (...) MALLE_RETURN_IF_ERROR(advisor->Record(sample));  // each step
//   AdvisorReport report = advisor->Report();                  // e.g. every 100 steps
//
// Thread-safety: thread-safe. Record() holds an internal mutex for O(1)
// amortized work and never waits for a fit: Report() copies the windows under
// the mutex (O(configurations * window)) and fits outside it.
#ifndef MALLE_ADVISOR_ADVISOR_H_
#define MALLE_ADVISOR_ADVISOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libmalle/advisor/probe.h"
#include "libmalle/advisor/report.h"
#include "libmalle/advisor/resize_cost.h"
#include "libmalle/advisor/scaling_model.h"
#include "libmalle/advisor/step_sample.h"

namespace malle::advisor {

struct AdvisorOptions {
  std::string job_id;  // copied into reports; may be empty
  // The range the curve covers (and probes stay in): 1 <= min <= max <= kMaxWorldSize.
  int min_nodes = 1;
  int max_nodes = 1;
  // Sizes the job can run at (e.g. divisors of the logical workers); empty:
  // every size in the range. Each must lie in the range.
  std::vector<int> allowed_sizes;
  // Steps skipped after the start and after each resize (K), >= 0.
  int skip_steps_after_resize = 3;
  // Steady-state steps kept per configuration (the aggregation window), >= 1.
  int window = 64;
  // Steps a configuration needs before it enters the fit, in [1, window].
  int min_samples_per_config = 10;
  // Configurations kept; the least recently updated one is dropped beyond this. >= 1.
  int max_configurations = 32;
  // Resize pauses kept per direction (ResizeCostTracker's window), >= 1.
  int resize_window = 64;
  FitOptions fit;
  ProbeOptions probe;
};

class Advisor {
 public:
  // InvalidArgument naming the bad option (e.g. `max_nodes = 0 must be >= min_nodes = 1`).
  static absl::StatusOr<std::unique_ptr<Advisor>> Create(AdvisorOptions options);

  Advisor(const Advisor&) = delete;
  Advisor& operator=(const Advisor&) = delete;

  // Adds one step. InvalidArgument (from Validate) leaves the advisor
  // unchanged. O(1) amortized; never blocks on fitting.
  absl::Status Record(const StepSample& sample);

  // The current report. With too few steady-state steps, model.fitted is
  // false and the curve is empty (resize costs are still reported). May
  // propose a probe, and then remembers the step, so that the next is at
  // least ProbeOptions::min_steps_between steps later. Does not block Record
  // while fitting.
  AdvisorReport Report();

  // The aggregated configurations that the next fit would use (ascending
  // nodes), and that fit. FailedPrecondition when no configuration has
  // min_samples_per_config steps yet.
  std::vector<Observation> Observations() const;
  absl::StatusOr<ScalingFit> Fit() const;

 private:
  // A steady-state step, reduced to what aggregation needs.
  struct Timing {
    double compute_s;
    double network_s;  // exposed communication
    double other_s;    // total - compute - network, >= 0
    double step_s;
  };
  struct Config {
    int nodes = 0;
    int64_t local_batch = 0;
    int64_t global_batch = 0;
    int logical_workers = 0;
    std::vector<Timing> window;  // ring buffer, at most options_.window entries
    size_t next = 0;
    int64_t last_update = 0;  // Record() counter, for eviction
  };
  struct Snapshot {
    std::vector<Config> configs;
    ResizeCosts resize_costs;
    int64_t steps_observed = 0;
    int64_t step = 0;
    int current_nodes = 0;
    JobShape shape;
    std::optional<int64_t> last_probe_step;
  };

  explicit Advisor(AdvisorOptions options);
  Snapshot TakeSnapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<Observation> Aggregate(const std::vector<Config>& configs) const;

  const AdvisorOptions options_;
  mutable absl::Mutex mu_;
  std::vector<Config> configs_ ABSL_GUARDED_BY(mu_);
  ResizeCostTracker resize_costs_ ABSL_GUARDED_BY(mu_);
  int64_t records_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_step_ ABSL_GUARDED_BY(mu_) = 0;
  int current_nodes_ ABSL_GUARDED_BY(mu_) = 0;
  JobShape shape_ ABSL_GUARDED_BY(mu_);
  int64_t steps_in_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<int64_t> last_probe_step_ ABSL_GUARDED_BY(mu_);
};

}  // namespace malle::advisor

#endif  // MALLE_ADVISOR_ADVISOR_H_
