// StepSample: what the elastic layer measures about one training step, and
// its validation.
//
// Every rank's advisor receives one sample per step. The phase durations
// partition the step as seen by this rank: data wait, forward+backward
// (compute), exposed (non-overlapped) gradient communication and the
// optimizer step; `total` is the wall time of the whole step and may exceed
// their sum by whatever the layer does not time (zero_grad, logging, hooks).
// The resize pause happened *before* the step and is not part of `total`.
//
//   StepSample s;
//   s.step = 1200;
//   s.world_size = 4;
//   s.logical_workers = 16;
//   s.global_batch = 512;
//   s.local_batch = 128;
//   s.compute = absl::Milliseconds(180);
//   s.comm = absl::Milliseconds(25);
//   s.total = absl::Milliseconds(215);
//   MALLE_RETURN_IF_ERROR(Validate(s));
//
// Thread-safety: plain struct; Validate is pure and thread-safe.
#ifndef MALLE_ADVISOR_STEP_SAMPLE_H_
#define MALLE_ADVISOR_STEP_SAMPLE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace malle::advisor {

// Largest world size / logical worker count accepted: far above any real job,
// low enough that a corrupted field cannot make the advisor build a huge curve.
inline constexpr int kMaxWorldSize = 100'000;
// Largest batch accepted (samples per step).
inline constexpr int64_t kMaxBatch = int64_t{1} << 40;

struct StepSample {
  int64_t step = 0;          // training step number, >= 0
  int world_size = 1;        // physical ranks n, in [1, kMaxWorldSize]
  int logical_workers = 1;   // L, in [1, kMaxWorldSize]; the job's fixed data-parallel degree
  int64_t local_batch = 1;   // samples this rank computed, in [1, global_batch]
  int64_t global_batch = 1;  // samples per step, whole job, in [1, kMaxBatch]

  absl::Duration data_wait = absl::ZeroDuration();
  absl::Duration compute = absl::ZeroDuration();       // forward + backward
  absl::Duration comm = absl::ZeroDuration();          // exposed gradient communication
  absl::Duration optimizer = absl::ZeroDuration();     // optimizer step
  absl::Duration resize_pause = absl::ZeroDuration();  // before this step; needs after_resize
  absl::Duration total = absl::ZeroDuration();         // step wall time, > 0

  bool after_resize = false;   // first step of a new membership generation
  bool after_failure = false;  // that resize was caused by a failed rank (needs after_resize)
  bool warmup = false;         // the layer knows this step is not steady state
};

// Tolerance of `total >= data_wait + compute + comm + optimizer`: timers
// started and stopped at slightly different points may overshoot the total by
// a little; more than this means the phases are not what this header says.
inline constexpr double kPhaseSumRelativeTolerance = 0.02;
inline constexpr absl::Duration kPhaseSumAbsoluteTolerance = absl::Milliseconds(1);

// OK or InvalidArgument naming the offending field and its allowed range,
// e.g. `local_batch = 600 must be in [1, global_batch = 512]`. Never blocks.
absl::Status Validate(const StepSample& sample);

// The local batch of the slowest rank at `world_size` ranks: with L logical
// workers of global_batch / L samples each, the busiest rank runs ceil(L / n)
// of them. Requires world_size, logical_workers, global_batch >= 1.
double SlowestLocalBatch(int64_t global_batch, int logical_workers, int world_size);

}  // namespace malle::advisor

#endif  // MALLE_ADVISOR_STEP_SAMPLE_H_
