// The per-node formulation, as a reference for alloc_bench.
//
// For jobs j, idle nodes i (N of them), forward window T:
//
//   x[j,i] in {0,1}      job j holds node i        sum_j x[j,i] <= 1   (each node)
//   n_j = sum_i x[j,i]   (continuous column; integral because the x are)
//   z_j in {0,1}         job j runs                min_j z_j <= n_j <= max_j z_j
//   lambda[j,k] >= 0, SOS2 over the job's breakpoints b_k (node counts)
//                        sum_k lambda = 1,  sum_k b_k lambda_k = n_j
//   r_j = sum_k rate_k lambda_k  (substituted into the objective, no column)
//   u_j, d_j in {0,1}    grew / shrank             n_j - c_j <= Mu_j u_j
//                                                  c_j - n_j <= Md_j d_j
//   maximise  sum_j T r_j - rate_j(c_j) (up_j u_j + down_j d_j)
//
// where c_j is the job's current node count and rate_j(c_j) = 0 when c_j is
// outside [min_j, max_j] (the job is not running at its current size). This
// is ResizeCostModel::kBftrainer with Objective::kThroughput, the same value
// the count model gives every (job, count) option, so with a single pool the
// two formulations have the same optimum: every count vector the per-node
// model can reach is realisable without migration in one pool.
//
// SOS2 makes r_j the exact linear interpolation between the two breakpoints
// adjacent to n_j, so r_j = alloc::Interpolate(curve, n_j) at every integer
// n_j, between breakpoints too (e.g. 3 nodes on a 0;1;2;4;8 curve).
//
// Big-M. The BFTrainer paper uses one constant, M = |N| + 1, in both resize
// rows. We use the tightest valid constant per row instead:
//   Mu_j = max(max'_j - c_j, 0)  (n_j <= max'_j = min(max_j, N))
//   Md_j = c_j                   (n_j >= 0)
// i.e. never more than max(max_j, c_j). Why it matters:
//   - too small is wrong, not slow: if |N| counts the nodes idle *now*, a job
//     that held more than |N| + 1 nodes before a preemption has
//     c_j - n_j > M for every n_j and the model is infeasible, or (with a
//     constant that is merely below max |n_j - c_j|) feasible allocations are
//     cut off and the "optimum" is not one;
//   - too large is weak: the LP relaxation can pay a fraction
//     (n_j - c_j) / M of a resize, so it barely sees resize costs, its bound
//     is loose and branch-and-bound has to close the gap; with M in the
//     thousands and integrality tolerances of 1e-6..1e-7 it also gets close
//     to letting a one-node change through for free.
// The tight constants make the reference as strong as this formulation can
// be, so the speed comparison is fair to it.
#include "tests/bench/bftrainer_pernode.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <sstream>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libmalle/base/status_macros.h"

namespace malle::bench {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

using alloc::Breakpoint;
using alloc::internal::CbcSettings;
using alloc::internal::MipModel;
using alloc::internal::MipResult;

absl::Status CheckScope(const alloc::Problem& problem) {
  MALLE_RETURN_IF_ERROR(alloc::ValidateProblem(problem));
  if (problem.classes.size() > 1 || (problem.classes.size() == 1 && problem.classes[0].speed != 1.0))
    return absl::InvalidArgumentError(
        "per-node reference: classes must be empty or one class of speed 1");
  for (const alloc::Node& node : problem.nodes) {
    if (node.expected_idle < problem.forward_window)
      return absl::InvalidArgumentError(absl::StrCat(
          "per-node reference: node '", node.id, "' has an idle forecast shorter than the window"));
  }
  if (problem.objective != alloc::Objective::kThroughput)
    return absl::InvalidArgumentError("per-node reference: objective must be kThroughput");
  if (problem.resize_cost != alloc::ResizeCostModel::kBftrainer)
    return absl::InvalidArgumentError("per-node reference: resize_cost must be kBftrainer");
  for (const alloc::JobSpec& job : problem.jobs) {
    if (!job.batch_options.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("per-node reference: job '", job.id, "' has batch options"));
  }
  return absl::OkStatus();
}

// The SOS2 breakpoints of a job that may run on 1..eff_max nodes: (0, 0),
// the curve's breakpoints strictly between 0 and eff_max, and eff_max itself
// (a breakpoint of the curve or interpolated).
std::vector<Breakpoint> SosPoints(const alloc::Curve& curve, int eff_max) {
  std::vector<Breakpoint> pts = {{0, 0.0}};
  for (const Breakpoint& bp : curve) {
    if (bp.nodes > 0 && bp.nodes < eff_max) pts.push_back(bp);
  }
  pts.push_back({eff_max, alloc::Interpolate(curve, eff_max)});
  return pts;
}

// Rate at the current size: 0 when the job cannot run at that size.
double CurrentRate(const alloc::JobSpec& job) {
  const int c = static_cast<int>(job.current_nodes.size());
  if (c < job.min_nodes || c > job.max_nodes) return 0.0;
  return alloc::Interpolate(job.throughput, c);
}

struct JobCols {
  int first_x = 0;  // x[j, i] = first_x + i
  int n = 0, z = 0, u = 0, d = 0;
  int first_lambda = 0;
  std::vector<Breakpoint> pts;  // lambda[k] <-> pts[k]
  int eff_max = 0;
  bool can_run = false;
};

absl::StatusOr<PerNodeResult> SolveInProcess(const alloc::Problem& problem,
                                             const PerNodeOptions& options);

// Child -> parent: one line of numbers, then CBC's detail text.
std::string Serialize(const absl::StatusOr<PerNodeResult>& r) {
  if (!r.ok())
    return absl::StrCat("E ", static_cast<int>(r.status().code()), "\n", r.status().message());
  std::ostringstream out;
  out.precision(17);
  out << "R " << static_cast<int>(r->status) << " " << r->objective << " " << r->best_bound << " "
      << r->evaluated_objective << " " << absl::ToInt64Nanoseconds(r->build_time) << " "
      << absl::ToInt64Nanoseconds(r->solve_time) << " " << r->branch_nodes << " " << r->rows << " "
      << r->columns << " " << r->sos2_sets << " " << r->nodes_per_job.size();
  for (int n : r->nodes_per_job) out << " " << n;
  out << "\n" << r->detail;
  return out.str();
}

absl::StatusOr<PerNodeResult> Deserialize(const std::string& text) {
  std::istringstream in(text);
  std::string tag;
  in >> tag;
  if (tag == "E") {
    int code = 0;
    in >> code;
    std::string message;
    std::getline(in, message);
    std::getline(in, message, '\0');
    return absl::Status(static_cast<absl::StatusCode>(code), message);
  }
  PerNodeResult r;
  int status = 0;
  int64_t build_ns = 0, solve_ns = 0;
  size_t jobs = 0;
  in >> status >> r.objective >> r.best_bound >> r.evaluated_objective >> build_ns >> solve_ns >>
      r.branch_nodes >> r.rows >> r.columns >> r.sos2_sets >> jobs;
  r.nodes_per_job.resize(jobs);
  for (int& n : r.nodes_per_job) in >> n;
  if (tag != "R" || !in) return absl::InternalError("per-node child: malformed result");
  r.status = static_cast<MipResult::Status>(status);
  r.build_time = absl::Nanoseconds(build_ns);
  r.solve_time = absl::Nanoseconds(solve_ns);
  std::getline(in, r.detail);
  std::getline(in, r.detail, '\0');
  return r;
}

absl::StatusOr<PerNodeResult> SolveForked(const alloc::Problem& problem,
                                          const PerNodeOptions& options) {
  int fds[2];
  if (::pipe(fds) != 0) return absl::InternalError(absl::StrCat("pipe: ", errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    const std::string msg = Serialize(SolveInProcess(problem, options));
    size_t done = 0;
    while (done < msg.size()) {
      const ssize_t w = ::write(fds[1], msg.data() + done, msg.size() - done);
      if (w <= 0) ::_exit(2);
      done += static_cast<size_t>(w);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  // CBC stops itself at time_limit; the grace covers model build and a
  // solver that does not look at the clock.
  const absl::Time deadline = absl::Now() + options.time_limit + absl::Seconds(30);
  std::string text;
  bool killed = false;
  char buf[4096];
  for (;;) {
    const int wait_ms = static_cast<int>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    pollfd pfd{fds[0], POLLIN, 0};
    const int ready = ::poll(&pfd, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      ::kill(pid, SIGKILL);  // by pid: the child we forked
      killed = true;
      break;
    }
    const ssize_t got = ::read(fds[0], buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    text.append(buf, static_cast<size_t>(got));
  }
  ::close(fds[0]);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (killed || WIFSIGNALED(wstatus) || (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) != 0)) {
    PerNodeResult r;
    r.status = MipResult::Status::kOther;
    r.evaluated_objective = std::numeric_limits<double>::quiet_NaN();
    r.detail = killed ? "killed at the hard deadline"
               : WIFSIGNALED(wstatus)
                   ? absl::StrCat("crashed (signal ", WTERMSIG(wstatus), ")")
                   : absl::StrCat("child exited with ", WEXITSTATUS(wstatus));
    return r;
  }
  return Deserialize(text);
}

}  // namespace

absl::StatusOr<PerNodeResult> SolveBftrainerPerNode(const alloc::Problem& problem,
                                                    const PerNodeOptions& options) {
  MALLE_RETURN_IF_ERROR(CheckScope(problem));
  return options.isolate ? SolveForked(problem, options) : SolveInProcess(problem, options);
}

namespace {

absl::StatusOr<PerNodeResult> SolveInProcess(const alloc::Problem& problem,
                                             const PerNodeOptions& options) {
  PerNodeResult out;
  const absl::Time build_start = absl::Now();
  const int num_nodes = static_cast<int>(problem.nodes.size());
  const int num_jobs = static_cast<int>(problem.jobs.size());
  const double window_s = absl::ToDoubleSeconds(problem.forward_window);
  absl::flat_hash_map<std::string, int> node_index;
  for (int i = 0; i < num_nodes; ++i) node_index[problem.nodes[i].id] = i;

  MipModel m;
  m.maximize = true;
  std::vector<JobCols> cols(num_jobs);
  for (int j = 0; j < num_jobs; ++j) {
    const alloc::JobSpec& job = problem.jobs[j];
    JobCols& jc = cols[j];
    const int c = static_cast<int>(job.current_nodes.size());
    const double rate_c = CurrentRate(job);
    jc.eff_max = std::min(job.max_nodes, num_nodes);
    jc.can_run = jc.eff_max >= job.min_nodes;
    jc.first_x = m.num_cols();
    for (int i = 0; i < num_nodes; ++i) m.AddCol(0, jc.can_run ? 1 : 0, 0, /*integer=*/true);
    jc.n = m.AddCol(0, jc.can_run ? jc.eff_max : 0, 0, /*integer=*/false);
    jc.z = m.AddCol(0, jc.can_run ? 1 : 0, 0, /*integer=*/true);
    jc.u = m.AddCol(0, 1, -rate_c * absl::ToDoubleSeconds(job.resize_up_pause), true);
    jc.d = m.AddCol(0, 1, -rate_c * absl::ToDoubleSeconds(job.resize_down_pause), true);
    jc.pts = jc.can_run ? SosPoints(job.throughput, jc.eff_max) : std::vector<Breakpoint>{{0, 0}};
    jc.first_lambda = m.num_cols();
    for (const Breakpoint& bp : jc.pts) m.AddCol(0, 1, window_s * bp.samples_per_s, false);

    // n_j = sum_i x[j,i]
    std::vector<int> idx;
    std::vector<double> val;
    idx.reserve(num_nodes + 1);
    val.reserve(num_nodes + 1);
    for (int i = 0; i < num_nodes; ++i) {
      idx.push_back(jc.first_x + i);
      val.push_back(1.0);
    }
    idx.push_back(jc.n);
    val.push_back(-1.0);
    m.AddRow(idx, val, 0, 0);
    // min z <= n <= max' z
    m.AddRow({jc.n, jc.z}, {1.0, -static_cast<double>(job.min_nodes)}, 0, kInf);
    m.AddRow({jc.n, jc.z}, {1.0, -static_cast<double>(jc.eff_max)}, -kInf, 0);
    // Convexity and reference rows of the SOS2 set.
    const int k_count = static_cast<int>(jc.pts.size());
    std::vector<int> lam(k_count);
    std::vector<double> ones(k_count, 1.0), weights(k_count);
    for (int k = 0; k < k_count; ++k) {
      lam[k] = jc.first_lambda + k;
      weights[k] = jc.pts[k].nodes;
    }
    m.AddRow(lam, ones, 1, 1);
    std::vector<int> ref_idx = lam;
    std::vector<double> ref_val = weights;
    ref_idx.push_back(jc.n);
    ref_val.push_back(-1.0);
    m.AddRow(ref_idx, ref_val, 0, 0);
    if (k_count >= 2) m.sos2.push_back(MipModel::Sos2{lam, weights});
    // Resize indicators with the tight big-M (see the file comment).
    const double m_up = std::max(jc.eff_max - c, 0);
    const double m_down = c;
    m.AddRow({jc.n, jc.u}, {1.0, -m_up}, -kInf, c);   // n - c <= Mu u
    m.AddRow({jc.n, jc.d}, {1.0, m_down}, c, kInf);   // c - n <= Md d
  }
  // Each node to at most one job.
  for (int i = 0; i < num_nodes; ++i) {
    std::vector<int> idx(num_jobs);
    std::vector<double> val(num_jobs, 1.0);
    for (int j = 0; j < num_jobs; ++j) idx[j] = cols[j].first_x + i;
    m.AddRow(idx, val, -kInf, 1);
  }

  // The current allocation as a start (a job outside its range stops).
  if (options.use_start) {
    m.start.assign(m.num_cols(), 0.0);
    for (int j = 0; j < num_jobs; ++j) {
      const alloc::JobSpec& job = problem.jobs[j];
      const JobCols& jc = cols[j];
      const int c = static_cast<int>(job.current_nodes.size());
      const bool keeps = jc.can_run && c >= job.min_nodes && c <= jc.eff_max;
      if (!keeps) {
        m.start[jc.first_lambda] = 1.0;  // at (0, 0)
        m.start[jc.d] = c > 0 ? 1.0 : 0.0;
        continue;
      }
      for (const std::string& id : job.current_nodes) m.start[jc.first_x + node_index.at(id)] = 1;
      m.start[jc.n] = c;
      m.start[jc.z] = 1;
      for (size_t k = 0; k < jc.pts.size(); ++k) {
        if (jc.pts[k].nodes == c) {
          m.start[jc.first_lambda + k] = 1.0;
          break;
        }
        if (k + 1 < jc.pts.size() && jc.pts[k].nodes < c && c < jc.pts[k + 1].nodes) {
          const double w = static_cast<double>(jc.pts[k + 1].nodes - c) /
                           (jc.pts[k + 1].nodes - jc.pts[k].nodes);
          m.start[jc.first_lambda + k] = w;
          m.start[jc.first_lambda + k + 1] = 1.0 - w;
          break;
        }
      }
    }
  }
  out.build_time = absl::Now() - build_start;
  out.rows = m.num_rows();
  out.columns = m.num_cols();
  out.sos2_sets = static_cast<int>(m.sos2.size());

  CbcSettings settings;
  settings.time_limit = options.time_limit;
  settings.relative_gap = options.relative_gap;
  const absl::Time solve_start = absl::Now();
  MALLE_ASSIGN_OR_RETURN(MipResult r, alloc::internal::SolveWithCbc(m, settings));
  out.solve_time = absl::Now() - solve_start;
  out.status = r.status;
  out.detail = r.detail;
  out.objective = r.objective;
  out.best_bound = r.best_bound;
  out.branch_nodes = r.branch_nodes;
  out.evaluated_objective = std::numeric_limits<double>::quiet_NaN();
  if (!r.x.empty()) {
    double total = 0;
    for (int j = 0; j < num_jobs; ++j) {
      const alloc::JobSpec& job = problem.jobs[j];
      double held = 0;
      for (int i = 0; i < num_nodes; ++i) held += r.x[cols[j].first_x + i];
      const int n = static_cast<int>(std::lround(held));
      const int c = static_cast<int>(job.current_nodes.size());
      out.nodes_per_job.push_back(n);
      const double rate_c = CurrentRate(job);
      if (n > 0) total += window_s * alloc::Interpolate(job.throughput, n);
      if (n > c) total -= rate_c * absl::ToDoubleSeconds(job.resize_up_pause);
      if (n < c) total -= rate_c * absl::ToDoubleSeconds(job.resize_down_pause);
    }
    out.evaluated_objective = total;
  }
  return out;
}

}  // namespace
}  // namespace malle::bench
