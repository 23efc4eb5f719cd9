#include "libmalle/control/service/client.h"

#include <unistd.h>

#include <random>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libmalle/advisor/report_json.h"
#include "libmalle/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace malle::control {
namespace {

std::string DefaultSender() {
  char host[64] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string h;
  for (const char* c = host; *c != '\0' && h.size() < 40; ++c) {
    if (std::isalnum(static_cast<unsigned char>(*c)) || *c == '-') h.push_back(*c);
  }
  std::random_device rd;
  return absl::StrCat("client.", h.empty() ? "host" : h, ".", ::getpid(), ".", rd() % 1000000);
}

}  // namespace

Client::Client(std::shared_ptr<comm::ControlStore> store, Secret secret, ClientOptions options)
    : store_(store), secret_(secret), options_(std::move(options)),
      outbox_(std::move(store), std::move(secret), options_.sender) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Over(std::shared_ptr<comm::ControlStore> store, Secret secret,
                                                     ClientOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("Client: null store");
  if (options.sender.empty()) options.sender = DefaultSender();
  MALLE_RETURN_IF_ERROR(ValidateId("ClientOptions.sender", options.sender));
  return std::unique_ptr<Client>(new Client(std::move(store), std::move(secret), std::move(options)));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& host, int port, Secret secret,
                                                        ClientOptions options) {
  MALLE_ASSIGN_OR_RETURN(std::shared_ptr<comm::ControlStore> store,
                         comm::ControlStore::Connect(host, port, options.connect_timeout));
  return Over(std::move(store), std::move(secret), std::move(options));
}

absl::Status Client::Submit(const JobSubmit& job) { return outbox_.Send(job); }

absl::Status Client::Cancel(const std::string& job, const std::string& reason) {
  return outbox_.Send(JobCancel{job, reason});
}

absl::StatusOr<std::string> Client::StatusJson() {
  MALLE_ASSIGN_OR_RETURN(std::optional<Envelope> doc, ReadDocument(*store_, keys::kStatus, secret_, absl::Now()));
  if (!doc) return absl::NotFoundError("the allocator has not published a status yet");
  const auto* status = std::get_if<AllocatorStatus>(&doc->message);
  if (status == nullptr) return absl::InvalidArgumentError("the status key holds another message type");
  return status->status_json;
}

absl::StatusOr<std::vector<JobView>> ParseJobViews(absl::string_view status_json) {
  nlohmann::json doc = nlohmann::json::parse(status_json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("jobs") || !doc["jobs"].is_array()) {
    return absl::InvalidArgumentError("status: expected an object with a \"jobs\" array");
  }
  std::vector<JobView> out;
  for (const nlohmann::json& j : doc["jobs"]) {
    JobView v;
    try {
      v.job = j.at("job").get<std::string>();
      v.phase = j.at("phase").get<std::string>();
      v.nodes = static_cast<int>(j.at("nodes").size());
      v.running_nodes = j.at("running_nodes").get<int>();
      v.samples_per_s = j.at("samples_per_s").get<double>();
      v.step = j.at("step").get<int64_t>();
      v.steps = j.value("steps", int64_t{0});
      v.samples = j.value("samples", int64_t{0});
      v.message = j.value("message", std::string());
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("status: jobs[", out.size(), "]: ", e.what()));
    }
    out.push_back(std::move(v));
  }
  return out;
}

absl::StatusOr<std::vector<JobView>> Client::Jobs() {
  MALLE_ASSIGN_OR_RETURN(std::string json, StatusJson());
  return ParseJobViews(json);
}

absl::StatusOr<JobView> Client::Job(const std::string& job) {
  MALLE_ASSIGN_OR_RETURN(std::vector<JobView> jobs, Jobs());
  for (JobView& v : jobs) {
    if (v.job == job) return std::move(v);
  }
  return absl::NotFoundError(absl::StrCat("job '", job, "' is not in the allocator's status"));
}

absl::StatusOr<JobView> Client::WaitUntilEnded(const std::string& job, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<JobView> v = Job(job);
    if (v.ok() && v->ended()) return v;
    if (!v.ok() && v.status().code() != absl::StatusCode::kNotFound) return v.status();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("job '", job, "' did not end within ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(options_.poll_interval);
  }
}

absl::StatusOr<std::optional<advisor::AdvisorReport>> Client::Report(const std::string& job) {
  MALLE_ASSIGN_OR_RETURN(std::optional<Envelope> doc,
                         ReadDocument(*store_, keys::ReportKey(job), secret_, absl::Now()));
  if (!doc) return std::optional<advisor::AdvisorReport>();
  const auto* r = std::get_if<AdvisorReport>(&doc->message);
  if (r == nullptr || r->job != job) return absl::InvalidArgumentError("the report key holds something else");
  MALLE_ASSIGN_OR_RETURN(advisor::AdvisorReport report, advisor::ParseReportJson(r->report_json));
  return std::optional<advisor::AdvisorReport>(std::move(report));
}

}  // namespace malle::control
