// The count formulation (milp.h), its solve in a forked child, and the
// fallback to the DP.
//
// Formulation. For job j and each option o in jobs[j].options, a binary
// y[j,o]; the objective is sum value(o) * y[j,o], every coefficient scaled by
// one common factor so that the largest is 1e3 (values are samples over the
// window and reach 1e9; CBC's absolute tolerances assume moderate numbers).
//   choice:    sum_o y[j,o] = 1                                   per job
// Single pool (or none), the multiple-choice knapsack:
//   capacity:  sum_{j,o} nodes(o) y[j,o] <= capacity              (0 if no pool)
// Several pools: integer x[j,p] in [0, min(capacity_p, max_nodes_j)] for each
// pool p that some pattern of j admits or that j holds nodes of (0 if no
// pattern admits p), and per job:
//   (a) count:    sum_p x[j,p] - sum_o nodes(o) y[j,o] = 0
//   (b) pattern:  x[j,p] - sum_{o: p in pattern(o)} nodes(o) y[j,o] <= 0
//   (c) keep:     x[j,p] - cur[j,p] sum_{o: nodes(o) >= cur_j} y[j,o] >= 0   (cur[j,p] > 0)
//   (d) release:  x[j,p] - sum_{o: nodes(o) > cur_j} nodes(o) y[j,o] <= cur[j,p]  (cur_j > 0)
//   capacity:     sum_j x[j,p] <= capacity_p                        per pool
// (b) is left out where every running option admits p (then (a) implies it).
// These are the rules of count_model.h; CheckSolution verifies every answer.
//
// Isolation. With SolveIsolation::kFork the MipModel is built here, then a
// child is forked that only runs SolveWithCbc and writes a fixed binary
// record to a pipe. The parent waits with poll() until time_limit +
// kill_grace, SIGKILLs the child by pid if it is late, and always reaps it.
// A crash, a hang, a short or malformed record all become a fallback to the
// DP with the cause in `reason`.
#include "libmalle/alloc/milp.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libmalle/alloc/dp.h"
#include "libmalle/alloc/internal/cbc_solver.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"

namespace malle::alloc {
namespace {

using internal::CbcSettings;
using internal::MipModel;
using internal::MipResult;

constexpr double kInf = std::numeric_limits<double>::infinity();
// Largest |objective coefficient| after scaling.
constexpr double kObjectiveScaleTarget = 1e3;

struct Formulation {
  MipModel mip;
  double scale = 1.0;               // objective coefficient = value * scale
  std::vector<std::vector<int>> y;  // y[j][o]: column of job j's option o
  std::vector<std::vector<int>> x;  // x[j][p]: column, or -1 (multi-pool only)
};

// With one pool, an option that uses more nodes than another option of the
// same job for no more value is never needed: the smaller one is feasible
// whenever the larger one is. Leaving such columns out shrinks the model and
// the tree without changing the optimum. The current option is always kept
// (it carries the start). With several pools a smaller option may be
// infeasible where a larger one is not (keep/release rules), so all stay.
std::vector<bool> NeededOptions(const CountModel& model, const JobModel& job) {
  std::vector<bool> needed(job.options.size(), true);
  if (!model.single_pool()) return needed;
  std::vector<int> order(job.options.size());
  for (size_t o = 0; o < order.size(); ++o) order[o] = static_cast<int>(o);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return job.options[a].nodes < job.options[b].nodes;
  });
  double best_below = -kInf;  // best value with fewer nodes than the current group
  double best_here = -kInf;   // best value with exactly `nodes` nodes
  int nodes = -1;
  for (int o : order) {
    const Option& opt = job.options[o];
    if (opt.nodes != nodes) {
      best_below = std::max(best_below, best_here);
      best_here = -kInf;
      nodes = opt.nodes;
    }
    if (opt.value <= best_below && o != job.current_option && o != 0) needed[o] = false;
    best_here = std::max(best_here, opt.value);
  }
  return needed;
}

// `start`: the first incumbent (nullptr: the current allocation), or no
// start at all when `use_start` is false.
Formulation BuildFormulation(const CountModel& model, bool use_start, const CountSolution* start) {
  Formulation f;
  double largest = 0.0;
  for (const JobModel& job : model.jobs) {
    for (const Option& o : job.options) largest = std::max(largest, std::fabs(o.value));
  }
  if (largest > 0.0) f.scale = kObjectiveScaleTarget / largest;

  const int num_jobs = static_cast<int>(model.jobs.size());
  const int num_pools = static_cast<int>(model.pools.size());
  MipModel& mip = f.mip;
  mip.maximize = true;
  f.y.resize(num_jobs);
  for (int j = 0; j < num_jobs; ++j) {
    const JobModel& job = model.jobs[j];
    const std::vector<bool> needed = NeededOptions(model, job);
    std::vector<int> cols;
    for (size_t o = 0; o < job.options.size(); ++o) {
      if (!needed[o]) {
        f.y[j].push_back(-1);
        continue;
      }
      f.y[j].push_back(mip.AddCol(0, 1, job.options[o].value * f.scale, /*integer=*/true));
      cols.push_back(f.y[j].back());
    }
    mip.AddRow(cols, std::vector<double>(cols.size(), 1.0), 1, 1);
  }

  if (model.single_pool()) {
    std::vector<int> cols;
    std::vector<double> nodes;
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = model.jobs[j];
      for (size_t o = 0; o < job.options.size(); ++o) {
        if (job.options[o].nodes == 0 || f.y[j][o] < 0) continue;
        cols.push_back(f.y[j][o]);
        nodes.push_back(job.options[o].nodes);
      }
    }
    mip.AddRow(cols, nodes, -kInf, model.pools.empty() ? 0 : model.pools[0].capacity);
  } else {
    std::vector<std::vector<int>> pool_cols(num_pools);
    f.x.assign(num_jobs, std::vector<int>(num_pools, -1));
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = model.jobs[j];
      const int cur = job.current_nodes;
      // Which pools each option admits, and whether every running option
      // admits a pool.
      std::vector<int> admitted_by(num_pools, 0);
      int running = 0;
      for (const Option& o : job.options) {
        if (o.nodes == 0) continue;
        ++running;
        for (int p : job.patterns[o.pattern].pools) ++admitted_by[p];
      }
      std::vector<int> count_cols;
      std::vector<double> count_vals;
      for (int p = 0; p < num_pools; ++p) {
        if (admitted_by[p] == 0 && job.current_per_pool[p] == 0) continue;
        const int ub = admitted_by[p] == 0 ? 0 : std::min(model.pools[p].capacity, job.max_nodes);
        const int xc = mip.AddCol(0, ub, 0.0, /*integer=*/true);
        f.x[j][p] = xc;
        pool_cols[p].push_back(xc);
        count_cols.push_back(xc);
        count_vals.push_back(1.0);
      }
      // (a)
      for (size_t o = 0; o < job.options.size(); ++o) {
        if (job.options[o].nodes == 0) continue;
        count_cols.push_back(f.y[j][o]);
        count_vals.push_back(-job.options[o].nodes);
      }
      mip.AddRow(count_cols, count_vals, 0, 0);
      for (int p = 0; p < num_pools; ++p) {
        const int xc = f.x[j][p];
        if (xc < 0) continue;
        // (b)
        if (admitted_by[p] > 0 && admitted_by[p] < running) {
          std::vector<int> cols = {xc};
          std::vector<double> vals = {1.0};
          for (size_t o = 0; o < job.options.size(); ++o) {
            const Option& opt = job.options[o];
            if (opt.nodes == 0) continue;
            const std::vector<int>& pools = job.patterns[opt.pattern].pools;
            if (!std::binary_search(pools.begin(), pools.end(), p)) continue;
            cols.push_back(f.y[j][o]);
            vals.push_back(-opt.nodes);
          }
          mip.AddRow(cols, vals, -kInf, 0);
        }
        const int held = job.current_per_pool[p];
        // (c)
        if (held > 0) {
          std::vector<int> cols = {xc};
          std::vector<double> vals = {1.0};
          for (size_t o = 0; o < job.options.size(); ++o) {
            if (job.options[o].nodes < cur) continue;
            cols.push_back(f.y[j][o]);
            vals.push_back(-held);
          }
          mip.AddRow(cols, vals, 0, kInf);
        }
        // (d)
        if (cur > 0) {
          std::vector<int> cols = {xc};
          std::vector<double> vals = {1.0};
          for (size_t o = 0; o < job.options.size(); ++o) {
            if (job.options[o].nodes <= cur) continue;
            cols.push_back(f.y[j][o]);
            vals.push_back(-job.options[o].nodes);
          }
          mip.AddRow(cols, vals, -kInf, held);
        }
      }
    }
    for (int p = 0; p < num_pools; ++p) {
      mip.AddRow(pool_cols[p], std::vector<double>(pool_cols[p].size(), 1.0), -kInf,
                 model.pools[p].capacity);
    }
  }

  // Identical jobs (same options, values, patterns and current nodes) are
  // interchangeable: any solution stays optimal with their choices swapped.
  // Jobs of one model submitted many times (HPO trials, the ImageNet mixes)
  // make this common, and branch-and-bound would otherwise explore every
  // permutation of them. Order them: count(a) >= count(b) for consecutive
  // identical jobs. Their current counts are equal, so the start obeys it.
  std::map<std::string, std::vector<int>> kinds;  // identical jobs, in index order
  {
    std::map<std::string, int> last_of_kind;
    for (int j = 0; j < num_jobs; ++j) {
      const JobModel& job = model.jobs[j];
      std::string key;
      auto put = [&key](const void* data, size_t size) {
        key.append(static_cast<const char*>(data), size);
      };
      for (const Option& o : job.options) {
        put(&o.nodes, sizeof(o.nodes));
        put(&o.value, sizeof(o.value));
        put(&o.batch_option, sizeof(o.batch_option));
        const std::vector<int>& pools =
            o.pattern >= 0 ? job.patterns[o.pattern].pools : std::vector<int>{};
        const int size = static_cast<int>(pools.size());
        put(&size, sizeof(size));
        if (size > 0) put(pools.data(), pools.size() * sizeof(int));
      }
      put(job.current_per_pool.data(), job.current_per_pool.size() * sizeof(int));
      put(&job.current_option, sizeof(job.current_option));
      kinds[key].push_back(j);
      auto [it, first] = last_of_kind.emplace(std::move(key), j);
      if (first) continue;
      const int prev = it->second;
      it->second = j;
      std::vector<int> cols;
      std::vector<double> vals;
      for (size_t o = 0; o < job.options.size(); ++o) {
        if (job.options[o].nodes == 0 || f.y[j][o] < 0) continue;
        cols.push_back(f.y[prev][o]);
        vals.push_back(job.options[o].nodes);
        cols.push_back(f.y[j][o]);
        vals.push_back(-job.options[o].nodes);
      }
      if (!cols.empty()) mip.AddRow(cols, vals, 0, kInf);
    }
  }

  if (use_start) {
    // Keeping every job where it is obeys every rule, so CBC starts with an
    // incumbent and a time limit can never leave it with nothing.
    CountSolution current = start != nullptr ? *start : CurrentSolution(model);
    if (start != nullptr) {
      // A given start may use an option left out as dominated (a DP breaks
      // ties its own way): the best kept option with no more nodes is worth
      // at least as much and needs no more capacity (one pool only, the only
      // case where options are left out).
      for (int j = 0; j < num_jobs; ++j) {
        const JobModel& job = model.jobs[j];
        const int o = current.option[j];
        if (f.y[j][o] >= 0) continue;
        int best = 0;
        for (size_t k = 0; k < job.options.size(); ++k) {
          if (f.y[j][k] < 0 || job.options[k].nodes > job.options[o].nodes) continue;
          const Option& b = job.options[best];
          const Option& c = job.options[k];
          if (c.value > b.value || (c.value == b.value && c.nodes < b.nodes)) {
            best = static_cast<int>(k);
          }
        }
        current.option[j] = best;
        if (num_pools == 1) current.per_pool[j][0] = job.options[best].nodes;
      }
      // Identical jobs are interchangeable; the ordering rows above want
      // non-increasing counts in index order.
      for (const auto& [key, group] : kinds) {
        if (group.size() < 2) continue;
        std::vector<std::pair<int, std::vector<int>>> choices;
        for (int j : group) choices.emplace_back(current.option[j], current.per_pool[j]);
        const JobModel& job = model.jobs[group[0]];
        std::stable_sort(choices.begin(), choices.end(), [&job](const auto& a, const auto& b) {
          return job.options[a.first].nodes > job.options[b.first].nodes;
        });
        for (size_t k = 0; k < group.size(); ++k) {
          current.option[group[k]] = choices[k].first;
          current.per_pool[group[k]] = std::move(choices[k].second);
        }
      }
    }
    mip.start.assign(mip.num_cols(), 0.0);
    for (int j = 0; j < num_jobs; ++j) {
      mip.start[f.y[j][current.option[j]]] = 1.0;
      if (f.x.empty()) continue;
      for (int p = 0; p < num_pools; ++p) {
        if (f.x[j][p] >= 0) mip.start[f.x[j][p]] = current.per_pool[j][p];
      }
    }
  }
  return f;
}

// The count solution a column vector stands for (not yet checked).
CountSolution Extract(const CountModel& model, const Formulation& f, const std::vector<double>& x) {
  CountSolution s;
  const size_t num_pools = model.pools.size();
  for (size_t j = 0; j < model.jobs.size(); ++j) {
    const JobModel& job = model.jobs[j];
    int best = 0;  // option 0 (stop) always has a column
    for (size_t o = 1; o < job.options.size(); ++o) {
      if (f.y[j][o] >= 0 && x[f.y[j][o]] > x[f.y[j][best]]) best = static_cast<int>(o);
    }
    s.option.push_back(best);
    std::vector<int> per_pool(num_pools, 0);
    if (f.x.empty()) {
      if (num_pools == 1) per_pool[0] = job.options[best].nodes;
    } else {
      for (size_t p = 0; p < num_pools; ++p) {
        if (f.x[j][p] >= 0) per_pool[p] = static_cast<int>(std::lround(x[f.x[j][p]]));
      }
    }
    s.per_pool.push_back(std::move(per_pool));
  }
  s.objective = SolutionObjective(model, s.option);
  return s;
}

// --- The child and its record ---------------------------------------------
//
// Record: header, then n_x doubles, then `detail_len` bytes, then the magic
// again. Native byte order: parent and child are the same binary.

constexpr uint32_t kRecordMagic = 0x4d494c50;  // "MILP"

struct RecordHeader {
  uint32_t magic;
  int32_t status_code;  // absl::StatusCode of SolveWithCbc; 0 = OK
  int32_t mip_status;   // MipResult::Status
  int32_t reserved;
  double objective;
  double best_bound;
  int64_t branch_nodes;
  uint64_t n_x;
  uint64_t detail_len;
};

std::string EncodeRecord(const absl::StatusOr<MipResult>& r) {
  RecordHeader h{};
  h.magic = kRecordMagic;
  std::string detail;
  std::vector<double> xs;
  if (r.ok()) {
    h.mip_status = static_cast<int32_t>(r->status);
    h.objective = r->objective;
    h.best_bound = r->best_bound;
    h.branch_nodes = r->branch_nodes;
    xs = r->x;
    detail = r->detail;
  } else {
    h.status_code = static_cast<int32_t>(r.status().code());
    detail = std::string(r.status().message());
  }
  h.n_x = xs.size();
  h.detail_len = detail.size();
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out.append(reinterpret_cast<const char*>(xs.data()), xs.size() * sizeof(double));
  out.append(detail);
  out.append(reinterpret_cast<const char*>(&kRecordMagic), sizeof(kRecordMagic));
  return out;
}

absl::StatusOr<MipResult> DecodeRecord(const std::string& bytes) {
  const auto garbage = [&](const char* what) {
    return absl::DataLossError(
        absl::StrFormat("solver returned garbage (%d bytes, %s)", bytes.size(), what));
  };
  RecordHeader h;
  if (bytes.size() < sizeof(h) + sizeof(kRecordMagic)) return garbage("too short");
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kRecordMagic) return garbage("bad magic");
  if (h.n_x > bytes.size() / sizeof(double) || h.detail_len > bytes.size() ||
      sizeof(h) + h.n_x * sizeof(double) + h.detail_len + sizeof(kRecordMagic) != bytes.size()) {
    return garbage("length mismatch");
  }
  uint32_t tail;
  std::memcpy(&tail, bytes.data() + bytes.size() - sizeof(tail), sizeof(tail));
  if (tail != kRecordMagic) return garbage("bad trailer");
  const char* p = bytes.data() + sizeof(h);
  std::string detail(p + h.n_x * sizeof(double), h.detail_len);
  if (h.status_code != 0) {
    if (h.status_code < 0 || h.status_code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
      return garbage("bad status code");
    }
    return absl::Status(static_cast<absl::StatusCode>(h.status_code), detail);
  }
  if (h.mip_status < 0 || h.mip_status > static_cast<int>(MipResult::Status::kOther)) {
    return garbage("bad solver status");
  }
  MipResult r;
  r.status = static_cast<MipResult::Status>(h.mip_status);
  r.objective = h.objective;
  r.best_bound = h.best_bound;
  r.branch_nodes = h.branch_nodes;
  r.x.resize(h.n_x);
  std::memcpy(r.x.data(), p, h.n_x * sizeof(double));
  r.detail = std::move(detail);
  return r;
}

bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Runs in the forked child: no logging, no locks, no return.
[[noreturn]] void ChildMain(int fd, const MipModel& mip, const CbcSettings& settings,
                            MilpFault fault) {
  switch (fault) {
    case MilpFault::kNone:
      break;
    case MilpFault::kCrash: {
      // No core file: the test provokes this on purpose.
      struct rlimit no_core = {0, 0};
      setrlimit(RLIMIT_CORE, &no_core);
      signal(SIGSEGV, SIG_DFL);
      raise(SIGSEGV);
      _exit(3);  // not reached
    }
    case MilpFault::kHang:
      for (;;) pause();
    case MilpFault::kGarbage: {
      char junk[512];
      uint32_t state = static_cast<uint32_t>(getpid()) * 2654435761u + 1;
      for (char& c : junk) {
        state = state * 1664525u + 1013904223u;
        c = static_cast<char>(state >> 24);
      }
      WriteAll(fd, junk, sizeof(junk));
      _exit(0);
    }
  }
  const std::string record = EncodeRecord(internal::SolveWithCbc(mip, settings));
  _exit(WriteAll(fd, record.data(), record.size()) ? 0 : 2);
}

// Solves in a forked child. Errors: the child's own SolveWithCbc error, or
// Unavailable/DataLoss/DeadlineExceeded describing what went wrong with it.
absl::StatusOr<MipResult> SolveForked(const MipModel& mip, const CbcSettings& settings,
                                      const MilpOptions& options) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe2 failed: ", std::strerror(errno)));
  }
  const absl::Time deadline = absl::Now() + options.time_limit + options.kill_grace;
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::UnavailableError(absl::StrCat("fork failed: ", std::strerror(err)));
  }
  if (pid == 0) {
    close(fds[0]);
    ChildMain(fds[1], mip, settings, options.fault);
  }
  close(fds[1]);

  std::string bytes;
  bool timed_out = false;
  absl::Status io_error;
  char buf[1 << 16];
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    struct pollfd pfd = {fds[0], POLLIN, 0};
    // Capped so that an infinite time limit cannot overflow the int.
    const double ms = std::ceil(absl::ToDoubleMilliseconds(std::min(left, absl::Minutes(1))));
    const int ready = poll(&pfd, 1, std::max(static_cast<int>(ms), 1));
    if (ready < 0) {
      if (errno == EINTR) continue;
      io_error = absl::UnavailableError(absl::StrCat("poll failed: ", std::strerror(errno)));
      break;
    }
    if (ready == 0) continue;  // re-check the deadline
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      io_error = absl::UnavailableError(absl::StrCat("read failed: ", std::strerror(errno)));
      break;
    }
    if (n == 0) break;  // EOF: the child closed its end (exited)
    bytes.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timed_out || !io_error.ok()) kill(pid, SIGKILL);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) {
      return absl::InternalError(absl::StrCat("waitpid failed: ", std::strerror(errno)));
    }
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrFormat("solver hung (killed after %s)",
                        absl::FormatDuration(options.time_limit + options.kill_grace)));
  }
  MALLE_RETURN_IF_ERROR(io_error);
  if (WIFSIGNALED(wstatus)) {
    return absl::UnavailableError(absl::StrFormat("solver crashed (signal %d)", WTERMSIG(wstatus)));
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return absl::UnavailableError(
        absl::StrFormat("solver exited with status %d", WEXITSTATUS(wstatus)));
  }
  return DecodeRecord(bytes);
}

// Serialises CBC: it is not known to be reentrant, and a forked solve per
// caller would only multiply memory for no gain on the allocator's cores.
absl::StatusOr<MipResult> SolveSerialised(const MipModel& mip, const CbcSettings& settings,
                                          const MilpOptions& options) {
  static absl::Mutex mu;
  absl::MutexLock lock(&mu);
  if (options.isolation == SolveIsolation::kInProcess) {
    return internal::SolveWithCbc(mip, settings);
  }
  return SolveForked(mip, settings, options);
}

}  // namespace

absl::StatusOr<PolicyResult> SolveMilp(const CountModel& model, const MilpOptions& options) {

  const absl::Time start = absl::Now();
  // The DP's answer as the start (dp_start), kept for the fallback too.
  std::optional<absl::StatusOr<PolicyResult>> dp;
  if (options.use_mip_start && options.dp_start) dp = SolveDp(model, options.fallback);
  const bool dp_started = dp.has_value() && dp->ok();
  Formulation f = BuildFormulation(model, options.use_mip_start,
                                   dp_started ? &(*dp)->solution : nullptr);
  CbcSettings settings;
  settings.time_limit = options.time_limit;
  settings.relative_gap = options.relative_gap;

  absl::StatusOr<MipResult> solved = SolveSerialised(f.mip, settings, options);

  std::string cause;  // why the DP must answer; empty when the MILP does
  PolicyResult result;
  if (!solved.ok()) {
    cause = std::string(solved.status().message());
  } else if (solved->status != MipResult::Status::kOptimal &&
             solved->status != MipResult::Status::kLimitWithSolution) {
    cause = absl::StrCat("solver status ", internal::MipStatusName(solved->status), " (",
                         solved->detail, ")");
  } else if (solved->x.size() != static_cast<size_t>(f.mip.num_cols())) {
    cause = absl::StrFormat("solver returned %d values for %d columns", solved->x.size(),
                            f.mip.num_cols());
  } else {
    result.solution = Extract(model, f, solved->x);
    const absl::Status check = CheckSolution(model, result.solution);
    if (!check.ok()) cause = absl::StrCat("solver answer rejected: ", check.message());
  }

  if (cause.empty() && dp_started &&
      result.solution.objective < (*dp)->solution.objective -
                                      1e-12 * std::max(1.0, std::fabs((*dp)->solution.objective))) {
    // Only possible when CBC rejected the start (it reports why in its
    // detail): the DP's answer is better, so it is the answer.
    cause = absl::StrCat("answer below the dp start (", solved->detail, ")");
  }
  if (cause.empty()) {
    const MipResult& mr = *solved;
    result.best_bound = std::max(mr.best_bound / f.scale, result.solution.objective);
    result.branch_nodes = mr.branch_nodes;
    if (mr.status == MipResult::Status::kOptimal) {
      result.optimal = true;
      result.reason = absl::StrFormat("milp: optimal, objective %.6g (%d branch nodes)",
                                      result.solution.objective, mr.branch_nodes);
    } else {
      const double obj = result.solution.objective;
      const double gap = (result.best_bound - obj) / std::max(std::fabs(obj), 1e-12);
      result.reason = absl::StrFormat(
          "milp: time limit %s reached; incumbent %.6g, bound %.6g (gap %.3g%%)",
          absl::FormatDuration(options.time_limit), obj, result.best_bound, 100.0 * gap);
    }
    if (dp_started) absl::StrAppend(&result.reason, "; started from the dp's answer");
    // A start CBC refused is a bug in the start (it obeys every rule by
    // construction): say so rather than lose it.
    if (const size_t at = mr.detail.find("start ignored"); at != std::string::npos) {
      absl::StrAppend(&result.reason, "; cbc: ", mr.detail.substr(at));
    }
  } else {
    if (!dp.has_value()) dp = SolveDp(model, options.fallback);
    if (!dp->ok()) {
      return absl::Status(
          dp->status().code(),
          absl::StrCat(dp->status().message(), " (the dp was the fallback of milp: ", cause, ")"));
    }
    result = **std::move(dp);
    result.fell_back = true;
    result.reason = absl::StrCat("milp: ", cause, "; answered by dp: ", result.reason);
    if (solved.ok()) result.branch_nodes = solved->branch_nodes;
    MALLE_LOG(WARNING) << result.reason;
  }
  result.rows = f.mip.num_rows();
  result.columns = f.mip.num_cols();
  result.solve_time = absl::Now() - start;
  return result;
}

}  // namespace malle::alloc
