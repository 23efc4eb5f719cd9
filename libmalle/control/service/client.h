// Client: the allocator's API for programs that submit jobs (NAS and HPO
// frameworks, `malletrain submit`, `malletrain status`).
//
//   MALLE_ASSIGN_OR_RETURN(Secret secret, LoadSecret("/etc/malle/secret"));
//   MALLE_ASSIGN_OR_RETURN(auto client, Client::Connect("127.0.0.1", 29400, secret));
//   JobSubmit trial;
//   trial.job = "trial-07";
//   trial.command = {"python", "train.py", "--width", "64"};
//   trial.min_nodes = 1, trial.max_nodes = 4, trial.logical_workers = 4;
//   MALLE_RETURN_IF_ERROR(client->Submit(trial));
//   MALLE_ASSIGN_OR_RETURN(JobView v, client->WaitUntilEnded("trial-07", absl::Hours(2)));
//   MALLE_ASSIGN_OR_RETURN(std::optional<advisor::AdvisorReport> r, client->Report("trial-07"));
//
// What a client reads is what the allocator published (its status document,
// every status_interval, and each job's latest advisor report), after
// checking the HMAC: a view that may lag the allocator by that interval.
// Submit and Cancel are control messages; their effect shows in the status
// (a refused submission appears as the allocator's last_rejection).
//
// Thread-safety: a Client may be shared; calls serialise on its store
// connection.
#ifndef MALLE_CONTROL_CLIENT_H_
#define MALLE_CONTROL_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libmalle/advisor/report.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/control/service/channel.h"
#include "libmalle/control/wire/messages.h"
#include "libmalle/control/wire/secret.h"

namespace malle::control {

// One job as the allocator's status document shows it.
struct JobView {
  std::string job;
  std::string phase;  // queued, running, succeeded, failed, cancelled
  int nodes = 0;          // planned
  int running_nodes = 0;  // whose agents say they run it
  double samples_per_s = 0;
  int64_t step = 0;
  int64_t steps = 0, samples = 0;  // when it ended
  std::string message;
  bool ended() const { return phase != "queued" && phase != "running"; }
};

struct ClientOptions {
  std::string sender;  // default "client.<host>.<pid>.<random>"
  absl::Duration connect_timeout = absl::Seconds(30);
  absl::Duration poll_interval = absl::Milliseconds(200);
};

class Client {
 public:
  // Errors: the store's (kUnavailable, kDeadlineExceeded), kInvalidArgument.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& host, int port, Secret secret,
                                                         ClientOptions options = {});
  static absl::StatusOr<std::unique_ptr<Client>> Over(std::shared_ptr<comm::ControlStore> store,
                                                      Secret secret, ClientOptions options = {});

  // Sends a submission / a cancellation. kInvalidArgument for an invalid
  // message (min > max, a bad id, ...: nothing is sent), the store's errors.
  absl::Status Submit(const JobSubmit& job);
  absl::Status Cancel(const std::string& job, const std::string& reason);

  // The allocator's status document (JSON object text). kNotFound before the
  // allocator has published one; kUnauthenticated if it does not verify.
  absl::StatusOr<std::string> StatusJson();
  // Every job in the status document.
  absl::StatusOr<std::vector<JobView>> Jobs();
  // One job; kNotFound if the status does not list it (yet).
  absl::StatusOr<JobView> Job(const std::string& job);
  // Polls until the job has ended; kDeadlineExceeded after `timeout`.
  absl::StatusOr<JobView> WaitUntilEnded(const std::string& job, absl::Duration timeout);
  // The job's latest advisor report as published by the allocator; nullopt
  // if it has sent none.
  absl::StatusOr<std::optional<advisor::AdvisorReport>> Report(const std::string& job);

 private:
  Client(std::shared_ptr<comm::ControlStore> store, Secret secret, ClientOptions options);
  std::shared_ptr<comm::ControlStore> store_;
  Secret secret_;
  ClientOptions options_;
  Outbox outbox_;
};

// Parses the status document's job list. kInvalidArgument if malformed.
absl::StatusOr<std::vector<JobView>> ParseJobViews(absl::string_view status_json);

}  // namespace malle::control

#endif  // MALLE_CONTROL_CLIENT_H_
