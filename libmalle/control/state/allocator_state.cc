#include "libmalle/control/state/allocator_state.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
#include <utility>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libmalle/advisor/report_json.h"
#include "libmalle/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace malle::control {
namespace {

using Json = nlohmann::ordered_json;

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }
double Unix(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

std::string ClassId(const NodeClass& c) { return absl::StrCat(c.group, "/", c.speed); }

// Relative difference of two curves over [lo, hi]; used to ignore reports
// that do not change the allocation problem materially.
double CurveChange(const alloc::Curve& a, const alloc::Curve& b, int lo, int hi) {
  if (a.empty() != b.empty()) return 1;
  if (a.empty()) return 0;
  double worst = 0;
  for (int n = std::max(lo, 1); n <= hi; ++n) {
    const double x = alloc::Interpolate(a, n), y = alloc::Interpolate(b, n);
    const double scale = std::max(std::abs(x), std::abs(y));
    if (scale > 0) worst = std::max(worst, std::abs(x - y) / scale);
  }
  return worst;
}

Json HeldJson(const HeldSeconds& h) {
  Json j;
  j["productive_node_s"] = h.productive;
  j["held_idle_node_s"] = h.idle();
  j["starting_node_s"] = h.starting;
  j["warming_node_s"] = h.warming;
  j["draining_node_s"] = h.draining;
  j["held_node_s"] = h.held();
  j["held_idle_pct"] = h.held() > 0 ? 100 * h.idle() / h.held() : 0.0;
  return j;
}

// A material change of a job's curve: re-deciding for less is churn.
constexpr double kCurveChangeThreshold = 0.05;

}  // namespace

absl::Status AllocatorStateOptions::Validate() const {
  auto positive = [](absl::string_view name, absl::Duration d) -> absl::Status {
    if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("AllocatorStateOptions.", name,
                                                     " must be finite and > 0, got ",
                                                     absl::FormatDuration(d)));
    }
    return absl::OkStatus();
  };
  MALLE_RETURN_IF_ERROR(positive("forward_window", forward_window));
  MALLE_RETURN_IF_ERROR(positive("heartbeat_timeout", heartbeat_timeout));
  MALLE_RETURN_IF_ERROR(positive("max_probe", max_probe));
  if (probe_cooldown < absl::ZeroDuration() || probe_cooldown == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllocatorStateOptions.probe_cooldown must be finite and >= 0, got ",
        absl::FormatDuration(probe_cooldown)));
  }
  if (!(default_samples_per_s > 0) || !std::isfinite(default_samples_per_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllocatorStateOptions.default_samples_per_s must be finite and > 0, got ",
        default_samples_per_s));
  }
  for (auto [name, d] : {std::pair{"default_grow_pause", default_grow_pause},
                         std::pair{"default_shrink_pause", default_shrink_pause}}) {
    if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("AllocatorStateOptions.", name,
                                                     " must be finite and >= 0, got ",
                                                     absl::FormatDuration(d)));
    }
  }
  if (!(default_serial_fraction >= 0 && default_serial_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllocatorStateOptions.default_serial_fraction must be in [0, 1], got ", default_serial_fraction));
  }
  if (max_rank_failures < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllocatorStateOptions.max_rank_failures must be >= 1, got ", max_rank_failures));
  }
  if (!std::isfinite(resize_hysteresis) || resize_hysteresis < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllocatorStateOptions.resize_hysteresis must be finite and >= 1, got ",
                     resize_hysteresis));
  }
  if (!std::isfinite(rank_weight_exponent) || rank_weight_exponent < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllocatorStateOptions.rank_weight_exponent must be finite and >= 0, got ",
                     rank_weight_exponent));
  }
  if (std::string why = alloc::RankAgingProblem(rank_aging, rank_weight_exponent); !why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("AllocatorStateOptions.rank_aging ", why));
  }
  if (objective == alloc::Objective::kCompletion) {
    return absl::InvalidArgumentError(
        "AllocatorStateOptions.objective: completion needs every job's work left, which jobs "
        "give only with total_steps; use speedup with rank_weight_exponent > 0, which orders "
        "the jobs by the work they have left");
  }
  return absl::OkStatus();
}

absl::string_view NodePhaseName(NodePhase phase) {
  switch (phase) {
    case NodePhase::kActive:
      return "active";
    case NodePhase::kReclaiming:
      return "reclaiming";
    case NodePhase::kGone:
      return "gone";
  }
  return "?";
}

absl::string_view JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kQueued:
      return "queued";
    case JobPhase::kRunning:
      return "running";
    case JobPhase::kSucceeded:
      return "succeeded";
    case JobPhase::kFailed:
      return "failed";
    case JobPhase::kCancelled:
      return "cancelled";
  }
  return "?";
}

std::string JobRecord::RuntimeId() const { return absl::StrCat(spec.job, ".i", incarnation); }

std::optional<double> JobRecord::ParkSeconds() const {
  if (!last_park) return std::nullopt;
  return last_park->write_s;
}

std::optional<double> JobRecord::UnparkSeconds() const {
  if (unpark_s) return unpark_s;
  // Not resumed yet: reading the state back is taken to cost what writing it did.
  return ParkSeconds();
}

absl::string_view HeldKindName(HeldKind kind) {
  switch (kind) {
    case HeldKind::kProductive:
      return "productive";
    case HeldKind::kStarting:
      return "starting";
    case HeldKind::kWarming:
      return "warming";
    case HeldKind::kDraining:
      return "draining";
  }
  return "?";
}

void HeldSeconds::Add(HeldKind kind, double seconds) {
  switch (kind) {
    case HeldKind::kProductive:
      productive += seconds;
      break;
    case HeldKind::kStarting:
      starting += seconds;
      break;
    case HeldKind::kWarming:
      warming += seconds;
      break;
    case HeldKind::kDraining:
      draining += seconds;
      break;
  }
}

alloc::Curve PriorCurve(int min_nodes, int max_nodes, double per_node, double serial) {
  std::set<int> sizes = {0, std::max(min_nodes, 1), max_nodes};
  for (int n = 1; n < max_nodes; n *= 2) sizes.insert(n);
  alloc::Curve curve;
  for (int n : sizes) curve.push_back({n, n == 0 ? 0.0 : per_node * n / (1 + serial * (n - 1))});
  return curve;
}

alloc::Curve CurveFromPoints(const std::vector<alloc::Breakpoint>& points, int min_nodes,
                             int max_nodes) {
  std::map<int, double> in;
  for (const alloc::Breakpoint& p : points) {
    if (p.nodes >= 1 && p.nodes <= max_nodes && std::isfinite(p.samples_per_s) &&
        p.samples_per_s >= 0) {
      in[p.nodes] = p.samples_per_s;
    }
  }
  alloc::Curve curve = {{0, 0.0}};
  if (in.empty()) return curve;
  const auto [first_n, first_x] = *in.begin();
  const auto [last_n, last_x] = *in.rbegin();
  // Below the smallest predicted size: that size's per-node rate.
  const int lo = std::max(1, std::min(min_nodes, first_n));
  if (lo < first_n) curve.push_back({lo, first_x / first_n * lo});
  for (const auto& [n, x] : in) curve.push_back({n, x});
  if (last_n < max_nodes) curve.push_back({max_nodes, last_x / last_n * max_nodes});
  return curve;
}

AllocatorState::AllocatorState(AllocatorStateOptions options) : options_(std::move(options)) {}

absl::StatusOr<NodeRecord*> AllocatorState::AgentNode(const Envelope& e, absl::string_view node) {
  auto it = nodes_.find(std::string(node));
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("node '", node, "' is not registered"));
  }
  NodeRecord& n = it->second;
  if (n.agent != e.sender) {
    return absl::PermissionDeniedError(absl::StrCat("node '", node, "' belongs to agent '", n.agent,
                                                    "', not to the sender '", e.sender, "'"));
  }
  if (n.phase == NodePhase::kGone) {
    return absl::FailedPreconditionError(
        absl::StrCat("node '", node, "' is gone (", n.why_gone, "); its agent must register again"));
  }
  return &n;
}

absl::StatusOr<JobRecord*> AllocatorState::LiveJob(absl::string_view job) {
  auto it = jobs_.find(std::string(job));
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job '", job, "' is not known"));
  JobRecord& j = it->second;
  if (j.phase != JobPhase::kQueued && j.phase != JobPhase::kRunning) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job, "' has ended (", JobPhaseName(j.phase), ")"));
  }
  return &j;
}

const JobRecord* AllocatorState::FindByRuntimeId(absl::string_view runtime_id) const {
  const size_t dot = runtime_id.rfind(".i");
  if (dot == absl::string_view::npos) return nullptr;
  auto it = jobs_.find(std::string(runtime_id.substr(0, dot)));
  if (it == jobs_.end() || it->second.RuntimeId() != runtime_id) return nullptr;
  return &it->second;
}

void AllocatorState::EndJob(JobRecord& job, JobPhase phase, absl::Time now, std::string message) {
  for (auto& [name, n] : nodes_) Accrue(n, now);
  job.phase = phase;
  job.ended_at = now;
  if (!message.empty()) job.message = std::move(message);
  // Its ranks stop being productive now, whether or not the plan has caught up.
  for (auto& [name, n] : nodes_) Reclassify(n, now);
}

void AllocatorState::ReleaseNodes(JobRecord& job, absl::Time now) {
  for (auto& [name, n] : nodes_) Accrue(n, now);
  for (const std::string& node : job.nodes) {
    NodeRecord& n = nodes_.at(node);
    if (n.planned && *n.planned == job.spec.job) n.planned.reset();
  }
  job.nodes.clear();
  job.probe.reset();
  if (job.phase == JobPhase::kRunning) job.phase = JobPhase::kQueued;
  for (auto& [name, n] : nodes_) Reclassify(n, now);
}

bool AllocatorState::HasRankRunning(const JobRecord& job) const {
  const std::string prefix = absl::StrCat(job.spec.job, ".i");
  for (const auto& [name, n] : nodes_) {
    if (n.phase != NodePhase::kGone && n.running && absl::StartsWith(n.running->job, prefix)) {
      return true;
    }
  }
  return false;
}

bool AllocatorState::HolderAlive(const JobRecord& job) const {
  const std::string id = job.RuntimeId();
  for (const auto& [name, n] : nodes_) {
    if (n.phase == NodePhase::kGone || !n.running || n.running->job != id) continue;
    if (n.running->phase.value_or(RankPhase::kTraining) != RankPhase::kStarting) return true;
  }
  if (job.formed || job.bootstrap_ended) return false;
  auto it = nodes_.find(job.bootstrap_node);
  if (it == nodes_.end() || it->second.phase == NodePhase::kGone) return false;
  const NodeRecord& b = it->second;
  if (b.running && b.running->job == id) return true;   // the bootstrap rank, warming up
  return b.planned && *b.planned == job.spec.job;        // about to start it (or waiting for a drain)
}

bool AllocatorState::Offered(const NodeRecord& n, absl::Time now) const {
  return n.phase == NodePhase::kActive && now - n.last_seen <= options_.heartbeat_timeout;
}

bool AllocatorState::Draining(const NodeRecord& n) const { return n.running.has_value(); }

std::optional<HeldKind> AllocatorState::ClassifyHeld(const NodeRecord& n, std::string* job) const {
  job->clear();
  if (n.phase == NodePhase::kGone) return std::nullopt;
  if (n.running) {
    // "<job>.i<k>": the job's name even for a rank of an older incarnation.
    const size_t dot = n.running->job.rfind(".i");
    const std::string name = dot == std::string::npos ? n.running->job : n.running->job.substr(0, dot);
    if (jobs_.count(name)) *job = name;
    const JobRecord* current = FindByRuntimeId(n.running->job);
    const bool wanted = current != nullptr && current->phase == JobPhase::kRunning && n.planned &&
                        *n.planned == current->spec.job;
    // An agent that does not say (an older one) is taken at its word that it runs the rank.
    const RankPhase phase = n.running->phase.value_or(RankPhase::kTraining);
    if (!wanted || phase == RankPhase::kDraining) return HeldKind::kDraining;
    return phase == RankPhase::kTraining ? HeldKind::kProductive : HeldKind::kWarming;
  }
  if (n.planned) {
    *job = *n.planned;
    return HeldKind::kStarting;
  }
  return std::nullopt;
}

void AllocatorState::Accrue(NodeRecord& n, absl::Time until) {
  if (until <= n.held_since) return;
  if (n.held) {
    const double seconds = Seconds(until - n.held_since);
    held_total_.Add(*n.held, seconds);
    if (auto it = jobs_.find(n.held_job); it != jobs_.end()) it->second.held.Add(*n.held, seconds);
  }
  n.held_since = until;
}

void AllocatorState::Reclassify(NodeRecord& n, absl::Time at) {
  Accrue(n, at);
  n.held = ClassifyHeld(n, &n.held_job);
}

HeldSeconds AllocatorState::HeldTotal(absl::Time now) const {
  HeldSeconds total = held_total_;
  for (const auto& [name, n] : nodes_) {
    if (n.held && now > n.held_since) total.Add(*n.held, Seconds(now - n.held_since));
  }
  return total;
}

HeldSeconds AllocatorState::HeldOf(absl::string_view job, absl::Time now) const {
  auto it = jobs_.find(std::string(job));
  if (it == jobs_.end()) return {};
  HeldSeconds held = it->second.held;
  for (const auto& [name, n] : nodes_) {
    if (n.held && n.held_job == job && now > n.held_since) held.Add(*n.held, Seconds(now - n.held_since));
  }
  return held;
}

void AllocatorState::ResetHeldTime(absl::Time now) {
  held_total_ = {};
  for (auto& [id, job] : jobs_) job.held = {};
  for (auto& [name, n] : nodes_) {
    n.held_since = now;
    n.held = ClassifyHeld(n, &n.held_job);
  }
}

namespace {

// Node-seconds `n` has been offered (kActive since its registration) at `now`.
double ActiveSeconds(const NodeRecord& n, absl::Time now) {
  return std::max(0.0, Seconds(now - n.registered_at));
}

}  // namespace

void AllocatorState::CloseActive(const NodeRecord& n, absl::Time now) {
  closed_active_seconds_ += ActiveSeconds(n, now);
}

double AllocatorState::ReclaimRate(absl::Time now) const {
  double seconds = closed_active_seconds_;
  for (const auto& [name, n] : nodes_) {
    if (n.phase == NodePhase::kActive) seconds += ActiveSeconds(n, now);
  }
  return seconds > 0 ? static_cast<double>(reclaims_seen_) / seconds : 0.0;
}

absl::StatusOr<Applied> AllocatorState::ApplyRegister(const Envelope& e, const NodeRegister& m,
                                                      absl::Time now) {
  if (m.agent != e.sender) {
    return absl::PermissionDeniedError(absl::StrCat("node_register: body.agent '", m.agent,
                                                    "' must be the sender '", e.sender, "'"));
  }
  Applied a;
  auto it = nodes_.find(m.node);
  if (it != nodes_.end() && it->second.phase != NodePhase::kGone) {
    NodeRecord& n = it->second;
    if (n.agent != m.agent) {
      if (now - n.last_seen <= options_.heartbeat_timeout) {
        return absl::AlreadyExistsError(absl::StrFormat(
            "node '%s' is already registered by agent '%s' (heard from %.1f s ago); a second agent "
            "is refused until that one leaves or is silent for %s",
            m.node, n.agent, Seconds(now - n.last_seen),
            absl::FormatDuration(options_.heartbeat_timeout)));
      }
      // The old agent went silent without being expired yet: replace it.
    } else {
      const bool changed = !(n.node_class == m.node_class) || n.idle_until != m.idle_until;
      n.node_class = m.node_class;
      n.idle_until = m.idle_until;
      n.last_seen = now;
      a.needs_decision = changed;
      a.journal = changed;
      a.what = absl::StrCat("node ", m.node, " registered again by agent ", m.agent,
                            changed ? " (class or idle window changed)" : "");
      return a;
    }
  }
  NodeRecord fresh;
  fresh.node = m.node;
  fresh.agent = m.agent;
  fresh.node_class = m.node_class;
  fresh.idle_until = m.idle_until;
  fresh.registered_at = now;
  fresh.last_seen = now;
  if (it != nodes_.end()) {
    Accrue(it->second, now);  // the record it replaces (a silent agent's)
    if (it->second.phase == NodePhase::kActive) {
      CloseActive(it->second, std::min(now, it->second.last_seen));
    }
    fresh.planned = it->second.planned;
  }
  fresh.held_since = now;
  NodeRecord& stored = nodes_[m.node] = std::move(fresh);
  Reclassify(stored, now);
  a.needs_decision = true;
  a.journal = true;
  a.what = absl::StrCat("node ", m.node, " registered (agent ", m.agent, ", class ",
                        ClassId(m.node_class), ")");
  return a;
}

absl::StatusOr<Applied> AllocatorState::Apply(const Envelope& e, absl::Time now) {
  return std::visit(
      [&](const auto& m) -> absl::StatusOr<Applied> {
        using T = std::decay_t<decltype(m)>;
        Applied a;
        if constexpr (std::is_same_v<T, NodeRegister>) {
          return ApplyRegister(e, m, now);
        } else if constexpr (std::is_same_v<T, NodeReclaim>) {
          MALLE_ASSIGN_OR_RETURN(NodeRecord * n, AgentNode(e, m.node));
          n->last_seen = now;
          const absl::Time deadline = e.ts + m.grace;
          if (n->phase == NodePhase::kReclaiming && n->reclaim_deadline <= deadline) {
            a.what = absl::StrCat("node ", m.node, " reclaim repeated");
            return a;
          }
          if (n->phase == NodePhase::kActive) {
            CloseActive(*n, now);
            ++reclaims_seen_;
          }
          n->phase = NodePhase::kReclaiming;
          n->reclaim_deadline = deadline;
          a.needs_decision = a.journal = true;
          a.what = absl::StrCat("node ", m.node, " reclaimed, empty within ",
                                absl::FormatDuration(m.grace), " (", m.reason, ")");
        } else if constexpr (std::is_same_v<T, NodeLeave>) {
          MALLE_ASSIGN_OR_RETURN(NodeRecord * n, AgentNode(e, m.node));
          Accrue(*n, now);
          if (n->phase == NodePhase::kActive) CloseActive(*n, now);
          n->phase = NodePhase::kGone;
          n->why_gone = absl::StrCat("left: ", m.reason);
          n->running.reset();
          Reclassify(*n, now);
          a.needs_decision = a.journal = true;
          a.what = absl::StrCat("node ", m.node, " left (", m.reason, ")");
        } else if constexpr (std::is_same_v<T, AgentHeartbeat>) {
          MALLE_ASSIGN_OR_RETURN(NodeRecord * n, AgentNode(e, m.node));
          n->last_seen = now;
          // The agent says when its rank entered its phase: the held time is
          // accounted from then, not from when the heartbeat arrived (clamped:
          // never before what is already accounted, never after now).
          absl::Time at = now;
          if (m.running && m.running->phase_since) {
            at = std::clamp(*m.running->phase_since, std::min(n->held_since, now), now);
          }
          Accrue(*n, at);
          n->running = m.running;
          Reclassify(*n, at);
          if (m.running && m.running->phase.value_or(RankPhase::kTraining) == RankPhase::kTraining) {
            if (const JobRecord* cur = FindByRuntimeId(m.running->job)) {
              JobRecord& job = jobs_.at(cur->spec.job);
              job.formed = true;
              job.holder_seen = std::max(job.holder_seen, now);
            }
          }
          if (n->held == HeldKind::kProductive) {
            // The first member of a resumed incarnation trains: the unpark is over.
            auto it = jobs_.find(n->held_job);
            if (it != jobs_.end() && it->second.unpark_since) {
              it->second.unpark_s = Seconds(std::max(at - *it->second.unpark_since, absl::ZeroDuration()));
              it->second.unpark_since.reset();
            }
          }
        } else if constexpr (std::is_same_v<T, RankExit>) {
          auto nit = nodes_.find(m.node);
          if (nit != nodes_.end() && nit->second.agent != e.sender) {
            return absl::PermissionDeniedError(absl::StrCat("rank_exit: node '", m.node,
                                                            "' belongs to agent '", nit->second.agent,
                                                            "', not to '", e.sender, "'"));
          }
          if (nit != nodes_.end() && nit->second.running && nit->second.running->member == m.member) {
            Accrue(nit->second, now);
            nit->second.running.reset();
            Reclassify(nit->second, now);
          }
          const std::string how =
              m.signal != 0 ? absl::StrCat("signal ", m.signal) : absl::StrCat("exit ", m.exit_code);
          a.what = absl::StrCat("rank ", m.member, " of ", m.job, " on ", m.node, " ended (", how,
                                ", ", RankExitCauseName(m.cause), ")");
          {
            // A queued job is not started while a rank of it still runs (it
            // may be parking): that rank's end is a reason to decide again.
            const size_t dot = m.job.rfind(".i");
            auto waiting = jobs_.find(dot == std::string::npos ? m.job : m.job.substr(0, dot));
            if (waiting != jobs_.end() && waiting->second.phase == JobPhase::kQueued) {
              a.needs_decision = true;
            }
          }
          const JobRecord* found = FindByRuntimeId(m.job);
          if (found != nullptr && !found->formed && m.node == found->bootstrap_node) {
            // Only the first rank on the bootstrap node bootstraps; any later
            // one there joins, and would wait for a leader that never comes.
            jobs_.at(found->spec.job).bootstrap_ended = true;
          }
          if (found == nullptr || m.cause != RankExitCause::kExited) return a;
          JobRecord& job = jobs_.at(found->spec.job);
          if (job.phase != JobPhase::kRunning ||
              std::find(job.nodes.begin(), job.nodes.end(), m.node) == job.nodes.end()) {
            return a;  // not a rank the plan wants: its end changes nothing
          }
          if (m.exit_code == 0 && m.signal == 0) {
            EndJob(job, JobPhase::kSucceeded, now,
                   absl::StrCat("a rank on ", m.node, " exited 0: the program ended"));
            a.what += "; job succeeded";
          } else {
            // A job that committed steps since its last rank failure starts a
            // new streak: a node that dies now and then does not fail a job
            // that recovers; a program that crashes again before any step does.
            ++job.rank_failures;
            if (job.step > job.failure_step) job.failures_in_a_row = 0;
            job.failure_step = job.step;
            if (++job.failures_in_a_row >= options_.max_rank_failures) {
              EndJob(job, JobPhase::kFailed, now,
                     absl::StrCat(job.failures_in_a_row,
                                  " rank failures with no step committed between them (at step ",
                                  job.step, "), the last on ", m.node, " (", how, ")"));
              a.what += "; job failed";
            } else {
              a.what += absl::StrCat("; failure ", job.failures_in_a_row, " of ",
                                     options_.max_rank_failures, " allowed in a row (at step ",
                                     job.step, ")");
            }
          }
          a.needs_decision = a.journal = true;
        } else if constexpr (std::is_same_v<T, JobSubmit>) {
          auto it = jobs_.find(m.job);
          if (it != jobs_.end()) {
            return absl::AlreadyExistsError(absl::StrCat("job '", m.job, "' already exists (",
                                                         JobPhaseName(it->second.phase),
                                                         "); job ids are never reused"));
          }
          JobRecord job;
          job.spec = m;
          job.submitted_at = now;
          jobs_[m.job] = std::move(job);
          a.needs_decision = a.journal = true;
          a.what = absl::StrCat("job ", m.job, " submitted (", m.min_nodes, "..",
                                m.EffectiveMaxNodes(), " nodes)");
        } else if constexpr (std::is_same_v<T, JobCancel>) {
          MALLE_ASSIGN_OR_RETURN(JobRecord * job, LiveJob(m.job));
          EndJob(*job, JobPhase::kCancelled, now, m.reason);
          a.needs_decision = a.journal = true;
          a.what = absl::StrCat("job ", m.job, " cancelled (", m.reason, ")");
        } else if constexpr (std::is_same_v<T, AdvisorReport>) {
          MALLE_ASSIGN_OR_RETURN(JobRecord * job, LiveJob(m.job));
          auto report = advisor::ParseReportJson(m.report_json);
          if (!report.ok()) {
            return absl::InvalidArgumentError(absl::StrCat("advisor_report of job '", m.job,
                                                           "': body.report.", report.status().message()));
          }
          std::vector<alloc::Breakpoint> points;
          for (const advisor::CurvePoint& p : report->curve) points.push_back({p.nodes, p.samples_per_s});
          const int lo = job->spec.min_nodes, hi = job->spec.EffectiveMaxNodes();
          bool usable = false;
          for (const alloc::Breakpoint& b : points) usable |= b.nodes >= 1 && b.nodes <= hi;
          alloc::Curve curve = usable ? CurveFromPoints(points, lo, hi) : alloc::Curve{};
          a.needs_decision = CurveChange(curve, job->curve, lo, hi) > kCurveChangeThreshold;
          job->curve = std::move(curve);
          job->report_json = m.report_json;
          job->grow_pause_s = report->resize_cost_s.grow;
          job->shrink_pause_s = report->resize_cost_s.shrink;
          job->step = report->step;
          job->global_batch = report->model.global_batch;
          // The step that ends a run of rank failures is hard state: a journal
          // replay must count the failures in a row as the live service did.
          if (job->failures_in_a_row > 0 && job->step > job->failure_step) a.journal = true;
          a.what = absl::StrCat("advisor report of ", m.job, " at step ", report->step,
                                a.needs_decision ? " (curve changed)" : "");
          // Probes. A request outside the job's range is the job's
          // misunderstanding of it: dropped, and said so.
          std::optional<advisor::ProbeRequest> request = report->probe;
          if (request && (request->nodes < lo || request->nodes > hi)) {
            absl::StrAppend(&a.what, "; probe at ", request->nodes, " nodes ignored: outside ", lo, "..", hi);
            request.reset();
          }
          if (request && !job->probe && !job->probe_request) a.needs_decision = true;
          job->probe_request = std::move(request);
          if (job->probe) {
            JobRecord::Probe& pr = *job->probe;
            if (!pr.until_step && report->model.current_nodes >= pr.nodes) {
              pr.until_step = report->step + pr.steps;  // counted from the first step at the size
            }
            if (pr.until_step && report->step >= *pr.until_step) {
              absl::StrAppend(&a.what, "; probe at ", pr.nodes, " nodes done");
              job->probe.reset();
              a.needs_decision = true;
            }
          }
        } else if constexpr (std::is_same_v<T, JobComplete>) {
          MALLE_ASSIGN_OR_RETURN(JobRecord * job, LiveJob(m.job));
          job->steps = m.steps;
          job->samples = m.samples;
          const JobPhase phase = m.status == JobStatus::kSucceeded ? JobPhase::kSucceeded
                                 : m.status == JobStatus::kFailed  ? JobPhase::kFailed
                                                                   : JobPhase::kCancelled;
          EndJob(*job, phase, now, m.message);
          a.needs_decision = a.journal = true;
          a.what = absl::StrCat("job ", m.job, " completed: ", JobPhaseName(phase), " after ",
                                m.steps, " steps, ", m.samples, " samples");
        } else if constexpr (std::is_same_v<T, JobSaved>) {
          MALLE_ASSIGN_OR_RETURN(JobRecord * job, LiveJob(m.job));
          JobRecord::Saved saved{m.kind,  m.runtime_id, m.step, m.bytes, Seconds(m.write_time),
                                 now};
          job->last_saved = saved;
          job->step = std::max(job->step, m.step);
          a.what = absl::StrCat("job ", m.job, " (", m.runtime_id, ") ",
                                m.kind == SaveKind::kPark ? "parked" : "snapshot", " at step ",
                                m.step, ": ", m.bytes, " B in ",
                                absl::StrFormat("%.3f", Seconds(m.write_time)), " s");
          // Soft (not journaled, changes no decision), unless it ends a run of
          // rank failures: a replay must count those as the live service did.
          if (job->failures_in_a_row > 0 && job->step > job->failure_step) a.journal = true;
          if (m.kind == SaveKind::kSnapshot) return a;
          job->last_park = saved;
          ++job->parks;
          ++parks_;
          // The cost it will be priced at changed; so does its state when the
          // park is its current incarnation's: no rank holds the job any more.
          a.needs_decision = a.journal = true;
          if (m.runtime_id != job->RuntimeId()) {
            absl::StrAppend(&a.what, "; not its current incarnation ", job->RuntimeId(),
                            ": cost recorded");
            return a;
          }
          if (!job->nodes.empty()) {
            absl::StrAppend(&a.what, "; gives back ", job->nodes.size(), " node(s)");
            ReleaseNodes(*job, now);
          }
          job->phase = JobPhase::kQueued;
          job->parked = true;
          job->message = absl::StrCat("parked at step ", m.step);
          absl::StrAppend(&a.what, "; queued");
        } else if constexpr (std::is_same_v<T, AllocationPlan>) {
          return absl::InvalidArgumentError(
              absl::StrCat("allocation_plan from '", e.sender, "': only the allocator makes plans"));
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat(MessageTypeName(TypeOf(e.message)), " is not a message the allocator takes"));
        }
        return a;
      },
      e.message);
}

std::vector<std::string> AllocatorState::Expire(absl::Time now) {
  std::vector<std::string> changed;
  for (auto& [name, n] : nodes_) {
    if (n.phase == NodePhase::kGone) continue;
    if (now - n.last_seen > options_.heartbeat_timeout) {
      Accrue(n, now);
      // Offered until it was last heard from, not until it was found silent.
      if (n.phase == NodePhase::kActive) CloseActive(n, std::min(now, n.last_seen));
      n.phase = NodePhase::kGone;
      n.why_gone = absl::StrCat("agent ", n.agent, " silent for ",
                                absl::FormatDuration(absl::Trunc(now - n.last_seen, absl::Milliseconds(1))));
      n.running.reset();
      Reclassify(n, now);
      changed.push_back(absl::StrCat("node ", name, " withdrawn: ", n.why_gone));
    }
  }
  for (auto& [id, job] : jobs_) {
    if (job.phase != JobPhase::kRunning || job.nodes.empty()) continue;
    if (HolderAlive(job)) {
      job.holder_seen = std::max(job.holder_seen, now);
      continue;
    }
    if (now - job.holder_seen <= options_.heartbeat_timeout) continue;
    const std::string lost = job.RuntimeId();
    const std::string why = job.formed ? "every member of it is gone"
                                       : "its bootstrap rank ended or lost its node before a member trained";
    ReleaseNodes(job, now);
    ++lost_incarnations_;
    job.message = absl::StrCat("incarnation ", lost, " lost (", why,
                               "): the next start is a new incarnation, from the job's newest saved "
                               "state if it has a park store, else from scratch");
    changed.push_back(absl::StrCat("job ", id, ": ", job.message));
  }
  return changed;
}

void AllocatorState::TouchAll(absl::Time now) {
  for (auto& [name, n] : nodes_) {
    if (n.phase != NodePhase::kGone) n.last_seen = now;
  }
  // Heartbeats are not journaled: after a replay no incarnation is known to
  // have formed, and each gets a full heartbeat_timeout to show a holder.
  for (auto& [id, job] : jobs_) job.holder_seen = now;
}

double AllocatorState::RemainingSamples(const JobRecord& job) {
  if (!job.spec.total_steps.has_value() || job.global_batch <= 0) return 0;
  // At least one step: a job at its last step still has it to train.
  const int64_t steps = std::max<int64_t>(*job.spec.total_steps - job.step, 1);
  return static_cast<double>(steps) * static_cast<double>(job.global_batch);
}

alloc::Curve AllocatorState::CurveOf(const JobRecord& job) const {
  if (!job.curve.empty()) return job.curve;
  return PriorCurve(job.spec.min_nodes, job.spec.EffectiveMaxNodes(), options_.default_samples_per_s,
                    options_.default_serial_fraction);
}

bool AllocatorState::HasWork(absl::Time now) const {
  bool offered = false;
  for (const auto& [name, n] : nodes_) offered = offered || Offered(n, now);
  for (const auto& [id, j] : jobs_) {
    if (j.phase == JobPhase::kQueued && offered) return true;
    if (j.phase == JobPhase::kRunning) return true;
  }
  return false;
}

alloc::Problem AllocatorState::BuildProblem(absl::Time now) const {
  alloc::Problem p;
  p.forward_window = options_.forward_window;
  p.objective = options_.objective;
  p.resize_hysteresis = options_.resize_hysteresis;
  p.rank_weight_exponent = options_.rank_weight_exponent;
  p.rank_aging = options_.rank_aging;
  if (options_.reclaim_hazard) p.reclaim_rate = ReclaimRate(now);
  std::set<std::string> class_ids;
  std::set<std::string> offered;
  for (const auto& [name, n] : nodes_) {
    if (!Offered(n, now)) continue;
    const std::string cls = ClassId(n.node_class);
    if (class_ids.insert(cls).second) {
      p.classes.push_back(alloc::NodeClass{cls, n.node_class.group, n.node_class.speed});
    }
    alloc::Node node;
    node.id = name;
    node.class_id = cls;
    if (n.idle_until) node.expected_idle = std::max(*n.idle_until - now, absl::Seconds(1));
    p.nodes.push_back(std::move(node));
    offered.insert(name);
  }
  // Deterministic job order: priority (high first), then submission, then id.
  std::vector<const JobRecord*> live;
  for (const auto& [id, j] : jobs_) {
    if (j.phase == JobPhase::kRunning) live.push_back(&j);
    // Not restarted while a rank of it still runs: it may be writing the
    // state the next incarnation must resume from.
    if (j.phase == JobPhase::kQueued && (!j.nodes.empty() || !HasRankRunning(j))) live.push_back(&j);
  }
  std::sort(live.begin(), live.end(), [](const JobRecord* a, const JobRecord* b) {
    return std::make_tuple(-a->spec.priority, a->submitted_at, a->spec.job) <
           std::make_tuple(-b->spec.priority, b->submitted_at, b->spec.job);
  });
  // The penalty must exceed anything the other jobs could gain over the
  // window: 4 x an upper bound of the whole objective.
  // What one sample of a job is worth in the objective.
  auto scale_of = [this](const JobRecord& j, const alloc::Curve& curve) {
    double scale = j.spec.weight;
    if (options_.objective == alloc::Objective::kThroughput) scale = 1;
    if (options_.objective == alloc::Objective::kSpeedup) {
      const double at_min = alloc::Interpolate(curve, j.spec.min_nodes);
      scale = at_min > 0 ? j.spec.weight * j.spec.min_nodes / at_min : 0;
    }
    return scale;
  };
  double bound = 0;
  for (const JobRecord* j : live) {
    const alloc::Curve curve = CurveOf(*j);
    double best = 0;
    for (const alloc::Breakpoint& b : curve) best = std::max(best, b.samples_per_s);
    bound += best * scale_of(*j, curve) * Seconds(options_.forward_window);
  }
  // Rank weights multiply a job's value by up to (number of jobs)^exponent.
  if (options_.rank_weight_exponent > 0) {
    bound *= std::pow(static_cast<double>(std::max<size_t>(live.size(), 1)),
                      options_.rank_weight_exponent);
  }
  const double penalty = 4 * bound + 1;
  for (const JobRecord* j : live) {
    alloc::JobSpec spec;
    spec.id = j->spec.job;
    spec.min_nodes = j->spec.min_nodes;
    spec.max_nodes = j->spec.EffectiveMaxNodes();
    spec.throughput = CurveOf(*j);
    spec.resize_up_pause =
        j->grow_pause_s ? absl::Seconds(*j->grow_pause_s) : options_.default_grow_pause;
    spec.resize_down_pause =
        j->shrink_pause_s ? absl::Seconds(*j->shrink_pause_s) : options_.default_shrink_pause;
    spec.weight = j->spec.weight;
    spec.remaining_samples = RemainingSamples(*j);
    spec.age = std::max(absl::ZeroDuration(), now - j->submitted_at);
    for (const std::string& node : j->nodes) {
      if (offered.count(node)) spec.current_nodes.push_back(node);
    }
    const std::optional<double> park_s = j->ParkSeconds(), unpark_s = j->UnparkSeconds();
    if (j->phase == JobPhase::kRunning && !spec.current_nodes.empty()) {
      // A job that can park loses, by stopping, what it would have trained
      // while parking and resuming (measured); one that never parked may
      // have nowhere to put its state, and would lose all of it.
      spec.stop_penalty = penalty;
      if (park_s) {
        const double rate =
            alloc::Interpolate(spec.throughput, static_cast<int>(spec.current_nodes.size()));
        spec.stop_penalty = scale_of(*j, spec.throughput) * rate * (*park_s + *unpark_s);
      }
    }
    if (j->parked && unpark_s) {
      // Its start reads the parked state back before it trains.
      spec.resize_up_pause = std::max(spec.resize_up_pause, absl::Seconds(*unpark_s));
    }
    p.jobs.push_back(std::move(spec));
  }
  if (options_.rank_weight_exponent > 0) {
    // Rank weights need every job's work left. A job that has not said
    // counts as the longest: twice the longest known, in the node-seconds
    // at min_nodes that alloc ranks by (alloc::WorkLeftNodeSeconds), in its
    // own samples (that function's inverse).
    double longest = 0;
    for (const alloc::JobSpec& j : p.jobs) {
      if (j.remaining_samples <= 0) continue;
      longest = std::max(longest, alloc::WorkLeftNodeSeconds(j, j.remaining_samples));
    }
    for (alloc::JobSpec& j : p.jobs) {
      if (j.remaining_samples > 0) continue;
      const double per_sample = alloc::WorkLeftNodeSeconds(j, 1);  // +inf at a zero rate
      j.remaining_samples =
          std::isfinite(per_sample) && per_sample > 0 ? (2 * longest + 1) / per_sample : 1;
    }
  }
  return p;
}

AllocationPlan AllocatorState::Adopt(const alloc::Decision& decision, absl::Time now,
                                     absl::string_view policy) {
  std::map<std::string, std::vector<std::string>> wanted;
  for (const alloc::JobAllocation& ja : decision.allocation.jobs) {
    std::vector<std::string> nodes = ja.nodes;
    std::sort(nodes.begin(), nodes.end());
    wanted[ja.job_id] = std::move(nodes);
  }
  const std::vector<std::string> probe_notes =
      options_.honour_probes ? ApplyProbes(wanted, now) : std::vector<std::string>{};
  // A job that shrinks gives back the nodes whose ranks are not training
  // first: the policy chose how many nodes of each class it keeps, not which
  // ones, and releasing the node of a member while keeping one whose rank
  // still warms up would make the member drain (a leave, or for the last
  // member a whole job held by a rank that cannot leave) for nothing.
  // Likewise an incarnation that has not formed keeps its bootstrap node: its
  // other ranks are joiners that wait for the bootstrap rank there.
  auto trains_for = [&](const std::string& node, const JobRecord& job) {
    if (!job.formed && !job.bootstrap_ended && node == job.bootstrap_node) return true;
    const NodeRecord& n = nodes_.at(node);
    return n.running && n.running->job == job.RuntimeId() &&
           n.running->phase.value_or(RankPhase::kTraining) == RankPhase::kTraining;
  };
  for (auto& [id, job] : jobs_) {
    auto w = wanted.find(id);
    if (w == wanted.end() || job.nodes.empty()) continue;
    std::vector<std::string>& next = w->second;
    for (const std::string& gone : job.nodes) {
      std::sort(next.begin(), next.end());
      // (Only a node still offered: a reclaimed or silent one goes anyway.)
      if (std::binary_search(next.begin(), next.end(), gone) || !trains_for(gone, job) ||
          !Offered(nodes_.at(gone), now)) {
        continue;
      }
      for (std::string& kept : next) {
        const NodeRecord& k = nodes_.at(kept);
        if (std::binary_search(job.nodes.begin(), job.nodes.end(), kept) && !trains_for(kept, job) &&
            k.node_class == nodes_.at(gone).node_class) {
          // The member stays, the warming (or empty) node goes; a job the
          // policy gave the member's node gets the other one (same class).
          const std::string released = kept;
          kept = gone;
          for (auto& [other, nodes] : wanted) {
            if (other == id) continue;
            for (std::string& n : nodes) {
              if (n == gone) n = released;
            }
            std::sort(nodes.begin(), nodes.end());
          }
          break;
        }
      }
    }
  }
  for (auto& [id, job] : jobs_) {
    auto w = wanted.find(id);
    std::vector<std::string> next = w == wanted.end() ? std::vector<std::string>{} : w->second;
    if (job.phase != JobPhase::kQueued && job.phase != JobPhase::kRunning) next.clear();
    if (job.nodes.empty() && !next.empty()) {
      ++job.incarnation;
      job.formed = job.bootstrap_ended = false;
      job.holder_seen = now;
      // Never on a node that is still draining another job's rank: the
      // bootstrap would wait for it while the job's other nodes wait for the
      // bootstrap. The first free node, or (all draining) the first one.
      job.bootstrap_node = next.front();
      for (const std::string& node : next) {
        if (!Draining(nodes_.at(node))) {
          job.bootstrap_node = node;
          break;
        }
      }
      job.phase = JobPhase::kRunning;
      if (job.parked) job.unpark_since = now;
      job.parked = false;
    } else if (!job.nodes.empty() && next.empty() && job.phase == JobPhase::kRunning) {
      // Its last member parks (a job_saved then says so) if the job has a
      // park store; else its state is lost and it starts again from scratch.
      job.phase = JobPhase::kQueued;
      job.message = "stopped: the nodes left could not hold every running job";
      ++job_stops_;
    } else if (!job.nodes.empty() && !next.empty() && job.nodes != next) {
      ++resizes_;
    }
    job.nodes = std::move(next);
  }
  for (auto& [name, n] : nodes_) Accrue(n, now);
  for (auto& [name, n] : nodes_) n.planned.reset();
  for (const auto& [id, job] : jobs_) {
    for (const std::string& node : job.nodes) nodes_.at(node).planned = id;
  }
  for (auto& [name, n] : nodes_) Reclassify(n, now);
  AllocationPlan plan;
  plan.plan = next_plan_id();
  plan.decided_at = absl::FromUnixMicros(absl::ToUnixMicros(now));
  plan.policy = std::string(policy);
  plan.reason = decision.result.reason;
  for (const std::string& note : probe_notes) absl::StrAppend(&plan.reason, "; ", note);
  plan.reason = plan.reason.substr(0, kMaxTextBytes);
  for (const auto& [name, n] : nodes_) {
    if (n.phase == NodePhase::kGone) continue;
    plan.assignments.push_back(Assignment{name, n.planned});
  }
  for (const auto& [id, job] : jobs_) {
    if (job.nodes.empty()) continue;
    plan.sizes.push_back(JobSize{id, static_cast<int>(job.nodes.size())});
    plan.launches.push_back(JobLaunch{id, job.RuntimeId(), job.bootstrap_node});
  }
  last_plan_ = plan;
  last_decision_ = DecisionInfo{now, std::string(policy), plan.reason,
                                absl::ToDoubleMilliseconds(decision.result.solve_time),
                                decision.objective};
  return plan;
}

std::vector<std::string> AllocatorState::ApplyProbes(
    std::map<std::string, std::vector<std::string>>& wanted, absl::Time now) {
  std::vector<std::string> notes;
  std::set<std::string> taken;
  for (const auto& [id, nodes] : wanted) taken.insert(nodes.begin(), nodes.end());
  std::vector<std::string> spare;  // offered, not in the policy's answer; by name
  for (const auto& [name, n] : nodes_) {
    if (Offered(n, now) && !taken.count(name)) spare.push_back(name);
  }
  for (auto& [id, job] : jobs_) {
    auto w = wanted.find(id);
    const bool live = job.phase == JobPhase::kQueued || job.phase == JobPhase::kRunning;
    if (!live || w == wanted.end() || w->second.empty()) {
      job.probe.reset();  // the policy stopped it (or never started it): no probe
      continue;
    }
    std::vector<std::string>& nodes = w->second;
    if (job.probe && now - job.probe->granted_at > options_.max_probe) {
      notes.push_back(absl::StrCat("probe of ", id, " at ", job.probe->nodes, " nodes ended after ",
                                   absl::FormatDuration(options_.max_probe)));
      job.probe.reset();
    }
    const int have = static_cast<int>(nodes.size());
    if (!job.probe && job.probe_request && job.probe_request->nodes > have &&
        job.probe_request->nodes - have <= static_cast<int>(spare.size()) &&
        (!job.last_probe_at || now - *job.last_probe_at >= options_.probe_cooldown)) {
      job.probe = JobRecord::Probe{job.probe_request->nodes, job.probe_request->steps, now,
                                   std::nullopt, job.probe_request->reason};
      job.last_probe_at = now;
      job.probe_request.reset();
      notes.push_back(absl::StrCat("probe granted: ", id, " at ", job.probe->nodes, " nodes for ",
                                   job.probe->steps, " steps from spare nodes (", job.probe->reason, ")"));
    } else if (job.probe && job.probe->nodes > have) {
      notes.push_back(absl::StrCat("probe of ", id, " at ", job.probe->nodes, " nodes held"));
    }
    if (!job.probe || job.probe->nodes <= have) continue;
    // Spare nodes the job already holds first (no resize), then the others.
    int need = job.probe->nodes - have;
    std::vector<std::string> order;
    for (const std::string& s : spare) {
      if (std::binary_search(job.nodes.begin(), job.nodes.end(), s)) order.push_back(s);
    }
    for (const std::string& s : spare) {
      if (!std::binary_search(job.nodes.begin(), job.nodes.end(), s)) order.push_back(s);
    }
    for (const std::string& s : order) {
      if (need == 0) break;
      nodes.push_back(s);
      spare.erase(std::find(spare.begin(), spare.end(), s));
      --need;
    }
    std::sort(nodes.begin(), nodes.end());
  }
  return notes;
}

absl::Status AllocatorState::Restore(const AllocationPlan& plan) {
  std::map<std::string, std::vector<std::string>> wanted;
  for (const Assignment& a : plan.assignments) {
    if (!nodes_.count(a.node)) {
      return absl::NotFoundError(absl::StrCat("plan ", plan.plan, ": unknown node '", a.node, "'"));
    }
    if (a.job) wanted[*a.job].push_back(a.node);
  }
  for (const auto& [id, nodes] : wanted) {
    if (!jobs_.count(id)) {
      return absl::NotFoundError(absl::StrCat("plan ", plan.plan, ": unknown job '", id, "'"));
    }
  }
  for (const JobLaunch& l : plan.launches) {
    auto it = jobs_.find(l.job);
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("plan ", plan.plan, ": unknown job '", l.job, "'"));
    }
    const size_t dot = l.runtime_id.rfind(".i");
    int incarnation = 0;
    if (dot == std::string::npos || !absl::SimpleAtoi(l.runtime_id.substr(dot + 2), &incarnation)) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan ", plan.plan, ": runtime id '", l.runtime_id, "' is not <job>.i<k>"));
    }
    it->second.incarnation = incarnation;
    it->second.bootstrap_node = l.bootstrap_node;
  }
  for (auto& [id, job] : jobs_) {
    auto w = wanted.find(id);
    std::vector<std::string> next = w == wanted.end() ? std::vector<std::string>{} : w->second;
    std::sort(next.begin(), next.end());
    if (job.phase == JobPhase::kQueued && !next.empty()) {
      job.phase = JobPhase::kRunning;
      job.parked = false;
    }
    if (job.phase == JobPhase::kRunning && next.empty()) job.phase = JobPhase::kQueued;
    job.nodes = std::move(next);
  }
  for (auto& [name, n] : nodes_) Accrue(n, plan.decided_at);
  for (auto& [name, n] : nodes_) n.planned.reset();
  for (const auto& [id, job] : jobs_) {
    for (const std::string& node : job.nodes) nodes_.at(node).planned = id;
  }
  for (auto& [name, n] : nodes_) Reclassify(n, plan.decided_at);
  last_plan_ = plan;
  last_decision_ = DecisionInfo{plan.decided_at, plan.policy, plan.reason, 0, 0};
  return absl::OkStatus();
}

std::string AllocatorState::StatusJson(absl::Time now) const {
  Json out;
  out["version"] = 1;
  out["now"] = Unix(now);
  // The main scheduler's reclaims so far, and the rate the objective prices
  // when reclaim_hazard is on.
  out["reclaims"] = {{"seen", reclaims_seen_},
                     {"per_node_hour", 3600 * ReclaimRate(now)},
                     {"priced", options_.reclaim_hazard}};
  Json nodes = Json::array();
  for (const auto& [name, n] : nodes_) {
    Json j;
    j["node"] = name;
    j["agent"] = n.agent;
    j["class"] = ClassId(n.node_class);
    j["phase"] = NodePhaseName(n.phase);
    j["offered"] = Offered(n, now);
    j["last_seen_s_ago"] = Seconds(now - n.last_seen);
    j["idle_until"] = n.idle_until ? Json(Unix(*n.idle_until)) : Json(nullptr);
    if (n.phase == NodePhase::kReclaiming) j["reclaim_deadline"] = Unix(n.reclaim_deadline);
    if (n.phase == NodePhase::kGone) j["why_gone"] = n.why_gone;
    j["planned"] = n.planned ? Json(*n.planned) : Json(nullptr);
    j["running"] = n.running ? Json(n.running->job) : Json(nullptr);
    j["rank_phase"] = n.running && n.running->phase ? Json(RankPhaseName(*n.running->phase)) : Json(nullptr);
    j["held"] = n.held ? Json(HeldKindName(*n.held)) : Json(nullptr);
    nodes.push_back(std::move(j));
  }
  out["nodes"] = std::move(nodes);
  Json jobs = Json::array();
  for (const auto& [id, job] : jobs_) {
    Json j;
    j["job"] = id;
    // A parked job is a queued one whose state waits in its park store.
    j["phase"] = job.phase == JobPhase::kQueued && job.parked ? "parked" : JobPhaseName(job.phase);
    j["runtime_id"] = job.incarnation > 0 ? Json(job.RuntimeId()) : Json(nullptr);
    j["min_nodes"] = job.spec.min_nodes;
    j["max_nodes"] = job.spec.EffectiveMaxNodes();
    j["nodes"] = job.nodes;
    int running = 0;
    for (const std::string& node : job.nodes) {
      const NodeRecord& n = nodes_.at(node);
      if (n.running && n.running->job == job.RuntimeId()) ++running;
    }
    j["running_nodes"] = running;
    int productive = 0, held_nodes = 0;
    for (const auto& [name, n] : nodes_) {
      if (n.held && n.held_job == id) {
        ++held_nodes;
        productive += *n.held == HeldKind::kProductive;
      }
    }
    j["productive_nodes"] = productive;  // now: members training where the plan wants them
    j["held_nodes"] = held_nodes;        // now: planned for it or running a rank of it
    j["held"] = HeldJson(HeldOf(id, now));
    // Predicted at the planned size (from the curve the allocator uses).
    j["samples_per_s"] =
        job.nodes.empty() ? 0.0 : alloc::Interpolate(CurveOf(job), static_cast<int>(job.nodes.size()));
    j["step"] = job.step;
    // The work it has left (rank weights), when it declared total_steps and reported.
    j["total_steps"] = job.spec.total_steps ? Json(*job.spec.total_steps) : Json(nullptr);
    const double left = RemainingSamples(job);
    j["remaining_samples"] = left > 0 ? Json(left) : Json(nullptr);
    j["has_report"] = !job.report_json.empty();
    j["rank_failures"] = job.rank_failures;
    j["failures_in_a_row"] = job.failures_in_a_row;
    j["submitted_at"] = Unix(job.submitted_at);
    if (job.phase != JobPhase::kQueued && job.phase != JobPhase::kRunning) {
      j["ended_at"] = Unix(job.ended_at);
      j["steps"] = job.steps;
      j["samples"] = job.samples;
    }
    // Parking: the newest saved state (park or snapshot) and its age, the
    // newest park and its measured cost.
    j["parks"] = job.parks;
    if (job.last_saved) {
      j["saved"] = {{"kind", SaveKindName(job.last_saved->kind)},
                    {"step", job.last_saved->step},
                    {"bytes", job.last_saved->bytes},
                    {"age_s", Seconds(now - job.last_saved->at)}};
    } else {
      j["saved"] = nullptr;
    }
    if (job.last_park) {
      j["park"] = {{"step", job.last_park->step},
                   {"bytes", job.last_park->bytes},
                   {"at", Unix(job.last_park->at)},
                   {"park_s", *job.ParkSeconds()},
                   {"unpark_s", *job.UnparkSeconds()},
                   {"unpark_measured", job.unpark_s.has_value()}};
    } else {
      j["park"] = nullptr;
    }
    j["message"] = job.message;
    jobs.push_back(std::move(j));
  }
  out["jobs"] = std::move(jobs);
  out["held"] = HeldJson(HeldTotal(now));
  if (last_decision_) {
    Json d;
    d["plan"] = last_plan_ ? last_plan_->plan : 0;
    d["at"] = Unix(last_decision_->at);
    d["policy"] = last_decision_->policy;
    d["reason"] = last_decision_->reason;
    d["solve_ms"] = last_decision_->solve_ms;
    d["objective"] = last_decision_->objective;
    out["last_decision"] = std::move(d);
  } else {
    out["last_decision"] = nullptr;
  }
  return out.dump();
}

}  // namespace malle::control
