#include "libmalle/advisor/step_sample.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libmalle/base/check.h"

namespace malle::advisor {
namespace {

absl::Status CheckDuration(absl::string_view name, absl::Duration d) {
  if (d == absl::InfiniteDuration() || d == -absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " = ", absl::FormatDuration(d), " must be finite and >= 0"));
  }
  if (d < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " = ", absl::FormatDuration(d), " must be >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Validate(const StepSample& s) {
  if (s.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step = ", s.step, " must be >= 0"));
  }
  if (s.world_size < 1 || s.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size = ", s.world_size, " must be in [1, ", kMaxWorldSize, "]"));
  }
  if (s.logical_workers < 1 || s.logical_workers > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("logical_workers = ", s.logical_workers,
                                                   " must be in [1, ", kMaxWorldSize, "]"));
  }
  if (s.global_batch < 1 || s.global_batch > kMaxBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("global_batch = ", s.global_batch, " must be in [1, ", kMaxBatch, "]"));
  }
  if (s.local_batch < 1 || s.local_batch > s.global_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local_batch = ", s.local_batch, " must be in [1, global_batch = ", s.global_batch, "]"));
  }
  const struct {
    absl::string_view name;
    absl::Duration value;
  } durations[] = {
      {"data_wait", s.data_wait}, {"compute", s.compute},           {"comm", s.comm},
      {"optimizer", s.optimizer}, {"resize_pause", s.resize_pause}, {"total", s.total}};
  for (const auto& d : durations) {
    if (absl::Status st = CheckDuration(d.name, d.value); !st.ok()) return st;
  }
  if (s.total <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("total = ", absl::FormatDuration(s.total), " must be > 0"));
  }
  const absl::Duration phases = s.data_wait + s.compute + s.comm + s.optimizer;
  const absl::Duration allowed =
      s.total + std::max(kPhaseSumAbsoluteTolerance, s.total * kPhaseSumRelativeTolerance);
  if (phases > allowed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "total = ", absl::FormatDuration(s.total),
        " must be >= data_wait + compute + comm + optimizer = ", absl::FormatDuration(phases),
        " (tolerance ", absl::FormatDuration(allowed - s.total), ")"));
  }
  if (s.resize_pause > absl::ZeroDuration() && !s.after_resize) {
    return absl::InvalidArgumentError(
        absl::StrCat("resize_pause = ", absl::FormatDuration(s.resize_pause),
                     " must be 0 unless after_resize is true"));
  }
  if (s.after_failure && !s.after_resize) {
    return absl::InvalidArgumentError("after_failure = true requires after_resize = true");
  }
  return absl::OkStatus();
}

double SlowestLocalBatch(int64_t global_batch, int logical_workers, int world_size) {
  MALLE_CHECK(global_batch >= 1 && logical_workers >= 1 && world_size >= 1)
      << "global_batch " << global_batch << " logical_workers " << logical_workers << " world_size "
      << world_size;
  const int64_t per_rank = (logical_workers + world_size - 1) / world_size;  // ceil(L / n)
  return static_cast<double>(per_rank) * static_cast<double>(global_batch) / logical_workers;
}

}  // namespace malle::advisor
