// BFTrainer's per-node MILP, rebuilt here as a benchmark reference only.
//
// Defines SolveBftrainerPerNode: the allocation problem written the way the
// BFTrainer paper writes it (one binary per (job, node), SOS2 throughput
// interpolation, big-M resize indicators), built as an internal::MipModel
// and solved with the same CBC entry point and settings as our count MILP,
// so that alloc_bench compares formulations, not solvers. It is not part of
// libmalle and nothing outside tests/bench uses it.
//
// Scope: one node class, no idle-window forecasts (every node's expected
// idle time at least the forward window), Objective::kThroughput with
// ResizeCostModel::kBftrainer, no batch options. Anything else is
// InvalidArgument.
//
//   PerNodeOptions opts;
//   opts.time_limit = absl::Seconds(60);
//   MALLE_ASSIGN_OR_RETURN(PerNodeResult r, SolveBftrainerPerNode(problem, opts));
//   if (r.status == MipResult::Status::kOptimal) use(r.objective);
//
// Thread-safety: pure apart from CBC, which is not known to be reentrant:
// callers must not run it concurrently with another CBC solve. With
// `isolate` it forks: call it from a single-threaded program (the benchmark).
#ifndef MALLE_TESTS_BENCH_BFTRAINER_PERNODE_H_
#define MALLE_TESTS_BENCH_BFTRAINER_PERNODE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libmalle/alloc/internal/cbc_solver.h"
#include "libmalle/alloc/problem.h"

namespace malle::bench {

struct PerNodeOptions {
  absl::Duration time_limit = absl::Seconds(60);
  double relative_gap = 1e-9;  // same as MilpOptions' default
  bool use_start = true;       // the current allocation as the first incumbent
  // Solve in a forked child, like SolveMilp's default kFork: Debian's CBC
  // 2.10.8 segfaults in CbcBranchDynamicDecision::betterBranch on some of
  // these SOS2 models (coin-or/Cbc PR #504, "Fix SOS2 branching", is not in
  // 2.10.8). A crash then comes back as status kOther with detail "crashed".
  bool isolate = true;
};

struct PerNodeResult {
  alloc::internal::MipResult::Status status = alloc::internal::MipResult::Status::kOther;
  std::string detail;          // CBC's own words
  double objective = 0.0;      // CBC's objective (samples over the window)
  double best_bound = 0.0;
  // The objective recomputed from the solution's node counts with
  // alloc::Interpolate, independent of the SOS2 machinery (NaN without a
  // solution). A gap between the two means the formulation is wrong.
  double evaluated_objective = 0.0;
  std::vector<int> nodes_per_job;  // empty without a solution
  absl::Duration build_time = absl::ZeroDuration();
  absl::Duration solve_time = absl::ZeroDuration();
  long long branch_nodes = 0;
  int rows = 0;
  int columns = 0;
  int sos2_sets = 0;
};

// Builds and solves the per-node model of `problem`. Blocks for at most about
// options.time_limit. InvalidArgument for a problem outside the scope above
// or one that fails alloc::ValidateProblem; errors of SolveWithCbc otherwise.
// Solver outcomes (time limit, infeasible) are in PerNodeResult::status.
absl::StatusOr<PerNodeResult> SolveBftrainerPerNode(const alloc::Problem& problem,
                                                    const PerNodeOptions& options = {});

}  // namespace malle::bench

#endif  // MALLE_TESTS_BENCH_BFTRAINER_PERNODE_H_
