#include "libmalle/comm/elastic_group.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <random>
#include <thread>

#include <ATen/ops/zeros.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/comm/internal/liveness.h"
#include "libmalle/comm/internal/local_address.h"
#include "libmalle/comm/internal/store_layout.h"

namespace malle::comm {

using internal::AbortKey;
using internal::AbortReasonKey;
using internal::AdmitKey;
using internal::BootKey;
using internal::CheckInCountKey;
using internal::CheckInKey;
using internal::GroupPrefix;
using internal::HeartbeatKey;
using internal::MemberKey;
using internal::NodeKey;
using internal::RecordKey;
using internal::RequestKey;

namespace {

// A refusal comes back in microseconds on a LAN; no answer at all (a host
// that is down) gives no verdict, and the recovery waits out its grace.
constexpr absl::Duration kLivenessProbeTimeout = absl::Milliseconds(50);
constexpr absl::Duration kLivenessReprobe = absl::Milliseconds(20);

std::string RandomHex() {
  std::random_device device;
  std::mt19937_64 rng((static_cast<uint64_t>(device()) << 32) ^ device() ^
                      static_cast<uint64_t>(::getpid()));
  return absl::StrFormat("%016x", rng());
}

std::string DefaultMemberId() {
  char host[64] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string h;
  for (char c : std::string(host)) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-') h += c;
  }
  if (h.empty()) h = "host";
  return absl::StrCat(h.substr(0, 40), "-", ::getpid(), "-", RandomHex().substr(0, 8));
}

absl::Status RequirePositive(const char* field, absl::Duration d) {
  if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("ElasticGroupOptions.", field,
                                                   " must be positive and finite, got ",
                                                   absl::FormatDuration(d)));
  }
  return absl::OkStatus();
}

std::vector<std::string> Difference(const std::vector<std::string>& a,
                                    const std::vector<std::string>& b) {
  std::vector<std::string> out;
  for (const auto& x : a) {
    if (std::find(b.begin(), b.end(), x) == b.end()) out.push_back(x);
  }
  return out;
}

}  // namespace

absl::string_view TransitionKindName(Transition::Kind kind) {
  switch (kind) {
    case Transition::Kind::kNone: return "none";
    case Transition::Kind::kBootstrap: return "bootstrap";
    case Transition::Kind::kJoined: return "joined";
    case Transition::Kind::kPlanned: return "planned";
    case Transition::Kind::kRecovered: return "recovered";
    case Transition::Kind::kLeft: return "left";
    case Transition::Kind::kExcluded: return "excluded";
  }
  return "unknown";
}

absl::Status ElasticGroupOptions::Validate() const {
  MALLE_RETURN_IF_ERROR(ValidateId("ElasticGroupOptions.job_id", job_id));
  if (!member_id.empty()) MALLE_RETURN_IF_ERROR(ValidateId("ElasticGroupOptions.member_id", member_id));
  if (!node.empty()) MALLE_RETURN_IF_ERROR(ValidateNodeName("ElasticGroupOptions.node", node));
  if (max_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ElasticGroupOptions.max_size must be >= 1, got ", max_size));
  }
  if (bootstrap_size < 0 || bootstrap_size > max_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ElasticGroupOptions.bootstrap_size must be in [0, max_size=", max_size, "], got ",
        bootstrap_size));
  }
  MALLE_RETURN_IF_ERROR(RequirePositive("rendezvous_timeout", rendezvous_timeout));
  MALLE_RETURN_IF_ERROR(RequirePositive("op_timeout", op_timeout));
  MALLE_RETURN_IF_ERROR(RequirePositive("heartbeat_interval", heartbeat_interval));
  MALLE_RETURN_IF_ERROR(RequirePositive("heartbeat_timeout", heartbeat_timeout));
  MALLE_RETURN_IF_ERROR(RequirePositive("recovery_grace", recovery_grace));
  if (recovery_grace < heartbeat_interval) {
    // A live member busy computing when a peer dies checks in from its
    // watchdog, at its next tick: a shorter grace would exclude it.
    return absl::InvalidArgumentError(absl::StrCat(
        "ElasticGroupOptions.recovery_grace (", absl::FormatDuration(recovery_grace),
        ") must be at least heartbeat_interval (", absl::FormatDuration(heartbeat_interval),
        "): a live member checks in at its watchdog's next tick, so a shorter grace would "
        "declare it failed"));
  }
  if (gloo.device_type != c10::DeviceType::CPU) {
    return absl::InvalidArgumentError(
        "ElasticGroupOptions.gloo.device_type must be CPU (the control group); for CUDA "
        "tensors set data_backend (MakeGlooBackend with device_type CUDA, or MakeNcclBackend)");
  }
  if (max_recoveries_without_commit < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ElasticGroupOptions.max_recoveries_without_commit must be >= 1, got ",
        max_recoveries_without_commit));
  }
  if (heartbeat_timeout < 3 * heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ElasticGroupOptions.heartbeat_timeout (", absl::FormatDuration(heartbeat_timeout),
        ") must be at least 3 x heartbeat_interval (", absl::FormatDuration(heartbeat_interval),
        ") or healthy members would be declared failed"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Watchdog: the group's one background thread. It owns its own store
// connection, so a main thread blocked in the store never delays a heartbeat.

class ElasticGroup::Watchdog {
 public:
  Watchdog(ElasticGroup* group, std::shared_ptr<ControlStore> store)
      : group_(group),
        store_(std::move(store)),
        interval_(group->options_.heartbeat_interval),
        tracker_(group->options_.heartbeat_timeout),
        heartbeat_key_(HeartbeatKey(group->member_id())) {
    thread_ = std::thread([this] { Run(); });
  }

  ~Watchdog() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Starts watching a generation: its members' heartbeats and its abort flag.
  void Watch(int64_t generation, std::vector<std::string> members,
             std::shared_ptr<AbortSignal> abort) {
    absl::MutexLock lock(&mu_);
    watched_ = Watched{generation, std::move(members), std::move(abort)};
    wake_ = true;
  }

  void Unwatch() {
    absl::MutexLock lock(&mu_);
    watched_.reset();
  }

  void Wake() {
    absl::MutexLock lock(&mu_);
    wake_ = true;
  }

  // This member was cut off (see CheckCutOff): it must not touch the store
  // again (every operation would hang on the silent network) and it is no
  // longer a member: its peers have excluded it.
  bool cut_off() const { return cut_off_.load(); }

 private:
  struct Watched {
    int64_t generation;
    std::vector<std::string> members;
    std::shared_ptr<AbortSignal> abort;
    bool published = false;  // local abort written to the store
    bool tracking = false;   // tracker reset for this generation
  };

  void Run() {
    base::Clock* clock = group_->clock_;
    int failures = 0;
    for (;;) {
      std::optional<Watched> snapshot;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
        mu_.AwaitWithTimeout(absl::Condition(&ready), interval_);
        if (stop_) return;
        wake_ = false;
        snapshot = watched_;
      }
      absl::Status status = Tick(snapshot, clock);
      if (!status.ok()) {
        if (failures++ % 50 == 0) MALLE_LOG(WARNING) << "watchdog: " << status;
        // While the store is unreachable nobody's heartbeat can be seen to
        // move: staleness restarts from the first tick that reads them again.
        restart_tracking_ = true;
        CheckCutOff(snapshot);
      } else {
        failures = 0;
        last_ok_ = absl::Now();
      }
    }
  }

  absl::Status Tick(std::optional<Watched>& w, base::Clock* clock) {
    if (group_->liveness_) group_->liveness_->Drain();
    MALLE_RETURN_IF_ERROR(store_->Add(heartbeat_key_, 1).status());
    if (!w.has_value()) return absl::OkStatus();
    if (w->abort->aborted()) {
      if (!w->published) {
        MALLE_RETURN_IF_ERROR(group_->PublishAbort(*store_, w->generation, w->abort->reason()));
        MarkPublished(w->generation);
      }
      return group_->CheckIn(*store_, w->generation);
    }
    MALLE_ASSIGN_OR_RETURN(int64_t aborts, store_->Add(AbortKey(w->generation), 0));
    if (aborts > 0) {
      MALLE_ASSIGN_OR_RETURN(auto why, store_->TryGet(AbortReasonKey(w->generation)));
      w->abort->Abort(absl::AbortedError(absl::StrCat("generation ", w->generation,
                                                      " was aborted: ", why.value_or("(no reason)"))));
      MarkPublished(w->generation);
      return group_->CheckIn(*store_, w->generation);
    }
    std::vector<std::string> peers, keys;
    for (const auto& m : w->members) {
      if (m == group_->member_id()) continue;
      peers.push_back(m);
      keys.push_back(HeartbeatKey(m));
    }
    const absl::Time now = clock->Now();
    if (!TrackingStarted(w->generation)) tracker_.Reset(peers, now);
    if (keys.empty()) return absl::OkStatus();
    MALLE_ASSIGN_OR_RETURN(std::vector<std::string> values, store_->MultiGet(keys));
    if (restart_tracking_) {
      restart_tracking_ = false;
      tracker_.Reset(peers, now);
    }
    for (size_t i = 0; i < peers.size(); ++i) {
      int64_t counter = 0;
      if (absl::SimpleAtoi(values[i], &counter)) tracker_.Observe(peers[i], counter, now);
    }
    std::vector<std::string> stale = tracker_.Stale(now);
    if (!stale.empty()) {
      w->abort->Abort(absl::UnavailableError(absl::StrCat(
          "member ", stale.front(), " of generation ", w->generation, " missed its heartbeats for ",
          absl::FormatDuration(tracker_.SilentFor(stale.front(), now)))));
      // The listener wakes us; the next tick publishes and checks in.
    }
    return absl::OkStatus();
  }

  // A network partition that leaves this member alone: neither the store nor
  // its peers answer. The peers (on the store's side) exclude it once its
  // heartbeat has been stale for heartbeat_timeout, so the collective it is
  // blocked in can never complete. In a mere store outage the collectives
  // keep completing (the generation needs no store between changes), so both
  // must be silent: the store for twice the heartbeat timeout and a wait on
  // the peers for as long. Then the generation is aborted here and the member
  // leaves without touching the store (ElasticGroup::Recover).
  void CheckCutOff(const std::optional<Watched>& w) {
    if (!w.has_value() || w->abort->aborted()) return;
    const absl::Time now = absl::Now();
    const absl::Duration limit = 2 * group_->options_.heartbeat_timeout;
    const absl::Time waiting = w->abort->waiting_since();
    if (now - last_ok_ < limit || waiting == absl::InfiniteFuture() || now - waiting < limit) return;
    cut_off_.store(true);
    const absl::Duration silent = absl::Trunc(now - last_ok_, absl::Milliseconds(1));
    w->abort->Abort(absl::UnavailableError(absl::StrCat(
        "member ", group_->member_id(), " is cut off: the control store has not answered for ",
        absl::FormatDuration(silent), " and generation ", w->generation, "'s peers for ",
        absl::FormatDuration(absl::Trunc(now - waiting, absl::Milliseconds(1))),
        " (a network partition); they have excluded it by now")));
    MALLE_LOG(ERROR) << w->abort->reason().message() << "; leaving the job";
  }

  bool TrackingStarted(int64_t generation) {
    absl::MutexLock lock(&mu_);
    if (!watched_ || watched_->generation != generation) return true;  // stale snapshot
    if (watched_->tracking) return true;
    watched_->tracking = true;
    return false;
  }

  void MarkPublished(int64_t generation) {
    absl::MutexLock lock(&mu_);
    if (watched_ && watched_->generation == generation) watched_->published = true;
  }

  ElasticGroup* group_;
  std::shared_ptr<ControlStore> store_;
  const absl::Duration interval_;
  HeartbeatTracker tracker_;  // watchdog thread only
  bool restart_tracking_ = false;  // watchdog thread only: a tick failed at the store
  absl::Time last_ok_ = absl::Now();  // watchdog thread only: the last tick the store answered
  std::atomic<bool> cut_off_{false};
  const std::string heartbeat_key_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Watched> watched_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// ---------------------------------------------------------------------------

ElasticGroup::ElasticGroup(std::shared_ptr<ControlStore> root, ElasticGroupOptions options)
    : root_(std::move(root)),
      options_(std::move(options)),
      clock_(options_.clock ? options_.clock : base::Clock::Real()),
      gloo_(MakeGlooBackend(options_.gloo)),
      data_(options_.data_backend),
      nonce_(RandomHex()) {
  job_ = root_->WithPrefix(JobPrefix(options_.job_id));
}

ElasticGroup::~ElasticGroup() {
  if (finished_.load()) {
    // Everyone stops after the same step: no abort, no dead report. Stop the
    // watchdog first so it does not take the others' exits for failures.
    watchdog_.reset();
    comm_.reset();
    return;
  }
  const bool cut_off = watchdog_ && watchdog_->cut_off();  // no store operation: it would hang
  if (watchdog_ && transition_.active() && record_.RankOf(member_id()) >= 0 && !cut_off) {
    // This member is going away without a planned leave. It must not become a
    // member of the next generation: the survivors would build it and wait for
    // it until its heartbeat goes stale. So (1) no more check-ins from this
    // incarnation: the watchdog, woken by the abort below, would otherwise
    // check in to the generation as the process exits; (2) it reports itself
    // dead, which also covers a check-in already made (the generation failed
    // before the caller gave up) and lets a recovery in progress decide at
    // once instead of waiting out recovery_grace.
    checked_in_.store(std::numeric_limits<int64_t>::max());
    absl::Status reported = ReportDead(*root_, job_id(), member_id());
    if (!reported.ok()) MALLE_LOG(WARNING) << "closing group: " << reported;
  }
  if (comm_ && transition_.active()) {
    // Tell the others now rather than letting them wait for a stale heartbeat.
    comm_->Abort(absl::AbortedError(absl::StrCat("member ", member_id(), " closed its group")));
    absl::Status published =
        cut_off ? absl::OkStatus() : PublishAbort(*job_, record_.generation, comm_->abort_reason());
    if (!published.ok()) MALLE_LOG(WARNING) << "closing group: " << published;
  }
  watchdog_.reset();
  comm_.reset();
}

absl::StatusOr<std::unique_ptr<ElasticGroup>> ElasticGroup::Join(std::shared_ptr<ControlStore> store,
                                                                 ElasticGroupOptions options) {
  if (!store) return absl::InvalidArgumentError("ElasticGroup::Join: store is null");
  if (options.member_id.empty()) options.member_id = DefaultMemberId();
  MALLE_RETURN_IF_ERROR(options.Validate());
  const absl::Time start = absl::Now();
  std::unique_ptr<ElasticGroup> group(new ElasticGroup(std::move(store), std::move(options)));
  MALLE_RETURN_IF_ERROR(group->Register());

  bool bootstrapped = false;
  MALLE_ASSIGN_OR_RETURN(GenerationRecord record, group->Bootstrap(&bootstrapped));
  MALLE_ASSIGN_OR_RETURN(
      Transition t,
      group->Enter(std::move(record),
                   bootstrapped ? Transition::Kind::kBootstrap : Transition::Kind::kJoined, start,
                   absl::ZeroDuration()));
  if (!t.active()) {
    return absl::AbortedError(absl::StrCat("member ", group->member_id(),
                                           " was excluded while joining: ", t.reason));
  }
  return group;
}

absl::Status ElasticGroup::Register() {
  // A member id names one process incarnation: a second process with the
  // same id would corrupt every generation it is listed in.
  MALLE_ASSIGN_OR_RETURN(std::string owner, job_->CreateIfAbsent(MemberKey(member_id()), nonce_));
  if (owner != nonce_) {
    return absl::AlreadyExistsError(absl::StrCat("member id '", member_id(), "' is already registered in job '",
                                                 job_id(), "'; member ids must be unique per process"));
  }
  // Before any request or boot ticket: whoever writes a record with this
  // member in it reads its node from there.
  if (!options_.node.empty()) MALLE_RETURN_IF_ERROR(job_->Set(NodeKey(member_id()), options_.node));
  MALLE_RETURN_IF_ERROR(job_->Add(HeartbeatKey(member_id()), 1).status());
  // The same address as the Gloo groups (internal/local_address.h).
  absl::StatusOr<std::string> host = options_.gloo.hostname.empty() ? internal::LocalAddressFor(*root_)
                                                                    : absl::StatusOr<std::string>(options_.gloo.hostname);
  absl::StatusOr<std::unique_ptr<internal::LivenessListener>> listener =
      host.ok() ? internal::LivenessListener::Listen(*host) : host.status();
  if (listener.ok()) {
    liveness_ = *std::move(listener);
    MALLE_RETURN_IF_ERROR(job_->Set(internal::ProbeKey(member_id()), liveness_->address()));
  } else {
    // Only slower: a recovery then waits out recovery_grace for this member.
    MALLE_LOG(WARNING) << "no liveness listener (" << listener.status()
                       << "); a death of this member is seen only after recovery_grace";
  }
  // Bounded: on a partitioned network a store operation would otherwise block
  // the watchdog (and its cut-off check) until the kernel drops the connection.
  MALLE_ASSIGN_OR_RETURN(std::shared_ptr<ControlStore> watchdog_store,
                         job_->CloneBounded(std::max(options_.heartbeat_interval, options_.heartbeat_timeout / 2)));
  watchdog_ = std::make_unique<Watchdog>(this, std::move(watchdog_store));
  return absl::OkStatus();
}

absl::StatusOr<GenerationRecord> ElasticGroup::Bootstrap(bool* bootstrapped) {
  const int n = options_.bootstrap_size;
  if (n > 0) {
    MALLE_ASSIGN_OR_RETURN(bool started, job_->Exists(RecordKey(0)));
    if (!started) {
      MALLE_ASSIGN_OR_RETURN(int64_t ticket, job_->Add(internal::kBootTicket, 1));
      --ticket;
      if (ticket < n) {
        MALLE_RETURN_IF_ERROR(job_->Set(BootKey(ticket), member_id()));
        if (ticket == n - 1) {
          // The last of the first n arrivals writes generation 0.
          std::vector<std::string> keys;
          for (int i = 0; i < n; ++i) keys.push_back(BootKey(i));
          MALLE_RETURN_IF_ERROR(job_->Wait(keys, options_.rendezvous_timeout));
          MALLE_ASSIGN_OR_RETURN(std::vector<std::string> members, job_->MultiGet(keys));
          GenerationRecord zero;
          zero.generation = 0;
          zero.cause = GenerationCause::kBootstrap;
          zero.members = std::move(members);
          MALLE_ASSIGN_OR_RETURN(zero.nodes, NodesOf(zero.members, GenerationRecord{}));
          zero.reason = absl::StrCat("bootstrap of ", n, " members");
          MALLE_RETURN_IF_ERROR(job_->CreateIfAbsent(RecordKey(0), EncodeRecord(zero)).status());
        }
        absl::Status arrived = job_->Wait({RecordKey(0)}, options_.rendezvous_timeout);
        if (absl::IsDeadlineExceeded(arrived)) {
          auto count = job_->Add(internal::kBootTicket, 0);
          return absl::DeadlineExceededError(absl::StrCat(
              "bootstrap of job '", job_id(), "': only ", count.ok() ? *count : -1, " of ", n,
              " members arrived within ", absl::FormatDuration(options_.rendezvous_timeout)));
        }
        MALLE_RETURN_IF_ERROR(arrived);
        *bootstrapped = true;
        return ReadRecord(0);
      }
    }
  }
  return WaitForAdmission();
}

absl::StatusOr<GenerationRecord> ElasticGroup::WaitForAdmission() {
  MALLE_RETURN_IF_ERROR(Enqueue({ChangeRequest::Kind::kJoin, member_id()}));
  absl::Status admitted = job_->Wait({AdmitKey(member_id())}, options_.rendezvous_timeout);
  if (!admitted.ok()) {
    // Withdraw, so that a leader does not admit a process that gave up.
    absl::Status withdrawn = Enqueue({ChangeRequest::Kind::kLeave, member_id()});
    if (!withdrawn.ok()) MALLE_LOG(WARNING) << "withdrawing join request: " << withdrawn;
    if (!absl::IsDeadlineExceeded(admitted)) return admitted;
    MALLE_ASSIGN_OR_RETURN(bool exists, job_->Exists(RecordKey(0)));
    if (!exists) {
      return absl::NotFoundError(absl::StrCat(
          "job '", job_id(), "' has no generation in the control store after ",
          absl::FormatDuration(options_.rendezvous_timeout),
          " (wrong job id, wrong store, or nobody bootstrapped it)"));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "member ", member_id(), " was not admitted to job '", job_id(), "' within ",
        absl::FormatDuration(options_.rendezvous_timeout),
        " (the group is at max_size or its leader is not reaching step boundaries)"));
  }
  MALLE_ASSIGN_OR_RETURN(std::string value, job_->Get(AdmitKey(member_id()), options_.rendezvous_timeout));
  int64_t generation = 0;
  if (!absl::SimpleAtoi(value, &generation) || generation < 0) {
    return absl::InternalError(absl::StrCat("admission notice for ", member_id(), " is malformed: '", value, "'"));
  }
  return ReadRecord(generation);
}

absl::StatusOr<GenerationRecord> ElasticGroup::ReadRecord(int64_t generation) {
  MALLE_ASSIGN_OR_RETURN(std::string text, job_->Get(RecordKey(generation), options_.rendezvous_timeout));
  MALLE_ASSIGN_OR_RETURN(GenerationRecord record, DecodeRecord(text));
  if (record.generation != generation) {
    return absl::InternalError(absl::StrCat("record under gen/", generation, " says generation ",
                                            record.generation));
  }
  return record;
}

absl::Status ElasticGroup::Enqueue(const ChangeRequest& request) {
  MALLE_ASSIGN_OR_RETURN(int64_t ticket, job_->Add(internal::kRequestTicket, 1));
  return job_->Set(RequestKey(ticket - 1), EncodeRequest(request));
}

absl::Status ElasticGroup::RequestLeave() { return Enqueue({ChangeRequest::Kind::kLeave, member_id()}); }

absl::Status ElasticGroup::RequestLeave(ControlStore& store, absl::string_view job_id,
                                        absl::string_view member_id) {
  MALLE_RETURN_IF_ERROR(ValidateId("job_id", job_id));
  MALLE_RETURN_IF_ERROR(ValidateId("member_id", member_id));
  auto job = store.WithPrefix(JobPrefix(job_id));
  MALLE_ASSIGN_OR_RETURN(int64_t ticket, job->Add(internal::kRequestTicket, 1));
  return job->Set(RequestKey(ticket - 1),
                  EncodeRequest({ChangeRequest::Kind::kLeave, std::string(member_id)}));
}

absl::Status ElasticGroup::ReportDead(ControlStore& store, absl::string_view job_id,
                                      absl::string_view member_id) {
  MALLE_RETURN_IF_ERROR(ValidateId("job_id", job_id));
  MALLE_RETURN_IF_ERROR(ValidateId("member_id", member_id));
  auto job = store.WithPrefix(JobPrefix(job_id));
  MALLE_RETURN_IF_ERROR(job->Set(internal::DeadKey(member_id), "1"));
  return job->Add(internal::kDeadCount, 1).status();
}

absl::Status ElasticGroup::RequestLeave(ControlStore& store, absl::string_view job_id,
                                        absl::Span<const std::string> member_ids) {
  MALLE_RETURN_IF_ERROR(ValidateId("job_id", job_id));
  if (member_ids.empty()) return absl::OkStatus();
  for (const std::string& m : member_ids) MALLE_RETURN_IF_ERROR(ValidateId("member_id", m));
  auto job = store.WithPrefix(JobPrefix(job_id));
  MALLE_ASSIGN_OR_RETURN(int64_t ticket, job->Add(internal::kRequestTicket, 1));
  return job->Set(RequestKey(ticket - 1), EncodeLeaves(member_ids));
}

absl::Status ElasticGroup::ReportDead(ControlStore& store, absl::string_view job_id,
                                      absl::Span<const std::string> member_ids) {
  MALLE_RETURN_IF_ERROR(ValidateId("job_id", job_id));
  if (member_ids.empty()) return absl::OkStatus();
  for (const std::string& m : member_ids) MALLE_RETURN_IF_ERROR(ValidateId("member_id", m));
  auto job = store.WithPrefix(JobPrefix(job_id));
  for (const std::string& m : member_ids) MALLE_RETURN_IF_ERROR(job->Set(internal::DeadKey(m), "1"));
  return job->Add(internal::kDeadCount, static_cast<int64_t>(member_ids.size())).status();
}

absl::StatusOr<GenerationRecord> ElasticGroup::LatestGeneration(ControlStore& store,
                                                                absl::string_view job_id) {
  MALLE_RETURN_IF_ERROR(ValidateId("job_id", job_id));
  auto job = store.WithPrefix(JobPrefix(job_id));
  int64_t g = 0;
  for (;; ++g) {
    MALLE_ASSIGN_OR_RETURN(bool exists, job->Exists(RecordKey(g)));
    if (!exists) break;
  }
  if (g == 0) return absl::NotFoundError(absl::StrCat("job '", job_id, "' has no generation"));
  MALLE_ASSIGN_OR_RETURN(std::string text, job->Get(RecordKey(g - 1), store.timeout()));
  return DecodeRecord(text);
}

void ElasticGroup::Commit(int64_t step) {
  int64_t current = committed_.load();
  while (step > current && !committed_.compare_exchange_weak(current, step)) {
  }
  recoveries_since_commit_ = 0;
}

absl::Status ElasticGroup::CountRecovery(const absl::Status& why) {
  if (recoveries_since_commit_ >= options_.max_recoveries_without_commit) {
    return absl::AbortedError(absl::StrCat(
        "member ", member_id(), " of job '", job_id(), "' gives up: ", recoveries_since_commit_,
        " recoveries in a row without a committed step (max_recoveries_without_commit); the "
        "last failure: ", why.message(),
        ". A failure that repeats at every attempt is not a lost member: see the log"));
  }
  ++recoveries_since_commit_;
  return absl::OkStatus();
}

absl::Status ElasticGroup::CheckIn(ControlStore& store, int64_t generation, bool ensure_visible) {
  int64_t seen = checked_in_.load();
  while (seen < generation) {
    if (checked_in_.compare_exchange_weak(seen, generation)) {
      MALLE_RETURN_IF_ERROR(store.Set(CheckInKey(generation, member_id()), "1"));
      return store.Add(CheckInCountKey(generation), 1).status();
    }
  }
  // Another thread won the exchange above and may still be writing the key.
  // The key is idempotent, so a caller about to decide a recovery from the
  // check-in keys writes it itself rather than leave itself out.
  if (ensure_visible && seen == generation) {
    return store.Set(CheckInKey(generation, member_id()), "1");
  }
  return absl::OkStatus();
}

absl::Status ElasticGroup::PublishAbort(ControlStore& store, int64_t generation,
                                        const absl::Status& reason) {
  std::string why = std::string(reason.message());
  if (why.empty()) why = reason.ToString();
  MALLE_RETURN_IF_ERROR(
      store.CreateIfAbsent(AbortReasonKey(generation), absl::StrCat(member_id(), ": ", why)).status());
  return store.Add(AbortKey(generation), 1).status();
}

absl::StatusOr<std::vector<std::string>> ElasticGroup::NodesOf(const std::vector<std::string>& members,
                                                                 const GenerationRecord& known) {
  std::vector<std::string> nodes;
  bool any = false;
  for (const std::string& m : members) {
    std::string node;
    if (known.RankOf(m) >= 0) {
      node = known.NodeOf(m);
    } else {
      // A new member (bootstrap, joiner): it set its key before it asked in.
      MALLE_ASSIGN_OR_RETURN(std::optional<std::string> value, job_->TryGet(NodeKey(m)));
      node = value.value_or("");
      if (!node.empty() && !ValidateNodeName("node", node).ok()) {
        MALLE_LOG(WARNING) << "member " << m << " published a malformed node name '" << node
                           << "'; treating its node as unknown";
        node.clear();
      }
    }
    any = any || !node.empty();
    nodes.push_back(std::move(node));
  }
  if (!any) nodes.clear();
  return nodes;
}

absl::StatusOr<int64_t> ElasticGroup::LeaderPropose() {
  MALLE_ASSIGN_OR_RETURN(int64_t tickets, job_->Add(internal::kRequestTicket, 0));
  if (tickets <= pending_.requests_consumed) return 0;
  std::vector<ChangeRequest> requests;
  int64_t next = pending_.requests_consumed;
  for (; next < tickets; ++next) {
    MALLE_ASSIGN_OR_RETURN(std::optional<std::string> text, job_->TryGet(RequestKey(next)));
    if (!text.has_value()) break;  // its writer is between Add and Set: next boundary
    // One entry may hold a node's leaves: taken whole, they make one change.
    absl::StatusOr<std::vector<ChangeRequest>> decoded = DecodeRequests(*text);
    if (!decoded.ok()) {
      MALLE_LOG(ERROR) << "change request #" << next << " rejected: " << decoded.status();
      continue;
    }
    for (ChangeRequest& r : *decoded) requests.push_back(std::move(r));
  }
  PlannedChange change = PlanNextMembers(pending_, requests, options_.max_size);
  change.requests_consumed = next;
  for (const std::string& note : change.notes) MALLE_LOG(WARNING) << "change request: " << note;
  pending_.requests_consumed = change.requests_consumed;
  pending_.deferred_joins = change.deferred;
  if (!change.changed) {
    // Only the last member can be refused a leave, and then it is the leader:
    // this member.
    if (!change.park.empty()) park_requested_ = true;
    return 0;
  }

  GenerationRecord proposal;
  proposal.generation = record_.generation + 1;
  proposal.cause = GenerationCause::kPlanned;
  proposal.members = change.next;
  MALLE_ASSIGN_OR_RETURN(proposal.nodes, NodesOf(proposal.members, record_));
  proposal.requests_consumed = change.requests_consumed;
  proposal.deferred_joins = change.deferred;
  proposal.park = change.park;
  proposal.reason = absl::StrCat("planned: +[", absl::StrJoin(change.joined, ","), "] -[",
                                 absl::StrJoin(change.removed, ","), "]",
                                 change.park.empty() ? "" : absl::StrCat(", ", change.park, " parks the job"));
  MALLE_ASSIGN_OR_RETURN(std::string stored,
                         job_->CreateIfAbsent(RecordKey(proposal.generation), EncodeRecord(proposal)));
  if (stored == EncodeRecord(proposal) && !change.leave_again.empty()) {
    // The last member's leave, postponed until the joiners hold the state.
    MALLE_RETURN_IF_ERROR(RequestLeave(*root_, job_id(), change.leave_again));
  }
  if (stored == EncodeRecord(proposal)) {
    for (const std::string& joiner : change.joined) {
      MALLE_RETURN_IF_ERROR(job_->Set(AdmitKey(joiner), absl::StrCat(proposal.generation)));
    }
  } else {
    // A recovery got there first; everyone follows that record instead.
    MALLE_LOG(WARNING) << "generation " << proposal.generation
                       << " was already decided by a recovery; planned change postponed";
  }
  return proposal.generation;
}

absl::Status ElasticGroup::RequireMember() const {
  if (transition_.active() && comm_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "member ", member_id(), " is no longer in job '", job_id(), "' (", transition_.reason, ")"));
}

bool ElasticGroup::StoreOutage(const absl::Status& status) {
  // The control store is down (or restarting): the generation itself needs
  // no store to run its collectives, so the job keeps training at its size;
  // changes wait until the store answers again.
  if (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status)) return false;
  if (store_failures_++ % 100 == 0) {
    MALLE_LOG(WARNING) << "job " << job_id() << ": control store unreachable (" << status.message()
                       << "); training on at the current size, changes wait for it";
  }
  return true;
}

absl::Status ElasticGroup::BeginStepBoundary() {
  MALLE_RETURN_IF_ERROR(RequireMember());
  if (early_vote_.has_value() || comm_->aborted()) return absl::OkStatus();
  int64_t wanted = 0;
  if (rank() == 0) {
    // What LeaderPropose() would look at first: are requests queued past
    // those already read? (Deferred joins alone change nothing, as there.)
    absl::StatusOr<int64_t> tickets = job_->Add(internal::kRequestTicket, 0);
    if (tickets.ok()) {
      wanted = *tickets > pending_.requests_consumed ? 1 : 0;
    } else if (!StoreOutage(tickets.status())) {
      return tickets.status();
    }
  }
  at::Tensor value = at::zeros({1}, at::kLong);
  value.data_ptr<int64_t>()[0] = wanted;
  std::vector<at::Tensor> tensors{value};
  absl::StatusOr<PendingCollective> pending = comm_->AllReduceAsync(tensors, ReduceOp::kMax);
  // Not started: the generation failed, which AtStepBoundary() recovers from.
  if (pending.ok()) early_vote_ = EarlyVote{value, *std::move(pending)};
  return absl::OkStatus();
}

absl::StatusOr<Transition> ElasticGroup::AtStepBoundary() {
  MALLE_RETURN_IF_ERROR(RequireMember());
  const absl::Time start = absl::Now();
  // The boundary changed nothing: the current generation, no phases.
  auto NoChange = [this] {
    Transition none = transition_;
    none.kind = Transition::Kind::kNone;
    none.joined.clear();
    none.removed.clear();
    none.phases = {};
    return none;
  };
  std::optional<EarlyVote> early = std::move(early_vote_);
  early_vote_.reset();
  absl::Status failure = comm_->abort_reason();
  if (!comm_->aborted() && early.has_value()) {
    failure = early->pending.Wait();
    if (failure.ok() && early->value.data_ptr<int64_t>()[0] == 0) {
      return NoChange();
    }
    // Requests are queued: agree on them below, as without the early vote.
  }
  if (failure.ok() && comm_->aborted()) failure = comm_->abort_reason();
  if (failure.ok()) {
    int64_t proposal = 0;
    if (rank() == 0) {
      absl::StatusOr<int64_t> proposed = LeaderPropose();
      if (proposed.ok()) {
        proposal = *proposed;
      } else if (!StoreOutage(proposed.status())) {
        return proposed.status();
      }
    }
    at::Tensor vote = at::zeros({1}, at::kLong);
    vote.data_ptr<int64_t>()[0] = proposal;
    const absl::Time vote_start = absl::Now();
    failure = comm_->AllReduce(vote, ReduceOp::kMax);
    const absl::Duration wait = absl::Now() - vote_start;
    if (failure.ok()) {
      const int64_t next = vote.data_ptr<int64_t>()[0];
      if (next == 0) {
        Transition none = NoChange();
        none.park = std::exchange(park_requested_, false);
        return none;
      }
      MALLE_ASSIGN_OR_RETURN(GenerationRecord record, ReadRecord(next));
      // The leader's proposal can lose the race to a recovery record; then
      // this is a recovery (and a member left out is excluded, not leaving).
      const Transition::Kind kind = record.cause == GenerationCause::kRecovery
                                        ? Transition::Kind::kRecovered
                                        : Transition::Kind::kPlanned;
      return Enter(std::move(record), kind, start, absl::ZeroDuration(), wait);
    }
  }
  // How long the failure was known locally before this boundary acted on it.
  const absl::Duration detect =
      comm_->aborted() ? std::max(absl::ZeroDuration(), start - comm_->abort_signal()->aborted_at())
                       : absl::ZeroDuration();
  MALLE_RETURN_IF_ERROR(CountRecovery(failure));
  MALLE_ASSIGN_OR_RETURN(GenerationRecord next, Recover(record_, failure));
  return Enter(std::move(next), Transition::Kind::kRecovered, start, detect);
}

absl::StatusOr<GenerationRecord> ElasticGroup::Recover(const GenerationRecord& failed,
                                                       absl::Status why) {
  const int64_t g = failed.generation;
  if (watchdog_ && watchdog_->cut_off()) {
    // Nothing to recover with: the store does not answer, and the peers have
    // gone on without this member. No store operation (it would hang).
    return absl::UnavailableError(absl::StrCat("member ", member_id(), " left job '", job_id(),
                                               "' at generation ", g, ": ", why.message()));
  }
  MALLE_LOG(WARNING) << "generation " << g << " failed: " << why << "; recovering";
  watchdog_->Unwatch();
  MALLE_RETURN_IF_ERROR(PublishAbort(*job_, g, why));
  comm_.reset();
  MALLE_RETURN_IF_ERROR(CheckIn(*job_, g, /*ensure_visible=*/true));
  const absl::Time deadline = absl::Now() + options_.recovery_grace;
  // When each member not checked in is probed next (see below).
  absl::flat_hash_map<std::string, absl::Time> next_probe;
  for (;;) {
    MALLE_ASSIGN_OR_RETURN(bool decided, job_->Exists(RecordKey(g + 1)));
    if (decided) break;
    MALLE_ASSIGN_OR_RETURN(int64_t arrived, job_->Add(CheckInCountKey(g), 0));
    const int64_t size = static_cast<int64_t>(failed.members.size());
    if (arrived < size) {
      // A member that has not checked in and whose liveness port refuses
      // connections is gone (killed, or its group closed): report it, as its
      // owner would, instead of waiting out the grace. A member whose port
      // still accepts is probed again every kLivenessReprobe: a process being
      // killed closes its Gloo sockets (which is how the others noticed)
      // before its listener, so the first probe may still be accepted.
      const absl::Time now = absl::Now();
      for (const std::string& m : failed.members) {
        if (m == member_id()) continue;
        auto due = next_probe.find(m);
        if (due != next_probe.end() && now < due->second) continue;
        MALLE_ASSIGN_OR_RETURN(bool in, job_->Exists(CheckInKey(g, m)));
        if (in) continue;
        next_probe[m] = now + kLivenessReprobe;
        MALLE_ASSIGN_OR_RETURN(std::optional<std::string> where, job_->TryGet(internal::ProbeKey(m)));
        if (where.has_value() &&
            internal::Probe(*where, kLivenessProbeTimeout) == internal::Liveness::kGone) {
          MALLE_LOG(WARNING) << "member " << m << " is gone (its liveness port " << *where
                             << " refuses connections); not waiting for its check-in";
          MALLE_RETURN_IF_ERROR(ReportDead(*root_, job_id(), m));
          next_probe[m] = absl::InfiniteFuture();  // reported once
        }
      }
      // Members reported dead by their owner will never check in.
      MALLE_ASSIGN_OR_RETURN(int64_t dead, job_->Add(internal::kDeadCount, 0));
      if (dead > 0) {
        for (const std::string& m : failed.members) {
          MALLE_ASSIGN_OR_RETURN(bool gone, job_->Exists(internal::DeadKey(m)));
          if (!gone) continue;
          MALLE_ASSIGN_OR_RETURN(bool in, job_->Exists(CheckInKey(g, m)));
          if (!in) ++arrived;
        }
      }
    }
    if (arrived >= size || absl::Now() >= deadline) {
      absl::flat_hash_set<std::string> checked_in, dead;
      MALLE_ASSIGN_OR_RETURN(int64_t dead_count, job_->Add(internal::kDeadCount, 0));
      for (const std::string& m : failed.members) {
        MALLE_ASSIGN_OR_RETURN(bool in, job_->Exists(CheckInKey(g, m)));
        if (in) checked_in.insert(m);
        if (dead_count > 0) {
          MALLE_ASSIGN_OR_RETURN(bool gone, job_->Exists(internal::DeadKey(m)));
          if (gone) dead.insert(m);
        }
      }
      GenerationRecord next;
      next.generation = g + 1;
      next.cause = GenerationCause::kRecovery;
      next.members = SurvivingMembers(failed.members, checked_in, dead);
      MALLE_ASSIGN_OR_RETURN(next.nodes, NodesOf(next.members, failed));
      next.requests_consumed = failed.requests_consumed;
      next.deferred_joins = failed.deferred_joins;
      next.reason = absl::StrCat("recovery from generation ", g, ": ", why.message());
      MALLE_RETURN_IF_ERROR(job_->CreateIfAbsent(RecordKey(g + 1), EncodeRecord(next)).status());
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return ReadRecord(g + 1);
}

absl::StatusOr<Transition> ElasticGroup::Enter(GenerationRecord record, Transition::Kind kind,
                                               absl::Time start, absl::Duration detect, absl::Duration wait) {
  const std::vector<std::string> previous = record_.members;
  for (;;) {
    Transition t;
    t.kind = kind;
    t.generation = record.generation;
    t.members = record.members;
    t.nodes = record.nodes;
    t.size = static_cast<int>(record.members.size());
    t.rank = record.RankOf(member_id());
    t.reason = record.reason;
    t.park = !record.park.empty() && record.park == member_id();
    t.joined = previous.empty() ? std::vector<std::string>{} : Difference(record.members, previous);
    t.removed = Difference(previous, record.members);
    t.phases.detect = detect;
    t.phases.wait = wait;
    const absl::Time agreed = absl::Now();
    t.phases.agree = agreed - start - wait;

    if (t.rank < 0) {
      // Not in the next generation: asked to leave, or declared failed.
      t.kind = (kind == Transition::Kind::kPlanned) ? Transition::Kind::kLeft : Transition::Kind::kExcluded;
      watchdog_->Unwatch();
      comm_.reset();
      record_ = record;
      t.phases.total = absl::Now() - start;
      transition_ = t;
      MALLE_LOG(INFO) << "member " << member_id() << " " << TransitionKindName(t.kind)
                      << " job at generation " << record.generation << ": " << record.reason;
      return t;
    }

    auto abort = std::make_shared<AbortSignal>();
    Watchdog* watchdog = watchdog_.get();
    abort->SetListener([watchdog](const absl::Status&) { watchdog->Wake(); });
    watchdog_->Watch(record.generation, record.members, abort);
    CommunicatorOptions comm_options;
    comm_options.op_timeout = options_.op_timeout;
    absl::StatusOr<std::unique_ptr<Communicator>> built = Communicator::Build(
        job_->WithPrefix(GroupPrefix(record.generation)), t.rank, t.size, record.generation, gloo_,
        data_ ? data_ : gloo_, abort, options_.rendezvous_timeout, comm_options);
    const absl::Time build_done = absl::Now();
    t.phases.build = build_done - agreed;
    absl::Status failure = built.status();
    if (built.ok()) {
      comm_ = *std::move(built);
      // Everyone learns everyone's newest committed step, and who is new in
      // this generation, in one collective: a joiner has no previous
      // membership to compare with, so it learns the joiners from the others.
      at::Tensor exchange = at::zeros({2 * t.size}, at::kLong);
      int64_t* slots = exchange.data_ptr<int64_t>();
      slots[t.rank] = committed_.load() + 1;
      slots[t.size + t.rank] = previous.empty() ? 1 : 0;
      failure = comm_->AllReduce(exchange, ReduceOp::kSum);
      if (failure.ok()) {
        for (int r = 0; r < t.size; ++r) t.committed_by_rank.push_back(slots[r] - 1);
        if (kind != Transition::Kind::kBootstrap) {
          t.joined.clear();
          for (int r = 0; r < t.size; ++r) {
            if (slots[t.size + r] != 0) t.joined.push_back(t.members[r]);
          }
        }
        ResumePoint resume = ChooseResumePoint(t.committed_by_rank);
        t.resume_step = resume.resume_step;
        t.state_source_rank = resume.source_rank;
        const absl::Time done = absl::Now();
        t.phases.sync = done - build_done;
        t.phases.total = done - start;
        record_ = record;
        pending_ = record;
        transition_ = t;
        base::SetLogContext(job_id(), t.rank, t.size, t.generation);
        MALLE_LOG(INFO) << TransitionKindName(t.kind) << " -> generation " << t.generation << " ["
                        << absl::StrJoin(t.members, ",") << "] resume at step " << t.resume_step
                        << " (wait " << absl::FormatDuration(t.phases.wait) << ", agree "
                        << absl::FormatDuration(t.phases.agree) << ", build "
                        << absl::FormatDuration(t.phases.build) << ", sync "
                        << absl::FormatDuration(t.phases.sync) << ")";
        return t;
      }
    } else if (!abort->aborted()) {
      abort->Abort(failure);
    }
    // The new generation failed before it started: recover from it.
    record_ = record;
    MALLE_RETURN_IF_ERROR(CountRecovery(failure));
    MALLE_ASSIGN_OR_RETURN(GenerationRecord next, Recover(record, failure));
    record = std::move(next);
    kind = Transition::Kind::kRecovered;
  }
}

}  // namespace malle::comm
