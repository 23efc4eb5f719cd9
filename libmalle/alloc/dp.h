// Exact dynamic programming over node counts (multiple-choice knapsack,
// after Saxena et al.'s allocation of GPUs to elastic jobs).
//
// Single pool: jobs in order, state = nodes left; each job picks one option.
// O(jobs * nodes * max_nodes) time, O(jobs * nodes) memory. Exact, so it is
// the oracle the MILP is tested against and the MILP's fallback.
// Several pools: state = nodes left in every pool (mixed radix), each job
// enumerates its per-pool vectors; exact but exponential in the number of
// pools, refused (ResourceExhausted) above DpOptions::max_states or when
// states x per-pool vectors exceeds DpOptions::max_work.
//
//   MALLE_ASSIGN_OR_RETURN(PolicyResult r, SolveDp(model, {}));
//
// Thread-safety: pure; thread-safe.
#ifndef MALLE_ALLOC_DP_H_
#define MALLE_ALLOC_DP_H_

#include "absl/status/statusor.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/policy_result.h"

namespace malle::alloc {

struct DpOptions {
  // Multi-pool only: largest product of (capacity + 1) over pools, and
  // largest number of per-pool vectors per job, that the DP will enumerate.
  long long max_states = 2'000'000;
  long long max_vectors_per_job = 200'000;
  // Multi-pool only: largest states x (per-pool vectors enumerated, over all
  // jobs), the DP's steps. Within the two limits above a decision could
  // take minutes (9 pools of Summit's 4,734 nodes by idle-window bucket,
  // hundreds of jobs: a simulated replay with forecasts did not finish 3
  // hours of the trace in 5 minutes); 3e8 steps is about a second.
  long long max_work = 300'000'000;
};

// Returns an optimal solution (optimal = true). ResourceExhausted when a
// multi-pool model exceeds the limits in `options`.
absl::StatusOr<PolicyResult> SolveDp(const CountModel& model, const DpOptions& options = {});

}  // namespace malle::alloc

#endif  // MALLE_ALLOC_DP_H_
