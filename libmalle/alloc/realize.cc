#include "libmalle/alloc/realize.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "libmalle/base/status_macros.h"

namespace malle::alloc {

absl::StatusOr<Allocation> Realize(const Problem& problem, const CountModel& model,
                                   const CountSolution& solution) {
  if (model.jobs.size() != problem.jobs.size() ||
      model.total_nodes != static_cast<int>(problem.nodes.size())) {
    return absl::FailedPreconditionError("Realize: the count model was not compiled from this problem");
  }
  MALLE_RETURN_IF_ERROR(CheckSolution(model, solution));
  const int num_pools = static_cast<int>(model.pools.size());
  std::vector<int> pool_of(problem.nodes.size(), -1);
  for (int p = 0; p < num_pools; ++p) {
    for (int i : model.pools[p].nodes) pool_of[i] = p;
  }
  // Views into `problem`: no copy of every node id per decision.
  absl::flat_hash_map<absl::string_view, int> node_index;
  node_index.reserve(problem.nodes.size());
  for (size_t i = 0; i < problem.nodes.size(); ++i) node_index[problem.nodes[i].id] = i;
  auto shorter_window = [&](int a, int b) {
    const absl::Duration wa = problem.nodes[a].expected_idle;
    const absl::Duration wb = problem.nodes[b].expected_idle;
    return wa != wb ? wa < wb : a < b;
  };

  std::vector<bool> held(problem.nodes.size(), false);
  std::vector<std::vector<int>> kept(problem.jobs.size());
  for (size_t j = 0; j < problem.jobs.size(); ++j) {
    // Per pool, the job's current nodes; it keeps the longest-lived ones.
    std::vector<std::vector<int>> mine(num_pools);
    for (const std::string& id : problem.jobs[j].current_nodes) {
      const int i = node_index.at(id);
      mine[pool_of[i]].push_back(i);
    }
    for (int p = 0; p < num_pools; ++p) {
      std::vector<int>& nodes = mine[p];
      std::sort(nodes.begin(), nodes.end(), shorter_window);
      const int keep = std::min<int>(nodes.size(), solution.per_pool[j][p]);
      // Release the first (shortest window) ones, keep the rest.
      for (size_t k = nodes.size() - keep; k < nodes.size(); ++k) {
        kept[j].push_back(nodes[k]);
        held[nodes[k]] = true;
      }
    }
  }
  // Free nodes per pool, longest expected window first.
  std::vector<std::vector<int>> free(num_pools);
  for (size_t i = 0; i < problem.nodes.size(); ++i) {
    if (!held[i]) free[pool_of[i]].push_back(static_cast<int>(i));
  }
  // Sorted so that pop_back() yields the longest window, lowest index first.
  for (auto& nodes : free) {
    std::sort(nodes.begin(), nodes.end(), [&](int a, int b) {
      const absl::Duration wa = problem.nodes[a].expected_idle;
      const absl::Duration wb = problem.nodes[b].expected_idle;
      return wa != wb ? wa < wb : a > b;
    });
  }

  Allocation allocation;
  for (size_t j = 0; j < problem.jobs.size(); ++j) {
    const JobSpec& spec = problem.jobs[j];
    const JobModel& job = model.jobs[j];
    const Option& opt = job.options[solution.option[j]];
    JobAllocation out;
    out.job_id = spec.id;
    out.previous_nodes = static_cast<int>(spec.current_nodes.size());
    out.batch_option = opt.batch_option;
    out.samples_per_s = opt.samples_per_s;
    out.value = opt.value;
    std::vector<int> count(num_pools, 0);
    // Keep the job's own order for the nodes it keeps (ranks stay stable).
    for (const std::string& id : spec.current_nodes) {
      const int i = node_index.at(id);
      if (std::find(kept[j].begin(), kept[j].end(), i) != kept[j].end()) {
        out.nodes.push_back(id);
        ++count[pool_of[i]];
      }
    }
    for (int p = 0; p < num_pools; ++p) {
      for (int need = solution.per_pool[j][p] - count[p]; need > 0; --need) {
        if (free[p].empty()) {
          return absl::InternalError(absl::StrFormat(
              "Realize: pool %d has no free node left for job \"%s\"", p, spec.id));
        }
        out.nodes.push_back(problem.nodes[free[p].back()].id);
        free[p].pop_back();
      }
    }
    allocation.jobs.push_back(std::move(out));
  }
  std::vector<int> idle;
  for (const auto& nodes : free) idle.insert(idle.end(), nodes.begin(), nodes.end());
  std::sort(idle.begin(), idle.end());
  for (int i : idle) allocation.idle_nodes.push_back(problem.nodes[i].id);
  return allocation;
}

}  // namespace malle::alloc
