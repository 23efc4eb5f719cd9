#include "libmalle/cluster/rank_env.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

}  // namespace malle::cluster
