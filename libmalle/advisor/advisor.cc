#include "libmalle/advisor/advisor.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libmalle/base/status_macros.h"

namespace malle::advisor {
namespace {

// Which steps of a window are steady state: those whose wall time lies within
// 3 robust standard deviations (1.4826 * MAD) of the window's median. A 5x
// slow step is dropped entirely (a plain median would still move a little
// towards it); on clean noise the clipped mean is about 1.25x more precise
// than the median.
//
// Outliers are whole steps, judged by their wall time, never phase by phase:
// on a shared machine one phase often has a frequent tail (one allreduce in
// three waits 5 ms for a descheduled peer) that is part of what the job
// really pays while the step it belongs to is unremarkable. Clipping each
// phase on its own drops that tail, and the phases then no longer sum to the
// step: on tests/cpp/comm/advisor_gloo_test.cc the fit fell 10% short of the
// measured step time at every size that way.
std::vector<bool> SteadySteps(const std::vector<double>& step_s) {
  auto median_of = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    const size_t k = x.size();
    return k % 2 == 1 ? x[k / 2] : (x[k / 2 - 1] + x[k / 2]) / 2;
  };
  const double median = median_of(step_s);
  std::vector<double> deviations;
  for (double x : step_s) deviations.push_back(std::fabs(x - median));
  const double limit = 3 * 1.4826 * median_of(deviations);
  std::vector<bool> keep;
  for (double x : step_s) keep.push_back(std::fabs(x - median) <= limit);
  return keep;
}

// Mean of the kept values and its standard error.
void MeanOf(const std::vector<double>& v, const std::vector<bool>& keep, double* mean,
            double* se) {
  double sum = 0, sum_sq = 0;
  int kept = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!keep[i]) continue;
    sum += v[i];
    sum_sq += v[i] * v[i];
    ++kept;
  }
  // kept >= 1: the steps nearest the median are within any limit >= 0.
  *mean = sum / kept;
  const double variance =
      kept > 1 ? std::max(0.0, (sum_sq - kept * *mean * *mean) / (kept - 1)) : 0;
  *se = std::sqrt(variance / kept);
}

absl::Status CheckOptions(const AdvisorOptions& o) {
  if (o.min_nodes < 1 || o.min_nodes > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_nodes = ", o.min_nodes, " must be in [1, ", kMaxWorldSize, "]"));
  }
  if (o.max_nodes < o.min_nodes || o.max_nodes > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("max_nodes = ", o.max_nodes,
                                                   " must be in [min_nodes = ", o.min_nodes, ", ",
                                                   kMaxWorldSize, "]"));
  }
  for (size_t i = 0; i < o.allowed_sizes.size(); ++i) {
    if (o.allowed_sizes[i] < o.min_nodes || o.allowed_sizes[i] > o.max_nodes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "allowed_sizes[", i, "] = ", o.allowed_sizes[i], " must be in [min_nodes = ", o.min_nodes,
          ", max_nodes = ", o.max_nodes, "]"));
    }
  }
  if (o.skip_steps_after_resize < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("skip_steps_after_resize = ", o.skip_steps_after_resize, " must be >= 0"));
  }
  if (o.window < 1) {
    return absl::InvalidArgumentError(absl::StrCat("window = ", o.window, " must be >= 1"));
  }
  if (o.min_samples_per_config < 1 || o.min_samples_per_config > o.window) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_samples_per_config = ", o.min_samples_per_config,
                     " must be in [1, window = ", o.window, "]"));
  }
  if (o.max_configurations < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_configurations = ", o.max_configurations, " must be >= 1"));
  }
  if (o.resize_window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("resize_window = ", o.resize_window, " must be >= 1"));
  }
  if (absl::Status s = ValidateFitOptions(o.fit); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("fit.", s.message()));
  }
  if (absl::Status s = ValidateProbeOptions(o.probe); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("probe.", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Advisor>> Advisor::Create(AdvisorOptions options) {
  MALLE_RETURN_IF_ERROR(CheckOptions(options));
  std::sort(options.allowed_sizes.begin(), options.allowed_sizes.end());
  options.allowed_sizes.erase(
      std::unique(options.allowed_sizes.begin(), options.allowed_sizes.end()),
      options.allowed_sizes.end());
  return std::unique_ptr<Advisor>(new Advisor(std::move(options)));
}

Advisor::Advisor(AdvisorOptions options)
    : options_(std::move(options)), resize_costs_(options_.resize_window) {}

absl::Status Advisor::Record(const StepSample& s) {
  MALLE_RETURN_IF_ERROR(Validate(s));
  absl::MutexLock lock(&mu_);
  ++records_;
  last_step_ = s.step;
  const int previous_nodes = current_nodes_;
  current_nodes_ = s.world_size;
  shape_ = JobShape{s.global_batch, s.logical_workers};
  // A new membership generation: flagged, or visible as a size change (the
  // layer may not flag every resize, e.g. after its own restart).
  if (s.after_resize || (previous_nodes != 0 && previous_nodes != s.world_size)) {
    steps_in_generation_ = 0;
    if (s.after_resize && s.resize_pause > absl::ZeroDuration()) {
      // Validate() admitted the pause: Add cannot fail.
      resize_costs_
          .Add(ClassifyResize(previous_nodes, s.world_size, s.after_failure), s.resize_pause)
          .IgnoreError();
    }
  }
  ++steps_in_generation_;
  if (s.warmup || steps_in_generation_ <= options_.skip_steps_after_resize) {
    return absl::OkStatus();
  }

  Timing t;
  t.compute_s = absl::ToDoubleSeconds(s.compute);
  t.network_s = absl::ToDoubleSeconds(s.comm);
  t.step_s = absl::ToDoubleSeconds(s.total);
  t.other_s = std::max(0.0, t.step_s - t.compute_s - t.network_s);
  // Few configurations (one per size the job ran at): a linear scan, most
  // recent first, is O(max_configurations) = O(1).
  Config* config = nullptr;
  for (auto it = configs_.rbegin(); it != configs_.rend(); ++it) {
    if (it->nodes == s.world_size && it->local_batch == s.local_batch &&
        it->global_batch == s.global_batch && it->logical_workers == s.logical_workers) {
      config = &*it;
      break;
    }
  }
  if (config == nullptr) {
    if (static_cast<int>(configs_.size()) >= options_.max_configurations) {
      auto oldest = std::min_element(
          configs_.begin(), configs_.end(),
          [](const Config& a, const Config& b) { return a.last_update < b.last_update; });
      configs_.erase(oldest);
    }
    Config c;
    c.nodes = s.world_size;
    c.local_batch = s.local_batch;
    c.global_batch = s.global_batch;
    c.logical_workers = s.logical_workers;
    c.window.reserve(options_.window);
    configs_.push_back(std::move(c));
    config = &configs_.back();
  }
  config->last_update = records_;
  if (static_cast<int>(config->window.size()) < options_.window) {
    config->window.push_back(t);
  } else {
    config->window[config->next] = t;
    config->next = (config->next + 1) % config->window.size();
  }
  return absl::OkStatus();
}

Advisor::Snapshot Advisor::TakeSnapshot() const {
  absl::MutexLock lock(&mu_);
  Snapshot snap;
  for (const Config& c : configs_) {
    if (static_cast<int>(c.window.size()) >= options_.min_samples_per_config) {
      snap.configs.push_back(c);
    }
  }
  auto median_s = [this](ResizeDirection d) -> std::optional<double> {
    std::optional<ResizeCostStats> stats = resize_costs_.Stats(d);
    if (!stats) return std::nullopt;
    return absl::ToDoubleSeconds(stats->median);
  };
  snap.resize_costs.grow = median_s(ResizeDirection::kGrow);
  snap.resize_costs.shrink = median_s(ResizeDirection::kShrink);
  snap.resize_costs.failure = median_s(ResizeDirection::kFailure);
  snap.steps_observed = records_;
  snap.step = last_step_;
  snap.current_nodes = current_nodes_;
  snap.shape = shape_;
  snap.last_probe_step = last_probe_step_;
  return snap;
}

std::vector<Observation> Advisor::Aggregate(const std::vector<Config>& configs) const {
  std::vector<Observation> observations;
  for (const Config& c : configs) {
    std::vector<double> compute, network, other, step;
    for (const Timing& t : c.window) {
      compute.push_back(t.compute_s);
      network.push_back(t.network_s);
      other.push_back(t.other_s);
      step.push_back(t.step_s);
    }
    Observation o;
    o.nodes = c.nodes;
    o.local_batch = static_cast<double>(c.local_batch);
    o.slowest_batch = SlowestLocalBatch(c.global_batch, c.logical_workers, c.nodes);
    o.global_batch = static_cast<double>(c.global_batch);
    double step_se = 0;
    const std::vector<bool> keep = SteadySteps(step);
    MeanOf(compute, keep, &o.compute_s, &o.compute_se_s);
    MeanOf(network, keep, &o.network_s, &o.network_se_s);
    MeanOf(other, keep, &o.other_s, &o.other_se_s);
    MeanOf(step, keep, &o.step_s, &step_se);
    o.steps = static_cast<int64_t>(c.window.size());
    observations.push_back(o);
  }
  std::sort(observations.begin(), observations.end(),
            [](const Observation& a, const Observation& b) {
              return std::tie(a.nodes, a.local_batch, a.global_batch) <
                     std::tie(b.nodes, b.local_batch, b.global_batch);
            });
  return observations;
}

std::vector<Observation> Advisor::Observations() const { return Aggregate(TakeSnapshot().configs); }

absl::StatusOr<ScalingFit> Advisor::Fit() const {
  return FitScalingModel(Observations(), options_.fit);
}

AdvisorReport Advisor::Report() {
  const Snapshot snap = TakeSnapshot();
  AdvisorReport report;
  report.job = options_.job_id;
  report.step = snap.step;
  report.resize_cost_s = snap.resize_costs;
  ModelSummary& m = report.model;
  m.steps_observed = snap.steps_observed;
  m.current_nodes = snap.current_nodes;
  if (snap.steps_observed > 0) {
    m.global_batch = snap.shape.global_batch;
    m.logical_workers = snap.shape.logical_workers;
  }
  const std::vector<Observation> observations = Aggregate(snap.configs);
  for (const Observation& o : observations) m.steps_used += o.steps;
  absl::StatusOr<ScalingFit> fitted = FitScalingModel(observations, options_.fit);
  if (!fitted.ok()) return report;  // FailedPrecondition: no configuration is ready yet
  const ScalingFit& fit = *fitted;
  report.sizes_observed = fit.observed_nodes;

  m.fitted = true;
  const NetworkCandidate& best = fit.candidates.front();
  m.compute_fixed_s = fit.compute.intercept;
  m.compute_per_sample_s = fit.compute.slope;
  m.network_fixed_s = best.network.intercept;
  m.network_per_node_s = best.network.slope;
  m.gamma = fit.gamma();
  m.gamma_lo = fit.gamma_lo();
  m.gamma_hi = fit.gamma_hi();
  m.other_s = fit.other_s;
  m.compute_identified = fit.compute_identified();
  m.network_identified = fit.network_identified();
  m.gamma_identified = fit.gamma_identified;
  m.rms_relative_error = fit.rms_relative_error;
  m.configurations = fit.configurations;
  m.efficiency_reference_nodes = fit.observed_nodes.front();

  absl::StatusOr<std::vector<Prediction>> curve =
      PredictCurve(fit, snap.shape, options_.min_nodes, options_.max_nodes, options_.allowed_sizes);
  if (!curve.ok()) return report;  // unreachable: options and shape were validated
  const Prediction reference = Predict(fit, snap.shape, m.efficiency_reference_nodes);
  const double per_node_reference = reference.samples_per_s / m.efficiency_reference_nodes;
  for (const Prediction& p : *curve) {
    CurvePoint point;
    point.nodes = p.nodes;
    point.samples_per_s = p.samples_per_s;
    point.lo = p.lo;
    point.hi = p.hi;
    point.efficiency =
        per_node_reference > 0 ? (p.samples_per_s / p.nodes) / per_node_reference : 0.0;
    report.curve.push_back(point);
  }
  const int n = snap.current_nodes;
  if (n >= options_.min_nodes && n <= options_.max_nodes) {
    const double here = Predict(fit, snap.shape, n).samples_per_s;
    if (n + 1 <= options_.max_nodes) {
      report.marginal_gain.up = Predict(fit, snap.shape, n + 1).samples_per_s - here;
    }
    if (n - 1 >= options_.min_nodes) {
      report.marginal_gain.down = here - Predict(fit, snap.shape, n - 1).samples_per_s;
    }
  }

  ProbeContext context;
  context.shape = snap.shape;
  context.min_nodes = options_.min_nodes;
  context.max_nodes = options_.max_nodes;
  context.allowed_sizes = options_.allowed_sizes;
  context.current_nodes = snap.current_nodes;
  context.step = snap.step;
  context.last_probe_step = snap.last_probe_step;
  absl::StatusOr<ProbeDecision> decision = ProposeProbe(fit, context, options_.probe);
  if (decision.ok() && decision->request) {
    report.probe = decision->request;
    absl::MutexLock lock(&mu_);
    last_probe_step_ = snap.step;
  }
  return report;
}

}  // namespace malle::advisor
