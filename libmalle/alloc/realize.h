// Realisation: from per-pool counts to concrete node ids.
//
// Within a pool nodes are interchangeable for the objective, but not for the
// future: a job that shrinks gives up its nodes with the shortest expected
// idle window first; a job that grows takes the free nodes with the longest
// window first. A job never loses a node it keeps by count (no needless
// migration).
//
// Thread-safety: pure; thread-safe.
#ifndef MALLE_ALLOC_REALIZE_H_
#define MALLE_ALLOC_REALIZE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/problem.h"

namespace malle::alloc {

struct JobAllocation {
  std::string job_id;
  std::vector<std::string> nodes;  // the nodes the job should hold
  int previous_nodes = 0;
  int batch_option = 0;
  double samples_per_s = 0.0;  // expected effective throughput
  double value = 0.0;          // contribution to the objective
};

struct Allocation {
  std::vector<JobAllocation> jobs;  // same order as Problem::jobs
  std::vector<std::string> idle_nodes;  // nodes no job holds
};

// `model` must be CompileCountModel(problem) and `solution` must pass
// CheckSolution; FailedPrecondition otherwise.
absl::StatusOr<Allocation> Realize(const Problem& problem, const CountModel& model,
                                   const CountSolution& solution);

}  // namespace malle::alloc

#endif  // MALLE_ALLOC_REALIZE_H_
