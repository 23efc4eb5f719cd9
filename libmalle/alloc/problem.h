// The allocation problem: which idle nodes each elastic job should hold.
//
// Plain data, no solver. A Problem is what the allocator knows at one event:
// the idle nodes (grouped in classes), the jobs with their throughput curves
// and current nodes, and the objective. Every policy (decide.h) is a pure
// function of a Problem and its options.
//
//   Problem p;
//   p.forward_window = absl::Minutes(2);
//   for (int i = 0; i < 8; ++i) p.nodes.push_back(Node{absl::StrCat("n", i)});
//   JobSpec job;
//   job.id = "resnet";
//   job.min_nodes = 1;
//   job.max_nodes = 8;
//   job.throughput = {{1, 100.0}, {8, 700.0}};
//   p.jobs.push_back(job);
//   MALLE_RETURN_IF_ERROR(ValidateProblem(p));
//
// Thread-safety: plain structs; functions here are pure and thread-safe.
#ifndef MALLE_ALLOC_PROBLEM_H_
#define MALLE_ALLOC_PROBLEM_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace malle::alloc {

// One point of a throughput curve: `samples_per_s` when the job runs on
// `nodes` nodes of speed 1.0. Between breakpoints throughput is interpolated
// linearly.
struct Breakpoint {
  int nodes = 0;
  double samples_per_s = 0.0;
};

// A throughput curve: breakpoints with strictly increasing `nodes` (>= 0) and
// finite, non-negative throughput. It must cover the job's [min, max] range.
using Curve = std::vector<Breakpoint>;

// Piecewise-linear interpolation of `curve` at `nodes`. Requires a validated
// curve whose range contains `nodes`; returns 0 outside the range.
double Interpolate(absl::Span<const Breakpoint> curve, int nodes);

// An alternative global batch size for a job (Pollux/Sia-style): the same job
// trained with another batch size has another throughput curve. Switching
// between options costs a resize pause (the job restarts its step loop).
struct BatchOption {
  std::string name;  // e.g. "bs1024"
  Curve throughput;
};

struct JobSpec {
  std::string id;  // unique, 1..128 chars
  int min_nodes = 1;
  int max_nodes = 1;
  // Throughput at each node count. With batch options, leave empty and give
  // one curve per option instead.
  Curve throughput;
  std::vector<BatchOption> batch_options;
  int current_batch_option = 0;  // index into batch_options (if any)
  // Pause (no training) when the job grows / shrinks; a start from zero
  // nodes counts as a grow.
  absl::Duration resize_up_pause = absl::ZeroDuration();
  absl::Duration resize_down_pause = absl::ZeroDuration();
  double weight = 1.0;  // used by Objective::kWeighted, kSpeedup and kCompletion
  // Samples the job still has to train (finite, >= 0; 0 = unknown). Needed by
  // Objective::kCompletion, which values work as a share of it.
  double remaining_samples = 0.0;
  // Subtracted from the objective when a job that holds nodes now is stopped
  // (given 0 nodes). A live elastic job keeps its training state only in its
  // ranks' memory, so the allocator service makes stopping it worse than any
  // gain elsewhere; stopping stays possible (and is then the least bad
  // choice) when the nodes left cannot hold every running job. Finite, >= 0.
  double stop_penalty = 0.0;
  // How long the job has been in the system (since it was submitted), for
  // Problem::rank_aging. Finite, >= 0.
  absl::Duration age = absl::ZeroDuration();
  // Ids of the nodes the job holds now (each must be one of Problem::nodes).
  std::vector<std::string> current_nodes;
};

// A class of interchangeable nodes: same locality group (rack, switch, cell),
// same performance class. PAL-style: a synchronous data-parallel job runs at
// the pace of its slowest node, so a job's throughput is scaled by the
// smallest `speed` among its nodes.
struct NodeClass {
  std::string id;
  std::string locality;  // jobs spanning several groups pay Problem::cross_locality_factor
  double speed = 1.0;    // > 0
};

struct Node {
  std::string id;
  std::string class_id;  // empty: the only class (or "default")
  // How long the node is expected to stay idle (the main scheduler's
  // backfill forecast). Infinite when unknown.
  absl::Duration expected_idle = absl::InfiniteDuration();
};

enum class Objective {
  kThroughput,  // total samples/s, BFTrainer's default
  kSpeedup,     // each job's throughput over its per-node throughput at min size, times weight
  kWeighted,    // weight * samples/s
  // The value of finishing: each job's work over the window as a share of the
  // work it has left (capped at all of it, but not for staying as it is: see
  // rank_weight_exponent), times weight. A node goes where it
  // brings jobs closest to done, shortest remaining work first when curves
  // are alike (SRPT for malleable jobs): what lowers mean completion time,
  // where kThroughput only counts samples. Needs remaining_samples > 0.
  kCompletion,
};

// How the cost of a resize is charged over the forward window.
enum class ResizeCostModel {
  // The job trains nothing during the pause: work = rate(new) * (H - pause).
  kLostWork,
  // BFTrainer's published model: work = rate(new) * H - rate(current) * pause.
  // Linear in a per-node MILP because rate(current) is a constant.
  kBftrainer,
};

struct Problem {
  std::vector<NodeClass> classes;  // empty: one class "default" of speed 1
  std::vector<Node> nodes;         // every idle node, free or held by a job
  std::vector<JobSpec> jobs;
  // Look-ahead of the objective (BFTrainer's T_fwd). A node's value is
  // bounded by min(forward_window, expected_idle).
  absl::Duration forward_window = absl::Minutes(2);
  Objective objective = Objective::kThroughput;
  ResizeCostModel resize_cost = ResizeCostModel::kLostWork;
  // Throughput factor for a job whose nodes span several locality groups
  // (1.0 = locality does not matter).
  double cross_locality_factor = 1.0;
  // Reclaims per idle node-second that the main scheduler makes (the
  // machine's history gives it: reclaims of idle nodes / idle node-seconds),
  // for nodes without their own forecast. A job on n such nodes expects
  // 1 - exp(-rate * n * H) chance of a forced shrink within the window, which
  // costs it its rate x its down pause (what the simulator charges); each
  // running option's value pays that expected cost. 0 (the default): not
  // counted. Finite, >= 0.
  double reclaim_rate = 0.0;
  // Hysteresis: the objective charges every resize (grow, shrink, start,
  // batch change) this many times its pause, so that a change must pay off
  // by a margin before it is made (1 = the pause as it is). Finite, >= 1.
  double resize_hysteresis = 1.0;
  // The order of finishing (JCT-aware; 0 = off, the default). When > 0,
  // every job's objective scale is multiplied by rank^rank_weight_exponent,
  // where rank = 1 + the number of jobs of the problem with more work left.
  // Work left is counted in node-seconds at the job's own per-node rate at
  // min_nodes (remaining_samples * min_nodes / r(min_nodes), first batch
  // option), so that a fast model and a slow one compare by time, not
  // samples; equal amounts rank by problem order (the later job counts as
  // the larger, so that of identical jobs the older finishes first). The job
  // closest to done weighs most, the one furthest from it 1. With the
  // speedup objective this is a shortest-remaining-first order that keeps
  // efficiency: a node still goes to whichever job turns it into the most
  // weighted speedup, so short jobs grow only while their speedup holds up
  // (the trade-off heSRPT solves: Berg, Vesilo, Harchol-Balter, "heSRPT:
  // Optimal Parallel Scheduling of Jobs With Known Sizes", arXiv:1903.09346).
  // The work a job is credited with over the window is capped at its
  // remaining samples (finishing it is all it can be worth), except when it
  // stays as it is: then it frees its nodes as it finishes, and the decision
  // its finish triggers gives them on, so staying is credited the whole
  // window (capped, a job with a second left would lose its nodes). Needs
  // remaining_samples > 0 and a positive rate at min_nodes for every job.
  // Finite, >= 0.
  double rank_weight_exponent = 0.0;
  // Aging for rank weights (infinite, the default: off). When finite, a
  // job's work left counts as work / (1 + age / rank_aging) in the ranking
  // (JobSpec::age), so a job that has been in the system for rank_aging
  // ranks as if half its work were left, and of two jobs with nearly the
  // same work the older ranks first. Shortest-remaining-first alone lets
  // copies of one long job overtake each other as their progress changes
  // and finish them all late (docs/benchmarks.md, "Aging"); aging bounds how
  // long any job can be ranked last. Needs rank_weight_exponent > 0. > 0.
  absl::Duration rank_aging = absl::InfiniteDuration();
};

// Why `rank_aging` cannot go with `rank_weight_exponent` ("must be > 0
// (infinite: off), got 0s", "is 1h, but rank weights are off ..."), or empty
// when it can: the check ValidateProblem, sim::SimOptions and the allocator
// service's options share, each naming the field its own way.
std::string RankAgingProblem(absl::Duration rank_aging, double rank_weight_exponent);

// Checks every field; the error (InvalidArgument) names the offending field
// with its index and id, e.g. `jobs[2] ("vgg").min_nodes = 5 > max_nodes = 3`.
absl::Status ValidateProblem(const Problem& problem);

// The work `samples` of `job` are, in node-seconds at its per-node rate at
// min_nodes (its first batch option's curve): what rank weights compare
// (Problem::rank_weight_exponent), so that a fast model and a slow one
// compare by time. Needs a positive rate at min_nodes (ValidateProblem
// checks it when rank weights are on).
double WorkLeftNodeSeconds(const JobSpec& job, double samples);

absl::string_view ObjectiveName(Objective objective);
// The objective named `name` (ObjectiveName's names); InvalidArgument
// "objective: unknown objective ..." listing them otherwise.
absl::StatusOr<Objective> ParseObjectiveName(absl::string_view name);
absl::string_view ResizeCostModelName(ResizeCostModel model);

}  // namespace malle::alloc

#endif  // MALLE_ALLOC_PROBLEM_H_
