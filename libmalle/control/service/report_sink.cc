#include "libmalle/control/service/report_sink.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace malle::control {

ControlReportSink::ControlReportSink(std::shared_ptr<comm::ControlStore> store, Secret secret,
                                     std::string sender, std::string job, std::string runtime_id)
    : outbox_(std::move(store), std::move(secret), std::move(sender)),
      job_(std::move(job)),
      runtime_id_(std::move(runtime_id)) {}

absl::Status ControlReportSink::SendReport(const std::string& report_json) {
  return outbox_.Send(AdvisorReport{job_, report_json});
}

absl::Status ControlReportSink::SendComplete(int64_t steps, int64_t samples) {
  JobComplete c;
  c.job = job_;
  c.status = JobStatus::kSucceeded;
  c.steps = steps;
  c.samples = samples;
  return outbox_.Send(c);
}

absl::Status ControlReportSink::SendParked(int64_t step, int64_t bytes, double seconds) {
  return SendSaved(SaveKind::kPark, step, bytes, seconds);
}

absl::Status ControlReportSink::SendSnapshot(int64_t step, int64_t bytes, double seconds) {
  return SendSaved(SaveKind::kSnapshot, step, bytes, seconds);
}

absl::Status ControlReportSink::SendSaved(SaveKind kind, int64_t step, int64_t bytes,
                                          double seconds) {
  if (!std::isfinite(seconds)) {
    return absl::InvalidArgumentError(absl::StrCat("body.write_s: expected seconds, got ", seconds));
  }
  JobSaved m;
  m.job = job_;
  m.runtime_id = runtime_id_;
  m.kind = kind;
  m.step = step;
  m.bytes = bytes;
  m.write_time = absl::Microseconds(std::llround(seconds * 1e6));
  return outbox_.Send(m);  // validates first: a bad value is kInvalidArgument naming the field
}

}  // namespace malle::control
