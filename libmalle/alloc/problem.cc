#include "libmalle/alloc/problem.h"

#include <cmath>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "libmalle/base/status_macros.h"

namespace malle::alloc {
namespace {

constexpr size_t kMaxIdLength = 128;

// "jobs[2] (\"vgg\")" — index and id, so the user finds the entry either way.
std::string JobName(size_t index, const JobSpec& job) {
  return absl::StrFormat("jobs[%d] (\"%s\")", index, job.id);
}

absl::Status Invalid(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// Check*: `where` is a callable giving the entry's name, called only for an
// error (the per-node and per-job checks run on every decision);
// ValidateIdString: the same with the name given.
template <typename Where>
absl::Status CheckIdString(const Where& where, const std::string& id) {
  if (id.empty()) return Invalid(where(), "must not be empty");
  if (id.size() > kMaxIdLength) {
    return Invalid(where(), absl::StrFormat("is %d characters long; at most %d allowed", id.size(),
                                            kMaxIdLength));
  }
  for (char c : id) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return Invalid(where(), "contains a control character");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateIdString(const std::string& where, const std::string& id) {
  return CheckIdString([&where] { return where; }, id);
}

template <typename Where>
absl::Status CheckDuration(const Where& where, absl::Duration d, bool allow_infinite) {
  if (d < absl::ZeroDuration()) {
    return Invalid(where(), absl::StrCat("must be >= 0, got ", absl::FormatDuration(d)));
  }
  if (!allow_infinite && d == absl::InfiniteDuration()) return Invalid(where(), "must be finite");
  return absl::OkStatus();
}

template <typename Where>
absl::Status CheckCurve(const Where& where, const Curve& curve, int min_nodes, int max_nodes) {
  if (curve.empty()) return Invalid(where(), "has no breakpoints");
  for (size_t k = 0; k < curve.size(); ++k) {
    const Breakpoint& b = curve[k];
    auto at = [&where, k] { return absl::StrFormat("%s[%d]", where(), k); };
    if (b.nodes < 0) return Invalid(at(), absl::StrCat("nodes must be >= 0, got ", b.nodes));
    if (!std::isfinite(b.samples_per_s) || b.samples_per_s < 0) {
      return Invalid(at(),
                     absl::StrCat("samples_per_s must be finite and >= 0, got ", b.samples_per_s));
    }
    if (k > 0 && b.nodes <= curve[k - 1].nodes) {
      return Invalid(
          at(), absl::StrFormat("breakpoints must have strictly increasing nodes; %d follows %d",
                                b.nodes, curve[k - 1].nodes));
    }
  }
  if (curve.front().nodes > min_nodes || curve.back().nodes < max_nodes) {
    return Invalid(where(),
                   absl::StrFormat("breakpoints cover nodes [%d, %d] but the job needs "
                                   "[min_nodes, max_nodes] = [%d, %d]",
                                   curve.front().nodes, curve.back().nodes, min_nodes, max_nodes));
  }
  return absl::OkStatus();
}

}  // namespace

double Interpolate(absl::Span<const Breakpoint> curve, int nodes) {
  if (curve.empty() || nodes < curve.front().nodes || nodes > curve.back().nodes) return 0.0;
  // Curves are short (a handful of breakpoints): a linear scan beats a search.
  for (size_t k = 1; k < curve.size(); ++k) {
    if (nodes <= curve[k].nodes) {
      const Breakpoint& a = curve[k - 1];
      const Breakpoint& b = curve[k];
      if (nodes == b.nodes) return b.samples_per_s;
      const double t = static_cast<double>(nodes - a.nodes) / (b.nodes - a.nodes);
      return a.samples_per_s + t * (b.samples_per_s - a.samples_per_s);
    }
  }
  return curve.front().samples_per_s;  // single breakpoint equal to `nodes`
}

double WorkLeftNodeSeconds(const JobSpec& job, double samples) {
  const Curve& curve = job.batch_options.empty() ? job.throughput : job.batch_options[0].throughput;
  return samples * job.min_nodes / Interpolate(curve, job.min_nodes);
}

absl::string_view ObjectiveName(Objective objective) {
  switch (objective) {
    case Objective::kThroughput:
      return "throughput";
    case Objective::kSpeedup:
      return "speedup";
    case Objective::kWeighted:
      return "weighted";
    case Objective::kCompletion:
      return "completion";
  }
  return "unknown";
}

absl::StatusOr<Objective> ParseObjectiveName(absl::string_view name) {
  for (Objective o : {Objective::kThroughput, Objective::kSpeedup, Objective::kWeighted,
                      Objective::kCompletion}) {
    if (name == ObjectiveName(o)) return o;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("objective: unknown objective \"", name,
                   "\"; expected one of throughput, speedup, weighted, completion"));
}

absl::string_view ResizeCostModelName(ResizeCostModel model) {
  switch (model) {
    case ResizeCostModel::kLostWork:
      return "lost_work";
    case ResizeCostModel::kBftrainer:
      return "bftrainer";
  }
  return "unknown";
}

std::string RankAgingProblem(absl::Duration rank_aging, double rank_weight_exponent) {
  if (rank_aging <= absl::ZeroDuration()) {
    return absl::StrCat("must be > 0 (infinite: off), got ", absl::FormatDuration(rank_aging));
  }
  if (rank_aging != absl::InfiniteDuration() && rank_weight_exponent <= 0) {
    return absl::StrCat("is ", absl::FormatDuration(rank_aging),
                        ", but rank weights are off (rank_weight_exponent = 0): aging changes "
                        "only their ranking");
  }
  return "";
}

absl::Status ValidateProblem(const Problem& problem) {
  if (problem.forward_window <= absl::ZeroDuration() ||
      problem.forward_window == absl::InfiniteDuration()) {
    return Invalid("forward_window", absl::StrCat("must be finite and > 0, got ",
                                                  absl::FormatDuration(problem.forward_window)));
  }
  if (!std::isfinite(problem.cross_locality_factor) || problem.cross_locality_factor <= 0 ||
      problem.cross_locality_factor > 1) {
    return Invalid("cross_locality_factor",
                   absl::StrCat("must be in (0, 1], got ", problem.cross_locality_factor));
  }

  if (!std::isfinite(problem.resize_hysteresis) || problem.resize_hysteresis < 1) {
    return Invalid("resize_hysteresis",
                   absl::StrCat("must be finite and >= 1, got ", problem.resize_hysteresis));
  }
  if (!std::isfinite(problem.reclaim_rate) || problem.reclaim_rate < 0) {
    return Invalid("reclaim_rate",
                   absl::StrCat("must be finite and >= 0, got ", problem.reclaim_rate));
  }
  if (!std::isfinite(problem.rank_weight_exponent) || problem.rank_weight_exponent < 0) {
    return Invalid("rank_weight_exponent",
                   absl::StrCat("must be finite and >= 0, got ", problem.rank_weight_exponent));
  }
  if (std::string why = RankAgingProblem(problem.rank_aging, problem.rank_weight_exponent);
      !why.empty()) {
    return Invalid("rank_aging", why);
  }

  absl::flat_hash_set<std::string> class_ids;
  for (size_t c = 0; c < problem.classes.size(); ++c) {
    const NodeClass& cls = problem.classes[c];
    const std::string where = absl::StrFormat("classes[%d]", c);
    MALLE_RETURN_IF_ERROR(ValidateIdString(where + ".id", cls.id));
    if (!class_ids.insert(cls.id).second) {
      return Invalid(where + ".id", absl::StrFormat("duplicate class id \"%s\"", cls.id));
    }
    if (!std::isfinite(cls.speed) || cls.speed <= 0) {
      return Invalid(where + ".speed", absl::StrCat("must be finite and > 0, got ", cls.speed));
    }
  }

  // Views into `problem` (no copy of every id), and each entry's name is
  // formatted only for an error: at ~20,000 idle nodes copying and
  // formatting them took most of a decision's fixed cost (docs/benchmarks.md,
  // "Mira competing").
  absl::flat_hash_set<absl::string_view> node_ids;
  node_ids.reserve(problem.nodes.size());
  for (size_t i = 0; i < problem.nodes.size(); ++i) {
    const Node& node = problem.nodes[i];
    auto where = [i] { return absl::StrFormat("nodes[%d]", i); };
    MALLE_RETURN_IF_ERROR(CheckIdString([&where] { return where() + ".id"; }, node.id));
    if (!node_ids.insert(node.id).second) {
      return Invalid(where() + ".id", absl::StrFormat("duplicate node id \"%s\"", node.id));
    }
    if (problem.classes.empty()) {
      if (!node.class_id.empty() && node.class_id != "default") {
        return Invalid(where() + ".class",
                       absl::StrFormat("unknown class \"%s\" (no classes are defined; leave it "
                                       "empty or use \"default\")",
                                       node.class_id));
      }
    } else if (node.class_id.empty()) {
      if (problem.classes.size() != 1) {
        return Invalid(where() + ".class", "must name one of the classes (there are several)");
      }
    } else if (!class_ids.contains(node.class_id)) {
      return Invalid(where() + ".class", absl::StrFormat("unknown class \"%s\"", node.class_id));
    }
    MALLE_RETURN_IF_ERROR(CheckDuration([&where] { return where() + ".expected_idle"; },
                                        node.expected_idle, /*allow_infinite=*/true));
  }

  absl::flat_hash_set<absl::string_view> job_ids;
  job_ids.reserve(problem.jobs.size());
  absl::flat_hash_map<absl::string_view, absl::string_view> holder;  // node id -> job naming it
  for (size_t j = 0; j < problem.jobs.size(); ++j) {
    const JobSpec& job = problem.jobs[j];
    // Named only for an error, as the nodes above: a replay decides
    // hundreds of thousands of times over a hundred jobs each.
    auto name = [j, &job] { return JobName(j, job); };
    MALLE_RETURN_IF_ERROR(CheckIdString([j] { return absl::StrFormat("jobs[%d].id", j); }, job.id));
    if (!job_ids.insert(job.id).second) {
      return Invalid(absl::StrFormat("jobs[%d].id", j),
                     absl::StrFormat("duplicate job id \"%s\"", job.id));
    }
    if (job.min_nodes < 1) {
      return Invalid(name() + ".min_nodes", absl::StrCat("must be >= 1, got ", job.min_nodes));
    }
    if (job.min_nodes > job.max_nodes) {
      return Invalid(
          name(), absl::StrFormat("min_nodes = %d > max_nodes = %d", job.min_nodes, job.max_nodes));
    }
    if (job.batch_options.empty()) {
      MALLE_RETURN_IF_ERROR(CheckCurve([&name] { return name() + ".throughput"; }, job.throughput,
                                       job.min_nodes, job.max_nodes));
      if (job.current_batch_option != 0) {
        return Invalid(name() + ".current_batch_option",
                       absl::StrCat("must be 0 when the job has no batch_options, got ",
                                    job.current_batch_option));
      }
    } else {
      if (!job.throughput.empty()) {
        return Invalid(name() + ".throughput",
                       "must be empty when batch_options are given (each option has its curve)");
      }
      absl::flat_hash_set<std::string> option_names;
      for (size_t b = 0; b < job.batch_options.size(); ++b) {
        auto where = [&name, b] { return absl::StrFormat("%s.batch_options[%d]", name(), b); };
        MALLE_RETURN_IF_ERROR(
            CheckIdString([&where] { return where() + ".name"; }, job.batch_options[b].name));
        if (!option_names.insert(job.batch_options[b].name).second) {
          return Invalid(where() + ".name", absl::StrFormat("duplicate batch option \"%s\"",
                                                            job.batch_options[b].name));
        }
        MALLE_RETURN_IF_ERROR(CheckCurve([&where] { return where() + ".throughput"; },
                                         job.batch_options[b].throughput, job.min_nodes,
                                         job.max_nodes));
      }
      if (job.current_batch_option < 0 ||
          job.current_batch_option >= static_cast<int>(job.batch_options.size())) {
        return Invalid(name() + ".current_batch_option",
                       absl::StrFormat("must be in [0, %d], got %d", job.batch_options.size() - 1,
                                       job.current_batch_option));
      }
    }
    MALLE_RETURN_IF_ERROR(CheckDuration([&name] { return name() + ".resize_up_pause"; },
                                        job.resize_up_pause, /*allow_infinite=*/false));
    MALLE_RETURN_IF_ERROR(CheckDuration([&name] { return name() + ".resize_down_pause"; },
                                        job.resize_down_pause, /*allow_infinite=*/false));
    if (!std::isfinite(job.weight) || job.weight < 0) {
      return Invalid(name() + ".weight", absl::StrCat("must be finite and >= 0, got ", job.weight));
    }
    if (!std::isfinite(job.remaining_samples) || job.remaining_samples < 0) {
      return Invalid(name() + ".remaining_samples",
                     absl::StrCat("must be finite and >= 0, got ", job.remaining_samples));
    }
    if (problem.objective == Objective::kCompletion && job.remaining_samples <= 0) {
      return Invalid(name() + ".remaining_samples",
                     "must be > 0 for the completion objective (it values work as a share of "
                     "what is left)");
    }
    if (problem.rank_weight_exponent > 0 && job.remaining_samples <= 0) {
      return Invalid(name() + ".remaining_samples",
                     "must be > 0 with rank_weight_exponent > 0 (jobs are ranked by the work "
                     "they have left)");
    }
    MALLE_RETURN_IF_ERROR(
        CheckDuration([&name] { return name() + ".age"; }, job.age, /*allow_infinite=*/false));
    if (!std::isfinite(job.stop_penalty) || job.stop_penalty < 0) {
      return Invalid(name() + ".stop_penalty",
                     absl::StrCat("must be finite and >= 0, got ", job.stop_penalty));
    }
    if (static_cast<int>(job.current_nodes.size()) > job.max_nodes) {
      return Invalid(name() + ".current_nodes",
                     absl::StrFormat("holds %d nodes, more than max_nodes = %d",
                                     job.current_nodes.size(), job.max_nodes));
    }
    for (size_t k = 0; k < job.current_nodes.size(); ++k) {
      const std::string& node = job.current_nodes[k];
      auto where = [&name, k] { return absl::StrFormat("%s.current_nodes[%d]", name(), k); };
      if (!node_ids.contains(node)) {
        return Invalid(where(), absl::StrFormat("unknown node \"%s\" (not in nodes)", node));
      }
      auto [it, inserted] = holder.emplace(node, job.id);
      if (!inserted) {
        return Invalid(where(), it->second == job.id
                                    ? absl::StrFormat("node \"%s\" listed twice", node)
                                    : absl::StrFormat("node \"%s\" is also held by job \"%s\"",
                                                      node, it->second));
      }
    }
  }
  if (problem.objective == Objective::kSpeedup || problem.rank_weight_exponent > 0) {
    for (size_t j = 0; j < problem.jobs.size(); ++j) {
      const JobSpec& job = problem.jobs[j];
      const Curve& curve = job.batch_options.empty() ? job.throughput
                                                     : job.batch_options[0].throughput;
      if (Interpolate(curve, job.min_nodes) <= 0) {
        return Invalid(JobName(j, job) + ".throughput",
                       problem.objective == Objective::kSpeedup
                           ? "throughput at min_nodes is 0, so the speedup objective is undefined"
                           : "throughput at min_nodes is 0, so the work left cannot be ranked "
                             "(rank_weight_exponent > 0)");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace malle::alloc
