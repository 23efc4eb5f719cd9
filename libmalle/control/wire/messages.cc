// JSON form of control messages (messages.h, docs/protocol.md).
//
// nlohmann::json is used in this file only. Decoding reads each field with a
// type check (and, for integers, the range, since they are narrowed), then
// runs the same Validate function that encoding runs first: the rules live
// in one place, and a decoded message is always one that would encode.
#include "libmalle/control/wire/messages.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libmalle/base/json_path.h"
#include "libmalle/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace malle::control {
namespace {

using Json = nlohmann::json;
// Output keeps the documented key order (docs/protocol.md).
using OrderedJson = nlohmann::ordered_json;

constexpr absl::string_view kIdRule = "an id matching ^[A-Za-z0-9._-]{1,128}$";
constexpr int64_t kMaxPid = std::numeric_limits<int32_t>::max();
constexpr int kMaxExitCode = 255;
constexpr int kMaxSignal = 127;

// The wire names, in MessageType (and Message alternative) order.
constexpr absl::string_view kTypeNames[] = {
    "node_register", "node_reclaim", "node_leave",     "agent_heartbeat", "rank_exit",
    "job_submit",    "job_cancel",   "advisor_report", "job_complete",    "allocation_plan",
    "allocator_status", "job_saved",
};
static_assert(std::size(kTypeNames) == std::variant_size_v<Message>,
              "one wire name per Message alternative");

constexpr std::pair<absl::string_view, RankExitCause> kRankExitCauseNames[] = {
    {"exited", RankExitCause::kExited},
    {"left", RankExitCause::kLeft},
    {"stopped", RankExitCause::kStopped},
};

constexpr std::pair<absl::string_view, RankPhase> kRankPhaseNames[] = {
    {"starting", RankPhase::kStarting},
    {"training", RankPhase::kTraining},
    {"draining", RankPhase::kDraining},
};

constexpr std::pair<absl::string_view, JobStatus> kJobStatusNames[] = {
    {"succeeded", JobStatus::kSucceeded},
    {"failed", JobStatus::kFailed},
    {"cancelled", JobStatus::kCancelled},
};

constexpr std::pair<absl::string_view, SaveKind> kSaveKindNames[] = {
    {"park", SaveKind::kPark},
    {"snapshot", SaveKind::kSnapshot},
};

// --- paths and messages: base/json_path, like every JSON format of libmalle ---------------------

using json_path::Describe;
using json_path::Quote;

// Paths here are often string_views into a caller's string.
std::string Member(absl::string_view path, absl::string_view key) {
  return json_path::Member(std::string(path), key);
}
std::string Element(absl::string_view path, size_t index) {
  return json_path::Element(std::string(path), index);
}
absl::Status PathError(absl::string_view path, absl::string_view message) {
  return json_path::PathError(std::string(path), message);
}

// --- struct-side checks (shared by encoding and decoding) ---------------------------------------

// The offset of the first byte that is not part of well-formed UTF-8
// (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF), or npos.
size_t FirstInvalidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t extra = 0;
    uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      extra = 1;
      code = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      extra = 2;
      code = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      extra = 3;
      code = c & 0x07;
    } else {
      return i;
    }
    if (i + extra >= text.size()) return i;  // truncated sequence
    for (size_t k = 1; k <= extra; ++k) {
      const unsigned char cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xc0) != 0x80) return i;
      code = code << 6 | (cc & 0x3f);
    }
    constexpr uint32_t kMinForLength[] = {0, 0x80, 0x800, 0x10000};
    if (code < kMinForLength[extra] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
      return i;
    }
    i += extra + 1;
  }
  return absl::string_view::npos;
}

absl::Status CheckId(absl::string_view path, absl::string_view id) {
  const bool ok =
      !id.empty() && id.size() <= kMaxIdBytes && std::all_of(id.begin(), id.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == '-';
      });
  if (ok) return absl::OkStatus();
  return PathError(
      path, absl::StrCat("expected ", kIdRule, ", got ",
                         id.size() > kMaxIdBytes ? absl::StrCat("a string of ", id.size(), " bytes")
                                                 : Quote(id)));
}

// Free text: at most `max_bytes`, UTF-8, no NUL (it could not reach argv,
// the environment or a C string in a log line intact).
absl::Status CheckText(absl::string_view path, absl::string_view text, size_t max_bytes) {
  if (text.size() > max_bytes) {
    return PathError(path, absl::StrCat("at most ", max_bytes, " bytes, got ", text.size()));
  }
  if (const size_t bad = FirstInvalidUtf8(text); bad != absl::string_view::npos) {
    return PathError(path, absl::StrCat("not valid UTF-8 (byte ", bad, ")"));
  }
  if (const size_t nul = text.find('\0'); nul != absl::string_view::npos) {
    return PathError(path, absl::StrCat("contains a NUL character (byte ", nul, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckInt(absl::string_view path, int64_t value, int64_t lo, int64_t hi,
                      absl::string_view lo_name = {}) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return PathError(
      path, absl::StrCat("expected an integer in [",
                         lo_name.empty() ? absl::StrCat(lo) : absl::StrCat(lo_name, " = ", lo),
                         ", ", hi, "], got ", value));
}

// A finite number in (lo, hi] (lo_open) or [lo, hi].
absl::Status CheckNumber(absl::string_view path, double value, double lo, bool lo_open, double hi) {
  const bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) && value <= hi;
  if (ok) return absl::OkStatus();
  return PathError(path, absl::StrFormat("expected a number in %s%g, %g], got %g",
                                         lo_open ? "(" : "[", lo, hi, value));
}

absl::Time MaxWireTime() { return absl::UnixEpoch() + absl::Seconds(kMaxUnixSeconds); }

absl::Status CheckTime(absl::string_view path, absl::Time t) {
  if (t >= absl::UnixEpoch() && t <= MaxWireTime()) return absl::OkStatus();
  return PathError(path,
                   absl::StrCat("expected unix seconds in [0, 1e10], got ",
                                absl::FormatTime(absl::RFC3339_full, t, absl::UTCTimeZone())));
}

// Wire times are seconds with microsecond resolution. Both conversions are
// exact for whole microseconds below 2^53 us (year 2255).
absl::Time FromWireSeconds(double seconds) {
  return absl::FromUnixMicros(std::llround(seconds * 1e6));
}
double ToWireSeconds(absl::Time t) { return static_cast<double>(absl::ToUnixMicros(t)) / 1e6; }
double ToWireSeconds(absl::Duration d) {
  return static_cast<double>(absl::ToInt64Microseconds(d)) / 1e6;
}

// --- reading JSON
// ----------------------------------------------------------------------------------

// Parses `text` as one JSON document that sits at `prefix` inside a message
// ("" for an envelope, "body" for a body on its own, "body.report" for a
// report), below `enclosing` levels of it: nesting is limited to
// kMaxJsonDepth for the whole message (json_path checks it before parsing).
absl::StatusOr<Json> ParseDocument(absl::string_view text, absl::string_view prefix = {},
                                   int enclosing = 0) {
  return json_path::ParseStrictJson(text, std::string(prefix), kMaxJsonDepth, enclosing);
}

// One JSON object being read: its path, and the keys it may have.
class Fields {
 public:
  static absl::StatusOr<Fields> Open(const Json& value, std::string path,
                                     std::initializer_list<absl::string_view> allowed) {
    MALLE_RETURN_IF_ERROR(json_path::CheckKeys(value, path, allowed));
    return Fields(value, std::move(path));
  }

  std::string Path(absl::string_view key) const { return Member(path_, key); }

  // nullptr if absent.
  const Json* Find(absl::string_view key) const {
    auto it = object_->find(std::string(key));
    return it == object_->end() ? nullptr : &*it;
  }
  // nullptr if absent or null.
  const Json* FindOptional(absl::string_view key) const {
    const Json* value = Find(key);
    return value == nullptr || value->is_null() ? nullptr : value;
  }
  absl::StatusOr<const Json*> Required(absl::string_view key) const {
    const Json* value = Find(key);
    if (value == nullptr) return PathError(Path(key), "missing (required)");
    return value;
  }

 private:
  Fields(const Json& object, std::string path) : object_(&object), path_(std::move(path)) {}

  const Json* object_;
  std::string path_;
};

using json_path::ReadString;

// A JSON integer (not 2.0, not 1e3) in [lo, hi].
absl::StatusOr<int64_t> ReadInt(const Json& value, absl::string_view path, int64_t lo, int64_t hi) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) {
      return PathError(path, absl::StrCat("expected an integer in [", lo, ", ", hi, "], got ", u));
    }
    MALLE_RETURN_IF_ERROR(CheckInt(path, static_cast<int64_t>(u), lo, hi));
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) {
    const int64_t i = value.get<int64_t>();
    MALLE_RETURN_IF_ERROR(CheckInt(path, i, lo, hi));
    return i;
  }
  return PathError(
      path, absl::StrCat("expected an integer in [", lo, ", ", hi, "], got ", Describe(value)));
}

absl::StatusOr<double> ReadNumber(const Json& value, absl::string_view path) {
  if (!value.is_number()) {
    return PathError(path, absl::StrCat("expected a number, got ", Describe(value)));
  }
  const double number = value.get<double>();
  if (!std::isfinite(number)) return PathError(path, "expected a finite number");
  return number;
}

absl::StatusOr<absl::Time> ReadTime(const Json& value, absl::string_view path) {
  MALLE_ASSIGN_OR_RETURN(double seconds, ReadNumber(value, path));
  if (seconds < 0 || seconds > kMaxUnixSeconds) {
    return PathError(path, absl::StrCat("expected unix seconds in [0, 1e10], got ", value.dump()));
  }
  return FromWireSeconds(seconds);
}

absl::StatusOr<absl::Duration> ReadSeconds(const Json& value, absl::string_view path,
                                           absl::Duration max) {
  MALLE_ASSIGN_OR_RETURN(double seconds, ReadNumber(value, path));
  const double max_seconds = absl::ToDoubleSeconds(max);
  if (seconds < 0 || seconds > max_seconds) {
    return PathError(
        path, absl::StrCat("expected seconds in [0, ", max_seconds, "], got ", value.dump()));
  }
  return absl::Microseconds(std::llround(seconds * 1e6));
}

// An array of at most `max` entries.
absl::Status CheckArray(const Json& value, absl::string_view path, size_t max) {
  if (!value.is_array()) {
    return PathError(path, absl::StrCat("expected an array, got ", Describe(value)));
  }
  if (value.size() > max) {
    return PathError(path, absl::StrCat("at most ", max, " entries, got ", value.size()));
  }
  return absl::OkStatus();
}

// Reads a required field with `read(value, path)`.
template <class Read>
auto Required(const Fields& fields, absl::string_view key, Read read)
    -> decltype(read(std::declval<const Json&>(), std::string())) {
  MALLE_ASSIGN_OR_RETURN(const Json* value, fields.Required(key));
  return read(*value, fields.Path(key));
}

auto StringReader() {
  return [](const Json& v, const std::string& p) { return ReadString(v, p); };
}
auto IntReader(int64_t lo, int64_t hi) {
  return [lo, hi](const Json& v, const std::string& p) { return ReadInt(v, p, lo, hi); };
}
auto NumberReader() {
  return [](const Json& v, const std::string& p) { return ReadNumber(v, p); };
}
auto TimeReader() {
  return [](const Json& v, const std::string& p) { return ReadTime(v, p); };
}

// --- validation (struct side)
// ---------------------------------------------------------------------

absl::Status ValidateObjectText(absl::string_view path, const std::string& json, size_t max_bytes) {
  // Inside an envelope the object sits two levels down (envelope, body):
  // counting them here keeps every valid message encodable as an envelope.
  absl::StatusOr<Json> object = ParseDocument(json, path, /*enclosing=*/2);
  if (!object.ok()) return object.status();
  if (!object->is_object()) {
    return PathError(path, absl::StrCat("expected a JSON object, got ", Describe(*object)));
  }
  const size_t size = object->dump().size();
  if (size > max_bytes) {
    return PathError(path, absl::StrCat("at most ", max_bytes,
                                        " bytes when serialised compactly, got ", size));
  }
  return absl::OkStatus();
}

absl::Status ValidateReport(absl::string_view path, const std::string& report_json) {
  return ValidateObjectText(path, report_json, kMaxReportBytes);
}

absl::Status Validate(const NodeRegister& m, const std::string& p) {
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "node"), m.node));
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "agent"), m.agent));
  const std::string class_path = Member(p, "node_class");
  MALLE_RETURN_IF_ERROR(CheckId(Member(class_path, "group"), m.node_class.group));
  MALLE_RETURN_IF_ERROR(
      CheckNumber(Member(class_path, "speed"), m.node_class.speed, 0, true, kMaxSpeed));
  if (m.idle_until.has_value()) {
    MALLE_RETURN_IF_ERROR(CheckTime(Member(p, "idle_until"), *m.idle_until));
  }
  return CheckInt(Member(p, "slots"), m.slots, 1, kMaxSlots);
}

absl::Status Validate(const NodeReclaim& m, const std::string& p) {
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "node"), m.node));
  if (m.grace < absl::ZeroDuration() || m.grace > kMaxGrace) {
    return PathError(Member(p, "grace_s"),
                     absl::StrCat("expected seconds in [0, ", absl::ToDoubleSeconds(kMaxGrace),
                                  "], got ", absl::ToDoubleSeconds(m.grace)));
  }
  return CheckText(Member(p, "reason"), m.reason, kMaxReasonBytes);
}

absl::Status Validate(const NodeLeave& m, const std::string& p) {
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "node"), m.node));
  return CheckText(Member(p, "reason"), m.reason, kMaxReasonBytes);
}

absl::Status Validate(const AgentHeartbeat& m, const std::string& p) {
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "node"), m.node));
  if (m.running.has_value()) {
    const std::string running = Member(p, "running");
    MALLE_RETURN_IF_ERROR(CheckId(Member(running, "job"), m.running->job));
    MALLE_RETURN_IF_ERROR(CheckId(Member(running, "member"), m.running->member));
    MALLE_RETURN_IF_ERROR(CheckInt(Member(running, "pid"), m.running->pid, 1, kMaxPid));
    if (m.running->phase.has_value()) {
      const bool known = std::any_of(std::begin(kRankPhaseNames), std::end(kRankPhaseNames),
                                     [&](const auto& entry) { return entry.second == *m.running->phase; });
      if (!known) {
        return PathError(Member(running, "phase"),
                         absl::StrCat("unknown RankPhase ", static_cast<int>(*m.running->phase)));
      }
    }
    if (m.running->phase_since.has_value()) {
      MALLE_RETURN_IF_ERROR(CheckTime(Member(running, "phase_since"), *m.running->phase_since));
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const RankExit& m, const std::string& p) {
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "node"), m.node));
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "job"), m.job));
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "member"), m.member));
  MALLE_RETURN_IF_ERROR(CheckInt(Member(p, "exit_code"), m.exit_code, 0, kMaxExitCode));
  MALLE_RETURN_IF_ERROR(CheckInt(Member(p, "signal"), m.signal, 0, kMaxSignal));
  const bool known = std::any_of(std::begin(kRankExitCauseNames), std::end(kRankExitCauseNames),
                                 [&](const auto& entry) { return entry.second == m.cause; });
  if (!known) {
    return PathError(Member(p, "cause"),
                     absl::StrCat("unknown RankExitCause ", static_cast<int>(m.cause)));
  }
  return absl::OkStatus();
}

// A POSIX environment variable name: [A-Za-z_][A-Za-z0-9_]*.
bool IsEnvName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxEnvNameBytes) return false;
  if (name[0] >= '0' && name[0] <= '9') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

absl::Status Validate(const JobSubmit& m, const std::string& p) {
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "job"), m.job));
  const std::string command = Member(p, "command");
  if (m.command.empty() || m.command.size() > kMaxCommandArgs) {
    return PathError(command, absl::StrCat("expected 1 to ", kMaxCommandArgs, " entries, got ",
                                           m.command.size()));
  }
  for (size_t i = 0; i < m.command.size(); ++i) {
    MALLE_RETURN_IF_ERROR(CheckText(Element(command, i), m.command[i], kMaxTextBytes));
  }
  if (m.command[0].empty()) return PathError(Element(command, 0), "the program must not be empty");
  const std::string env = Member(p, "env");
  if (m.env.size() > kMaxEnvEntries) {
    return PathError(env, absl::StrCat("at most ", kMaxEnvEntries, " entries, got ", m.env.size()));
  }
  for (const auto& [name, value] : m.env) {
    if (!IsEnvName(name)) {
      return PathError(env, absl::StrCat("key ", Quote(name),
                                         " is not a variable name [A-Za-z_][A-Za-z0-9_]* of at "
                                         "most ",
                                         kMaxEnvNameBytes, " bytes"));
    }
    MALLE_RETURN_IF_ERROR(CheckText(Member(env, name), value, kMaxTextBytes));
  }
  const std::string cwd = Member(p, "cwd");
  MALLE_RETURN_IF_ERROR(CheckText(cwd, m.cwd, kMaxTextBytes));
  if (!m.cwd.empty() && m.cwd[0] != '/') {
    return PathError(cwd, absl::StrCat("expected an absolute path or \"\", got ", Quote(m.cwd)));
  }
  MALLE_RETURN_IF_ERROR(CheckInt(Member(p, "min_nodes"), m.min_nodes, 1, kMaxNodes));
  MALLE_RETURN_IF_ERROR(
      CheckInt(Member(p, "max_nodes"), m.max_nodes, m.min_nodes, kMaxNodes, "min_nodes"));
  if (m.logical_workers.has_value()) {
    MALLE_RETURN_IF_ERROR(CheckInt(Member(p, "logical_workers"), *m.logical_workers, m.min_nodes,
                                   kMaxLogicalWorkers, "min_nodes"));
  }
  MALLE_RETURN_IF_ERROR(CheckNumber(Member(p, "weight"), m.weight, 0, true, kMaxWeight));
  if (m.total_steps.has_value()) {
    MALLE_RETURN_IF_ERROR(CheckInt(Member(p, "total_steps"), *m.total_steps, 1, kMaxCounter));
  }
  return CheckInt(Member(p, "priority"), m.priority, kMinPriority, kMaxPriority);
}

absl::Status Validate(const JobCancel& m, const std::string& p) {
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "job"), m.job));
  return CheckText(Member(p, "reason"), m.reason, kMaxReasonBytes);
}

absl::Status Validate(const AdvisorReport& m, const std::string& p) {
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "job"), m.job));
  return ValidateReport(Member(p, "report"), m.report_json);
}

absl::Status Validate(const JobComplete& m, const std::string& p) {
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "job"), m.job));
  const bool known = std::any_of(std::begin(kJobStatusNames), std::end(kJobStatusNames),
                                 [&](const auto& entry) { return entry.second == m.status; });
  if (!known) {
    return PathError(Member(p, "status"),
                     absl::StrCat("unknown JobStatus ", static_cast<int>(m.status)));
  }
  MALLE_RETURN_IF_ERROR(CheckInt(Member(p, "steps"), m.steps, 0, kMaxCounter));
  MALLE_RETURN_IF_ERROR(CheckInt(Member(p, "samples"), m.samples, 0, kMaxCounter));
  return CheckText(Member(p, "message"), m.message, kMaxTextBytes);
}

absl::Status Validate(const AllocationPlan& m, const std::string& p) {
  MALLE_RETURN_IF_ERROR(CheckInt(Member(p, "plan"), m.plan, 0, kMaxCounter));
  MALLE_RETURN_IF_ERROR(CheckTime(Member(p, "decided_at"), m.decided_at));
  MALLE_RETURN_IF_ERROR(CheckText(Member(p, "policy"), m.policy, kMaxPolicyBytes));
  MALLE_RETURN_IF_ERROR(CheckText(Member(p, "reason"), m.reason, kMaxTextBytes));
  const std::string assignments = Member(p, "assignments");
  if (m.assignments.size() > kMaxPlanEntries) {
    return PathError(assignments, absl::StrCat("at most ", kMaxPlanEntries, " entries, got ",
                                               m.assignments.size()));
  }
  absl::flat_hash_set<absl::string_view> nodes;
  nodes.reserve(m.assignments.size());
  for (size_t i = 0; i < m.assignments.size(); ++i) {
    const Assignment& a = m.assignments[i];
    const std::string entry = Element(assignments, i);
    MALLE_RETURN_IF_ERROR(CheckId(Member(entry, "node"), a.node));
    if (a.job.has_value()) MALLE_RETURN_IF_ERROR(CheckId(Member(entry, "job"), *a.job));
    if (!nodes.insert(a.node).second) {
      return PathError(Member(entry, "node"),
                       absl::StrCat("node ", Quote(a.node), " is assigned more than once"));
    }
  }
  const std::string sizes = Member(p, "sizes");
  if (m.sizes.size() > kMaxPlanEntries) {
    return PathError(sizes,
                     absl::StrCat("at most ", kMaxPlanEntries, " entries, got ", m.sizes.size()));
  }
  absl::flat_hash_set<absl::string_view> jobs;
  jobs.reserve(m.sizes.size());
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    const JobSize& s = m.sizes[i];
    const std::string entry = Element(sizes, i);
    MALLE_RETURN_IF_ERROR(CheckId(Member(entry, "job"), s.job));
    MALLE_RETURN_IF_ERROR(CheckInt(Member(entry, "nodes"), s.nodes, 0, kMaxNodes));
    if (!jobs.insert(s.job).second) {
      return PathError(Member(entry, "job"),
                       absl::StrCat("job ", Quote(s.job), " is listed more than once"));
    }
  }
  const std::string launches = Member(p, "launches");
  if (m.launches.size() > kMaxPlanEntries) {
    return PathError(launches,
                     absl::StrCat("at most ", kMaxPlanEntries, " entries, got ", m.launches.size()));
  }
  absl::flat_hash_set<absl::string_view> launched;
  launched.reserve(m.launches.size());
  for (size_t i = 0; i < m.launches.size(); ++i) {
    const JobLaunch& l = m.launches[i];
    const std::string entry = Element(launches, i);
    MALLE_RETURN_IF_ERROR(CheckId(Member(entry, "job"), l.job));
    MALLE_RETURN_IF_ERROR(CheckId(Member(entry, "runtime_id"), l.runtime_id));
    MALLE_RETURN_IF_ERROR(CheckId(Member(entry, "bootstrap_node"), l.bootstrap_node));
    if (!launched.insert(l.job).second) {
      return PathError(Member(entry, "job"),
                       absl::StrCat("job ", Quote(l.job), " is listed more than once"));
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const AllocatorStatus& m, const std::string& p) {
  return ValidateObjectText(Member(p, "status"), m.status_json, kMaxStatusBytes);
}

absl::Status Validate(const JobSaved& m, const std::string& p) {
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "job"), m.job));
  MALLE_RETURN_IF_ERROR(CheckId(Member(p, "runtime_id"), m.runtime_id));
  const bool known = std::any_of(std::begin(kSaveKindNames), std::end(kSaveKindNames),
                                 [&](const auto& entry) { return entry.second == m.kind; });
  if (!known) {
    return PathError(Member(p, "kind"), absl::StrCat("unknown SaveKind ", static_cast<int>(m.kind)));
  }
  MALLE_RETURN_IF_ERROR(CheckInt(Member(p, "step"), m.step, 0, kMaxCounter));
  MALLE_RETURN_IF_ERROR(CheckInt(Member(p, "bytes"), m.bytes, 0, kMaxCounter));
  if (m.write_time < absl::ZeroDuration() || m.write_time > kMaxSaveTime) {
    return PathError(Member(p, "write_s"),
                     absl::StrCat("expected seconds in [0, ", absl::ToDoubleSeconds(kMaxSaveTime),
                                  "], got ", absl::ToDoubleSeconds(m.write_time)));
  }
  return absl::OkStatus();
}

// --- decoding bodies -----------------------------------------------------------------------------

absl::StatusOr<NodeRegister> DecodeNodeRegister(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(
      Fields f, Fields::Open(body, path, {"node", "agent", "node_class", "idle_until", "slots"}));
  NodeRegister m;
  MALLE_ASSIGN_OR_RETURN(m.node, Required(f, "node", StringReader()));
  MALLE_ASSIGN_OR_RETURN(m.agent, Required(f, "agent", StringReader()));
  MALLE_ASSIGN_OR_RETURN(const Json* node_class, f.Required("node_class"));
  MALLE_ASSIGN_OR_RETURN(Fields c,
                         Fields::Open(*node_class, f.Path("node_class"), {"group", "speed"}));
  MALLE_ASSIGN_OR_RETURN(m.node_class.group, Required(c, "group", StringReader()));
  MALLE_ASSIGN_OR_RETURN(m.node_class.speed, Required(c, "speed", NumberReader()));
  if (const Json* idle = f.FindOptional("idle_until")) {
    MALLE_ASSIGN_OR_RETURN(m.idle_until, ReadTime(*idle, f.Path("idle_until")));
  }
  if (const Json* slots = f.Find("slots")) {
    MALLE_ASSIGN_OR_RETURN(m.slots, ReadInt(*slots, f.Path("slots"), 1, kMaxSlots));
  }
  return m;
}

absl::StatusOr<NodeReclaim> DecodeNodeReclaim(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(Fields f, Fields::Open(body, path, {"node", "grace_s", "reason"}));
  NodeReclaim m;
  MALLE_ASSIGN_OR_RETURN(m.node, Required(f, "node", StringReader()));
  MALLE_ASSIGN_OR_RETURN(m.grace, Required(f, "grace_s", [](const Json& v, const std::string& p) {
                           return ReadSeconds(v, p, kMaxGrace);
                         }));
  MALLE_ASSIGN_OR_RETURN(m.reason, Required(f, "reason", StringReader()));
  return m;
}

absl::StatusOr<NodeLeave> DecodeNodeLeave(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(Fields f, Fields::Open(body, path, {"node", "reason"}));
  NodeLeave m;
  MALLE_ASSIGN_OR_RETURN(m.node, Required(f, "node", StringReader()));
  MALLE_ASSIGN_OR_RETURN(m.reason, Required(f, "reason", StringReader()));
  return m;
}

absl::StatusOr<AgentHeartbeat> DecodeAgentHeartbeat(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(Fields f, Fields::Open(body, path, {"node", "running"}));
  AgentHeartbeat m;
  MALLE_ASSIGN_OR_RETURN(m.node, Required(f, "node", StringReader()));
  if (const Json* running = f.FindOptional("running")) {
    MALLE_ASSIGN_OR_RETURN(Fields r,
                           Fields::Open(*running, f.Path("running"),
                                        {"job", "member", "pid", "phase", "phase_since"}));
    RunningRank rank;
    MALLE_ASSIGN_OR_RETURN(rank.job, Required(r, "job", StringReader()));
    MALLE_ASSIGN_OR_RETURN(rank.member, Required(r, "member", StringReader()));
    MALLE_ASSIGN_OR_RETURN(rank.pid, Required(r, "pid", IntReader(1, kMaxPid)));
    if (const Json* phase = r.FindOptional("phase")) {
      MALLE_ASSIGN_OR_RETURN(std::string name, ReadString(*phase, r.Path("phase")));
      for (const auto& [known, value] : kRankPhaseNames) {
        if (known == name) rank.phase = value;
      }
      if (!rank.phase) {
        return PathError(r.Path("phase"),
                         absl::StrCat("expected one of \"starting\", \"training\", \"draining\", got ",
                                      Quote(name)));
      }
    }
    if (const Json* since = r.FindOptional("phase_since")) {
      MALLE_ASSIGN_OR_RETURN(rank.phase_since, ReadTime(*since, r.Path("phase_since")));
    }
    m.running = std::move(rank);
  }
  return m;
}

absl::StatusOr<RankExit> DecodeRankExit(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(
      Fields f, Fields::Open(body, path, {"node", "job", "member", "exit_code", "signal", "cause"}));
  RankExit m;
  MALLE_ASSIGN_OR_RETURN(m.node, Required(f, "node", StringReader()));
  MALLE_ASSIGN_OR_RETURN(m.job, Required(f, "job", StringReader()));
  MALLE_ASSIGN_OR_RETURN(m.member, Required(f, "member", StringReader()));
  MALLE_ASSIGN_OR_RETURN(m.exit_code, Required(f, "exit_code", IntReader(0, kMaxExitCode)));
  MALLE_ASSIGN_OR_RETURN(m.signal, Required(f, "signal", IntReader(0, kMaxSignal)));
  MALLE_ASSIGN_OR_RETURN(std::string cause, Required(f, "cause", StringReader()));
  bool known = false;
  for (const auto& [name, value] : kRankExitCauseNames) {
    if (name == cause) {
      m.cause = value;
      known = true;
    }
  }
  if (!known) {
    return PathError(f.Path("cause"),
                     absl::StrCat("expected one of \"exited\", \"left\", \"stopped\", got ",
                                  Quote(cause)));
  }
  return m;
}

absl::StatusOr<JobSubmit> DecodeJobSubmit(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(Fields f,
                         Fields::Open(body, path,
                                      {"job", "command", "env", "cwd", "min_nodes", "max_nodes",
                                       "logical_workers", "weight", "priority", "total_steps"}));
  JobSubmit m;
  MALLE_ASSIGN_OR_RETURN(m.job, Required(f, "job", StringReader()));
  MALLE_ASSIGN_OR_RETURN(const Json* command, f.Required("command"));
  const std::string command_path = f.Path("command");
  MALLE_RETURN_IF_ERROR(CheckArray(*command, command_path, kMaxCommandArgs));
  for (size_t i = 0; i < command->size(); ++i) {
    MALLE_ASSIGN_OR_RETURN(std::string arg, ReadString((*command)[i], Element(command_path, i)));
    m.command.push_back(std::move(arg));
  }
  if (const Json* env = f.Find("env")) {
    const std::string env_path = f.Path("env");
    if (!env->is_object()) {
      return PathError(env_path,
                       absl::StrCat("expected an object of strings, got ", Describe(*env)));
    }
    if (env->size() > kMaxEnvEntries) {
      return PathError(env_path,
                       absl::StrCat("at most ", kMaxEnvEntries, " entries, got ", env->size()));
    }
    for (auto it = env->begin(); it != env->end(); ++it) {
      MALLE_ASSIGN_OR_RETURN(std::string value, ReadString(it.value(), Member(env_path, it.key())));
      m.env.emplace(it.key(), std::move(value));
    }
  }
  if (const Json* cwd = f.Find("cwd")) {
    MALLE_ASSIGN_OR_RETURN(m.cwd, ReadString(*cwd, f.Path("cwd")));
  }
  MALLE_ASSIGN_OR_RETURN(m.min_nodes, Required(f, "min_nodes", IntReader(1, kMaxNodes)));
  MALLE_ASSIGN_OR_RETURN(m.max_nodes, Required(f, "max_nodes", IntReader(1, kMaxNodes)));
  if (const Json* workers = f.FindOptional("logical_workers")) {
    MALLE_ASSIGN_OR_RETURN(m.logical_workers,
                           ReadInt(*workers, f.Path("logical_workers"), 1, kMaxLogicalWorkers));
  }
  if (const Json* weight = f.Find("weight")) {
    MALLE_ASSIGN_OR_RETURN(m.weight, ReadNumber(*weight, f.Path("weight")));
  }
  if (const Json* priority = f.Find("priority")) {
    MALLE_ASSIGN_OR_RETURN(m.priority,
                           ReadInt(*priority, f.Path("priority"), kMinPriority, kMaxPriority));
  }
  if (const Json* total = f.FindOptional("total_steps")) {
    MALLE_ASSIGN_OR_RETURN(m.total_steps, ReadInt(*total, f.Path("total_steps"), 1, kMaxCounter));
  }
  return m;
}

absl::StatusOr<JobCancel> DecodeJobCancel(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(Fields f, Fields::Open(body, path, {"job", "reason"}));
  JobCancel m;
  MALLE_ASSIGN_OR_RETURN(m.job, Required(f, "job", StringReader()));
  MALLE_ASSIGN_OR_RETURN(m.reason, Required(f, "reason", StringReader()));
  return m;
}

absl::StatusOr<AdvisorReport> DecodeAdvisorReport(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(Fields f, Fields::Open(body, path, {"job", "report"}));
  AdvisorReport m;
  MALLE_ASSIGN_OR_RETURN(m.job, Required(f, "job", StringReader()));
  MALLE_ASSIGN_OR_RETURN(const Json* report, f.Required("report"));
  if (!report->is_object()) {
    return PathError(f.Path("report"),
                     absl::StrCat("expected a JSON object, got ", Describe(*report)));
  }
  m.report_json = report->dump();
  if (m.report_json.size() > kMaxReportBytes) {
    return PathError(f.Path("report"),
                     absl::StrCat("at most ", kMaxReportBytes,
                                  " bytes when serialised compactly, got ", m.report_json.size()));
  }
  return m;
}

absl::StatusOr<JobComplete> DecodeJobComplete(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(
      Fields f, Fields::Open(body, path, {"job", "status", "steps", "samples", "message"}));
  JobComplete m;
  MALLE_ASSIGN_OR_RETURN(m.job, Required(f, "job", StringReader()));
  MALLE_ASSIGN_OR_RETURN(std::string status, Required(f, "status", StringReader()));
  bool known = false;
  for (const auto& [name, value] : kJobStatusNames) {
    if (name == status) {
      m.status = value;
      known = true;
    }
  }
  if (!known) {
    return PathError(f.Path("status"),
                     absl::StrCat("expected one of \"succeeded\", \"failed\", \"cancelled\", got ",
                                  Quote(status)));
  }
  MALLE_ASSIGN_OR_RETURN(m.steps, Required(f, "steps", IntReader(0, kMaxCounter)));
  MALLE_ASSIGN_OR_RETURN(m.samples, Required(f, "samples", IntReader(0, kMaxCounter)));
  MALLE_ASSIGN_OR_RETURN(m.message, Required(f, "message", StringReader()));
  return m;
}

absl::StatusOr<AllocationPlan> DecodeAllocationPlan(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(
      Fields f,
      Fields::Open(body, path,
                   {"plan", "decided_at", "policy", "reason", "assignments", "sizes", "launches"}));
  AllocationPlan m;
  MALLE_ASSIGN_OR_RETURN(m.plan, Required(f, "plan", IntReader(0, kMaxCounter)));
  MALLE_ASSIGN_OR_RETURN(m.decided_at, Required(f, "decided_at", TimeReader()));
  MALLE_ASSIGN_OR_RETURN(m.policy, Required(f, "policy", StringReader()));
  MALLE_ASSIGN_OR_RETURN(m.reason, Required(f, "reason", StringReader()));

  MALLE_ASSIGN_OR_RETURN(const Json* assignments, f.Required("assignments"));
  const std::string assignments_path = f.Path("assignments");
  MALLE_RETURN_IF_ERROR(CheckArray(*assignments, assignments_path, kMaxPlanEntries));
  m.assignments.reserve(assignments->size());
  for (size_t i = 0; i < assignments->size(); ++i) {
    MALLE_ASSIGN_OR_RETURN(
        Fields a, Fields::Open((*assignments)[i], Element(assignments_path, i), {"node", "job"}));
    Assignment entry;
    MALLE_ASSIGN_OR_RETURN(entry.node, Required(a, "node", StringReader()));
    MALLE_ASSIGN_OR_RETURN(const Json* job, a.Required("job"));
    if (!job->is_null()) {
      if (!job->is_string()) {
        return PathError(a.Path("job"),
                         absl::StrCat("expected a job id or null, got ", Describe(*job)));
      }
      entry.job = job->get<std::string>();
    }
    m.assignments.push_back(std::move(entry));
  }

  MALLE_ASSIGN_OR_RETURN(const Json* sizes, f.Required("sizes"));
  const std::string sizes_path = f.Path("sizes");
  MALLE_RETURN_IF_ERROR(CheckArray(*sizes, sizes_path, kMaxPlanEntries));
  m.sizes.reserve(sizes->size());
  for (size_t i = 0; i < sizes->size(); ++i) {
    MALLE_ASSIGN_OR_RETURN(Fields s,
                           Fields::Open((*sizes)[i], Element(sizes_path, i), {"job", "nodes"}));
    JobSize entry;
    MALLE_ASSIGN_OR_RETURN(entry.job, Required(s, "job", StringReader()));
    MALLE_ASSIGN_OR_RETURN(entry.nodes, Required(s, "nodes", IntReader(0, kMaxNodes)));
    m.sizes.push_back(std::move(entry));
  }

  MALLE_ASSIGN_OR_RETURN(const Json* launches, f.Required("launches"));
  const std::string launches_path = f.Path("launches");
  MALLE_RETURN_IF_ERROR(CheckArray(*launches, launches_path, kMaxPlanEntries));
  m.launches.reserve(launches->size());
  for (size_t i = 0; i < launches->size(); ++i) {
    MALLE_ASSIGN_OR_RETURN(Fields l, Fields::Open((*launches)[i], Element(launches_path, i),
                                                  {"job", "runtime_id", "bootstrap_node"}));
    JobLaunch entry;
    MALLE_ASSIGN_OR_RETURN(entry.job, Required(l, "job", StringReader()));
    MALLE_ASSIGN_OR_RETURN(entry.runtime_id, Required(l, "runtime_id", StringReader()));
    MALLE_ASSIGN_OR_RETURN(entry.bootstrap_node, Required(l, "bootstrap_node", StringReader()));
    m.launches.push_back(std::move(entry));
  }
  return m;
}

absl::StatusOr<AllocatorStatus> DecodeAllocatorStatus(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(Fields f, Fields::Open(body, path, {"status"}));
  MALLE_ASSIGN_OR_RETURN(const Json* status, f.Required("status"));
  if (!status->is_object()) {
    return PathError(f.Path("status"),
                     absl::StrCat("expected a JSON object, got ", Describe(*status)));
  }
  AllocatorStatus m;
  m.status_json = status->dump();
  return m;
}

absl::StatusOr<JobSaved> DecodeJobSaved(const Json& body, const std::string& path) {
  MALLE_ASSIGN_OR_RETURN(
      Fields f,
      Fields::Open(body, path, {"job", "runtime_id", "kind", "step", "bytes", "write_s"}));
  JobSaved m;
  MALLE_ASSIGN_OR_RETURN(m.job, Required(f, "job", StringReader()));
  MALLE_ASSIGN_OR_RETURN(m.runtime_id, Required(f, "runtime_id", StringReader()));
  MALLE_ASSIGN_OR_RETURN(std::string kind, Required(f, "kind", StringReader()));
  bool known = false;
  for (const auto& [name, value] : kSaveKindNames) {
    if (name == kind) {
      m.kind = value;
      known = true;
    }
  }
  if (!known) {
    return PathError(f.Path("kind"),
                     absl::StrCat("expected one of \"park\", \"snapshot\", got ", Quote(kind)));
  }
  MALLE_ASSIGN_OR_RETURN(m.step, Required(f, "step", IntReader(0, kMaxCounter)));
  MALLE_ASSIGN_OR_RETURN(m.bytes, Required(f, "bytes", IntReader(0, kMaxCounter)));
  MALLE_ASSIGN_OR_RETURN(m.write_time, Required(f, "write_s", [](const Json& v, const std::string& p) {
                           return ReadSeconds(v, p, kMaxSaveTime);
                         }));
  return m;
}

absl::StatusOr<Message> DecodeBodyValue(MessageType type, const Json& body,
                                        const std::string& path) {
  absl::StatusOr<Message> message;
  switch (type) {
    case MessageType::kNodeRegister:
      message = DecodeNodeRegister(body, path);
      break;
    case MessageType::kNodeReclaim:
      message = DecodeNodeReclaim(body, path);
      break;
    case MessageType::kNodeLeave:
      message = DecodeNodeLeave(body, path);
      break;
    case MessageType::kAgentHeartbeat:
      message = DecodeAgentHeartbeat(body, path);
      break;
    case MessageType::kRankExit:
      message = DecodeRankExit(body, path);
      break;
    case MessageType::kJobSubmit:
      message = DecodeJobSubmit(body, path);
      break;
    case MessageType::kJobCancel:
      message = DecodeJobCancel(body, path);
      break;
    case MessageType::kAdvisorReport:
      message = DecodeAdvisorReport(body, path);
      break;
    case MessageType::kJobComplete:
      message = DecodeJobComplete(body, path);
      break;
    case MessageType::kAllocationPlan:
      message = DecodeAllocationPlan(body, path);
      break;
    case MessageType::kAllocatorStatus:
      message = DecodeAllocatorStatus(body, path);
      break;
    case MessageType::kJobSaved:
      message = DecodeJobSaved(body, path);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown MessageType ", static_cast<int>(type)));
  }
  if (!message.ok()) return message.status();
  MALLE_RETURN_IF_ERROR(std::visit([&path](const auto& m) { return Validate(m, path); }, *message));
  return message;
}

// --- encoding ------------------------------------------------------------------------------------

OrderedJson OptionalTime(const std::optional<absl::Time>& t) {
  return t.has_value() ? OrderedJson(ToWireSeconds(*t)) : OrderedJson(nullptr);
}

OrderedJson Encode(const NodeRegister& m) {
  return {{"node", m.node},
          {"agent", m.agent},
          {"node_class", {{"group", m.node_class.group}, {"speed", m.node_class.speed}}},
          {"idle_until", OptionalTime(m.idle_until)},
          {"slots", m.slots}};
}

OrderedJson Encode(const NodeReclaim& m) {
  return {{"node", m.node}, {"grace_s", ToWireSeconds(m.grace)}, {"reason", m.reason}};
}

OrderedJson Encode(const NodeLeave& m) { return {{"node", m.node}, {"reason", m.reason}}; }

OrderedJson Encode(const AgentHeartbeat& m) {
  OrderedJson running = nullptr;
  if (m.running.has_value()) {
    running = {{"job", m.running->job}, {"member", m.running->member}, {"pid", m.running->pid}};
    if (m.running->phase) running["phase"] = std::string(RankPhaseName(*m.running->phase));
    if (m.running->phase_since) running["phase_since"] = ToWireSeconds(*m.running->phase_since);
  }
  return {{"node", m.node}, {"running", std::move(running)}};
}

OrderedJson Encode(const RankExit& m) {
  return {{"node", m.node},
          {"job", m.job},
          {"member", m.member},
          {"exit_code", m.exit_code},
          {"signal", m.signal},
          {"cause", std::string(RankExitCauseName(m.cause))}};
}

OrderedJson Encode(const JobSubmit& m) {
  OrderedJson env = OrderedJson::object();
  for (const auto& [name, value] : m.env) env[name] = value;
  OrderedJson out = {
      {"job", m.job},
      {"command", m.command},
      {"env", std::move(env)},
      {"cwd", m.cwd},
      {"min_nodes", m.min_nodes},
      {"max_nodes", m.max_nodes},
      {"logical_workers",
       m.logical_workers.has_value() ? OrderedJson(*m.logical_workers) : OrderedJson(nullptr)},
      {"weight", m.weight},
      {"priority", m.priority}};
  // Only when given: an allocator older than the field refuses unknown keys,
  // so a client that does not use it stays readable by one.
  if (m.total_steps.has_value()) out["total_steps"] = *m.total_steps;
  return out;
}

OrderedJson Encode(const JobCancel& m) { return {{"job", m.job}, {"reason", m.reason}}; }

OrderedJson Encode(const AdvisorReport& m) {
  // Validated before encoding: report_json parses to an object.
  return {{"job", m.job}, {"report", OrderedJson::parse(m.report_json)}};
}

OrderedJson Encode(const JobComplete& m) {
  absl::string_view status = "unknown";
  for (const auto& [name, value] : kJobStatusNames) {
    if (value == m.status) status = name;
  }
  return {{"job", m.job},
          {"status", std::string(status)},
          {"steps", m.steps},
          {"samples", m.samples},
          {"message", m.message}};
}

OrderedJson Encode(const AllocationPlan& m) {
  OrderedJson assignments = OrderedJson::array();
  for (const Assignment& a : m.assignments) {
    assignments.push_back(
        {{"node", a.node},
         {"job", a.job.has_value() ? OrderedJson(*a.job) : OrderedJson(nullptr)}});
  }
  OrderedJson sizes = OrderedJson::array();
  for (const JobSize& s : m.sizes) sizes.push_back({{"job", s.job}, {"nodes", s.nodes}});
  OrderedJson launches = OrderedJson::array();
  for (const JobLaunch& l : m.launches) {
    launches.push_back(
        {{"job", l.job}, {"runtime_id", l.runtime_id}, {"bootstrap_node", l.bootstrap_node}});
  }
  return {{"plan", m.plan},
          {"decided_at", ToWireSeconds(m.decided_at)},
          {"policy", m.policy},
          {"reason", m.reason},
          {"assignments", std::move(assignments)},
          {"sizes", std::move(sizes)},
          {"launches", std::move(launches)}};
}

OrderedJson Encode(const AllocatorStatus& m) {
  // Validated before encoding: status_json parses to an object.
  return {{"status", OrderedJson::parse(m.status_json)}};
}

OrderedJson Encode(const JobSaved& m) {
  return {{"job", m.job},
          {"runtime_id", m.runtime_id},
          {"kind", std::string(SaveKindName(m.kind))},
          {"step", m.step},
          {"bytes", m.bytes},
          {"write_s", ToWireSeconds(m.write_time)}};
}

// Compact ASCII (non-ASCII \u-escaped): the wire is one line of printable text.
absl::StatusOr<std::string> Dump(const OrderedJson& value) {
  try {
    return value.dump(-1, ' ', /*ensure_ascii=*/true);
  } catch (const OrderedJson::exception& e) {
    // Unreachable after validation (every string was checked to be UTF-8);
    // kept so that a missed case is an error, not an exception.
    return absl::InvalidArgumentError(absl::StrCat("cannot serialise message: ", e.what()));
  }
}

absl::Status ValidateHeader(const Envelope& envelope) {
  MALLE_RETURN_IF_ERROR(CheckId("sender", envelope.sender));
  if (envelope.seq == 0) return PathError("seq", "expected an integer in [1, 2^64 - 1], got 0");
  return CheckTime("ts", envelope.ts);
}

}  // namespace

int JobSubmit::EffectiveMaxNodes() const {
  return logical_workers.has_value() ? std::min(max_nodes, *logical_workers) : max_nodes;
}

MessageType TypeOf(const Message& message) { return static_cast<MessageType>(message.index()); }

absl::string_view RankExitCauseName(RankExitCause cause) {
  for (const auto& [name, value] : kRankExitCauseNames) {
    if (value == cause) return name;
  }
  return "unknown";
}

absl::string_view RankPhaseName(RankPhase phase) {
  for (const auto& [name, value] : kRankPhaseNames) {
    if (value == phase) return name;
  }
  return "unknown";
}

absl::string_view SaveKindName(SaveKind kind) {
  for (const auto& [name, value] : kSaveKindNames) {
    if (value == kind) return name;
  }
  return "unknown";
}

absl::string_view MessageTypeName(MessageType type) {
  const size_t index = static_cast<size_t>(type);
  return index < std::size(kTypeNames) ? kTypeNames[index] : absl::string_view("unknown");
}

absl::StatusOr<MessageType> ParseMessageType(absl::string_view name) {
  for (size_t i = 0; i < std::size(kTypeNames); ++i) {
    if (kTypeNames[i] == name) return static_cast<MessageType>(i);
  }
  return PathError("type", absl::StrCat("unknown message type ", Quote(name), "; expected one of ",
                                        absl::StrJoin(kTypeNames, ", ")));
}

absl::Status ValidateId(absl::string_view field, absl::string_view id) {
  return CheckId(field, id);
}

absl::Status ValidateMessage(const Message& message) {
  return std::visit([](const auto& m) { return Validate(m, "body"); }, message);
}

absl::StatusOr<std::string> EncodeBody(const Message& message) {
  MALLE_RETURN_IF_ERROR(ValidateMessage(message));
  return Dump(std::visit([](const auto& m) { return Encode(m); }, message));
}

absl::StatusOr<Message> DecodeBody(MessageType type, absl::string_view body_json) {
  MALLE_ASSIGN_OR_RETURN(Json body, ParseDocument(body_json, "body", /*enclosing=*/1));
  return DecodeBodyValue(type, body, "body");
}

absl::StatusOr<std::string> EncodeEnvelopeJson(const Envelope& envelope) {
  MALLE_RETURN_IF_ERROR(ValidateHeader(envelope));
  MALLE_RETURN_IF_ERROR(ValidateMessage(envelope.message));
  OrderedJson out = {
      {"v", kProtocolVersion},
      {"type", std::string(MessageTypeName(TypeOf(envelope.message)))},
      {"sender", envelope.sender},
      {"seq", envelope.seq},
      {"ts", ToWireSeconds(envelope.ts)},
      {"body", std::visit([](const auto& m) { return Encode(m); }, envelope.message)},
  };
  return Dump(out);
}

absl::StatusOr<Envelope> DecodeEnvelopeJson(
    absl::string_view json, absl::FunctionRef<absl::Status(const EnvelopeHeader&)> check_header) {
  MALLE_ASSIGN_OR_RETURN(Json document, ParseDocument(json));
  if (!document.is_object()) {
    return PathError("", absl::StrCat("expected an envelope object, got ", Describe(document)));
  }
  // The version first: a newer peer's envelope may have keys this build
  // does not know, and "unsupported version" is the useful message then.
  const auto v = document.find("v");
  if (v == document.end()) return PathError("v", "missing (required)");
  if (!v->is_number_integer() || v->get<int64_t>() != kProtocolVersion) {
    return PathError("v", absl::StrCat("unsupported protocol version ", Describe(*v),
                                       "; this build speaks version ", kProtocolVersion));
  }
  MALLE_ASSIGN_OR_RETURN(Fields f,
                         Fields::Open(document, "", {"v", "type", "sender", "seq", "ts", "body"}));
  EnvelopeHeader header;
  MALLE_ASSIGN_OR_RETURN(std::string type, Required(f, "type", StringReader()));
  MALLE_ASSIGN_OR_RETURN(header.type, ParseMessageType(type));
  MALLE_ASSIGN_OR_RETURN(header.sender, Required(f, "sender", StringReader()));
  MALLE_RETURN_IF_ERROR(CheckId("sender", header.sender));
  MALLE_ASSIGN_OR_RETURN(const Json* seq, f.Required("seq"));
  if (!seq->is_number_unsigned() || seq->get<uint64_t>() == 0) {
    return PathError("seq",
                     absl::StrCat("expected an integer in [1, 2^64 - 1], got ", Describe(*seq)));
  }
  header.seq = seq->get<uint64_t>();
  MALLE_ASSIGN_OR_RETURN(header.ts, Required(f, "ts", TimeReader()));
  MALLE_RETURN_IF_ERROR(check_header(header));

  MALLE_ASSIGN_OR_RETURN(const Json* body, f.Required("body"));
  MALLE_ASSIGN_OR_RETURN(Message message, DecodeBodyValue(header.type, *body, "body"));
  Envelope envelope;
  envelope.sender = std::move(header.sender);
  envelope.seq = header.seq;
  envelope.ts = header.ts;
  envelope.message = std::move(message);
  return envelope;
}

absl::StatusOr<Envelope> DecodeEnvelopeJson(absl::string_view json) {
  return DecodeEnvelopeJson(json, [](const EnvelopeHeader&) { return absl::OkStatus(); });
}

// --- equality ------------------------------------------------------------------------------------

bool operator==(const NodeClass& a, const NodeClass& b) {
  return std::tie(a.group, a.speed) == std::tie(b.group, b.speed);
}
bool operator==(const NodeRegister& a, const NodeRegister& b) {
  return std::tie(a.node, a.agent, a.node_class, a.idle_until, a.slots) ==
         std::tie(b.node, b.agent, b.node_class, b.idle_until, b.slots);
}
bool operator==(const NodeReclaim& a, const NodeReclaim& b) {
  return std::tie(a.node, a.grace, a.reason) == std::tie(b.node, b.grace, b.reason);
}
bool operator==(const NodeLeave& a, const NodeLeave& b) {
  return std::tie(a.node, a.reason) == std::tie(b.node, b.reason);
}
bool operator==(const RunningRank& a, const RunningRank& b) {
  return std::tie(a.job, a.member, a.pid, a.phase, a.phase_since) ==
         std::tie(b.job, b.member, b.pid, b.phase, b.phase_since);
}
bool operator==(const AgentHeartbeat& a, const AgentHeartbeat& b) {
  return std::tie(a.node, a.running) == std::tie(b.node, b.running);
}
bool operator==(const RankExit& a, const RankExit& b) {
  return std::tie(a.node, a.job, a.member, a.exit_code, a.signal, a.cause) ==
         std::tie(b.node, b.job, b.member, b.exit_code, b.signal, b.cause);
}
bool operator==(const JobSubmit& a, const JobSubmit& b) {
  return std::tie(a.job, a.command, a.env, a.cwd, a.min_nodes, a.max_nodes, a.logical_workers,
                  a.weight, a.priority, a.total_steps) ==
         std::tie(b.job, b.command, b.env, b.cwd, b.min_nodes, b.max_nodes, b.logical_workers,
                  b.weight, b.priority, b.total_steps);
}
bool operator==(const JobCancel& a, const JobCancel& b) {
  return std::tie(a.job, a.reason) == std::tie(b.job, b.reason);
}
bool operator==(const AdvisorReport& a, const AdvisorReport& b) {
  return std::tie(a.job, a.report_json) == std::tie(b.job, b.report_json);
}
bool operator==(const JobComplete& a, const JobComplete& b) {
  return std::tie(a.job, a.status, a.steps, a.samples, a.message) ==
         std::tie(b.job, b.status, b.steps, b.samples, b.message);
}
bool operator==(const Assignment& a, const Assignment& b) {
  return std::tie(a.node, a.job) == std::tie(b.node, b.job);
}
bool operator==(const JobSize& a, const JobSize& b) {
  return std::tie(a.job, a.nodes) == std::tie(b.job, b.nodes);
}
bool operator==(const JobLaunch& a, const JobLaunch& b) {
  return std::tie(a.job, a.runtime_id, a.bootstrap_node) ==
         std::tie(b.job, b.runtime_id, b.bootstrap_node);
}
bool operator==(const AllocationPlan& a, const AllocationPlan& b) {
  return std::tie(a.plan, a.decided_at, a.policy, a.reason, a.assignments, a.sizes, a.launches) ==
         std::tie(b.plan, b.decided_at, b.policy, b.reason, b.assignments, b.sizes, b.launches);
}
bool operator==(const AllocatorStatus& a, const AllocatorStatus& b) {
  return a.status_json == b.status_json;
}
bool operator==(const JobSaved& a, const JobSaved& b) {
  return std::tie(a.job, a.runtime_id, a.kind, a.step, a.bytes, a.write_time) ==
         std::tie(b.job, b.runtime_id, b.kind, b.step, b.bytes, b.write_time);
}
bool operator==(const Envelope& a, const Envelope& b) {
  return std::tie(a.sender, a.seq, a.ts, a.message) == std::tie(b.sender, b.seq, b.ts, b.message);
}

}  // namespace malle::control
