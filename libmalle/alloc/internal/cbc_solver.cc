// CBC behind the plain-array MipModel (cbc_solver.h).
//
// This is the only translation unit that includes coin/*.hpp: COIN's headers
// are large, its exceptions are not ours, and keeping them here means the rest
// of the allocator never sees either.
//
// The driver is CBC's library interface (CbcModel::branchAndBound), not the
// CbcSolver command line: no preprocessing, so the columns CBC reports are
// the columns we built, and SOS objects and the start keep their meaning.
//
// Nothing in this file logs or takes a lock: milp.cc calls SolveWithCbc in a
// child forked from a multi-threaded process, where only the solver's own
// work is safe.
#include "libmalle/alloc/internal/cbc_solver.h"

#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coin/CbcHeuristic.hpp"
#include "coin/CbcModel.hpp"
#include "coin/CbcSOS.hpp"
#include "coin/CglClique.hpp"
#include "coin/ClpSimplex.hpp"
#include "coin/CoinError.hpp"
#include "coin/CoinPackedMatrix.hpp"
#include "coin/OsiClpSolverInterface.hpp"
#include "libmalle/base/check.h"
#include "libmalle/base/status_macros.h"

namespace malle::alloc::internal {
namespace {

// Tolerances used to accept a caller's start as feasible. CBC's own
// integrality tolerance is 1e-6; a start is produced by exact arithmetic on
// small integers, so anything looser would hide a bug in the caller.
constexpr double kStartIntegrality = 1e-6;
constexpr double kStartFeasibility = 1e-6;

bool IsNan(double v) { return std::isnan(v); }

absl::Status ValidateModel(const MipModel& m) {
  const size_t n = m.obj.size();
  if (m.col_lb.size() != n || m.col_ub.size() != n || m.is_integer.size() != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MipModel: column arrays differ in size (obj %d, col_lb %d, col_ub %d, is_integer %d)", n,
        m.col_lb.size(), m.col_ub.size(), m.is_integer.size()));
  }
  for (size_t c = 0; c < n; ++c) {
    if (!std::isfinite(m.obj[c])) {
      return absl::InvalidArgumentError(
          absl::StrFormat("MipModel: obj[%d] = %g is not finite", c, m.obj[c]));
    }
    const double lb = m.col_lb[c], ub = m.col_ub[c];
    if (IsNan(lb) || IsNan(ub) || lb > ub || lb == std::numeric_limits<double>::infinity() ||
        ub == -std::numeric_limits<double>::infinity()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("MipModel: column %d has bounds [%g, %g]", c, lb, ub));
    }
  }
  const size_t rows = m.row_lb.size();
  if (m.row_ub.size() != rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MipModel: row_lb has %d entries but row_ub has %d", rows, m.row_ub.size()));
  }
  if (m.row_start.size() != rows + 1 || m.row_start[0] != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MipModel: row_start must have num_rows + 1 = %d entries starting at 0 (has %d)", rows + 1,
        m.row_start.size()));
  }
  if (m.col_index.size() != m.value.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MipModel: col_index has %d entries but value has %d", m.col_index.size(), m.value.size()));
  }
  if (static_cast<size_t>(m.row_start.back()) != m.col_index.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MipModel: row_start.back() = %d but there are %d entries",
                        m.row_start.back(), m.col_index.size()));
  }
  // CoinPackedMatrix would silently merge or reject duplicate entries in a
  // row; either way the caller meant something else.
  std::vector<int> last_row(n, -1);
  for (size_t r = 0; r < rows; ++r) {
    const double lb = m.row_lb[r], ub = m.row_ub[r];
    if (IsNan(lb) || IsNan(ub) || lb > ub) {
      return absl::InvalidArgumentError(
          absl::StrFormat("MipModel: row %d has bounds [%g, %g]", r, lb, ub));
    }
    if (m.row_start[r + 1] < m.row_start[r]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("MipModel: row_start decreases at row %d (%d > %d)", r, m.row_start[r],
                          m.row_start[r + 1]));
    }
    for (int k = m.row_start[r]; k < m.row_start[r + 1]; ++k) {
      const int c = m.col_index[k];
      if (c < 0 || static_cast<size_t>(c) >= n) {
        return absl::InvalidArgumentError(
            absl::StrFormat("MipModel: row %d refers to column %d (num_cols = %d)", r, c, n));
      }
      if (!std::isfinite(m.value[k])) {
        return absl::InvalidArgumentError(
            absl::StrFormat("MipModel: row %d, column %d has coefficient %g", r, c, m.value[k]));
      }
      if (last_row[c] == static_cast<int>(r)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("MipModel: row %d lists column %d twice", r, c));
      }
      last_row[c] = static_cast<int>(r);
    }
  }
  for (size_t s = 0; s < m.sos2.size(); ++s) {
    const MipModel::Sos2& set = m.sos2[s];
    if (set.cols.empty() || set.cols.size() != set.weights.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("MipModel: sos2[%d] has %d columns and %d weights (need equal, > 0)", s,
                          set.cols.size(), set.weights.size()));
    }
    for (size_t i = 0; i < set.cols.size(); ++i) {
      if (set.cols[i] < 0 || static_cast<size_t>(set.cols[i]) >= n) {
        return absl::InvalidArgumentError(
            absl::StrFormat("MipModel: sos2[%d].cols[%d] = %d is not a column (num_cols = %d)", s,
                            i, set.cols[i], n));
      }
      if (!std::isfinite(set.weights[i]) || (i > 0 && !(set.weights[i] > set.weights[i - 1]))) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "MipModel: sos2[%d].weights must be finite and strictly increasing (weights[%d] = %g)",
            s, i, set.weights[i]));
      }
    }
  }
  if (!m.start.empty()) {
    if (m.start.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrFormat("MipModel: start has %d values for %d columns", m.start.size(), n));
    }
    for (size_t c = 0; c < n; ++c) {
      if (!std::isfinite(m.start[c])) {
        return absl::InvalidArgumentError(
            absl::StrFormat("MipModel: start[%d] = %g is not finite", c, m.start[c]));
      }
    }
  }
  return absl::OkStatus();
}

// CBC would accept an infeasible start without complaint (with check=false)
// and then report it as optimal if nothing beats it, so it is checked here.
// SOS2 sets are checked too: adjacent non-zeros only.
bool StartIsFeasible(const MipModel& m, std::string* why) {
  const int n = m.num_cols();
  for (int c = 0; c < n; ++c) {
    const double v = m.start[c];
    if (v < m.col_lb[c] - kStartFeasibility || v > m.col_ub[c] + kStartFeasibility) {
      *why = absl::StrFormat("start[%d] = %g outside [%g, %g]", c, v, m.col_lb[c], m.col_ub[c]);
      return false;
    }
    if (m.is_integer[c] && std::fabs(v - std::round(v)) > kStartIntegrality) {
      *why = absl::StrFormat("start[%d] = %g is not integral", c, v);
      return false;
    }
  }
  for (int r = 0; r < m.num_rows(); ++r) {
    double activity = 0.0;
    for (int k = m.row_start[r]; k < m.row_start[r + 1]; ++k) {
      activity += m.value[k] * m.start[m.col_index[k]];
    }
    const double tol = kStartFeasibility * (1.0 + std::fabs(activity));
    if (activity < m.row_lb[r] - tol || activity > m.row_ub[r] + tol) {
      *why = absl::StrFormat("start violates row %d (%g not in [%g, %g])", r, activity, m.row_lb[r],
                             m.row_ub[r]);
      return false;
    }
  }
  for (size_t s = 0; s < m.sos2.size(); ++s) {
    int first = -1, last = -1;
    const std::vector<int>& cols = m.sos2[s].cols;
    for (size_t i = 0; i < cols.size(); ++i) {
      if (std::fabs(m.start[cols[i]]) > kStartFeasibility) {
        if (first < 0) first = static_cast<int>(i);
        last = static_cast<int>(i);
      }
    }
    if (first >= 0 && last - first > 1) {
      *why = absl::StrFormat("start violates sos2[%d]", s);
      return false;
    }
  }
  return true;
}

double Dot(const std::vector<double>& a, const double* b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// SOS1 objects for the choice rows; see the comment at the call.
std::vector<std::unique_ptr<CbcSOS>> ChoiceRowSets(const MipModel& m, CbcModel* model) {
  std::vector<std::unique_ptr<CbcSOS>> sets;
  std::vector<char> used(m.num_cols(), 0);
  for (int r = 0; r < m.num_rows(); ++r) {
    const int begin = m.row_start[r], end = m.row_start[r + 1];
    if (end - begin < 2 || m.row_lb[r] != 1.0 || m.row_ub[r] != 1.0) continue;
    bool choice = true;
    for (int k = begin; k < end && choice; ++k) {
      const int c = m.col_index[k];
      choice = m.value[k] == 1.0 && m.is_integer[c] && m.col_lb[c] == 0.0 && m.col_ub[c] == 1.0 &&
               !used[c];
    }
    if (!choice) continue;
    std::vector<double> weights(end - begin);
    for (int k = begin; k < end; ++k) {
      used[m.col_index[k]] = 1;
      weights[k - begin] = k - begin;
    }
    sets.push_back(std::make_unique<CbcSOS>(model, end - begin, m.col_index.data() + begin,
                                            weights.data(), static_cast<int>(sets.size()),
                                            /*type=*/1));
  }
  return sets;
}

MipResult SolveTrivial(const MipModel& m) {
  // CBC misbehaves on a model without columns; its answer is obvious.
  MipResult result;
  for (int r = 0; r < m.num_rows(); ++r) {
    if (m.row_lb[r] > 0.0 || m.row_ub[r] < 0.0) {
      result.status = MipResult::Status::kInfeasible;
      result.detail = absl::StrFormat("no columns and row %d excludes 0", r);
      return result;
    }
  }
  result.status = MipResult::Status::kOptimal;
  result.detail = "no columns";
  return result;
}

// Loads `m` into `lp`: infinite bounds as the solver's infinity, the
// objective multiplied by `sense`.
void LoadModel(const MipModel& m, double sense, OsiClpSolverInterface& lp) {
  const int n = m.num_cols();
  const int rows = m.num_rows();
  const double inf = lp.getInfinity();
  auto clamp_inf = [inf](double v) { return std::isinf(v) ? (v > 0 ? inf : -inf) : v; };
  std::vector<double> col_lb(n), col_ub(n), row_lb(rows), row_ub(rows), obj(n);
  for (int c = 0; c < n; ++c) {
    col_lb[c] = clamp_inf(m.col_lb[c]);
    col_ub[c] = clamp_inf(m.col_ub[c]);
    obj[c] = sense * m.obj[c];
  }
  for (int r = 0; r < rows; ++r) {
    row_lb[r] = clamp_inf(m.row_lb[r]);
    row_ub[r] = clamp_inf(m.row_ub[r]);
  }
  std::vector<CoinBigIndex> starts(m.row_start.begin(), m.row_start.end());
  std::vector<int> lengths(rows);
  for (int r = 0; r < rows; ++r) lengths[r] = m.row_start[r + 1] - m.row_start[r];
  CoinPackedMatrix matrix(/*colordered=*/false, /*minor=*/n, /*major=*/rows,
                          static_cast<CoinBigIndex>(m.value.size()), m.value.data(),
                          m.col_index.data(), starts.data(), lengths.data());
  lp.loadProblem(matrix, col_lb.data(), col_ub.data(), obj.data(), row_lb.data(), row_ub.data());
}

absl::StatusOr<MipResult> Solve(const MipModel& m, const CbcSettings& settings) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = m.num_cols();
  const int rows = m.num_rows();

  OsiClpSolverInterface lp;
  lp.messageHandler()->setLogLevel(settings.log_level > 0 ? settings.log_level : 0);
  lp.setHintParam(OsiDoReducePrint, settings.log_level <= 0, OsiHintTry);
  LoadModel(m, /*sense=*/1.0, lp);
  for (int c = 0; c < n; ++c) {
    if (m.is_integer[c]) lp.setInteger(c);
  }
  lp.setObjSense(m.maximize ? -1.0 : 1.0);

  CbcModel model(lp);  // clones `lp`; everything below works on the clone
  model.setLogLevel(settings.log_level > 0 ? settings.log_level : 0);
  model.messageHandler()->setLogLevel(settings.log_level > 0 ? settings.log_level : 0);
  model.solver()->messageHandler()->setLogLevel(settings.log_level > 1 ? settings.log_level : 0);
  model.setNumberThreads(0);

  MipResult result;
  model.initialSolve();
  OsiSolverInterface* relaxed = model.solver();
  if (relaxed->isProvenPrimalInfeasible()) {
    result.status = MipResult::Status::kInfeasible;
    result.detail = "linear relaxation infeasible";
    return result;
  }
  if (relaxed->isProvenDualInfeasible()) {
    result.status = MipResult::Status::kUnbounded;
    result.detail = "linear relaxation unbounded";
    return result;
  }
  if (!relaxed->isProvenOptimal()) {
    result.status = MipResult::Status::kOther;
    result.detail = "linear relaxation not solved (numerical difficulties)";
    return result;
  }

  // Tuning, measured on multiple-choice knapsacks built from throughput
  // curves (100 jobs x 65 options; 1000 x 65): cliques (the choice rows),
  // the rounding heuristic and the choice-row branching below. Adding
  // probing, Gomory and MIR cuts, the feasibility pump or local search made
  // the median 3-4x and the tail 4-5x slower without saving nodes. Knapsack
  // covers are left out on purpose: CBC 2.10.8's CglKnapsackCover produced
  // cuts that cut off feasible (even the optimal) solutions on these models,
  // so CBC reported a suboptimal answer as optimal (found by the
  // MILP-vs-DP test: milp_test, SinglePoolMatchesDpOnRandomProblems).
  CglClique clique;
  clique.setStarCliqueReport(false);
  clique.setRowCliqueReport(false);
  model.addCutGenerator(&clique, -1, "Clique");
  CbcRounding rounding(model);
  model.addHeuristic(&rounding);

  // Each "choose exactly one" row (all ones, = 1, binaries) becomes an SOS1
  // branching object weighted by position, so CBC branches on "the job takes
  // one of its first k options or one of the rest" instead of fixing single
  // binaries; that cut the nodes ~10x and the time 2-3x on the models above.
  // The rows stay in the LP, so the answer is unchanged.
  std::vector<std::unique_ptr<CbcSOS>> choice_sets = ChoiceRowSets(m, &model);
  std::vector<CbcObject*> choice_objects;
  for (auto& set : choice_sets) choice_objects.push_back(set.get());
  if (!choice_objects.empty()) {
    // addObjects clones them.
    model.addObjects(static_cast<int>(choice_objects.size()), choice_objects.data());
  }

  if (!m.sos2.empty()) {
    std::vector<std::unique_ptr<CbcSOS>> sets;
    std::vector<CbcObject*> objects;
    for (size_t s = 0; s < m.sos2.size(); ++s) {
      sets.push_back(std::make_unique<CbcSOS>(
          &model, static_cast<int>(m.sos2[s].cols.size()), m.sos2[s].cols.data(),
          m.sos2[s].weights.data(), static_cast<int>(choice_sets.size() + s), /*type=*/2));
      objects.push_back(sets.back().get());
    }
    // addObjects clones them.
    model.addObjects(static_cast<int>(objects.size()), objects.data());
  }

  std::string start_note;
  if (!m.start.empty()) {
    std::string why;
    if (StartIsFeasible(m, &why)) {
      // Objective in CBC's internal (minimising) sense; check=false because
      // the start was verified above and CBC's check re-solves the LP.
      const double internal_obj = (m.maximize ? -1.0 : 1.0) * Dot(m.obj, m.start.data());
      model.setBestSolution(m.start.data(), n, internal_obj, /*check=*/false);
      start_note = "; start accepted";
    } else {
      start_note = absl::StrCat("; start ignored: ", why);
    }
  }

  // Trust pseudo-costs from the first branching on a variable instead of
  // strong-branching it 10 times first (CBC's default): measured on the
  // allocation models (alloc_bench, 128-4734 nodes x 10-100 jobs), p99 fell
  // 25-35 % with no change in the answers.
  model.setNumberBeforeTrust(0);
  model.setUseElapsedTime(true);
  const double limit_s = absl::ToDoubleSeconds(settings.time_limit);
  // The B&B clock starts inside branchAndBound; what was spent building the
  // model and solving the root LP comes off its budget.
  model.setMaximumSeconds(std::max(limit_s - SecondsSince(t0), 1e-3));
  model.setAllowableFractionGap(std::max(settings.relative_gap, 0.0));

  model.branchAndBound();

  const double* best = model.bestSolution();
  result.branch_nodes = model.getNodeCount();
  if (best != nullptr) {
    result.x.assign(best, best + n);
    result.objective = Dot(m.obj, best);
  }
  result.detail = absl::StrFormat("cbc status %d, secondary %d%s", model.status(),
                                  model.secondaryStatus(), start_note);
  if (model.isProvenOptimal() && best != nullptr) {
    result.status = MipResult::Status::kOptimal;
  } else if (model.isProvenInfeasible()) {
    result.status = MipResult::Status::kInfeasible;
  } else if (model.isContinuousUnbounded()) {
    result.status = MipResult::Status::kUnbounded;
  } else if (model.isSecondsLimitReached()) {
    result.status = best != nullptr ? MipResult::Status::kLimitWithSolution
                                    : MipResult::Status::kLimitNoSolution;
  } else {
    result.status = MipResult::Status::kOther;
  }
  if (result.status == MipResult::Status::kOptimal ||
      result.status == MipResult::Status::kLimitWithSolution) {
    result.best_bound = model.getBestPossibleObjValue();
    // The bound can only be on the right side of the incumbent; CBC reports
    // the bound of the open nodes, which after a proof may lie a cutoff
    // increment on the wrong side.
    result.best_bound = m.maximize ? std::max(result.best_bound, result.objective)
                                   : std::min(result.best_bound, result.objective);
  }
  return result;
}

}  // namespace

absl::StatusOr<LpResult> SolveLpWithClp(const MipModel& m) {
  MALLE_RETURN_IF_ERROR(ValidateModel(m));
  try {
    OsiClpSolverInterface lp;
    const int n = m.num_cols(), rows = m.num_rows();
    // Clp minimises: the objective is negated for a maximisation, and the
    // duals negated back below.
    const double sense = m.maximize ? -1.0 : 1.0;
    lp.messageHandler()->setLogLevel(0);
    lp.setHintParam(OsiDoReducePrint, true, OsiHintTry);
    LoadModel(m, sense, lp);
    lp.setObjSense(1.0);
    lp.initialSolve();
    LpResult result;
    result.optimal = lp.isProvenOptimal();
    if (!result.optimal) return result;
    result.objective = sense * lp.getObjValue();
    result.x.assign(lp.getColSolution(), lp.getColSolution() + n);
    result.row_duals.assign(lp.getRowPrice(), lp.getRowPrice() + rows);
    result.reduced_costs.assign(lp.getReducedCost(), lp.getReducedCost() + n);
    // Minimisation of -obj: y' = -y and r' = -r in the maximisation's sense.
    for (double& y : result.row_duals) y *= sense;
    for (double& r : result.reduced_costs) r *= sense;
    return result;
  } catch (const CoinError& e) {
    return absl::InternalError(absl::StrCat("COIN error in Clp: ", e.message()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("exception in Clp: ", e.what()));
  }
}

// What a column must still improve a reported optimum by to have it solved
// again (ColumnLp::Solve; the header's repaired_solves).
constexpr double kImprovingTolerance = 1e-6;

struct ColumnLp::Impl {
  ClpSimplex clp;
  int rows = 0;
  int solved_columns = 0;  // columns already inside `clp`
  // Queued columns, column-major.
  std::vector<double> lb, ub, obj;
  std::vector<CoinBigIndex> starts{0};
  std::vector<int> index;
  std::vector<double> value;
  bool solved_once = false;
  bool bounds_changed = false;
  bool rows_added = false;
  int cold_retries = 0;
  int repairs = 0;

  // Whether an optimum Clp reported still has a column whose reduced cost
  // improves it by more than `tolerance` (Clp minimises -objective: d < 0
  // improves at the lower bound, d > 0 at the upper; a basic column has 0).
  bool Improvable(double tolerance) const {
    const int n = clp.getNumCols();
    const double* x = clp.primalColumnSolution();
    const double* d = clp.dualColumnSolution();
    const double* lo = clp.getColLower();
    const double* hi = clp.getColUpper();
    for (int j = 0; j < n; ++j) {
      const bool at_lower = x[j] <= lo[j] + 1e-9, at_upper = x[j] >= hi[j] - 1e-9;
      if (at_lower && at_upper) continue;  // fixed
      const double gain = at_lower ? -d[j] : at_upper ? d[j] : std::fabs(d[j]);
      if (gain > tolerance) return true;
    }
    return false;
  }

  // Moves the queued columns into `clp`.
  void Flush() {
    if (obj.empty()) return;
    clp.addColumns(static_cast<int>(obj.size()), lb.data(), ub.data(), obj.data(), starts.data(),
                   index.data(), value.data());
    solved_columns += static_cast<int>(obj.size());
    lb.clear();
    ub.clear();
    obj.clear();
    index.clear();
    value.clear();
    starts.assign(1, 0);
  }
};

ColumnLp::ColumnLp(std::vector<double> row_lb, std::vector<double> row_ub)
    : impl_(std::make_unique<Impl>()) {
  MALLE_CHECK(row_lb.size() == row_ub.size()) << "ColumnLp: row bound arrays differ in size";
  Impl& m = *impl_;
  m.rows = static_cast<int>(row_lb.size());
  m.clp.setLogLevel(0);
  m.clp.messageHandler()->setLogLevel(0);
  m.clp.resize(m.rows, 0);
  const double inf = COIN_DBL_MAX;
  for (int r = 0; r < m.rows; ++r) {
    m.clp.setRowBounds(r, std::isinf(row_lb[r]) ? -inf : row_lb[r],
                       std::isinf(row_ub[r]) ? inf : row_ub[r]);
  }
  m.clp.setOptimizationDirection(1.0);  // minimise -objective
  // No scaling. Clp's scale factors, kept across the warm solves while
  // columns and rows joined, let solves end "optimal" with columns that
  // still improved the objective by up to 1e-1 (in units where the largest
  // value is 1e3): the master's LP stopped short, so branch-and-price's
  // bound came out loose and a plunge could branch on the same job until
  // its deadline (issue 27, docs/benchmarks.md, "twelfth look"). The
  // master's entries are node counts, 1 and cut coefficients; values are
  // scaled by the caller.
  m.clp.scaling(0);
}

ColumnLp::~ColumnLp() = default;

int ColumnLp::AddColumn(const std::vector<int>& rows, const std::vector<double>& values,
                        double objective, double lb, double ub) {
  MALLE_CHECK(rows.size() == values.size()) << "ColumnLp::AddColumn: rows and values differ";
  Impl& m = *impl_;
  m.lb.push_back(std::isinf(lb) ? -COIN_DBL_MAX : lb);
  m.ub.push_back(std::isinf(ub) ? COIN_DBL_MAX : ub);
  m.obj.push_back(-objective);
  for (size_t i = 0; i < rows.size(); ++i) {
    MALLE_CHECK(rows[i] >= 0 && rows[i] < m.rows) << "ColumnLp::AddColumn: row out of range";
    m.index.push_back(rows[i]);
    m.value.push_back(values[i]);
  }
  m.starts.push_back(static_cast<CoinBigIndex>(m.index.size()));
  return num_columns() - 1;
}

void ColumnLp::SetColumnUpper(int c, double ub) {
  Impl& m = *impl_;
  MALLE_CHECK(c >= 0 && c < num_columns()) << "ColumnLp::SetColumnUpper: column out of range";
  if (std::isinf(ub)) ub = COIN_DBL_MAX;  // Clp's infinity, so that equal bounds compare equal
  if (c >= m.solved_columns) {
    m.ub[c - m.solved_columns] = ub;
    return;
  }
  if (m.clp.columnUpper()[c] == ub) return;
  m.clp.setColumnUpper(c, ub);
  m.bounds_changed = true;
}

int ColumnLp::AddRow(const std::vector<int>& columns, const std::vector<double>& values, double lb,
                     double ub) {
  MALLE_CHECK(columns.size() == values.size()) << "ColumnLp::AddRow: columns and values differ";
  Impl& m = *impl_;
  for (int c : columns) {
    MALLE_CHECK(c >= 0 && c < num_columns()) << "ColumnLp::AddRow: column out of range";
  }
  m.Flush();
  const CoinBigIndex starts[2] = {0, static_cast<CoinBigIndex>(columns.size())};
  const double row_lb = std::isinf(lb) ? -COIN_DBL_MAX : lb;
  const double row_ub = std::isinf(ub) ? COIN_DBL_MAX : ub;
  m.clp.addRows(1, &row_lb, &row_ub, starts, columns.data(), values.data());
  m.rows_added = true;
  return m.rows++;
}

int ColumnLp::cold_retries() const { return impl_->cold_retries; }
int ColumnLp::repaired_solves() const { return impl_->repairs; }
void ColumnLp::SetScalingForTesting(int mode) { impl_->clp.scaling(mode); }

int ColumnLp::num_columns() const {
  return impl_->solved_columns + static_cast<int>(impl_->obj.size());
}

absl::StatusOr<LpResult> ColumnLp::Solve() {
  Impl& m = *impl_;
  try {
    m.Flush();
    if (m.clp.getNumCols() == 0) {
      // No columns (a master whose every job has left it, or a problem
      // without jobs): Clp's dual simplex crashes on such a model (SIGSEGV
      // in ClpSimplex::deleteRim, Clp 1.17). The LP is max 0 over the
      // empty vector: optimal with zero duals where every row admits 0,
      // infeasible otherwise.
      LpResult result;
      result.optimal = true;
      for (int r = 0; r < m.rows; ++r) {
        result.optimal =
            result.optimal && m.clp.getRowLower()[r] <= 0 && m.clp.getRowUpper()[r] >= 0;
      }
      if (result.optimal) result.row_duals.assign(m.rows, 0.0);
      return result;
    }
    // The first solve from scratch (dual simplex from the slack basis);
    // then primal from the last basis, which new columns keep feasible.
    // startFinishOptions 1 (keep the work areas and the factorization after
    // a solve), then 1 | 2 | 4 (reuse them; Clp tracks what changed:
    // columns added, bounds set). A branch-and-price node is one or two
    // small warm solves, which spent much of their time creating, scaling
    // and freeing Clp's work areas: an instance of 333 nodes went from 300
    // to 235 ms (perf, issue 27).
    // New rows: the dual simplex from the last basis too (a cut makes it
    // primal infeasible, not dual), with fresh work areas for the new size.
    if (!m.solved_once || m.bounds_changed || m.rows_added) {
      m.clp.dual(0, m.solved_once && !m.rows_added ? 7 : 1);
      m.solved_once = true;
      m.bounds_changed = false;
      m.rows_added = false;
    } else {
      m.clp.primal(0, 7);
    }
    if (m.clp.isProvenOptimal() && m.Improvable(kImprovingTolerance)) {
      // An optimum with a column that still improves it (what scaling did,
      // above): without scaling, the primal simplex from this basis with
      // fresh work areas; if that does not do either, the slack basis below.
      ++m.repairs;
      m.clp.scaling(0);
      m.clp.primal(0, 1);
      if (m.clp.isProvenOptimal() && m.Improvable(kImprovingTolerance)) m.clp.setProblemStatus(10);
    }
    if (!m.clp.isProvenOptimal()) {
      // A warm solve can end wrongly infeasible (seen at branch nodes of a
      // master with cut rows, whose artificial columns keep it feasible):
      // once more from the slack basis with fresh work areas.
      m.clp.allSlackBasis(true);
      m.clp.dual(0, 1);
      ++m.cold_retries;
    }
    LpResult result;
    result.optimal = m.clp.isProvenOptimal();
    result.status = m.clp.problemStatus();
    if (!result.optimal) return result;
    const int n = m.clp.getNumCols();
    result.objective = -m.clp.objectiveValue();
    result.x.assign(m.clp.primalColumnSolution(), m.clp.primalColumnSolution() + n);
    result.row_duals.assign(m.clp.dualRowSolution(), m.clp.dualRowSolution() + m.rows);
    result.reduced_costs.assign(m.clp.dualColumnSolution(), m.clp.dualColumnSolution() + n);
    for (double& y : result.row_duals) y = -y;
    for (double& r : result.reduced_costs) r = -r;
    return result;
  } catch (const CoinError& e) {
    return absl::InternalError(absl::StrCat("COIN error in Clp: ", e.message()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("exception in Clp: ", e.what()));
  }
}

MipModel SubModel(const MipModel& m, const std::vector<int>& cols) {
  MipModel sub;
  sub.maximize = m.maximize;
  std::vector<int> where(m.num_cols(), -1);
  for (int c : cols) {
    where[c] = sub.AddCol(m.col_lb[c], m.col_ub[c], m.obj[c], m.is_integer[c] != 0);
  }
  for (int r = 0; r < m.num_rows(); ++r) {
    std::vector<int> rc;
    std::vector<double> rv;
    for (int k = m.row_start[r]; k < m.row_start[r + 1]; ++k) {
      if (where[m.col_index[k]] < 0) continue;
      rc.push_back(where[m.col_index[k]]);
      rv.push_back(m.value[k]);
    }
    sub.AddRow(rc, rv, m.row_lb[r], m.row_ub[r]);
  }
  if (!m.start.empty()) {
    for (int c : cols) sub.start.push_back(m.start[c]);
  }
  return sub;
}

int MipModel::AddCol(double lb, double ub, double objective, bool integer) {
  col_lb.push_back(lb);
  col_ub.push_back(ub);
  obj.push_back(objective);
  is_integer.push_back(integer ? 1 : 0);
  return num_cols() - 1;
}

void MipModel::AddRow(const std::vector<int>& cols, const std::vector<double>& values, double lb,
                      double ub) {
  MALLE_CHECK(cols.size() == values.size())
      << "AddRow: " << cols.size() << " columns but " << values.size() << " values";
  if (row_start.empty()) row_start.push_back(0);
  col_index.insert(col_index.end(), cols.begin(), cols.end());
  value.insert(value.end(), values.begin(), values.end());
  row_start.push_back(static_cast<int>(col_index.size()));
  row_lb.push_back(lb);
  row_ub.push_back(ub);
}

absl::string_view MipStatusName(MipResult::Status status) {
  switch (status) {
    case MipResult::Status::kOptimal:
      return "optimal";
    case MipResult::Status::kLimitWithSolution:
      return "time limit with solution";
    case MipResult::Status::kLimitNoSolution:
      return "time limit without solution";
    case MipResult::Status::kInfeasible:
      return "infeasible";
    case MipResult::Status::kUnbounded:
      return "unbounded";
    case MipResult::Status::kOther:
      return "other";
  }
  return "unknown";
}

absl::StatusOr<MipResult> SolveWithCbc(const MipModel& model, const CbcSettings& settings) {
  MALLE_RETURN_IF_ERROR(ValidateModel(model));
  if (model.num_cols() == 0) return SolveTrivial(model);
  try {
    return Solve(model, settings);
  } catch (const CoinError& e) {
    return absl::InternalError(absl::StrCat("CBC threw CoinError in ", e.className(),
                                            "::", e.methodName(), ": ", e.message()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("CBC threw: ", e.what()));
  } catch (...) {
    return absl::InternalError("CBC threw an unknown exception");
  }
}

}  // namespace malle::alloc::internal
