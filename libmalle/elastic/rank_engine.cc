#include "libmalle/elastic/rank_engine.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/control/service/report_sink.h"
#include "libmalle/control/wire/secret.h"
#include "libmalle/elastic/park_store.h"

namespace malle::elastic {
namespace {

// A knob's value, or nullopt when it is not set.
absl::StatusOr<std::optional<int64_t>> IntKnob(const cluster::EnvLookup& lookup, const char* name) {
  std::optional<std::string> text = lookup(name);
  int64_t value = 0;
  if (text && !absl::SimpleAtoi(*text, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not an integer: '", *text, "'"));
  }
  return text ? std::optional<int64_t>(value) : std::nullopt;
}

absl::StatusOr<std::optional<double>> SecondsKnob(const cluster::EnvLookup& lookup, const char* name) {
  std::optional<std::string> text = lookup(name);
  double value = 0;
  if (text && !(absl::SimpleAtod(*text, &value) && value > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a positive number of seconds: '", *text, "'"));
  }
  return text ? std::optional<double>(value) : std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> CreateRankEngine(const cluster::RankEnv& env, RankEngineOptions options,
                                                         const cluster::EnvLookup& lookup) {
  MALLE_RETURN_IF_ERROR(env.Validate());
  comm::ElasticGroupOptions g = std::move(options.group);
  const comm::ElasticGroupOptions from_env = GroupOptionsFor(env);
  g.job_id = from_env.job_id;
  g.member_id = from_env.member_id;
  g.bootstrap_size = from_env.bootstrap_size;
  g.node = from_env.node;

  EngineOptions& o = options.engine;
  if (o.backend.empty()) o.backend = env.backend.empty() ? "gloo" : env.backend;
  if (o.advisor_job.empty()) o.advisor_job = env.control_job;
  if (env.min_nodes > 0) o.min_nodes = env.min_nodes;
  if (env.max_nodes > 0) o.max_nodes = env.max_nodes;
  if (env.local_world_size > 0) o.ranks_per_node = env.local_world_size;
  MALLE_ASSIGN_OR_RETURN(std::optional<int64_t> direct, IntKnob(lookup, kEnvStateDirectMinBytes));
  if (direct) o.state_direct_min_bytes = *direct;
  MALLE_ASSIGN_OR_RETURN(std::optional<int64_t> first_bucket, IntKnob(lookup, kEnvFirstBucketBytes));
  if (first_bucket) o.first_bucket_bytes = *first_bucket;
  MALLE_ASSIGN_OR_RETURN(std::optional<double> interval, SecondsKnob(lookup, kEnvReportInterval));
  if (interval) o.report_interval = absl::Seconds(*interval);
  if (std::optional<std::string> fault = lookup(kEnvFaultExitInStateSync)) o.fault_exit_in_state_sync = *fault;

  std::optional<control::Secret> secret;
  if (!env.control_secret.empty()) {
    absl::StatusOr<control::Secret> loaded = control::LoadSecret(env.control_secret);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat(cluster::kEnvControlSecret, ": ", loaded.status().message()));
    }
    secret = *std::move(loaded);
    if (o.secret.empty()) o.secret = std::string(secret->bytes());
  }
  // Everything is checked before the store is dialled.
  MALLE_RETURN_IF_ERROR(o.Validate());
  if (o.logical_workers > 0 && g.bootstrap_size > o.logical_workers) {
    return absl::InvalidArgumentError(absl::StrCat("logical_workers: ", o.logical_workers,
                                                   " is smaller than the job's starting size ", g.bootstrap_size,
                                                   "; every rank needs at least one logical worker"));
  }
  if (o.logical_workers > 0) g.max_size = std::min(g.max_size, o.logical_workers);
  MALLE_RETURN_IF_ERROR(g.Validate());
  if (o.park_store == nullptr && !env.park_dir.empty()) {
    DirParkStoreOptions p;
    p.dir = env.park_dir;
    p.job = env.control_job.empty() ? env.job_id : env.control_job;
    p.secret = o.secret;
    MALLE_ASSIGN_OR_RETURN(o.park_store, DirParkStore::Open(std::move(p)));
  }
  MALLE_ASSIGN_OR_RETURN(std::shared_ptr<comm::ControlStore> store,
                         comm::ControlStore::Connect(env.store_host(), env.store_port(), g.rendezvous_timeout));
  if (o.report_sink == nullptr && !env.control_job.empty() && secret) {
    // Reports, completion and parks go to the allocator as signed messages.
    const std::string sender = absl::StrCat("rank.", g.member_id).substr(0, 128);
    o.report_sink = std::make_shared<control::ControlReportSink>(store, *std::move(secret), sender,
                                                                 env.control_job, env.job_id);
  }
  return Engine::Create(std::move(store), std::move(g), std::move(o));
}

}  // namespace malle::elastic
