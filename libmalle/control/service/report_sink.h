// ControlReportSink: an advisor::ReportSink that sends what a job's engine
// reports (advisor reports, completion, parks) to the allocator as signed
// control messages through the inbox (channel.h). The Python binding uses it
// for every rank the agent starts; a C++ training program sets it as
// EngineOptions::report_sink the same way:
//
//   auto sink = std::make_shared<control::ControlReportSink>(
//       store, secret, "rank.w3", /*job=*/"digits", /*runtime_id=*/"digits.i2");
//   options.report_sink = sink;
//
// `job` is the allocator's job id (MALLE_CONTROL_JOB), `runtime_id` the
// incarnation the rank belongs to (the job id in the control store): a park
// names it, so that the allocator tells a late park of an old incarnation from
// its current one's.
//
// Thread-safety: thread-safe (Outbox::Send is).
#ifndef MALLE_CONTROL_SERVICE_REPORT_SINK_H_
#define MALLE_CONTROL_SERVICE_REPORT_SINK_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "libmalle/advisor/report_sink.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/control/service/channel.h"
#include "libmalle/control/wire/messages.h"
#include "libmalle/control/wire/secret.h"

namespace malle::control {

class ControlReportSink : public advisor::ReportSink {
 public:
  // `sender` must be an id unique to this process (Outbox).
  ControlReportSink(std::shared_ptr<comm::ControlStore> store, Secret secret, std::string sender,
                    std::string job, std::string runtime_id);

  // Each blocks for two store round trips. Errors: kInvalidArgument (a value
  // the wire refuses, e.g. a negative step; nothing is sent), the store's
  // errors (kUnavailable, kDeadlineExceeded).
  absl::Status SendReport(const std::string& report_json) override;
  absl::Status SendComplete(int64_t steps, int64_t samples) override;
  absl::Status SendParked(int64_t step, int64_t bytes, double seconds) override;
  // A snapshot made durable in the park store (JobSaved kind snapshot): the
  // allocator shows its age. Not yet called by the engine (ReportSink has no
  // such hook); kept next to SendParked since both are one JobSaved.
  absl::Status SendSnapshot(int64_t step, int64_t bytes, double seconds);

 private:
  absl::Status SendSaved(SaveKind kind, int64_t step, int64_t bytes, double seconds);

  Outbox outbox_;
  std::string job_, runtime_id_;
};

}  // namespace malle::control

#endif  // MALLE_CONTROL_SERVICE_REPORT_SINK_H_
