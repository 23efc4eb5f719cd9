#include "libmalle/control/service/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <variant>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/cluster/node_slots.h"
#include "libmalle/cluster/rank_env.h"
#include "libmalle/comm/elastic_group.h"
#include "libmalle/control/service/client.h"
#include "libmalle/control/service/metrics.h"

namespace malle::control {

namespace {

// The control store did not answer (comm::ControlStore marks its errors).
bool IsStoreError(const absl::Status& s) {
  auto cls = s.GetPayload(comm::kErrorClassPayload);
  return cls.has_value() && *cls == "StoreError";
}

}  // namespace

absl::Status AgentOptions::Validate() const {
  MALLE_RETURN_IF_ERROR(ValidateId("AgentOptions.node", node));
  MALLE_RETURN_IF_ERROR(ValidateId("AgentOptions.agent_id", agent_id));
  cluster::RankEnv env;  // what the agent's ranks will be given must be valid
  env.store = store_address;
  env.node = node;
  if (absl::Status s = env.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("AgentOptions.store_address: ", s.message()));
  }
  for (auto [name, d] : {std::pair{"heartbeat_interval", heartbeat_interval},
                         std::pair{"poll_interval", poll_interval},
                         std::pair{"reregister_after", reregister_after},
                         std::pair{"leave_timeout", leave_timeout},
                         std::pair{"stop_timeout", stop_timeout},
                         std::pair{"finish_timeout", finish_timeout},
                         std::pair{"member_poll", member_poll},
                         std::pair{"respawn_backoff", respawn_backoff},
                         std::pair{"zygote_ready_timeout", zygote_ready_timeout}}) {
    if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("AgentOptions.", name, " must be finite and > 0, got ",
                                                     absl::FormatDuration(d)));
    }
  }
  if (!zygote_python.empty()) {
    if (absl::StatusOr<std::string> p = cluster::ResolveProgram(zygote_python); !p.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("AgentOptions.zygote_python: ", p.status().message()));
    }
    if (zygote_preload.empty()) return absl::InvalidArgumentError("AgentOptions.zygote_preload is empty");
  }
  if (slots < 1 || slots > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("AgentOptions.slots must be in [1, ", kMaxSlots, "] (ranks per node), got ", slots));
  }
  if (!(node_class.speed > 0 && node_class.speed <= kMaxSpeed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AgentOptions.node_class.speed must be in (0, 100], got ", node_class.speed));
  }
  return ValidateId("AgentOptions.node_class.group", node_class.group);
}

Agent::Agent(std::shared_ptr<comm::ControlStore> store, Secret secret, AgentOptions options)
    : store_(std::move(store)),
      secret_(secret),
      options_(std::move(options)),
      outbox_(store_, std::move(secret), options_.agent_id) {}

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(std::shared_ptr<comm::ControlStore> store,
                                                     Secret secret, AgentOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("Agent: null store");
  if (options.agent_id.empty()) options.agent_id = absl::StrCat("agent.", options.node, ".", ::getpid());
  MALLE_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<Agent>(new Agent(std::move(store), std::move(secret), std::move(options)));
}

Agent::~Agent() {
  KillAll();
  for (Rank& r : finishing_) (void)r.process->Kill(absl::Seconds(10));
}

void Agent::KillAll() {
  for (Rank& r : ranks_) {
    if (r.process && !r.exit) (void)r.process->Kill(absl::Seconds(10));
  }
}

bool Agent::AnyRankNotEnding() const {
  for (const Rank& r : ranks_) {
    if (r.process && !r.exit && r.ending == Rank::Ending::kNone) return true;
  }
  return false;
}

void Agent::Reclaim(absl::Duration grace, std::string reason) {
  absl::MutexLock lock(&mu_);
  reclaim_ = true;
  grace_ = std::clamp(grace, absl::ZeroDuration(), absl::Hours(1));
  why_ = std::move(reason);
}

void Agent::Stop(std::string reason) {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  why_ = std::move(reason);
}

std::optional<RunningRank> Agent::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

int Agent::running_ranks() const {
  absl::MutexLock lock(&mu_);
  return counters_.ranks;
}

void Agent::SetRunning() {
  absl::MutexLock lock(&mu_);
  counters_.finishing = static_cast<int>(finishing_.size());
  counters_.ranks = static_cast<int>(ranks_.size());
  // The wire says one rank per node: the node's first rank stands for all, in
  // the phase of the least advanced one (the node trains when all of it does).
  const Rank* first = nullptr;
  RankPhase phase = RankPhase::kDraining;
  absl::Time since = absl::InfinitePast();
  for (const Rank& r : ranks_) {
    if (!r.process) continue;
    if (first == nullptr) first = &r;
    if (static_cast<int>(r.phase) < static_cast<int>(phase)) {
      phase = r.phase;
      since = r.phase_since;
    } else if (r.phase == phase) {
      since = std::max(since, r.phase_since);
    }
  }
  if (first != nullptr) {
    running_ = RunningRank{first->runtime_id, first->member, static_cast<int>(first->process->pid()), phase,
                           absl::FromUnixMicros(absl::ToUnixMicros(since))};
  } else {
    running_.reset();
  }
}

absl::Status Agent::Register() {
  NodeRegister r;
  r.node = options_.node;
  r.agent = options_.agent_id;
  r.node_class = options_.node_class;
  r.idle_until = options_.idle_until;
  r.slots = options_.slots;
  last_register_ = absl::Now();
  return outbox_.Send(r);
}

void Agent::SetPhase(Rank& r, RankPhase phase, absl::Time now) {
  if (r.phase == phase) return;
  r.phase = phase;
  r.phase_since = now;
  heartbeat_due_ = true;
  SetRunning();
}

absl::Status Agent::CheckMembership(absl::Time now) {
  bool starting = false;
  for (const Rank& r : ranks_) starting |= r.phase == RankPhase::kStarting && r.ending == Rank::Ending::kNone;
  if (!starting || ranks_.empty()) return absl::OkStatus();
  if (now - ranks_.front().member_checked < options_.member_poll) return absl::OkStatus();
  ranks_.front().member_checked = now;
  absl::StatusOr<comm::GenerationRecord> latest =
      comm::ElasticGroup::LatestGeneration(*store_, ranks_.front().runtime_id);
  if (absl::IsNotFound(latest.status())) return absl::OkStatus();  // not bootstrapped yet
  MALLE_RETURN_IF_ERROR(latest.status());
  for (Rank& r : ranks_) {
    if (r.phase == RankPhase::kStarting && r.ending == Rank::Ending::kNone && latest->RankOf(r.member) >= 0) {
      SetPhase(r, RankPhase::kTraining, now);
    }
  }
  return absl::OkStatus();
}

absl::Status Agent::Heartbeat() {
  AgentHeartbeat h;
  h.node = options_.node;
  {
    absl::MutexLock lock(&mu_);
    h.running = running_;
  }
  last_heartbeat_ = absl::Now();
  heartbeat_due_ = false;
  return outbox_.Send(h);
}

absl::Status Agent::PollPlan(absl::Time now) {
  MALLE_ASSIGN_OR_RETURN(std::optional<std::string> id_text, store_->TryGet(keys::kPlanId));
  int64_t id = 0;
  if (!id_text || !absl::SimpleAtoi(*id_text, &id) || id <= plan_id_) return absl::OkStatus();
  absl::StatusOr<std::optional<Envelope>> doc = ReadDocument(*store_, keys::kPlan, secret_, now);
  if (!doc.ok()) {
    MALLE_LOG(WARNING) << "plan not accepted: " << doc.status();
    return absl::OkStatus();
  }
  if (!doc->has_value()) return absl::OkStatus();
  const auto* plan = std::get_if<AllocationPlan>(&(*doc)->message);
  if (plan == nullptr || plan->plan < id || plan->plan <= plan_id_) return absl::OkStatus();
  plan_id_ = plan->plan;
  plan_seen_.store(plan_id_);
  in_plan_ = false;
  wanted_.reset();
  std::optional<std::string> job;
  for (const Assignment& a : plan->assignments) {
    if (a.node == options_.node) {
      in_plan_ = true;
      job = a.job;
    }
  }
  if (job) {
    Wanted w;
    w.job = *job;
    for (const JobLaunch& l : plan->launches) {
      if (l.job == *job) w.runtime_id = l.runtime_id, w.bootstrap_node = l.bootstrap_node;
    }
    for (const JobSize& s : plan->sizes) {
      if (s.job == *job) w.job_nodes = s.nodes;
    }
    if (w.runtime_id.empty()) {
      MALLE_LOG(WARNING) << "plan " << plan->plan << " assigns job " << *job
                         << " to this node without launch information; ignored";
    } else {
      wanted_ = std::move(w);
    }
  }
  // Jobs the plan still runs somewhere: the ranks of one of them leave, of any
  // other job they are stopped.
  if (AnyRankNotEnding() && (!wanted_ || wanted_->runtime_id != ranks_.front().runtime_id)) {
    const std::string runtime_id = ranks_.front().runtime_id;
    bool job_still_runs = false;
    for (const JobLaunch& l : plan->launches) job_still_runs |= l.runtime_id == runtime_id;
    MALLE_LOG(INFO) << "plan " << plan_id_ << ": the " << ranks_.size() << " rank(s) of " << runtime_id
                    << " are no longer wanted here";
    // Ranks not members yet (imports, model build, waiting for admission or
    // the bootstrap) cannot be asked to leave at a step boundary, and have no
    // state to lose: stopped now, so the node goes back at once.
    MALLE_RETURN_IF_ERROR(StopStartingRanks(now));
    if (!AnyRankNotEnding()) return absl::OkStatus();
    if (job_still_runs) {
      MALLE_RETURN_IF_ERROR(EndRanks(Rank::Ending::kLeaving, now + options_.leave_timeout));
    } else if (JobPhase(ranks_.front().job, now) == "succeeded") {
      // Its program is ending by itself (the job reported completion): it
      // may write its results, in the background; the node is free now.
      MALLE_RETURN_IF_ERROR(EndRanks(Rank::Ending::kFinishing, now + options_.finish_timeout));
      std::vector<Rank> keep;
      for (Rank& r : ranks_) {
        if (r.ending == Rank::Ending::kFinishing) {
          SetPhase(r, RankPhase::kDraining, now);
          finishing_.push_back(std::move(r));
        } else {
          keep.push_back(std::move(r));
        }
      }
      ranks_ = std::move(keep);
      SetRunning();
      heartbeat_due_ = true;
    } else {
      MALLE_RETURN_IF_ERROR(EndRanks(Rank::Ending::kStopping, now + options_.stop_timeout));
    }
  }
  return absl::OkStatus();
}

std::string Agent::JobPhase(absl::string_view job, absl::Time now) {
  absl::StatusOr<std::optional<Envelope>> doc = ReadDocument(*store_, keys::kStatus, secret_, now);
  if (!doc.ok() || !doc->has_value()) return "";
  const auto* status = std::get_if<AllocatorStatus>(&(*doc)->message);
  if (status == nullptr) return "";
  absl::StatusOr<std::vector<JobView>> jobs = ParseJobViews(status->status_json);
  if (!jobs.ok()) return "";
  for (const JobView& v : *jobs) {
    if (v.job == job) return v.phase;
  }
  return "";
}

absl::Status Agent::StopStartingRanks(absl::Time now) {
  std::vector<std::string> stopped;
  for (Rank& r : ranks_) {
    if (!r.process || r.exit || r.ending != Rank::Ending::kNone || r.phase != RankPhase::kStarting) continue;
    MALLE_LOG(INFO) << "rank " << r.member << " of " << r.runtime_id << " is not a member yet: stopped at once";
    SetPhase(r, RankPhase::kDraining, now);
    r.ending = Rank::Ending::kStopping;
    (void)r.process->Kill(absl::Seconds(10));
    stopped.push_back(r.member);
  }
  if (stopped.empty()) return absl::OkStatus();
  // A join request they may have queued is withdrawn (a leave of a member
  // that is not admitted cancels its join), so a leader never admits a
  // process that is gone; the dead report covers a join already being admitted.
  const std::string job = ranks_.front().runtime_id;
  MALLE_RETURN_IF_ERROR(comm::ElasticGroup::RequestLeave(*store_, job, absl::MakeConstSpan(stopped)));
  return comm::ElasticGroup::ReportDead(*store_, job, absl::MakeConstSpan(stopped));
}

absl::Status Agent::EndRanks(Rank::Ending how, absl::Time deadline) {
  std::vector<std::string> leaving;
  for (Rank& r : ranks_) {
    if (!r.process || r.exit || r.ending != Rank::Ending::kNone) continue;
    r.ending = how;
    r.deadline = deadline;
    if (how != Rank::Ending::kFinishing) SetPhase(r, RankPhase::kDraining, absl::Now());
    if (how == Rank::Ending::kLeaving) {
      leaving.push_back(r.member);
    } else if (how == Rank::Ending::kStopping) {
      (void)r.process->Signal(SIGTERM);
    }
  }
  if (leaving.empty()) return absl::OkStatus();
  // One request for the node's ranks: they leave in one generation change.
  return comm::ElasticGroup::RequestLeave(*store_, ranks_.front().runtime_id, absl::MakeConstSpan(leaving));
}

absl::Status Agent::KillAndReportDead(std::vector<std::string> also) {
  std::vector<std::string> dead = std::move(also);
  for (Rank& r : ranks_) {
    if (!r.process || r.exit) continue;
    MALLE_LOG(WARNING) << "rank " << r.member << " of " << r.runtime_id << " killed ("
                       << (r.ending == Rank::Ending::kNone ? "a rank of its node crashed" : "it did not end in time")
                       << ")";
    if (r.ending == Rank::Ending::kNone || r.ending == Rank::Ending::kLeaving) r.ending = Rank::Ending::kKilled;
    (void)r.process->Kill(absl::Seconds(10));
    r.exit = r.process->PollStatus();
    dead.push_back(r.member);
  }
  if (dead.empty() || ranks_.empty()) return absl::OkStatus();
  // Together: a recovery that sees one of them dead sees all of them.
  return comm::ElasticGroup::ReportDead(*store_, ranks_.front().runtime_id, absl::MakeConstSpan(dead));
}

absl::Status Agent::Reap(absl::Time now) {
  if (ranks_.empty()) return absl::OkStatus();
  bool overdue = false, crashed = false;
  std::vector<std::string> crashed_members;
  for (Rank& r : ranks_) {
    if (!r.process) continue;
    if (!r.exit) r.exit = r.process->PollStatus();
    if (!r.exit) {
      overdue |= r.ending != Rank::Ending::kNone && now >= r.deadline;
      continue;
    }
    const bool clean = r.exit->code == 0 && r.exit->signal == 0;
    if (r.ending == Rank::Ending::kNone && !clean) {
      crashed = true;
      crashed_members.push_back(r.member);
    }
  }
  if (crashed) {
    // The node's ranks are one unit: the others are stopped and all are
    // reported dead at once, so the job recovers once, without this node
    // (during a store outage they cannot recover anyway; the exits are kept).
    absl::Status reported = KillAndReportDead(std::move(crashed_members));
    if (!reported.ok() && !IsStoreError(reported)) return reported;
    ++crashes_;
    next_spawn_ = now + std::min(options_.respawn_backoff * crashes_, absl::Seconds(30));
  } else if (overdue) {
    MALLE_RETURN_IF_ERROR(KillAndReportDead());
  }
  if (std::none_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.exit.has_value(); })) {
    return absl::OkStatus();
  }
  std::vector<Rank> keep, done;
  for (Rank& r : ranks_) (r.exit ? done : keep).push_back(std::move(r));
  ranks_ = std::move(keep);
  SetRunning();
  heartbeat_due_ = true;
  for (Rank& r : done) MALLE_RETURN_IF_ERROR(Report(r, *r.exit, now));
  return absl::OkStatus();
}

absl::Status Agent::ReapFinishing(absl::Time now) {
  for (size_t i = 0; i < finishing_.size();) {
    Rank& r = finishing_[i];
    std::optional<cluster::ExitStatus> status = r.process->PollStatus();
    if (!status && now >= r.deadline) {
      MALLE_LOG(WARNING) << "rank " << r.member << " of " << r.runtime_id
                         << " did not finish within the finish timeout: killed";
      r.ending = Rank::Ending::kKilled;
      (void)r.process->Kill(absl::Seconds(10));
      status = r.process->PollStatus();
    }
    if (!status) {
      ++i;
      continue;
    }
    Rank done = std::move(r);
    finishing_.erase(finishing_.begin() + static_cast<std::ptrdiff_t>(i));
    MALLE_RETURN_IF_ERROR(Report(done, *status, now));
  }
  return absl::OkStatus();
}

absl::Status Agent::Report(Rank& r, const cluster::ExitStatus& status, absl::Time now) {
  RankExit e;
  e.node = options_.node;
  e.job = r.runtime_id;
  e.member = r.member;
  e.exit_code = std::clamp(status.code, 0, 255);
  e.signal = std::clamp(status.signal, 0, 127);
  switch (r.ending) {
    case Rank::Ending::kNone:
    case Rank::Ending::kFinishing:
      e.cause = RankExitCause::kExited;
      break;
    case Rank::Ending::kLeaving:
      e.cause = RankExitCause::kLeft;
      break;
    case Rank::Ending::kStopping:
    case Rank::Ending::kKilled:
      e.cause = RankExitCause::kStopped;
      break;
  }
  {
    absl::MutexLock lock(&mu_);
    ++counters_.rank_exits[std::string(RankExitCauseName(e.cause))];
  }
  const bool clean = status.code == 0 && status.signal == 0;
  const bool crashed = e.cause == RankExitCause::kExited && !clean;
  if (e.cause == RankExitCause::kExited && clean) finished_[e.job] = true;
  MALLE_LOG(INFO) << "rank " << e.member << " of " << e.job << " ended with status "
                  << status.ShellCode() << " (" << RankExitCauseName(e.cause) << ")";
  // A crash of a rank of the node's current set was handled by Reap (its
  // node-mates stopped, all reported dead together); one finishing in the
  // background is reported here.
  if (crashed && r.ending == Rank::Ending::kFinishing) {
    ++crashes_;
    next_spawn_ = now + std::min(options_.respawn_backoff * crashes_, absl::Seconds(30));
    // The others are waiting in a collective or a boundary: tell them now
    // (during a store outage they cannot recover anyway; the exit is kept).
    absl::Status reported = comm::ElasticGroup::ReportDead(*store_, e.job, e.member);
    if (!reported.ok() && !IsStoreError(reported)) return reported;
  }
  return SendReliably(e);
}

std::string Agent::MetricsText() const {
  control::MetricsText m;
  absl::MutexLock lock(&mu_);
  m.Counter("malle_agent_rank_starts_total", "Ranks this agent started.", counters_.rank_starts);
  for (const char* cause : {"exited", "left", "stopped"}) {
    auto it = counters_.rank_exits.find(cause);
    m.Counter("malle_agent_rank_exits_total", "Ranks that ended, by cause.",
              it == counters_.rank_exits.end() ? 0 : it->second, {{"cause", cause}});
  }
  for (RankPhase p : {RankPhase::kStarting, RankPhase::kTraining, RankPhase::kDraining}) {
    const bool now = running_ && running_->phase == p;
    m.Gauge("malle_agent_rank_phase", "1 for the phase of the ranks running here, the least advanced one (none: all 0).", now ? 1 : 0,
            {{"phase", std::string(RankPhaseName(p))}});
  }
  m.Counter("malle_agent_warm_rank_starts_total", "Ranks forked from the zygote (of malle_agent_rank_starts_total).",
            counters_.warm_starts);
  m.Counter("malle_agent_zygote_starts_total", "Zygotes this agent started.", counters_.zygote_starts);
  m.Gauge("malle_agent_zygote_warmup_seconds", "The zygote's start to ready (0: none ready yet).",
          counters_.zygote_warmup_s);
  m.Gauge("malle_agent_slots", "Ranks per job this node runs (--slots).", options_.slots);
  m.Gauge("malle_agent_ranks", "Ranks of the node's current job running here.", counters_.ranks);
  m.Gauge("malle_agent_finishing_ranks", "Ranks of succeeded jobs writing their results.", counters_.finishing);
  m.Counter("malle_agent_store_errors_total", "Loop iterations the control store did not answer.",
            counters_.store_errors);
  m.Gauge("malle_agent_unsent_messages", "Messages kept while the store is down.", counters_.unsent);
  m.Counter("malle_store_reconnects_total", "Connections to a TCPStore server replaced after a loss.",
            static_cast<double>(comm::ControlStoreReconnects()));
  return m.text();
}

absl::Status Agent::SendReliably(const Message& m) {
  if (unsent_.empty()) {
    absl::Status s = outbox_.Send(m);
    if (s.ok() || !IsStoreError(s)) return s;
  }
  // The store is down: kept (in order) and sent when it is back, signed then
  // (a message signed now would be stale by then).
  if (unsent_.size() >= 1000) unsent_.pop_front();
  unsent_.push_back(m);
  absl::MutexLock lock(&mu_);
  counters_.unsent = static_cast<int64_t>(unsent_.size());
  return absl::OkStatus();
}

absl::Status Agent::FlushUnsent() {
  while (!unsent_.empty()) {
    MALLE_RETURN_IF_ERROR(outbox_.Send(unsent_.front()));
    unsent_.pop_front();
    absl::MutexLock lock(&mu_);
    counters_.unsent = static_cast<int64_t>(unsent_.size());
  }
  return absl::OkStatus();
}

absl::Status Agent::Spawn(const Wanted& w, absl::Time now) {
  auto spec_it = specs_.find(w.job);
  if (spec_it == specs_.end()) {
    absl::StatusOr<std::optional<Envelope>> doc = ReadDocument(*store_, keys::JobSpecKey(w.job), secret_, now);
    if (!doc.ok() || !doc->has_value()) {
      MALLE_LOG(WARNING) << "job " << w.job << ": no valid spec yet ("
                         << (doc.ok() ? "absent" : doc.status().ToString()) << ")";
      next_spawn_ = now + options_.respawn_backoff;
      return absl::OkStatus();
    }
    const auto* submit = std::get_if<JobSubmit>(&(*doc)->message);
    if (submit == nullptr || submit->job != w.job) {
      MALLE_LOG(WARNING) << "job " << w.job << ": the spec key holds something else";
      next_spawn_ = now + options_.respawn_backoff;
      return absl::OkStatus();
    }
    spec_it = specs_.emplace(w.job, *submit).first;
  }
  const JobSubmit& spec = spec_it->second;
  // On the incarnation's bootstrap node the node's ranks form the job's first
  // generation together (bootstrap size = slots); elsewhere they join.
  const bool bootstrap = w.bootstrap_node == options_.node && !bootstrapped_[w.runtime_id];
  const int slots = options_.slots;
  std::vector<Rank> started;
  for (int local = 0; local < slots; ++local) {
    Rank r;
    r.job = w.job;
    r.runtime_id = w.runtime_id;
    r.member = absl::StrCat(options_.node, "-", ::getpid(), "-r", ++spawned_);
    cluster::ProcessSpec p;
    p.argv = spec.command;
    p.cwd = spec.cwd;
    if (!options_.log_dir.empty()) {
      p.stdout_path = absl::StrCat(options_.log_dir, "/", r.member, ".out");
      p.stderr_path = absl::StrCat(options_.log_dir, "/", r.member, ".err");
    }
    for (const auto& [k, v] : spec.env) p.env.emplace_back(k, v);
    for (const auto& kv : options_.extra_env) p.env.push_back(kv);
    if (!options_.visible_devices.empty()) p.env.emplace_back(cluster::kEnvCudaVisibleDevices, options_.visible_devices);
    // The rank environment contract (cluster/rank_env.h); LocalProcess adds it
    // last, so it wins over the job's own env.
    cluster::RankEnv& env = p.rank_env.emplace();
    env.store = options_.store_address;
    env.job_id = w.runtime_id;
    env.member_id = r.member;
    env.bootstrap_size = bootstrap ? slots : 0;
    env.control_job = w.job;
    env.control_secret = options_.secret_path;
    env.node = options_.node;
    env.min_nodes = spec.min_nodes;
    env.max_nodes = spec.EffectiveMaxNodes();
    env.local_rank = local;
    env.local_world_size = slots;
    if (!options_.park_root.empty()) {
      // Ids are [A-Za-z0-9._-]: one path component, except these two.
      if (w.job == "." || w.job == "..") {
        MALLE_LOG(WARNING) << "job '" << w.job << "' has no park store: its id is not a directory name";
      } else {
        env.park_dir = absl::StrCat(options_.park_root, "/", w.job);
      }
    }
    // Its own process group: stopping the rank stops what it started too.
    p.new_process_group = true;
    p.zygote = zygote_;
    absl::StatusOr<std::unique_ptr<cluster::LocalProcess>> process = cluster::LocalProcess::Spawn(p);
    if (!process.ok()) {
      MALLE_LOG(WARNING) << "job " << w.job << ": cannot start its command: " << process.status();
      // The node's ranks are one unit: the ones already started go too (they
      // are not members yet: a bootstrap or a join would wait for the missing one).
      std::vector<std::string> gone;
      for (Rank& s : started) {
        (void)s.process->Kill(absl::Seconds(10));
        gone.push_back(s.member);
      }
      if (!gone.empty()) {
        absl::Status st = comm::ElasticGroup::RequestLeave(*store_, w.runtime_id, absl::MakeConstSpan(gone));
        if (st.ok()) st = comm::ElasticGroup::ReportDead(*store_, w.runtime_id, absl::MakeConstSpan(gone));
        if (!st.ok() && !IsStoreError(st)) return st;
      }
      ++crashes_;
      next_spawn_ = now + std::min(options_.respawn_backoff * crashes_, absl::Seconds(30));
      RankExit e;
      e.node = options_.node;
      e.job = w.runtime_id;
      e.member = r.member;
      e.exit_code = 127;
      e.cause = RankExitCause::kExited;
      return SendReliably(e);
    }
    r.process = *std::move(process);
    MALLE_LOG(INFO) << "started rank " << r.member << " (local rank " << local << " of " << slots << ") of "
                    << w.runtime_id << " (pid " << r.process->pid()
                    << (bootstrap ? ", bootstraps the job" : ", joins")
                    << (r.process->warm() ? ", warm: forked from the zygote"
                        : options_.zygote_python.empty()
                            ? ""
                            : absl::StrCat(", cold: ", zygote_ ? r.process->cold_reason()
                                                               : "no zygote (a new one starts after its predecessor died)"))
                    << ")";
    if (r.process->warm()) {
      absl::MutexLock lock(&mu_);
      ++counters_.warm_starts;
    }
    r.phase_since = now;
    started.push_back(std::move(r));
  }
  if (bootstrap) bootstrapped_[w.runtime_id] = true;
  {
    absl::MutexLock lock(&mu_);
    counters_.rank_starts += slots;
  }
  ranks_ = std::move(started);
  SetRunning();
  heartbeat_due_ = true;
  return absl::OkStatus();
}

void Agent::EnsureZygote(absl::Time now) {
  if (options_.zygote_python.empty()) return;
  if (zygote_ != nullptr) {
    if (zygote_->Ready()) {
      if (zygote_failures_ > 0 || !zygote_ready_seen_) {
        zygote_failures_ = 0;
        zygote_ready_seen_ = true;
        absl::MutexLock lock(&mu_);
        counters_.zygote_warmup_s = zygote_->warmup_seconds().value_or(0);
      }
      return;
    }
    if (zygote_->failure().empty()) return;  // still importing
    // A zygote that keeps failing (its imports do) is retried less and less
    // often: 5 s after the first failure, doubling up to 5 min.
    const absl::Duration backoff = std::min(absl::Seconds(5) * (1 << std::min(zygote_failures_, 6)),
                                            absl::Minutes(5));
    ++zygote_failures_;
    MALLE_LOG(WARNING) << "zygote " << zygote_->pid() << " is unusable (" << zygote_->failure()
                       << "): ranks start cold; a new one in " << absl::FormatDuration(backoff);
    zygote_.reset();
    zygote_ready_seen_ = false;
    zygote_next_start_ = now + backoff;
  }
  if (now < zygote_next_start_) return;
  cluster::ZygoteOptions z;
  z.python = options_.zygote_python;
  z.preload = options_.zygote_preload;
  if (!options_.log_dir.empty()) z.log_path = absl::StrCat(options_.log_dir, "/zygote-", options_.node, ".log");
  absl::StatusOr<std::shared_ptr<cluster::Zygote>> started = cluster::Zygote::Start(z);
  absl::MutexLock lock(&mu_);
  ++counters_.zygote_starts;
  if (!started.ok()) {
    MALLE_LOG(WARNING) << "cannot start a zygote (" << started.status() << "): ranks start cold";
    zygote_next_start_ = now + absl::Seconds(30);
    return;
  }
  zygote_ = *std::move(started);
  MALLE_LOG(INFO) << "zygote " << zygote_->pid() << " started (" << options_.zygote_python << ", preloads "
                  << absl::StrJoin(options_.zygote_preload, ",") << ")";
}

void Agent::WaitForZygote() {
  EnsureZygote(absl::Now());
  if (zygote_ == nullptr) return;
  const absl::Time deadline = absl::Now() + options_.zygote_ready_timeout;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_ || reclaim_) return;
    }
    if (zygote_->Ready()) {
      zygote_ready_seen_ = true;
      absl::MutexLock lock(&mu_);
      counters_.zygote_warmup_s = zygote_->warmup_seconds().value_or(0);
      MALLE_LOG(INFO) << "zygote ready after " << counters_.zygote_warmup_s << " s: the node is offered";
      return;
    }
    if (!zygote_->failure().empty()) {
      MALLE_LOG(WARNING) << "zygote failed (" << zygote_->failure() << "): the node is offered, ranks start cold";
      return;
    }
    if (absl::Now() >= deadline) {
      MALLE_LOG(WARNING) << "zygote not ready after " << absl::FormatDuration(options_.zygote_ready_timeout)
                         << ": the node is offered, ranks start cold until it is";
      return;
    }
    absl::SleepFor(options_.poll_interval);
  }
}

absl::Status Agent::Reconcile(absl::Time now) {
  EnsureZygote(now);
  MALLE_RETURN_IF_ERROR(Reap(now));
  MALLE_RETURN_IF_ERROR(ReapFinishing(now));
  MALLE_RETURN_IF_ERROR(CheckMembership(now));
  if (ranks_.empty() && wanted_ && now >= next_spawn_ && !finished_[wanted_->runtime_id]) {
    MALLE_RETURN_IF_ERROR(Spawn(*wanted_, now));
  }
  return absl::OkStatus();
}

absl::Status Agent::Vacate(absl::Time deadline, bool reclaim) {
  std::string why;
  absl::Duration grace;
  {
    absl::MutexLock lock(&mu_);
    why = why_;
    grace = grace_;
  }
  if (reclaim) {
    NodeReclaim r;
    r.node = options_.node;
    r.grace = grace;
    r.reason = why.substr(0, kMaxReasonBytes);
    MALLE_RETURN_IF_ERROR(SendReliably(r));
  }
  wanted_.reset();
  // Ranks not members yet stop at once; the others leave at their next step
  // boundary, all in one generation change.
  MALLE_RETURN_IF_ERROR(StopStartingRanks(absl::Now()));
  MALLE_RETURN_IF_ERROR(EndRanks(Rank::Ending::kLeaving, deadline));
  for (Rank& r : ranks_) r.deadline = std::min(r.deadline, deadline);
  for (Rank& r : finishing_) r.deadline = std::min(r.deadline, deadline);
  while (!ranks_.empty() || !finishing_.empty()) {
    const absl::Time now = absl::Now();
    absl::Status s = [&]() -> absl::Status {
      MALLE_RETURN_IF_ERROR(Reap(now));
      MALLE_RETURN_IF_ERROR(ReapFinishing(now));
      if (now - last_heartbeat_ >= options_.heartbeat_interval) MALLE_RETURN_IF_ERROR(Heartbeat());
      return FlushUnsent();
    }();
    // A store outage does not stop the vacating: the ranks still go by their
    // deadline; what could not be said is said when the store is back.
    if (!s.ok() && !IsStoreError(s)) return s;
    if (!s.ok()) {
      for (Rank& r : ranks_) {
        if (r.process && !r.exit && now >= r.deadline) (void)r.process->Kill(absl::Seconds(10));
      }
    }
    absl::SleepFor(options_.poll_interval);
  }
  NodeLeave leave;
  leave.node = options_.node;
  leave.reason = (reclaim ? absl::StrCat("reclaimed: ", why) : why).substr(0, kMaxReasonBytes);
  if (leave.reason.empty()) leave.reason = "stopped";
  // The last words: try for a while if the store is down, then give up (the
  // allocator withdraws a silent node after its heartbeat timeout anyway).
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  for (;;) {
    absl::Status s = FlushUnsent();
    if (s.ok()) s = outbox_.Send(leave);
    if (s.ok() || !IsStoreError(s) || absl::Now() >= give_up) return s;
    absl::SleepFor(options_.poll_interval * 4);
  }
}

absl::Status Agent::Run() {
  WaitForZygote();
  MALLE_RETURN_IF_ERROR(Register());
  MALLE_LOG(INFO) << "agent " << options_.agent_id << " offers node " << options_.node << " (" << options_.slots
                  << " slot(s))";
  for (;;) {
    const absl::Time now = absl::Now();
    bool stop, reclaim;
    absl::Duration grace;
    {
      absl::MutexLock lock(&mu_);
      stop = stop_;
      reclaim = reclaim_;
      grace = grace_;
    }
    if (reclaim || stop) {
      // Keep a margin to kill and report before the scheduler's own kill.
      const absl::Duration margin = std::min(absl::Seconds(1), grace / 4);
      const absl::Time deadline = reclaim ? now + grace - margin : now + options_.leave_timeout;
      absl::Status s = Vacate(deadline, reclaim);
      if (!s.ok()) KillAll();
      return s;
    }
    absl::Status s = [&]() -> absl::Status {
      MALLE_RETURN_IF_ERROR(FlushUnsent());
      if (now - last_heartbeat_ >= options_.heartbeat_interval) MALLE_RETURN_IF_ERROR(Heartbeat());
      MALLE_RETURN_IF_ERROR(PollPlan(now));
      if (!in_plan_ && now - last_register_ >= options_.reregister_after) MALLE_RETURN_IF_ERROR(Register());
      MALLE_RETURN_IF_ERROR(Reconcile(now));
      // A rank changed phase, started or ended: the allocator hears it now
      // (its held-time accounting and its view of draining nodes).
      if (heartbeat_due_) MALLE_RETURN_IF_ERROR(Heartbeat());
      return absl::OkStatus();
    }();
    if (!s.ok() && IsStoreError(s)) {
      // The store is down: the rank keeps training at its job's current size
      // (its group needs no store between changes); the agent retries, and
      // re-registers when the store is back (a restarted store forgot it).
      if (store_failures_++ % 100 == 0) {
        MALLE_LOG(WARNING) << "agent " << options_.agent_id << ": control store unreachable (" << s.message()
                           << "); the rank keeps running, retrying";
      }
      store_down_ = true;
      absl::MutexLock lock(&mu_);
      ++counters_.store_errors;
    } else if (!s.ok()) {
      MALLE_LOG(ERROR) << "agent " << options_.agent_id << ": " << s << "; stopping its ranks";
      KillAll();
      return s;
    } else if (store_down_) {
      store_down_ = false;
      MALLE_LOG(INFO) << "agent " << options_.agent_id << ": control store reachable again";
      last_register_ = absl::InfinitePast();
      in_plan_ = false;  // registers again at once (idempotent for a store that kept its state)
    }
    absl::SleepFor(options_.poll_interval);
  }
}

}  // namespace malle::control
