// ReportSink: where a job sends what its profiling advisor learned and that
// it completed. The elastic engine calls it; the control plane implements it
// (signed messages to the allocator), so the engine needs no upward
// dependency on control/. Without a sink, reports stay in the job.
//
// Thread-safety: implementations must accept calls from any one thread at a
// time (the engine's reporter thread and its training thread never call at
// once: the engine serialises them).
#ifndef MALLE_ADVISOR_REPORT_SINK_H_
#define MALLE_ADVISOR_REPORT_SINK_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace malle::advisor {

class ReportSink {
 public:
  virtual ~ReportSink() = default;
  // The advisor's report (report_json.h's format). May block on I/O.
  virtual absl::Status SendReport(const std::string& report_json) = 0;
  // The job trained all its steps (`samples` of them in all). May block on I/O.
  virtual absl::Status SendComplete(int64_t steps, int64_t samples) = 0;
  // The job lost its last member and parked its state at `step` (`bytes`,
  // written in `seconds`); it resumes there when it gets nodes again.
  virtual absl::Status SendParked(int64_t step, int64_t bytes, double seconds) {
    (void)step, (void)bytes, (void)seconds;
    return absl::OkStatus();
  }
};

}  // namespace malle::advisor

#endif  // MALLE_ADVISOR_REPORT_SINK_H_
