// ResizeCostTracker: statistics of measured resize pauses, per direction.
//
// A resize pause is the time a job trains nothing while its membership
// changes (measured by the elastic layer, StepSample::resize_pause). Grows,
// shrinks and failure recoveries cost different amounts (a grow broadcasts
// state to the newcomers; a failure first waits for the failure detector), so
// they are kept apart. Median and p90 are over the last `window` pauses of a
// direction: recent resizes predict the next one better than old ones, and
// memory stays bounded.
//
//   ResizeCostTracker costs;
//   MALLE_RETURN_IF_ERROR(costs.Add(ClassifyResize(4, 8, false), absl::Seconds(12)));
//   if (auto grow = costs.Stats(ResizeDirection::kGrow)) use(grow->median);
//
// Thread-safety: not thread-safe; guard a shared tracker externally (Advisor
// does). ClassifyResize and ResizeDirectionName are pure.
#ifndef MALLE_ADVISOR_RESIZE_COST_H_
#define MALLE_ADVISOR_RESIZE_COST_H_

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace malle::advisor {

enum class ResizeDirection { kGrow = 0, kShrink = 1, kFailure = 2 };
inline constexpr int kResizeDirections = 3;

// "grow", "shrink", "failure" (the JSON keys of report_json.h).
absl::string_view ResizeDirectionName(ResizeDirection direction);

// A resize caused by a failed rank is kFailure whatever the sizes; otherwise
// kShrink when the job got smaller and kGrow when it got larger, stayed the
// same size (a replacement joined) or had no previous size (previous_nodes <=
// 0: a start counts as a grow, as in alloc/problem.h).
ResizeDirection ClassifyResize(int previous_nodes, int nodes, bool after_failure);

struct ResizeCostStats {
  int64_t count = 0;      // all pauses ever added in this direction
  absl::Duration median;  // over the last `window` pauses
  absl::Duration p90;     // nearest-rank 90th percentile, same window
  absl::Duration last;
};

class ResizeCostTracker {
 public:
  // `window` >= 1 pauses kept per direction (values < 1 are taken as 1).
  explicit ResizeCostTracker(int window = 64);

  // InvalidArgument when `pause` is negative or infinite (the tracker is
  // unchanged). O(1); never blocks.
  absl::Status Add(ResizeDirection direction, absl::Duration pause);

  // nullopt until a pause of `direction` was added. O(window log window).
  std::optional<ResizeCostStats> Stats(ResizeDirection direction) const;

 private:
  struct Ring {
    std::vector<absl::Duration> values;  // at most window_ entries
    size_t next = 0;                     // slot overwritten when full
    int64_t count = 0;
    absl::Duration last;
  };
  int window_;
  std::array<Ring, kResizeDirections> rings_;
};

}  // namespace malle::advisor

#endif  // MALLE_ADVISOR_RESIZE_COST_H_
