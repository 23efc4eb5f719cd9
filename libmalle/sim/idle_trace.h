// Idle-node traces: when each node of a machine became idle or busy.
//
// Defines IdleEvent, IdleTrace and the reader for the transition format of
// ../shared/data/summit-idle-2021-02.csv.gz:
//
//   # comment lines
//   time,node,idle
//   1612915732,c05n06,0
//
// time = Unix seconds (integer), node = node name, idle = 1 (became idle) or
// 0 (became busy). The rows of the first timestamp give every node's initial
// state; later rows list changes only. Files ending in ".gz" are read through
// zlib.
//
//   MALLE_ASSIGN_OR_RETURN(IdleTrace t, LoadIdleTrace(path));
//   for (const IdleEvent& e : t.events) ...  // sorted by time, then file order
//
// Validation: a malformed row (wrong column count, non-integer time, idle not
// 0/1, empty node name) and a time earlier than the previous row's are
// errors; in lenient mode they are listed in `rejected` (file, line,
// message) and skipped; strict mode fails on the first. A row that repeats a
// node's current state changes nothing and is counted in `redundant_rows`
// (not an error: snapshot-derived traces contain them).
//
// Thread-safety: plain structs and pure functions; thread-safe.
#ifndef MALLE_SIM_IDLE_TRACE_H_
#define MALLE_SIM_IDLE_TRACE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libmalle/sim/job_mix.h"

namespace malle::sim {

struct IdleEvent {
  absl::Time time;
  int node = 0;       // index into IdleTrace::nodes
  bool idle = false;  // true: the node became idle (usable); false: reclaimed
  // For a reclaim (idle = false): when the main scheduler knew of it, e.g.
  // the submit time of the job that takes the node (SWF logs give it), so a
  // forecast may use it from then on (sim::ForecastMode::kReservation).
  // InfiniteFuture: not known before it happens (CSV traces).
  absl::Time announced = absl::InfiniteFuture();
};

struct IdleTrace {
  std::vector<std::string> nodes;  // in order of first appearance
  // State changes only, sorted by time (stable: file order within a time).
  // Nodes start busy; the initial-state rows become events at the first time.
  std::vector<IdleEvent> events;
  absl::Time start = absl::InfinitePast();  // first timestamp
  absl::Time end = absl::InfinitePast();    // last timestamp
  long long rows = 0;            // data rows read
  long long redundant_rows = 0;  // rows that repeated the node's state
  std::vector<LineError> rejected;
};

struct IdleTraceOptions {
  bool strict = false;  // fail on the first bad row instead of listing it
};

// Parses the text of a trace; `file_name` only appears in messages.
absl::StatusOr<IdleTrace> ParseIdleTrace(absl::string_view text, absl::string_view file_name,
                                         const IdleTraceOptions& options = {});

// Reads `path` (gzip-compressed if it ends in ".gz"). NotFound if missing;
// DataLoss for a corrupt gzip stream; otherwise as ParseIdleTrace.
absl::StatusOr<IdleTrace> LoadIdleTrace(const std::string& path,
                                        const IdleTraceOptions& options = {});

}  // namespace malle::sim

#endif  // MALLE_SIM_IDLE_TRACE_H_
