// ElasticGroup: the membership of one job, as a sequence of generations.
//
// Each generation is an ordered member list (rank r = position r) plus a
// Communicator built on the store prefix of that generation. Membership only
// changes at step boundaries: planned joins and leaves are agreed in one tiny
// collective, failures through an atomic create-if-absent on the store, so no
// two survivors can ever form different generations. Survivors keep their
// relative order: the oldest survivor is rank 0 (the leader) and is the
// natural source of state for joiners.
//
//   ElasticGroupOptions options;
//   options.job_id = "mnist";
//   options.bootstrap_size = 4;                   // generation 0: first 4 arrivals
//   ASSIGN_OR_RETURN(auto group, ElasticGroup::Join(store, options));
//   int64_t step = group->last_transition().resume_step;
//   while (step < kSteps) {
//     absl::Status s = TrainStep(group->comm(), step);   // collectives inside
//     if (s.ok()) group->Commit(step++);
//     ASSIGN_OR_RETURN(Transition t, group->AtStepBoundary());
//     if (t.kind == Transition::Kind::kLeft || t.kind == Transition::Kind::kExcluded) break;
//     if (t.changed()) {
//       SyncState(group->comm(), t.state_source_rank);    // joiners / laggards catch up
//       step = t.resume_step;                              // redo what nobody committed
//     }
//   }
//
// Failures: a member killed (-9) makes a collective fail on its neighbours;
// they abort the generation in the store, every member's watchdog sees it
// within heartbeat_interval and aborts its own blocked collective. A frozen
// member (SIGSTOP) is found by its stale heartbeat. Survivors check in, the
// first to decide writes the next generation, everyone builds it, and
// AtStepBoundary() returns kRecovered with the step to redo. A member that
// comes back after that finds itself excluded; it can only Join() again as a
// new member (a member id names one process incarnation).
//
// Thread-safety: one thread (the training loop) calls the member functions.
// The group runs one long-lived background thread (the watchdog: heartbeats,
// staleness, abort propagation) and a short-lived helper thread per group
// build; docs/threading.md lists every thread. Join() and AtStepBoundary()
// block, each step of them bounded by the configured timeouts.
#ifndef MALLE_COMM_ELASTIC_GROUP_H_
#define MALLE_COMM_ELASTIC_GROUP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libmalle/base/clock.h"
#include "libmalle/comm/backend.h"
#include "libmalle/comm/communicator.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/comm/membership.h"

namespace malle::comm {
namespace internal {
class LivenessListener;
}  // namespace internal

struct ElasticGroupOptions {
  std::string job_id;     // required; [A-Za-z0-9._-]{1,128}
  std::string member_id;  // unique per process incarnation; empty = generated
  // > 0: the first `bootstrap_size` members to arrive form generation 0 (late
  // arrivals join it at a boundary). 0: join a job that is already running.
  int bootstrap_size = 0;
  int max_size = 1024;  // joins beyond this wait for room
  // The node this member runs on (MALLE_NODE; [A-Za-z0-9._:-]{1,128}); empty:
  // unknown (a node of its own). Goes into the generation records, so that a
  // state transfer crosses to a node once and is copied there locally.
  std::string node;
  // Backend for device tensors; null means Gloo (CPU). Control traffic always
  // uses Gloo.
  std::shared_ptr<const BackendFactory> data_backend;
  GlooBackendOptions gloo;
  // Waiting to be admitted, for the bootstrap, and for a group to build.
  absl::Duration rendezvous_timeout = absl::Seconds(60);
  // Upper bound for one collective before the generation is aborted.
  absl::Duration op_timeout = absl::Seconds(60);
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  // A member whose heartbeat has not moved for this long is declared failed.
  absl::Duration heartbeat_timeout = absl::Seconds(2);
  // After a failure, how long survivors wait for each other to check in.
  // At least heartbeat_interval: a member busy computing checks in from its
  // watchdog, at the watchdog's next tick.
  absl::Duration recovery_grace = absl::Milliseconds(500);
  // A member gives up (AtStepBoundary returns kAborted) when it is about to
  // recover for the this-many-plus-first time in a row without committing a
  // step in between: a failure that repeats at every attempt (a bug, a
  // misconfigured backend) would otherwise make the job recover forever.
  int max_recoveries_without_commit = 16;
  base::Clock* clock = nullptr;  // null = real time

  absl::Status Validate() const;  // kInvalidArgument naming the field
};

// What happened at a step boundary (or at Join()).
struct Transition {
  enum class Kind {
    kNone,       // same generation, keep going
    kBootstrap,  // this member formed generation 0
    kJoined,     // this member was admitted into a running job
    kPlanned,    // planned joins/leaves took effect
    kRecovered,  // a failure was recovered from
    kLeft,       // this member left on request; the group is closed for it
    kExcluded,   // this member was declared failed; it must Join() again
  };
  Kind kind = Kind::kNone;
  int64_t generation = 0;
  int rank = -1;
  int size = 0;
  std::vector<std::string> members;
  // nodes[r]: the node of members[r] ("" unknown); empty when no member said.
  std::vector<std::string> nodes;
  // Members new in this generation, the same list on every member (a joiner
  // learns it in the generation's first collective); empty at a bootstrap.
  std::vector<std::string> joined;
  std::vector<std::string> removed;  // members gone since the last generation
  // Training resumes at this step: the first one no member has committed.
  int64_t resume_step = 0;
  // The rank with the newest committed state (lowest such rank).
  int state_source_rank = 0;
  std::vector<int64_t> committed_by_rank;  // -1 = nothing committed
  std::string reason;
  // This member is the job's last and was asked to leave: no member is left to
  // hold the job's state, which it must park (elastic/park_store.h) before it
  // closes. With kind kNone or kPlanned.
  bool park = false;

  struct Phases {
    absl::Duration detect;  // failure raised locally -> recovery started
    // Planned changes: the boundary vote, i.e. waiting for every member to
    // finish the step in flight. Every boundary pays it, changed or not (a
    // fixed-size job waits as long in its next collective); not in `agree`.
    absl::Duration wait;
    absl::Duration agree;   // boundary/recovery start -> next membership known, less `wait`
    absl::Duration build;   // process group(s) of the new generation
    absl::Duration sync;    // committed-step exchange in the new generation
    absl::Duration total;
  } phases;

  bool changed() const { return kind != Kind::kNone && kind != Kind::kLeft && kind != Kind::kExcluded; }
  bool active() const { return kind != Kind::kLeft && kind != Kind::kExcluded; }
};
absl::string_view TransitionKindName(Transition::Kind kind);

class ElasticGroup {
 public:
  // Registers this process in job `options.job_id` on `store` (a handle to the
  // deployment's store, not prefixed) and blocks until it is a member of a
  // generation whose Communicator is built.
  // Errors: kInvalidArgument (options), kAlreadyExists (member id taken),
  // kNotFound (no such job after rendezvous_timeout, for a pure joiner),
  // kDeadlineExceeded (bootstrap incomplete or not admitted in time),
  // kUnavailable (store unreachable), kAborted (declared failed while
  // joining), kInternal / kInvalidArgument (a corrupt record in the store).
  static absl::StatusOr<std::unique_ptr<ElasticGroup>> Join(std::shared_ptr<ControlStore> store,
                                                            ElasticGroupOptions options);

  // If still a member, aborts the current generation so the others recover at
  // once instead of waiting for this member's heartbeat to go stale.
  ~ElasticGroup();
  ElasticGroup(const ElasticGroup&) = delete;
  ElasticGroup& operator=(const ElasticGroup&) = delete;

  // The current generation's collectives. Must not be used after a kLeft or
  // kExcluded transition.
  Communicator& comm() { return *comm_; }
  int rank() const { return transition_.rank; }
  int size() const { return transition_.size; }
  int64_t generation() const { return transition_.generation; }
  const std::vector<std::string>& members() const { return transition_.members; }
  const std::string& member_id() const { return options_.member_id; }
  const std::string& job_id() const { return options_.job_id; }
  const Transition& last_transition() const { return transition_; }
  bool active() const { return transition_.active(); }

  // Records that `step` completed on this rank (no I/O). Steps are committed
  // in order; the newest one decides where a new generation resumes.
  void Commit(int64_t step);
  int64_t committed_step() const { return committed_.load(); }

  // The step boundary. Blocks in one tiny collective; if the leader saw a
  // change request, or a collective of this generation failed, moves to the
  // next generation first. Returns kNone when nothing changed.
  // A generation that fails to build is itself recovered from (the next one
  // leaves out whoever did not arrive), so build failures are not errors here.
  // Errors: kFailedPrecondition (called after leaving or exclusion),
  // kUnavailable / kDeadlineExceeded (the control store did not answer).
  absl::StatusOr<Transition> AtStepBoundary();

  // Optional: starts the next boundary's vote now and returns without waiting
  // for it. Call it once this step's gradients are reduced (before the
  // optimizer step): the vote then completes while the optimizer runs, and an
  // AtStepBoundary() that finds nothing to change returns without a collective
  // of its own, so a step synchronises the ranks once, not twice. The leader's
  // part is only a look at whether change requests are queued (no record is
  // written); if some are, AtStepBoundary() runs the usual agreement. A second
  // call before AtStepBoundary() does nothing. Nothing may be issued on
  // comm() between this call and AtStepBoundary() unless every rank issues it
  // in the same order. Errors: kFailedPrecondition (after leaving or
  // exclusion), kUnavailable / kDeadlineExceeded (the leader's store read).
  absl::Status BeginStepBoundary();

  // Asks to leave at the next step boundary (AtStepBoundary returns kLeft).
  absl::Status RequestLeave();

  // Declares that this member is done with the job together with the others
  // (the job agreed to stop: its last step is committed everywhere). Closing
  // the group then neither aborts the generation nor reports this member
  // dead: a slower member still completing the last collective must not see
  // it fail. Without Finish(), closing an active group is a failure for the
  // others (they recover without this member at once). Does not block.
  void Finish() { finished_.store(true); }

  // --- For drivers (launchers, tests, the allocator) -------------------------
  // Queues a leave for `member_id` of job `job_id`; it happens at the next
  // step boundary. `store` is the deployment's (unprefixed) store.
  static absl::Status RequestLeave(ControlStore& store, absl::string_view job_id,
                                   absl::string_view member_id);
  // Queues the leaves of several members as one request (a node agent's
  // ranks): the leader reads it whole, so they leave in one generation change.
  static absl::Status RequestLeave(ControlStore& store, absl::string_view job_id,
                                   absl::Span<const std::string> member_ids);
  // Reports that the process of `member_id` has exited (its launcher or node
  // agent saw it): a recovery then stops waiting for its check-in instead of
  // waiting out recovery_grace. Reporting a live member makes it be left out
  // of the next recovery (it finds itself excluded).
  static absl::Status ReportDead(ControlStore& store, absl::string_view job_id,
                                 absl::string_view member_id);
  // Reports several members dead together (a node's ranks): every one is
  // marked before the count that recoveries look at moves.
  static absl::Status ReportDead(ControlStore& store, absl::string_view job_id,
                                 absl::Span<const std::string> member_ids);
  // The newest generation record of a job (kNotFound if it has none).
  static absl::StatusOr<GenerationRecord> LatestGeneration(ControlStore& store,
                                                           absl::string_view job_id);

 private:
  class Watchdog;
  ElasticGroup(std::shared_ptr<ControlStore> root, ElasticGroupOptions options);

  absl::Status Register();
  absl::StatusOr<GenerationRecord> Bootstrap(bool* bootstrapped);
  absl::StatusOr<GenerationRecord> WaitForAdmission();
  absl::StatusOr<GenerationRecord> ReadRecord(int64_t generation);
  // The nodes of `members` for a new record: from `known` where it lists the
  // member, else from the member's node key. Empty if no node is known.
  absl::StatusOr<std::vector<std::string>> NodesOf(const std::vector<std::string>& members,
                                                   const GenerationRecord& known);
  // Moves into `record` (building its groups); on failure recovers and tries
  // the successor, until this member is in a working generation or out.
  absl::StatusOr<Transition> Enter(GenerationRecord record, Transition::Kind kind, absl::Time start,
                                   absl::Duration detect, absl::Duration wait = absl::ZeroDuration());
  // After a failure of `failed`: check in, wait for the others, agree.
  absl::StatusOr<GenerationRecord> Recover(const GenerationRecord& failed, absl::Status why);
  // kFailedPrecondition once this member left or was excluded.
  absl::Status RequireMember() const;
  // True (and logged, rate-limited) for a status that says the control store
  // is unreachable: the step boundary then goes on without a change.
  bool StoreOutage(const absl::Status& status);
  // Before each recovery: kAborted once max_recoveries_without_commit is used up.
  absl::Status CountRecovery(const absl::Status& why);
  absl::StatusOr<int64_t> LeaderPropose();
  absl::Status Enqueue(const ChangeRequest& request);
  // At most once per generation (an atomic guards it; closing the group
  // disables it). `ensure_visible`: on return this member's key is in the
  // store even if another thread did the check-in and is still writing it.
  absl::Status CheckIn(ControlStore& store, int64_t generation, bool ensure_visible = false);
  absl::Status PublishAbort(ControlStore& store, int64_t generation, const absl::Status& reason);

  std::shared_ptr<ControlStore> root_;
  std::shared_ptr<ControlStore> job_;  // main connection, job prefix
  ElasticGroupOptions options_;
  base::Clock* clock_;
  std::shared_ptr<const BackendFactory> gloo_;
  std::shared_ptr<const BackendFactory> data_;
  std::string nonce_;

  GenerationRecord record_;   // current generation
  GenerationRecord pending_;  // leader only: record_ plus requests read but not applied
  std::unique_ptr<Communicator> comm_;
  // BeginStepBoundary()'s vote in flight on comm_; AtStepBoundary() takes it.
  struct EarlyVote {
    at::Tensor value;  // one int64: 1 if the leader saw change requests
    PendingCollective pending;
  };
  std::optional<EarlyVote> early_vote_;
  Transition transition_;
  std::atomic<int64_t> committed_{-1};
  int recoveries_since_commit_ = 0;       // training thread only (Commit, AtStepBoundary)
  int64_t store_failures_ = 0;            // training thread only (StoreOutage)
  bool park_requested_ = false;           // training thread only: the leader refused its own leave
  std::atomic<int64_t> checked_in_{-1};  // newest generation this member checked in to
  std::atomic<bool> finished_{false};    // Finish(): the destructor leaves the generation alone
  // Refuses connections once this group is gone (others probe it in a recovery);
  // null if it could not listen. Drained by the watchdog, destroyed after it.
  std::unique_ptr<internal::LivenessListener> liveness_;
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace malle::comm

#endif  // MALLE_COMM_ELASTIC_GROUP_H_
