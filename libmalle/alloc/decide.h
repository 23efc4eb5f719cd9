// One entry point for every allocation policy.
//
//   DecideOptions opts;
//   opts.policy = PolicyKind::kMilp;
//   MALLE_ASSIGN_OR_RETURN(Decision d, Decide(problem, opts));
//   for (const JobAllocation& j : d.allocation.jobs) ...
//
// Decide validates and compiles the problem, runs the policy, checks its
// answer and realises it into node ids. It is a pure function of (problem,
// options) apart from the MILP's wall-clock limit.
//
// Thread-safety: thread-safe (MILP solves are serialised, see milp.h).
#ifndef MALLE_ALLOC_DECIDE_H_
#define MALLE_ALLOC_DECIDE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/dp.h"
#include "libmalle/alloc/milp.h"
#include "libmalle/alloc/policy_result.h"
#include "libmalle/alloc/problem.h"
#include "libmalle/alloc/realize.h"

namespace malle::alloc {

enum class PolicyKind { kMilp, kDp, kGreedy, kEqualShare, kStatic };

absl::string_view PolicyName(PolicyKind kind);  // "milp", "dp", "greedy", "equal_share", "static"
// InvalidArgument listing the valid names for anything else.
absl::StatusOr<PolicyKind> ParsePolicyName(absl::string_view name);

// The DP policy's limits: DpOptions' own, but with several pools it takes on
// at most 1e7 steps (states x per-pool vectors, about 30 ms) and hands larger
// problems to the MILP, which answers them in milliseconds. DpOptions' 3e8
// (about a second) stays for the DP as the MILP's fallback, the last exact
// answer there. Summit with idle-window pools (one class): the DP policy's
// replay 17.5 s against 100.3 s, decision p99 18 ms against 349 ms, the same
// figures (docs/benchmarks.md, "The DP policy's work limit").
DpOptions DpPolicyOptions();

struct DecideOptions {
  PolicyKind policy = PolicyKind::kMilp;
  CountModelOptions model;
  // milp.time_limit bounds the whole decision, not only the solve: Decide
  // sets milp.started to `started`, so that the time compiling the problem
  // took (for the DP policy, also the DP's try before it hands the problem
  // to the MILP) counts with the MILP's own starts and setup
  // (MilpOptions::time_limit). The solver gets what is left, down to 1 ms,
  // in which it answers with its start (the best of the current allocation
  // and the heuristics'). The reason says when the solver had less than 90 %.
  MilpOptions milp;
  DpOptions dp = DpPolicyOptions();
  // When the decision began (e.g. when its problem was built);
  // InfinitePast: when Decide was called.
  absl::Time started = absl::InfinitePast();
};

struct Decision {
  PolicyKind policy = PolicyKind::kMilp;
  Allocation allocation;
  double objective = 0.0;         // of the realised allocation, in the count model
  double current_objective = 0.0; // what keeping the current allocation would be worth
  PolicyResult result;            // counts, reason, solver detail
};

// InvalidArgument for a bad problem (naming the field); otherwise the
// policy's answer. The DP policy on a multi-pool problem beyond its limits
// (DpOptions) is answered by the MILP; a problem too large for the DP that
// the MILP falls back to goes further, to the MILP's start (the best of the
// current allocation and the heuristics' answers) or else to the greedy
// heuristic. Either way result.fell_back is set, result.answered_by names
// whose answer it is and result.reason says why.
absl::StatusOr<Decision> Decide(const Problem& problem, const DecideOptions& options = {});

}  // namespace malle::alloc

#endif  // MALLE_ALLOC_DECIDE_H_
