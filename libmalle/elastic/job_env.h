// JobEnv: the identity a launcher gives a rank process, from the environment.
//
// Reads exactly what malletrain.elastic.ElasticJob reads, so C++ and Python
// programs run under the same launcher (`malletrain local`, the allocator's
// node agent):
//   MALLE_STORE           host:port of the control store (required)
//   MALLE_JOB_ID          job id (default "local")
//   MALLE_MEMBER_ID       member id (default <hostname>-<pid>-<8 hex>)
//   MALLE_BOOTSTRAP_SIZE  size of generation 0 (default 0: join a running job)
//
//   MALLE_ASSIGN_OR_RETURN(JobEnv env, ReadJobEnv());
//   MALLE_ASSIGN_OR_RETURN(auto store, ConnectStore(env, absl::Seconds(60)));
//   comm::ElasticGroupOptions options = env.GroupOptions();
//
// Thread-safety: ReadJobEnv reads the environment (not thread-safe against
// setenv); the rest are pure or block only on the connection.
#ifndef MALLE_ELASTIC_JOB_ENV_H_
#define MALLE_ELASTIC_JOB_ENV_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/comm/elastic_group.h"

namespace malle::elastic {

struct JobEnv {
  std::string store_host;
  int store_port = 0;
  std::string job_id = "local";
  std::string member_id;
  int bootstrap_size = 0;

  // job_id, member_id and bootstrap_size set; the timeouts at their defaults.
  comm::ElasticGroupOptions GroupOptions() const;
};

// Errors: kInvalidArgument naming the variable (missing store, not host:port,
// a non-integer bootstrap size).
absl::StatusOr<JobEnv> ReadJobEnv();

// Connects to env's store (retrying until `timeout`). Errors: ControlStore::Connect's.
absl::StatusOr<std::shared_ptr<comm::ControlStore>> ConnectStore(const JobEnv& env, absl::Duration timeout);

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_JOB_ENV_H_
