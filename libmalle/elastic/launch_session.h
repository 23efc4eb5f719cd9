// LaunchSession: what a rank of a fixed-size job started by torchrun, srun or
// a hand-made environment (cluster::ReadLaunchEnv) does around its engine,
// and malletrain's own launchers and agents do for their ranks.
//
// No process outlives the ranks there, so task 0 hosts the job's control
// store (unless torchrun's agent already does), and the store must stay up
// until every member of the last generation has finished its last step: at
// the end each member counts itself closed under "malle/job/<id>/closed" and
// the host waits for the last generation's size (bounded) before it lets the
// store go. Under malletrain's launchers both are no-ops.
//
//   MALLE_ASSIGN_OR_RETURN(cluster::LaunchEnv launch, cluster::ReadLaunchEnv());
//   MALLE_ASSIGN_OR_RETURN(auto session, LaunchSession::Open(launch, absl::Seconds(60)));
//   ... Engine / ElasticTrainer over launch.rank, train ...
//   absl::Status closed = session->Close(last_size, absl::Seconds(60));  // after the engine closed
//
// Thread-safety: one thread uses a session.
#ifndef MALLE_ELASTIC_LAUNCH_SESSION_H_
#define MALLE_ELASTIC_LAUNCH_SESSION_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libmalle/cluster/rank_env.h"
#include "libmalle/comm/control_store.h"

namespace malle::elastic {

class LaunchSession {
 public:
  // Starts hosting the control store if `launch.host_store` (listening on
  // launch.store_bind at the store port; `timeout` for its operations).
  // Does not block beyond binding. Errors: kUnavailable / the store's,
  // with the address and where it came from (e.g. "set MASTER_PORT to
  // choose another port").
  static absl::StatusOr<std::unique_ptr<LaunchSession>> Open(const cluster::LaunchEnv& launch,
                                                             absl::Duration timeout);

  // True if this process hosts the job's store.
  bool hosting() const { return hosted_ != nullptr; }
  // The key members count themselves closed under ("" under malletrain's
  // launchers, which need no count).
  const std::string& closed_key() const { return closed_key_; }

  // Once this member is done (its engine closed): counts it closed; the
  // host then waits until `size` members (the last generation's) have, for
  // `timeout` at most, and stops hosting. Blocks. Errors: kDeadlineExceeded
  // naming how many did not close (the store then goes anyway), the store's
  // errors (e.g. kUnavailable: the host is gone, nothing left to wait for).
  // A second call does nothing.
  absl::Status Close(int size, absl::Duration timeout);

 private:
  LaunchSession(const cluster::LaunchEnv& launch, std::shared_ptr<comm::ControlStore> hosted);

  std::string store_host_;
  int store_port_ = 0;
  std::string closed_key_;
  std::shared_ptr<comm::ControlStore> hosted_;  // the server, while hosting
  bool closed_ = false;
};

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_LAUNCH_SESSION_H_
