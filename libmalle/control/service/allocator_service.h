// AllocatorService: the shared allocator, as a loop over the control store.
//
// Consumes the inbox (channel.h) in order, verifies every message (HMAC,
// staleness, replay; envelope.h), applies it to an AllocatorState, journals
// what must survive a restart, and, debounced, runs the configured policy
// (alloc::Decide) and publishes the plan. It also publishes each job's spec
// for the agents and a status document for `malletrain status` and clients.
//
//   AllocatorServiceOptions o;
//   o.journal_path = "/var/lib/malle/journal";
//   MALLE_ASSIGN_OR_RETURN(auto service, AllocatorService::Create(store, secret, o));
//   MALLE_RETURN_IF_ERROR(service->Run());       // blocks until Stop()
//
// Embedded mode: Start() runs the same loop on a thread of the caller's
// process (the launcher, a notebook); Stop() ends it.
//
// Restart: the service does not host the store. The process that hosts it
// (the launcher, `malletrain store`) outlives the allocator, so jobs keep
// training at their current size while the allocator is down, and a new
// allocator replays its journal, takes a new epoch (an older instance that
// is still alive sees it and stops publishing), treats every node as just
// heard from, and continues from the inbox position the journal and the
// store agree on. A ticket whose message does not arrive within
// hole_timeout (its sender died between taking the ticket and writing it) is
// skipped and logged.
//
// Rejected messages (unsigned, forged, stale, replayed, malformed, or
// refused by AllocatorState, e.g. a node registered twice) are logged with
// the reason, counted in the status document, and dropped: nothing a sender
// can send stops the loop.
//
// Thread-safety: Start/Stop/StatusJson/stats are thread-safe; Run blocks the
// calling thread.
#ifndef MALLE_CONTROL_ALLOCATOR_SERVICE_H_
#define MALLE_CONTROL_ALLOCATOR_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libmalle/alloc/decide.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/control/state/allocator_state.h"
#include "libmalle/control/service/channel.h"
#include "libmalle/control/wire/envelope.h"
#include "libmalle/control/state/journal.h"
#include "libmalle/control/wire/secret.h"

namespace malle::control {

struct AllocatorServiceOptions {
  AllocatorStateOptions state;
  alloc::DecideOptions decide;  // the policy and its options
  std::string journal_path;     // empty: no journal (a restart starts empty)
  std::string sender = "allocator";
  // Events closer together than this are decided once.
  absl::Duration debounce = absl::Milliseconds(200);
  // A decision caused only by advisor reports waits at least this long after the previous one.
  absl::Duration report_min_interval = absl::Seconds(5);
  absl::Duration poll_interval = absl::Milliseconds(20);
  absl::Duration hole_timeout = absl::Seconds(5);
  absl::Duration status_interval = absl::Milliseconds(500);
  // Published documents are re-signed this often (readers accept a day).
  absl::Duration republish_interval = absl::Minutes(1);
  VerifyOptions verify;

  absl::Status Validate() const;  // kInvalidArgument naming the field
};

struct AllocatorStats {
  int64_t accepted = 0;
  int64_t rejected = 0;
  int64_t holes_skipped = 0;
  int64_t store_errors = 0;  // loop iterations the control store did not answer
  int64_t store_resets = 0;  // times the store came back empty and was re-seeded
  int64_t decisions = 0;
  int64_t epoch = 0;
  int64_t cursor = 0;
  std::string last_rejection;  // "<code>: <message>"
  std::deque<std::string> recent_rejections;  // the last 20, oldest first
  std::deque<double> decision_ms;  // the last 1000 decision latencies
  double decision_ms_sum = 0;      // of every decision
};

class AllocatorService {
 public:
  // Replays the journal (if any) into the state. Does not touch the store
  // yet. Errors: kInvalidArgument (options), the journal's errors.
  static absl::StatusOr<std::unique_ptr<AllocatorService>> Create(
      std::shared_ptr<comm::ControlStore> store, Secret secret, AllocatorServiceOptions options);
  ~AllocatorService();  // Stop() and join

  // Runs the loop until Stop(). Returns OK after Stop(); otherwise the error
  // that ended it: the store unreachable at the start (kUnavailable), the
  // journal not writable (kUnavailable), another allocator took over
  // (kAborted). A store outage later does not end it: it waits, and when the
  // store is back re-seeds what a restarted store lost (epoch, inbox
  // numbering, job specs, plan, status) from its own state.
  absl::Status Run();
  // Run() on a background thread; its result is what Stop() returns.
  absl::Status Start();
  // Ends the loop at its next iteration and waits for it (at most one
  // decision). Returns Run()'s status when Start() was used.
  absl::Status Stop();

  std::string StatusJson() const;
  AllocatorStats stats() const;
  // The Prometheus text exposition of the allocator's state and counters
  // (docs/operations.md, "Metrics"). Thread-safe.
  std::string MetricsText() const;

  // One iteration of the loop, for tests: read what is in the inbox, expire,
  // decide if due, publish. `now` drives every time-based rule.
  absl::Status Step(absl::Time now);
  // Prepares Run()/Step(): epoch, inbox cursor, republish. Called by Run().
  absl::Status Begin(absl::Time now);

 private:
  AllocatorService(std::shared_ptr<comm::ControlStore> store, Secret secret,
                   AllocatorServiceOptions options, std::unique_ptr<Journal> journal);
  absl::Status Replay();
  absl::Status Consume(absl::Time now);
  absl::Status Handle(const std::string& wire, absl::Time now);
  absl::Status Decide(absl::Time now);
  absl::Status PublishPlan(absl::Time now);
  absl::Status PublishStatus(absl::Time now);
  absl::Status CheckEpoch();
  absl::Status StoreBack(absl::Time now);
  void Reject(const absl::Status& why, absl::string_view what);

  std::shared_ptr<comm::ControlStore> store_;
  Secret secret_;
  const AllocatorServiceOptions options_;
  std::unique_ptr<Journal> journal_;
  Outbox outbox_;  // signs published documents

  mutable absl::Mutex mu_;
  AllocatorState state_ ABSL_GUARDED_BY(mu_);
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
  std::string status_json_ ABSL_GUARDED_BY(mu_);

  // Loop state (the loop's thread only).
  ReplayGuard guard_;
  int64_t cursor_ = 0;
  int64_t epoch_ = 0;
  std::optional<absl::Time> hole_since_;
  std::optional<absl::Time> pending_since_;  // a decision is due from this time
  bool pending_report_only_ = true;
  absl::Time last_decision_ = absl::InfinitePast();
  absl::Time last_status_ = absl::InfinitePast();
  absl::Time last_republish_ = absl::InfinitePast();
  absl::Time last_expire_ = absl::InfinitePast();

  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Status thread_status_;
};

}  // namespace malle::control

#endif  // MALLE_CONTROL_ALLOCATOR_SERVICE_H_
