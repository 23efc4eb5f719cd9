#include "libmalle/sim/idle_trace.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/sim/internal/read_file.h"

namespace malle::sim {
namespace {

constexpr absl::string_view kHeader = "time,node,idle";
constexpr size_t kMaxNodeName = 128;

// One data row split on ','; the message names the column, as job_mix does.
absl::Status ParseRow(absl::string_view row, int64_t* time, absl::string_view* node, bool* idle) {
  const size_t c1 = row.find(',');
  const size_t c2 = c1 == absl::string_view::npos ? c1 : row.find(',', c1 + 1);
  if (c2 == absl::string_view::npos || row.find(',', c2 + 1) != absl::string_view::npos) {
    size_t columns = 1;
    for (char c : row) columns += c == ',';
    return absl::InvalidArgumentError(
        absl::StrCat("expected 3 columns (time,node,idle), got ", columns));
  }
  const absl::string_view t = row.substr(0, c1);
  const absl::string_view n = row.substr(c1 + 1, c2 - c1 - 1);
  const absl::string_view i = row.substr(c2 + 1);
  if (!absl::SimpleAtoi(t, time) || *time < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("time: '", t, "' is not a non-negative integer (Unix seconds)"));
  }
  if (n.empty()) return absl::InvalidArgumentError("node: empty node name");
  if (n.size() > kMaxNodeName) {
    return absl::InvalidArgumentError(
        absl::StrCat("node: name longer than ", kMaxNodeName, " characters"));
  }
  if (i == "1") {
    *idle = true;
  } else if (i == "0") {
    *idle = false;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("idle: '", i, "' is not 0 or 1"));
  }
  *node = n;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IdleTrace> ParseIdleTrace(absl::string_view text, absl::string_view file_name,
                                         const IdleTraceOptions& options) {
  IdleTrace trace;
  absl::flat_hash_map<std::string, int> index;
  std::vector<char> state;  // per node: 1 idle, 0 busy (nodes start busy)
  bool have_header = false;
  int64_t last_time = std::numeric_limits<int64_t>::min();
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == absl::string_view::npos) end = text.size();
    absl::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') {
      if (end == text.size()) break;
      continue;
    }
    if (!have_header) {
      if (absl::StripAsciiWhitespace(line) != kHeader) {
        return absl::InvalidArgumentError(absl::StrCat(file_name, ":", line_no,
                                                       ": expected the header '", kHeader,
                                                       "', got '", line, "'"));
      }
      have_header = true;
      continue;
    }
    int64_t time = 0;
    absl::string_view node;
    bool idle = false;
    absl::Status row = ParseRow(line, &time, &node, &idle);
    if (row.ok() && time < last_time) {
      row = absl::InvalidArgumentError(absl::StrCat(
          "time: ", time, " is earlier than the previous row's ", last_time,
          " (rows must be in time order)"));
    }
    if (!row.ok()) {
      if (options.strict) {
        return absl::InvalidArgumentError(
            absl::StrCat(file_name, ":", line_no, ": ", row.message()));
      }
      trace.rejected.push_back(LineError{std::string(file_name), line_no, std::string(row.message())});
      continue;
    }
    last_time = time;
    ++trace.rows;
    const absl::Time at = absl::FromUnixSeconds(time);
    if (trace.rows == 1) trace.start = at;
    trace.end = at;
    auto [it, inserted] = index.try_emplace(std::string(node), static_cast<int>(trace.nodes.size()));
    if (inserted) {
      trace.nodes.emplace_back(node);
      state.push_back(0);
    }
    const int n = it->second;
    if (state[n] == static_cast<char>(idle)) {
      // A busy row for a node never seen idle is its initial state, not a
      // repeat; only later repeats count as redundant.
      if (!(inserted && !idle)) ++trace.redundant_rows;
      continue;
    }
    state[n] = static_cast<char>(idle);
    trace.events.push_back(IdleEvent{at, n, idle});
  }
  if (!have_header) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": no header line '", kHeader, "' (empty file?)"));
  }
  return trace;
}

absl::StatusOr<IdleTrace> LoadIdleTrace(const std::string& path, const IdleTraceOptions& options) {
  MALLE_ASSIGN_OR_RETURN(const std::string text, internal::ReadMaybeGzipped(path));
  return ParseIdleTrace(text, path, options);
}

}  // namespace malle::sim
