// AllocatorState: what the allocator service knows, and the pure decisions it
// takes from it.
//
// Defines the node and job records, Apply (one verified control message ->
// state change), Expire (agents that went silent), BuildProblem (the state as
// an alloc::Problem), Adopt (a Decision -> the next AllocationPlan) and the
// status document that `malletrain status` prints. Everything here is a pure
// function of (state, message or decision, now, options): no I/O, no clock,
// no threads, so the service (allocator_service.h) and the tests drive it
// alike, and a journal replay rebuilds the same state.
//
//   AllocatorState state(options);
//   MALLE_ASSIGN_OR_RETURN(Applied a, state.Apply(envelope, now));
//   if (a.needs_decision) {
//     MALLE_ASSIGN_OR_RETURN(alloc::Decision d, alloc::Decide(state.BuildProblem(now), decide));
//     AllocationPlan plan = state.Adopt(d, now, "milp");
//   }
//
// Rules, in short (docs/operations.md has them in full):
//   - A node is offered while its agent is registered, has not announced a
//     reclaim or a leave, and has sent a heartbeat within heartbeat_timeout.
//     A node registered by another live agent is refused.
//   - A job is queued until a plan gives it nodes, running while it holds
//     nodes, and ends succeeded (a JobComplete, or one of its ranks exiting 0
//     on a node the plan still gives it), failed (max_rank_failures rank
//     crashes in a row: with no step committed between them, as the job's
//     reports and saves tell its step) or cancelled. Ended jobs hold no node.
//   - A running job whose state lives only in its ranks is never stopped to
//     make room for others (it pays a prohibitive alloc::JobSpec::stop_penalty);
//     it stops only when the nodes left cannot hold every running job. A job
//     that has parked (JobSaved kind park) can park again: its stop costs what
//     its park and unpark were measured to cost (the samples it would have
//     trained meanwhile). Each start from zero nodes is a new incarnation
//     (store job id "<job>.i<k>"), bootstrapped by one node, the others join.
//   - An incarnation that no rank holds any more is lost: a running job none
//     of whose nodes has run a member of its current incarnation for
//     heartbeat_timeout (its members all died, or its bootstrap rank ended
//     or lost its node before the first member trained) is queued again, and
//     its next start is a new incarnation (which resumes from the job's park
//     store, if it has one). Its remaining ranks are joiners that would wait
//     for a leader that no longer exists; the next plan stops them.
//   - Parking: a park of the job's current incarnation means no rank holds
//     it: the job is queued (status phase "parked") and gives back its nodes;
//     a rank that then exits 0 is not the job's success. A job is not started
//     again while a rank of it still runs anywhere (that rank may still be
//     writing the state the next incarnation resumes from). Unpark time is
//     measured from the launch of the next incarnation to its first member
//     training (until then: the park's write time).
//   - Curves come from the job's latest advisor report (samples/s at each
//     size it can predict, extended linearly by the nearest per-node rate);
//     before any report a job is assumed to scale like the prior in
//     AllocatorStateOptions.
//   - Probes: a report may ask to run a few steps at a larger size where its
//     curve is uncertain (advisor::ProbeRequest). Adopt grants it only from
//     nodes the policy left spare (never from another job), holds it until a
//     report at the probe size shows the steps done (or max_probe passed),
//     and grants a job at most one probe per probe_cooldown. A probe is an
//     offer the job may ignore, and is not journaled: a restart ends it.
//
// Thread-safety: not synchronised; the owner serialises calls.
#ifndef MALLE_CONTROL_ALLOCATOR_STATE_H_
#define MALLE_CONTROL_ALLOCATOR_STATE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libmalle/alloc/decide.h"
#include "libmalle/advisor/probe.h"
#include "libmalle/alloc/problem.h"
#include "libmalle/control/wire/messages.h"

namespace malle::control {

struct AllocatorStateOptions {
  absl::Duration forward_window = absl::Minutes(2);  // alloc::Problem::forward_window
  alloc::Objective objective = alloc::Objective::kThroughput;
  // alloc::Problem's objective terms (docs/allocator.md): every resize is
  // charged this many times its pause (>= 1), and each job's value is
  // multiplied by rank^rank_weight_exponent (>= 0; 0 = off), rank 1 for the
  // job with the most work left. A job's work left is (total_steps - step) x
  // global batch, from its JobSubmit and its latest advisor report; a job
  // that did not declare total_steps, or has not reported yet, counts as the
  // longest (rank weights favour the jobs known to be close to done).
  // kCompletion needs every job's work left and is refused.
  double resize_hysteresis = 1.0;
  double rank_weight_exponent = 0.0;
  // alloc::Problem::rank_aging: with rank weights, a job's work left ranks as
  // work / (1 + age / rank_aging), its age counted from its JobSubmit, so
  // that no job stays ranked last for ever. Infinite (the default) = off; >
  // 0, and finite only with rank_weight_exponent > 0.
  absl::Duration rank_aging = absl::InfiniteDuration();
  // alloc::Problem::reclaim_rate from this allocator's own history: the
  // main scheduler's reclaims (node_reclaim messages) per node-second of
  // nodes offered, since the allocator's journal began. Each running option
  // then pays the expected cost of a forced shrink within the window. Off
  // by default.
  bool reclaim_hazard = false;
  // An agent silent for this long is considered dead: its node is withdrawn.
  absl::Duration heartbeat_timeout = absl::Seconds(15);
  // A job's curve before its first advisor report (the prior): Amdahl-like,
  // r(n) = default_samples_per_s * n / (1 + default_serial_fraction * (n - 1)).
  // A concave prior gives a new job's first node more value than a running
  // job's next one, so jobs share nodes until their advisors have measured
  // how they really scale; a linear prior would let the first job hold every
  // node (any resize costs something, equal shares gain nothing).
  double default_samples_per_s = 1.0;
  double default_serial_fraction = 0.1;
  // Resize pauses assumed until the advisor has measured them.
  absl::Duration default_grow_pause = absl::Seconds(1);
  absl::Duration default_shrink_pause = absl::Milliseconds(200);
  // Rank crashes (non-zero exit not caused by the agent) in a row, with no
  // step committed between them, after which a job is failed.
  int max_rank_failures = 3;
  // Probes (see the rules above): granted from spare nodes when true.
  bool honour_probes = true;
  absl::Duration max_probe = absl::Minutes(10);     // a probe ends after this at the latest
  absl::Duration probe_cooldown = absl::Minutes(5);  // between two probes of one job

  absl::Status Validate() const;  // kInvalidArgument naming the field
};

enum class NodePhase { kActive, kReclaiming, kGone };

// Node time by what the node did for a job (docs/operations.md, "Held node
// time"). A node is held while the plan gives it to a job or a rank runs on
// it; it is productive while its rank is a member of the job the plan gives
// it. Everything else held is held without training:
//   starting  planned for the job, no rank running yet (the agent has not
//             started it: spec, backoff, the previous rank still there)
//   warming   a rank runs but is not yet a member (imports, model build,
//             waiting to be admitted or for the bootstrap)
//   draining  a rank that is no longer wanted there: leaving, stopped, or of
//             a job the plan no longer gives the node
enum class HeldKind { kProductive, kStarting, kWarming, kDraining };
absl::string_view HeldKindName(HeldKind kind);  // "productive", "starting", ...

struct HeldSeconds {
  double productive = 0, starting = 0, warming = 0, draining = 0;  // node-seconds
  double idle() const { return starting + warming + draining; }   // held without training
  double held() const { return productive + idle(); }
  void Add(HeldKind kind, double seconds);
};
enum class JobPhase { kQueued, kRunning, kSucceeded, kFailed, kCancelled };
absl::string_view NodePhaseName(NodePhase phase);  // "active", "reclaiming", "gone"
absl::string_view JobPhaseName(JobPhase phase);    // "queued", "running", ...

struct NodeRecord {
  std::string node;
  std::string agent;
  NodeClass node_class;
  std::optional<absl::Time> idle_until;
  NodePhase phase = NodePhase::kActive;
  absl::Time registered_at;
  absl::Time last_seen;                  // last message from its agent
  absl::Time reclaim_deadline;           // kReclaiming: when the node must be empty
  std::string why_gone;                  // kGone: leave reason, reclaim, or missed heartbeats
  std::optional<RunningRank> running;    // what the agent last said it runs
  std::optional<std::string> planned;    // job id the current plan gives it
  // Held-time accounting: what the node is doing now, for which job (empty:
  // not held, or a rank of a job this allocator does not know), since when.
  std::optional<HeldKind> held;
  std::string held_job;
  absl::Time held_since;
};

struct JobRecord {
  JobSubmit spec;
  JobPhase phase = JobPhase::kQueued;
  absl::Time submitted_at;
  absl::Time ended_at;
  int incarnation = 0;         // starts from zero nodes so far
  std::string bootstrap_node;  // of the current incarnation
  // Whether a rank still holds (or is about to hold) the current
  // incarnation's state (AllocatorState::HolderAlive): formed once a member
  // of it trained; the bootstrap rank ended before that; when a holder was
  // last seen (soft state, like heartbeats).
  bool formed = false;
  bool bootstrap_ended = false;
  absl::Time holder_seen;
  int rank_failures = 0;      // all of them
  int failures_in_a_row = 0;  // since the job last committed a step (`step` grew)
  int64_t failure_step = -1;  // `step` at the last rank failure
  std::vector<std::string> nodes;  // the current plan's nodes, sorted
  // From the latest advisor report (empty before the first one).
  std::string report_json;
  alloc::Curve curve;
  std::optional<double> grow_pause_s, shrink_pause_s;
  int64_t step = 0;          // last reported step
  int64_t global_batch = 0;  // of the last report (0: unknown)
  // Probes: the latest report's request (within [min, max] nodes), the probe
  // granted (if any) and when the last one was granted.
  std::optional<advisor::ProbeRequest> probe_request;
  struct Probe {
    int nodes = 0;
    int64_t steps = 0;
    absl::Time granted_at;
    std::optional<int64_t> until_step;  // set by the first report at the probe size
    std::string reason;
  };
  std::optional<Probe> probe;
  std::optional<absl::Time> last_probe_at;
  // Parking (from JobSaved): the newest state saved (park or snapshot), the
  // newest park, whether the job is parked now (its current incarnation
  // parked and none has started since) and how many times it parked.
  struct Saved {
    SaveKind kind = SaveKind::kPark;
    std::string runtime_id;
    int64_t step = 0;
    int64_t bytes = 0;
    double write_s = 0;
    absl::Time at;  // when the allocator received it
  };
  std::optional<Saved> last_saved, last_park;
  bool parked = false;
  int64_t parks = 0;
  // Unpark: when the incarnation that resumes a park was launched (until its
  // first member trains), and what the last resume took (soft state).
  std::optional<absl::Time> unpark_since;
  std::optional<double> unpark_s;
  // From JobComplete.
  int64_t steps = 0, samples = 0;
  std::string message;
  // Node-seconds this job held, by kind (accounted up to each node's held_since).
  HeldSeconds held;

  // "<job>.i<incarnation>": the job id its ranks use in the control store,
  // new for every start from zero nodes (a restart cannot meet the old
  // incarnation's store records).
  std::string RuntimeId() const;
  // The measured cost of parking and of resuming, in seconds (nullopt: the
  // job never parked). Unpark: the last resume, else the park's write time.
  std::optional<double> ParkSeconds() const;
  std::optional<double> UnparkSeconds() const;
};

// What Apply did.
struct Applied {
  bool needs_decision = false;  // the allocation problem changed
  bool journal = false;         // hard state changed: write the message to the journal
  std::string what;             // one line for the log, e.g. "node n3 registered (agent a-n3)"
};

class AllocatorState {
 public:
  explicit AllocatorState(AllocatorStateOptions options = {});

  // Applies one verified message received at `now`. Errors (the message is
  // refused, the state is unchanged): kAlreadyExists (a job id that exists, a
  // node registered by another live agent), kNotFound (unknown node or job),
  // kPermissionDenied (an agent speaking for another agent's node),
  // kFailedPrecondition (e.g. a report for an ended job), kInvalidArgument
  // (an AllocationPlan: only the allocator makes those; a report whose
  // content is malformed).
  absl::StatusOr<Applied> Apply(const Envelope& envelope, absl::Time now);

  // Withdraws nodes whose agent has been silent for heartbeat_timeout, ends
  // reclaims past their deadline, and queues again the running jobs whose
  // incarnation no rank has held for heartbeat_timeout (see the rules
  // above). Returns what changed (empty: nothing).
  std::vector<std::string> Expire(absl::Time now);

  // Treats every live node as heard from at `now` (after a restart, the
  // journal has no heartbeats: agents get a full heartbeat_timeout).
  void TouchAll(absl::Time now);

  // Held node time, per job and in total, up to `now` (accounted so far plus
  // each node's current state since it began). The counters are soft state:
  // a journal replay does not rebuild them (heartbeats are not journaled), so
  // the service calls ResetHeldTime after a replay; they count from there.
  HeldSeconds HeldTotal(absl::Time now) const;
  HeldSeconds HeldOf(absl::string_view job, absl::Time now) const;
  void ResetHeldTime(absl::Time now);

  // The allocation problem: offered nodes, queued and running jobs with
  // their curves, current nodes and stop penalties. Always valid.
  alloc::Problem BuildProblem(absl::Time now) const;
  // Reclaims per offered node-second so far (ReclaimRate: reclaims / node
  // time in kActive, counted from each node's registration to when it left
  // kActive); 0 before any node time.
  double ReclaimRate(absl::Time now) const;
  int64_t reclaims_seen() const { return reclaims_seen_; }
  // A job's work left, in samples: (total_steps - step, at least 1) x the
  // global batch of its latest report; 0 when it did not declare
  // total_steps or has not reported a global batch yet.
  static double RemainingSamples(const JobRecord& job);
  // True if some job is queued or running and some node is offered, or a
  // job holds nodes that are no longer offered.
  bool HasWork(absl::Time now) const;

  // Takes `decision` (made from BuildProblem) as the new allocation and
  // returns the plan that says so (id = last plan + 1): every known node that
  // is not gone, with its job or none. Jobs that start get a new incarnation;
  // running jobs that lose every node go back to queued.
  AllocationPlan Adopt(const alloc::Decision& decision, absl::Time now, absl::string_view policy);
  // Re-applies a plan read from the journal (same effects as Adopt had).
  absl::Status Restore(const AllocationPlan& plan);

  // The status document (JSON object text) `malletrain status` prints and
  // clients watch: nodes, jobs, the last plan and its reason.
  std::string StatusJson(absl::Time now) const;

  const std::map<std::string, NodeRecord>& nodes() const { return nodes_; }
  const std::map<std::string, JobRecord>& jobs() const { return jobs_; }
  const std::optional<AllocationPlan>& last_plan() const { return last_plan_; }
  // Plans that changed a running job's nodes (a grow or a shrink), and
  // running jobs stopped because the nodes left could not hold them (what
  // issue 22's park/unpark will count as parks).
  int64_t resizes() const { return resizes_; }
  int64_t job_stops() const { return job_stops_; }
  // Incarnations found lost (no rank held them; Expire).
  int64_t lost_incarnations() const { return lost_incarnations_; }
  // Parks reported (JobSaved kind park), of any incarnation.
  int64_t parks() const { return parks_; }
  int64_t next_plan_id() const { return last_plan_ ? last_plan_->plan + 1 : 1; }
  const AllocatorStateOptions& options() const { return options_; }

  // The job whose runtime id is `runtime_id` ("<job>.i<k>"), or nullptr.
  const JobRecord* FindByRuntimeId(absl::string_view runtime_id) const;

 private:
  absl::StatusOr<Applied> ApplyRegister(const Envelope& e, const NodeRegister& m, absl::Time now);
  absl::StatusOr<NodeRecord*> AgentNode(const Envelope& e, absl::string_view node);
  absl::StatusOr<JobRecord*> LiveJob(absl::string_view job);
  bool Offered(const NodeRecord& n, absl::Time now) const;
  // Held-time accounting: what `n` does now (nullopt: not held) and for which job.
  std::optional<HeldKind> ClassifyHeld(const NodeRecord& n, std::string* job) const;
  // Accounts `n`'s current state up to `at`, then re-classifies it from there.
  void Reclassify(NodeRecord& n, absl::Time at);
  void Accrue(NodeRecord& n, absl::Time until);
  // A node whose agent runs a rank that the plan does not want there (or
  // that is already on its way out): a new incarnation must not bootstrap on it.
  bool Draining(const NodeRecord& n) const;
  void EndJob(JobRecord& job, JobPhase phase, absl::Time now, std::string message);
  // A running job gives back every node (its plan entries too) and is queued.
  void ReleaseNodes(JobRecord& job, absl::Time now);
  // A rank of `job` (any incarnation) still runs on a node that is not gone.
  bool HasRankRunning(const JobRecord& job) const;
  // Some rank holds the current incarnation's state, or is about to: a
  // member of it (training or draining) on a node that is not gone; before
  // its first member trained, its bootstrap node (not gone, the bootstrap
  // rank not ended) running a rank of it or planned for it.
  bool HolderAlive(const JobRecord& job) const;
  alloc::Curve CurveOf(const JobRecord& job) const;
  // Adds spare nodes to `wanted` for granted and grantable probes; returns
  // one note per probe granted or held, for the plan's reason.
  std::vector<std::string> ApplyProbes(std::map<std::string, std::vector<std::string>>& wanted,
                                       absl::Time now);

  AllocatorStateOptions options_;
  std::map<std::string, NodeRecord> nodes_;
  std::map<std::string, JobRecord> jobs_;
  HeldSeconds held_total_;  // every job's, and ranks of jobs not known here
  // Reclaim history (ReclaimRate): reclaims, and node-seconds in kActive of
  // the nodes no longer in it (those still in it are added at the time of
  // asking). Rebuilt by a journal replay from the messages' times.
  int64_t reclaims_seen_ = 0;
  double closed_active_seconds_ = 0;
  // A node leaves kActive at `now`: its active time joins the history.
  void CloseActive(const NodeRecord& n, absl::Time now);
  int64_t resizes_ = 0;
  int64_t job_stops_ = 0;
  int64_t lost_incarnations_ = 0;
  int64_t parks_ = 0;
  std::optional<AllocationPlan> last_plan_;
  struct DecisionInfo {
    absl::Time at;
    std::string policy, reason;
    double solve_ms = 0;
    double objective = 0;
  };
  std::optional<DecisionInfo> last_decision_;
};

// A job's curve from an advisor report's points over [min_nodes, max_nodes]:
// breakpoint (0, 0), the reported sizes, and beyond them the nearest point's
// per-node rate. Requires a non-empty `points` with a size in [1, max_nodes].
alloc::Curve CurveFromPoints(const std::vector<alloc::Breakpoint>& points, int min_nodes,
                             int max_nodes);
// The prior: r(n) = per_node * n / (1 + serial * (n - 1)) at n = 0, min,
// powers of two and max (interpolated linearly in between).
alloc::Curve PriorCurve(int min_nodes, int max_nodes, double per_node, double serial);

}  // namespace malle::control

#endif  // MALLE_CONTROL_ALLOCATOR_STATE_H_
