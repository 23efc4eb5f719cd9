#include "libmalle/sim/job_mix.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
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
#include "absl/strings/str_format.h"
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

namespace {

// SplitMix64 (Steele, Lea, Flood 2014): tiny, and its output is fixed by its
// definition, unlike std::uniform_real_distribution's.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Unit(); }
  double LogUniform(double lo, double hi) {
    return lo == hi ? lo : std::exp(Uniform(std::log(lo), std::log(hi)));
  }
  int Int(int lo, int hi) {  // [lo, hi]
    return lo + static_cast<int>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double Exponential(double mean) { return -mean * std::log1p(-Unit()); }

 private:
  uint64_t state_;
};

absl::Status RangeError(absl::string_view lo_name, double lo, double hi, absl::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrCat(lo_name, ": [", lo, ", ", hi, "] ", rule));
}

absl::Status ValidateSynthetic(int n, const SyntheticMixOptions& o) {
  if (n < 0 || n > 1'000'000) {
    return absl::InvalidArgumentError(absl::StrCat("n: ", n, " is out of range [0, 1000000]"));
  }
  if (o.mean_interarrival <= absl::ZeroDuration() ||
      o.mean_interarrival == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mean_interarrival: must be finite and > 0, got ",
                     absl::FormatDuration(o.mean_interarrival)));
  }
  constexpr int kMaxNodes = 1'000'000;
  auto int_range = [&](absl::string_view name, int lo, int hi) -> absl::Status {
    if (lo < 1 || hi < lo || hi > kMaxNodes)
      return RangeError(name, lo, hi, "must satisfy 1 <= lo <= hi <= 1000000");
    return absl::OkStatus();
  };
  auto range = [](absl::string_view name, double lo, double hi, double min, bool strict,
                  double max) -> absl::Status {
    const bool ok = std::isfinite(lo) && std::isfinite(hi) && lo <= hi && hi <= max &&
                    (strict ? lo > min : lo >= min);
    if (!ok) {
      return RangeError(name, lo, hi,
                        absl::StrCat("must be finite with ", min, strict ? " < " : " <= ",
                                     "lo <= hi", std::isfinite(max) ? absl::StrCat(" <= ", max) : ""));
    }
    return absl::OkStatus();
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  MALLE_RETURN_IF_ERROR(int_range("min_nodes_lo..min_nodes_hi", o.min_nodes_lo, o.min_nodes_hi));
  MALLE_RETURN_IF_ERROR(int_range("max_nodes_lo..max_nodes_hi", o.max_nodes_lo, o.max_nodes_hi));
  if (o.max_nodes_hi < o.min_nodes_lo) {
    return absl::InvalidArgumentError(absl::StrCat("max_nodes_hi: ", o.max_nodes_hi,
                                                   " is less than min_nodes_lo = ",
                                                   o.min_nodes_lo));
  }
  MALLE_RETURN_IF_ERROR(range("rate_lo..rate_hi", o.rate_lo, o.rate_hi, 0, true, kInf));
  MALLE_RETURN_IF_ERROR(range("serial_lo..serial_hi", o.serial_lo, o.serial_hi, 0, false, 1));
  MALLE_RETURN_IF_ERROR(
      range("work_hours_lo..work_hours_hi", o.work_hours_lo, o.work_hours_hi, 0, true, kInf));
  MALLE_RETURN_IF_ERROR(range("rescale_up_s_lo..rescale_up_s_hi", o.rescale_up_s_lo,
                              o.rescale_up_s_hi, 0, false, kInf));
  MALLE_RETURN_IF_ERROR(range("rescale_down_s_lo..rescale_down_s_hi", o.rescale_down_s_lo,
                              o.rescale_down_s_hi, 0, false, kInf));
  return absl::OkStatus();
}

std::string Exact(double v) { return absl::StrFormat("%.17g", v); }

}  // namespace

absl::StatusOr<JobMix> SyntheticJobMix(int n, uint64_t seed, const SyntheticMixOptions& options) {
  MALLE_RETURN_IF_ERROR(ValidateSynthetic(n, options));
  const SyntheticMixOptions& o = options;
  SplitMix64 rng(seed);
  JobMix mix;
  mix.jobs.reserve(n);
  double arrival = 0;  // seconds after first_submit
  const double mean_gap = absl::ToDoubleSeconds(o.mean_interarrival);
  for (int k = 0; k < n; ++k) {
    if (k > 0) arrival += rng.Exponential(mean_gap);
    MixJob job;
    job.name = absl::StrFormat("S%05d", k);
    job.submit_time = o.first_submit + absl::Seconds(std::floor(arrival));
    job.min_nodes = rng.Int(o.min_nodes_lo, o.min_nodes_hi);
    job.max_nodes = rng.Int(std::max(o.max_nodes_lo, job.min_nodes),
                            std::max(o.max_nodes_hi, job.min_nodes));
    const double r1 = rng.LogUniform(o.rate_lo, o.rate_hi);
    const double s = rng.Uniform(o.serial_lo, o.serial_hi);
    job.work_samples = r1 * rng.LogUniform(o.work_hours_lo, o.work_hours_hi) * 3600;
    job.rescale_up = absl::Seconds(rng.Uniform(o.rescale_up_s_lo, o.rescale_up_s_hi));
    job.rescale_down = absl::Seconds(rng.Uniform(o.rescale_down_s_lo, o.rescale_down_s_hi));
    std::vector<int> sizes = {0, job.min_nodes, job.max_nodes};
    for (int p = 1; p < job.max_nodes; p *= 2) sizes.push_back(p);
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    for (int size : sizes) {
      job.throughput.push_back(
          alloc::Breakpoint{size, size == 0 ? 0.0 : r1 * size / (1 + s * (size - 1))});
    }
    mix.jobs.push_back(std::move(job));
  }
  return mix;
}

absl::StatusOr<std::vector<MixJob>> RepeatMix(const std::vector<MixJob>& jobs, int copies,
                                              absl::Duration period) {
  if (copies < 1 || copies > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("copies: must be in [1, 1000], got ", copies));
  }
  if (period < absl::ZeroDuration() || period == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("period: must be finite and >= 0, got ", absl::FormatDuration(period)));
  }
  if (jobs.size() * static_cast<size_t>(copies) > 10'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("copies: ", copies, " x ", jobs.size(), " jobs is more than 10,000,000 jobs"));
  }
  std::vector<MixJob> out;
  out.reserve(jobs.size() * copies);
  for (int k = 0; k < copies; ++k) {
    for (const MixJob& job : jobs) {
      MixJob copy = job;
      if (k > 0) {
        copy.name = absl::StrCat(job.name, "~", k);
        copy.submit_time += k * period;
      }
      out.push_back(std::move(copy));
    }
  }
  return out;
}

std::string JobMixToCsv(const std::vector<MixJob>& jobs) {
  std::string out =
      "name,submit_time,min_nodes,max_nodes,work_samples,rescale_up_s,rescale_down_s,nodes,"
      "throughput\n";
  for (const MixJob& j : jobs) {
    std::vector<std::string> nodes, rates;
    for (const alloc::Breakpoint& b : j.throughput) {
      nodes.push_back(absl::StrCat(b.nodes));
      rates.push_back(Exact(b.samples_per_s));
    }
    absl::StrAppend(&out, j.name, ",", absl::ToUnixSeconds(j.submit_time), ",", j.min_nodes, ",",
                    j.max_nodes, ",", Exact(j.work_samples), ",",
                    Exact(absl::ToDoubleSeconds(j.rescale_up)), ",",
                    Exact(absl::ToDoubleSeconds(j.rescale_down)), ",", absl::StrJoin(nodes, ";"),
                    ",", absl::StrJoin(rates, ";"), "\n");
  }
  return out;
}

}  // namespace malle::sim
