// CreateRankEngine: the engine of a rank that a launcher or node agent
// started, set up from the rank's environment, for both APIs.
//
// What the process was told (cluster::RankEnv: MALLE_* or torchrun's / srun's
// variables) fills in what the program does not choose itself: the job and
// member ids, the bootstrap size and node (the group options), the backend,
// the allocator's node range, the park store (MALLE_PARK_DIR, signed with the
// deployment secret), and, when the allocator started the job
// (MALLE_CONTROL_JOB + MALLE_CONTROL_SECRET), the report sink through which
// the advisor's reports, the job's completion and its parks reach the
// allocator as signed messages. The Python binding and C++ programs
// (ElasticTrainer over it) call the same function, so a C++ job under an
// agent reports, parks and resumes as a Python one does.
//
//   MALLE_ASSIGN_OR_RETURN(cluster::LaunchEnv launch, cluster::ReadLaunchEnv());
//   RankEngineOptions o;
//   o.engine.logical_workers = 4;
//   MALLE_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, CreateRankEngine(launch.rank, o));
//
// Thread-safety: a pure factory.
#ifndef MALLE_ELASTIC_RANK_ENGINE_H_
#define MALLE_ELASTIC_RANK_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "libmalle/cluster/rank_env.h"
#include "libmalle/comm/elastic_group.h"
#include "libmalle/elastic/engine.h"

namespace malle::elastic {

// Tuning and test knobs a rank reads besides the contract (cluster/rank_env.h);
// none of them is needed to run.
inline constexpr char kEnvStateDirectMinBytes[] = "MALLE_STATE_DIRECT_MIN_BYTES";  // EngineOptions field
inline constexpr char kEnvFirstBucketBytes[] = "MALLE_FIRST_BUCKET_BYTES";        // EngineOptions field
inline constexpr char kEnvReportInterval[] = "MALLE_REPORT_INTERVAL";              // seconds
inline constexpr char kEnvFaultExitInStateSync[] = "MALLE_FAULT_EXIT_IN_STATE_SYNC";  // tests: a member id

struct RankEngineOptions {
  // Timeouts, heartbeats, recovery (the ids, bootstrap size and node come
  // from the environment; max_size from the logical workers).
  comm::ElasticGroupOptions group;
  // What the program chooses (logical workers, seed, deterministic, buckets,
  // snapshots, resume_from, ...). From the environment: `backend` when empty
  // (MALLE_BACKEND, else "gloo"), `min_nodes`/`max_nodes` and
  // `ranks_per_node` when given there, and, unless set here, `advisor_job`,
  // `secret`, `park_store` and `report_sink`; the knobs above when set.
  EngineOptions engine;

  RankEngineOptions() { engine.backend.clear(); }
};

// Checks every option before it dials the control store (which waits up to
// group.rendezvous_timeout), then connects and creates the engine (joining
// is deferred to its first NextStep()). Blocks for the connection. Errors:
// kInvalidArgument naming the field or variable (bootstrap size above the
// logical workers, a malformed knob, an unreadable secret, ...), the park
// store's (an unusable directory), the store's (kUnavailable /
// kDeadlineExceeded).
absl::StatusOr<std::unique_ptr<Engine>> CreateRankEngine(const cluster::RankEnv& env, RankEngineOptions options,
                                                         const cluster::EnvLookup& lookup = cluster::ProcessEnv);

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_RANK_ENGINE_H_
