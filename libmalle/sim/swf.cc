#include "libmalle/sim/swf.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/sim/internal/read_file.h"

namespace malle::sim {
namespace {

constexpr int kNumFields = 18;
constexpr const char* kFields[kNumFields] = {
    "job_number",       "submit_time",   "wait_time",       "run_time",       "allocated_procs",
    "average_cpu_time", "used_memory",   "requested_procs", "requested_time", "requested_memory",
    "status",           "user_id",       "group_id",        "executable",     "queue",
    "partition",        "preceding_job", "think_time"};
// Fields that must be whole numbers (0-based): job number, processor counts,
// status. The others may carry fractions (some logs write seconds or memory
// with decimals).
constexpr bool kInteger[kNumFields] = {true,  false, false, false, true, false, false, true, false,
                                       false, true,  true,  true,  true, true,  true,  true, false};
constexpr double kMaxExact = 9007199254740992.0;  // 2^53
constexpr int64_t kMaxMachineNodes = 10'000'000;
// A first submit this many seconds after the log's time 0 (3.2 years) means
// the log gives absolute Unix times: no published log spans that long.
constexpr double kAbsoluteTimeThreshold = 1e8;

std::string Quote(absl::string_view s) {
  constexpr size_t kMax = 40;
  if (s.size() <= kMax) return absl::StrCat("'", s, "'");
  return absl::StrCat("'", s.substr(0, kMax), "...' (", s.size(), " chars)");
}

absl::Status FieldError(int k, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("field ", k + 1, " (", kFields[k], "): ", message));
}

bool IsPartial(int status) { return status >= 2 && status <= 4; }

absl::StatusOr<SwfJob> ParseJobLine(absl::string_view line) {
  const std::vector<absl::string_view> f =
      absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  if (static_cast<int>(f.size()) != kNumFields) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", kNumFields, " whitespace-separated fields, got ", f.size()));
  }
  double v[kNumFields];
  for (int k = 0; k < kNumFields; ++k) {
    if (!absl::SimpleAtod(f[k], &v[k]) || !std::isfinite(v[k])) {
      return FieldError(k, absl::StrCat(Quote(f[k]), " is not a number"));
    }
    if (v[k] < 0 && v[k] != -1) {
      return FieldError(k, absl::StrCat(f[k], " is negative; only -1 (unknown) is allowed"));
    }
    if (kInteger[k] && (v[k] != std::floor(v[k]) || v[k] > kMaxExact)) {
      return FieldError(k, absl::StrCat(Quote(f[k]), " is not an integer"));
    }
  }
  if (v[0] < 0) return FieldError(0, "-1: a job needs a number");
  if (v[10] > 5) {
    return FieldError(10, absl::StrCat(f[10], " is not a status (-1, 0 .. 5)"));
  }
  SwfJob job;
  job.id = static_cast<int64_t>(v[0]);
  job.submit = v[1];
  job.wait = v[2];
  job.run = v[3];
  job.allocated_procs = static_cast<int64_t>(v[4]);
  job.requested_procs = static_cast<int64_t>(v[7]);
  job.status = static_cast<int>(v[10]);
  return job;
}

// A "; Key: value" header comment. Only the keys the replay uses are checked;
// a value must start with a whole number (text after it is a remark).
absl::Status ParseHeaderLine(absl::string_view line, SwfHeader& header,
                             absl::flat_hash_map<std::string, int>& seen, int line_no) {
  absl::string_view body = absl::StripAsciiWhitespace(line.substr(1));
  const size_t colon = body.find(':');
  if (colon == absl::string_view::npos) return absl::OkStatus();  // free-text comment
  const absl::string_view key = absl::StripTrailingAsciiWhitespace(body.substr(0, colon));
  int64_t* target = nullptr;
  int64_t lo = 1;
  if (key == "MaxNodes") {
    target = &header.max_nodes;
  } else if (key == "MaxProcs") {
    target = &header.max_procs;
  } else if (key == "UnixStartTime") {
    target = &header.unix_start_time;
    lo = 0;
  } else {
    return absl::OkStatus();
  }
  auto [it, inserted] = seen.try_emplace(std::string(key), line_no);
  if (!inserted) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": given again (first on line ", it->second, ")"));
  }
  const absl::string_view rest = absl::StripLeadingAsciiWhitespace(body.substr(colon + 1));
  const absl::string_view value = rest.substr(0, rest.find_first_of(" \t"));
  int64_t v = 0;
  if (!absl::SimpleAtoi(value, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", Quote(value), " is not an integer"));
  }
  if (v < lo || (target != &header.unix_start_time && v > kMaxMachineNodes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, ": ", v, " is out of range [", lo, ", ",
        target == &header.unix_start_time ? std::string("...") : absl::StrCat(kMaxMachineNodes),
        "]"));
  }
  *target = v;
  if (target == &header.unix_start_time) header.has_unix_start_time = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SwfLog> ParseSwf(absl::string_view text, absl::string_view file_name,
                                const SwfOptions& options) {
  SwfLog log;
  log.file = std::string(file_name);
  absl::flat_hash_map<std::string, int> header_seen;
  // Job number -> line of its (one) non-partial line.
  absl::flat_hash_map<int64_t, int> line_of_job;
  int line_no = 0;
  auto reject = [&](const absl::Status& status) -> absl::Status {
    if (options.strict) {
      return absl::InvalidArgumentError(
          absl::StrCat(file_name, ":", line_no, ": ", status.message()));
    }
    log.rejected.push_back(
        LineError{std::string(file_name), line_no, std::string(status.message())});
    return absl::OkStatus();
  };
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);  // also drops a '\r'
    if (line.empty()) continue;
    if (line.front() == ';') {
      absl::Status s = ParseHeaderLine(line, log.header, header_seen, line_no);
      if (!s.ok()) MALLE_RETURN_IF_ERROR(reject(s));
      continue;
    }
    ++log.lines;
    absl::StatusOr<SwfJob> job = ParseJobLine(line);
    if (job.ok() && !IsPartial(job->status)) {
      auto [it, inserted] = line_of_job.try_emplace(job->id, line_no);
      if (!inserted) {
        job = FieldError(0, absl::StrCat(job->id, " duplicates the job on line ", it->second,
                                         " (only partial executions, status 2-4, may repeat a "
                                         "job number)"));
      }
    }
    if (!job.ok()) {
      MALLE_RETURN_IF_ERROR(reject(job.status()));
      continue;
    }
    job->line = line_no;
    log.jobs.push_back(*job);
  }
  return log;
}

absl::StatusOr<SwfLog> LoadSwf(const std::string& path, const SwfOptions& options) {
  MALLE_ASSIGN_OR_RETURN(const std::string text, internal::ReadMaybeGzipped(path));
  return ParseSwf(text, path, options);
}

namespace {

struct Interval {
  double submit = 0, start = 0, end = 0;
  int64_t nodes = 0;
  int line = 0;
};

// A state change in log seconds; `announced` (reclaims only) is the submit
// time of the job that takes the node.
struct LogEvent {
  double t = 0;
  int node = 0;
  bool idle = false;
  double announced = 0;
};

// The sweep over start and end times. Per time stamp: ends, then deficits of
// running jobs (in start order), then new starts (in start order); every node
// taken is the lowest-numbered free one.
class SwfReplay {
 public:
  SwfReplay(int64_t num_nodes, std::vector<Interval> jobs, SwfReplayReport& report)
      : n_(num_nodes), jobs_(std::move(jobs)), report_(report) {}

  // Fills events (in replay seconds, converted by the caller) and the report.
  void Run(double t0, std::vector<LogEvent>& events);

 private:
  void Take(int job, int64_t want);
  void Touch(int node);

  const int64_t n_;
  std::vector<Interval> jobs_;  // sorted by (start, line)
  SwfReplayReport& report_;
  std::set<int> free_;
  std::vector<std::vector<int>> held_;
  std::vector<int64_t> deficit_;
  std::vector<char> short_;    // the job ever ran short
  std::set<int> short_now_;    // jobs with a deficit, by start order
  std::vector<char> idle_;     // per node, after the last time stamp
  std::vector<char> touched_;  // per node, during this time stamp
  std::vector<int> touched_list_;
  std::vector<int> taker_;  // per node: the job that last took it
  int64_t asked_ = 0, busy_ = 0, total_deficit_ = 0;
};

void SwfReplay::Touch(int node) {
  if (touched_[node]) return;
  touched_[node] = 1;
  touched_list_.push_back(node);
}

void SwfReplay::Take(int job, int64_t want) {
  while (want > 0 && !free_.empty()) {
    const int node = *free_.begin();
    free_.erase(free_.begin());
    held_[job].push_back(node);
    taker_[node] = job;
    Touch(node);
    --want;
    ++busy_;
  }
}

void SwfReplay::Run(double t0, std::vector<LogEvent>& events) {
  const size_t count = jobs_.size();
  held_.resize(count);
  deficit_.assign(count, 0);
  short_.assign(count, 0);
  idle_.assign(n_, 0);  // an IdleTrace's nodes start busy
  touched_.assign(n_, 0);
  taker_.assign(n_, -1);
  // Ends: (end time, job), earliest first.
  using End = std::pair<double, int>;
  std::priority_queue<End, std::vector<End>, std::greater<End>> ends;
  size_t next_start = 0;
  double now = t0;
  bool first = true;
  while (first || next_start < count || !ends.empty()) {
    double t = first ? t0 : std::numeric_limits<double>::infinity();
    if (next_start < count) t = std::min(t, jobs_[next_start].start);
    if (!ends.empty()) t = std::min(t, ends.top().first);
    const double dt = t - now;
    report_.asked_node_seconds += static_cast<double>(asked_) * dt;
    report_.busy_node_seconds += static_cast<double>(busy_) * dt;
    report_.oversubscribed_node_seconds += static_cast<double>(total_deficit_) * dt;
    now = t;
    if (first) {
      // The log's time 0: every node is free (the log says nothing of jobs
      // that were running before it starts).
      for (int node = 0; node < n_; ++node) {
        free_.insert(free_.end(), node);
        Touch(node);
      }
      first = false;
    }
    while (!ends.empty() && ends.top().first <= t) {
      const int j = ends.top().second;
      ends.pop();
      for (int node : held_[j]) {
        free_.insert(node);
        Touch(node);
      }
      busy_ -= static_cast<int64_t>(held_[j].size());
      held_[j].clear();
      asked_ -= jobs_[j].nodes;
      total_deficit_ -= deficit_[j];
      deficit_[j] = 0;
      short_now_.erase(j);
    }
    for (auto it = short_now_.begin(); it != short_now_.end() && !free_.empty();) {
      const int j = *it;
      const size_t before = held_[j].size();
      Take(j, deficit_[j]);
      const int64_t got = static_cast<int64_t>(held_[j].size() - before);
      deficit_[j] -= got;
      total_deficit_ -= got;
      it = deficit_[j] == 0 ? short_now_.erase(it) : std::next(it);
    }
    for (; next_start < count && jobs_[next_start].start <= t; ++next_start) {
      const int j = static_cast<int>(next_start);
      Take(j, jobs_[j].nodes);
      deficit_[j] = jobs_[j].nodes - static_cast<int64_t>(held_[j].size());
      asked_ += jobs_[j].nodes;
      report_.peak_asked_nodes = std::max(report_.peak_asked_nodes, asked_);
      if (deficit_[j] > 0) {
        total_deficit_ += deficit_[j];
        short_now_.insert(j);
        short_[j] = 1;
      }
      ends.emplace(jobs_[j].end, j);
    }
    // Only nodes whose state differs from before this time stamp change:
    // a node freed and taken again at one time stays busy.
    std::sort(touched_list_.begin(), touched_list_.end());
    for (int node : touched_list_) {
      touched_[node] = 0;
      const bool idle = free_.count(node) > 0;
      if (idle != static_cast<bool>(idle_[node])) {
        idle_[node] = idle;
        LogEvent e;
        e.t = t;
        e.node = node;
        e.idle = idle;
        if (!idle) e.announced = jobs_[taker_[node]].submit;
        events.push_back(e);
      }
    }
    touched_list_.clear();
  }
  for (char s : short_) report_.oversubscribed_jobs += s;
}

}  // namespace

absl::StatusOr<SwfTrace> SwfToIdleTrace(const SwfLog& log, const SwfReplayOptions& options) {
  SwfTrace out;
  SwfReplayReport& report = out.report;
  const SwfHeader& h = log.header;
  if (options.nodes < 0 || options.nodes > kMaxMachineNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("nodes: ", options.nodes, " is out of range [0, ", kMaxMachineNodes, "]"));
  }
  if (options.procs_per_node < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("procs_per_node: ", options.procs_per_node, " must be >= 0"));
  }
  report.nodes = options.nodes > 0 ? options.nodes : h.max_nodes > 0 ? h.max_nodes : h.max_procs;
  if (report.nodes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nodes: ", log.file,
        " has neither '; MaxNodes:' nor '; MaxProcs:' in its header; give the machine size"));
  }
  if (options.procs_per_node > 0) {
    report.procs_per_node = options.procs_per_node;
  } else if (h.max_nodes > 0 && h.max_procs > 0) {
    if (h.max_procs % h.max_nodes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("procs_per_node: ", log.file, "'s MaxProcs (", h.max_procs,
                       ") is not a multiple of MaxNodes (", h.max_nodes, "); give procs_per_node"));
    }
    report.procs_per_node = h.max_procs / h.max_nodes;
  } else {
    report.procs_per_node = 1;
  }

  // Jobs replayed from their partial executions: their summary line is skipped.
  absl::flat_hash_set<int64_t> has_parts;
  for (const SwfJob& j : log.jobs) {
    if (IsPartial(j.status)) has_parts.insert(j.id);
  }
  std::vector<Interval> intervals;
  intervals.reserve(log.jobs.size());
  for (const SwfJob& j : log.jobs) {
    if (!IsPartial(j.status) && has_parts.contains(j.id)) {
      ++report.summary_lines_replaced;
      continue;
    }
    double wait = j.wait;
    if (wait < 0 && options.unknown_wait_is_zero && j.submit >= 0 && j.run >= 0) wait = 0;
    if (j.submit < 0 || wait < 0 || j.run < 0) {
      ++report.jobs_unknown_times;
      continue;
    }
    int64_t procs = j.allocated_procs;
    if (procs <= 0) {
      procs = j.requested_procs;
      if (procs <= 0) {
        ++report.jobs_unknown_procs;
        continue;
      }
      ++report.jobs_requested_procs;
    }
    if (j.run == 0) {
      ++report.jobs_zero_length;
      continue;
    }
    if (j.wait < 0) ++report.jobs_wait_assumed_zero;
    Interval in;
    in.submit = j.submit;
    in.start = j.submit + wait;
    in.end = in.start + j.run;
    in.nodes = (procs + report.procs_per_node - 1) / report.procs_per_node;
    in.line = j.line;
    if (in.nodes > report.nodes) ++report.oversized_jobs;
    intervals.push_back(in);
    ++report.jobs_replayed;
  }
  if (intervals.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        log.file, ": no job occupies a node for a positive time (", log.jobs.size(), " job lines, ",
        log.rejected.size(), " rejected, ", report.jobs_unknown_times,
        " with an unknown submit, wait or run time", ")",
        report.jobs_unknown_times > 0 && !options.unknown_wait_is_zero
            ? "; if the log records no wait times because its submit times are start times, "
              "replay unknown waits as 0 (unknown_wait_is_zero)"
            : ""));
  }
  std::sort(intervals.begin(), intervals.end(), [](const Interval& a, const Interval& b) {
    return a.start != b.start ? a.start < b.start : a.line < b.line;
  });
  // The first event: nothing is replayed before the log says anything (a log
  // with absolute times would otherwise begin with decades of idle nodes).
  double t0 = intervals.front().start;
  double last_end = 0;
  for (const Interval& in : intervals) {
    t0 = std::min(t0, in.submit);
    last_end = std::max(last_end, in.end);
  }
  report.absolute_times = t0 >= kAbsoluteTimeThreshold;
  if (report.absolute_times && h.has_unix_start_time) {
    report.ignored_unix_start_time = h.unix_start_time;
  }
  report.skipped_lead_s = std::max(0.0, t0);
  report.span_s = last_end - t0;

  std::vector<LogEvent> events;
  SwfReplay(report.nodes, std::move(intervals), report).Run(t0, events);

  IdleTrace& trace = out.trace;
  // Absolute times already are Unix seconds: adding UnixStartTime would
  // count the start twice.
  const absl::Time origin = absl::FromUnixSeconds(
      h.has_unix_start_time && !report.absolute_times ? h.unix_start_time : 0);
  const int width = static_cast<int>(absl::StrCat(report.nodes - 1).size());
  trace.nodes.reserve(report.nodes);
  for (int64_t n = 0; n < report.nodes; ++n) {
    trace.nodes.push_back(absl::StrFormat("n%0*d", width, n));
  }
  trace.events.reserve(events.size());
  for (const LogEvent& le : events) {
    IdleEvent e;
    e.time = origin + absl::Seconds(le.t);
    e.node = le.node;
    e.idle = le.idle;
    if (!le.idle) e.announced = origin + absl::Seconds(le.announced);
    trace.events.push_back(e);
  }
  trace.start = origin + absl::Seconds(t0);
  trace.end = origin + absl::Seconds(last_end);
  trace.rows = log.lines;
  trace.rejected = log.rejected;
  return out;
}

}  // namespace malle::sim
