#include "libmalle/alloc/internal/decomposition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libmalle/alloc/internal/cbc_solver.h"
#include "libmalle/base/check.h"
#include "libmalle/base/status_macros.h"

namespace malle::alloc::internal {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// F(t) of the MIR with fraction f (PoolCut).
double MirF(double t, double f) {
  const double fl = std::floor(t);
  return fl + std::max(0.0, (t - fl) - f) / (1.0 - f);
}

}  // namespace

int CountedLow(const CountedShape& shape, int current, int count, int k) {
  if (count < current) {
    const int held_out = k < 0 || shape.held_out.empty() ? 0 : shape.held_out[k];
    return -std::min({shape.held, current - count, shape.held - std::max(0, count - held_out)});
  }
  if (count == 0) return 0;  // stays stopped
  const int outside = shape.room_out.empty() ? -1 : shape.room_out[k];
  return outside < 0 ? count - current : std::max(0, count - current - outside);
}

namespace {

// What the cuts in which a job is counted charge its option of `count`
// nodes in pattern k (JobCutTerms::net).
double NetCharge(absl::Span<const JobCutTerms::Net> net, int current, int count, int k) {
  double charge = 0.0;
  for (const JobCutTerms::Net& t : net) {
    const int low = CountedLow(*t.shape, current, count, k);
    charge -= t.mu * MirF((low + t.shift) / t.delta, t.fraction);
  }
  return charge;
}

// Pools of a pattern as (price, nodes available), cheapest first; ties by
// pool index so that splits do not depend on the sort's whims.
using Slot = JobPricer::Slot;

// Cost of taking `amount` nodes from `slots` (sorted), cheapest first; +inf
// if they hold fewer.
double TakeCost(const std::vector<Slot>& slots, int amount) {
  double cost = 0;
  for (const Slot& s : slots) {
    if (amount <= 0) break;
    const int take = std::min(amount, s.amount);
    cost += take * s.price;
    amount -= take;
  }
  return amount > 0 ? kInf : cost;
}

// Growth slots of pattern k for job j: every pool's nodes not held by the
// job (a split never puts more in a pool than it has). Shrink slots: the
// job's held nodes inside the pattern. Both cheapest first: `by_price`
// (every pool, by price then index) filtered by the pattern's membership,
// which is the order a sort of the pattern's slots would give, without one.
// With cut terms the nodes a job adds and those it keeps are priced apart
// (add, keep), each list in its own order.
void PatternSlots(const CountModel& model, const JobModel& job, absl::Span<const char> member,
                  absl::Span<const double> add, absl::Span<const int> add_order,
                  absl::Span<const double> keep, absl::Span<const int> keep_order,
                  std::vector<Slot>& grow, std::vector<Slot>& shrink) {
  grow.clear();
  shrink.clear();
  for (int p : add_order) {
    if (!member[p]) continue;
    const int room = model.pools[p].capacity - job.current_per_pool[p];
    if (room > 0) grow.push_back({add[p], room, p});
  }
  for (int p : keep_order) {
    if (!member[p]) continue;
    const int held = job.current_per_pool[p];
    if (held > 0) shrink.push_back({keep[p], held, p});
  }
}

}  // namespace

// The least-cost flow of any amount from s to t where every arc out of s
// has a negative cost and every other arc costs 0 (FlowRound's network:
// s -> job arcs carry the values, job -> pool -> t arcs only capacities).
// The amounts a flow can send on the source arcs form a polymatroid (the
// most any set of them can send together is a max flow, a submodular
// function of the set), so the greedy is optimal: take the source arcs by
// increasing cost (largest value first) and send on each as much as still
// fits, re-routing earlier flow but never reducing it (augmenting paths
// from the arc's head to t that avoid s). Each augmentation is a
// breadth-first search, no shortest paths; a vertex found unable to reach
// t never can again (the residual arcs out of the vertices it reaches do
// not change), so it is not searched twice. This replaced successive
// shortest paths with a Bellman-Ford per augmentation, which cost
// 0.2-2 ms a flow at 100-1,000 jobs (docs/benchmarks.md, issue 27).
class MinCostFlow {
 public:
  explicit MinCostFlow(int vertices = 0) : adj_(vertices) {}

  // Empties the network (keeping its memory: ModeFlow solves thousands).
  void Reset(int vertices) {
    if (static_cast<int>(adj_.size()) < vertices) adj_.resize(vertices);
    for (std::vector<int>& a : adj_) a.clear();
    adj_.resize(vertices);
    arcs_.clear();
  }
  int To(int arc) const { return arcs_[arc].to; }

  int AddArc(int from, int to, long long capacity, double cost) {
    adj_[from].push_back(static_cast<int>(arcs_.size()));
    arcs_.push_back({to, capacity, cost});
    adj_[to].push_back(static_cast<int>(arcs_.size()));
    arcs_.push_back({from, 0, -cost});
    return static_cast<int>(arcs_.size()) - 2;
  }

  // `dist`: also compute Dist (one Bellman-Ford on the final residual
  // graph), which FlowRound's pool prices need.
  void Run(int s, int t, bool dist) {
    const int n = static_cast<int>(adj_.size());
    std::vector<int>& sources = sources_;
    sources.clear();
    for (int a : adj_[s]) {
      if ((a & 1) == 0 && arcs_[a].capacity > 0 && arcs_[a].cost < 0) sources.push_back(a);
    }
    // Largest value first; ties by arc index so that the flow is
    // deterministic.
    std::sort(sources.begin(), sources.end(), [this](int a, int b) {
      return arcs_[a].cost != arcs_[b].cost ? arcs_[a].cost < arcs_[b].cost : a < b;
    });
    std::vector<char>& dead = dead_;
    std::vector<int>& via = via_;
    std::vector<int>& queue = queue_;
    std::vector<int>& seen_at = seen_at_;
    dead.assign(n, 0);
    via.assign(n, 0);
    seen_at.assign(n, -1);
    int search = 0;
    dead[s] = 1;  // paths never go through s: earlier amounts stay
    for (int src : sources) {
      const int head = arcs_[src].to;
      while (arcs_[src].capacity > 0 && !dead[head]) {
        // Breadth-first from the arc's head to t.
        ++search;
        queue.assign(1, head);
        seen_at[head] = search;
        bool found = false;
        for (size_t q = 0; q < queue.size() && !found; ++q) {
          const int v = queue[q];
          for (int a : adj_[v]) {
            const Arc& arc = arcs_[a];
            if (arc.capacity <= 0 || dead[arc.to] || seen_at[arc.to] == search) continue;
            seen_at[arc.to] = search;
            via[arc.to] = a;
            if (arc.to == t) {
              found = true;
              break;
            }
            queue.push_back(arc.to);
          }
        }
        if (!found) {
          for (int v : queue) dead[v] = 1;
          break;
        }
        long long push = arcs_[src].capacity;
        for (int v = t; v != head; v = arcs_[via[v] ^ 1].to) {
          push = std::min(push, arcs_[via[v]].capacity);
        }
        for (int v = t; v != head; v = arcs_[via[v] ^ 1].to) {
          arcs_[via[v]].capacity -= push;
          arcs_[via[v] ^ 1].capacity += push;
        }
        arcs_[src].capacity -= push;
        arcs_[src ^ 1].capacity += push;
      }
    }
    dist_.clear();
    if (dist) ShortestPaths(s);
  }

  long long Flow(int arc) const { return arcs_[arc ^ 1].capacity; }
  int num_arcs() const { return static_cast<int>(arcs_.size()); }
  // After Run(.., dist = true): the least cost of a path from s to v in the
  // final residual graph (+inf where none), i.e. minus the value of one
  // more unit at v.
  double Dist(int v) const { return dist_.empty() ? kInf : dist_[v]; }

 private:
  struct Arc {
    int to;
    long long capacity;
    double cost;
  };

  // Bellman-Ford (queue) from s; the flow is optimal, so the residual
  // graph has no negative cycle.
  void ShortestPaths(int s) {
    const int n = static_cast<int>(adj_.size());
    dist_.assign(n, kInf);
    std::vector<char> queued(n, 0);
    dist_[s] = 0;
    std::vector<int> queue = {s};
    queued[s] = 1;
    for (size_t head = 0; head < queue.size(); ++head) {
      const int v = queue[head];
      queued[v] = 0;
      for (int a : adj_[v]) {
        const Arc& arc = arcs_[a];
        if (arc.capacity <= 0) continue;
        const double d = dist_[v] + arc.cost;
        if (d < dist_[arc.to] - 1e-12 * (1 + std::fabs(d))) {
          dist_[arc.to] = d;
          if (!queued[arc.to]) {
            queued[arc.to] = 1;
            queue.push_back(arc.to);
          }
        }
      }
    }
  }

  std::vector<std::vector<int>> adj_;
  std::vector<Arc> arcs_;
  std::vector<double> dist_;
  // Run's scratch, kept between runs.
  std::vector<char> dead_;
  std::vector<int> via_, queue_, seen_at_, sources_;
};

namespace {

double HeldCost(const JobModel& job, absl::Span<const double> pi) {
  double cost = 0;
  for (size_t p = 0; p < job.current_per_pool.size(); ++p) cost += pi[p] * job.current_per_pool[p];
  return cost;
}

}  // namespace

JobPricer::JobPricer(const CountModel& model) : model_(model) {
  by_pattern_.resize(model.jobs.size());
  for (size_t j = 0; j < model.jobs.size(); ++j) {
    const JobModel& job = model.jobs[j];
    for (const Option& o : job.options) largest_ = std::max(largest_, std::fabs(o.value));
    member_.emplace_back();
    for (const Pattern& pattern : job.patterns) {
      member_[j].emplace_back(model.pools.size(), 0);
      for (int p : pattern.pools) member_[j].back()[p] = 1;
    }
    by_pattern_[j].resize(job.patterns.size());
    for (size_t o = 1; o < job.options.size(); ++o) {
      by_pattern_[j][job.options[o].pattern].push_back(static_cast<int>(o));
    }
    for (std::vector<int>& opts : by_pattern_[j]) {
      std::stable_sort(opts.begin(), opts.end(), [&job](int a, int b) {
        return job.options[a].nodes < job.options[b].nodes;
      });
    }
  }
}

namespace {

// pi + extra, and the pools by that price (ties by index).
void Own(absl::Span<const double> pi, const std::vector<double>& extra, std::vector<double>& price,
         std::vector<int>& order) {
  price.assign(pi.begin(), pi.end());
  for (size_t p = 0; p < price.size(); ++p) price[p] += extra[p];
  order.resize(price.size());
  for (size_t p = 0; p < order.size(); ++p) order[p] = static_cast<int>(p);
  std::sort(order.begin(), order.end(),
            [&price](int a, int b) { return price[a] != price[b] ? price[a] < price[b] : a < b; });
}

}  // namespace

void JobPricer::Charge(absl::Span<const double> pi, absl::Span<const int> by_price,
                       const JobCutTerms* terms, Charged& out) {
  out.add = out.keep = pi;
  out.add_order = out.keep_order = by_price;
  out.constant = out.grow_bonus = 0.0;
  out.net = {};
  if (terms == nullptr) return;
  out.constant = terms->constant;
  out.net = terms->net;
  if (!terms->keep.empty()) {
    Own(pi, terms->keep, out.keep_own, out.keep_order_own);
    out.keep = out.keep_own;
    out.keep_order = out.keep_order_own;
  }
}

void JobPricer::ChargePattern(absl::Span<const double> pi, absl::Span<const int> by_price,
                              const JobCutTerms* terms, int k, Charged& out) {
  out.add = pi;
  out.add_order = by_price;
  out.grow_bonus = 0.0;
  out.inside = {};
  if (terms == nullptr) return;
  if (k < static_cast<int>(terms->grow_bonus.size())) out.grow_bonus = terms->grow_bonus[k];
  if (k < static_cast<int>(terms->inside.size())) out.inside = terms->inside[k];
  if (k < static_cast<int>(terms->add.size()) && !terms->add[k].empty()) {
    Own(pi, terms->add[k], out.add_own, out.add_order_own);
    out.add = out.add_own;
    out.add_order = out.add_order_own;
  }
}

template <typename Visit>
void JobPricer::Walk(int j, int k, absl::Span<const int> opts, const Charged& c, double held_cost,
                     std::vector<Slot>& grow, std::vector<Slot>& shrink, const Visit& visit) const {
  const JobModel& job = model_.jobs[j];
  const int cur = job.current_nodes;
  PatternSlots(model_, job, member_[j][k], c.add, c.add_order, c.keep, c.keep_order, grow, shrink);
  // Options come by increasing count: walk the slots once for the growing
  // ones (cost of the first `extra` nodes, cheapest first).
  size_t slot = 0;
  int used_in_slot = 0, taken = 0;
  double grow_cost = 0;
  for (int o : opts) {
    const int n = job.options[o].nodes;
    double cost;
    if (n >= cur) {
      const int extra = n - cur;
      while (taken < extra && slot < grow.size()) {
        const int step = std::min(extra - taken, grow[slot].amount - used_in_slot);
        grow_cost += step * grow[slot].price;
        taken += step;
        used_in_slot += step;
        if (used_in_slot == grow[slot].amount) {
          ++slot;
          used_in_slot = 0;
        }
      }
      cost = taken < extra ? kInf : held_cost + grow_cost;
    } else {
      cost = TakeCost(shrink, n);
    }
    double cut = NetCharge(c.net, cur, n, job.options[o].pattern);
    if (n > cur) {
      cut += c.grow_bonus;
      for (const JobCutTerms::Inside& in : c.inside) {
        cut -= in.mu * MirF((n - cur) / in.delta, in.fraction);
      }
    }
    visit(o, job.options[o].value - cost + c.constant + cut);
  }
}

double JobPricer::StopScore(int j, const JobCutTerms* terms) const {
  const JobModel& job = model_.jobs[j];
  if (terms == nullptr) return job.options[0].value;
  return job.options[0].value + terms->constant + NetCharge(terms->net, job.current_nodes, 0, -1);
}

void JobPricer::Scores(int j, absl::Span<const double> pi, absl::Span<const int> by_price,
                       std::vector<double>& score, const JobCutTerms* terms) const {
  const JobModel& job = model_.jobs[j];
  score.assign(job.options.size(), -kInf);
  score[0] = StopScore(j, terms);
  Charged charged;
  Charge(pi, by_price, terms, charged);
  const double held_cost = HeldCost(job, charged.keep);
  std::vector<Slot> grow, shrink;
  for (size_t k = 0; k < job.patterns.size(); ++k) {
    const std::vector<int>& opts = by_pattern_[j][k];
    if (opts.empty()) continue;
    ChargePattern(pi, by_price, terms, static_cast<int>(k), charged);
    Walk(j, static_cast<int>(k), opts, charged, held_cost, grow, shrink,
         [&score](int o, double v) { score[o] = v; });
  }
}

std::vector<int> PoolsByPrice(absl::Span<const double> pi) {
  std::vector<int> order(pi.size());
  for (size_t p = 0; p < pi.size(); ++p) order[p] = static_cast<int>(p);
  std::sort(order.begin(), order.end(),
            [&pi](int a, int b) { return pi[a] != pi[b] ? pi[a] < pi[b] : a < b; });
  return order;
}

void JobPricer::BestByPattern(int j, absl::Span<const double> pi, absl::Span<const int> by_price,
                              const std::vector<std::vector<int>>& opts,
                              std::vector<std::pair<double, int>>& best, double* scores,
                              const JobCutTerms* terms) const {
  const JobModel& job = model_.jobs[j];
  best.assign(job.patterns.size(), {-kInf, -1});
  Charged& charged = charged_scratch_;
  Charge(pi, by_price, terms, charged);
  const double held_cost = HeldCost(job, charged.keep);
  std::vector<Slot>& grow = grow_scratch_;
  std::vector<Slot>& shrink = shrink_scratch_;
  for (size_t k = 0; k < job.patterns.size(); ++k) {
    if (opts[k].empty()) continue;
    std::pair<double, int>& b = best[k];
    ChargePattern(pi, by_price, terms, static_cast<int>(k), charged);
    Walk(j, static_cast<int>(k), opts[k], charged, held_cost, grow, shrink,
         [&b, scores](int o, double v) {
           if (scores != nullptr) scores[o] = v;
           if (b.second < 0 || v > b.first) b = {v, o};
         });
  }
}

std::vector<int> JobPricer::Split(int j, int o, absl::Span<const double> pi,
                                  absl::Span<const int> by_price, const JobCutTerms* terms) const {
  const JobModel& job = model_.jobs[j];
  std::vector<int> x(model_.pools.size(), 0);
  const Option& opt = job.options[o];
  if (opt.nodes == 0) return x;
  Charged charged;
  Charge(pi, by_price, terms, charged);
  ChargePattern(pi, by_price, terms, opt.pattern, charged);
  std::vector<Slot> grow, shrink;
  PatternSlots(model_, job, member_[j][opt.pattern], charged.add, charged.add_order, charged.keep,
               charged.keep_order, grow, shrink);
  int left;
  const std::vector<Slot>* from;
  if (opt.nodes >= job.current_nodes) {
    x = job.current_per_pool;
    left = opt.nodes - job.current_nodes;
    from = &grow;
  } else {
    left = opt.nodes;
    from = &shrink;
  }
  for (const Slot& s : *from) {
    if (left <= 0) break;
    const int take = std::min(left, s.amount);
    x[s.pool] += take;
    left -= take;
  }
  return x;
}

Direction OptionDirection(const JobModel& job, int o) {
  const Option& opt = job.options[o];
  if (opt.nodes == 0) return Direction::kStop;
  if (o == job.current_option) return Direction::kStay;
  return opt.nodes >= job.current_nodes ? Direction::kUp : Direction::kDown;
}

ModeFlow::ModeFlow(const CountModel& model, const JobPricer& pricer)
    : model_(model),
      pricer_(pricer),
      must_(4 * std::max(1.0, pricer.largest_value())),
      cache_(model.jobs.size()),
      flow_(std::make_unique<MinCostFlow>()) {}

ModeFlow::~ModeFlow() = default;

// Job j's options in `mode` and the concave envelope of their values, built
// once per (job, mode): the local search asks for the same ones thousands
// of times, one job's mode changed at a time.
const ModeFlow::Plan* ModeFlow::PlanFor(int j, const Mode& mode) {
  for (const Plan& plan : cache_[j]) {
    if (plan.mode.pattern == mode.pattern && plan.mode.direction == mode.direction) return &plan;
  }
  const JobModel& job = model_.jobs[j];
  Plan plan;
  plan.mode = mode;
  const bool up = mode.direction == Direction::kUp;
  for (int o : pricer_.PatternOptions(j, mode.pattern)) {
    if (OptionDirection(job, o) == mode.direction) plan.options.push_back(o);
  }
  if (!plan.options.empty()) {
    auto amount = [&](int o) { return job.options[o].nodes - (up ? job.current_nodes : 0); };
    plan.base = amount(plan.options[0]);
    // The upper concave envelope of (amount, value) from the base on.
    std::vector<int> hull = {plan.options[0]};
    for (size_t i = 1; i < plan.options.size(); ++i) {
      const int o = plan.options[i];
      while (hull.size() >= 2) {
        const int a = hull[hull.size() - 2], b = hull.back();
        const double s_ab = (job.options[b].value - job.options[a].value) / (amount(b) - amount(a));
        const double s_ao = (job.options[o].value - job.options[a].value) / (amount(o) - amount(a));
        if (s_ao >= s_ab) {
          hull.pop_back();
        } else {
          break;
        }
      }
      hull.push_back(o);
    }
    for (size_t i = 1; i < hull.size(); ++i) {
      const int a = hull[i - 1], b = hull[i];
      const double slope = (job.options[b].value - job.options[a].value) / (amount(b) - amount(a));
      if (slope <= 0) break;  // concave: no later segment pays either
      plan.segments.emplace_back(amount(b) - amount(a), slope);
    }
  }
  cache_[j].push_back(std::move(plan));
  return &cache_[j].back();
}

bool ModeFlow::Solve(const std::vector<Mode>& modes, bool prices) {
  const int num_jobs = static_cast<int>(model_.jobs.size());
  const int num_pools = static_cast<int>(model_.pools.size());
  const int s = 0, t = 1;
  auto job_v = [](int j) { return 2 + j; };
  auto pool_v = [num_jobs](int p) { return 2 + num_jobs + p; };
  MinCostFlow& flow = *flow_;
  flow.Reset(2 + num_jobs + num_pools);
  modes_ = modes;
  solved_ = false;
  room_.resize(num_pools);
  for (int p = 0; p < num_pools; ++p) room_[p] = model_.pools[p].capacity;
  plans_.assign(num_jobs, nullptr);
  arcs_.assign(num_jobs, {0, 0, 0});
  for (int j = 0; j < num_jobs; ++j) {
    const JobModel& job = model_.jobs[j];
    const Mode& mode = modes[j];
    if (mode.direction == Direction::kStop) continue;
    if (mode.direction == Direction::kStay) {
      if (job.current_option == 0) return false;
      for (int p = 0; p < num_pools; ++p) room_[p] -= job.current_per_pool[p];
      continue;
    }
    const bool up = mode.direction == Direction::kUp;
    // (Valid until the next Solve: PlanFor(j) is not called again before.)
    const Plan* plan = PlanFor(j, mode);
    if (plan->options.empty()) return false;
    plans_[j] = plan;
    if (up) {
      for (int p = 0; p < num_pools; ++p) room_[p] -= job.current_per_pool[p];
    }
    Arcs& arcs = arcs_[j];
    arcs.first = -1;
    if (plan->base > 0) arcs.first = flow.AddArc(s, job_v(j), plan->base, -must_);
    for (const auto& [amount, slope] : plan->segments) {
      const int a = flow.AddArc(s, job_v(j), amount, -slope);
      if (arcs.first < 0) arcs.first = a;
    }
    if (arcs.first < 0) arcs.first = flow.num_arcs();
    arcs.pools = flow.num_arcs();
    for (int p : job.patterns[mode.pattern].pools) {
      const long long cap =
          up ? model_.pools[p].capacity - job.current_per_pool[p] : job.current_per_pool[p];
      if (cap > 0) flow.AddArc(job_v(j), pool_v(p), cap, 0.0);
    }
    arcs.end = flow.num_arcs();
  }
  for (int p = 0; p < num_pools; ++p) {
    if (room_[p] < 0) return false;
    if (room_[p] > 0) flow.AddArc(pool_v(p), t, room_[p], 0.0);
  }
  flow.Run(s, t, prices);
  if (prices) {
    prices_.assign(num_pools, 0.0);
    for (int p = 0; p < num_pools; ++p) {
      const double d = flow.Dist(pool_v(p));
      if (d < 0) prices_[p] = std::min(-d, must_);
    }
  }
  option_.assign(num_jobs, 0);
  objective_ = 0;
  for (int j = 0; j < num_jobs; ++j) {
    const JobModel& job = model_.jobs[j];
    const Mode& mode = modes[j];
    if (mode.direction == Direction::kStay) option_[j] = job.current_option;
    if (plans_[j] != nullptr) {
      const Plan& plan = *plans_[j];
      long long sent = 0;
      for (int a = arcs_[j].first; a < arcs_[j].pools; a += 2) sent += flow.Flow(a);
      if (sent < plan.base) return false;
      const int n =
          static_cast<int>(sent) + (mode.direction == Direction::kUp ? job.current_nodes : 0);
      int chosen = -1;
      for (int o : plan.options) {
        if (job.options[o].nodes == n) chosen = o;
      }
      if (chosen < 0) return false;  // a gap in the mode's counts
      option_[j] = chosen;
    }
    objective_ += job.options[option_[j]].value;
  }
  solved_ = true;
  return true;
}

CountSolution ModeFlow::Solution() const {
  MALLE_CHECK(solved_) << "ModeFlow::Solution without a successful Solve";
  const int num_jobs = static_cast<int>(model_.jobs.size());
  const int num_pools = static_cast<int>(model_.pools.size());
  const MinCostFlow& flow = *flow_;
  CountSolution sol;
  sol.option = option_;
  sol.per_pool.assign(num_jobs, std::vector<int>(num_pools, 0));
  for (int j = 0; j < num_jobs; ++j) {
    const JobModel& job = model_.jobs[j];
    const Direction d = modes_[j].direction;
    if (d == Direction::kStay || d == Direction::kUp) sol.per_pool[j] = job.current_per_pool;
    if (plans_[j] == nullptr) continue;
    for (int a = arcs_[j].pools; a < arcs_[j].end; a += 2) {
      sol.per_pool[j][flow.To(a) - 2 - num_jobs] += static_cast<int>(flow.Flow(a));
    }
  }
  sol.objective = SolutionObjective(model_, sol.option);
  return sol;
}

std::optional<CountSolution> FlowRound(const CountModel& model, const JobPricer& pricer,
                                       const std::vector<Mode>& modes,
                                       std::vector<double>* pool_prices) {
  ModeFlow flow(model, pricer);
  if (!flow.Solve(modes, pool_prices != nullptr)) return std::nullopt;
  if (pool_prices != nullptr) *pool_prices = flow.pool_prices();
  return flow.Solution();
}

Mode OptionMode(const JobModel& job, int o) {
  return {o == 0 ? -1 : job.options[o].pattern, OptionDirection(job, o)};
}

namespace {

bool SameMode(const Mode& a, const Mode& b) {
  return a.direction == b.direction && (a.direction == Direction::kStop || a.pattern == b.pattern);
}

// Every mode of job j: stop, stay (when it runs), and up / down in each
// pattern that has such an option.
std::vector<Mode> AllModes(const JobModel& job, const JobPricer& pricer, int j) {
  std::vector<Mode> modes = {{-1, Direction::kStop}};
  if (job.current_option != 0) modes.push_back(OptionMode(job, job.current_option));
  for (int k = 0; k < static_cast<int>(job.patterns.size()); ++k) {
    bool up = false, down = false;
    for (int o : pricer.PatternOptions(j, k)) {
      const Direction d = OptionDirection(job, o);
      up = up || d == Direction::kUp;
      down = down || d == Direction::kDown;
    }
    if (up) modes.push_back({k, Direction::kUp});
    if (down) modes.push_back({k, Direction::kDown});
  }
  return modes;
}

}  // namespace

CountSolution ImproveModes(const CountModel& model, const JobPricer& pricer,
                           const CountSolution& start,
                           const std::vector<std::vector<ModeCandidate>>& candidates,
                           absl::Span<const int> order, absl::Time deadline, int* flows) {
  const int num_jobs = static_cast<int>(model.jobs.size());
  CountSolution best = start;
  std::vector<Mode> modes(num_jobs);
  for (int j = 0; j < num_jobs; ++j) modes[j] = OptionMode(model.jobs[j], start.option[j]);
  int count = 0;
  std::vector<ModeCandidate> all;
  // Prices of the pools in the best allocation's flow (the value of one
  // more node in each): a switch whose gain at these prices is negative
  // is not tried. A screen, not a bound (the flow re-balances).
  ModeFlow flow(model, pricer);
  std::vector<double> prices;
  std::vector<int> by_price;  // PoolsByPrice(prices)
  if (flow.Solve(modes, /*prices=*/true)) {
    prices = flow.pool_prices();
    by_price = PoolsByPrice(prices);
  }
  std::vector<double> score, mode_profit;
  bool gained = true;
  while (gained && absl::Now() < deadline) {
    gained = false;
    for (int i = 0; i < num_jobs && absl::Now() < deadline; ++i) {
      const int j = order.empty() ? i : order[i];
      const bool given = !candidates.empty() && !candidates[j].empty();
      if (!given) {
        all.clear();
        for (const Mode& m : AllModes(model.jobs[j], pricer, j)) all.push_back({m});
      }
      const Mode was = modes[j];
      const JobModel& job = model.jobs[j];
      bool scored = false;
      double now_profit = 0;
      for (const ModeCandidate& c : given ? candidates[j] : all) {
        if (!(c.bound > best.objective)) break;  // nor any later one
        if (SameMode(c.mode, was)) continue;
        if (!prices.empty()) {
          // Mode (pattern k, direction d) at 1 + 4 k + d; the stop mode at 0.
          auto key = [](const Mode& m) {
            return m.direction == Direction::kStop
                       ? 0
                       : 1 + 4 * m.pattern + static_cast<int>(m.direction);
          };
          if (!scored) {
            pricer.Scores(j, prices, by_price, score);
            now_profit = job.options[best.option[j]].value;
            for (size_t p = 0; p < prices.size(); ++p)
              now_profit -= prices[p] * best.per_pool[j][p];
            mode_profit.assign(1 + 4 * job.patterns.size(), -kInf);
            for (int o = 0; o < static_cast<int>(score.size()); ++o) {
              double& m = mode_profit[key(OptionMode(job, o))];
              m = std::max(m, score[o]);
            }
            scored = true;
          }
          const double profit = mode_profit[key(c.mode)];
          if (!(profit > now_profit - 1e-9 * std::max(1.0, std::fabs(now_profit)))) continue;
        }
        modes[j] = c.mode;
        ++count;
        if (flow.Solve(modes) &&
            flow.objective() > best.objective + 1e-9 * std::max(1.0, std::fabs(best.objective))) {
          CountSolution sol = flow.Solution();
          if (CheckSolution(model, sol).ok()) {
            // The flow may have changed other jobs' counts within their modes.
            best = std::move(sol);
            // The prices cost a shortest-path search: only for the switches
            // kept (the flow is deterministic: the same allocation).
            if (flow.Solve(modes, /*prices=*/true)) {
              prices = flow.pool_prices();
              by_price = PoolsByPrice(prices);
            }
            gained = true;
            break;
          }
        }
        modes[j] = was;
      }
    }
  }
  if (flows != nullptr) *flows = count;
  return best;
}

double LagrangianBound(const CountModel& model, const JobPricer& pricer,
                       absl::Span<const double> pi, std::vector<double>* best) {
  double bound = 0;
  for (size_t p = 0; p < model.pools.size(); ++p) bound += pi[p] * model.pools[p].capacity;
  std::vector<double> score;
  const std::vector<int> by_price = PoolsByPrice(pi);
  if (best != nullptr) best->assign(model.jobs.size(), -kInf);
  for (size_t j = 0; j < model.jobs.size(); ++j) {
    pricer.Scores(static_cast<int>(j), pi, by_price, score);
    const double b = *std::max_element(score.begin(), score.end());
    bound += b;
    if (best != nullptr) (*best)[j] = b;
  }
  return bound;
}

namespace {

const PoolCut::Member* FindMember(const std::vector<PoolCut::Member>& members, int j) {
  const auto it = std::lower_bound(members.begin(), members.end(), j,
                                   [](const PoolCut::Member& m, int job) { return m.job < job; });
  return it != members.end() && it->job == j ? &*it : nullptr;
}

const PoolCut::Counted* FindCounted(const std::vector<PoolCut::Counted>& counted, int j) {
  const auto it = std::lower_bound(counted.begin(), counted.end(), j,
                                   [](const PoolCut::Counted& e, int job) { return e.job < job; });
  return it != counted.end() && it->job == j ? &*it : nullptr;
}

}  // namespace

bool PatternInside(const CountModel& model, int j, int k, absl::Span<const char> in_set) {
  for (int p : model.jobs[j].patterns[k].pools) {
    if (!in_set[p]) return false;
  }
  return true;
}

double PoolCut::Coefficient(const CountModel& model, int j, int o,
                            const std::vector<int>& x) const {
  const JobModel& job = model.jobs[j];
  if (const Counted* e = FindCounted(counted, j)) {
    const int count = o <= 0 ? 0 : job.options[o].nodes;
    const int low =
        CountedLow(*e->shape, job.current_nodes, count, o <= 0 ? -1 : job.options[o].pattern);
    return MirF((low + e->shift) / delta, fraction);
  }
  int added = 0, freed = 0;
  for (size_t p = 0; p < in_set.size(); ++p) {
    if (!in_set[p]) continue;
    const int held = job.current_per_pool[p];
    added += std::max(0, x[p] - held);
    freed += std::max(0, held - x[p]);
  }
  double c = -kappa * freed;
  if (o <= 0 || job.options[o].nodes <= job.current_nodes) return c;
  const int k = job.options[o].pattern;
  if (Inside(j, k)) {
    return c + MirF((job.options[o].nodes - job.current_nodes) / delta, fraction);
  }
  const Member* m = FindMember(members, j);
  if (m != nullptr && m->patterns[k]) c += kappa * added + m->grow;
  return c;
}

bool PoolCut::Inside(int j, int k) const {
  return std::binary_search(inside_patterns.begin() + inside_start[j],
                            inside_patterns.begin() + inside_start[j + 1], k);
}

namespace {

// A cut's share of job j's pricing at dual mu > 0 but the released nodes'
// (CutTerms): a counted job's net term; a pattern inside S: F(w / delta);
// a member: mu kappa per node added in S and its growing options' bonus.
// `e`, `m`: job j's entry in cut.counted, cut.members (nullptr: none).
void AddPatternTerms(const PoolCut& cut, const CountModel& model, int j, double mu,
                     const PoolCut::Counted* e, const PoolCut::Member* m, JobCutTerms& terms) {
  if (e != nullptr) {
    terms.net.push_back({mu, cut.delta, cut.fraction, e->shift, e->shape});
    return;
  }
  const JobModel& job = model.jobs[j];
  const size_t num_pools = cut.in_set.size();
  const size_t num_patterns = job.patterns.size();
  for (int i = cut.inside_start[j]; i < cut.inside_start[j + 1]; ++i) {
    terms.inside.resize(num_patterns);
    terms.inside[cut.inside_patterns[i]].push_back({mu, cut.delta, cut.fraction});
  }
  if (m == nullptr) return;
  terms.add.resize(num_patterns);
  terms.grow_bonus.resize(num_patterns, 0.0);
  for (size_t k = 0; k < num_patterns; ++k) {
    if (!m->patterns[k]) continue;
    if (terms.add[k].empty()) terms.add[k].assign(num_pools, 0.0);
    for (size_t p = 0; p < num_pools; ++p) {
      if (cut.in_set[p]) terms.add[k][p] += mu * cut.kappa;
    }
    terms.grow_bonus[k] -= mu * m->grow;
  }
}

}  // namespace

void CutTerms(const CountModel& model, absl::Span<const PoolCut> cuts, absl::Span<const double> mu,
              std::vector<JobCutTerms>& terms) {
  const int num_jobs = static_cast<int>(model.jobs.size());
  const int num_pools = static_cast<int>(model.pools.size());
  terms.resize(num_jobs);
  for (JobCutTerms& t : terms) {
    t.keep.clear();
    t.constant = 0.0;
    t.add.clear();
    t.grow_bonus.clear();
    t.inside.clear();
    t.net.clear();
  }
  std::vector<int> live;
  for (size_t c = 0; c < cuts.size(); ++c) {
    if (mu[c] > 0) live.push_back(static_cast<int>(c));
  }
  // The live cuts in which each job is counted, in order.
  std::vector<std::vector<int>> counted_in(num_jobs);
  for (int c : live) {
    for (const PoolCut::Counted& e : cuts[c].counted) counted_in[e.job].push_back(c);
  }
  // Released nodes, in each cut where the job is not counted: +mu kappa
  // each, i.e. mu kappa per node kept in S (keep) less mu kappa per held
  // node there (the constant).
  std::map<std::vector<int>, std::vector<double>> keep_by_counted;
  for (int j = 0; j < num_jobs; ++j) {
    const std::vector<int>& in = counted_in[j];
    if (in.size() == live.size()) continue;  // counted in every one
    auto [it, fresh] = keep_by_counted.try_emplace(in);
    size_t i = 0;
    for (int c : live) {
      if (i < in.size() && in[i] == c) {
        ++i;
        continue;
      }
      const double w = mu[c] * cuts[c].kappa;
      terms[j].constant += w * cuts[c].held[j];
      if (!fresh) continue;
      it->second.resize(num_pools, 0.0);
      for (int p = 0; p < num_pools; ++p) {
        if (cuts[c].in_set[p]) it->second[p] += w;
      }
    }
    terms[j].keep = it->second;
  }
  for (int c : live) {
    const PoolCut& cut = cuts[c];
    // Both lists are by job: walked along.
    auto e = cut.counted.begin();
    auto m = cut.members.begin();
    for (int j = 0; j < num_jobs; ++j) {
      while (e != cut.counted.end() && e->job < j) ++e;
      while (m != cut.members.end() && m->job < j) ++m;
      AddPatternTerms(cut, model, j, mu[c], e != cut.counted.end() && e->job == j ? &*e : nullptr,
                      m != cut.members.end() && m->job == j ? &*m : nullptr, terms[j]);
    }
  }
}

int MostAdded(const CountModel& model, int j, absl::Span<const char> in_set,
              absl::Span<const char> patterns) {
  const JobModel& job = model.jobs[j];
  std::vector<int> room(job.patterns.size(), 0);
  for (size_t k = 0; k < job.patterns.size(); ++k) {
    if (!patterns[k]) continue;
    for (int p : job.patterns[k].pools) {
      if (in_set[p]) room[k] += std::max(0, model.pools[p].capacity - job.current_per_pool[p]);
    }
  }
  int most = 0;
  for (size_t o = 1; o < job.options.size(); ++o) {
    const Option& opt = job.options[o];
    if (opt.nodes <= job.current_nodes || !patterns[opt.pattern]) continue;
    most = std::max(most, std::min(opt.nodes - job.current_nodes, room[opt.pattern]));
  }
  return most;
}

namespace {

// The room of S: its capacity less every job's held nodes there.
double Room(const CountModel& model, absl::Span<const char> in_set) {
  double b = 0;
  for (size_t p = 0; p < in_set.size(); ++p) {
    if (!in_set[p]) continue;
    b += model.pools[p].capacity;
    for (const JobModel& job : model.jobs) b -= job.current_per_pool[p];
  }
  return b;
}

// Fractions of b / delta the cuts use: away from 0 (no cut) and from 1
// (kappa = 1 / (delta (1 - f)) would make the rows ill-conditioned).
constexpr double kMinFraction = 1e-3, kMaxFraction = 0.99;

}  // namespace

CountedShape ShapeIn(const CountModel& model, int j, absl::Span<const char> in_set) {
  const JobModel& job = model.jobs[j];
  CountedShape shape;
  for (size_t p = 0; p < in_set.size(); ++p) shape.held += in_set[p] ? job.current_per_pool[p] : 0;
  if (ExactIn(model, j, in_set)) return shape;
  for (const Pattern& pattern : job.patterns) {
    int room = -1, held = 0;
    for (int p : pattern.pools) {
      if (in_set[p]) continue;
      room = std::max(room, 0) + std::max(0, model.pools[p].capacity - job.current_per_pool[p]);
      held += job.current_per_pool[p];
    }
    shape.room_out.push_back(room);
    shape.held_out.push_back(held);
  }
  return shape;
}

bool ExactIn(const CountModel& model, int j, absl::Span<const char> in_set) {
  const JobModel& job = model.jobs[j];
  bool touches = false;
  for (size_t p = 0; p < in_set.size(); ++p) {
    if (job.current_per_pool[p] == 0) continue;
    if (!in_set[p]) return false;
    touches = true;
  }
  for (const Pattern& pattern : job.patterns) {
    for (int p : pattern.pools) {
      if (!in_set[p]) return false;
      touches = true;
    }
  }
  return touches;
}

std::optional<PoolCut> MirCut(const CountModel& model, const std::vector<char>& in_set,
                              std::vector<PoolCut::Member> members, double delta,
                              std::vector<PoolCut::Counted> counted) {
  if (!(delta > 0)) return std::nullopt;
  std::sort(counted.begin(), counted.end(),
            [](const PoolCut::Counted& a, const PoolCut::Counted& b) { return a.job < b.job; });
  double shifts = 0;
  for (size_t i = 0; i < counted.size(); ++i) {
    MALLE_CHECK(i + 1 == counted.size() || counted[i].job != counted[i + 1].job)
        << "MirCut: job " << counted[i].job << " counted twice";
    PoolCut::Counted& c = counted[i];
    c.shape = std::make_shared<const CountedShape>(ShapeIn(model, c.job, in_set));
    shifts += c.shift;
  }
  const double beta = (Room(model, in_set) + shifts) / delta;
  const double f = beta - std::floor(beta);
  if (f < kMinFraction || f > kMaxFraction) return std::nullopt;
  PoolCut cut;
  cut.in_set = in_set;
  std::sort(members.begin(), members.end(),
            [](const PoolCut::Member& a, const PoolCut::Member& b) { return a.job < b.job; });
  for (size_t i = 0; i + 1 < members.size(); ++i) {
    MALLE_CHECK(members[i].job != members[i + 1].job)
        << "MirCut: job " << members[i].job << " twice";
  }
  cut.delta = delta;
  cut.fraction = f;
  cut.kappa = 1.0 / (delta * (1.0 - f));
  cut.rhs = std::floor(beta);
  for (const PoolCut::Member& m : members) {
    MALLE_CHECK(FindCounted(counted, m.job) == nullptr)
        << "MirCut: job " << m.job << " both counted and a member";
  }
  cut.counted = std::move(counted);
  // Per job: which of its patterns lie inside S, and its held nodes there.
  const int num_jobs = static_cast<int>(model.jobs.size());
  cut.inside_start.assign(num_jobs + 1, 0);
  cut.held.assign(num_jobs, 0);
  for (int j = 0; j < num_jobs; ++j) {
    const JobModel& job = model.jobs[j];
    for (int k = 0; k < static_cast<int>(job.patterns.size()); ++k) {
      if (PatternInside(model, j, k, in_set)) cut.inside_patterns.push_back(k);
    }
    cut.inside_start[j + 1] = static_cast<int>(cut.inside_patterns.size());
    for (size_t p = 0; p < in_set.size(); ++p) {
      if (in_set[p]) cut.held[j] += job.current_per_pool[p];
    }
  }
  for (PoolCut::Member& m : members) {
    // A pattern inside S has its own exact term: not a member's.
    for (size_t k = 0; k < m.patterns.size(); ++k) {
      if (m.patterns[k] && cut.Inside(m.job, static_cast<int>(k))) m.patterns[k] = 0;
    }
    const int u = MostAdded(model, m.job, in_set, m.patterns);
    m.grow = MirF(u / delta, f) - cut.kappa * u;
  }
  cut.members = std::move(members);
  return cut;
}

std::vector<PoolCut> SeparatePoolCuts(const CountModel& model, const LpPoint& point,
                                      double min_violation) {
  const int num_jobs = static_cast<int>(model.jobs.size());
  const int num_pools = static_cast<int>(model.pools.size());
  // The pool sets: each pool, each pattern's pools, every pool.
  std::set<std::vector<char>> sets;
  for (int p = 0; p < num_pools; ++p) {
    std::vector<char> s(num_pools, 0);
    s[p] = 1;
    sets.insert(std::move(s));
  }
  for (const JobModel& job : model.jobs) {
    for (const Pattern& pattern : job.patterns) {
      std::vector<char> s(num_pools, 0);
      for (int p : pattern.pools) s[p] = 1;
      sets.insert(std::move(s));
    }
  }
  sets.insert(std::vector<char>(num_pools, 1));
  // Per job and S: counted or not. Counted (exact in S, or a releaser: it
  // holds nodes in S and does not grow there in the LP): its columns' lows
  // and weights, the shift that complements its heaviest column. Not
  // counted (a releaser too, where that weighs more unshifted): the nodes
  // it releases in S, its growing columns inside S (step, weight), and its
  // patterns meeting S but not inside it (as a member): g, nodes added, u.
  // (Counting every job that grows only inside S as well, measured: 91 of
  // alloc_pools_bench's 100 proven at 0.15 s against 95, not kept.)
  enum class Form { kPlain, kExact, kReleaser };
  struct Job {
    Form form = Form::kPlain;
    std::vector<std::pair<int, double>> lows;  // counted: (low, weight)
    int shift = 0;                             // counted: -low of the heaviest column
    double freed = 0;                          // nodes released in S
    std::vector<std::pair<int, double>> inside;
    std::vector<char> meeting;
    double g = 0, added = 0;
    int most = 0;
  };
  std::vector<PoolCut> cuts;
  std::vector<Job> jobs(num_jobs);
  std::vector<std::vector<char>> inside(num_jobs);
  for (const std::vector<char>& in_set : sets) {
    std::set<int> divisors;
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = model.jobs[j];
      const int num_patterns = static_cast<int>(job.patterns.size());
      Job& jb = jobs[j];
      jb.lows.clear();
      jb.inside.clear();
      jb.g = jb.added = jb.freed = 0;
      jb.most = 0;
      jb.shift = 0;
      jb.form = ExactIn(model, j, in_set) ? Form::kExact : Form::kPlain;
      int held = 0;
      for (int p = 0; p < num_pools; ++p) {
        if (!in_set[p]) continue;
        jb.freed += point.freed[j][p];
        held += job.current_per_pool[p];
      }
      inside[j].assign(num_patterns, 0);
      for (int k = 0; k < num_patterns; ++k) inside[j][k] = PatternInside(model, j, k, in_set);
      jb.meeting.assign(num_patterns, 0);
      for (int k = 0; k < num_patterns; ++k) {
        for (int p : job.patterns[k].pools) jb.meeting[k] = jb.meeting[k] || in_set[p];
      }
      if (jb.form == Form::kPlain && held > 0) {
        bool grows = false;
        for (int k = 0; k < num_patterns; ++k) {
          grows = grows || (jb.meeting[k] && point.grow[j][k] > 1e-9);
        }
        if (!grows) jb.form = Form::kReleaser;
      }
      if (jb.form != Form::kPlain) {
        const CountedShape shape = ShapeIn(model, j, in_set);
        double heaviest = -1;
        for (const LpPoint::Use& use : point.uses[j]) {
          const int low = CountedLow(shape, job.current_nodes, use.count, use.pattern);
          jb.lows.emplace_back(low, use.weight);
          if (use.weight < 1 - 1e-6 && low != 0) divisors.insert(std::abs(low));
          if (use.weight > heaviest) {
            heaviest = use.weight;
            jb.shift = -low;
          }
        }
        if (jb.form == Form::kExact) continue;
      }
      bool fractional_inside = false;
      for (const LpPoint::Step& step : point.steps[j]) {
        if (!inside[j][step.pattern]) continue;
        jb.inside.emplace_back(step.w, step.weight);
        if (step.weight < 1 - 1e-6 && step.w > 0) {
          divisors.insert(step.w);
          fractional_inside = true;
        }
      }
      if (fractional_inside) {
        // Also the most the job can add in S through the patterns inside it.
        const int u = MostAdded(model, j, in_set, inside[j]);
        if (u > 0) divisors.insert(u);
      }
      bool any = false;
      for (int k = 0; k < num_patterns; ++k) {
        if (!jb.meeting[k] || inside[j][k] || !(point.grow[j][k] > 1e-9)) {
          jb.meeting[k] = 0;
          continue;
        }
        any = true;
        jb.g += point.grow[j][k];
        for (int p = 0; p < num_pools; ++p) {
          if (in_set[p]) jb.added += point.add[j][k][p];
        }
      }
      if (!any) continue;
      jb.most = MostAdded(model, j, in_set, jb.meeting);
      if (jb.g > 1e-6 && jb.g < 1 - 1e-6 && jb.most > 0 && jb.added > 1e-9) {
        divisors.insert(jb.most);
      }
    }
    if (divisors.empty()) continue;
    const double room = Room(model, in_set);
    // Counted jobs unshifted (0), shifted by what their heaviest column
    // releases (1), or by minus its low whatever its sign (2): the sums of
    // their shifts, and whether a kind differs from the one before it (1
    // from 0 only where some shift is positive, 2 from 1 where one is
    // negative; an identical kind would find the same cut again).
    int total[3] = {0, 0, 0};
    bool differs[3] = {true, false, false};
    for (const Job& jb : jobs) {
      if (jb.form == Form::kPlain) continue;
      total[1] += std::max(0, jb.shift);
      total[2] += jb.shift;
      differs[1] = differs[1] || jb.shift > 0;
      differs[2] = differs[2] || jb.shift < 0;
    }
    // The most violated candidate; its cut (MirCut) is built once, below.
    struct Candidate {
      std::vector<PoolCut::Member> members;
      std::vector<PoolCut::Counted> counted;
      int d = 0;
    };
    std::optional<Candidate> best;
    double best_violation = min_violation;
    for (int d : divisors) {
      for (const int shifted : {0, 1, 2}) {
        if (!differs[shifted]) continue;
        auto shift_of = [shifted](const Job& jb) {
          return shifted == 0 ? 0 : shifted == 1 ? std::max(0, jb.shift) : jb.shift;
        };
        const double beta = (room + total[shifted]) / d;
        const double f = beta - std::floor(beta);
        if (f < kMinFraction || f > kMaxFraction) continue;
        const double kappa = 1.0 / (d * (1.0 - f));
        std::vector<PoolCut::Member> members;
        std::vector<PoolCut::Counted> counted;
        double lhs = 0;
        for (int j = 0; j < num_jobs; ++j) {
          const Job& jb = jobs[j];
          if (jb.form != Form::kPlain) {
            const int shift = shift_of(jb);
            double term = 0;
            for (const auto& [low, weight] : jb.lows)
              term += MirF(static_cast<double>(low + shift) / d, f) * weight;
            // A releaser unshifted: counted or by its released nodes,
            // whichever weighs more.
            if (jb.form == Form::kExact || shift != 0 || term >= -kappa * jb.freed) {
              counted.push_back({j, shift});
              lhs += term;
              continue;
            }
          }
          lhs -= kappa * jb.freed;
          for (const auto& [w, weight] : jb.inside)
            lhs += MirF(static_cast<double>(w) / d, f) * weight;
          if (jb.most == 0) continue;
          const double term = MirF(static_cast<double>(jb.most) / d, f) * jb.g -
                              kappa * (jb.most * jb.g - jb.added);
          if (term > 1e-12) {
            members.push_back({j, jb.meeting, 0.0});
            lhs += term;
          }
        }
        const double violation = lhs - std::floor(beta);
        if (violation > best_violation) {
          best_violation = violation;
          best = Candidate{std::move(members), std::move(counted), d};
        }
      }
    }
    if (!best) continue;
    if (std::optional<PoolCut> cut =
            MirCut(model, in_set, std::move(best->members), best->d, std::move(best->counted))) {
      cuts.push_back(*std::move(cut));
    }
  }
  return cuts;
}

namespace {

// One column of the master: job j at option o with split x (option -1: the
// job's artificial column, which keeps every node's master feasible).
struct Column {
  int job = 0;
  int option = 0;
  std::vector<int> x;
};

// A branching decision on one job's options.
struct Decision {
  enum Kind { kCountAtMost, kCountAtLeast, kOnlyOption, kNotOption, kOnlyPattern, kNotPattern };
  int job;
  Kind kind;
  int param;

  bool Allows(const Option& opt, int o) const {
    switch (kind) {
      case kCountAtMost:
        return opt.nodes <= param;
      case kCountAtLeast:
        return opt.nodes >= param;
      case kOnlyOption:
        return o == param;
      case kNotOption:
        return o != param;
      case kOnlyPattern:
        return opt.pattern == param;
      case kNotPattern:
        return opt.pattern != param;
    }
    return true;
  }
};

// Options fixed out of a subtree by a node's Lagrangian bound (global
// option ids), shared by the node's descendants: each node stores only
// what it added.
struct FixChain {
  std::shared_ptr<const FixChain> parent;
  std::vector<int> fixed;
};

struct Node {
  std::vector<Decision> decisions;
  double bound;  // the parent's (an upper bound on the node's optimum)
  int depth;
  std::shared_ptr<const FixChain> fix;  // null: nothing fixed at the nodes above
};

// Jobs the model cannot tell apart (same options, values, patterns and
// held nodes): swapping their allocations changes nothing.
bool Twins(const JobModel& a, const JobModel& b) {
  if (a.min_nodes != b.min_nodes || a.max_nodes != b.max_nodes ||
      a.requested_max_nodes != b.requested_max_nodes || a.current_nodes != b.current_nodes ||
      a.current_batch_option != b.current_batch_option || a.current_option != b.current_option ||
      a.current_samples_per_s != b.current_samples_per_s ||
      a.current_per_pool != b.current_per_pool || a.patterns.size() != b.patterns.size() ||
      a.options.size() != b.options.size()) {
    return false;
  }
  for (size_t k = 0; k < a.patterns.size(); ++k) {
    const Pattern &x = a.patterns[k], &y = b.patterns[k];
    if (x.speed != y.speed || x.horizon_s != y.horizon_s || x.locality != y.locality ||
        x.factor != y.factor || x.pools != y.pools) {
      return false;
    }
  }
  for (size_t o = 0; o < a.options.size(); ++o) {
    const Option &x = a.options[o], &y = b.options[o];
    if (x.nodes != y.nodes || x.pattern != y.pattern || x.batch_option != y.batch_option ||
        x.samples_per_s != y.samples_per_s || x.value != y.value) {
      return false;
    }
  }
  return true;
}

double Gap(double bound, double objective) {
  return (bound - objective) / std::max(std::fabs(objective), 1e-12);
}

}  // namespace

absl::StatusOr<DecompositionResult> SolveByDecomposition(const CountModel& model,
                                                         const CountSolution& start,
                                                         const DecompositionSettings& settings) {
  const int num_jobs = static_cast<int>(model.jobs.size());
  const int num_pools = static_cast<int>(model.pools.size());
  const double gap = settings.relative_gap;
  DecompositionResult out;
  out.solution = start;
  out.bound = kInf;
  // Nodes whose bound is below this cannot improve the answer by more than
  // the gap.
  auto threshold = [&] {
    return out.solution.objective + gap * std::max(std::fabs(out.solution.objective), 1e-12);
  };

  // Scaled like the count formulation: the largest |value| becomes 1e3.
  double largest = 0;
  for (const JobModel& job : model.jobs) {
    for (const Option& o : job.options) largest = std::max(largest, std::fabs(o.value));
  }
  const double scale = largest > 0 ? 1e3 / largest : 1.0;
  // An artificial column per job (no nodes, this value) keeps the master
  // feasible whatever a node forbids; worth less than losing every job's
  // best option, so an LP optimum uses it only where nothing else fits.
  const double artificial = -2.0 * (1e3 * (num_jobs + 1));

  JobPricer pricer(model);
  // Twins, in index order per group (twin_pos: a job's place in its group,
  // -1 for a job without twins). Searched is only where some allocation
  // gives twins non-increasing counts in index order: any allocation becomes
  // one by swapping twins' allocations, at the same value, so the optimum is
  // among them. Every branch on one twin's count then also bounds the
  // others' (count <= t for the twins after it, >= t for those before):
  // without that the search visits each way of choosing which of k
  // identical waiting jobs start, k! times over (the bench's mix has up to
  // 25 copies of a job).
  std::vector<std::vector<int>> twin_groups;
  std::vector<int> twin_group(num_jobs, -1), twin_pos(num_jobs, -1);
  if (settings.twins) {
    std::map<std::tuple<int, int, size_t, double>, std::vector<int>> buckets;
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = model.jobs[j];
      buckets[{job.current_nodes, job.current_option, job.options.size(), job.options.back().value}]
          .push_back(j);
    }
    for (const auto& [key, members] : buckets) {
      std::vector<char> taken(members.size(), 0);
      for (size_t a = 0; a < members.size(); ++a) {
        if (taken[a]) continue;
        std::vector<int> group = {members[a]};
        for (size_t b = a + 1; b < members.size(); ++b) {
          if (!taken[b] && Twins(model.jobs[members[a]], model.jobs[members[b]])) {
            taken[b] = 1;
            group.push_back(members[b]);
          }
        }
        if (group.size() < 2) continue;
        for (size_t i = 0; i < group.size(); ++i) {
          twin_group[group[i]] = static_cast<int>(twin_groups.size());
          twin_pos[group[i]] = static_cast<int>(i);
        }
        twin_groups.push_back(std::move(group));
      }
    }
  }
  long long twin_decisions = 0;
  // The decisions a branch on one twin implies for the others (above).
  auto add_implied = [&](std::vector<Decision>& decisions, const Decision& d) {
    const int g = twin_group[d.job];
    if (g < 0) return;
    const std::vector<int>& group = twin_groups[g];
    const int pos = twin_pos[d.job];
    const JobModel& job = model.jobs[d.job];
    if (d.kind == Decision::kCountAtMost ||
        (d.kind == Decision::kOnlyOption && d.param == job.current_option &&
         job.current_option != 0)) {
      const int t = d.kind == Decision::kCountAtMost ? d.param : job.current_nodes;
      for (size_t i = pos + 1; i < group.size(); ++i) {
        decisions.push_back({group[i], Decision::kCountAtMost, t});
        ++twin_decisions;
      }
    } else if (d.kind == Decision::kCountAtLeast) {
      for (int i = 0; i < pos; ++i) {
        decisions.push_back({group[i], Decision::kCountAtLeast, d.param});
        ++twin_decisions;
      }
    }
  };
  // L at zero prices (every job at its best option, nodes free): finite and
  // valid before any LP is solved.
  const double free_bound = LagrangianBound(model, pricer, std::vector<double>(num_pools, 0.0));
  // The master's rows: one per job still in it (job_row), then one per
  // pool (from pool_row0). A job the fixing leaves a single option with a
  // fixed split (stop, or stay) leaves the master when it is rebuilt: its
  // nodes come off the pools' rows, its score enters L as a constant.
  std::vector<int> job_row(num_jobs);
  for (int j = 0; j < num_jobs; ++j) job_row[j] = j;
  int pool_row0 = num_jobs;
  std::vector<int> fixed_option(num_jobs, -1);  // >= 0: out of the master
  // MIR cuts on pool sets (PoolCut), separated at the root: rows after the
  // pools'. A job out of the master moves its coefficient to the row's
  // bound, as its held nodes do on the pools' rows.
  std::vector<PoolCut> cuts;
  auto fixed_split = [&](int j) {
    return fixed_option[j] > 0 ? model.jobs[j].current_per_pool : std::vector<int>(num_pools, 0);
  };
  // A cut row's bound in the master: its right-hand side less the
  // coefficients of the jobs out of it.
  auto cut_bound = [&](const PoolCut& cut) {
    double left = cut.rhs;
    for (int j = 0; j < num_jobs; ++j) {
      if (fixed_option[j] >= 0) left -= cut.Coefficient(model, j, fixed_option[j], fixed_split(j));
    }
    return left;
  };
  auto master_rows = [&] {
    std::vector<double> lb, ub;
    for (int j = 0; j < num_jobs; ++j) {
      if (fixed_option[j] >= 0) continue;
      lb.push_back(1.0);
      ub.push_back(1.0);
    }
    for (int p = 0; p < num_pools; ++p) {
      int left = model.pools[p].capacity;
      for (int j = 0; j < num_jobs; ++j) {
        if (fixed_option[j] > 0) left -= model.jobs[j].current_per_pool[p];
      }
      lb.push_back(-kInf);
      ub.push_back(left);
    }
    for (const PoolCut& cut : cuts) {
      lb.push_back(-kInf);
      ub.push_back(cut_bound(cut));
    }
    return std::make_pair(lb, ub);
  };
  std::unique_ptr<ColumnLp> master_lp;
  {
    const auto [lb, ub] = master_rows();
    master_lp = std::make_unique<ColumnLp>(lb, ub);
  }
  std::vector<Column> columns;
  std::vector<std::vector<int>> job_columns(num_jobs);  // by job
  std::vector<std::set<std::pair<int, std::vector<int>>>> seen(num_jobs);
  // Puts column (j, o, x) into the master LP (not into `columns`).
  auto lp_column = [&](int j, int o, const std::vector<int>& x, double ub) {
    std::vector<int> rows = {job_row[j]};
    std::vector<double> vals = {1.0};
    for (int p = 0; p < num_pools; ++p) {
      if (x[p] == 0) continue;
      rows.push_back(pool_row0 + p);
      vals.push_back(x[p]);
    }
    for (size_t c = 0; c < cuts.size(); ++c) {
      const double v = cuts[c].Coefficient(model, j, o, x);
      if (v == 0) continue;
      rows.push_back(pool_row0 + num_pools + static_cast<int>(c));
      vals.push_back(v);
    }
    // No upper bound of 1 (the job's row keeps the column below it): a
    // column at an upper bound would leave the job row's dual free to be
    // anything below its value, and pricing needs the true one.
    master_lp->AddColumn(rows, vals, o < 0 ? artificial : model.jobs[j].options[o].value * scale,
                         0.0, ub);
  };
  auto add_column = [&](int j, int o, std::vector<int> x, double ub) {
    if (!seen[j].insert({o, x}).second) return false;
    lp_column(j, o, x, ub);
    job_columns[j].push_back(static_cast<int>(columns.size()));
    columns.push_back({j, o, std::move(x)});
    return true;
  };
  for (int j = 0; j < num_jobs; ++j) {
    add_column(j, -1, std::vector<int>(num_pools, 0), kInf);
    add_column(j, 0, std::vector<int>(num_pools, 0), kInf);
    if (start.option[j] != 0) add_column(j, start.option[j], start.per_pool[j], kInf);
  }

  // The decisions of the node being solved, by job.
  std::vector<std::vector<const Decision*>> rules(num_jobs);
  // Reduced-cost fixing with the root's prices: an allocation that gives
  // job j option o is worth at most root_l - shortfall[j][o] (its score's
  // shortfall from the job's best at those prices), so once that is below
  // the threshold the option is out of every node.
  double root_l = kInf;
  std::vector<std::vector<double>> shortfall;
  std::vector<std::vector<char>> banned;  // by the threshold of banned_at
  double banned_at = -kInf;
  // Each job's options that reduced-cost fixing leaves, per pattern by
  // increasing count: what pricing walks (all of them before the root's
  // fixing; after it most are out: 70-95 % on the bench's instances).
  std::vector<std::vector<std::vector<int>>> active(num_jobs);
  for (int j = 0; j < num_jobs; ++j) {
    for (int k = 0; k < static_cast<int>(model.jobs[j].patterns.size()); ++k) {
      active[j].push_back(pricer.PatternOptions(j, k));
    }
  }
  // node_options' copies are valid (cleared at each node and when the
  // fixing changes).
  std::vector<char> node_opts_ok(num_jobs, 0);
  auto refresh_banned = [&] {
    if (shortfall.empty() || threshold() <= banned_at) return;
    banned_at = threshold();
    banned.resize(num_jobs);
    for (int j = 0; j < num_jobs; ++j) {
      banned[j].resize(shortfall[j].size());
      for (size_t o = 0; o < shortfall[j].size(); ++o) {
        // Or-ed: the root's prices may change (cuts), and an option once
        // fixed out stays out (pricing walks `active`, which only shrinks).
        banned[j][o] = banned[j][o] || root_l - shortfall[j][o] < banned_at;
      }
      for (std::vector<int>& opts : active[j]) {
        opts.erase(std::remove_if(opts.begin(), opts.end(), [&](int o) { return banned[j][o]; }),
                   opts.end());
      }
    }
    std::fill(node_opts_ok.begin(), node_opts_ok.end(), 0);
  };
  // Global option ids, and the options fixed out of the current node's
  // subtree by its ancestors' bounds (node_fixed_jobs: the jobs concerned).
  std::vector<int> option_base(num_jobs + 1, 0);
  for (int j = 0; j < num_jobs; ++j) {
    option_base[j + 1] = option_base[j] + static_cast<int>(model.jobs[j].options.size());
  }
  std::vector<char> node_fixed(option_base[num_jobs], 0), node_fixed_job(num_jobs, 0);
  auto allowed = [&](int j, int o) {
    if (o < 0) return true;
    if (!banned.empty() && banned[j][o]) return false;
    if (node_fixed[option_base[j] + o]) return false;
    const Option& opt = model.jobs[j].options[o];
    for (const Decision* d : rules[j]) {
      if (!d->Allows(opt, o)) return false;
    }
    return true;
  };
  // What pricing walks for job j at this node: `active`, less what the
  // node's decisions forbid (a copy only for the few jobs they concern).
  std::vector<std::vector<std::vector<int>>> node_opts(num_jobs);
  auto node_options = [&](int j) -> const std::vector<std::vector<int>>& {
    if (rules[j].empty() && !node_fixed_job[j]) return active[j];
    std::vector<std::vector<int>>& mine = node_opts[j];
    if (node_opts_ok[j]) return mine;
    node_opts_ok[j] = 1;
    mine.resize(active[j].size());
    for (size_t k = 0; k < active[j].size(); ++k) {
      mine[k].clear();
      for (int o : active[j][k]) {
        if (allowed(j, o)) mine[k].push_back(o);
      }
    }
    return mine;
  };

  std::vector<double> pi(num_pools, 0.0);
  // The cut rows' duals and what they add to each job's pricing (terms:
  // none while every dual is 0).
  std::vector<double> mu;
  std::vector<JobCutTerms> cut_terms;
  bool with_terms = false;
  auto terms = [&](int j) -> const JobCutTerms* { return with_terms ? &cut_terms[j] : nullptr; };
  // The last pricing round's scores (by global option id, for the options
  // it priced) and each job's best allowed score: the node's fixing.
  std::vector<double> node_score(option_base[num_jobs], -kInf), job_best(num_jobs, -kInf);
  int lp_solves = 0, nodes_done = 0, pruned = 0, leaves = 0, root_rounds = 0;
  double root_bound = kInf;
  double last_l = kInf;  // L at the last prices solve_node priced with
  double pruned_bound = -kInf;  // the largest bound of a pruned node
  auto prune = [&](double bound) {
    ++pruned;
    pruned_bound = std::max(pruned_bound, bound);
  };
  // Solves the node's master by column generation. Returns its bound (the
  // least Lagrangian bound seen: valid for the node whatever the LP does),
  // and the LP's column values in `x` when the generation converged (empty
  // when the node was pruned early or time ran out).
  std::vector<std::pair<double, int>> by_pattern, picks;
  std::vector<double> score;
  auto solve_node = [&](std::vector<double>& x) -> absl::StatusOr<double> {
    x.clear();
    double bound = kInf;
    for (int round = 0;; ++round) {
      MALLE_ASSIGN_OR_RETURN(LpResult lp, master_lp->Solve());
      ++lp_solves;
      if (nodes_done == 0) ++root_rounds;
      if (!lp.optimal) {
        return absl::InternalError(
            absl::StrCat("decomposition: master LP not solved by Clp (status ", lp.status, ", ",
                         cuts.size(), " cuts)"));
      }
      for (int p = 0; p < num_pools; ++p)
        pi[p] = std::max(0.0, lp.row_duals[pool_row0 + p]) / scale;
      double l = 0;
      for (int p = 0; p < num_pools; ++p) l += pi[p] * model.pools[p].capacity;
      mu.assign(cuts.size(), 0.0);
      with_terms = false;
      for (size_t c = 0; c < cuts.size(); ++c) {
        mu[c] = std::max(0.0, lp.row_duals[pool_row0 + num_pools + c]) / scale;
        l += mu[c] * cuts[c].rhs;
        with_terms = with_terms || mu[c] > 0;
      }
      if (with_terms) CutTerms(model, cuts, mu, cut_terms);
      const double tol = 1e-9 * 1e3;
      const std::vector<int> by_price = PoolsByPrice(pi);
      int added = 0;
      for (int j = 0; j < num_jobs; ++j) {
        // The best allowed score goes into L; columns with a positive
        // reduced cost: the best option of each pattern, the few best of
        // those. A job out of the master is priced the same way (L must
        // not depend on which jobs the master holds: it is valid for any
        // prices, the master only supplies them), and gets no columns.
        constexpr size_t kPerJob = 3;
        const JobModel& job = model.jobs[j];
        const bool in_master = fixed_option[j] < 0;
        const double dual = in_master ? lp.row_duals[job_row[j]] : kInf;
        double best = -kInf;
        picks.clear();
        if (allowed(j, 0)) {
          const double stop = pricer.StopScore(j, terms(j));
          best = std::max(best, stop);
          const double rc = stop * scale - dual;
          if (rc > tol) picks.emplace_back(rc, 0);
        }
        pricer.BestByPattern(j, pi, by_price, node_options(j), by_pattern,
                             &node_score[option_base[j]], terms(j));
        for (const auto& [v, o] : by_pattern) {
          if (o < 0) continue;
          best = std::max(best, v);
          const double rc = v * scale - dual;
          if (rc > tol) picks.emplace_back(rc, o);
        }
        // L takes each job's best real option, not the artificial column's
        // value when that is higher: the artificial is no allocation, and
        // flooring at it inflated L whenever prices were high (a job out
        // of the master, whose held nodes the prices charge, gave up to
        // 6e10 too much). Only a job with no option allowed at all is
        // floored there (no allocation in the node: L far below anything).
        if (!(best > -kInf)) best = artificial / scale;
        l += best;
        job_best[j] = best;
        if (!in_master) continue;
        std::sort(picks.begin(), picks.end(), std::greater<>());
        for (size_t i = 0; i < picks.size() && i < kPerJob; ++i) {
          const int o = picks[i].second;
          added += add_column(j, o, pricer.Split(j, o, pi, by_price, terms(j)), kInf) ? 1 : 0;
        }
      }
      bound = std::min(bound, l);
      last_l = l;
      if (bound <= threshold()) return bound;  // pruned
      if (added == 0) {
        x = std::move(lp.x);
        return bound;
      }
      if (absl::Now() > settings.deadline) return bound;
    }
  };

  // Incumbents by rounding: every job takes the mode of its heaviest LP
  // column, the flow decides the counts.
  int rounded = 0, rounded_better = 0;
  double searched_from = kInf;  // the incumbent the last local search ended with
  int ls_flows = 0;
  double ls_gain = 0;
  // Where the time goes (in the detail string): the root's column
  // generation, the local search, and the whole solve.
  const absl::Time t_start = absl::Now();
  absl::Duration root_time, ls_time;
  ModeFlow round_flow(model, pricer);
  auto flow_round = [&](const std::vector<double>& lp_x) {
    std::vector<Mode> modes(num_jobs);
    for (int j = 0; j < num_jobs; ++j) {
      if (fixed_option[j] >= 0) modes[j] = OptionMode(model.jobs[j], fixed_option[j]);
    }
    std::vector<double> weight(num_jobs, 0.0);
    for (int c = 0; c < static_cast<int>(lp_x.size()); ++c) {
      const Column& col = columns[c];
      if (col.option < 0 || lp_x[c] <= weight[col.job]) continue;
      weight[col.job] = lp_x[c];
      const JobModel& job = model.jobs[col.job];
      modes[col.job] = {job.options[col.option].pattern, OptionDirection(job, col.option)};
    }
    ++rounded;
    if (!round_flow.Solve(modes) || !(round_flow.objective() > out.solution.objective)) return;
    CountSolution sol = round_flow.Solution();
    if (CheckSolution(model, sol).ok()) {
      out.solution = std::move(sol);
      ++rounded_better;
    }
  };

  // The local search over modes from the incumbent: after the root, and
  // again whenever a rounding or a leaf improves the incumbent (its modes
  // come from one LP optimum, and a few switches often complete it: the
  // optimum of rep 4 of the bench was found at node 1,972 of 1,973 by a
  // rounding, and is found at once by a search from an earlier one).
  auto local_search = [&] {
    // Each job's modes that some option of the root's reduced costs
    // leaves, best first, bounded by the root's L less their shortfall.
    std::vector<std::vector<ModeCandidate>> candidates(num_jobs);
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = model.jobs[j];
      std::vector<ModeCandidate>& mine = candidates[j];
      for (int o = 0; o < static_cast<int>(job.options.size()); ++o) {
        const double b = root_l - shortfall[j][o];
        if (!(b > out.solution.objective)) continue;
        const Mode m = OptionMode(job, o);
        auto it = std::find_if(mine.begin(), mine.end(),
                               [&m](const ModeCandidate& c) { return SameMode(c.mode, m); });
        if (it == mine.end()) {
          mine.push_back({m, b});
        } else {
          it->bound = std::max(it->bound, b);
        }
      }
      std::stable_sort(
          mine.begin(), mine.end(),
          [](const ModeCandidate& a, const ModeCandidate& b) { return a.bound > b.bound; });
      // A job with nothing left keeps its mode (no empty list: that
      // would mean every mode).
      if (mine.empty()) mine.push_back({OptionMode(job, out.solution.option[j]), -kInf});
    }
    // The jobs the incumbent serves worst (largest shortfall) first.
    std::vector<int> order(num_jobs);
    for (int j = 0; j < num_jobs; ++j) order[j] = j;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return shortfall[a][out.solution.option[a]] > shortfall[b][out.solution.option[b]];
    });
    const absl::Time now = absl::Now();
    const absl::Time until = settings.deadline == absl::InfiniteFuture()
                                 ? absl::InfiniteFuture()
                                 : now + (settings.deadline - now) * settings.local_search_share;
    int flows = 0;
    const double before = out.solution.objective;
    out.solution = ImproveModes(model, pricer, out.solution, candidates, order, until, &flows);
    ls_time += absl::Now() - now;
    ls_flows += flows;
    ls_gain += out.solution.objective - before;
    refresh_banned();
  };

  // Best-first over open nodes (largest bound first), plunging.
  auto worse = [](const Node& a, const Node& b) { return a.bound < b.bound; };
  std::vector<Node> open;
  std::optional<Node> plunge = Node{{}, kInf, 0, nullptr};
  long long node_fixings = 0;
  std::vector<double> x;
  bool out_of_time = false;
  std::vector<int> ruled;     // the jobs the last node's decisions concern
  double compact_at = -kInf;  // banned_at when the master was last checked
  int compactions = 0;
  std::shared_ptr<const FixChain> current_fix;  // the fixings marked in node_fixed
  std::vector<int> option_job(option_base[num_jobs]);
  for (int j = 0; j < num_jobs; ++j) {
    for (int id = option_base[j]; id < option_base[j + 1]; ++id) option_job[id] = j;
  }
  double bounds_at = std::nan("");  // banned_at when every bound was last set
  // A new master LP over `columns` (after the fixing dropped some, or with
  // new cut rows): a cold solve once.
  int lp_retries = 0, lp_repairs = 0;  // ColumnLp's counts of the masters rebuilt
  auto rebuild_master = [&] {
    lp_retries += master_lp->cold_retries();
    lp_repairs += master_lp->repaired_solves();
    const auto [lb, ub] = master_rows();
    master_lp = std::make_unique<ColumnLp>(lb, ub);
    for (auto& jc : job_columns) jc.clear();
    for (int c = 0; c < static_cast<int>(columns.size()); ++c) {
      lp_column(columns[c].job, columns[c].option, columns[c].x, kInf);
      job_columns[columns[c].job].push_back(c);
    }
    bounds_at = std::nan("");  // every bound to be set
  };
  // Where the LP optimum x stands for the cuts (SeparatePoolCuts).
  auto lp_point = [&](const std::vector<double>& lp_x) {
    LpPoint point;
    point.grow.resize(num_jobs);
    point.add.resize(num_jobs);
    point.freed.assign(num_jobs, std::vector<double>(num_pools, 0.0));
    point.steps.assign(num_jobs, {});
    point.uses.assign(num_jobs, {});
    for (int j = 0; j < num_jobs; ++j) {
      const size_t patterns = model.jobs[j].patterns.size();
      point.grow[j].assign(patterns, 0.0);
      point.add[j].assign(patterns, std::vector<double>(num_pools, 0.0));
    }
    auto visit = [&](int j, int o, const std::vector<int>& split, double w) {
      const JobModel& job = model.jobs[j];
      point.uses[j].push_back(
          {o > 0 ? job.options[o].nodes : 0, o > 0 ? job.options[o].pattern : -1, w});
      const bool grows = o > 0 && job.options[o].nodes > job.current_nodes;
      const int k = grows ? job.options[o].pattern : -1;
      if (grows) {
        point.grow[j][k] += w;
        point.steps[j].push_back({k, job.options[o].nodes - job.current_nodes, w});
      }
      for (int p = 0; p < num_pools; ++p) {
        if (grows) point.add[j][k][p] += w * std::max(0, split[p] - job.current_per_pool[p]);
        point.freed[j][p] += w * std::max(0, job.current_per_pool[p] - split[p]);
      }
    };
    for (int c = 0; c < static_cast<int>(lp_x.size()); ++c) {
      if (lp_x[c] > 1e-9) visit(columns[c].job, columns[c].option, columns[c].x, lp_x[c]);
    }
    for (int j = 0; j < num_jobs; ++j) {
      if (fixed_option[j] >= 0) visit(j, fixed_option[j], fixed_split(j), 1.0);
    }
    return point;
  };
  int cut_rounds_done = 0, dropped_cuts = 0;
  while (plunge || !open.empty()) {
    Node node;
    if (plunge) {
      node = std::move(*plunge);
      plunge.reset();
    } else {
      std::pop_heap(open.begin(), open.end(), worse);
      node = std::move(open.back());
      open.pop_back();
    }
    if (node.bound <= threshold()) {
      prune(node.bound);
      continue;
    }
    if (absl::Now() > settings.deadline) {
      open.push_back(std::move(node));
      std::push_heap(open.begin(), open.end(), worse);
      out_of_time = true;
      break;
    }
    refresh_banned();
    // Columns of options the fixing took out of every node only weigh on
    // Clp (each solve's set-up is linear in the columns): when they are
    // more than half, the master is rebuilt without them (a cold solve
    // once; 60 % of the columns at 1,000 jobs after the root).
    if (compact_at != banned_at && !banned.empty()) {
      compact_at = banned_at;
      // Jobs left with one option whose split is fixed (stop, or stay:
      // a stay keeps exactly the nodes it holds).
      std::vector<int> single(num_jobs, -1);
      int new_fixed = 0, free_jobs = 0;
      for (int j = 0; j < num_jobs; ++j) {
        if (fixed_option[j] >= 0) continue;
        ++free_jobs;
        int n = 0, last = -1;
        for (int o = 0; o < static_cast<int>(banned[j].size()) && n < 2; ++o) {
          if (!banned[j][o]) {
            ++n;
            last = o;
          }
        }
        if (n == 1 && (last == 0 || last == model.jobs[j].current_option)) {
          single[j] = last;
          ++new_fixed;
        }
      }
      int out_cols = 0;
      for (const Column& c : columns) {
        out_cols += c.option >= 0 && (banned[c.job][c.option] || single[c.job] >= 0);
      }
      if (2 * out_cols > static_cast<int>(columns.size()) || 4 * new_fixed > free_jobs) {
        for (int j = 0; j < num_jobs; ++j) {
          if (single[j] >= 0) fixed_option[j] = single[j];
        }
        int row = 0;
        for (int j = 0; j < num_jobs; ++j) job_row[j] = fixed_option[j] >= 0 ? -1 : row++;
        pool_row0 = row;
        std::vector<Column> kept;
        kept.reserve(columns.size() - out_cols);
        for (Column& c : columns) {
          if (fixed_option[c.job] < 0 && (c.option < 0 || !banned[c.job][c.option])) {
            kept.push_back(std::move(c));
          }
        }
        columns = std::move(kept);
        rebuild_master();
        ++compactions;
      }
    }
    for (int j : ruled) rules[j].clear();
    for (const Decision& d : node.decisions) rules[d.job].push_back(&d);
    std::fill(node_opts_ok.begin(), node_opts_ok.end(), 0);
    // The node's fixings replace the last node's. `ruled` collects the
    // jobs the last node's decisions and fixings concern, and this one's.
    for (const FixChain* f = current_fix.get(); f != nullptr; f = f->parent.get()) {
      for (int id : f->fixed) {
        node_fixed[id] = 0;
        ruled.push_back(option_job[id]);
      }
    }
    std::fill(node_fixed_job.begin(), node_fixed_job.end(), 0);
    current_fix = node.fix;
    for (const FixChain* f = current_fix.get(); f != nullptr; f = f->parent.get()) {
      for (int id : f->fixed) {
        node_fixed[id] = 1;
        node_fixed_job[option_job[id]] = 1;
        ruled.push_back(option_job[id]);
      }
    }
    for (const Decision& d : node.decisions) ruled.push_back(d.job);
    std::sort(ruled.begin(), ruled.end());
    ruled.erase(std::unique(ruled.begin(), ruled.end()), ruled.end());
    // The columns' bounds: all of them when the root's fixing changed,
    // else only those of the jobs in `ruled` (the others' bounds cannot
    // have changed; a full pass at every node was 6 % of the run at 1,000
    // jobs, ~10,000 columns, and 4 % at 100 jobs with the fixings at
    // nodes).
    auto set_bounds = [&](int j) {
      for (int c : job_columns[j]) {
        master_lp->SetColumnUpper(c, allowed(j, columns[c].option) ? kInf : 0.0);
      }
    };
    if (bounds_at != banned_at) {
      for (int j = 0; j < num_jobs; ++j) set_bounds(j);
      bounds_at = banned_at;
    } else {
      for (int j : ruled) set_bounds(j);
    }
    // (The next node adds this one's fixings as it clears them.)
    ruled.clear();
    for (const Decision& d : node.decisions) ruled.push_back(d.job);
    MALLE_ASSIGN_OR_RETURN(double bound, solve_node(x));
    // The root's final prices (L there is the LP's value): the reduced
    // costs every node's fixing and the local search use.
    auto root_prices = [&] {
      root_time = absl::Now() - t_start;
      root_bound = bound;
      if (x.empty()) return;
      root_l = last_l;
      shortfall.assign(num_jobs, {});
      const std::vector<int> by_price = PoolsByPrice(pi);
      for (int j = 0; j < num_jobs; ++j) {
        pricer.Scores(j, pi, by_price, score, terms(j));
        // The best score L took for the job: over the options still allowed
        // (after the cuts' rounds the first fixing has taken some out, and a
        // shortfall from an option L did not count would fix too much).
        const double best = job_best[j];
        shortfall[j].resize(score.size());
        for (size_t o = 0; o < score.size(); ++o) shortfall[j][o] = best - score[o];
      }
    };
    if (nodes_done == 0) root_prices();
    refresh_banned();
    // A rounding at every node: with ModeFlow's cached envelopes a flow
    // costs 20-50 us, a node 0.4-3 ms (it was every 8th node when a flow
    // cost as much as a node).
    if (!x.empty() && bound > threshold()) flow_round(x);
    if (settings.local_search && !shortfall.empty() && bound > threshold() &&
        (nodes_done == 0 || searched_from < out.solution.objective)) {
      local_search();
      searched_from = out.solution.objective;
    }
    // At the root, after the local search (so that the incumbent can end
    // the rounds early): rounds of MIR cuts on the pools' capacities
    // (PoolCut) while the LP violates some, for at most half of the
    // time left and settings.cut_rounds rounds. Rounds that close little
    // of the gap are not a reason to stop: on full pools the LP moves its
    // fraction from job to job, and the third or fourth round proves what
    // two did not (docs/benchmarks.md, issue 27, thirteenth look). Then the
    // cuts whose dual is 0 leave (their dense rows only slow Clp down), and
    // the root's prices, now with the cuts' duals, fix options again.
    if (nodes_done == 0 && settings.cut_rounds > 0 && !x.empty()) {
      const absl::Time cut_start = absl::Now();
      const absl::Time cut_until = settings.deadline == absl::InfiniteFuture()
                                       ? absl::InfiniteFuture()
                                       : cut_start + (settings.deadline - cut_start) / 2;
      while (cut_rounds_done < settings.cut_rounds && !x.empty() && bound > threshold() &&
             absl::Now() < cut_until) {
        std::vector<PoolCut> found = SeparatePoolCuts(model, lp_point(x), 1e-3);
        if (found.empty()) break;
        ++cut_rounds_done;
        for (PoolCut& cut : found) {
          // Its row over the columns so far (ColumnLp::AddRow; a warm solve).
          std::vector<int> cols;
          std::vector<double> vals;
          for (int c = 0; c < static_cast<int>(columns.size()); ++c) {
            const double v =
                cut.Coefficient(model, columns[c].job, columns[c].option, columns[c].x);
            if (v == 0) continue;
            cols.push_back(c);
            vals.push_back(v);
          }
          const int row = master_lp->AddRow(cols, vals, -kInf, cut_bound(cut));
          MALLE_CHECK(row == pool_row0 + num_pools + static_cast<int>(cuts.size()))
              << "decomposition: cut row " << row << " out of place";
          cuts.push_back(std::move(cut));
        }
        MALLE_ASSIGN_OR_RETURN(const double b, solve_node(x));
        bound = std::min(bound, b);
      }
      if (!cuts.empty()) {
        if (!x.empty()) {
          std::vector<PoolCut> kept;
          for (size_t c = 0; c < cuts.size(); ++c) {
            if (mu[c] > 0) kept.push_back(std::move(cuts[c]));
          }
          dropped_cuts += static_cast<int>(cuts.size() - kept.size());
          cuts = std::move(kept);
          root_prices();
          banned_at = -kInf;  // fix again at the new prices
          refresh_banned();
          if (bound > threshold()) flow_round(x);
        }
        // (cut_terms stay those of the last pricing, which the root's
        // branching and fixing below read with job_best and last_l.)
        rebuild_master();
      }
    }
    ++nodes_done;
    node.bound = std::min(node.bound, bound);
    if (node.bound <= threshold()) {
      prune(node.bound);
      continue;
    }
    if (x.empty()) {  // out of time inside the node
      open.push_back(std::move(node));
      std::push_heap(open.begin(), open.end(), worse);
      out_of_time = true;
      break;
    }
    // Each job's columns in the LP optimum.
    constexpr double kUsed = 1e-7;
    std::vector<std::vector<std::pair<double, int>>> used(num_jobs);  // (weight, column)
    for (int c = 0; c < static_cast<int>(x.size()); ++c) {
      if (x[c] > kUsed) used[columns[c].job].emplace_back(x[c], c);
    }
    int branch_job = -1;
    double branch_score = -1;
    std::vector<int> option(num_jobs, 0);
    for (int j = 0; j < num_jobs; ++j) {
      if (fixed_option[j] >= 0) {
        option[j] = fixed_option[j];
        continue;
      }
      auto& u = used[j];
      std::sort(u.begin(), u.end(), std::greater<>());
      bool one_option = !u.empty() && columns[u[0].second].option >= 0;
      for (const auto& [w, c] : u) one_option = one_option && columns[c].option == columns[u[0].second].option;
      if (one_option) {
        option[j] = columns[u[0].second].option;
        continue;
      }
      // The job whose LP mix gains the most over its options' own values
      // would make a choice cost the most: the value dispersion of its
      // columns, sum w |value - mean|.
      double mean_value = 0, weight = 0;
      for (const auto& [w, c] : u) {
        const double v = columns[c].option >= 0 ? model.jobs[j].options[columns[c].option].value
                                                : artificial / scale;
        mean_value += w * v;
        weight += w;
      }
      mean_value /= std::max(weight, 1e-12);
      double s = 0;
      for (const auto& [w, c] : u) {
        const double v = columns[c].option >= 0 ? model.jobs[j].options[columns[c].option].value
                                                : artificial / scale;
        s += w * std::fabs(v - mean_value);
      }
      s += 1e-12;  // any split job beats none
      if (s > branch_score) {
        branch_score = s;
        branch_job = j;
      }
    }
    if (branch_job < 0) {
      ++leaves;
      absl::StatusOr<CountSolution> placed = PlaceOptions(model, option);
      if (placed.ok() && placed->objective > out.solution.objective &&
          CheckSolution(model, *placed).ok()) {
        out.solution = *std::move(placed);
      }
      continue;  // the node's optimum is this allocation
    }
    // The partition: stay / move if the job's current option is among its
    // columns; else count <= t / >= t + 1 if the counts differ; else this
    // pattern / another. The heaviest column's side is plunged into.
    const int j = branch_job;
    const JobModel& job = model.jobs[j];
    std::vector<int> opts;
    double mean = 0, total = 0;
    for (const auto& [w, c] : used[j]) {
      if (columns[c].option < 0) continue;
      opts.push_back(columns[c].option);
      mean += w * job.options[columns[c].option].nodes;
      total += w;
    }
    Decision in{j, Decision::kOnlyOption, 0}, out_d{j, Decision::kNotOption, 0};
    const int heavy = opts.empty() ? 0 : opts[0];
    const bool has_stay = job.current_option != 0 &&
                          std::find(opts.begin(), opts.end(), job.current_option) != opts.end();
    int lo = 1 << 30, hi = -1;
    for (int o : opts) {
      lo = std::min(lo, job.options[o].nodes);
      hi = std::max(hi, job.options[o].nodes);
    }
    bool heavy_in;
    if (opts.empty()) {
      // Only the artificial column: nothing the node allows fits (its
      // bound is the LP's, which the artificial column drags far down).
      prune(-kInf);
      continue;
    } else if (has_stay && opts.size() > 1) {
      in = {j, Decision::kOnlyOption, job.current_option};
      out_d = {j, Decision::kNotOption, job.current_option};
      heavy_in = heavy == job.current_option;
    } else if (lo < hi) {
      const int t = std::clamp(static_cast<int>(std::floor(mean / std::max(total, 1e-12))), lo, hi - 1);
      in = {j, Decision::kCountAtMost, t};
      out_d = {j, Decision::kCountAtLeast, t + 1};
      heavy_in = job.options[heavy].nodes <= t;
    } else if (opts.size() > 1) {
      const int k = job.options[heavy].pattern;
      in = {j, Decision::kOnlyPattern, k};
      out_d = {j, Decision::kNotPattern, k};
      heavy_in = true;
    } else {
      // One option and the artificial column: the option's column, or
      // nothing (the artificial), by the pattern of that option.
      const int k = job.options[heavy].pattern;
      in = {j, Decision::kOnlyPattern, k};
      out_d = {j, Decision::kNotPattern, k};
      heavy_in = true;
    }
    // Fixing by the node's own bound (its last L, at the prices pi): an
    // allocation in the subtree that gives job j option o is worth at most
    // L less o's shortfall from j's best allowed score at pi; below the
    // threshold, o is out of the subtree. The children's LPs lose columns
    // that only a fractional optimum could use.
    std::shared_ptr<const FixChain> child_fix = current_fix;
    {
      // (The last round priced every allowed option at pi; the fixing since
      // refreshed can only have shrunk the lists.)
      std::vector<int> fixed;
      const double margin = last_l - threshold();
      for (int jj = 0; jj < num_jobs; ++jj) {
        const double best = job_best[jj];
        if (allowed(jj, 0) && best - pricer.StopScore(jj, terms(jj)) > margin) {
          fixed.push_back(option_base[jj]);
        }
        const double* sc = &node_score[option_base[jj]];
        for (const std::vector<int>& opts : node_options(jj)) {
          for (int o : opts) {
            if (best - sc[o] > margin) fixed.push_back(option_base[jj] + o);
          }
        }
      }
      if (!fixed.empty()) {
        node_fixings += fixed.size();
        child_fix = std::make_shared<const FixChain>(FixChain{current_fix, std::move(fixed)});
      }
    }
    Node a{node.decisions, node.bound, node.depth + 1, child_fix};
    a.decisions.push_back(in);
    add_implied(a.decisions, in);
    Node b{node.decisions, node.bound, node.depth + 1, child_fix};
    b.decisions.push_back(out_d);
    add_implied(b.decisions, out_d);
    if (!heavy_in) std::swap(a, b);
    plunge = std::move(a);
    open.push_back(std::move(b));
    std::push_heap(open.begin(), open.end(), worse);
  }
  double open_bound = -kInf;
  for (const Node& n : open) open_bound = std::max(open_bound, n.bound);
  if (plunge) open_bound = std::max(open_bound, plunge->bound);
  // Every allocation lies in an open node, a pruned one or a leaf (worth
  // at most the incumbent), and under the root's bound.
  out.bound = std::min({root_bound, free_bound,
                        std::max({open_bound, pruned_bound, out.solution.objective})});
  out.bound = std::max(out.bound, out.solution.objective);
  out.proven = !out_of_time && Gap(out.bound, out.solution.objective) <= gap * (1 + 1e-9);
  out.branch_nodes = nodes_done;
  out.master_rows = pool_row0 + num_pools + static_cast<int>(cuts.size());
  out.master_columns = static_cast<int>(columns.size());
  out.detail = absl::StrFormat(
      "decomposition: root bound %.9g after %d rounds; %d nodes (%d leaves, %d pruned, %d open), "
      "%d LP solves (%d again from the slack basis, %d repaired), "
      "%d columns (%d rebuilds, %d jobs out of the master); "
      "%d cuts in %d rounds (%d dropped); "
      "%lld options fixed at nodes; %d groups of twins, %lld decisions implied for twins; "
      "%d roundings (%d improved); "
      "mode search %d flows, +%.6g; "
      "%.1f ms (root %.1f, mode search %.1f); %s",
      root_bound, root_rounds, nodes_done, leaves, pruned, open.size() + (plunge ? 1 : 0),
      lp_solves, lp_retries + master_lp->cold_retries(), lp_repairs + master_lp->repaired_solves(),
      columns.size(), compactions, num_jobs - pool_row0, cuts.size(), cut_rounds_done, dropped_cuts,
      node_fixings, static_cast<int>(twin_groups.size()), twin_decisions, rounded, rounded_better,
      ls_flows, ls_gain, absl::ToDoubleMilliseconds(absl::Now() - t_start),
      absl::ToDoubleMilliseconds(root_time), absl::ToDoubleMilliseconds(ls_time),
      out.proven    ? "proven"
      : out_of_time ? "out of time"
                    : "search ended unproven");
  return out;
}

}  // namespace malle::alloc::internal
