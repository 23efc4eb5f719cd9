// Test-only: a synthetic elastic job whose true step-time function is known.
//
// Steps are generated from (a, b, c, d, gamma, e) as scaling_model.h defines
// them, with multiplicative log-normal noise per phase, and optional injected
// outliers: slow steps, slow steps after a resize, warm-up steps.
//
//   SyntheticJob job(kResnet, {512, 16}, /*seed=*/1);
//   job.Run(advisor.get(), /*nodes=*/4, /*steps=*/100, {});
//
// Thread-safety: not thread-safe (one generator per test).
#ifndef MALLE_TESTS_CPP_ADVISOR_SYNTHETIC_JOB_H_
#define MALLE_TESTS_CPP_ADVISOR_SYNTHETIC_JOB_H_

#include <cmath>
#include <cstdint>
#include <random>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "libmalle/advisor/advisor.h"
#include "libmalle/advisor/scaling_model.h"
#include "libmalle/advisor/step_sample.h"

namespace malle::advisor::testing {

struct TrueModel {
  double a = 0;  // s
  double b = 0;  // s per sample
  double c = 0;  // s
  double d = 0;  // s per node
  double gamma = 1;
  double e = 0;  // s (data + optimizer)
};

inline double TrueCompute(const TrueModel& m, double batch) { return m.a + m.b * batch; }
inline double TrueNetwork(const TrueModel& m, int n) { return n <= 1 ? 0 : m.c + m.d * (n - 1); }
inline double TrueCore(const TrueModel& m, double compute, double network) {
  return std::pow(std::pow(compute, m.gamma) + std::pow(network, m.gamma), 1 / m.gamma);
}
inline double TrueStep(const TrueModel& m, const JobShape& shape, int n) {
  const double batch = SlowestLocalBatch(shape.global_batch, shape.logical_workers, n);
  return m.e + TrueCore(m, TrueCompute(m, batch), TrueNetwork(m, n));
}
inline double TrueThroughput(const TrueModel& m, const JobShape& shape, int n) {
  return shape.global_batch / TrueStep(m, shape, n);
}

// An aggregated observation at n with the true values times (1 + jitter) and
// standard errors of `se` (relative). Measured on the busiest rank.
inline Observation TrueObservation(const TrueModel& m, const JobShape& shape, int n,
                                   double jitter = 0, double se = 0.005) {
  Observation o;
  o.nodes = n;
  o.slowest_batch = SlowestLocalBatch(shape.global_batch, shape.logical_workers, n);
  o.local_batch = o.slowest_batch;
  o.global_batch = static_cast<double>(shape.global_batch);
  const double compute = TrueCompute(m, o.slowest_batch);
  const double core = TrueCore(m, compute, TrueNetwork(m, n));
  o.compute_s = compute * (1 + jitter);
  o.network_s = (core - compute) * (1 + jitter);
  o.other_s = m.e * (1 + jitter);
  o.step_s = o.compute_s + o.network_s + o.other_s;
  o.compute_se_s = se * o.compute_s;
  o.network_se_s = se * o.network_s;
  o.other_se_s = se * o.other_s;
  o.steps = 64;
  return o;
}

struct Outliers {
  int slow_every = 0;  // every k-th steady step is slow_factor times slower (0: none)
  double slow_factor = 5;
  int slow_after_resize = 0;  // the first k steps after a resize are 3x slower
  int warmup_steps = 0;       // the job's first k steps are flagged warm-up and 4x slower
  absl::Duration pause = absl::ZeroDuration();  // pause of a resize into this run
  bool failure = false;                         // that resize was caused by a failure
};

class SyntheticJob {
 public:
  SyntheticJob(TrueModel model, JobShape shape, uint64_t seed, double noise = 0.03)
      : model_(model), shape_(shape), rng_(seed), noise_(noise) {}

  // One step at n, as measured on a rank running `workers` logical workers
  // (0: the busiest rank, ceil(L / n)); all phases scaled by `factor`.
  StepSample Sample(int n, double factor = 1, int workers = 0) {
    const int busiest = (shape_.logical_workers + n - 1) / n;
    if (workers == 0) workers = busiest;
    const double per_worker = static_cast<double>(shape_.global_batch) / shape_.logical_workers;
    const double slow_batch = busiest * per_worker;
    const double own_batch = workers * per_worker;
    const double slow_compute = TrueCompute(model_, slow_batch) * Noise();
    const double own_compute =
        slow_compute * TrueCompute(model_, own_batch) / TrueCompute(model_, slow_batch);
    const double core_compute = TrueCompute(model_, slow_batch);
    const double exposed =
        (TrueCore(model_, core_compute, TrueNetwork(model_, n)) - core_compute) * Noise();
    // A rank with less work waits for the busiest one inside the all-reduce.
    const double wait = slow_compute - own_compute;
    StepSample s;
    s.step = step_++;
    s.world_size = n;
    s.logical_workers = shape_.logical_workers;
    s.global_batch = shape_.global_batch;
    s.local_batch = static_cast<int64_t>(std::llround(own_batch));
    s.data_wait = absl::Seconds(0.3 * model_.e * Noise() * factor);
    s.compute = absl::Seconds(own_compute * factor);
    s.comm = absl::Seconds((exposed + wait) * factor);
    s.optimizer = absl::Seconds(0.7 * model_.e * Noise() * factor);
    s.total = s.data_wait + s.compute + s.comm + s.optimizer;
    return s;
  }

  // Runs `steps` steps at n. A change of n starts with a resize step.
  void Run(Advisor* advisor, int n, int steps, const Outliers& outliers, int workers = 0) {
    const bool resize = current_ != 0 && current_ != n;
    for (int i = 0; i < steps; ++i) {
      double factor = 1;
      const bool warmup = total_steps_ < outliers.warmup_steps;
      if (warmup) factor = 4;
      if (resize && i < outliers.slow_after_resize) factor = 3;
      if (outliers.slow_every > 0 && i % outliers.slow_every == outliers.slow_every - 1) {
        factor = outliers.slow_factor;
      }
      StepSample s = Sample(n, factor, workers);
      s.warmup = warmup;
      if (resize && i == 0) {
        s.after_resize = true;
        s.after_failure = outliers.failure;
        s.resize_pause = outliers.pause;
      }
      ASSERT_TRUE(advisor->Record(s).ok()) << "step " << s.step;
      ++total_steps_;
    }
    current_ = n;
  }

  int64_t step() const { return step_; }

 private:
  double Noise() { return std::exp(noise_ * normal_(rng_)); }

  TrueModel model_;
  JobShape shape_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0.0, 1.0};
  double noise_;
  int64_t step_ = 0;
  int64_t total_steps_ = 0;
  int current_ = 0;
};

// Jobs used across the tests. G = 512, L = 16.
inline constexpr JobShape kShape{512, 16};
// Compute-bound, communication adds (gamma 1). X(1) ~ 1190, X(16) ~ 4080 samples/s.
inline constexpr TrueModel kComputeBound{0.010, 0.0008, 0.020, 0.004, 1.0, 0.010};
// Communication-heavy: throughput peaks near 8 nodes and then falls.
inline constexpr TrueModel kCommHeavy{0.005, 0.0002, 0.030, 0.010, 1.0, 0.005};
// Communication overlaps compute (gamma 2).
inline constexpr TrueModel kOverlapped{0.010, 0.0006, 0.030, 0.008, 2.0, 0.010};

}  // namespace malle::advisor::testing

#endif  // MALLE_TESTS_CPP_ADVISOR_SYNTHETIC_JOB_H_
