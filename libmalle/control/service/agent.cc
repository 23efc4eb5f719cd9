#include "libmalle/control/service/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <variant>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/cluster/rank_env.h"
#include "libmalle/comm/elastic_group.h"
#include "libmalle/control/service/client.h"

namespace malle::control {

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
  if (rank_ && rank_->process) {
    running_ = RunningRank{rank_->runtime_id, rank_->member, static_cast<int>(rank_->process->pid())};
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

absl::Status Agent::Heartbeat() {
  AgentHeartbeat h;
  h.node = options_.node;
  {
    absl::MutexLock lock(&mu_);
    h.running = running_;
  }
  last_heartbeat_ = absl::Now();
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
    if (job_still_runs) {
      MALLE_RETURN_IF_ERROR(EndRank(Rank::Ending::kLeaving, now + options_.leave_timeout));
    } else if (JobPhase(rank_->job, now) == "succeeded") {
      // Its program is ending by itself (the job reported completion): let
      // it write its results.
      MALLE_RETURN_IF_ERROR(EndRank(Rank::Ending::kFinishing, now + options_.finish_timeout));
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

absl::Status Agent::EndRank(Rank::Ending how, absl::Time deadline) {
  if (!rank_ || !rank_->process) return absl::OkStatus();
  rank_->ending = how;
  rank_->deadline = deadline;
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
  RankExit e;
  e.node = options_.node;
  e.job = rank_->runtime_id;
  e.member = rank_->member;
  e.exit_code = std::clamp(status->code, 0, 255);
  e.signal = std::clamp(status->signal, 0, 127);
  switch (rank_->ending) {
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
  const bool clean = status->code == 0 && status->signal == 0;
  const bool crashed = e.cause == RankExitCause::kExited && !clean;
  if (e.cause == RankExitCause::kExited && clean) finished_[e.job] = true;
  MALLE_LOG(INFO) << "rank " << e.member << " of " << e.job << " ended with status "
                  << status->ShellCode() << " (" << RankExitCauseName(e.cause) << ")";
  if (crashed) {
    // The others are waiting in a collective or a boundary: tell them now.
    MALLE_RETURN_IF_ERROR(comm::ElasticGroup::ReportDead(*store_, e.job, e.member));
    ++crashes_;
    next_spawn_ = now + std::min(options_.respawn_backoff * crashes_, absl::Seconds(30));
  }
  rank_.reset();
  SetRunning();
  return outbox_.Send(e);
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
    return outbox_.Send(e);
  }
  if (bootstrap) bootstrapped_[w.runtime_id] = true;
  r.process = *std::move(process);
  MALLE_LOG(INFO) << "started rank " << r.member << " of " << w.runtime_id << " (pid " << r.process->pid()
                  << (bootstrap ? ", bootstraps the job)" : ", joins)");
  rank_ = std::move(r);
  SetRunning();
  return absl::OkStatus();
}

absl::Status Agent::Reconcile(absl::Time now) {
  MALLE_RETURN_IF_ERROR(Reap(now));
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
    MALLE_RETURN_IF_ERROR(outbox_.Send(r));
  }
  wanted_.reset();
  if (rank_ && rank_->process && rank_->ending == Rank::Ending::kNone) {
    MALLE_RETURN_IF_ERROR(EndRank(Rank::Ending::kLeaving, deadline));
  } else if (rank_) {
    rank_->deadline = std::min(rank_->deadline, deadline);
  }
  while (rank_) {
    const absl::Time now = absl::Now();
    MALLE_RETURN_IF_ERROR(Reap(now));
    if (now - last_heartbeat_ >= options_.heartbeat_interval) MALLE_RETURN_IF_ERROR(Heartbeat());
    absl::SleepFor(options_.poll_interval);
  }
  NodeLeave leave;
  leave.node = options_.node;
  leave.reason = (reclaim ? absl::StrCat("reclaimed: ", why) : why).substr(0, kMaxReasonBytes);
  if (leave.reason.empty()) leave.reason = "stopped";
  return outbox_.Send(leave);
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
      if (now - last_heartbeat_ >= options_.heartbeat_interval) MALLE_RETURN_IF_ERROR(Heartbeat());
      MALLE_RETURN_IF_ERROR(PollPlan(now));
      if (!in_plan_ && now - last_register_ >= options_.reregister_after) MALLE_RETURN_IF_ERROR(Register());
      return Reconcile(now);
    }();
    if (!s.ok()) {
      MALLE_LOG(ERROR) << "agent " << options_.agent_id << ": " << s << "; stopping its rank";
      if (rank_ && rank_->process) (void)rank_->process->Kill(absl::Seconds(10));
      return s;
    }
    absl::SleepFor(options_.poll_interval);
  }
}

}  // namespace malle::control
