// The step-time model of an elastic data-parallel job, fitted from measured
// steps, and its predictions with honest uncertainty bands.
//
// Model (the shape of AdaptDL/Pollux's throughput model, fitted per phase):
//
//   B(n)       = ceil(L / n) * G / L      local batch of the busiest of n ranks
//   T_comp(n)  = a + b * B(n)             forward + backward
//   T_net(n)   = c + d * (n - 1)          0 when n == 1
//   T_core(n)  = (T_comp^gamma + T_net^gamma)^(1 / gamma),  gamma >= 1
//   T(n)       = e + T_core(n)            e: data wait + optimizer + untimed work
//   X(n)       = G / T(n)                 throughput, samples/s
//
// a, b, c, d, e >= 0. gamma = 1 means communication adds to compute (no
// overlap); larger gamma means more of it hides behind backward, up to
// T_core = max(T_comp, T_net). The terms are fitted separately: (a, b) from
// the compute phase against the local batch, e from the non-core time, and
// (c, d, gamma) from the measured compute and exposed communication at sizes
// n >= 2: their sum is T_core, and for each gamma of a fixed grid
// y = (T_core^gamma - T_comp^gamma)^(1/gamma) is linear in (c, d) (for gamma
// = 1, y is the exposed communication itself). gamma minimizes the weighted
// (Huber) residual of T_core over the grid, refined by golden-section search
// between the best grid value's neighbours. Fitting the network term to the
// measured communication phase rather than to the step time matters: it is
// often a tenth of the step, so a 1% error of the step would be a 10% error
// of the network term, and extrapolation multiplies that.
//
// Input is one Observation per distinct configuration, already aggregated
// (the Advisor takes a robust mean, over the steps whose wall time is within 3 MADs of the median, of
// a bounded window of steady-state steps per configuration; see advisor.h). Every linear fit is a
// weighted least-squares fit (weight 1 / standard error^2) made robust by Huber IRLS across
// configurations (started from a Theil-Sen line, with the residual scale
// fixed from it, so that one bad configuration cannot drag the start), with
// non-negative parameters. Fitting costs
// O(configurations * |gamma grid|), independent of how many steps were seen.
//
// Uncertainty (Predict's lo/hi, about 95%):
//   * identified linear terms: z * standard deviation of the fitted line at
//     the predicted point, from the parameter covariance (scaled up by the
//     reduced chi^2 when the points scatter more than their standard errors);
//   * unidentified terms use a bracketing prior instead of a guess:
//       - one local batch B0 seen (time T0): a in [0, T0], so T_comp(B) lies
//         between T0 * B / B0 (all time proportional to the batch) and T0 (all
//         fixed overhead); point estimate a = prior_fixed_compute_fraction * T0;
//       - one size n0 >= 2 seen (network time N0): c + d (n - 1) lies between
//         N0 (flat, like a bandwidth-bound ring all-reduce) and
//         N0 (n - 1) / (n0 - 1) (linear, like a parameter server);
//       - no size >= 2 seen: T_net(n) in [0, prior_max_network_ratio *
//         T_core(observed) * log2 n];
//       - gamma: the band is the union over the gamma values whose residual
//         is within chi^2_1(95%) of the best (profile set; with one size
//         >= 2 or none, the whole grid). gamma counts as identified from 4
//         sizes >= 2 on (three parameters c, d, gamma and one degree of
//         freedom); with fewer, three sizes fit many gamma exactly and the
//         best one would jump with the noise, so the point estimate is the
//         plausible value nearest prior_gamma instead;
//   * model error: the model is an approximation; the band is widened by
//     model_error_per_doubling per doubling of distance from the nearest
//     observed size (0 at an observed size).
// Step-time extremes are combined monotonically (T is increasing in every
// term), so the band is conservative; throughput's band is G / T's band.
//
//   MALLE_ASSIGN_OR_RETURN(ScalingFit fit, FitScalingModel(observations, {}));
//   Prediction p = Predict(fit, JobShape{512, 16}, 8);
//   std::cout << p.samples_per_s << " in [" << p.lo << ", " << p.hi << "]\n";
//
// Thread-safety: plain data and pure functions; thread-safe.
#ifndef MALLE_ADVISOR_SCALING_MODEL_H_
#define MALLE_ADVISOR_SCALING_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace malle::advisor {

// What the job trains with: the global batch G and the number of logical
// workers L (fixed while the job runs; n ranks share them).
struct JobShape {
  int64_t global_batch = 1;  // >= 1
  int logical_workers = 1;   // >= 1
};

// One configuration's aggregated measurements, in seconds per step.
// Invariant: step_s ~= compute_s + network_s + other_s (the Advisor sets
// other_s = step_s - compute_s - network_s, clamped at 0).
struct Observation {
  int nodes = 1;             // n >= 1
  double local_batch = 1;    // samples the rank that measured compute_s computed, > 0
  double slowest_batch = 1;  // local batch of the busiest rank (SlowestLocalBatch), > 0
  double global_batch = 1;   // > 0
  double compute_s = 0;      // forward + backward on this rank
  double network_s = 0;      // exposed communication (includes waiting for slower ranks)
  double other_s = 0;        // data wait + optimizer + untimed work
  double step_s = 0;         // step wall time, > 0
  // Standard errors of compute_s, network_s and other_s. 0 means unknown;
  // FitOptions::min_relative_error (of each value) is a floor in any case.
  double compute_se_s = 0;
  double network_se_s = 0;
  double other_se_s = 0;
  int64_t steps = 1;  // steps aggregated, >= 1 (informational)
};

struct FitOptions {
  // Huber threshold, in robust standard deviations of the residuals.
  double huber_k = 1.345;
  // Floor of every standard error, relative to the value: the jitter of a
  // shared machine between windows, not visible within one window.
  double min_relative_error = 0.01;
  // Width of the bands in standard deviations (1.96: about 95%).
  double z = 1.96;
  // gamma's grid is {1, 1.1, 1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 7, 10} cut at
  // max_gamma (Pollux bounds gamma to [1, 10]). prior_gamma is the point
  // estimate while gamma is not identified (the nearest grid value).
  double max_gamma = 10.0;
  double prior_gamma = 1.0;
  // Priors of unidentified terms (see the header comment).
  double prior_fixed_compute_fraction = 0.1;  // in [0, 1]
  double prior_network_slope_share = 0.5;     // one size >= 2: share of N0 in d * (n0 - 1)
  double prior_network_ratio = 0.1;           // no size >= 2: point estimate
  double prior_max_network_ratio = 1.0;       // no size >= 2: upper bound
  double model_error_per_doubling = 0.05;     // relative, >= 0
};

// y = intercept + slope * x with its (scaled) parameter covariance.
struct LinearFit {
  double intercept = 0;
  double slope = 0;
  double var_intercept = 0;
  double var_slope = 0;
  double covariance = 0;

  double Eval(double x) const { return intercept + slope * x; }
  // Standard deviation of Eval(x) from the parameter covariance.
  double StdDev(double x) const;
};

// The network term at one gamma of the grid.
struct NetworkCandidate {
  double gamma = 1;
  LinearFit network;    // x = n - 1
  double ref_se_s = 0;  // one size >= 2: standard error of the network time there
  double chi2 = 0;      // weighted squared residual of T_core over sizes >= 2
};

struct ScalingFit {
  // Compute term, x = local batch. compute_batches < 2: a prior (see above)
  // around (compute_ref_batch, compute_ref_s).
  LinearFit compute;
  int compute_batches = 0;  // distinct local batches observed
  double compute_ref_batch = 0;
  double compute_ref_s = 0;
  double compute_ref_se_s = 0;

  // Network term. network_sizes = distinct n >= 2 observed; < 2: a prior.
  int network_sizes = 0;
  int network_ref_nodes = 0;  // network_sizes == 1: that size
  double core_ref_s = 0;      // network_sizes == 0: observed T_core (the prior's scale)
  // The plausible gamma values, best first (candidates[0] is the point estimate).
  std::vector<NetworkCandidate> candidates;
  bool gamma_identified = false;  // network_sizes >= 4 (see the header comment)

  // Non-core time e: weighted mean over configurations and its spread.
  double other_s = 0;
  double other_sd_s = 0;

  std::vector<int> observed_nodes;  // ascending, distinct
  int configurations = 0;
  int64_t steps = 0;              // sum of Observation::steps
  double rms_relative_error = 0;  // of the fitted step time vs step_s over configurations
  FitOptions options;

  double gamma() const { return candidates.empty() ? 1.0 : candidates.front().gamma; }
  double gamma_lo() const;
  double gamma_hi() const;
  bool compute_identified() const { return compute_batches >= 2; }
  bool network_identified() const { return network_sizes >= 2; }
};

// OK or InvalidArgument naming the bad option, e.g. `max_gamma = 12 must be in [1, 10]`.
absl::Status ValidateFitOptions(const FitOptions& options);

// Fits the model. InvalidArgument naming `observations[i].field` for a bad
// value or bad options; FailedPrecondition when `observations` is empty.
// Pure; never blocks.
absl::StatusOr<ScalingFit> FitScalingModel(absl::Span<const Observation> observations,
                                           const FitOptions& options = {});

struct Prediction {
  int nodes = 0;
  double step_s = 0;  // point estimate of T(n)
  double step_lo_s = 0;
  double step_hi_s = 0;
  double samples_per_s = 0;  // G / step_s
  double lo = 0;             // G / step_hi_s
  double hi = 0;             // G / step_lo_s
  double compute_s = 0;      // point estimates of the terms
  double network_s = 0;
  double other_s = 0;

  // (hi - lo) / samples_per_s; what probing minimizes.
  double RelativeUncertainty() const;
};

// Prediction at `nodes` >= 1 for `shape` (validated: G, L >= 1). Aborts
// (MALLE_CHECK) on nodes < 1 or an invalid shape. Pure.
Prediction Predict(const ScalingFit& fit, const JobShape& shape, int nodes);

// Predictions for every n in [min_nodes, max_nodes] (or for `sizes` when not
// empty, which must lie in that range). InvalidArgument on a bad range, size
// or shape.
absl::StatusOr<std::vector<Prediction>> PredictCurve(const ScalingFit& fit, const JobShape& shape,
                                                     int min_nodes, int max_nodes,
                                                     absl::Span<const int> sizes = {});

}  // namespace malle::advisor

#endif  // MALLE_ADVISOR_SCALING_MODEL_H_
