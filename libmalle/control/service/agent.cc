#include "libmalle/control/service/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <variant>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
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
                         std::pair{"respawn_backoff", respawn_backoff}}) {
    if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("AgentOptions.", name, " must be finite and > 0, got ",
                                                     absl::FormatDuration(d)));
    }
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
  if (rank_ && rank_->process) (void)rank_->process->Kill(absl::Seconds(10));
  for (Rank& r : finishing_) (void)r.process->Kill(absl::Seconds(10));
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

void Agent::SetRunning() {
  absl::MutexLock lock(&mu_);
  counters_.finishing = static_cast<int>(finishing_.size());
  if (rank_ && rank_->process) {
    running_ = RunningRank{rank_->runtime_id, rank_->member, static_cast<int>(rank_->process->pid()),
                           rank_->phase, absl::FromUnixMicros(absl::ToUnixMicros(rank_->phase_since))};
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
  last_register_ = absl::Now();
  return outbox_.Send(r);
}

void Agent::SetPhase(Rank& r, RankPhase phase, absl::Time now) {
  if (r.phase == phase) return;
  r.phase = phase;
  r.phase_since = now;
  heartbeat_due_ = true;
  if (rank_ && &r == &*rank_) SetRunning();
}

absl::Status Agent::CheckMembership(absl::Time now) {
  if (!rank_ || rank_->phase != RankPhase::kStarting || rank_->ending != Rank::Ending::kNone) {
    return absl::OkStatus();
  }
  if (now - rank_->member_checked < options_.member_poll) return absl::OkStatus();
  rank_->member_checked = now;
  absl::StatusOr<comm::GenerationRecord> latest =
      comm::ElasticGroup::LatestGeneration(*store_, rank_->runtime_id);
  if (absl::IsNotFound(latest.status())) return absl::OkStatus();  // not bootstrapped yet
  MALLE_RETURN_IF_ERROR(latest.status());
  if (latest->RankOf(rank_->member) >= 0) SetPhase(*rank_, RankPhase::kTraining, now);
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
  // Jobs the plan still runs somewhere: a rank of one of them leaves, of any
  // other job it is stopped.
  if (rank_ && rank_->ending == Rank::Ending::kNone &&
      (!wanted_ || wanted_->runtime_id != rank_->runtime_id)) {
    bool job_still_runs = false;
    for (const JobLaunch& l : plan->launches) job_still_runs |= l.runtime_id == rank_->runtime_id;
    MALLE_LOG(INFO) << "plan " << plan_id_ << ": the rank " << rank_->member << " of " << rank_->runtime_id
                    << " is no longer wanted here";
    if (rank_->phase == RankPhase::kStarting) {
      // Not a member yet (imports, model build, waiting for admission or the
      // bootstrap): it cannot be asked to leave at a step boundary, and it
      // has no state to lose. Stopped now, so the node goes back at once.
      MALLE_RETURN_IF_ERROR(StopStartingRank(now));
    } else if (job_still_runs) {
      MALLE_RETURN_IF_ERROR(EndRank(Rank::Ending::kLeaving, now + options_.leave_timeout));
    } else if (JobPhase(rank_->job, now) == "succeeded") {
      // Its program is ending by itself (the job reported completion): it
      // may write its results, in the background; the node is free now.
      MALLE_RETURN_IF_ERROR(EndRank(Rank::Ending::kFinishing, now + options_.finish_timeout));
      SetPhase(*rank_, RankPhase::kDraining, now);
      finishing_.push_back(*std::move(rank_));
      rank_.reset();
      SetRunning();
      heartbeat_due_ = true;
    } else {
      MALLE_RETURN_IF_ERROR(EndRank(Rank::Ending::kStopping, now + options_.stop_timeout));
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

absl::Status Agent::StopStartingRank(absl::Time now) {
  MALLE_LOG(INFO) << "rank " << rank_->member << " of " << rank_->runtime_id
                  << " is not a member yet: stopped at once";
  SetPhase(*rank_, RankPhase::kDraining, now);
  rank_->ending = Rank::Ending::kStopping;
  (void)rank_->process->Kill(absl::Seconds(10));
  // A join request it may have queued is withdrawn (a leave of a member that
  // is not admitted cancels its join), so a leader never admits a process
  // that is gone; the dead report covers a join already being admitted.
  MALLE_RETURN_IF_ERROR(comm::ElasticGroup::RequestLeave(*store_, rank_->runtime_id, rank_->member));
  return comm::ElasticGroup::ReportDead(*store_, rank_->runtime_id, rank_->member);
}

absl::Status Agent::EndRank(Rank::Ending how, absl::Time deadline) {
  if (!rank_ || !rank_->process) return absl::OkStatus();
  rank_->ending = how;
  rank_->deadline = deadline;
  if (how != Rank::Ending::kFinishing) SetPhase(*rank_, RankPhase::kDraining, absl::Now());
  if (how == Rank::Ending::kLeaving) {
    absl::Status s = comm::ElasticGroup::RequestLeave(*store_, rank_->runtime_id, rank_->member);
    if (!s.ok()) return s;
  } else if (how == Rank::Ending::kStopping) {
    (void)rank_->process->Signal(SIGTERM);
  }
  return absl::OkStatus();
}

absl::Status Agent::KillAndReportDead() {
  if (!rank_ || !rank_->process) return absl::OkStatus();
  MALLE_LOG(WARNING) << "rank " << rank_->member << " of " << rank_->runtime_id
                     << " did not end in time: killed";
  rank_->ending = Rank::Ending::kKilled;
  (void)rank_->process->Kill(absl::Seconds(10));
  return comm::ElasticGroup::ReportDead(*store_, rank_->runtime_id, rank_->member);
}

absl::Status Agent::Reap(absl::Time now) {
  if (!rank_ || !rank_->process) return absl::OkStatus();
  std::optional<cluster::ExitStatus> status = rank_->process->PollStatus();
  if (!status) {
    if (rank_->ending != Rank::Ending::kNone && now >= rank_->deadline) {
      MALLE_RETURN_IF_ERROR(KillAndReportDead());
      status = rank_->process->PollStatus();
    }
    if (!status) return absl::OkStatus();
  }
  Rank r = *std::move(rank_);
  rank_.reset();
  SetRunning();
  heartbeat_due_ = true;
  return Report(r, *status, now);
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
  if (crashed) {
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
    m.Gauge("malle_agent_rank_phase", "1 for the phase of the rank running here (none: all 0).", now ? 1 : 0,
            {{"phase", std::string(RankPhaseName(p))}});
  }
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
  const bool bootstrap = w.bootstrap_node == options_.node && !bootstrapped_[w.runtime_id];
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
  // The rank environment contract (cluster/rank_env.h); LocalProcess adds it
  // last, so it wins over the job's own env.
  cluster::RankEnv& env = p.rank_env.emplace();
  env.store = options_.store_address;
  env.job_id = w.runtime_id;
  env.member_id = r.member;
  env.bootstrap_size = bootstrap ? 1 : 0;
  env.control_job = w.job;
  env.control_secret = options_.secret_path;
  env.node = options_.node;
  env.min_nodes = spec.min_nodes;
  env.max_nodes = spec.EffectiveMaxNodes();
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
  absl::StatusOr<std::unique_ptr<cluster::LocalProcess>> process = cluster::LocalProcess::Spawn(p);
  if (!process.ok()) {
    MALLE_LOG(WARNING) << "job " << w.job << ": cannot start its command: " << process.status();
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
  if (bootstrap) bootstrapped_[w.runtime_id] = true;
  r.process = *std::move(process);
  MALLE_LOG(INFO) << "started rank " << r.member << " of " << w.runtime_id << " (pid " << r.process->pid()
                  << (bootstrap ? ", bootstraps the job)" : ", joins)");
  r.phase_since = now;
  {
    absl::MutexLock lock(&mu_);
    ++counters_.rank_starts;
  }
  rank_ = std::move(r);
  SetRunning();
  heartbeat_due_ = true;
  return absl::OkStatus();
}

absl::Status Agent::Reconcile(absl::Time now) {
  MALLE_RETURN_IF_ERROR(Reap(now));
  MALLE_RETURN_IF_ERROR(ReapFinishing(now));
  MALLE_RETURN_IF_ERROR(CheckMembership(now));
  if (!rank_ && wanted_ && now >= next_spawn_ && !finished_[wanted_->runtime_id]) {
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
  if (rank_ && rank_->process && rank_->ending == Rank::Ending::kNone &&
      rank_->phase == RankPhase::kStarting) {
    MALLE_RETURN_IF_ERROR(StopStartingRank(absl::Now()));
  } else if (rank_ && rank_->process && rank_->ending == Rank::Ending::kNone) {
    MALLE_RETURN_IF_ERROR(EndRank(Rank::Ending::kLeaving, deadline));
  } else if (rank_) {
    rank_->deadline = std::min(rank_->deadline, deadline);
  }
  for (Rank& r : finishing_) r.deadline = std::min(r.deadline, deadline);
  while (rank_ || !finishing_.empty()) {
    const absl::Time now = absl::Now();
    absl::Status s = [&]() -> absl::Status {
      MALLE_RETURN_IF_ERROR(Reap(now));
      MALLE_RETURN_IF_ERROR(ReapFinishing(now));
      if (now - last_heartbeat_ >= options_.heartbeat_interval) MALLE_RETURN_IF_ERROR(Heartbeat());
      return FlushUnsent();
    }();
    // A store outage does not stop the vacating: the rank still goes by its
    // deadline; what could not be said is said when the store is back.
    if (!s.ok() && !IsStoreError(s)) return s;
    if (!s.ok() && rank_ && rank_->process && now >= rank_->deadline) (void)rank_->process->Kill(absl::Seconds(10));
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
  MALLE_RETURN_IF_ERROR(Register());
  MALLE_LOG(INFO) << "agent " << options_.agent_id << " offers node " << options_.node;
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
      if (!s.ok() && rank_ && rank_->process) (void)rank_->process->Kill(absl::Seconds(10));
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
      MALLE_LOG(ERROR) << "agent " << options_.agent_id << ": " << s << "; stopping its rank";
      if (rank_ && rank_->process) (void)rank_->process->Kill(absl::Seconds(10));
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
