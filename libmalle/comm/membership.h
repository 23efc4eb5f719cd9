// Membership decisions of the elastic group, as pure functions.
//
// Everything here is a function of (state, requests, now, options): no I/O, no
// threads, no LibTorch. ElasticGroup (elastic_group.h) calls these and does
// the store and network work around them; tests drive them table-driven.
//
//   GenerationRecord current = ...;                 // generation g
//   PlannedChange change = PlanNextMembers(current, requests, /*max_size=*/8);
//   if (change.changed) { ... propose generation g+1 with change.next ... }
//
// Thread-safety: pure functions are thread-safe; HeartbeatTracker is not (one
// owner thread).
#ifndef MALLE_COMM_MEMBERSHIP_H_
#define MALLE_COMM_MEMBERSHIP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace malle::comm {

// Checks a job or member id: 1..128 characters from [A-Za-z0-9._-]. `what`
// names the field in the error ("job_id", "member_id").
absl::Status ValidateId(absl::string_view what, absl::string_view id);
// Checks a node name (the rank environment's MALLE_NODE): 1..128 characters
// from [A-Za-z0-9._:-].
absl::Status ValidateNodeName(absl::string_view what, absl::string_view node);

// Why a generation exists.
enum class GenerationCause { kBootstrap, kPlanned, kRecovery };
absl::string_view GenerationCauseName(GenerationCause cause);

// The agreed state of one generation; written once to the store (by atomic
// create-if-absent) and never changed.
struct GenerationRecord {
  int64_t generation = 0;
  GenerationCause cause = GenerationCause::kBootstrap;
  std::vector<std::string> members;  // rank order: members[r] has rank r
  // The node each member runs on (MALLE_NODE), so that state reaches a node
  // once and is copied there locally: empty (no member said), or one entry
  // per member, "" where that member did not say.
  std::vector<std::string> nodes;
  // Change requests with index < requests_consumed have been decided.
  int64_t requests_consumed = 0;
  // Joins seen but not admitted yet (group at max size), oldest first.
  std::vector<std::string> deferred_joins;
  std::string reason;  // human-readable, for logs and `status`
  // A member asked to leave while it was the last one: it stays (a group is
  // never empty) and must park the job's state, then close. Empty: none.
  std::string park;

  int RankOf(absl::string_view member) const;  // -1 if not a member
  // The node of `member` ("" if unknown or not a member).
  std::string NodeOf(absl::string_view member) const;
  bool operator==(const GenerationRecord& other) const;
};

// Text encoding (one "key=value" per line, stable and versioned "v=1").
std::string EncodeRecord(const GenerationRecord& record);
// Rejects anything malformed with kInvalidArgument naming the field.
absl::StatusOr<GenerationRecord> DecodeRecord(absl::string_view text);

// A request in the job's change queue.
struct ChangeRequest {
  enum class Kind { kJoin, kLeave };
  Kind kind = Kind::kJoin;
  std::string member;
  bool operator==(const ChangeRequest& other) const {
    return kind == other.kind && member == other.member;
  }
};
std::string EncodeRequest(const ChangeRequest& request);
absl::StatusOr<ChangeRequest> DecodeRequest(absl::string_view text);
// Several leaves in one queue entry ("leave a,b,c"): a node's ranks leave
// together, and a leader reads one entry whole, so they go in one generation
// change (never split over two boundaries). `members` must not be empty.
std::string EncodeLeaves(absl::Span<const std::string> members);
// One queue entry: a join, a leave, or several leaves (EncodeLeaves), in order.
absl::StatusOr<std::vector<ChangeRequest>> DecodeRequests(absl::string_view text);

// The leader's decision for the next step boundary.
struct PlannedChange {
  bool changed = false;                // membership differs from current
  std::vector<std::string> next;       // next member list (survivors first, in order)
  std::vector<std::string> joined;     // admitted, in admission order
  std::vector<std::string> removed;    // left on request
  std::vector<std::string> deferred;   // joins waiting for room
  std::vector<std::string> notes;      // requests that were ignored, and why
  // The last member, asked to leave: it stays and must park the job (no
  // member is left to hold its state). Empty: none.
  std::string park;
  // The last member, asked to leave while joiners are admitted in this very
  // change: it stays for now (the joiners receive the state) and asks to
  // leave again, a normal leave at the next boundary. Empty: none.
  std::string leave_again;
  int64_t requests_consumed = 0;
};

// Applies `requests` (queue indices current.requests_consumed,
// current.requests_consumed+1, ...) to `current`:
//  - a leave removes a member, unless it is the last one (never an empty group):
//    that one is to park the job instead (`park`), or, when joiners are
//    admitted in the same change, to hand over and leave after (`leave_again`);
//    a leave of a deferred joiner cancels the join;
//  - joins are admitted in queue order while size < max_size, the rest are
//    deferred (kept in order for later boundaries);
//  - a join by a current member or a leave by a stranger is ignored and noted.
// Survivors keep their relative order; joiners are appended.
PlannedChange PlanNextMembers(const GenerationRecord& current,
                              absl::Span<const ChangeRequest> requests, int max_size);

// After a failure: the members of the failed generation that checked in and
// are not reported dead, in their old order. A member can check in and then
// exit (it closed its group, or its owner saw it die): its check-in alone must
// not make it a member of the next generation, where everyone would wait for
// it. If that would leave nobody, the dead reports are ignored (a group is
// never empty, and the caller, which checked in, is alive).
std::vector<std::string> SurvivingMembers(absl::Span<const std::string> old_members,
                                          const absl::flat_hash_set<std::string>& checked_in,
                                          const absl::flat_hash_set<std::string>& dead = {});

// Where training resumes in a new generation, from each rank's last committed
// step (-1 = none, e.g. a joiner).
struct ResumePoint {
  int64_t resume_step = 0;  // first step nobody has committed
  int source_rank = 0;      // lowest rank holding the newest committed state
};
ResumePoint ChooseResumePoint(absl::Span<const int64_t> committed_by_rank);

// Decides which peers' heartbeats have gone stale. A heartbeat is a counter
// its owner increments; a peer is stale when its counter has not changed for
// `timeout` of the tracker's observations.
class HeartbeatTracker {
 public:
  explicit HeartbeatTracker(absl::Duration timeout) : timeout_(timeout) {}
  // Starts (or restarts) tracking exactly `members`, all fresh as of `now`.
  void Reset(absl::Span<const std::string> members, absl::Time now);
  void Observe(absl::string_view member, int64_t counter, absl::Time now);
  // Members whose counter has not moved for at least `timeout`.
  std::vector<std::string> Stale(absl::Time now) const;
  // How long `member` has been silent (zero if unknown).
  absl::Duration SilentFor(absl::string_view member, absl::Time now) const;

 private:
  struct Entry {
    int64_t counter = -1;
    absl::Time last_change;
  };
  absl::Duration timeout_;
  std::vector<std::string> order_;
  absl::flat_hash_map<std::string, Entry> entries_;
};

}  // namespace malle::comm

#endif  // MALLE_COMM_MEMBERSHIP_H_
