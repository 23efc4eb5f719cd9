// Scheduler logs in the Standard Workload Format (SWF) of the Parallel
// Workloads Archive, and the idle-node trace they imply.
//
// Defines SwfJob / SwfLog and their reader (ParseSwf, LoadSwf), and
// SwfToIdleTrace, which replays the log's start and end times onto a machine
// of the logged size and returns the IdleTrace the simulator replays (the
// same struct LoadIdleTrace fills) with a report of what the replay assumed
// and how far the log over-subscribes the machine.
//
//   MALLE_ASSIGN_OR_RETURN(SwfLog log, LoadSwf("KTH-SP2-1996-2.1-cln.swf.gz"));
//   MALLE_ASSIGN_OR_RETURN(SwfTrace t, SwfToIdleTrace(log));
//   Simulate(t.trace, mix.jobs, options);
//   std::cout << t.report.oversubscribed_node_seconds << "\n";
//
// The format. Lines starting with ';' are header comments; "; MaxNodes: N",
// "; MaxProcs: N" and "; UnixStartTime: T" are read, the others ignored.
// Every other non-blank line is one job: 18 whitespace-separated numbers,
//    1 job number          7 used memory          13 group id
//    2 submit time (s)     8 requested procs      14 executable number
//    3 wait time (s)       9 requested time       15 queue number
//    4 run time (s)       10 requested memory     16 partition number
//    5 allocated procs    11 status               17 preceding job number
//    6 average CPU time   12 user id              18 think time
// -1 means "unknown"; any other negative number, a non-number, a fractional
// job number / processor count / status, or a wrong field count makes the
// line bad. Submit times are seconds since the log's start (UnixStartTime).
//
// Bad lines: strict mode fails on the first with InvalidArgument
// "file:line: field: message"; lenient mode skips the line and lists it in
// SwfLog::rejected. Well-formed jobs that cannot be replayed (unknown times
// or processor counts, zero run time) are not errors: SwfTrace::report counts
// each kind. Nothing is dropped without being counted.
//
// The replay (SwfToIdleTrace), and the assumptions it makes:
//   - the machine has `nodes` nodes (default: MaxNodes, else MaxProcs), named
//     "n0000".."n<N-1>" (zero-padded so that names sort like indices);
//   - a job occupies ceil(procs / procs_per_node) whole nodes, procs being the
//     allocated processors (the requested ones when unknown); procs_per_node
//     defaults to MaxProcs / MaxNodes (1 with only one of them). Nodes are
//     never shared by two jobs;
//   - a job starts at submit + wait and ends at start + run; at one time,
//     ends are applied before starts, so a node freed at t can be reused at t;
//   - node assignment is deterministic: starts in order of (start time, line),
//     each taking the lowest-numbered free nodes;
//   - over-subscription (the log runs more nodes than the machine has, or one
//     job asks for more than the machine): the job takes what is free and the
//     rest of its nodes is its *deficit*; every node freed later goes first to
//     running jobs with a deficit (in start order, lowest index first), then
//     to new starts. So the number of busy nodes is always min(N, what the log
//     asks for), the log's times are never moved, and the report gives the
//     node-seconds asked for beyond N, the jobs that ran short, and the peak;
//   - a job listed with partial executions (status 2, 3, 4: checkpointed or
//     swapped-out parts) is replayed from those lines; its summary line (same
//     job number, status 0, 1, 5 or -1) is skipped and counted;
//   - the trace starts at the log's first event (its earliest submit or
//     start) with every node idle except those starting then, and ends at the
//     last job end: nothing is replayed before the log says anything.
//     Times are UnixStartTime + seconds. Logs published with absolute Unix
//     times (a first submit of 1e8 s or more, i.e. more than three years after
//     the log's time 0, which no relative log has) are read as such: the
//     origin is the Unix epoch, UnixStartTime (if any) is not added, and the
//     report says so (`absolute_times`, `skipped_lead_s`);
//   - every reclaim (a node becoming busy) is announced at the submit time of
//     the job that takes the node (IdleEvent::announced): the moment a
//     backfill scheduler knows the job is queued and can reserve nodes for it
//     (an exact reservation is assumed: the forecast built on it,
//     ForecastMode::kReservation, is an upper bound on what walltime-based
//     reservations give).
//
// Thread-safety: plain structs and pure functions; LoadSwf only reads its
// file. All are thread-safe.
#ifndef MALLE_SIM_SWF_H_
#define MALLE_SIM_SWF_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libmalle/sim/idle_trace.h"
#include "libmalle/sim/job_mix.h"

namespace malle::sim {

// One job line. Times in seconds (fractions allowed), -1 = unknown.
struct SwfJob {
  int line = 0;  // 1-based line in the file
  int64_t id = 0;
  double submit = -1, wait = -1, run = -1;
  int64_t allocated_procs = -1, requested_procs = -1;
  int status = -1;  // 0 failed, 1 completed, 5 cancelled, 2/3/4 partial executions
  // Fields 6, 7, 9, 10, 12..18 are validated but not kept: the replay does not
  // need them.
};

struct SwfHeader {
  int64_t max_nodes = 0;  // 0: not in the header
  int64_t max_procs = 0;  // 0: not in the header
  bool has_unix_start_time = false;
  int64_t unix_start_time = 0;
};

struct SwfLog {
  std::string file;
  SwfHeader header;
  std::vector<SwfJob> jobs;         // in file order
  long long lines = 0;              // job lines read (accepted + rejected)
  std::vector<LineError> rejected;  // in file order; empty with strict parsing
};

struct SwfOptions {
  bool strict = false;  // fail on the first bad line instead of listing it
};

// Parses SWF text; `file_name` only appears in messages. Never blocks.
// InvalidArgument "file:line: field: message" in strict mode.
absl::StatusOr<SwfLog> ParseSwf(absl::string_view text, absl::string_view file_name,
                                const SwfOptions& options = {});

// Reads `path` (gunzipped if it ends in ".gz", as the archive ships its logs)
// and parses it. Blocks on the read. NotFound, DataLoss (corrupt gzip), or
// ParseSwf's errors.
absl::StatusOr<SwfLog> LoadSwf(const std::string& path, const SwfOptions& options = {});

struct SwfReplayOptions {
  int64_t nodes = 0;           // machine size; 0: MaxNodes, else MaxProcs
  int64_t procs_per_node = 0;  // 0: MaxProcs / MaxNodes, 1 if either is absent
  // Some logs record no wait times (-1) because their submit times are start
  // times (e.g. NASA-iPSC-1993, says its header). True: an unknown wait is
  // read as 0 (counted in jobs_wait_assumed_zero); false: such jobs are not
  // replayed (jobs_unknown_times).
  bool unknown_wait_is_zero = false;
};

// What the replay did with the log's jobs. Every job line is counted in
// exactly one of jobs_replayed, jobs_zero_length, jobs_unknown_times,
// jobs_unknown_procs, summary_lines_replaced.
struct SwfReplayReport {
  int64_t nodes = 0;
  int64_t procs_per_node = 1;
  long long jobs_replayed = 0;           // occupied nodes for a positive time
  long long jobs_zero_length = 0;        // run time 0: occupy nothing
  long long jobs_unknown_times = 0;      // submit, wait or run time -1
  long long jobs_wait_assumed_zero = 0;  // replayed with wait 0 (unknown_wait_is_zero)
  long long jobs_unknown_procs = 0;      // allocated and requested procs both -1 (or 0)
  long long jobs_requested_procs = 0;    // replayed with the requested procs (allocated -1)
  long long summary_lines_replaced = 0;  // replaced by the job's partial-execution lines
  // Over-subscription.
  long long oversized_jobs = 0;            // asked for more nodes than the machine has
  long long oversubscribed_jobs = 0;       // ran short of their nodes at some time
  double oversubscribed_node_seconds = 0;  // integral of max(0, asked - nodes)
  double asked_node_seconds = 0;           // integral of what the log asks for
  double busy_node_seconds = 0;            // integral of busy nodes in the trace
  int64_t peak_asked_nodes = 0;            // most nodes the log asks for at once
  // Time.
  bool absolute_times = false;  // submit times read as Unix seconds (see above)
  // With absolute_times: the header's UnixStartTime, which is not added (some
  // logs say 0 and still give Unix times); -1 when the header has none.
  int64_t ignored_unix_start_time = -1;
  double skipped_lead_s = 0;    // log time 0 .. first event, not replayed
  double span_s = 0;            // first event .. last job end
};

struct SwfTrace {
  IdleTrace trace;  // rows = job lines read; rejected = the log's rejected lines
  SwfReplayReport report;
};

// Replays `log` (see the header comment for the assumptions). Never blocks.
// InvalidArgument naming the field when the machine size or processors per
// node are unknown, inconsistent (MaxProcs not a multiple of MaxNodes without
// an explicit procs_per_node) or out of range, or when no job occupies a node
// for a positive time (the trace would be empty).
absl::StatusOr<SwfTrace> SwfToIdleTrace(const SwfLog& log, const SwfReplayOptions& options = {});

}  // namespace malle::sim

#endif  // MALLE_SIM_SWF_H_
