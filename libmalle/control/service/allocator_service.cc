#include "libmalle/control/service/allocator_service.h"

#include <algorithm>
#include <map>
#include <utility>
#include <variant>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/control/service/metrics.h"
#include "nlohmann/json.hpp"

namespace malle::control {
namespace {

// The envelope JSON of a signed message: everything before the MAC.
absl::string_view EnvelopeOf(absl::string_view wire) {
  const size_t space = wire.rfind(' ');
  return space == absl::string_view::npos ? wire : wire.substr(0, space);
}

std::string CodeName(const absl::Status& s) { return absl::StatusCodeToString(s.code()); }

// The control store did not answer (comm::ControlStore marks its errors).
bool IsStoreError(const absl::Status& s) {
  auto cls = s.GetPayload(comm::kErrorClassPayload);
  return cls.has_value() && *cls == "StoreError";
}

}  // namespace

absl::Status AllocatorServiceOptions::Validate() const {
  MALLE_RETURN_IF_ERROR(state.Validate());
  auto positive = [](absl::string_view name, absl::Duration d) -> absl::Status {
    if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("AllocatorServiceOptions.", name,
                                                     " must be finite and > 0, got ",
                                                     absl::FormatDuration(d)));
    }
    return absl::OkStatus();
  };
  MALLE_RETURN_IF_ERROR(positive("poll_interval", poll_interval));
  MALLE_RETURN_IF_ERROR(positive("hole_timeout", hole_timeout));
  MALLE_RETURN_IF_ERROR(positive("status_interval", status_interval));
  MALLE_RETURN_IF_ERROR(positive("republish_interval", republish_interval));
  if (republish_interval > absl::Hours(12)) {
    return absl::InvalidArgumentError(
        "AllocatorServiceOptions.republish_interval must be <= 12h (readers accept a day)");
  }
  if (debounce < absl::ZeroDuration() || report_min_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "AllocatorServiceOptions.debounce and report_min_interval must be >= 0");
  }
  return ValidateId("AllocatorServiceOptions.sender", sender);
}

AllocatorService::AllocatorService(std::shared_ptr<comm::ControlStore> store, Secret secret,
                                   AllocatorServiceOptions options, std::unique_ptr<Journal> journal)
    : store_(std::move(store)),
      secret_(secret),
      options_(std::move(options)),
      journal_(std::move(journal)),
      outbox_(store_, std::move(secret), options_.sender),
      state_(options_.state) {}

absl::StatusOr<std::unique_ptr<AllocatorService>> AllocatorService::Create(
    std::shared_ptr<comm::ControlStore> store, Secret secret, AllocatorServiceOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("AllocatorService: null store");
  MALLE_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Journal> journal;
  if (!options.journal_path.empty()) {
    MALLE_ASSIGN_OR_RETURN(journal, Journal::Open(options.journal_path));
  }
  std::unique_ptr<AllocatorService> service(
      new AllocatorService(std::move(store), std::move(secret), std::move(options), std::move(journal)));
  MALLE_RETURN_IF_ERROR(service->Replay());
  return service;
}

AllocatorService::~AllocatorService() { (void)Stop(); }

absl::Status AllocatorService::Replay() {
  if (journal_ == nullptr) return absl::OkStatus();
  if (journal_->dropped_torn_tail()) {
    MALLE_LOG(WARNING) << journal_->path() << ": dropped an incomplete last record (a crash while writing it)";
  }
  absl::MutexLock lock(&mu_);
  int line = 0;
  for (const JournalRecord& r : journal_->records()) {
    ++line;
    absl::StatusOr<Envelope> e = DecodeEnvelopeJson(r.envelope_json);
    if (!e.ok()) {
      return absl::DataLossError(absl::StrCat(journal_->path(), ":", line, ": ", e.status().message()));
    }
    guard_.Record(e->sender, e->seq, e->ts);
    cursor_ = std::max(cursor_, r.cursor);
    if (const auto* plan = std::get_if<AllocationPlan>(&e->message)) {
      MALLE_RETURN_IF_ERROR(state_.Restore(*plan));
      continue;
    }
    absl::StatusOr<Applied> a = state_.Apply(*e, r.at);
    if (!a.ok()) {
      // The same message was accepted when it was journaled; the state rules
      // are deterministic, so this is a journal from another version.
      return absl::DataLossError(absl::StrCat(journal_->path(), ":", line, ": replay refused: ",
                                              a.status().message()));
    }
  }
  MALLE_LOG(INFO) << "journal " << journal_->path() << ": replayed " << journal_->records().size()
                  << " records; " << state_.nodes().size() << " nodes, " << state_.jobs().size()
                  << " jobs, inbox position " << cursor_;
  return absl::OkStatus();
}

absl::Status AllocatorService::Begin(absl::Time now) {
  MALLE_ASSIGN_OR_RETURN(epoch_, store_->Add(keys::kEpoch, 1));
  MALLE_ASSIGN_OR_RETURN(int64_t stored_cursor, store_->Add(keys::kInboxCursor, 0));
  cursor_ = std::max(cursor_, stored_cursor);
  {
    absl::MutexLock lock(&mu_);
    state_.TouchAll(now);
    // A replay rebuilt the plans but not the heartbeats: held time counts from here.
    state_.ResetHeldTime(now);
    stats_.epoch = epoch_;
    stats_.cursor = cursor_;
    // Job specs: the store may be younger than the journal.
    for (const auto& [id, job] : state_.jobs()) {
      if (job.phase != JobPhase::kQueued && job.phase != JobPhase::kRunning) continue;
      MALLE_ASSIGN_OR_RETURN(std::string wire, outbox_.SignNow(job.spec));
      MALLE_RETURN_IF_ERROR(store_->Set(keys::JobSpecKey(id), wire));
    }
    if (state_.HasWork(now)) pending_since_ = now, pending_report_only_ = false;
  }
  MALLE_LOG(INFO) << "allocator epoch " << epoch_ << " starts at inbox position " << cursor_;
  MALLE_RETURN_IF_ERROR(PublishPlan(now));
  return PublishStatus(now);
}

absl::Status AllocatorService::CheckEpoch() {
  MALLE_ASSIGN_OR_RETURN(int64_t epoch, store_->Add(keys::kEpoch, 0));
  if (epoch < epoch_) {
    // Not another allocator (it would have a larger epoch): the store came
    // back empty after a restart.
    return StoreBack(absl::FromUnixMicros(absl::ToUnixMicros(absl::Now())));
  }
  if (epoch != epoch_) {
    return absl::AbortedError(absl::StrCat("allocator epoch ", epoch_, " replaced by epoch ", epoch,
                                           ": another allocator took over"));
  }
  return absl::OkStatus();
}

void AllocatorService::Reject(const absl::Status& why, absl::string_view what) {
  MALLE_LOG(WARNING) << "rejected " << what << ": " << why;
  absl::MutexLock lock(&mu_);
  ++stats_.rejected;
  stats_.last_rejection = absl::StrCat(CodeName(why), ": ", why.message());
  stats_.recent_rejections.push_back(absl::StrCat(what, ": ", stats_.last_rejection));
  if (stats_.recent_rejections.size() > 20) stats_.recent_rejections.pop_front();
}

absl::Status AllocatorService::Handle(const std::string& wire, absl::Time now) {
  absl::StatusOr<Envelope> e = Verify(wire, secret_, guard_, now, options_.verify);
  if (!e.ok()) {
    Reject(e.status(), absl::StrCat("inbox message ", cursor_));
    return absl::OkStatus();
  }
  absl::StatusOr<Applied> a;
  {
    absl::MutexLock lock(&mu_);
    a = state_.Apply(*e, now);
  }
  if (!a.ok()) {
    Reject(a.status(), absl::StrCat(MessageTypeName(TypeOf(e->message)), " from ", e->sender));
    return absl::OkStatus();
  }
  if (a->journal && journal_ != nullptr) {
    MALLE_RETURN_IF_ERROR(journal_->Append({now, cursor_, std::string(EnvelopeOf(wire))}));
  }
  if (const auto* report = std::get_if<AdvisorReport>(&e->message)) {
    // Clients read it as the job signed it.
    MALLE_RETURN_IF_ERROR(store_->Set(keys::ReportKey(report->job), wire));
  }
  if (const auto* submit = std::get_if<JobSubmit>(&e->message)) {
    MALLE_ASSIGN_OR_RETURN(std::string spec, outbox_.SignNow(*submit));
    MALLE_RETURN_IF_ERROR(store_->Set(keys::JobSpecKey(submit->job), spec));
  }
  // Reports and snapshots come every few seconds: not logged.
  const auto* saved = std::get_if<JobSaved>(&e->message);
  if (!a->what.empty() && TypeOf(e->message) != MessageType::kAdvisorReport &&
      !(saved != nullptr && saved->kind == SaveKind::kSnapshot)) {
    MALLE_LOG(INFO) << a->what;
  }
  absl::MutexLock lock(&mu_);
  ++stats_.accepted;
  if (a->needs_decision) {
    if (!pending_since_) pending_since_ = now;
    if (TypeOf(e->message) != MessageType::kAdvisorReport) pending_report_only_ = false;
  }
  return absl::OkStatus();
}

absl::Status AllocatorService::Consume(absl::Time now) {
  MALLE_ASSIGN_OR_RETURN(int64_t next, store_->Add(keys::kInboxNext, 0));
  const int64_t start = cursor_;
  while (cursor_ < next && !stop_.load()) {
    const std::string key = keys::InboxKey(cursor_ + 1);
    MALLE_ASSIGN_OR_RETURN(std::optional<std::string> wire, store_->TryGet(key));
    if (!wire) {
      // A ticket taken but not (yet) written.
      if (!hole_since_) hole_since_ = now;
      if (now - *hole_since_ < options_.hole_timeout) break;
      MALLE_LOG(WARNING) << "inbox ticket " << cursor_ + 1 << " was never written within "
                         << options_.hole_timeout << "; skipped (its sender died after taking it?)";
      hole_since_.reset();
      ++cursor_;
      absl::MutexLock lock(&mu_);
      ++stats_.holes_skipped;
      continue;
    }
    hole_since_.reset();
    ++cursor_;
    MALLE_RETURN_IF_ERROR(Handle(*wire, now));
    MALLE_RETURN_IF_ERROR(store_->Delete(key).status());
  }
  if (cursor_ != start) {
    MALLE_RETURN_IF_ERROR(store_->Set(keys::kInboxCursor, absl::StrCat(cursor_)));
    absl::MutexLock lock(&mu_);
    stats_.cursor = cursor_;
  }
  return absl::OkStatus();
}

absl::Status AllocatorService::Decide(absl::Time now) {
  const absl::Time t0 = absl::Now();
  absl::StatusOr<alloc::Decision> decision;
  alloc::Problem problem;
  {
    absl::MutexLock lock(&mu_);
    problem = state_.BuildProblem(now);
  }
  // The solve runs without the lock: status readers are not held up by it.
  decision = alloc::Decide(problem, options_.decide);
  pending_since_.reset();
  pending_report_only_ = true;
  last_decision_ = now;
  if (!decision.ok()) {
    // BuildProblem makes valid problems; this is a bug, not bad input.
    MALLE_LOG(ERROR) << "decision failed, keeping the current plan: " << decision.status();
    return absl::OkStatus();
  }
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  AllocationPlan plan;
  {
    absl::MutexLock lock(&mu_);
    plan = state_.Adopt(*decision, now, alloc::PolicyName(decision->policy));
    ++stats_.decisions;
    stats_.decision_ms.push_back(ms);
    stats_.decision_ms_sum += ms;
    if (stats_.decision_ms.size() > 1000) stats_.decision_ms.pop_front();
  }
  MALLE_ASSIGN_OR_RETURN(std::string wire, outbox_.SignNow(plan));
  if (journal_ != nullptr) {
    MALLE_RETURN_IF_ERROR(journal_->Append({now, cursor_, std::string(EnvelopeOf(wire))}));
  }
  MALLE_LOG(INFO) << "plan " << plan.plan << " (" << ms << " ms): " << plan.reason;
  MALLE_RETURN_IF_ERROR(CheckEpoch());
  // Status first: an agent that sees the new plan reads a status that
  // already explains it (e.g. that a job it runs has succeeded).
  MALLE_RETURN_IF_ERROR(PublishStatus(now));
  MALLE_RETURN_IF_ERROR(store_->Set(keys::kPlan, wire));
  MALLE_RETURN_IF_ERROR(store_->Set(keys::kPlanId, absl::StrCat(plan.plan)));
  last_republish_ = now;
  return absl::OkStatus();
}

absl::Status AllocatorService::PublishPlan(absl::Time now) {
  std::optional<AllocationPlan> plan;
  {
    absl::MutexLock lock(&mu_);
    plan = state_.last_plan();
  }
  last_republish_ = now;
  if (!plan) return absl::OkStatus();
  MALLE_ASSIGN_OR_RETURN(std::string wire, outbox_.SignNow(*plan));
  MALLE_RETURN_IF_ERROR(CheckEpoch());
  MALLE_RETURN_IF_ERROR(store_->Set(keys::kPlan, wire));
  return store_->Set(keys::kPlanId, absl::StrCat(plan->plan));
}

absl::Status AllocatorService::PublishStatus(absl::Time now) {
  std::string json;
  {
    absl::MutexLock lock(&mu_);
    nlohmann::json doc = nlohmann::json::parse(state_.StatusJson(now));
    nlohmann::json s;
    s["epoch"] = stats_.epoch;
    s["accepted"] = stats_.accepted;
    s["rejected"] = stats_.rejected;
    s["last_rejection"] = stats_.last_rejection;
    s["recent_rejections"] = std::vector<std::string>(stats_.recent_rejections.begin(),
                                                      stats_.recent_rejections.end());
    s["holes_skipped"] = stats_.holes_skipped;
    s["store_errors"] = stats_.store_errors;
    s["store_resets"] = stats_.store_resets;
    s["decisions"] = stats_.decisions;
    s["inbox_position"] = stats_.cursor;
    s["policy"] = alloc::PolicyName(options_.decide.policy);
    s["journal"] = options_.journal_path;
    doc["allocator"] = std::move(s);
    json = doc.dump();
    status_json_ = json;
  }
  last_status_ = now;
  MALLE_ASSIGN_OR_RETURN(std::string wire, outbox_.SignNow(AllocatorStatus{json}));
  return store_->Set(keys::kStatus, wire);
}

absl::Status AllocatorService::Step(absl::Time now) {
  // The journal keeps microseconds: so does the state, or a replay would differ.
  now = absl::FromUnixMicros(absl::ToUnixMicros(now));
  // Fencing: an instance replaced by a newer one must not even consume the
  // inbox (it would take messages from the new one).
  MALLE_RETURN_IF_ERROR(CheckEpoch());
  MALLE_RETURN_IF_ERROR(Consume(now));
  if (now - last_expire_ >= absl::Seconds(1)) {
    last_expire_ = now;
    std::vector<std::string> expired;
    {
      absl::MutexLock lock(&mu_);
      expired = state_.Expire(now);
    }
    for (const std::string& what : expired) MALLE_LOG(WARNING) << what;
    if (!expired.empty()) {
      if (!pending_since_) pending_since_ = now;
      pending_report_only_ = false;
    }
  }
  if (pending_since_ && now - *pending_since_ >= options_.debounce &&
      (!pending_report_only_ || now - last_decision_ >= options_.report_min_interval)) {
    MALLE_RETURN_IF_ERROR(Decide(now));
  }
  if (now - last_republish_ >= options_.republish_interval) MALLE_RETURN_IF_ERROR(PublishPlan(now));
  if (now - last_status_ >= options_.status_interval) MALLE_RETURN_IF_ERROR(PublishStatus(now));
  return absl::OkStatus();
}

absl::Status AllocatorService::Run() {
  MALLE_RETURN_IF_ERROR(Begin(absl::Now()));
  int64_t failures = 0;
  while (!stop_.load()) {
    absl::Status s = Step(absl::Now());
    if (!s.ok() && IsStoreError(s)) {
      // The store is down: nothing to read or publish, the state and the
      // journal are intact; jobs train on at their sizes. Retry.
      if (failures++ % 100 == 0) {
        MALLE_LOG(WARNING) << "control store unreachable (" << s.message() << "); the allocator waits for it";
      }
      {
        absl::MutexLock lock(&mu_);
        ++stats_.store_errors;
      }
      absl::SleepFor(options_.poll_interval * 5);
      continue;
    }
    MALLE_RETURN_IF_ERROR(s);
    if (failures > 0) {
      failures = 0;
      // Back: re-seed what a restarted store lost, and publish everything again.
      absl::Status back = StoreBack(absl::Now());
      if (!back.ok() && !IsStoreError(back)) return back;
    }
    absl::SleepFor(options_.poll_interval);
  }
  return absl::OkStatus();
}

absl::Status AllocatorService::StoreBack(absl::Time now) {
  MALLE_ASSIGN_OR_RETURN(int64_t stored_epoch, store_->Add(keys::kEpoch, 0));
  if (stored_epoch < epoch_) {
    // The store restarted empty (a newer allocator would have a larger
    // epoch). Its inbox numbering restarted too: handle the tickets taken
    // since (they sit below our cursor), then move the counter past our
    // cursor so that new tickets follow it.
    MALLE_LOG(WARNING) << "the control store lost its contents (epoch " << stored_epoch << " < " << epoch_
                       << "); re-seeding it from the allocator's state";
    MALLE_RETURN_IF_ERROR(store_->Add(keys::kEpoch, epoch_ - stored_epoch).status());
    MALLE_ASSIGN_OR_RETURN(int64_t taken, store_->Add(keys::kInboxNext, 0));
    for (int64_t i = 1; i <= taken; ++i) {
      MALLE_ASSIGN_OR_RETURN(std::optional<std::string> wire, store_->TryGet(keys::InboxKey(i)));
      if (!wire) continue;  // never written: its sender died, or will re-send
      MALLE_RETURN_IF_ERROR(Handle(*wire, now));
      MALLE_RETURN_IF_ERROR(store_->Delete(keys::InboxKey(i)).status());
    }
    MALLE_RETURN_IF_ERROR(store_->Add(keys::kInboxNext, cursor_).status());
    cursor_ += taken;
    MALLE_RETURN_IF_ERROR(store_->Set(keys::kInboxCursor, absl::StrCat(cursor_)));
    absl::MutexLock lock(&mu_);
    ++stats_.store_resets;
    stats_.cursor = cursor_;
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : state_.jobs()) {
      if (job.phase != JobPhase::kQueued && job.phase != JobPhase::kRunning) continue;
      MALLE_ASSIGN_OR_RETURN(std::string wire, outbox_.SignNow(job.spec));
      MALLE_RETURN_IF_ERROR(store_->Set(keys::JobSpecKey(id), wire));
    }
  }
  MALLE_RETURN_IF_ERROR(PublishPlan(now));
  return PublishStatus(now);
}

absl::Status AllocatorService::Start() {
  if (thread_.joinable()) return absl::FailedPreconditionError("AllocatorService already started");
  stop_.store(false);
  thread_ = std::thread([this] {
    absl::Status s = Run();
    if (!s.ok()) MALLE_LOG(ERROR) << "allocator stopped: " << s;
    thread_status_ = s;
  });
  return absl::OkStatus();
}

absl::Status AllocatorService::Stop() {
  stop_.store(true);
  if (thread_.joinable()) {
    thread_.join();
    return thread_status_;
  }
  return absl::OkStatus();
}

std::string AllocatorService::StatusJson() const {
  absl::MutexLock lock(&mu_);
  return status_json_;
}

std::string AllocatorService::MetricsText() const {
  const absl::Time now = absl::Now();
  control::MetricsText m;
  absl::MutexLock lock(&mu_);
  std::map<std::string, int> node_phases = {{"active", 0}, {"reclaiming", 0}, {"gone", 0}};
  for (const auto& [name, n] : state_.nodes()) ++node_phases[std::string(NodePhaseName(n.phase))];
  for (const auto& [phase, count] : node_phases) {
    m.Gauge("malle_allocator_nodes", "Nodes the allocator knows, by phase.", count, {{"phase", phase}});
  }
  m.Gauge("malle_allocator_nodes_offered", "Nodes offered to jobs now.",
          static_cast<double>(state_.BuildProblem(now).nodes.size()));
  std::map<std::string, int> job_phases = {
      {"queued", 0}, {"parked", 0}, {"running", 0}, {"succeeded", 0}, {"failed", 0}, {"cancelled", 0}};
  for (const auto& [id, j] : state_.jobs()) {
    // As the status document says it: a parked job is a queued one with its state parked.
    ++job_phases[j.phase == JobPhase::kQueued && j.parked ? "parked" : std::string(JobPhaseName(j.phase))];
  }
  for (const auto& [phase, count] : job_phases) {
    m.Gauge("malle_allocator_jobs", "Jobs by phase.", count, {{"phase", phase}});
  }
  m.Counter("malle_allocator_decisions_total", "Allocation decisions taken.", stats_.decisions);
  m.Summary("malle_allocator_decision_seconds", "Time to decide (build, solve, adopt), last 1000.",
            [&] {
              std::vector<double> v;
              for (double ms : stats_.decision_ms) v.push_back(ms / 1e3);
              return v;
            }(),
            stats_.decision_ms_sum / 1e3, static_cast<double>(stats_.decisions));
  m.Counter("malle_allocator_resizes_total", "Plans that grew or shrank a running job.", state_.resizes());
  m.Counter("malle_allocator_job_stops_total",
            "Running jobs stopped because the nodes left could not hold them.", state_.job_stops());
  m.Counter("malle_allocator_lost_incarnations_total",
            "Incarnations no rank held any more (every member died, or the bootstrap ended first): "
            "their jobs were queued for a new one.",
            state_.lost_incarnations());
  m.Counter("malle_allocator_parks_total",
            "Jobs that parked their state in their park store (reported by their last member).",
            state_.parks());
  m.Counter("malle_allocator_messages_total", "Inbox messages, by result.", stats_.accepted,
            {{"result", "accepted"}});
  m.Counter("malle_allocator_messages_total", "Inbox messages, by result.", stats_.rejected,
            {{"result", "rejected"}});
  m.Counter("malle_allocator_holes_skipped_total", "Inbox tickets never written, skipped.", stats_.holes_skipped);
  m.Counter("malle_allocator_store_errors_total", "Loop iterations the control store did not answer.",
            stats_.store_errors);
  m.Counter("malle_allocator_store_resets_total", "Times the store came back empty and was re-seeded.",
            stats_.store_resets);
  m.Counter("malle_store_reconnects_total", "Connections to a TCPStore server replaced after a loss.",
            static_cast<double>(comm::ControlStoreReconnects()));
  m.Gauge("malle_allocator_epoch", "This allocator's epoch.", stats_.epoch);
  // Held node time, per job and kind, then the total (ranks of unknown jobs included).
  const char* kHeldHelp = "Node-seconds held, by job and by what the node did (productive or not).";
  auto held = [&](const std::string& job, const HeldSeconds& h) {
    for (auto [kind, v] : {std::pair{"productive", h.productive}, std::pair{"starting", h.starting},
                           std::pair{"warming", h.warming}, std::pair{"draining", h.draining}}) {
      m.Counter("malle_allocator_held_node_seconds_total", kHeldHelp, v, {{"job", job}, {"kind", kind}});
    }
  };
  for (const auto& [id, j] : state_.jobs()) held(id, state_.HeldOf(id, now));
  const HeldSeconds total = state_.HeldTotal(now);
  m.Gauge("malle_allocator_held_idle_ratio", "Held node time without training / held node time, all jobs.",
          total.held() > 0 ? total.idle() / total.held() : 0.0);
  return m.text();
}

AllocatorStats AllocatorService::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace malle::control
