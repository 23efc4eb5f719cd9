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
// local search over the jobs' modes (ImproveModes) finds better ones. At
// the root, rounds of MIR cuts on the pools' capacities (PoolCut) tighten
// the master's LP where it grows jobs by a fraction of their step.
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

// What the master's cut rows (PoolCut) add to one job's pricing, on top of
// the pools' prices: a price per pool on the nodes it keeps (held nodes it
// keeps when it stays, grows or shrinks), a constant on every option (the
// stop option too), and per pattern of the job: a price per pool on the
// nodes it adds and a bonus on the options that add nodes (count above its
// current), and terms mu F((count - current) / delta) charged to those
// options (`inside`, PoolCut); and terms mu F((low + shift) / delta)
// charged to every option, the stop option too, with `low` the least the
// option adds less releases in S (`net`: a cut in which the job's option
// alone sets its coefficient, PoolCut::counted; CountedLow). Empty vectors:
// none.
// Where a counted job (PoolCut::counted) stands against a pool set S:
// what CountedLow needs.
struct CountedShape {
  int held = 0;  // its held nodes in S
  // Per pattern: the nodes it could add in the pattern's pools outside S
  // (-1: no pool outside S); empty: every pattern inside S.
  std::vector<int> room_out;
  // Per pattern: its held nodes in the pattern's pools outside S; empty: 0.
  std::vector<int> held_out;
};

struct JobCutTerms {
  struct Inside {
    double mu, delta, fraction;
  };
  struct Net {
    double mu, delta, fraction;
    int shift;
    // The cut's (PoolCut::Counted::shape): shared, not copied per pricing
    // round.
    std::shared_ptr<const CountedShape> shape;
  };
  std::vector<double> keep;  // per pool
  double constant = 0.0;
  std::vector<std::vector<double>> add;     // per pattern (empty: 0), per pool
  std::vector<double> grow_bonus;           // per pattern
  std::vector<std::vector<Inside>> inside;  // per pattern
  std::vector<Net> net;
};

// Per-job pricing under pool prices: each option's best score and split.
// `terms` (optional, every method): the cut rows' share of the prices; the
// score of (option, split) is then value - pi . split - the duals times its
// coefficients in the cuts (PoolCut::Coefficient).
class JobPricer {
 public:
  explicit JobPricer(const CountModel& model);

  // score[o] = value(o) - min over o's splits of pi . split, for every option
  // of job j (-inf where the option has no split within the pools'
  // capacities). `pi` has one non-negative price per pool; `by_price`:
  // PoolsByPrice(pi), computed once for all the jobs priced at pi.
  void Scores(int j, absl::Span<const double> pi, absl::Span<const int> by_price,
              std::vector<double>& score, const JobCutTerms* terms = nullptr) const;

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
                     std::vector<std::pair<double, int>>& best, double* scores = nullptr,
                     const JobCutTerms* terms = nullptr) const;

  // A split of option o of job j of least cost under `pi` (one count per
  // pool); the cost is what Scores charged. `by_price`: PoolsByPrice(pi).
  std::vector<int> Split(int j, int o, absl::Span<const double> pi, absl::Span<const int> by_price,
                         const JobCutTerms* terms = nullptr) const;

  // The stop option's score (no nodes): its value plus the terms' constant.
  double StopScore(int j, const JobCutTerms* terms = nullptr) const;

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
  // The prices a job's nodes are charged in pattern k: those it adds (add,
  // by add_order) and those it keeps (keep, by keep_order); both pi without
  // cut terms. Keep: Charge once per job; ChargePattern per pattern.
  struct Charged {
    std::vector<double> add_own, keep_own;  // storage where terms change pi
    std::vector<int> add_order_own, keep_order_own;
    absl::Span<const double> add, keep;
    absl::Span<const int> add_order, keep_order;
    double constant = 0.0, grow_bonus = 0.0;
    absl::Span<const JobCutTerms::Inside> inside;
    absl::Span<const JobCutTerms::Net> net;
  };
  static void Charge(absl::Span<const double> pi, absl::Span<const int> by_price,
                     const JobCutTerms* terms, Charged& out);
  static void ChargePattern(absl::Span<const double> pi, absl::Span<const int> by_price,
                            const JobCutTerms* terms, int k, Charged& out);

  // Calls visit(o, score) for the options `opts` of pattern k of job j
  // (by increasing count).
  template <typename Visit>
  void Walk(int j, int k, absl::Span<const int> opts, const Charged& c, double held_cost,
            std::vector<Slot>& grow, std::vector<Slot>& shrink, const Visit& visit) const;

  const CountModel& model_;
  // by_pattern_[j][k]: job j's options of pattern k.
  std::vector<std::vector<std::vector<int>>> by_pattern_;
  double largest_ = 0.0;
  // member_[j][k][p]: pool p is in pattern k of job j.
  std::vector<std::vector<std::vector<char>>> member_;
  mutable std::vector<Slot> grow_scratch_, shrink_scratch_;
  mutable Charged charged_scratch_;
};

// A mixed-integer rounding (MIR) cut on the capacity of a set S of pools,
// valid for every allocation of the count model. Why: growing costs a job
// a fixed resize cost however many nodes it adds, and a job starts or grows
// by whole steps, so the master's LP grows several jobs by a fraction of
// their step and pays a fraction of each cost, where an allocation grows a
// job by whole nodes and pays it all (docs/benchmarks.md, issue 27, seventh
// look); no branching on one job closes that, since the LP moves the
// fraction to a similar job.
//
// The row: the nodes jobs add in S less those they release there fit in
// the room b = capacity(S) - held(S). A growing option of a pattern whose
// pools all lie in S adds exactly w = count - current there: an integer
// term w y_o. For a job's other growing options (patterns that meet S) the
// nodes added there, a_j, are either dropped (they are >= 0) or, for the
// patterns in a member's `patterns`, written a_j = u_j g_j - s_j with g_j
// = 1 when the job grows in one of them, u_j the most it can add in S and
// s_j >= 0. Divided by delta, the MIR of the row (f the fraction of
// b / delta, F(t) = floor(t) + max(0, frac(t) - f) / (1 - f)) is
//   sum_o F(w_o / delta) y_o + sum_members [F(u_j / delta) g_j - kappa s_j]
//       - kappa (nodes released in S) <= floor(b / delta),
// kappa = 1 / (delta (1 - f)) (Marchand and Wolsey 2001, "Aggregation and
// mixed integer rounding to solve MIPs"). With every step w = delta: at
// most floor(b / delta) jobs take their whole step.
//
// A `counted` job enters by its options alone: what option o adds less
// what it releases in S is at least low_o (CountedLow: all its releasable
// nodes there released, none of its growth outside S that could go
// elsewhere), an integer, and the rest is >= 0 and dropped. A job whose
// held nodes and patterns all lie in S (ExactIn; with S every pool, every
// job) adds or releases exactly low_o = count - current there. A counted
// job may also be complemented: the row gets shift_j (sum_o y_o - 1) = 0
// added, so each of its options weighs low_o + shift_j and b grows by
// shift_j. With shift_j what the job releases in its LP optimum, a row
// whose pools are all full (b = 0, no cut) becomes "the nodes started and
// grown fit in what the shrinking jobs release", and whole steps count
// again: 32 nodes cannot start on 18 released ones (docs/benchmarks.md,
// issue 27, thirteenth look). Its coefficient is F((low_o + shift_j) /
// delta), and b / delta above reads (b + sum shift_j) / delta.
struct PoolCut {
  struct Member {
    int job;
    std::vector<char> patterns;  // per pattern of the job (meeting S, not inside)
    double grow;                 // F(u_j / delta) - kappa u_j
  };
  std::vector<char> in_set;     // per pool: in S
  std::vector<Member> members;  // by job index
  struct Counted {
    int job;
    int shift;
    std::shared_ptr<const CountedShape> shape;  // set by MirCut
  };
  std::vector<Counted> counted;  // by job index; never members
  // Job j's patterns inside S, by increasing index:
  // inside_patterns[inside_start[j] .. inside_start[j + 1]) (set by MirCut;
  // Coefficient and CutTerms read them for every column and every pricing
  // round, where PatternInside over the patterns' pools took 8-13 % of a
  // search).
  std::vector<int> inside_start, inside_patterns;
  std::vector<int> held;  // per job: its held nodes in S (set by MirCut)
  double kappa = 0.0;
  double rhs = 0.0;  // floor((b + sum shift_j) / delta)
  double delta = 0.0;
  double fraction = 0.0;  // f

  // The coefficient of job j taking option o (-1: no allocation, nodes 0)
  // with split x: F(w / delta) for a growing option of a pattern inside S;
  // for a member's growing option of one of its patterns grow_j plus kappa
  // per node it adds in S; less kappa per node it releases in S. For a
  // counted job F((low_o + shift) / delta), whatever x.
  double Coefficient(const CountModel& model, int j, int o, const std::vector<int>& x) const;
  // Whether pattern k of job j lies inside S (from inside_patterns).
  bool Inside(int j, int k) const;
};

// Every job's share of the pricing at the cuts' duals `mu` (>= 0; a cut at
// 0 adds nothing): terms[j] for job j, its vectors reused. The prices on
// released nodes (`keep`) are summed once for all the jobs counted in the
// same cuts, not per cut and job (that, and PatternInside, was 13 % of a
// search).
void CutTerms(const CountModel& model, absl::Span<const PoolCut> cuts, absl::Span<const double> mu,
              std::vector<JobCutTerms>& terms);

// Whether every pool of pattern k of job j is in `in_set`.
bool PatternInside(const CountModel& model, int j, int k, absl::Span<const char> in_set);

// The most nodes job j can add in the pools `in_set` with a growing option
// of one of `patterns` (0 if none).
int MostAdded(const CountModel& model, int j, absl::Span<const char> in_set,
              absl::Span<const char> patterns);

// Whether job j's held nodes and every pool of its patterns lie in
// `in_set`, and it holds or may take some node there: its count alone sets
// what it adds or releases in S.
bool ExactIn(const CountModel& model, int j, absl::Span<const char> in_set);

// The least a counted job's option (count nodes in pattern k; count 0:
// stop, k = -1) adds less releases in S, for a job holding `current` nodes:
// shrinking releases at most current - count there, and keeps at least
// count - held_out[k] of its held nodes in S (the rest of the count can
// only be kept in the pattern's pools outside S); growing adds count -
// current in S when its pattern lies inside S (room_out[k] = -1), else at
// least count - current less room_out[k].
int CountedLow(const CountedShape& shape, int current, int count, int k);

// The shape of job j against `in_set`.
CountedShape ShapeIn(const CountModel& model, int j, absl::Span<const char> in_set);

// The MIR cut of pool set `in_set` with divisor delta > 0, `members` (job
// and patterns meeting S but not inside it; grow is computed) and `counted`
// jobs (each with its shift; the shape is computed); nullopt when (b +
// shifts) / delta is (nearly) integral, which gives no cut.
std::optional<PoolCut> MirCut(const CountModel& model, const std::vector<char>& in_set,
                              std::vector<PoolCut::Member> members, double delta,
                              std::vector<PoolCut::Counted> counted = {});

// Where an LP solution stands for the cuts: per job and pattern, the
// weight of its growing options and the nodes they add per pool, and each
// growing column's (pattern, step w = count - current, weight); per job
// and pool the nodes it releases (weighted by the columns' values); per job
// the count and pattern (-1: none) of each column it uses and its weight.
struct LpPoint {
  struct Step {
    int pattern, w;
    double weight;
  };
  std::vector<std::vector<double>> grow;              // per job, per pattern
  std::vector<std::vector<std::vector<double>>> add;  // per job, per pattern, per pool
  std::vector<std::vector<double>> freed;             // per job, per pool
  std::vector<std::vector<Step>> steps;               // per job
  struct Use {
    int count, pattern;
    double weight;
  };
  std::vector<std::vector<Use>> uses;  // per job
};

// The most violated MIR cut (by more than `min_violation`) of each pool
// set worth trying: every pool alone, every pool set of a pattern of some
// job, and every pool. Divisors: the steps of fractional growing columns
// inside S, the u_j of members whose g is fractional, and the count changes
// of exact jobs' fractional columns. A job is a member (for the patterns
// meeting S but not inside it) when its term is positive there. Jobs exact
// in S (ExactIn) are counted; jobs holding nodes in S that do not grow there
// in the LP are counted or not, whichever weighs more at the point; the
// counted jobs are tried unshifted, with the releasing ones shifted by what
// their heaviest column releases, and with every one shifted by minus its
// heaviest column's low.
std::vector<PoolCut> SeparatePoolCuts(const CountModel& model, const LpPoint& point,
                                      double min_violation);

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
  // MIR cuts on the pools' capacities (PoolCut), separated at the root for
  // up to this many rounds (0: none).
  int cut_rounds = 40;
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
