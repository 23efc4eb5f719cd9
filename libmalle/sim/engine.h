// The trace-driven simulator: replays an idle-node trace, submits a job mix,
// and lets an allocation policy (the same alloc::Decide the live allocator
// runs) decide who gets which idle node.
//
//   MALLE_ASSIGN_OR_RETURN(IdleTrace trace, LoadIdleTrace(".../summit-idle-2021-02.csv.gz"));
//   MALLE_ASSIGN_OR_RETURN(JobMix mix, LoadJobMix(".../jobs-imagenet-1001.csv"));
//   SimOptions opts;
//   opts.decide.policy = alloc::PolicyKind::kDp;
//   MALLE_ASSIGN_OR_RETURN(SimResult r, Simulate(trace, mix.jobs, opts));
//   std::cout << r.summary.efficiency << "\n";
//
// Accounting (BFTrainer-compatible, docs/simulator.md has the worked example):
//   - between events a running job on n nodes trains r(n) samples/s;
//   - a resize decided by the policy costs r(old n) * pause (up pause when it
//     grows, down pause when it shrinks; a start from 0 nodes costs nothing
//     because r(0) = 0) — Accounting::kBftrainer. Accounting::kPause instead
//     stops the job for the pause (it trains nothing for that long), which is
//     what malletrain's elastic layer actually does;
//   - a node reclaimed from under a job is a forced shrink and costs the down
//     pause the same way; if the job falls below min_nodes it stops (a
//     preemption) and waits for nodes again; what a stop (a preemption, or
//     the policy giving a running job 0 nodes) costs is SimOptions::
//     preemption: by default the park + unpark time of the live system's
//     park store, or nothing, the progress since the last snapshot, or all
//     progress (PreemptionCost);
//   - a job finishes when it has trained work_samples; its nodes are freed;
//   - jobs are admitted at their submit time; the policy considers running
//     jobs and the first `max_waiting` waiting jobs (FIFO);
//   - decisions are debounced: an event schedules a decision `debounce`
//     later unless one is already pending (events at one time always
//     coalesce).
//
// Deterministic: same inputs and options, same output (the seed only drives
// the estimated forecast's tie-breaking and synthetic mixes).
//
// Thread-safety: Simulate is a pure function of its arguments (apart from
// the MILP's wall-clock limit and the measured decision latencies).
#ifndef MALLE_SIM_ENGINE_H_
#define MALLE_SIM_ENGINE_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libmalle/alloc/decide.h"
#include "libmalle/sim/idle_trace.h"
#include "libmalle/sim/job_mix.h"

namespace malle::sim {

enum class Accounting { kBftrainer, kPause };

// What a preemption (a job stopped: reclaims pushed it below min_nodes, or
// the policy gave it 0 nodes) costs the job. docs/simulator.md has the
// worked numbers and where the defaults come from.
enum class PreemptionCost {
  // Nothing: the job keeps its progress and restarts for free (BFTrainer's
  // replayer; the simulator's accounting before issue 22).
  kFree,
  // The live system with a park store: the last member writes the job state
  // before it leaves (r(n before) x park time lost) and the next incarnation
  // reads it back (r(n after) x unpark time lost; with Accounting::kPause the
  // job is paused for it instead). Every stop is assumed announced (a grace
  // period), so no snapshot is charged.
  kPark,
  // Every stop unplanned (kill -9, no grace): the job falls back to its last
  // asynchronous snapshot (it loses what it trained since), pays the unpark
  // time to read it, and pays each snapshot's copy while it runs.
  kSnapshot,
  // No park store: the job loses everything and starts over (the live
  // system's behaviour without one).
  kRestart,
};

// "free", "park", "snapshot", "restart".
const char* PreemptionCostName(PreemptionCost mode);
// The inverse; InvalidArgument naming the allowed names otherwise.
absl::StatusOr<PreemptionCost> ParsePreemptionCost(absl::string_view name);

// The parameters of PreemptionCost. Defaults: a ~250 MB job state (the size
// of resize_bench's state, issue 22's park benchmark) and the bandwidths of
// this project's VMs (dd of 256 MiB: 129 MB/s written with fsync, 1.1 GB/s
// read with O_DIRECT; a clone into fresh memory ~1 GB/s, docs/benchmarks.md).
// A site's shared filesystem differs: pass what the park benchmark measures.
struct PreemptionCostOptions {
  PreemptionCost mode = PreemptionCost::kPark;
  double state_bytes = 250e6;        // job state (parameters, optimizer, ...)
  double write_bytes_per_s = 125e6;  // park store write (fsync included)
  double read_bytes_per_s = 1e9;     // park store read
  double copy_bytes_per_s = 1e9;     // a snapshot's copy (the step pays it)
  // Per park / unpark, beyond the bytes: rename, directory fsync, checksum
  // and HMAC check, store metadata.
  absl::Duration park_fixed = absl::Seconds(1);
  absl::Duration unpark_fixed = absl::Seconds(1);
  // kSnapshot: time between snapshots while the job runs. Zero: adaptive like
  // the live engine's (elastic::EngineOptions::snapshot_budget), so that the
  // copies cost `snapshot_budget` of the training time: copy / budget, and
  // never less than the write (the live writer skips a snapshot while the
  // previous one is being written).
  absl::Duration snapshot_interval = absl::ZeroDuration();
  double snapshot_budget = 0.01;

  absl::Duration ParkTime() const;
  absl::Duration UnparkTime() const;
  absl::Duration SnapshotCopyTime() const;
  absl::Duration SnapshotInterval() const;  // the interval kSnapshot uses
};

// What the policy knows of a job's scalability.
enum class CurveMode {
  kOracle,   // the job's true (measured) curve
  // Only what an in-job advisor could have learned: the rates at the sizes
  // the job actually ran at (after `learned_warmup`), linear in between and
  // scaled by the last known per-node rate beyond; a job that never ran is
  // assumed to scale linearly from its rate at min_nodes.
  kLearned,
  // No scalability information at all: the policy sees every job as linear
  // from its rate at min_nodes (what a user can state by running the job
  // once), whatever it measured since. The baseline the learned mode should
  // beat (MalleTrain's claim).
  kLinear,
};

// What the policy knows of when idle nodes will be reclaimed.
enum class ForecastMode {
  kNone,       // nothing: every window is unknown (infinite)
  kOracle,     // the true time until the node's next busy event in the trace
  kEstimated,  // from idle-fragment statistics of the trace seen so far
  // The main scheduler's reservations: a node's reclaim is known exactly from
  // the time the trace announces it (IdleEvent::announced; for SWF logs the
  // submit time of the job that takes the node), unknown (infinite) before.
  kReservation,
};

// A class of the machine's nodes (speed and locality group, alloc::NodeClass)
// and the share of the trace's nodes it holds (SimOptions::node_classes).
struct NodeClassShare {
  alloc::NodeClass node_class;
  double share = 0.0;  // > 0; the shares of all classes sum to 1
};

// Parses "id:locality:speed:share[,...]" (e.g. "fast:r0:1:0.5,slow:r1:0.85:0.5")
// into node classes for SimOptions::node_classes; an error names the item
// and the field. The shares are checked by Simulate (they must sum to 1).
absl::StatusOr<std::vector<NodeClassShare>> ParseNodeClassShares(absl::string_view spec);

struct SimOptions {
  alloc::DecideOptions decide;  // policy and its options
  alloc::Objective objective = alloc::Objective::kThroughput;
  alloc::ResizeCostModel resize_cost = alloc::ResizeCostModel::kBftrainer;
  double resize_hysteresis = 1.0;  // alloc::Problem::resize_hysteresis
  // alloc::Problem::rank_weight_exponent: jobs closer to done weigh more (the
  // engine gives every job its remaining samples). 0 = off.
  double rank_weight_exponent = 0.0;
  // alloc::Problem::rank_aging: with rank weights, a job's work left ranks
  // as work / (1 + age / rank_aging), age since its (aligned) submit time.
  // Infinite = off. > 0; finite only with rank_weight_exponent > 0.
  absl::Duration rank_aging = absl::InfiniteDuration();
  absl::Duration forward_window = absl::Minutes(2);
  absl::Duration debounce = absl::ZeroDuration();
  int max_waiting = 64;
  // At most this many jobs are in play at once: the policy considers only
  // the first `max_jobs` submitted, unfinished jobs in submit order, running
  // or not (BFTrainer's replayer's `maxJ`, 10 by default there; a job, once
  // among them, stays until it finishes). 0 = no limit (then every running
  // job and the first `max_waiting` waiting ones are considered).
  int max_jobs = 0;
  Accounting accounting = Accounting::kBftrainer;
  PreemptionCostOptions preemption;
  CurveMode curves = CurveMode::kOracle;
  absl::Duration learned_warmup = absl::ZeroDuration();
  ForecastMode forecast = ForecastMode::kNone;
  // Tell the policy the machine's reclaim rate so far (alloc::Problem::
  // reclaim_rate: reclaims of idle nodes per idle node-second, from the trace
  // seen up to the decision, history before the replay start included; 0
  // until 32 reclaims were seen), so that it prices the forced shrinks that
  // holding more nodes risks.
  bool reclaim_hazard = false;
  // Node classes: the trace's nodes, in their order, fall into contiguous
  // blocks (racks, partitions), class k taking its `share` of them (block
  // boundaries rounded to whole nodes). A job trains at its curve's rate
  // times the smallest speed among the nodes it holds, times
  // `cross_locality_factor` when they span several locality groups: the
  // rule the allocator's count model prices (alloc::Problem). Empty: one
  // class of speed 1 (as before).
  std::vector<NodeClassShare> node_classes;
  double cross_locality_factor = 1.0;  // in (0, 1]; alloc::Problem's
  // Replay window; InfinitePast/InfiniteFuture = the trace's own bounds.
  // BFTrainer's replayer starts at the trace's 1,000th snapshot
  // (skip_snapshots = 999).
  absl::Time start = absl::InfinitePast();
  absl::Time end = absl::InfiniteFuture();
  int skip_snapshots = 0;
  // Job submit times are shifted so that the first job arrives at the replay
  // start plus this offset (mixes and traces come from different periods).
  bool align_submit_times = true;
  uint64_t seed = 1;
  bool record_events = true;       // fill SimResult::events
  absl::Duration timeline_step = absl::Minutes(10);  // SimResult::timeline sampling
  // Called now and then with the fraction of the replay done (0..1).
  std::function<void(double)> progress;
  // Called after every decision with the problem the policy was given, its
  // answer and the wall time Decide took (e.g. to audit a MILP's gap against
  // the DP on the same problem). Not timed as part of the decision.
  std::function<void(const alloc::Problem&, const alloc::Decision&, absl::Duration)> on_decision;
};

struct JobOutcome {
  std::string name;
  absl::Time submit, first_start = absl::InfiniteFuture(), finish = absl::InfiniteFuture();
  double work_samples = 0, samples_done = 0;
  double node_seconds = 0;       // node-time held
  double ideal_samples = 0;      // integral of r(n(t)) dt: same node counts, no losses
  int resizes = 0;               // policy-decided size changes (starts included)
  int preemptions = 0;           // forced stops (fell below min_nodes)
  int reclaims = 0;              // nodes taken from under the job
  int stops = 0;                 // the policy gave the job 0 nodes while it ran
  double lost_to_preemptions = 0;  // samples (SimOptions::preemption)
};

struct EventRecord {
  absl::Time time;
  std::string kind;  // "idle", "busy", "submit", "finish", "decide", "resize", "reclaim", "preempt"
  std::string job;   // empty if none
  std::string node;  // empty if none
  int nodes_before = 0, nodes_after = 0;  // the job's, for resize/reclaim/preempt
  int idle_nodes = 0;                     // idle nodes after the event
  int used_nodes = 0;                     // idle nodes held by jobs after the event
  double decision_ms = 0;                 // for "decide"
};

struct TimelineSample {
  absl::Time time;
  int idle_nodes = 0;
  int used_nodes = 0;
  int running_jobs = 0;
  int waiting_jobs = 0;
};

struct Summary {
  std::string policy;
  double samples_trained = 0;
  double idle_node_hours = 0;   // offered by the trace during the replay
  double used_node_hours = 0;   // held by jobs
  // Samples trained over the samples the same node-time would have trained
  // at the same node counts without resize and preemption losses (our
  // reading of BFTrainer's "efficiency compared with dedicated nodes";
  // docs/simulator.md).
  double efficiency = 0;
  double utilisation = 0;       // used / idle node-hours
  // Samples the resize pauses cost (Accounting: old rate x pause, or the
  // rate at the new size x pause), split by cause: the policy's resizes and
  // the reclaims (forced shrinks and preemptions).
  double lost_to_resizes = 0, lost_to_reclaims = 0;
  // What SimOptions::preemption charged: the mode and its per-stop costs in
  // words (e.g. "park (park 3.0 s, unpark 1.25 s)"), and the samples lost to
  // stops (parks and unparks, progress since the last snapshot or all of
  // it) and to snapshot copies. A stop is a preemption or a policy stop.
  std::string preemption_cost;
  double lost_to_preemptions = 0, lost_to_snapshots = 0;
  int stops = 0;  // policy-decided stops of a running job
  int jobs_submitted = 0, jobs_finished = 0;
  int resizes = 0, preemptions = 0, reclaims = 0;
  int decisions = 0;
  // Decisions the policy's own method could not answer, another did
  // (alloc::PolicyResult::fell_back: the DP beyond its multi-pool limits,
  // answered by the MILP; the MILP's fallbacks), and the first one's reason.
  // Each replay with some says so in `warnings`.
  int decisions_fell_back = 0;
  std::string first_fallback_reason;
  double decision_p50_ms = 0, decision_p99_ms = 0, decision_max_ms = 0;
  double wall_s = 0;            // time the replay took
  // Job completion time (JCT) = finish - arrival, over the jobs that
  // finished, where arrival is the (aligned) submit time, or the replay
  // start for a job submitted before it. NaN when no job finished.
  double jct_mean_s = std::numeric_limits<double>::quiet_NaN();
  double jct_median_s = std::numeric_limits<double>::quiet_NaN();
  double jct_p95_s = std::numeric_limits<double>::quiet_NaN();  // nearest rank
  double jct_max_s = std::numeric_limits<double>::quiet_NaN();
  // Last finish - first arrival; NaN unless every job of the mix finished
  // within the replay (otherwise it would only say when the replay ended).
  double makespan_s = std::numeric_limits<double>::quiet_NaN();
  // Samples trained per node-hour held (NaN if none was held).
  double samples_per_node_hour = std::numeric_limits<double>::quiet_NaN();
  // While jobs were present (some job submitted and unfinished): how long,
  // the idle node-hours offered then, the share of them jobs held, and the
  // share of that time when the jobs present could have used more nodes than
  // were idle (sum of their max_nodes > idle nodes): the time the policies
  // actually competed for nodes.
  double active_hours = 0;
  double active_idle_node_hours = 0;
  double active_utilisation = std::numeric_limits<double>::quiet_NaN();
  double contended_fraction = std::numeric_limits<double>::quiet_NaN();
  // Results that cannot be right or say little, in words (e.g. "idle
  // node-hours exceed the machine x the replay", "the policies hardly
  // competed"). Empty when nothing is suspicious.
  std::vector<std::string> warnings;
};

struct SimResult {
  Summary summary;
  std::vector<JobOutcome> jobs;        // in mix order
  std::vector<EventRecord> events;     // empty unless record_events
  std::vector<TimelineSample> timeline;
};

// InvalidArgument for bad options (naming the field) or an empty trace;
// errors of the policy are returned as they are.
absl::StatusOr<SimResult> Simulate(const IdleTrace& trace, const std::vector<MixJob>& jobs,
                                   const SimOptions& options);

// CSV writers (header line + one row per record; times as Unix seconds).
// SummariesToCsv keeps its first columns (policy .. makespan_s) for existing
// readers; the later Summary fields are in the Python summary's records.
std::string EventsToCsv(const std::vector<EventRecord>& events);
std::string JobsToCsv(const std::vector<JobOutcome>& jobs);
std::string SummariesToCsv(const std::vector<Summary>& summaries);

// The four figures users feel, compared between two replays of the same jobs:
// samples per node-hour held and efficiency (higher is better), mean and p95
// JCT (lower is better). WorseUserFigures names those where `ours` is worse
// than `base`, in that order ("samples/nh", "JCT mean", "JCT p95", "eff"); a
// NaN of ours (e.g. no job finished) is worse unless base's is NaN too.
// DominatedOnUserFigures: `base` is at least as good on all four and better
// on at least one. No policy can be at least as good as every baseline on
// all four in general (EngineTest.NoScheduleBeatsStaticAndEqualShareAtOnce),
// so "not dominated by any baseline" is the target that can be asked of one.
std::vector<std::string> WorseUserFigures(const Summary& ours, const Summary& base);
bool DominatedOnUserFigures(const Summary& ours, const Summary& base);

}  // namespace malle::sim

#endif  // MALLE_SIM_ENGINE_H_
