#include "libmalle/advisor/resize_cost.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace malle::advisor {

absl::string_view ResizeDirectionName(ResizeDirection direction) {
  switch (direction) {
    case ResizeDirection::kGrow:
      return "grow";
    case ResizeDirection::kShrink:
      return "shrink";
    case ResizeDirection::kFailure:
      return "failure";
  }
  return "unknown";
}

ResizeDirection ClassifyResize(int previous_nodes, int nodes, bool after_failure) {
  if (after_failure) return ResizeDirection::kFailure;
  if (previous_nodes > 0 && nodes < previous_nodes) return ResizeDirection::kShrink;
  return ResizeDirection::kGrow;
}

ResizeCostTracker::ResizeCostTracker(int window) : window_(std::max(1, window)) {}

absl::Status ResizeCostTracker::Add(ResizeDirection direction, absl::Duration pause) {
  if (pause < absl::ZeroDuration() || pause == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("resize pause = ", absl::FormatDuration(pause), " must be finite and >= 0"));
  }
  Ring& ring = rings_[static_cast<int>(direction)];
  if (static_cast<int>(ring.values.size()) < window_) {
    ring.values.push_back(pause);
  } else {
    ring.values[ring.next] = pause;
    ring.next = (ring.next + 1) % ring.values.size();
  }
  ++ring.count;
  ring.last = pause;
  return absl::OkStatus();
}

std::optional<ResizeCostStats> ResizeCostTracker::Stats(ResizeDirection direction) const {
  const Ring& ring = rings_[static_cast<int>(direction)];
  if (ring.count == 0) return std::nullopt;
  std::vector<absl::Duration> sorted = ring.values;
  std::sort(sorted.begin(), sorted.end());
  const size_t k = sorted.size();
  ResizeCostStats stats;
  stats.count = ring.count;
  stats.last = ring.last;
  stats.median = k % 2 == 1 ? sorted[k / 2] : (sorted[k / 2 - 1] + sorted[k / 2]) / 2;
  // Nearest rank: the smallest value with at least 90% of the pauses <= it.
  const size_t rank = (9 * k + 9) / 10;  // ceil(0.9 k), >= 1
  stats.p90 = sorted[rank - 1];
  return stats;
}

}  // namespace malle::advisor
