// Decomposition of the multi-pool count model by job (Dantzig-Wolfe /
// Lagrangian relaxation of the pool capacities), for SolveMilp.
//
// The pools couple the jobs only through their capacities. Price each pool
// (pi_p >= 0) and the jobs fall apart: each picks, on its own, the option and
// per-pool split that maximise value - pi . split under the count model's
// rules (keep, release, pattern), which takes a sort of at most P prices per
// pattern. For any pi,
//   L(pi) = pi . capacity + sum_j max_(option, split) [value - pi . split]
// bounds every allocation from above (each job's chosen split is one of the
// splits it maximises over, and sum_j split_j <= capacity with pi >= 0).
// The best pi comes from column generation on the master LP (a convex
// combination of splits per job, the pool capacities): J + P rows however
// many nodes, warm re-solves. Its bound is that of the convex hull of each
// job's allocations, at least as tight as the count formulation's LP.
//
// Branch-and-price (SolveByDecomposition): the master LP's optimum has
// few jobs split between options (at most about one per binding pool row);
// an LP optimum whose every job uses one option is an allocation (placing
// the options is a flow problem, whose integral solutions the LP's
// fractional split implies). Otherwise one split job is branched on
// (stay / move; count <= t / > t; this pattern / another), columns the
// branch forbids are bounded to 0, and the children are re-priced from the
// parent's basis. Nodes whose bound is within the relative gap of the
// incumbent are pruned. Best-first, plunging into the child that holds
// the job's heaviest column, which also finds incumbents (and a rounding
// at every node); after the root and after every better incumbent, a
// local search over the jobs' modes (ImproveModes) finds better ones.
//
// Thread-safety: pure functions; the caller serialises COIN (milp.cc).
#ifndef MALLE_ALLOC_INTERNAL_DECOMPOSITION_H_
#define MALLE_ALLOC_INTERNAL_DECOMPOSITION_H_

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "libmalle/alloc/count_model.h"

namespace malle::alloc::internal {

// Per-job pricing under pool prices: each option's best score and split.
class JobPricer {
 public:
  explicit JobPricer(const CountModel& model);

  // score[o] = value(o) - min over o's splits of pi . split, for every option
  // of job j (-inf where the option has no split within the pools'
  // capacities). `pi` has one non-negative price per pool; `by_price`:
  // PoolsByPrice(pi), computed once for all the jobs priced at pi.
  void Scores(int j, absl::Span<const double> pi, absl::Span<const int> by_price,
              std::vector<double>& score) const;

  // Per pattern k, the best score among the options in `opts[k]` (a subset
  // of PatternOptions(j, k), in its order) and that option: (-inf, -1) where
  // opts[k] is empty or no option of it fits. The same scores as Scores, for
  // the options a search still allows (after reduced-cost fixing most of
  // them are out, and pricing only the rest is what makes a branch node
  // cheap). Not thread-safe (scratch space); Scores is.
  // `by_price`: PoolsByPrice(pi), computed once for all the jobs.
  // `scores` (optional, one entry per option of the job): receives the
  // score of every option walked.
  void BestByPattern(int j, absl::Span<const double> pi, absl::Span<const int> by_price,
                     const std::vector<std::vector<int>>& opts,
                     std::vector<std::pair<double, int>>& best, double* scores = nullptr) const;

  // A split of option o of job j of least cost under `pi` (one count per
  // pool); the cost is what Scores charged. `by_price`: PoolsByPrice(pi).
  std::vector<int> Split(int j, int o, absl::Span<const double> pi,
                         absl::Span<const int> by_price) const;

  // A pool's price and the nodes a job may take there (decomposition.cc).
  struct Slot {
    double price;
    int amount;
    int pool;
  };

  // Job j's options of pattern k, by increasing count.
  const std::vector<int>& PatternOptions(int j, int k) const { return by_pattern_[j][k]; }

  // The largest |value| of any option (FlowRound scales by it; computing it
  // took 94 % of a flow at 1,000 jobs).
  double largest_value() const { return largest_; }

 private:
  // Calls visit(o, score) for the options `opts` of pattern k of job j
  // (by increasing count).
  template <typename Visit>
  void Walk(int j, int k, absl::Span<const int> opts, absl::Span<const double> pi,
            absl::Span<const int> by_price, double held_cost, std::vector<Slot>& grow,
            std::vector<Slot>& shrink, const Visit& visit) const;

  const CountModel& model_;
  // by_pattern_[j][k]: job j's options of pattern k.
  std::vector<std::vector<std::vector<int>>> by_pattern_;
  double largest_ = 0.0;
  // member_[j][k][p]: pool p is in pattern k of job j.
  std::vector<std::vector<std::vector<char>>> member_;
  mutable std::vector<Slot> grow_scratch_, shrink_scratch_;
};

// Every pool, by increasing price (ties by index): the order in which a
// job's split takes pools.
std::vector<int> PoolsByPrice(absl::Span<const double> pi);

// How a job moves: stops, stays as it is, grows (or changes pattern at its
// count) or shrinks, inside one pattern.
enum class Direction { kStop, kStay, kUp, kDown };
struct Mode {
  int pattern = -1;
  Direction direction = Direction::kStop;
};
Direction OptionDirection(const JobModel& job, int o);

// The best counts when every job's mode is fixed: a min-cost flow of the
// jobs' counts into the pools, each job valued along the concave envelope
// of its mode's options (exact where the values are concave in the count,
// which they are but for the curves' own bumps). nullopt when the modes
// cannot all be met (a mode's smallest count does not fit).
// `pool_prices` (optional) receives each pool's price in the flow's optimum:
// the value one more node there would add (0 where nodes are left over).
std::optional<CountSolution> FlowRound(const CountModel& model, const JobPricer& pricer,
                                       const std::vector<Mode>& modes,
                                       std::vector<double>* pool_prices = nullptr);

class MinCostFlow;  // decomposition.cc

// FlowRound for many mode vectors in a row (the local search): each job's
// envelope per mode is built once, the network's memory is kept, and the
// objective comes without the per-pool split (Solution builds it).
// Not thread-safe.
class ModeFlow {
 public:
  ModeFlow(const CountModel& model, const JobPricer& pricer);
  ~ModeFlow();
  ModeFlow(const ModeFlow&) = delete;
  ModeFlow& operator=(const ModeFlow&) = delete;

  // The flow for `modes` (FlowRound's); false when they cannot all be met.
  // `prices`: also the pool prices (a shortest-path search more).
  bool Solve(const std::vector<Mode>& modes, bool prices = false);
  // After a successful Solve: the allocation's objective, its options, the
  // whole allocation, the pool prices (when asked for).
  double objective() const { return objective_; }
  const std::vector<int>& options() const { return option_; }
  CountSolution Solution() const;
  const std::vector<double>& pool_prices() const { return prices_; }

 private:
  struct Plan {
    Mode mode;
    std::vector<int> options;                      // by increasing count
    int base = 0;                                  // flow the smallest count needs
    std::vector<std::pair<int, double>> segments;  // (amount, slope) above the base
  };
  struct Arcs {
    int first, pools, end;  // source arcs [first, pools), pool arcs [pools, end), step 2
  };
  const Plan* PlanFor(int j, const Mode& mode);

  const CountModel& model_;
  const JobPricer& pricer_;
  double must_;
  std::vector<std::vector<Plan>> cache_;  // per job
  std::unique_ptr<MinCostFlow> flow_;
  std::vector<Mode> modes_;
  std::vector<const Plan*> plans_;
  std::vector<Arcs> arcs_;
  std::vector<long long> room_;
  std::vector<int> option_;
  std::vector<double> prices_;
  double objective_ = 0;
  bool solved_ = false;
};

// The mode of option o of job j (pattern -1 for the stop option).
Mode OptionMode(const JobModel& job, int o);

// A mode to try in ImproveModes, with an upper bound on every allocation
// that puts the job in it (+inf if none is known): a Lagrangian bound less
// the mode's shortfall from the job's best score at the same prices.
struct ModeCandidate {
  Mode mode;
  double bound = std::numeric_limits<double>::infinity();
};

// Local search over modes: from `start` (feasible), switch one job at a
// time (in `order`; empty: by index) to another of its `candidates` (tried
// in their order, which must be by decreasing bound; empty: every mode of
// the job, unbounded) and let FlowRound set every count; a switch is kept
// when the allocation gains more than 1e-9 relative. A candidate whose
// bound is not above the best allocation so far is not tried (nor are the
// job's later ones): no allocation with the job in that mode is better.
// Passes over the jobs until one gains nothing or `deadline`. Never returns
// worse than `start`; every allocation it returns passes CheckSolution.
// `flows` (optional) counts the FlowRounds.
// Why: the roundings fix every job's mode from one LP optimum; where the LP
// mixes a job's staying with its growing, or two patterns, the rounding's
// choice is often not the best one, and one switch (with the counts the
// flow re-balances) gains what the search would otherwise have to find
// node by node (docs/allocator.md).
CountSolution ImproveModes(const CountModel& model, const JobPricer& pricer,
                           const CountSolution& start,
                           const std::vector<std::vector<ModeCandidate>>& candidates,
                           absl::Span<const int> order, absl::Time deadline, int* flows = nullptr);

// L(pi) (see above); `best` (optional) receives each job's best score.
double LagrangianBound(const CountModel& model, const JobPricer& pricer,
                       absl::Span<const double> pi, std::vector<double>* best = nullptr);

struct DecompositionSettings {
  absl::Time deadline = absl::InfiniteFuture();
  double relative_gap = 1e-4;
  // After the root and after every better incumbent: ImproveModes over
  // the modes the root's reduced costs leave, each run for at most this
  // share of the time left.
  bool local_search = true;
  double local_search_share = 0.3;
  // Jobs the model cannot tell apart are searched in one order only (a
  // branch on one's count bounds its twins': decomposition.cc).
  bool twins = true;
};

struct DecompositionResult {
  CountSolution solution;  // checked (CheckSolution) before it is returned
  double bound = 0.0;      // proven upper bound on the model's optimum
  bool proven = false;     // bound - objective <= relative_gap * |objective|
  long long branch_nodes = 0;
  int master_rows = 0, master_columns = 0;  // the master LP's size at the end
  std::string detail;      // rounds, columns, nodes, where the proof came from
};

// Starts from `start` (a feasible allocation: the best heuristic's, say),
// never returns worse. Errors: Internal when Clp fails; DeadlineExceeded
// never (at the deadline the best allocation so far is returned, unproven).
absl::StatusOr<DecompositionResult> SolveByDecomposition(const CountModel& model,
                                                         const CountSolution& start,
                                                         const DecompositionSettings& settings);

}  // namespace malle::alloc::internal

#endif  // MALLE_ALLOC_INTERNAL_DECOMPOSITION_H_
