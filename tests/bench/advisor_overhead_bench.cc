// Advisor overhead per training step (issue 4): target < 1% of the step.
//
// Two measurements in one run, printed side by side with the target:
//  (1) direct: the cost of Advisor::Record() (the only advisor work on the
//      step's path) per call, and of Report() (a fit; in ElasticJob it runs on
//      the reporter thread every MALLE_REPORT_INTERVAL seconds, or at the end),
//      over windows full of realistic samples;
//  (2) A/B in the same run: steps of a fixed CPU-bound work, interleaved
//      with, without, without' (so that slow drifts of a shared machine hit
//      all alike). A "with" step builds its StepSample from its own timings
//      and records it; a reporter thread calls Report() every
//      --report_interval_s, as ElasticJob does. The overhead is the median
//      over blocks of (with - without) / without; the A/A comparison
//      (without' vs without) shows the noise floor.
//
//   build/ci/tests/bench/advisor_overhead_bench --step_ms 20 --blocks 20 --steps 50
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libmalle/advisor/advisor.h"

ABSL_FLAG(double, step_ms, 20, "CPU work per step, in ms (a calibrated busy loop)");
ABSL_FLAG(int, steps, 50, "steps of each kind per block");
ABSL_FLAG(int, blocks, 20, "blocks in the A/B comparison");
ABSL_FLAG(double, report_interval_s, 5, "Report() interval of the reporter thread (ElasticJob: 5 s)");
ABSL_FLAG(int, record_calls, 200000, "Record() calls timed in the direct measurement");

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Work the compiler cannot remove: `iters` rounds of an LCG.
volatile uint64_t g_sink = 0;
void Spin(int64_t iters) {
  uint64_t x = g_sink + 1;
  for (int64_t i = 0; i < iters; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  g_sink = x;
}

// Iterations per ms, the fastest of several tries (a descheduled try is slow).
double Calibrate() {
  double best = 0;
  for (int i = 0; i < 20; ++i) {
    const int64_t iters = 2'000'000;
    const auto t0 = Clock::now();
    Spin(iters);
    best = std::max(best, iters / Ms(Clock::now() - t0));
  }
  return best;
}

malle::advisor::AdvisorOptions Options() {
  malle::advisor::AdvisorOptions o;
  o.job_id = "bench";
  o.min_nodes = 1;
  o.max_nodes = 64;
  return o;
}

// A plausible step at n ranks of a 512-sample, 16-worker job (~20 ms).
malle::advisor::StepSample Sample(int64_t step, int n, std::mt19937_64& rng) {
  std::lognormal_distribution<double> noise(0, 0.03);
  malle::advisor::StepSample s;
  s.step = step;
  s.world_size = n;
  s.logical_workers = 16;
  s.global_batch = 512;
  s.local_batch = 512 / 16 * ((16 + n - 1) / n);
  s.data_wait = absl::Microseconds(300 * noise(rng));
  s.compute = absl::Microseconds((2000 + 500.0 * s.local_batch / 32) * noise(rng));
  s.comm = absl::Microseconds((n > 1 ? 1000 + 300 * (n - 1) : 0) * noise(rng));
  s.optimizer = absl::Microseconds(700 * noise(rng));
  s.total = s.data_wait + s.compute + s.comm + s.optimizer + absl::Microseconds(50);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const double step_ms = absl::GetFlag(FLAGS_step_ms);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int blocks = absl::GetFlag(FLAGS_blocks);
  const double report_interval_s = absl::GetFlag(FLAGS_report_interval_s);
  std::mt19937_64 rng(1);

  // (1) Direct cost. Record(): 16 configurations (every size 1..16), windows
  // full, so every call is the steady-state ring-buffer path.
  auto advisor = malle::advisor::Advisor::Create(Options());
  if (!advisor.ok()) {
    std::fprintf(stderr, "%s\n", advisor.status().ToString().c_str());
    return 1;
  }
  std::vector<malle::advisor::StepSample> samples;
  const int calls = absl::GetFlag(FLAGS_record_calls);
  for (int i = 0; i < calls; ++i) samples.push_back(Sample(i, 1 + (i / 100) % 16, rng));
  const auto r0 = Clock::now();
  for (const auto& s : samples) {
    if (!(*advisor)->Record(s).ok()) return 1;
  }
  const double record_us = 1e3 * Ms(Clock::now() - r0) / calls;
  std::vector<double> report_ms;
  int curve_points = 0;
  for (int i = 0; i < 20; ++i) {
    const auto t0 = Clock::now();
    malle::advisor::AdvisorReport r = (*advisor)->Report();
    report_ms.push_back(Ms(Clock::now() - t0));
    curve_points = static_cast<int>(r.curve.size());
  }
  const double report_med_ms = Median(report_ms);

  // (2) A/B in the same run.
  const int64_t per_ms = static_cast<int64_t>(Calibrate());
  const int64_t iters = static_cast<int64_t>(step_ms * per_ms);
  auto ab_advisor = malle::advisor::Advisor::Create(Options());
  if (!ab_advisor.ok()) return 1;
  std::atomic<bool> reporting{false}, stop{false};  // the reporter runs during (2)
  std::atomic<int64_t> reports{0};
  std::thread reporter([&] {
    // The ElasticJob reporter: a report every interval while "with" blocks run.
    auto next = Clock::now();
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!reporting.load() || Clock::now() < next) continue;
      (*ab_advisor)->Report();
      reports.fetch_add(1);
      next = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(report_interval_s));
    }
  });
  int64_t step = 0;
  reporting.store(true);
  // One block: steps in cycles of three (with, without, without'), the
  // cycle's start rotating per block, so that a drift of the machine within
  // a block hits all three alike. Returns the mean step of each.
  auto block = [&](int k, double* w, double* wo, double* wo2) {
    double sum[3] = {0, 0, 0};
    auto prev_end = Clock::now();
    for (int i = 0; i < 3 * steps; ++i) {
      const int kind = (i + k) % 3;  // 0: with, 1: without, 2: without'
      const auto a = Clock::now();
      Spin(iters);
      const auto b = Clock::now();
      if (kind == 0) {
        malle::advisor::StepSample s;
        s.step = step;
        s.world_size = 1;
        s.logical_workers = 16;
        s.global_batch = 512;
        s.local_batch = 512;
        s.compute = absl::FromChrono(b - a);
        s.total = absl::FromChrono(b - prev_end);
        if (!(*ab_advisor)->Record(s).ok()) std::abort();
      }
      ++step;
      const auto end = Clock::now();
      sum[kind] += Ms(end - prev_end);
      prev_end = end;
    }
    *w = sum[0] / steps;
    *wo = sum[1] / steps;
    *wo2 = sum[2] / steps;
  };
  std::vector<double> overhead, aa, with_ms, without_ms;
  for (int k = 0; k < blocks; ++k) {
    double w, wo, wo2;
    block(k, &w, &wo, &wo2);
    with_ms.push_back(w);
    without_ms.push_back(wo);
    overhead.push_back((w - wo) / wo);
    aa.push_back((wo2 - wo) / wo);
  }
  stop.store(true);
  reporter.join();

  const double target = 0.01;
  const double mean_step_ms = Median(without_ms);
  const double reports_per_step = mean_step_ms / 1e3 / report_interval_s;
  const double direct = (record_us / 1e3 + report_med_ms * reports_per_step) / mean_step_ms;
  std::printf("advisor_overhead_bench: step %.1f ms of CPU work, %d blocks x %d steps, report every %.1f s\n\n",
              step_ms, blocks, steps, report_interval_s);
  std::printf("(1) direct cost                                   measured         target\n");
  std::printf("  Record() per step                              %8.2f us\n", record_us);
  std::printf("  Report() (fit, %2d-point curve, 16 configs)     %8.2f ms\n", curve_points,
              report_med_ms);
  std::printf("  per step: Record + Report / interval           %8.4f %%       < %.0f %%\n",
              100 * direct, 100 * target);
  std::printf("\n(2) same run, with vs without (median of %d blocks)\n", blocks);
  std::printf("  step without advisor                           %8.3f ms\n", mean_step_ms);
  std::printf("  step with advisor                              %8.3f ms\n", Median(with_ms));
  std::printf("  overhead (with - without) / without            %+8.3f %%       < %.0f %%\n",
              100 * Median(overhead), 100 * target);
  std::printf("  noise floor: A/A (without vs without)          %+8.3f %%\n", 100 * Median(aa));
  std::printf("  reports made during the run                    %8lld\n",
              static_cast<long long>(reports.load()));
  const bool ok = direct < target && Median(overhead) < target;
  std::printf("\n%s\n", ok ? "within target" : "OVER TARGET");
  return 0;
}
