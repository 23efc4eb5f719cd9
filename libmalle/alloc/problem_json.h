// JSON forms of a Problem and a Decision (docs/allocator-json.md documents both).
//
//   MALLE_ASSIGN_OR_RETURN(Problem p, ParseProblemJson(text));
//   MALLE_ASSIGN_OR_RETURN(Decision d, Decide(p));
//   std::cout << DecisionToJson(p, d) << "\n";
//
// Parsing is strict: an unknown key, a wrong type, a missing required field
// or a value out of range is an InvalidArgument that names the JSON path
// (e.g. `jobs[3].throughput[1][0]: expected an integer node count, got 2.5`). The parsed
// problem is also checked with ValidateProblem.
//
// Thread-safety: pure; thread-safe.
#ifndef MALLE_ALLOC_PROBLEM_JSON_H_
#define MALLE_ALLOC_PROBLEM_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libmalle/alloc/decide.h"
#include "libmalle/alloc/problem.h"

namespace malle::alloc {

inline constexpr int kProblemJsonVersion = 1;

absl::StatusOr<Problem> ParseProblemJson(absl::string_view text);
std::string ProblemToJson(const Problem& problem, int indent = 2);

// The decision as JSON (allocation, reason, objective, solver detail).
std::string DecisionToJson(const Problem& problem, const Decision& decision, int indent = 2);

// Options given as JSON ({"policy": "milp", "time_limit_s": 1, ...}); the
// same keys as malle-alloc's flags.
absl::StatusOr<DecideOptions> ParseDecideOptionsJson(absl::string_view text);

}  // namespace malle::alloc

#endif  // MALLE_ALLOC_PROBLEM_JSON_H_
