#include "libmalle/cluster/rank_env.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "libmalle/base/status_macros.h"

namespace malle::cluster {
namespace {

// The same rule as comm::ValidateId (membership ids), which this layer cannot link.
absl::Status CheckId(const char* var, const std::string& id) {
  if (id.empty() || id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat(var, ": must be 1..128 characters, got ", id.size(), " ('", id.substr(0, 40), "')"));
  }
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat(var, ": '", id, "' has a character outside [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadInt(const EnvLookup& lookup, const char* var, int* out) {
  std::optional<std::string> v = lookup(var);
  if (!v) return absl::OkStatus();
  if (!absl::SimpleAtoi(*v, out) || *out < 0) {
    return absl::InvalidArgumentError(absl::StrCat(var, ": must be a non-negative integer, got '", *v, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> RankEnvNames() {
  return {kEnvStore,         kEnvJobId, kEnvMemberId, kEnvBootstrapSize, kEnvControlJob,
          kEnvControlSecret, kEnvNode,  kEnvMinNodes, kEnvMaxNodes,      kEnvBackend,
          kEnvParkDir,       kEnvLocalRank, kEnvLocalWorldSize};
}

std::string RankEnv::store_host() const { return store.substr(0, store.rfind(':')); }

int RankEnv::store_port() const {
  int port = 0;
  const size_t colon = store.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(store.substr(colon + 1), &port)) return 0;
  return port;
}

absl::Status RankEnv::Validate() const {
  if (store.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kEnvStore, ": no control store given; run under `malletrain local` or a node agent (which set ",
        kEnvStore, ", ", kEnvJobId, ", ", kEnvMemberId, " and ", kEnvBootstrapSize, ") or set ", kEnvStore,
        "=host:port"));
  }
  const size_t colon = store.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(store.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvStore, ": expected 'host:port', got '", store, "'"));
  }
  MALLE_RETURN_IF_ERROR(CheckId(kEnvJobId, job_id));
  if (!member_id.empty()) MALLE_RETURN_IF_ERROR(CheckId(kEnvMemberId, member_id));
  if (!control_job.empty()) MALLE_RETURN_IF_ERROR(CheckId(kEnvControlJob, control_job));
  if (!node.empty()) MALLE_RETURN_IF_ERROR(CheckId(kEnvNode, node));
  if (bootstrap_size < 0 || min_nodes < 0 || max_nodes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvBootstrapSize, "/", kEnvMinNodes, "/", kEnvMaxNodes,
                                                   ": must not be negative"));
  }
  if (min_nodes > 0 && max_nodes > 0 && min_nodes > max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvMinNodes, "=", min_nodes, " is larger than ", kEnvMaxNodes,
                                                   "=", max_nodes));
  }
  if (local_rank < 0 || local_world_size < 0 || (local_world_size > 0 && local_rank >= local_world_size) ||
      (local_world_size == 0 && local_rank > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvLocalRank, "=", local_rank, ": must be in [0, ",
                                                   kEnvLocalWorldSize, "=", local_world_size, ")"));
  }
  if (!backend.empty() && backend != "gloo" && backend != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat(kEnvBackend, ": must be 'gloo' or 'nccl', got '", backend, "'"));
  }
  return absl::OkStatus();
}

std::optional<std::string> ProcessEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

absl::StatusOr<RankEnv> ReadRankEnv(const EnvLookup& lookup) {
  RankEnv env;
  auto text = [&](const char* var, std::string* out) {
    std::optional<std::string> v = lookup(var);
    if (v && !v->empty()) *out = *v;
  };
  text(kEnvStore, &env.store);
  text(kEnvJobId, &env.job_id);
  text(kEnvMemberId, &env.member_id);
  text(kEnvControlJob, &env.control_job);
  text(kEnvControlSecret, &env.control_secret);
  text(kEnvNode, &env.node);
  text(kEnvBackend, &env.backend);
  text(kEnvParkDir, &env.park_dir);
  MALLE_RETURN_IF_ERROR(ReadInt(lookup, kEnvBootstrapSize, &env.bootstrap_size));
  MALLE_RETURN_IF_ERROR(ReadInt(lookup, kEnvMinNodes, &env.min_nodes));
  MALLE_RETURN_IF_ERROR(ReadInt(lookup, kEnvMaxNodes, &env.max_nodes));
  MALLE_RETURN_IF_ERROR(ReadInt(lookup, kEnvLocalRank, &env.local_rank));
  MALLE_RETURN_IF_ERROR(ReadInt(lookup, kEnvLocalWorldSize, &env.local_world_size));
  MALLE_RETURN_IF_ERROR(env.Validate());
  return env;
}

std::vector<std::pair<std::string, std::string>> RankEnvVars(const RankEnv& env) {
  std::vector<std::pair<std::string, std::string>> out = {
      {kEnvStore, env.store},
      {kEnvJobId, env.job_id},
      {kEnvMemberId, env.member_id},
      {kEnvBootstrapSize, absl::StrCat(env.bootstrap_size)},
  };
  if (!env.control_job.empty()) out.emplace_back(kEnvControlJob, env.control_job);
  if (!env.control_secret.empty()) out.emplace_back(kEnvControlSecret, env.control_secret);
  if (!env.node.empty()) out.emplace_back(kEnvNode, env.node);
  if (env.min_nodes > 0) out.emplace_back(kEnvMinNodes, absl::StrCat(env.min_nodes));
  if (env.max_nodes > 0) out.emplace_back(kEnvMaxNodes, absl::StrCat(env.max_nodes));
  if (!env.backend.empty()) out.emplace_back(kEnvBackend, env.backend);
  if (!env.park_dir.empty()) out.emplace_back(kEnvParkDir, env.park_dir);
  if (env.local_world_size > 0) {
    out.emplace_back(kEnvLocalRank, absl::StrCat(env.local_rank));
    out.emplace_back(kEnvLocalWorldSize, absl::StrCat(env.local_world_size));
  }
  return out;
}

std::string GeneratedMemberId() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string clean;
  for (const char* p = host; *p && clean.size() < 40; ++p) {
    if (std::isalnum(static_cast<unsigned char>(*p)) || *p == '-') clean.push_back(*p);
  }
  if (clean.empty()) clean = "host";
  std::random_device rd;
  return absl::StrFormat("%s-%d-%08x", clean, ::getpid(), rd());
}

namespace {

// An integer variable that must be set, in [lo, hi]. `why` says who needs it.
absl::Status ReadRequiredInt(const EnvLookup& lookup, const char* var, int64_t lo, int64_t hi,
                             const std::string& why, int64_t* out) {
  std::optional<std::string> v = lookup(var);
  if (!v) return absl::InvalidArgumentError(absl::StrCat(var, " is not set (", why, ")"));
  if (!absl::SimpleAtoi(*v, out) || *out < lo || *out > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(var, ": must be an integer in [", lo, ", ", hi, "], got '", *v, "'"));
  }
  return absl::OkStatus();
}

// A launcher's run id as a job id: characters outside [A-Za-z0-9._-] become '_'.
std::string CleanId(const std::string& id) {
  std::string out;
  for (char c : id.substr(0, 100)) {
    out.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ? c : '_');
  }
  return out;
}

// Where the store's host listens: the address itself when it is an IPv4
// literal (or localhost), every interface when it is a name (which the other
// ranks resolve to one of this host's addresses).
std::string BindAddress(const std::string& host) {
  if (host == "localhost") return "127.0.0.1";
  in_addr addr{};
  if (::inet_pton(AF_INET, host.c_str(), &addr) == 1) return host;
  return "0.0.0.0";
}

}  // namespace

const char* LauncherName(Launcher launcher) {
  switch (launcher) {
    case Launcher::kMalle: return "malletrain";
    case Launcher::kTorchrun: return "torchrun";
    case Launcher::kSlurm: return "srun";
  }
  return "?";
}

absl::StatusOr<int> SlurmTasksOnNode(const std::string& tasks_per_node, int node) {
  const auto malformed = [&](absl::string_view entry) {
    return absl::InvalidArgumentError(absl::StrCat("malformed entry '", entry, "' in '", tasks_per_node,
                                                   "' (expected N or N(xM), comma-separated)"));
  };
  int first = 0;  // the first node the current entry covers
  for (absl::string_view entry : absl::StrSplit(tasks_per_node, ',')) {
    absl::string_view count = entry, times = "1";
    if (size_t open = entry.find("(x"); open != absl::string_view::npos) {
      if (entry.back() != ')') return malformed(entry);
      count = entry.substr(0, open);
      times = entry.substr(open + 2, entry.size() - open - 3);
    }
    int tasks = 0, repeat = 0;
    if (!absl::SimpleAtoi(count, &tasks) || !absl::SimpleAtoi(times, &repeat) || tasks < 1 || repeat < 1) {
      return malformed(entry);
    }
    if (node < first + repeat) return tasks;
    first += repeat;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("node ", node, " is beyond '", tasks_per_node, "', which covers ", first, " nodes"));
}

absl::StatusOr<std::string> FirstSlurmHost(const std::string& hostlist) {
  std::string host;
  for (size_t i = 0; i < hostlist.size() && hostlist[i] != ','; ++i) {
    const char c = hostlist[i];
    if (c == ']') {
      return absl::InvalidArgumentError(absl::StrCat("hostlist '", hostlist, "': ']' without '['"));
    }
    if (c != '[') {
      host.push_back(c);
      continue;
    }
    const size_t close = hostlist.find(']', i);
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("hostlist '", hostlist, "': '[' without ']'"));
    }
    // The first number of the first range: "[0100-0103,0200]" -> "0100" (padding kept).
    const std::string ranges = hostlist.substr(i + 1, close - i - 1);
    const std::string first = ranges.substr(0, ranges.find_first_of(",-"));
    if (first.empty() || !std::all_of(first.begin(), first.end(), [](char d) { return std::isdigit(d); })) {
      return absl::InvalidArgumentError(
          absl::StrCat("hostlist '", hostlist, "': expected a number range inside [...], got '", ranges, "'"));
    }
    host += first;
    i = close;
  }
  if (host.empty() || host.find_first_of(" \t") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("hostlist '", hostlist, "': no host name at its start"));
  }
  return host;
}

int SlurmStorePort(int64_t job_id, int64_t step_id) {
  return 10000 + static_cast<int>(((job_id % 20000) * 8 + step_id % 8) % 20000);
}

absl::StatusOr<LaunchEnv> ReadLaunchEnv(const EnvLookup& lookup) {
  LaunchEnv out;
  // 1. malletrain's own launchers and agents.
  if (lookup(kEnvStore)) {
    MALLE_ASSIGN_OR_RETURN(out.rank, ReadRankEnv(lookup));
    return out;
  }
  std::map<std::string, std::string> translated;  // MALLE_* values the launcher implies
  std::string host;
  int64_t port = 0;
  if (lookup(kTorchRank) || lookup(kTorchWorldSize)) {
    // 2. torchrun, or anything that follows torch's env:// convention.
    out.launcher = Launcher::kTorchrun;
    const std::string why = absl::StrCat("torchrun's variables: ", kTorchRank, ", ", kTorchWorldSize, ", ",
                                         kTorchMasterAddr, ", ", kTorchMasterPort, " go together");
    int64_t world = 0, rank = 0;
    MALLE_RETURN_IF_ERROR(ReadRequiredInt(lookup, kTorchWorldSize, 1, 1 << 20, why, &world));
    MALLE_RETURN_IF_ERROR(ReadRequiredInt(lookup, kTorchRank, 0, 1 << 20, why, &rank));
    if (rank >= world) {
      return absl::InvalidArgumentError(
          absl::StrCat(kTorchRank, "=", rank, " is not below ", kTorchWorldSize, "=", world));
    }
    std::optional<std::string> addr = lookup(kTorchMasterAddr);
    if (!addr) {
      return absl::InvalidArgumentError(absl::StrCat(kTorchWorldSize, "=", world, " is set but ", kTorchMasterAddr,
                                                     " is not (", why, ")"));
    }
    MALLE_RETURN_IF_ERROR(ReadRequiredInt(lookup, kTorchMasterPort, 1, 65535,
                                          absl::StrCat(why, "; torchrun --master-port 0 passes 0: give a port or "
                                                            "use --standalone"),
                                          &port));
    host = *addr;
    out.global_rank = static_cast<int>(rank);
    out.world_size = static_cast<int>(world);
    // torchrun's agent hosts a TCPStore at MASTER_ADDR:MASTER_PORT for its
    // workers and says so; without it (a hand-made env:// launch) rank 0 hosts.
    std::optional<std::string> agent = lookup(kTorchUseAgentStore);
    const bool agent_store = agent && (absl::AsciiStrToLower(*agent) == "true" || *agent == "1");
    out.host_store = !agent_store && rank == 0;
    out.store_from = absl::StrCat(kTorchMasterAddr, ":", kTorchMasterPort,
                                  agent_store ? " (torchrun's store)" : " (hosted by rank 0)");
    if (std::optional<std::string> run_id = lookup(kTorchRunId)) {
      // A restarted worker group is a new job: it must not meet the old one's records.
      std::optional<std::string> restart = lookup(kTorchRestartCount);
      translated[kEnvJobId] = absl::StrCat("torchrun-", CleanId(*run_id), "-r", restart ? CleanId(*restart) : "0");
    } else {
      translated[kEnvJobId] = "torch-env";
    }
    translated[kEnvMemberId] = absl::StrCat("rank", rank);
    if (std::optional<std::string> local = lookup(kEnvLocalRank)) {
      int local_rank = 0;
      if (!absl::SimpleAtoi(*local, &local_rank) || local_rank < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(kEnvLocalRank, ": must be a non-negative integer, got '", *local, "'"));
      }
      out.local_rank = local_rank;
    }
  } else if (lookup(kSlurmProcId) && lookup(kSlurmStepId)) {
    // 3. srun (a job step; the batch script itself is not one).
    out.launcher = Launcher::kSlurm;
    const std::string why = "an srun step sets it";
    int64_t procid = 0, ntasks = 0, job = 0, step = 0;
    const char* ntasks_var = lookup(kSlurmStepNumTasks) ? kSlurmStepNumTasks : kSlurmNtasks;
    MALLE_RETURN_IF_ERROR(ReadRequiredInt(lookup, ntasks_var, 1, 1 << 20, why, &ntasks));
    MALLE_RETURN_IF_ERROR(ReadRequiredInt(lookup, kSlurmProcId, 0, 1 << 20, why, &procid));
    if (procid >= ntasks) {
      return absl::InvalidArgumentError(
          absl::StrCat(kSlurmProcId, "=", procid, " is not below ", ntasks_var, "=", ntasks));
    }
    MALLE_RETURN_IF_ERROR(ReadRequiredInt(lookup, kSlurmJobId, 0, int64_t{1} << 40, why, &job));
    MALLE_RETURN_IF_ERROR(ReadRequiredInt(lookup, kSlurmStepId, 0, int64_t{1} << 40, why, &step));
    out.global_rank = static_cast<int>(procid);
    out.world_size = static_cast<int>(ntasks);
    int64_t local = -1, node = -1;
    if (lookup(kSlurmLocalId)) MALLE_RETURN_IF_ERROR(ReadRequiredInt(lookup, kSlurmLocalId, 0, 1 << 20, why, &local));
    if (lookup(kSlurmNodeId)) MALLE_RETURN_IF_ERROR(ReadRequiredInt(lookup, kSlurmNodeId, 0, 1 << 20, why, &node));
    out.local_rank = static_cast<int>(local);
    // A node's tasks get LOCAL_RANK / LOCAL_WORLD_SIZE as malletrain's agents
    // and torchrun give them (one GPU per task on NCCL), when srun says both.
    if (std::optional<std::string> per_node = lookup(kSlurmStepTasksPerNode); per_node && local >= 0 && node >= 0) {
      absl::StatusOr<int> here = SlurmTasksOnNode(*per_node, static_cast<int>(node));
      if (!here.ok()) return absl::InvalidArgumentError(absl::StrCat(kSlurmStepTasksPerNode, ": ", here.status().message()));
      translated[kEnvLocalRank] = absl::StrCat(local);
      translated[kEnvLocalWorldSize] = absl::StrCat(*here);
    }
    if (std::optional<std::string> addr = lookup(kTorchMasterAddr)) {
      host = *addr;
      out.store_from = kTorchMasterAddr;
    } else {
      const char* list_var = lookup(kSlurmStepNodeList) ? kSlurmStepNodeList : kSlurmJobNodeList;
      std::optional<std::string> list = lookup(list_var);
      if (!list) {
        return absl::InvalidArgumentError(absl::StrCat("srun step without ", kTorchMasterAddr, ", ",
                                                       kSlurmStepNodeList, " or ", kSlurmJobNodeList,
                                                       ": no host for the control store"));
      }
      absl::StatusOr<std::string> first = FirstSlurmHost(*list);
      if (!first.ok()) return absl::InvalidArgumentError(absl::StrCat(list_var, ": ", first.status().message()));
      host = *first;
      out.store_from = absl::StrCat("the first host of ", list_var);
      // Task 0 hosts the store; the others look for it on the first node.
      if (procid == 0 && node > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            kSlurmProcId, "=0 runs on ", kSlurmNodeId, "=", node, ", not on the first node of ", list_var,
            " (", host, "), where the other tasks look for the control store it hosts: set ", kTorchMasterAddr,
            " to its host"));
      }
    }
    if (lookup(kTorchMasterPort)) {
      MALLE_RETURN_IF_ERROR(ReadRequiredInt(lookup, kTorchMasterPort, 1, 65535, "the store's port", &port));
      absl::StrAppend(&out.store_from, ", ", kTorchMasterPort);
    } else {
      port = SlurmStorePort(job, step);
      absl::StrAppend(&out.store_from, ", port from ", kSlurmJobId, "/", kSlurmStepId);
    }
    out.host_store = procid == 0;
    translated[kEnvJobId] = absl::StrCat("slurm-", job, ".", step);
    translated[kEnvMemberId] = absl::StrCat("task", procid);
  } else {
    // No launcher: ReadRankEnv's error (MALLE_STORE missing), which names them all.
    absl::StatusOr<RankEnv> env = ReadRankEnv(lookup);
    if (env.ok()) return absl::InternalError("ReadRankEnv accepted an environment without MALLE_STORE");
    return absl::InvalidArgumentError(absl::StrCat(
        env.status().message(), "; or start it with torchrun (", kTorchRank, ", ", kTorchWorldSize, ", ",
        kTorchMasterAddr, ", ", kTorchMasterPort, ") or srun (", kSlurmProcId, ", ", kSlurmNtasks, ", ...)"));
  }
  out.store_bind = BindAddress(host);
  translated[kEnvStore] = absl::StrCat(host, ":", port);
  translated[kEnvBootstrapSize] = absl::StrCat(out.world_size);
  if (std::optional<std::string> given = lookup(kEnvBootstrapSize); given && *given != translated[kEnvBootstrapSize]) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvBootstrapSize, "=", *given, " contradicts the ",
                                                   LauncherName(out.launcher), " job's world size ", out.world_size));
  }
  // MALLE_* variables the user set win over what the launcher implies (job id, member id).
  MALLE_ASSIGN_OR_RETURN(out.rank, ReadRankEnv([&](const char* name) -> std::optional<std::string> {
    if (std::optional<std::string> v = lookup(name)) return v;
    auto it = translated.find(name);
    if (it != translated.end()) return it->second;
    return std::nullopt;
  }));
  return out;
}

}  // namespace malle::cluster
