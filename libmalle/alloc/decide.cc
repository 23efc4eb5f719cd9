#include "libmalle/alloc/decide.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libmalle/alloc/heuristics.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"

namespace malle::alloc {

absl::string_view PolicyName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kMilp:
      return "milp";
    case PolicyKind::kDp:
      return "dp";
    case PolicyKind::kGreedy:
      return "greedy";
    case PolicyKind::kEqualShare:
      return "equal_share";
    case PolicyKind::kStatic:
      return "static";
  }
  return "unknown";
}

DpOptions DpPolicyOptions() {
  DpOptions options;
  options.max_work = 10'000'000;
  return options;
}

absl::StatusOr<PolicyKind> ParsePolicyName(absl::string_view name) {
  for (PolicyKind kind : {PolicyKind::kMilp, PolicyKind::kDp, PolicyKind::kGreedy,
                          PolicyKind::kEqualShare, PolicyKind::kStatic}) {
    if (name == PolicyName(kind)) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "policy: unknown policy \"", name, "\"; expected one of milp, dp, greedy, equal_share, static"));
}

namespace {

// The MILP with what is left of the decision's time (DecideOptions::milp):
// its limit runs from the decision's start.
absl::StatusOr<PolicyResult> SolveMilpInTime(const CountModel& model, const DecideOptions& options,
                                             absl::Time started) {
  MilpOptions milp = options.milp;
  milp.started = started;
  return SolveMilp(model, milp);
}

absl::StatusOr<PolicyResult> RunPolicy(const CountModel& model, const DecideOptions& options,
                                       absl::Time started) {
  switch (options.policy) {
    case PolicyKind::kMilp:
      return SolveMilpInTime(model, options, started);
    case PolicyKind::kDp:
      return SolveDp(model, options.dp);
    case PolicyKind::kGreedy:
      return SolveGreedy(model);
    case PolicyKind::kEqualShare:
      return SolveEqualShare(model);
    case PolicyKind::kStatic:
      return SolveStatic(model);
  }
  return absl::InvalidArgumentError("DecideOptions.policy: unknown value");
}

// "2 grow, 1 shrinks, 1 starts, 0 stop" — what changes, for the reason line.
std::string ChangeSummary(const CountModel& model, const CountSolution& solution) {
  int grow = 0, shrink = 0, start = 0, stop = 0, same = 0;
  for (size_t j = 0; j < model.jobs.size(); ++j) {
    const int before = model.jobs[j].current_nodes;
    const int after = model.jobs[j].options[solution.option[j]].nodes;
    if (after == before) {
      ++same;
    } else if (before == 0) {
      ++start;
    } else if (after == 0) {
      ++stop;
    } else if (after > before) {
      ++grow;
    } else {
      ++shrink;
    }
  }
  return absl::StrFormat("%d start, %d grow, %d shrink, %d stop, %d unchanged", start, grow,
                         shrink, stop, same);
}

}  // namespace

absl::StatusOr<Decision> Decide(const Problem& problem, const DecideOptions& options) {
  const absl::Time started =
      options.started == absl::InfinitePast() ? absl::Now() : options.started;
  MALLE_ASSIGN_OR_RETURN(CountModel model, CompileCountModel(problem, options.model));
  absl::StatusOr<PolicyResult> result = RunPolicy(model, options, started);
  if (!result.ok() && absl::IsResourceExhausted(result.status()) &&
      options.policy == PolicyKind::kDp) {
    // Multi-pool model too large for the DP policy: the MILP (branch-and-
    // price with several pools) is exact too, within its gap and time
    // limit, and answers these in milliseconds where the DP would take
    // minutes or refuses; a heuristic would give worse answers than either.
    const std::string cause(result.status().message());
    result = SolveMilpInTime(model, options, started);
    if (result.ok()) {
      result->fell_back = true;
      result->reason = absl::StrCat("dp could not answer (", cause, "); the milp answered: ",
                                    result->reason);
    }
  }
  if (!result.ok() && absl::IsResourceExhausted(result.status())) {
    // Multi-pool model too large for the exact DP (the MILP's fallback, or
    // the DP policy and then the MILP): a heuristic answer beats no answer.
    const std::string cause(result.status().message());
    MALLE_LOG(WARNING) << PolicyName(options.policy) << " could not answer (" << cause
                       << "); using greedy";
    result = SolveGreedy(model);
    if (result.ok()) {
      result->fell_back = true;
      result->reason = absl::StrCat(PolicyName(options.policy), " could not answer (", cause,
                                    "); ", result->reason);
    }
  }
  if (!result.ok()) return result.status();
  if (absl::Status s = CheckSolution(model, result->solution); !s.ok()) {
    return absl::InternalError(absl::StrCat("policy ", PolicyName(options.policy),
                                            " returned an invalid allocation: ", s.message()));
  }
  Decision decision;
  decision.policy = options.policy;
  decision.objective = result->solution.objective;
  decision.current_objective = CurrentSolution(model).objective;
  MALLE_ASSIGN_OR_RETURN(decision.allocation, Realize(problem, model, result->solution));
  result->reason = absl::StrFormat("%s; %s; objective %.6g (keeping the current allocation: %.6g)",
                                   result->reason, ChangeSummary(model, result->solution),
                                   decision.objective, decision.current_objective);
  decision.result = *std::move(result);
  return decision;
}

}  // namespace malle::alloc
