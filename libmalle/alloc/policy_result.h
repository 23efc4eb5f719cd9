// What every allocation policy returns at the count level.
//
// Thread-safety: plain struct.
#ifndef MALLE_ALLOC_POLICY_RESULT_H_
#define MALLE_ALLOC_POLICY_RESULT_H_

#include <string>

#include "absl/time/time.h"
#include "libmalle/alloc/count_model.h"

namespace malle::alloc {

struct PolicyResult {
  CountSolution solution;
  // Why this answer: the policy, what it found, and anything unusual (a
  // time limit hit, a fallback taken and its cause).
  std::string reason;
  bool optimal = false;        // proven optimal for the count model
  bool fell_back = false;      // the policy's own method failed; another answered
  // Whose answer `solution` is: "milp", "dp" (also as the MILP's
  // fallback), "greedy", "equal_share", "static", or "current allocation"
  // (when the MILP's search failed it returns its start, the best of the
  // current allocation and those answers, named here). With fell_back it
  // tells which fallback answered, without reading `reason`.
  std::string answered_by;
  absl::Duration solve_time = absl::ZeroDuration();
  // Solver detail (MILP only; zero elsewhere).
  int rows = 0;
  int columns = 0;
  long long branch_nodes = 0;
  double best_bound = 0.0;  // upper bound on the objective proven by the solver
};

}  // namespace malle::alloc

#endif  // MALLE_ALLOC_POLICY_RESULT_H_
