// A plain-array MIP and one function that solves it with CBC.
//
// The only header of the allocator that leads to coin/*.hpp (included by
// cbc_solver.cc alone). milp.cc builds the count formulation as a MipModel;
// the benchmark builds BFTrainer's per-node reference formulation (with SOS2
// sets) the same way.
//
// Thread-safety: SolveWithCbc is reentrant as far as CBC is, which is not
// guaranteed; callers serialise (milp.cc holds a process-wide mutex).
#ifndef MALLE_ALLOC_INTERNAL_CBC_SOLVER_H_
#define MALLE_ALLOC_INTERNAL_CBC_SOLVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace malle::alloc::internal {

struct MipModel {
  bool maximize = true;
  // Columns.
  std::vector<double> col_lb, col_ub, obj;
  std::vector<char> is_integer;  // 1 = integer (binary if bounds are [0, 1])
  // Rows in compressed sparse row form: row r has entries
  // [row_start[r], row_start[r + 1]) of (col_index, value).
  std::vector<double> row_lb, row_ub;
  std::vector<int> row_start{0};
  std::vector<int> col_index;
  std::vector<double> value;
  // Special ordered sets of type 2 (reference formulation only).
  struct Sos2 {
    std::vector<int> cols;
    std::vector<double> weights;  // strictly increasing
  };
  std::vector<Sos2> sos2;
  // Optional feasible starting solution (one value per column).
  std::vector<double> start;

  int num_cols() const { return static_cast<int>(obj.size()); }
  int num_rows() const { return static_cast<int>(row_lb.size()); }
  int AddCol(double lb, double ub, double objective, bool integer);
  // Adds lb <= sum(values[i] * x[cols[i]]) <= ub.
  void AddRow(const std::vector<int>& cols, const std::vector<double>& values, double lb,
              double ub);
};

struct CbcSettings {
  absl::Duration time_limit = absl::Seconds(1);  // elapsed time
  double relative_gap = 1e-9;
  int log_level = 0;
};

struct MipResult {
  enum class Status {
    kOptimal,            // proven optimal within relative_gap
    kLimitWithSolution,  // time limit hit; x is the best incumbent
    kLimitNoSolution,    // time limit hit before any incumbent
    kInfeasible,
    kUnbounded,
    kOther,              // anything else CBC reports; `detail` says what
  };
  Status status = Status::kOther;
  std::vector<double> x;  // column values (empty without a solution)
  double objective = 0.0;
  double best_bound = 0.0;
  long long branch_nodes = 0;
  std::string detail;  // CBC's own status words, for reasons and logs
  // Size of what was solved, where it is not the model passed in (the
  // decomposition's master); 0: the model's own.
  int solved_rows = 0;
  int solved_columns = 0;
};

absl::string_view MipStatusName(MipResult::Status status);

// Solves `model`. Errors only for a malformed model (InvalidArgument) or an
// exception thrown by COIN (Internal, with its message); solver outcomes are
// reported in MipResult::status.
absl::StatusOr<MipResult> SolveWithCbc(const MipModel& model, const CbcSettings& settings);

// The linear relaxation of `model` (integrality and `start` ignored), solved
// with Clp. Duals and reduced costs are in the model's own sense: for a
// maximisation, a column at its lower bound with reduced cost r > 0 would
// raise the objective by r per unit; row_duals y give r_k = obj_k - y . A_k.
struct LpResult {
  bool optimal = false;
  // Clp's problemStatus() (1 infeasible, 2 unbounded, 3 stopped...): why
  // it is not optimal.
  int status = 0;
  double objective = 0.0;
  std::vector<double> x, row_duals, reduced_costs;
};
absl::StatusOr<LpResult> SolveLpWithClp(const MipModel& model);

// A linear program that grows by columns and is re-solved from its last
// basis (the master of a Dantzig-Wolfe decomposition: the rows are fixed
// at construction, columns are priced in between solves). Maximises.
// Primal simplex after new columns: the previous basis stays feasible, so a
// re-solve costs the pivots the new columns bring, not a cold solve.
//
// Thread-safety: not thread-safe; one object per thread.
class ColumnLp {
 public:
  ColumnLp(std::vector<double> row_lb, std::vector<double> row_ub);
  ~ColumnLp();
  ColumnLp(const ColumnLp&) = delete;
  ColumnLp& operator=(const ColumnLp&) = delete;

  // Queues a column lb <= x <= ub with `objective` and entries (rows[i],
  // values[i]); it joins the model at the next Solve. Returns its index.
  int AddColumn(const std::vector<int>& rows, const std::vector<double>& values, double objective,
                double lb = 0.0, double ub = 1.0);
  int num_columns() const;
  // Changes column c's upper bound (0 takes it out of the LP, as a branch
  // does); the next Solve starts with the dual simplex from the last basis.
  void SetColumnUpper(int c, double ub);
  // Appends a row lb <= sum_i values[i] x[columns[i]] <= ub over columns
  // added so far (cuts); the next Solve starts with the dual simplex from
  // the last basis, the new row's slack basic. Returns its index.
  int AddRow(const std::vector<int>& columns, const std::vector<double>& values, double lb,
             double ub);
  // Warm solves that ended short of optimal and were solved again from the
  // slack basis (Solve).
  int cold_retries() const;
  // Solves Clp reported optimal with a column that still improved the
  // objective by more than 1e-6, and that were solved again (Solve).
  int repaired_solves() const;
  // Clp's scaling mode (ClpSimplex::scaling; 0, off, unless a test sets it).
  void SetScalingForTesting(int mode);

  // Solves (warm after the first call). x over every column added so far,
  // duals in the maximisation's sense (r_k = obj_k - y . A_k). Internal for
  // a COIN exception; optimal = false when Clp stops short.
  absl::StatusOr<LpResult> Solve();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The model restricted to `cols` (in that order): every row, with the
// entries of other columns left out; start entries kept.
MipModel SubModel(const MipModel& model, const std::vector<int>& cols);

}  // namespace malle::alloc::internal

#endif  // MALLE_ALLOC_INTERNAL_CBC_SOLVER_H_
