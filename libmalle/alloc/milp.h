// The allocation MILP, solved with COIN-OR CBC.
//
// By default (`decomposition`, one pool or several): branch-and-price on
// the decomposition by job (internal/decomposition.h): pool prices from
// column generation on a J + P row master, a Lagrangian bound, branching on
// the jobs the LP splits between options, min-cost-flow rounding for
// incumbents. Otherwise CBC on the count formulation.
//
// Count/class formulation (docs/allocator.md): by default one binary per
// piece (a run of options on one line) of each job, else per (job, option),
// with exactly one chosen per job; integer per-(job, pool) counts linked to
// the chosen option by rows whose coefficients are node counts (no big-M,
// no SOS in the model; CBC may branch on the choice rows as SOS1 sets); one
// capacity row per pool. With a single pool it is the
// multiple-choice knapsack and has no count variables at all.
//
// Robustness: CBC (or the decomposition, which uses Clp and CBC's
// libraries) runs in a forked child by default (SolveIsolation::kFork):
// a crash or a hang of the solver cannot take the allocator down. Whatever
// goes wrong (crash, hard deadline, time limit without incumbent, an
// infeasible or unbounded status, an answer that fails CheckSolution) the
// answer comes from SolveDp instead and `reason` says why (fell_back = true).
// A time limit reached with an incumbent returns the incumbent (optimal =
// false) with its proven bound. Only one CBC solve runs at a time in a
// process; concurrent callers wait.
//
//   MilpOptions opts;
//   opts.time_limit = absl::Milliseconds(500);
//   MALLE_ASSIGN_OR_RETURN(PolicyResult r, SolveMilp(model, opts));
//
// Thread-safety: thread-safe (serialised internally). Blocks for at most
// about time_limit + kill_grace.
#ifndef MALLE_ALLOC_MILP_H_
#define MALLE_ALLOC_MILP_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/dp.h"
#include "libmalle/alloc/policy_result.h"

namespace malle::alloc {

enum class SolveIsolation {
  kFork,       // solve in a forked child; crash- and hang-proof
  kInProcess,  // solve in this thread; cheaper, trusts CBC
};

// Test hooks: make the solver misbehave on purpose (only honoured with
// kFork, where the misbehaviour is contained).
enum class MilpFault { kNone, kCrash, kHang, kGarbage };

struct MilpOptions {
  // Elapsed (wall) time for the whole SolveMilp call from `started`: the
  // DP's start (dp_start), the heuristics' starts, building the formulation,
  // forking and the solver. The solver gets what is left, at least 1 ms (in
  // which it answers with its start); the reason says when that was less
  // than 90 % of the limit. Past the limit only the answer's hand-over
  // remains (the search checks the deadline between LP solves) and the
  // DP's turn where it has one: the check of an unproven answer on one
  // pool, or the fallback of a failed solve.
  absl::Duration time_limit = absl::Seconds(1);
  // When the time limit began; InfinitePast: when SolveMilp was called (a
  // time still to come counts as that too: the solver never gets more).
  // Decide passes the decision's start, so that compiling the problem counts.
  absl::Time started = absl::InfinitePast();
  // With kFork, the child is killed (SIGKILL, by pid) kill_grace after the
  // solver's share of time_limit.
  absl::Duration kill_grace = absl::Milliseconds(500);
  double relative_gap = 1e-9;  // stop when (bound - incumbent) / |incumbent| is below
  SolveIsolation isolation = SolveIsolation::kFork;
  bool use_mip_start = true;   // give CBC the current allocation as the first incumbent
  // With use_mip_start: solve the model with the DP first and give CBC the
  // DP's answer as the first incumbent instead (where the DP answers: always
  // with one pool; with several, within `fallback`'s limits, else the
  // current allocation is the start). The answer is then never worse than
  // the DP's and a time limit only cuts the proof short; on a single pool
  // (where the DP is exact) CBC can only confirm it. The DP's time counts
  // against time_limit. Off by default: the MILP stays an independent check.
  bool dp_start = false;
  // With use_mip_start: also try the baselines' answers (greedy, equal share,
  // static; milliseconds) and start CBC from the best of them, the current
  // allocation and the DP's (dp_start). The answer is then never worse than
  // any of them; if CBC's were worse, or CBC fails and the DP cannot answer
  // (a multi-pool model beyond its limits), the start is the answer
  // (fell_back, with the reason).
  bool heuristic_start = true;
  // Merge each job's options whose values lie on a line into pieces (one
  // binary per piece, one integer count inside it; with several pools an
  // integer per job and pool besides; milp.cc has the formulation). False:
  // one binary per option.
  bool segments = true;
  // With segments and several pools: how a job's count meets the pools.
  //   kUnionRows: no per-pool variables. One row per union T of
  //     the pools that growing pieces may draw from: what jobs grow into T
  //     must fit in T's free nodes plus what shrinking and stopping jobs
  //     release in T (the transportation problem's cut condition, exact:
  //     milp.cc). The per-pool split is placed afterwards by a flow
  //     (PlaceOptions). Used when there are at most max_union_rows unions
  //     and at most 64 pools, else kPerPoolCounts.
  //   kPerPoolCounts (default): an integer per (job, pool), linked to the
  //     chosen piece by the rules of count_model.h.
  // Both are exact (milp_test checks them against an exhaustive search);
  // both are slower than the decomposition at 4,734 nodes x 100 jobs x 12
  // pools (docs/benchmarks.md, issue 27). Used with decomposition = false.
  enum class Pools { kUnionRows, kPerPoolCounts };
  Pools pools = Pools::kPerPoolCounts;
  int max_union_rows = 1024;
  // With segments and use_mip_start: solve by pricing (milp.cc,
  // SolveByPricing): column generation for the LP bound, CBC on the
  // generated pieces, then on the pieces that reduced-cost fixing cannot
  // rule out. Exact; CBC sees a fraction of the columns. False: CBC on the
  // whole model. Off by default: under load its stages overran the time
  // limit (the child is then killed and the start answers) more often than
  // CBC on the whole model did (docs/benchmarks.md).
  bool pricing = false;
  // With segments and use_mip_start: solve by decomposition
  // (internal/decomposition.h): column generation over the jobs with the
  // pools priced, whose Lagrangian bound proves most answers without any
  // branching, then branch-and-price, no CBC. Exact: the answer is proven
  // within relative_gap or the time limit is reached. False: CBC on the
  // whole count formulation (`pools`, `pricing`). Several pools since
  // issue 27's third try; one pool too since it was measured faster there
  // (4,734 nodes x 1,000 jobs: p99 89 against 815 ms; docs/benchmarks.md).
  bool decomposition = true;
  // With decomposition: after the root and after every better incumbent,
  // a local search over the jobs' modes (stop, stay, grow or shrink in a
  // pattern; each switch re-balanced by a min-cost flow), each run for at
  // most decomposition_local_search_share of the time left. It finds
  // incumbents the roundings miss, which the search then needs to prune
  // (docs/allocator.md); never changes exactness.
  bool decomposition_local_search = true;
  double decomposition_local_search_share = 0.3;
  // With decomposition: jobs the model cannot tell apart (same options,
  // values and held nodes) are searched in one order only, a branch on one
  // job's count bounding its twins' too; never changes exactness.
  bool decomposition_twins = true;
  // With decomposition: rounds of MIR cuts on the pools' capacities at the
  // root (internal::PoolCut; 0: none). Never changes exactness.
  int decomposition_cut_rounds = 40;
  DpOptions fallback;          // options for the DP fallback
  MilpFault fault = MilpFault::kNone;
};

// Never returns an error for solver trouble (it falls back); InvalidArgument
// for a decomposition_local_search_share outside [0, 1]; returns an
// error only if the fallback fails too and there is no start to answer with
// (use_mip_start = false and ResourceExhausted from a multi-pool DP; then
// the caller may use a heuristic).
absl::StatusOr<PolicyResult> SolveMilp(const CountModel& model, const MilpOptions& options = {});

}  // namespace malle::alloc

#endif  // MALLE_ALLOC_MILP_H_
