// Fitting and prediction of the step-time model (scaling_model.h).
//
// Every fit here is a two-parameter weighted least-squares line with
// non-negative parameters; the robust version reweights configurations with
// Huber weights (IRLS). Two parameters never need a linear-algebra library:
// the normal equations are solved in closed form.
#include "libmalle/advisor/scaling_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "libmalle/advisor/step_sample.h"
#include "libmalle/base/check.h"

namespace malle::advisor {
namespace {

constexpr double kGammaGrid[] = {1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 7.0, 10.0};
// chi^2 with one degree of freedom, 95%: the profile-likelihood set of gamma.
constexpr double kChi2OneDof95 = 3.841;
// Smallest standard error (seconds) of anything: keeps weights finite.
constexpr double kMinSeconds = 1e-9;
// A transformed network point whose T_core hardly depends on T_net (the
// network hides behind compute) is known poorly: its standard error is the
// core's divided by dT_core/dT_net, floored here so that the weight stays > 0.
constexpr double kMinSensitivity = 0.05;
// The band's upper throughput is at most this multiple of the point estimate
// (a band that allows a zero step time would be infinite).
constexpr double kMaxBandRatio = 1000.0;

struct Point {
  double x = 0;
  double y = 0;
  double sigma = 1;
};

double Median(std::vector<double> v) {
  MALLE_CHECK(!v.empty());
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double m = v[mid];
  if (v.size() % 2 == 0) m = (m + *std::max_element(v.begin(), v.begin() + mid)) / 2;
  return m;
}

int CountDistinct(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  int distinct = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i == 0 || xs[i] - xs[i - 1] > 1e-9 * std::max(1.0, std::fabs(xs[i]))) ++distinct;
  }
  return distinct;
}

double Sigma(double se, double value, const FitOptions& options) {
  return std::max({se, options.min_relative_error * std::fabs(value), kMinSeconds});
}

// Weighted least squares with intercept, slope >= 0; `h` are Huber factors.
LinearFit NonNegativeWls(absl::Span<const Point> points, absl::Span<const double> h) {
  double s0 = 0, s1 = 0, s2 = 0, sy = 0, sxy = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    const double w = h[i] / (points[i].sigma * points[i].sigma);
    s0 += w;
    s1 += w * points[i].x;
    s2 += w * points[i].x * points[i].x;
    sy += w * points[i].y;
    sxy += w * points[i].x * points[i].y;
  }
  LinearFit fit;
  const double det = s0 * s2 - s1 * s1;
  if (det > 1e-12 * s0 * s2) {
    fit.slope = (s0 * sxy - s1 * sy) / det;
    fit.intercept = (sy - fit.slope * s1) / s0;
    fit.var_intercept = s2 / det;
    fit.var_slope = s0 / det;
    fit.covariance = -s1 / det;
    if (fit.slope >= 0 && fit.intercept >= 0) return fit;
  }
  // A constraint binds: the optimum lies on an edge of the feasible quadrant.
  // The covariance stays the unconstrained one (conservative: the clamped
  // parameter is not known to be exactly 0).
  auto sse = [&](double intercept, double slope) {
    double total = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      const double r = points[i].y - intercept - slope * points[i].x;
      total += h[i] * r * r / (points[i].sigma * points[i].sigma);
    }
    return total;
  };
  const double flat = std::max(0.0, sy / s0);
  const double proportional = s2 > 0 ? std::max(0.0, sxy / s2) : 0.0;
  if (sse(flat, 0) <= sse(0, proportional)) {
    fit.intercept = flat;
    fit.slope = 0;
  } else {
    fit.intercept = 0;
    fit.slope = proportional;
  }
  return fit;
}

// A robust starting line: Theil-Sen (median of pairwise slopes, median
// intercept), projected onto intercept, slope >= 0. Needs >= 2 distinct x.
LinearFit TheilSen(absl::Span<const Point> points) {
  std::vector<double> slopes;
  for (size_t i = 0; i < points.size(); ++i) {
    for (size_t j = i + 1; j < points.size(); ++j) {
      const double dx = points[j].x - points[i].x;
      if (std::fabs(dx) > 1e-12 * std::max(1.0, std::fabs(points[i].x))) {
        slopes.push_back((points[j].y - points[i].y) / dx);
      }
    }
  }
  LinearFit fit;
  fit.slope = std::max(0.0, Median(slopes));
  std::vector<double> intercepts;
  for (const Point& p : points) intercepts.push_back(p.y - fit.slope * p.x);
  fit.intercept = Median(intercepts);
  if (fit.intercept < 0) {
    fit.intercept = 0;
    std::vector<double> ratios;
    for (const Point& p : points) {
      if (p.x > 0) ratios.push_back(p.y / p.x);
    }
    fit.slope = ratios.empty() ? 0.0 : std::max(0.0, Median(ratios));
  }
  return fit;
}

// Huber M-estimate around NonNegativeWls; needs >= 2 distinct x. IRLS starts
// from TheilSen with the residual scale fixed from the start's residuals
// (median absolute standardized residual, at least 1: points are never
// trusted more than their standard errors say). The covariance is scaled by
// the reduced chi^2 when the points scatter more than their standard errors
// say (Birge ratio), so that a misfit widens the band.
LinearFit RobustFit(absl::Span<const Point> points, double huber_k) {
  std::vector<double> h(points.size(), 1.0);
  LinearFit fit;
  // With 3 or fewer points a line leaves too few residuals to tell which one
  // is the outlier: plain weighted least squares.
  if (points.size() >= 4) {
    const LinearFit start = TheilSen(points);
    std::vector<double> abs_u;
    for (const Point& p : points) abs_u.push_back(std::fabs(p.y - start.Eval(p.x)) / p.sigma);
    const double scale = std::max(1.0, 1.4826 * Median(abs_u));
    fit = start;
    for (int iteration = 0; iteration < 100; ++iteration) {
      double change = 0;
      for (size_t i = 0; i < points.size(); ++i) {
        const double u = std::fabs(points[i].y - fit.Eval(points[i].x)) / points[i].sigma;
        const double next = u <= huber_k * scale ? 1.0 : huber_k * scale / u;
        change = std::max(change, std::fabs(next - h[i]));
        h[i] = next;
      }
      fit = NonNegativeWls(points, h);
      if (iteration > 0 && change < 1e-9) break;
    }
  } else {
    fit = NonNegativeWls(points, h);
  }
  if (points.size() > 2) {
    double chi2 = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      const double r = (points[i].y - fit.Eval(points[i].x)) / points[i].sigma;
      chi2 += h[i] * r * r;
    }
    const double factor = std::max(1.0, chi2 / static_cast<double>(points.size() - 2));
    fit.var_intercept *= factor;
    fit.var_slope *= factor;
    fit.covariance *= factor;
  }
  return fit;
}

// Weighted mean of points that share one x, and its standard error (scaled
// by the reduced chi^2 like RobustFit).
void WeightedMean(absl::Span<const Point> points, double* mean, double* se) {
  double sw = 0, swy = 0;
  for (const Point& p : points) {
    const double w = 1 / (p.sigma * p.sigma);
    sw += w;
    swy += w * p.y;
  }
  *mean = swy / sw;
  double chi2 = 0;
  for (const Point& p : points) chi2 += (p.y - *mean) * (p.y - *mean) / (p.sigma * p.sigma);
  const double factor =
      points.size() > 1 ? std::max(1.0, chi2 / static_cast<double>(points.size() - 1)) : 1.0;
  *se = std::sqrt(factor / sw);
}

double Core(double compute, double network, double gamma) {
  if (gamma == 1.0) return compute + network;
  const double m = std::max(compute, network);
  if (m <= 0) return 0;
  return m * std::pow(std::pow(compute / m, gamma) + std::pow(network / m, gamma), 1 / gamma);
}

// Inverse of Core in its second argument: the network time that makes
// Core(compute, ., gamma) == core (0 when compute alone exceeds it).
double NetworkFromCore(double core, double compute, double gamma) {
  if (core <= compute || core <= 0) return 0;
  if (gamma == 1.0) return core - compute;
  return core * std::pow(1 - std::pow(compute / core, gamma), 1 / gamma);
}

absl::Status CheckFinite(absl::string_view field, double value, double lo, bool lo_open) {
  if (!std::isfinite(value) || value < lo || (lo_open && value == lo)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, " must be finite and ", lo_open ? "> " : ">= ", lo));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateFitOptions(const FitOptions& o) {
  if (!(o.huber_k > 0) || !std::isfinite(o.huber_k)) {
    return absl::InvalidArgumentError(absl::StrCat("huber_k = ", o.huber_k, " must be > 0"));
  }
  if (!(o.min_relative_error >= 0 && o.min_relative_error < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_relative_error = ", o.min_relative_error, " must be in [0, 1)"));
  }
  if (!(o.z > 0) || !std::isfinite(o.z)) {
    return absl::InvalidArgumentError(absl::StrCat("z = ", o.z, " must be > 0"));
  }
  if (!(o.max_gamma >= 1 && o.max_gamma <= 10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_gamma = ", o.max_gamma, " must be in [1, 10]"));
  }
  if (!(o.prior_gamma >= 1 && o.prior_gamma <= o.max_gamma)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prior_gamma = ", o.prior_gamma, " must be in [1, max_gamma = ", o.max_gamma, "]"));
  }
  if (!(o.prior_fixed_compute_fraction >= 0 && o.prior_fixed_compute_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prior_fixed_compute_fraction = ", o.prior_fixed_compute_fraction, " must be in [0, 1]"));
  }
  if (!(o.prior_network_slope_share >= 0 && o.prior_network_slope_share <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prior_network_slope_share = ", o.prior_network_slope_share, " must be in [0, 1]"));
  }
  if (!(o.prior_max_network_ratio >= 0) || !std::isfinite(o.prior_max_network_ratio)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prior_max_network_ratio = ", o.prior_max_network_ratio, " must be >= 0"));
  }
  if (!(o.prior_network_ratio >= 0 && o.prior_network_ratio <= o.prior_max_network_ratio)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prior_network_ratio = ", o.prior_network_ratio,
                     " must be in [0, prior_max_network_ratio = ", o.prior_max_network_ratio, "]"));
  }
  if (!(o.model_error_per_doubling >= 0) || !std::isfinite(o.model_error_per_doubling)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_error_per_doubling = ", o.model_error_per_doubling, " must be >= 0"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status ValidateObservation(const Observation& o, size_t i) {
  const std::string p = absl::StrCat("observations[", i, "].");
  if (o.nodes < 1 || o.nodes > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "nodes = ", o.nodes, " must be in [1, ", kMaxWorldSize, "]"));
  }
  if (auto s = CheckFinite(p + "local_batch", o.local_batch, 0, true); !s.ok()) return s;
  if (auto s = CheckFinite(p + "slowest_batch", o.slowest_batch, 0, true); !s.ok()) return s;
  if (auto s = CheckFinite(p + "global_batch", o.global_batch, 0, true); !s.ok()) return s;
  if (auto s = CheckFinite(p + "compute_s", o.compute_s, 0, false); !s.ok()) return s;
  if (auto s = CheckFinite(p + "network_s", o.network_s, 0, false); !s.ok()) return s;
  if (auto s = CheckFinite(p + "other_s", o.other_s, 0, false); !s.ok()) return s;
  if (auto s = CheckFinite(p + "step_s", o.step_s, 0, true); !s.ok()) return s;
  if (auto s = CheckFinite(p + "compute_se_s", o.compute_se_s, 0, false); !s.ok()) return s;
  if (auto s = CheckFinite(p + "network_se_s", o.network_se_s, 0, false); !s.ok()) return s;
  if (auto s = CheckFinite(p + "other_se_s", o.other_se_s, 0, false); !s.ok()) return s;
  if (o.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(p, "steps = ", o.steps, " must be >= 1"));
  }
  return absl::OkStatus();
}

struct Band {
  double lo = 0;
  double point = 0;
  double hi = 0;
};

Band ComputeBand(const ScalingFit& fit, double batch) {
  const double z = fit.options.z;
  Band b;
  b.point = std::max(0.0, fit.compute.Eval(batch));
  if (fit.compute_identified()) {
    const double sd = fit.compute.StdDev(batch);
    b.lo = std::max(0.0, b.point - z * sd);
    b.hi = b.point + z * sd;
    return b;
  }
  // a in [0, T0]: between proportional-to-batch and flat.
  const double r = batch / fit.compute_ref_batch;
  const double t0 = fit.compute_ref_s;
  const double se = fit.compute_ref_se_s;
  b.lo = std::max(0.0, std::min(t0, t0 * r) - z * se * std::min(1.0, r));
  b.hi = std::max(t0, t0 * r) + z * se * std::max(1.0, r);
  return b;
}

Band NetworkBand(const ScalingFit& fit, const NetworkCandidate& c, int nodes) {
  Band b;
  if (nodes <= 1) return b;
  const double z = fit.options.z;
  const double x = nodes - 1;
  if (fit.network_sizes >= 2) {
    b.point = std::max(0.0, c.network.Eval(x));
    const double sd = c.network.StdDev(x);
    b.lo = std::max(0.0, b.point - z * sd);
    b.hi = b.point + z * sd;
  } else if (fit.network_sizes == 1) {
    const double x0 = fit.network_ref_nodes - 1;
    const double y0 = c.network.Eval(x0);
    const double r = x / x0;
    b.point = std::max(0.0, c.network.Eval(x));
    b.lo = std::max(0.0, std::min(y0, y0 * r) - z * c.ref_se_s * std::min(1.0, r));
    b.hi = std::max(y0, y0 * r) + z * c.ref_se_s * std::max(1.0, r);
  } else {
    const double scale = fit.core_ref_s * std::log2(static_cast<double>(nodes));
    b.point = fit.options.prior_network_ratio * scale;
    b.lo = 0;
    b.hi = fit.options.prior_max_network_ratio * scale;
  }
  return b;
}

}  // namespace

double LinearFit::StdDev(double x) const {
  return std::sqrt(std::max(0.0, var_intercept + 2 * x * covariance + x * x * var_slope));
}

double ScalingFit::gamma_lo() const {
  double g = gamma();
  for (const NetworkCandidate& c : candidates) g = std::min(g, c.gamma);
  return g;
}

double ScalingFit::gamma_hi() const {
  double g = gamma();
  for (const NetworkCandidate& c : candidates) g = std::max(g, c.gamma);
  return g;
}

double Prediction::RelativeUncertainty() const {
  return samples_per_s > 0 ? (hi - lo) / samples_per_s : std::numeric_limits<double>::infinity();
}

absl::StatusOr<ScalingFit> FitScalingModel(absl::Span<const Observation> observations,
                                           const FitOptions& options) {
  if (absl::Status s = ValidateFitOptions(options); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("options.", s.message()));
  }
  if (observations.empty()) {
    return absl::FailedPreconditionError("no observations: the model needs at least one size");
  }
  for (size_t i = 0; i < observations.size(); ++i) {
    if (absl::Status s = ValidateObservation(observations[i], i); !s.ok()) return s;
  }

  ScalingFit fit;
  fit.options = options;
  fit.configurations = static_cast<int>(observations.size());
  for (const Observation& o : observations) {
    fit.steps += o.steps;
    fit.observed_nodes.push_back(o.nodes);
  }
  std::sort(fit.observed_nodes.begin(), fit.observed_nodes.end());
  fit.observed_nodes.erase(std::unique(fit.observed_nodes.begin(), fit.observed_nodes.end()),
                           fit.observed_nodes.end());

  // --- compute: T_comp = a + b * local batch --------------------------------------------------
  std::vector<Point> compute_points;
  std::vector<double> batches;
  for (const Observation& o : observations) {
    compute_points.push_back(
        {o.local_batch, o.compute_s, Sigma(o.compute_se_s, o.compute_s, options)});
    batches.push_back(o.local_batch);
  }
  fit.compute_batches = CountDistinct(batches);
  if (fit.compute_batches >= 2) {
    fit.compute = RobustFit(compute_points, options.huber_k);
  } else {
    fit.compute_ref_batch = compute_points.front().x;
    WeightedMean(compute_points, &fit.compute_ref_s, &fit.compute_ref_se_s);
    const double t0 = fit.compute_ref_s;
    fit.compute.intercept = options.prior_fixed_compute_fraction * t0;
    fit.compute.slope = (1 - options.prior_fixed_compute_fraction) * t0 / fit.compute_ref_batch;
  }

  // --- other: e, constant ------------------------------------------------------------------------
  {
    double sw = 0, swy = 0;
    for (const Observation& o : observations) {
      const double s = Sigma(o.other_se_s, o.other_s, options);
      sw += 1 / (s * s);
      swy += o.other_s / (s * s);
    }
    fit.other_s = swy / sw;
    double spread = 0;
    for (const Observation& o : observations) {
      const double s = Sigma(o.other_se_s, o.other_s, options);
      spread += (o.other_s - fit.other_s) * (o.other_s - fit.other_s) / (s * s);
    }
    // A new size's e may lie anywhere in the spread across sizes, not only
    // within the standard error of their mean.
    fit.other_sd_s = std::sqrt(1 / sw + spread / sw);
  }

  // --- network: T_net = c + d (n - 1), and gamma ------------------------------------------------
  // The busiest rank's compute time, measured: on a rank with fewer logical
  // workers, scaled by the fitted ratio (its communication phase includes the
  // wait for the busiest rank, so compute + communication is the same on
  // every rank).
  struct NetPoint {
    double x;
    double compute;
    double compute_sigma;
    double exposed;  // core - compute
    double exposed_sigma;
  };
  std::vector<NetPoint> net;
  std::vector<double> sizes;
  double core_sum = 0, core_weight = 0;
  for (const Observation& o : observations) {
    const double core = o.compute_s + o.network_s;
    if (o.nodes < 2) {
      const double sigma = std::hypot(Sigma(o.compute_se_s, o.compute_s, options),
                                      Sigma(o.network_se_s, o.network_s, options));
      core_sum += core / (sigma * sigma);
      core_weight += 1 / (sigma * sigma);
      continue;
    }
    double ratio = 1;
    const double own = fit.compute.Eval(o.local_batch);
    if (o.local_batch != o.slowest_batch && own > 0) {
      ratio = std::max(0.0, fit.compute.Eval(o.slowest_batch)) / own;
    }
    NetPoint p;
    p.x = o.nodes - 1;
    p.compute = std::min(core, o.compute_s * ratio);
    p.compute_sigma = Sigma(o.compute_se_s, o.compute_s, options) * ratio;
    p.exposed = core - p.compute;
    p.exposed_sigma = Sigma(o.network_se_s, o.network_s, options);
    net.push_back(p);
    sizes.push_back(o.nodes);
  }
  fit.network_sizes = CountDistinct(sizes);
  if (fit.network_sizes == 0) fit.core_ref_s = core_sum / core_weight;
  if (fit.network_sizes == 1) fit.network_ref_nodes = static_cast<int>(sizes.front());

  // The network line and its (Huber) residual at one gamma.
  auto candidate_at = [&](double gamma) {
    NetworkCandidate c;
    c.gamma = gamma;
    std::vector<Point> points;
    for (const NetPoint& p : net) {
      const double core = p.compute + p.exposed;
      const double y = NetworkFromCore(core, p.compute, gamma);
      double sigma = p.exposed_sigma;
      if (gamma != 1.0) {
        // Delta method: dy/d(exposed) = (core / y)^(gamma - 1) and
        // dy/d(compute) = that * (1 - (compute / core)^(gamma - 1)).
        const double q = std::max(kMinSensitivity, core > 0 ? std::pow(y / core, gamma - 1) : 0.0);
        const double from_compute =
            (core > 0 ? 1 - std::pow(p.compute / core, gamma - 1) : 0.0) * p.compute_sigma;
        sigma = std::hypot(p.exposed_sigma, from_compute) / q;
      }
      points.push_back({p.x, y, sigma});
    }
    if (fit.network_sizes >= 2) {
      c.network = RobustFit(points, options.huber_k);
    } else if (fit.network_sizes == 1) {
      double y0 = 0;
      WeightedMean(points, &y0, &c.ref_se_s);
      const double share = options.prior_network_slope_share;
      c.network.intercept = (1 - share) * y0;
      c.network.slope = share * y0 / points.front().x;
    }
    // Residual of T_core given the measured compute: an error e_c of the
    // compute phase and e_x of the exposed communication move it by
    // e_x + e_c * (1 - (compute / core)^(gamma - 1)).
    for (const NetPoint& p : net) {
      const double core = p.compute + p.exposed;
      const double model = Core(p.compute, std::max(0.0, c.network.Eval(p.x)), gamma);
      const double from_compute =
          gamma == 1.0 || core <= 0 ? 0.0
                                    : (1 - std::pow(p.compute / core, gamma - 1)) * p.compute_sigma;
      // Huber's loss, so that one bad configuration cannot choose gamma.
      const double u = std::fabs(core - model) / std::hypot(p.exposed_sigma, from_compute);
      const double k = options.huber_k;
      c.chi2 += u <= k ? u * u : 2 * k * u - k * k;
    }
    return c;
  };

  std::vector<NetworkCandidate> grid;
  for (double gamma : kGammaGrid) {
    if (gamma > options.max_gamma + 1e-12) break;
    grid.push_back(candidate_at(gamma));
  }
  double chi2_min = std::numeric_limits<double>::infinity();
  size_t grid_best = 0;
  for (size_t i = 0; i < grid.size(); ++i) {
    if (grid[i].chi2 < chi2_min) {
      chi2_min = grid[i].chi2;
      grid_best = i;
    }
  }
  fit.gamma_identified = fit.network_sizes >= 4;
  NetworkCandidate best = grid[grid_best];
  if (fit.gamma_identified && grid.size() > 1) {
    // Refine between the grid neighbours of the best value (golden section):
    // a continuous gamma keeps the point estimate from jumping between grid
    // values when the data change a little.
    double lo = grid[grid_best == 0 ? 0 : grid_best - 1].gamma;
    double hi = grid[std::min(grid.size() - 1, grid_best + 1)].gamma;
    constexpr double kInvPhi = 0.6180339887498949;
    double x1 = hi - kInvPhi * (hi - lo), x2 = lo + kInvPhi * (hi - lo);
    NetworkCandidate c1 = candidate_at(x1), c2 = candidate_at(x2);
    for (int i = 0; i < 40 && hi - lo > 1e-4; ++i) {
      if (c1.chi2 <= c2.chi2) {
        hi = x2;
        x2 = x1;
        c2 = c1;
        x1 = hi - kInvPhi * (hi - lo);
        c1 = candidate_at(x1);
      } else {
        lo = x1;
        x1 = x2;
        c1 = c2;
        x2 = lo + kInvPhi * (hi - lo);
        c2 = candidate_at(x2);
      }
    }
    const NetworkCandidate& refined = c1.chi2 <= c2.chi2 ? c1 : c2;
    if (refined.chi2 < best.chi2) best = refined;
    chi2_min = std::min(chi2_min, best.chi2);
  }
  double scale = 1;
  if (fit.gamma_identified && net.size() > 3) {
    scale = std::max(1.0, chi2_min / static_cast<double>(net.size() - 3));
  }
  // The profile set: every gamma whose residual is within chi^2_1(95%) of the best.
  const double cutoff = chi2_min + kChi2OneDof95 * scale;
  if (!fit.gamma_identified) {
    // No data choose gamma: the plausible value nearest the prior (stable,
    // where the best fit would jump between grid values with the noise).
    bool found = false;
    for (const NetworkCandidate& c : grid) {
      if (c.chi2 > cutoff) continue;
      if (!found ||
          std::fabs(c.gamma - options.prior_gamma) < std::fabs(best.gamma - options.prior_gamma)) {
        best = c;
        found = true;
      }
    }
  }
  fit.candidates.push_back(best);
  for (const NetworkCandidate& c : grid) {
    if (c.gamma != best.gamma && c.chi2 <= cutoff) fit.candidates.push_back(c);
  }

  // --- fit quality -------------------------------------------------------------------------------
  double sum_sq = 0;
  const NetworkCandidate& c = fit.candidates.front();
  for (const Observation& o : observations) {
    const double compute = std::max(0.0, fit.compute.Eval(o.slowest_batch));
    const double network = o.nodes >= 2 ? std::max(0.0, c.network.Eval(o.nodes - 1)) : 0.0;
    const double predicted = fit.other_s + Core(compute, network, c.gamma);
    const double r = (predicted - o.step_s) / o.step_s;
    sum_sq += r * r;
  }
  fit.rms_relative_error = std::sqrt(sum_sq / observations.size());
  return fit;
}

Prediction Predict(const ScalingFit& fit, const JobShape& shape, int nodes) {
  MALLE_CHECK(nodes >= 1) << "nodes " << nodes;
  MALLE_CHECK(!fit.candidates.empty())
      << "Predict on a ScalingFit that FitScalingModel did not make";
  const double batch = SlowestLocalBatch(shape.global_batch, shape.logical_workers, nodes);
  const double z = fit.options.z;
  const Band compute = ComputeBand(fit, batch);
  const Band other{std::max(0.0, fit.other_s - z * fit.other_sd_s), fit.other_s,
                   fit.other_s + z * fit.other_sd_s};

  Prediction p;
  p.nodes = nodes;
  const NetworkCandidate& best = fit.candidates.front();
  const Band best_network = NetworkBand(fit, best, nodes);
  p.compute_s = compute.point;
  p.network_s = best_network.point;
  p.other_s = other.point;
  p.step_s = other.point + Core(compute.point, best_network.point, best.gamma);
  double lo = p.step_s, hi = p.step_s;
  for (const NetworkCandidate& c : fit.candidates) {
    const Band network = NetworkBand(fit, c, nodes);
    lo = std::min(lo, other.lo + Core(compute.lo, network.lo, c.gamma));
    hi = std::max(hi, other.hi + Core(compute.hi, network.hi, c.gamma));
  }
  // Model error grows with the distance to the nearest observed size.
  double doublings = std::numeric_limits<double>::infinity();
  for (int n : fit.observed_nodes) {
    doublings = std::min(doublings, std::fabs(std::log2(static_cast<double>(nodes) / n)));
  }
  if (!std::isfinite(doublings)) doublings = 0;
  const double widen = 1 + fit.options.model_error_per_doubling * doublings;
  p.step_lo_s = std::max(lo / widen, p.step_s / kMaxBandRatio);
  p.step_hi_s = hi * widen;
  const double g = static_cast<double>(shape.global_batch);
  p.samples_per_s = p.step_s > 0 ? g / p.step_s : 0;
  p.lo = g / p.step_hi_s;
  p.hi = p.step_lo_s > 0 ? g / p.step_lo_s : p.samples_per_s;
  return p;
}

absl::StatusOr<std::vector<Prediction>> PredictCurve(const ScalingFit& fit, const JobShape& shape,
                                                     int min_nodes, int max_nodes,
                                                     absl::Span<const int> sizes) {
  if (fit.candidates.empty()) {
    return absl::FailedPreconditionError("the fit has no model (use FitScalingModel)");
  }
  if (shape.global_batch < 1 || shape.global_batch > kMaxBatch) {
    return absl::InvalidArgumentError(absl::StrCat("shape.global_batch = ", shape.global_batch,
                                                   " must be in [1, ", kMaxBatch, "]"));
  }
  if (shape.logical_workers < 1 || shape.logical_workers > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape.logical_workers = ", shape.logical_workers, " must be in [1, ", kMaxWorldSize, "]"));
  }
  if (min_nodes < 1 || min_nodes > max_nodes || max_nodes > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_nodes = ", min_nodes, ", max_nodes = ", max_nodes,
                     ": need 1 <= min_nodes <= max_nodes <= ", kMaxWorldSize));
  }
  std::vector<int> ns;
  if (sizes.empty()) {
    for (int n = min_nodes; n <= max_nodes; ++n) ns.push_back(n);
  } else {
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] < min_nodes || sizes[i] > max_nodes) {
        return absl::InvalidArgumentError(absl::StrCat("sizes[", i, "] = ", sizes[i],
                                                       " must be in [min_nodes = ", min_nodes,
                                                       ", max_nodes = ", max_nodes, "]"));
      }
      ns.push_back(sizes[i]);
    }
    std::sort(ns.begin(), ns.end());
    ns.erase(std::unique(ns.begin(), ns.end()), ns.end());
  }
  std::vector<Prediction> curve;
  curve.reserve(ns.size());
  for (int n : ns) curve.push_back(Predict(fit, shape, n));
  return curve;
}

}  // namespace malle::advisor
