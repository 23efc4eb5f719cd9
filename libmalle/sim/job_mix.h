// Job mixes: the elastic training jobs a simulation or a benchmark submits.
//
// Defines MixJob (one job of a mix: submit time, node range, work, resize
// pauses and measured throughput curve), JobMix (the parsed jobs plus the
// lines that were rejected), LoadJobMix / ParseJobMix (the CSV reader) and
// ToJobSpec (a MixJob as the allocator's JobSpec), SyntheticJobMix (a mix
// drawn from a seed) and JobMixToCsv (the writer).
//
// File format (see ../shared/data/README.md): UTF-8 text, '#' lines are
// comments, blank lines are ignored, the first other line is the header
//
//   name,submit_time,min_nodes,max_nodes,work_samples,rescale_up_s,rescale_down_s,nodes,throughput
//
// and every following line is one job, e.g.
//
//   J00000-AlexNet,1612988475,1,64,130000000,17.788,11.273,0;1;2;4;8,0;7115.3;13071.7;21066.1;40484.9
//
// submit_time is Unix seconds (integer), nodes/throughput are ';'-separated
// lists of equal length (node counts strictly increasing, throughput in
// samples/s, finite and >= 0) and the curve must cover [min_nodes, max_nodes].
//
//   MALLE_ASSIGN_OR_RETURN(JobMix mix, LoadJobMix("jobs-imagenet-1001.csv"));
//   for (const LineError& e : mix.rejected) std::cerr << e.file << ":" << e.line << ": "
//                                                     << e.message << "\n";
//   alloc::JobSpec spec = ToJobSpec(mix.jobs[0]);
//
// Thread-safety: plain structs and pure functions; LoadJobMix only reads the
// file it is given. All are thread-safe.
#ifndef MALLE_SIM_JOB_MIX_H_
#define MALLE_SIM_JOB_MIX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libmalle/alloc/problem.h"

namespace malle::sim {

struct MixJob {
  std::string name;  // unique within a mix
  absl::Time submit_time = absl::UnixEpoch();
  int min_nodes = 1;
  int max_nodes = 1;
  double work_samples = 0.0;  // samples to train until the job is done (> 0)
  absl::Duration rescale_up = absl::ZeroDuration();    // pause when growing (or starting)
  absl::Duration rescale_down = absl::ZeroDuration();  // pause when shrinking
  alloc::Curve throughput;  // as in the file, (0, 0) included if the file has it
};

// A data line that was not accepted (lenient parsing), or the reason a strict
// parse failed. `line` is 1-based.
struct LineError {
  std::string file;
  int line = 0;
  std::string message;  // names the column, e.g. "min_nodes: 'x' is not an integer"
};

struct JobMix {
  std::vector<MixJob> jobs;          // in file order
  std::vector<LineError> rejected;   // in file order; always empty with strict parsing
};

struct JobMixOptions {
  // true: the first bad data line makes the whole parse fail.
  // false: bad data lines are skipped and listed in JobMix::rejected.
  // A missing or wrong header is an error either way.
  bool strict = false;
};

// Parses `text` (the contents of a job-mix file); `file_name` is only used
// in messages. Never blocks. Returns InvalidArgument "file:line: column:
// message" for a missing or wrong header and, in strict mode, for the first
// bad data line. A header without data lines is an empty (valid) mix.
// Fields are not quoted: a name cannot contain ','.
absl::StatusOr<JobMix> ParseJobMix(absl::string_view text, absl::string_view file_name,
                                   const JobMixOptions& options = {});

// Reads `path` and parses it (blocks on the file read). NotFound if the file
// does not exist, PermissionDenied if it cannot be read, Unavailable for any
// other read failure, and ParseJobMix's errors.
absl::StatusOr<JobMix> LoadJobMix(const std::string& path, const JobMixOptions& options = {});

// The allocator's view of `job`: id = name, same node range and curve,
// resize pauses, weight 1, no current nodes.
alloc::JobSpec ToJobSpec(const MixJob& job);

// The ranges a synthetic mix is drawn from. Every job gets
//   - a submit time: the first at `first_submit`, then Poisson arrivals
//     (exponential gaps of mean `mean_interarrival`), floored to seconds;
//   - min_nodes, max_nodes: integers uniform in their ranges (max_nodes at
//     least min_nodes);
//   - an Amdahl-like curve r(n) = r1 * n / (1 + s * (n - 1)), r1 (samples/s
//     on one node) log-uniform, the serial fraction s uniform, sampled at
//     0, 1, 2, 4, ... and at min_nodes and max_nodes;
//   - work = r1 x (hours on one node) x 3600, the hours log-uniform;
//   - resize pauses uniform in their ranges.
// The defaults resemble jobs-imagenet-1001.csv (one job every 36 s, 1..64
// nodes, 5..40 h of work on one node, 61..100 % parallel efficiency at 64
// nodes, pauses of ~15-20 s up and ~10-13 s down).
struct SyntheticMixOptions {
  absl::Time first_submit = absl::FromUnixSeconds(1'600'000'000);
  absl::Duration mean_interarrival = absl::Seconds(36);
  int min_nodes_lo = 1, min_nodes_hi = 1;
  int max_nodes_lo = 16, max_nodes_hi = 64;
  double rate_lo = 1000, rate_hi = 8000;           // r1, samples/s
  double serial_lo = 0.0, serial_hi = 0.01;        // Amdahl's s, in [0, 1]
  double work_hours_lo = 5, work_hours_hi = 40;    // hours on one node
  double rescale_up_s_lo = 15, rescale_up_s_hi = 20;
  double rescale_down_s_lo = 10, rescale_down_s_hi = 13;
};

// Draws `n` jobs named "S00000", "S00001", ... from `seed`. Deterministic:
// the same (n, seed, options) give the same mix on every run (the generator
// is SplitMix64, not a std:: distribution, whose output varies by standard
// library). Never blocks. InvalidArgument naming the field for n < 0 or
// n > 1,000,000, an empty or out-of-range range (lo > hi, a non-positive
// node count, rate or work, a serial fraction outside [0, 1], a negative
// pause) or a non-positive mean_interarrival.
absl::StatusOr<JobMix> SyntheticJobMix(int n, uint64_t seed,
                                       const SyntheticMixOptions& options = {});

// A heavier variant of a mix, for a saturated regime (the idle pool the
// bottleneck): `copies` copies of `jobs`, copy k (0-based) submitted
// k * period after the original, named "<name>~k" for k > 0. Never blocks.
// InvalidArgument for copies < 1 or > 1,000, a negative or infinite period,
// or more than 10,000,000 jobs in all.
absl::StatusOr<std::vector<MixJob>> RepeatMix(const std::vector<MixJob>& jobs, int copies,
                                              absl::Duration period);

// The mix in the job-mix file format (header + one line per job; numbers
// printed exactly, so ParseJobMix gives the same jobs back). Job names must
// not contain ',' (ParseJobMix guarantees it for what it read).
std::string JobMixToCsv(const std::vector<MixJob>& jobs);

}  // namespace malle::sim

#endif  // MALLE_SIM_JOB_MIX_H_
