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

#include <cstdint>
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

// --- Ranks started by the launchers users already have (docs/elastic.md) -------
//
// A script that calls malletrain.init() (or ReadLaunchEnv() in C++) also runs
// unchanged under torchrun and under srun: their variables are translated into
// the contract above, as a fixed-size job of WORLD_SIZE (SLURM_NTASKS) ranks.
// Precedence: MALLE_STORE set -> malletrain's own launchers and agents (the
// variables below are ignored); else RANK or WORLD_SIZE set -> torchrun (or any
// launcher that follows torch's env:// convention); else SLURM_PROCID set inside
// a step (SLURM_STEP_ID) -> srun. The other MALLE_* variables (job id, member id,
// backend, park dir, ...) apply under every launcher.
inline constexpr char kTorchRank[] = "RANK";
inline constexpr char kTorchWorldSize[] = "WORLD_SIZE";
inline constexpr char kTorchMasterAddr[] = "MASTER_ADDR";
inline constexpr char kTorchMasterPort[] = "MASTER_PORT";
inline constexpr char kTorchRunId[] = "TORCHELASTIC_RUN_ID";                  // torchrun only
inline constexpr char kTorchRestartCount[] = "TORCHELASTIC_RESTART_COUNT";    // torchrun only
inline constexpr char kTorchUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";  // "True": torchrun hosts a store
inline constexpr char kSlurmProcId[] = "SLURM_PROCID";
inline constexpr char kSlurmNtasks[] = "SLURM_NTASKS";
inline constexpr char kSlurmStepNumTasks[] = "SLURM_STEP_NUM_TASKS";
inline constexpr char kSlurmLocalId[] = "SLURM_LOCALID";
inline constexpr char kSlurmNodeId[] = "SLURM_NODEID";
inline constexpr char kSlurmStepTasksPerNode[] = "SLURM_STEP_TASKS_PER_NODE";
inline constexpr char kSlurmStepNodeList[] = "SLURM_STEP_NODELIST";
inline constexpr char kSlurmJobNodeList[] = "SLURM_JOB_NODELIST";
inline constexpr char kSlurmJobId[] = "SLURM_JOB_ID";
inline constexpr char kSlurmStepId[] = "SLURM_STEP_ID";

// Which launcher started this rank.
enum class Launcher { kMalle, kTorchrun, kSlurm };
const char* LauncherName(Launcher launcher);  // "malletrain", "torchrun", "srun"

struct LaunchEnv {
  Launcher launcher = Launcher::kMalle;
  // The contract, translated: store, job id, member id, bootstrap size (the
  // world size: a fixed-size job) and whatever MALLE_* variables were also set.
  RankEnv rank;
  int global_rank = -1;  // RANK / SLURM_PROCID; -1 under malletrain's launchers
  int world_size = 0;    // WORLD_SIZE / SLURM_NTASKS; 0 under malletrain's launchers
  int local_rank = -1;   // LOCAL_RANK / SLURM_LOCALID; -1 when not given
  // This process must host the control store (a TCPStore server listening on
  // store_bind:rank.store_port()) before it connects: global rank 0, unless
  // torchrun's agent already hosts one at MASTER_ADDR:MASTER_PORT.
  bool host_store = false;
  std::string store_bind;  // an IPv4 address; "0.0.0.0" when the store host is a name
  std::string store_from;  // where the address came from, for messages
};

// Reads whichever launcher's variables are present (the precedence above) and
// validates them. Errors: kInvalidArgument naming the variable, e.g. RANK >=
// WORLD_SIZE, WORLD_SIZE without MASTER_ADDR, MASTER_PORT=0, a malformed
// SLURM_STEP_NODELIST, MALLE_BOOTSTRAP_SIZE differing from the world size, and
// ReadRankEnv's errors (no launcher at all: MALLE_STORE missing).
absl::StatusOr<LaunchEnv> ReadLaunchEnv(const EnvLookup& lookup = ProcessEnv);

// The first host of a Slurm hostlist ("nid00[0100-0103,0200],login" ->
// "nid000100"). kInvalidArgument on a malformed or empty list.
absl::StatusOr<std::string> FirstSlurmHost(const std::string& hostlist);

// The number of tasks on node `node` (SLURM_NODEID) of a Slurm tasks-per-node
// list ("2(x3),1": 2 tasks on nodes 0-2, 1 on node 3). kInvalidArgument on a
// malformed list or a node beyond it.
absl::StatusOr<int> SlurmTasksOnNode(const std::string& tasks_per_node, int node);

// The store port of an srun step without MASTER_PORT:
// 10000 + (job_id * 8 + step_id % 8) % 20000, in [10000, 29999] (below Linux's
// ephemeral range): distinct for 8 steps of a job and for nearby job ids.
int SlurmStorePort(int64_t job_id, int64_t step_id);

}  // namespace malle::cluster

#endif  // MALLE_CLUSTER_RANK_ENV_H_
