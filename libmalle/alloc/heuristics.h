// Baseline allocation policies: fast, not optimal, useful for comparison.
//
//   Greedy marginal gain (Optimus-style): start every job at zero; while
//     nodes are left, give the next node(s) to the job whose value grows the
//     most per node (a stopped job is offered its min_nodes at once).
//   Equal share (BFTrainer's heuristic baseline): admit jobs in order while
//     their min_nodes fit, then deal the remaining nodes one at a time,
//     round robin, to jobs below max_nodes.
//   Static (no elasticity): a job runs at exactly its requested max_nodes or
//     not at all. A job holding exactly max_nodes keeps its nodes; any other
//     job (one that lost nodes) stops; stopped jobs start, in order, at
//     max_nodes when that many nodes are free.
//
// They choose total counts per job using the job's widest pattern; nodes are
// then drawn from pools by PlaceCounts, so they are class-aware only through
// placement.
//
// Thread-safety: pure; thread-safe.
#ifndef MALLE_ALLOC_HEURISTICS_H_
#define MALLE_ALLOC_HEURISTICS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/policy_result.h"

namespace malle::alloc {

absl::StatusOr<PolicyResult> SolveGreedy(const CountModel& model);
absl::StatusOr<PolicyResult> SolveEqualShare(const CountModel& model);
absl::StatusOr<PolicyResult> SolveStatic(const CountModel& model);

// Turns total counts per job into a feasible CountSolution: jobs keep or
// release their own nodes first (releasing from the shortest-horizon,
// slowest pools), then growing jobs take free nodes, preferring their own
// locality group, fast pools and long horizons. A job whose count cannot be
// placed gets the largest count that can. Picks each job's best option for
// the resulting vector.
CountSolution PlaceCounts(const CountModel& model, absl::Span<const int> totals);

}  // namespace malle::alloc

#endif  // MALLE_ALLOC_HEURISTICS_H_
