// RankEnv: the environment contract between whatever starts a rank process
// (the local launcher, the allocator's node agent, a Slurm script) and the rank.
//
// Defines the names of the variables a rank reads, RankEnv (their parsed,
// validated values), ReadRankEnv (from the environment or any lookup) and
// RankEnvVars (what a starter sets). It is the one place these names are
// spelled: launchers and ranks in C++ use it, Python gets it through the
// binding (malletrain._C.RankEnv), so the two sides cannot drift.
//
//   RankEnv env;                                    // a starter
//   env.store = "127.0.0.1:29400"; env.job_id = "digits.i0"; env.member_id = "n0-0";
//   spec.env = RankEnvVars(env);
//
//   MALLE_ASSIGN_OR_RETURN(RankEnv env, ReadRankEnv());   // the rank
//
// Thread-safety: ReadRankEnv() with the default lookup reads the process
// environment (not thread-safe against setenv); everything else is pure.
#ifndef MALLE_CLUSTER_RANK_ENV_H_
#define MALLE_CLUSTER_RANK_ENV_H_

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace malle::cluster {

// The variables. A rank reads them; a starter sets them (RankEnvVars).
inline constexpr char kEnvStore[] = "MALLE_STORE";                  // host:port of the control store
inline constexpr char kEnvJobId[] = "MALLE_JOB_ID";                 // the job's id in the store
inline constexpr char kEnvMemberId[] = "MALLE_MEMBER_ID";           // this rank's member id
inline constexpr char kEnvBootstrapSize[] = "MALLE_BOOTSTRAP_SIZE";  // size of generation 0; 0: join
inline constexpr char kEnvControlJob[] = "MALLE_CONTROL_JOB";       // the allocator's name of the job
inline constexpr char kEnvControlSecret[] = "MALLE_CONTROL_SECRET";  // path of the deployment secret
inline constexpr char kEnvNode[] = "MALLE_NODE";                    // the node the rank runs on
inline constexpr char kEnvMinNodes[] = "MALLE_MIN_NODES";           // the job's node range
inline constexpr char kEnvMaxNodes[] = "MALLE_MAX_NODES";
inline constexpr char kEnvBackend[] = "MALLE_BACKEND";              // "gloo" or "nccl" (CUDA tensors)
inline constexpr char kEnvParkDir[] = "MALLE_PARK_DIR";             // the job's park store (a directory)
// The rank's place on its node (torchrun's names, which scripts already read):
// a node with N slots runs N ranks, LOCAL_RANK 0..N-1, LOCAL_WORLD_SIZE N. On
// NCCL the rank uses CUDA device LOCAL_RANK (of the devices it sees).
inline constexpr char kEnvLocalRank[] = "LOCAL_RANK";
inline constexpr char kEnvLocalWorldSize[] = "LOCAL_WORLD_SIZE";

// Every variable above, in that order (for docs and for clearing an environment).
std::vector<std::string> RankEnvNames();

// Variables of the deployment's tools, not part of what a rank reads. They are
// spelled here too, so that no starter (CLI, launcher, agent) spells them.
inline constexpr char kEnvSecret[] = "MALLE_SECRET";       // default --secret of the CLI tools
inline constexpr char kEnvLogLevel[] = "MALLE_LOG_LEVEL";  // libmalle's log level (base/log.h)
inline constexpr char kEnvBinDir[] = "MALLE_BIN_DIR";      // where malle-agent etc. are if not in the package

struct RankEnv {
  std::string store;              // "host:port"; required to read
  std::string job_id = "local";
  std::string member_id;          // empty: the rank makes one up (GeneratedMemberId)
  int bootstrap_size = 0;         // >= 0
  std::string control_job;        // empty: not started by the allocator
  std::string control_secret;     // empty: no signed messages to the allocator
  std::string node;
  int min_nodes = 0;              // 0: not given
  int max_nodes = 0;              // 0: not given
  std::string backend;            // empty: the rank's default
  std::string park_dir;           // the job's own park-store directory; empty: none
  int local_rank = 0;             // in [0, local_world_size) when that is given
  int local_world_size = 0;       // ranks on this node (its slots); 0: not given (one)

  // `store` split; only valid after ReadRankEnv or Validate() succeeded.
  std::string store_host() const;
  int store_port() const;

  // kInvalidArgument naming the variable: store not "host:port" (port 1..65535),
  // a negative bootstrap size or node count, min_nodes > max_nodes, a backend
  // other than "", "gloo", "nccl", an id with characters outside [A-Za-z0-9._:-],
  // a local rank outside [0, local_world_size).
  absl::Status Validate() const;
};

// Looks a variable up; nullopt when it is not set. An empty value counts as not set.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
// The process environment (std::getenv).
std::optional<std::string> ProcessEnv(const char* name);

// Reads and validates the contract. Errors: kInvalidArgument naming the
// variable (MALLE_STORE missing or malformed, a non-integer count, ...).
absl::StatusOr<RankEnv> ReadRankEnv(const EnvLookup& lookup = ProcessEnv);

// The variables a starter sets for `env`: every field that is not at its
// default (store, job id, member id and bootstrap size always).
std::vector<std::pair<std::string, std::string>> RankEnvVars(const RankEnv& env);

// "<host>-<pid>-<8 hex>": a member id for a rank started without one.
std::string GeneratedMemberId();

}  // namespace malle::cluster

#endif  // MALLE_CLUSTER_RANK_ENV_H_
