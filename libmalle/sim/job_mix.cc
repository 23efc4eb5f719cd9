#include "libmalle/sim/job_mix.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libmalle/base/status_macros.h"

namespace malle::sim {
namespace {

constexpr const char* kColumns[] = {"name",         "submit_time",    "min_nodes",
                                    "max_nodes",    "work_samples",   "rescale_up_s",
                                    "rescale_down_s", "nodes",        "throughput"};
constexpr int kNumColumns = sizeof(kColumns) / sizeof(kColumns[0]);
constexpr size_t kMaxNameLength = 128;  // alloc::JobSpec::id's limit

// Quotes a field for a message, shortened so a corrupt line cannot flood a log.
std::string Quote(absl::string_view s) {
  constexpr size_t kMax = 40;
  if (s.size() <= kMax) return absl::StrCat("'", s, "'");
  return absl::StrCat("'", s.substr(0, kMax), "...' (", s.size(), " chars)");
}

absl::Status ColumnError(absl::string_view column, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(column, ": ", message));
}

absl::StatusOr<int64_t> ParseInt(absl::string_view column, absl::string_view s, int64_t lo,
                                 int64_t hi) {
  int64_t v = 0;
  if (s.empty()) return ColumnError(column, "empty, expected an integer");
  if (!absl::SimpleAtoi(s, &v))
    return ColumnError(column, absl::StrCat(Quote(s), " is not an integer (or out of range)"));
  if (v < lo || v > hi)
    return ColumnError(column, absl::StrCat(v, " is out of range [", lo, ", ", hi, "]"));
  return v;
}

// A finite number >= lo (strictly greater when `strict_lo`).
absl::StatusOr<double> ParseNumber(absl::string_view column, absl::string_view s, double lo,
                                   bool strict_lo) {
  double v = 0;
  if (s.empty()) return ColumnError(column, "empty, expected a number");
  if (!absl::SimpleAtod(s, &v)) return ColumnError(column, absl::StrCat(Quote(s), " is not a number"));
  if (!std::isfinite(v)) return ColumnError(column, absl::StrCat(Quote(s), " is not finite"));
  if (strict_lo ? !(v > lo) : !(v >= lo))
    return ColumnError(column, absl::StrCat(s, " must be ", strict_lo ? "> " : ">= ", lo));
  return v;
}

std::vector<absl::string_view> SplitList(absl::string_view s) {
  std::vector<absl::string_view> parts = absl::StrSplit(s, ';');
  for (absl::string_view& p : parts) p = absl::StripAsciiWhitespace(p);
  return parts;
}

absl::StatusOr<MixJob> ParseLine(const std::vector<absl::string_view>& f) {
  if (static_cast<int>(f.size()) != kNumColumns)
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", kNumColumns, " comma-separated columns, got ", f.size()));
  MixJob job;
  // name
  if (f[0].empty()) return ColumnError("name", "empty");
  if (f[0].size() > kMaxNameLength)
    return ColumnError("name", absl::StrCat(Quote(f[0]), " is longer than ", kMaxNameLength,
                                            " characters"));
  job.name = std::string(f[0]);
  // submit_time: Unix seconds.
  MALLE_ASSIGN_OR_RETURN(const int64_t submit,
                         ParseInt("submit_time", f[1], 0, std::numeric_limits<int64_t>::max() / 2));
  job.submit_time = absl::FromUnixSeconds(submit);
  constexpr int64_t kMaxNodes = 1'000'000;
  MALLE_ASSIGN_OR_RETURN(const int64_t min_nodes, ParseInt("min_nodes", f[2], 1, kMaxNodes));
  MALLE_ASSIGN_OR_RETURN(const int64_t max_nodes, ParseInt("max_nodes", f[3], 1, kMaxNodes));
  if (min_nodes > max_nodes)
    return ColumnError("max_nodes",
                       absl::StrCat(max_nodes, " is less than min_nodes = ", min_nodes));
  job.min_nodes = static_cast<int>(min_nodes);
  job.max_nodes = static_cast<int>(max_nodes);
  MALLE_ASSIGN_OR_RETURN(job.work_samples, ParseNumber("work_samples", f[4], 0, true));
  MALLE_ASSIGN_OR_RETURN(const double up_s, ParseNumber("rescale_up_s", f[5], 0, false));
  MALLE_ASSIGN_OR_RETURN(const double down_s, ParseNumber("rescale_down_s", f[6], 0, false));
  job.rescale_up = absl::Seconds(up_s);
  job.rescale_down = absl::Seconds(down_s);

  // The curve: two parallel lists.
  const std::vector<absl::string_view> nodes = SplitList(f[7]);
  const std::vector<absl::string_view> rates = SplitList(f[8]);
  if (nodes.size() != rates.size())
    return ColumnError("throughput", absl::StrCat("has ", rates.size(), " entries but nodes has ",
                                                  nodes.size()));
  job.throughput.reserve(nodes.size());
  for (size_t k = 0; k < nodes.size(); ++k) {
    const std::string ncol = absl::StrCat("nodes[", k, "]");
    const std::string tcol = absl::StrCat("throughput[", k, "]");
    MALLE_ASSIGN_OR_RETURN(const int64_t n, ParseInt(ncol, nodes[k], 0, kMaxNodes));
    if (k > 0 && n <= job.throughput.back().nodes)
      return ColumnError(ncol, absl::StrCat(n, " is not greater than nodes[", k - 1, "] = ",
                                            job.throughput.back().nodes,
                                            " (node counts must be strictly increasing)"));
    MALLE_ASSIGN_OR_RETURN(const double rate, ParseNumber(tcol, rates[k], 0, false));
    job.throughput.push_back(alloc::Breakpoint{static_cast<int>(n), rate});
  }
  if (job.throughput.front().nodes > job.min_nodes || job.throughput.back().nodes < job.max_nodes)
    return ColumnError("nodes", absl::StrCat("curve covers [", job.throughput.front().nodes, ", ",
                                             job.throughput.back().nodes,
                                             "], which does not contain [min_nodes, max_nodes] = [",
                                             job.min_nodes, ", ", job.max_nodes, "]"));
  return job;
}

absl::Status LineStatus(absl::string_view file, int line, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(file, ":", line, ": ", message));
}

}  // namespace

absl::StatusOr<JobMix> ParseJobMix(absl::string_view text, absl::string_view file_name,
                                   const JobMixOptions& options) {
  JobMix mix;
  bool have_header = false;
  absl::flat_hash_map<std::string, int> line_of_name;  // accepted names -> their line
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);  // also drops a '\r'
    if (line.empty() || line.front() == '#') continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    for (absl::string_view& f : fields) f = absl::StripAsciiWhitespace(f);
    if (!have_header) {
      // The header is checked exactly: a file with other columns (or columns in
      // another order) would otherwise be read into the wrong fields.
      bool ok = static_cast<int>(fields.size()) == kNumColumns;
      for (int c = 0; ok && c < kNumColumns; ++c) ok = fields[c] == kColumns[c];
      if (!ok)
        return LineStatus(file_name, line_no,
                          absl::StrCat("header: expected '", absl::StrJoin(kColumns, ","),
                                       "', got ", Quote(line)));
      have_header = true;
      continue;
    }
    absl::StatusOr<MixJob> job = ParseLine(fields);
    if (job.ok()) {
      auto [it, inserted] = line_of_name.try_emplace(job->name, line_no);
      if (!inserted)
        job = ColumnError("name", absl::StrCat(Quote(job->name), " duplicates the job on line ",
                                               it->second));
    }
    if (!job.ok()) {
      if (options.strict) return LineStatus(file_name, line_no, job.status().message());
      mix.rejected.push_back(
          LineError{std::string(file_name), line_no, std::string(job.status().message())});
      continue;
    }
    mix.jobs.push_back(*std::move(job));
  }
  if (!have_header)
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": no header line (expected '", absl::StrJoin(kColumns, ","),
                     "')"));
  return mix;
}

absl::StatusOr<JobMix> LoadJobMix(const std::string& path, const JobMixOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string message = absl::StrCat("cannot open job mix '", path, "': ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    if (err == EACCES) return absl::PermissionDeniedError(message);
    return absl::UnavailableError(message);
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::UnavailableError(absl::StrCat("error reading job mix '", path, "'"));
  return ParseJobMix(contents.str(), path, options);
}

alloc::JobSpec ToJobSpec(const MixJob& job) {
  alloc::JobSpec spec;
  spec.id = job.name;
  spec.min_nodes = job.min_nodes;
  spec.max_nodes = job.max_nodes;
  spec.throughput = job.throughput;
  spec.resize_up_pause = job.rescale_up;
  spec.resize_down_pause = job.rescale_down;
  spec.weight = 1.0;
  return spec;
}

}  // namespace malle::sim
