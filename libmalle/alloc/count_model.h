// The count model: a Problem compiled into what the solvers work on.
//
// Nodes of one class with the same (bucketed) idle horizon are interchangeable,
// so an allocation is fully described by how many nodes each job draws from
// each such *pool*; which concrete node is decided afterwards (realize.h).
// Each job gets a table of *options*: a node count, a compatibility pattern
// (the pools it may draw from, which fixes the speed, horizon and locality
// factor it is valued at) and a batch option, each with its objective value.
// A solution picks one option per job and a per-pool split of its count.
//
// Rules every solution obeys (no migration inside one decision):
//   - a job that grows (or keeps its size) keeps every node it holds;
//   - a job that shrinks only releases nodes, it takes none;
//   - a job draws only from pools of its option's pattern;
//   - pools are not over-subscribed.
// With these rules the value of a job depends only on its per-pool counts,
// which is why counts suffice (docs/allocator.md has the argument).
//
//   MALLE_ASSIGN_OR_RETURN(CountModel model, CompileCountModel(problem, {}));
//   CountSolution s = ...;  // from a policy
//   MALLE_RETURN_IF_ERROR(CheckSolution(model, s));
//
// Thread-safety: pure functions over immutable data; thread-safe.
#ifndef MALLE_ALLOC_COUNT_MODEL_H_
#define MALLE_ALLOC_COUNT_MODEL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libmalle/alloc/problem.h"

namespace malle::alloc {

// Interchangeable nodes: one NodeClass, one horizon bucket.
struct Pool {
  int class_index = 0;
  int locality = 0;        // index into CountModel::localities
  double speed = 1.0;
  double horizon_s = 0.0;  // min(forward window, expected idle), rounded down to a bucket
  int capacity = 0;        // nodes in the pool (free or held)
  std::vector<int> nodes;  // indices into Problem::nodes
};

// The pools a job may draw from when valued at (speed, horizon, locality).
struct Pattern {
  double speed = 1.0;      // min speed over `pools`
  double horizon_s = 0.0;  // min horizon over `pools`
  int locality = -1;       // -1: spans groups (pays the cross-locality factor)
  double factor = 1.0;     // throughput multiplier: speed * locality factor
  std::vector<int> pools;  // sorted pool indices
};

struct Option {
  int nodes = 0;         // 0: the job does not run
  int pattern = -1;      // index into JobModel::patterns; -1 when nodes == 0
  int batch_option = 0;  // index into JobSpec::batch_options (0 without options)
  double samples_per_s = 0.0;  // effective throughput (speed and locality applied)
  double value = 0.0;          // contribution to the objective over the window
};

struct JobModel {
  int min_nodes = 1;
  int max_nodes = 1;      // clamped to the total number of nodes
  int requested_max_nodes = 1;  // JobSpec::max_nodes as given (the static policy's fixed size)
  int current_nodes = 0;  // sum of current_per_pool
  int current_batch_option = 0;
  std::vector<int> current_per_pool;  // one entry per pool
  double current_samples_per_s = 0.0; // 0 when current_nodes is outside [min, max]
  std::vector<Pattern> patterns;
  // options[0] is always {nodes = 0}. Options whose count cannot be placed
  // (more nodes than the compatible pools hold) are left out.
  std::vector<Option> options;
  // The option that describes the current allocation (0 if none does, e.g.
  // the job lost nodes and is below min_nodes). Used as the MIP start.
  int current_option = 0;
};

struct CountModelOptions {
  // Idle horizons shorter than the forward window are rounded *down* to a
  // multiple of forward_window / horizon_buckets (conservative), so that
  // forecasts do not create one pool per node.
  int horizon_buckets = 8;
};

struct CountModel {
  double forward_window_s = 0.0;
  std::vector<std::string> localities;
  std::vector<Pool> pools;
  std::vector<JobModel> jobs;  // same order as Problem::jobs
  int total_nodes = 0;

  bool single_pool() const { return pools.size() <= 1; }
};

// One chosen option per job and how many nodes it draws from each pool.
struct CountSolution {
  std::vector<int> option;                 // per job, index into JobModel::options
  std::vector<std::vector<int>> per_pool;  // per job, one count per pool
  double objective = 0.0;                  // sum of the options' values
};

// Validates `problem` (ValidateProblem) and compiles it. InvalidArgument
// names the offending field.
absl::StatusOr<CountModel> CompileCountModel(const Problem& problem,
                                             const CountModelOptions& options = {});

// The best value job `job` can have when it draws `per_pool[p]` nodes from
// each pool (the rules above applied); nullopt if no option allows it.
// `option_index` (optional) receives the option that attains it.
std::optional<double> JobVectorValue(const JobModel& job, absl::Span<const int> per_pool,
                                     int* option_index = nullptr);

// Checks that `solution` obeys every rule (shape, option counts, patterns,
// keep/release, capacities) and that its objective matches its options'
// values (relative 1e-9). FailedPrecondition names the first violation.
absl::Status CheckSolution(const CountModel& model, const CountSolution& solution);

// Sum of the chosen options' values.
double SolutionObjective(const CountModel& model, absl::Span<const int> option);

// Places every job's chosen option on the pools: per-pool counts that obey
// the rules above (keep, release, pattern, capacities), found as a flow of
// the jobs' counts into the pools (a growing job's held nodes are placed
// first). `option[j]` indexes jobs[j].options. FailedPrecondition when no
// placement exists (InvalidArgument for a malformed `option`). Solutions
// that pick options by counts alone (the MILP's pool-union formulation)
// get their per-pool split here.
absl::StatusOr<CountSolution> PlaceOptions(const CountModel& model, absl::Span<const int> option);

// The solution that keeps every job where it is (a job below min_nodes
// stops; its nodes become free). Always feasible.
CountSolution CurrentSolution(const CountModel& model);

}  // namespace malle::alloc

#endif  // MALLE_ALLOC_COUNT_MODEL_H_
