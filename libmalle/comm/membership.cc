#include "libmalle/comm/membership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libmalle/base/status_macros.h"

namespace malle::comm {
namespace {

constexpr int kMaxIdLength = 128;

bool IdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

absl::StatusOr<std::vector<std::string>> DecodeIdList(absl::string_view field,
                                                      absl::string_view value) {
  std::vector<std::string> ids;
  if (value.empty()) return ids;
  for (absl::string_view id : absl::StrSplit(value, ',')) {
    absl::Status valid = ValidateId(field, id);
    if (!valid.ok()) return valid;
    ids.emplace_back(id);
  }
  return ids;
}

}  // namespace

absl::Status ValidateId(absl::string_view what, absl::string_view id) {
  if (id.empty() || id.size() > kMaxIdLength) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s must have 1..%d characters, got %d", what, kMaxIdLength, id.size()));
  }
  for (char c : id) {
    if (!IdChar(c)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s '%s' has the character '%c'; allowed are letters, digits, '.', '_' and '-'", what,
          id, c));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateNodeName(absl::string_view what, absl::string_view node) {
  if (node.empty() || node.size() > kMaxIdLength) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s must have 1..%d characters, got %d", what, kMaxIdLength, node.size()));
  }
  for (char c : node) {
    if (!IdChar(c) && c != ':') {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s '%s' has the character '%c'; allowed are letters, digits, '.', '_', ':' and '-'",
          what, node, c));
    }
  }
  return absl::OkStatus();
}

absl::string_view GenerationCauseName(GenerationCause cause) {
  switch (cause) {
    case GenerationCause::kBootstrap: return "bootstrap";
    case GenerationCause::kPlanned: return "planned";
    case GenerationCause::kRecovery: return "recovery";
  }
  return "unknown";
}

int GenerationRecord::RankOf(absl::string_view member) const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == member) return static_cast<int>(i);
  }
  return -1;
}

std::string GenerationRecord::NodeOf(absl::string_view member) const {
  const int rank = RankOf(member);
  if (rank < 0 || rank >= static_cast<int>(nodes.size())) return "";
  return nodes[rank];
}

bool GenerationRecord::operator==(const GenerationRecord& other) const {
  return generation == other.generation && cause == other.cause && members == other.members &&
         nodes == other.nodes &&
         requests_consumed == other.requests_consumed && deferred_joins == other.deferred_joins &&
         reason == other.reason && park == other.park;
}

std::string EncodeRecord(const GenerationRecord& record) {
  std::string reason = record.reason;
  std::replace(reason.begin(), reason.end(), '\n', ' ');
  return absl::StrCat("v=1\ngeneration=", record.generation,
                      "\ncause=", GenerationCauseName(record.cause),
                      "\nmembers=", absl::StrJoin(record.members, ","),
                      record.nodes.empty() ? "" : absl::StrCat("\nnodes=", absl::StrJoin(record.nodes, ",")),
                      "\nconsumed=", record.requests_consumed,
                      "\ndeferred=", absl::StrJoin(record.deferred_joins, ","),
                      record.park.empty() ? "" : absl::StrCat("\npark=", record.park),
                      "\nreason=", reason, "\n");
}

absl::StatusOr<GenerationRecord> DecodeRecord(absl::string_view text) {
  GenerationRecord record;
  absl::flat_hash_set<std::string> seen;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    const std::string key(kv.first);
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat("generation record: duplicate field '", key, "'"));
    }
    if (key == "v") {
      if (kv.second != "1") {
        return absl::InvalidArgumentError(
            absl::StrCat("generation record: unsupported version '", kv.second, "' (expected 1)"));
      }
    } else if (key == "generation") {
      if (!absl::SimpleAtoi(kv.second, &record.generation) || record.generation < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("generation record: field 'generation' must be an integer >= 0, got '",
                         kv.second, "'"));
      }
    } else if (key == "cause") {
      if (kv.second == "bootstrap") record.cause = GenerationCause::kBootstrap;
      else if (kv.second == "planned") record.cause = GenerationCause::kPlanned;
      else if (kv.second == "recovery") record.cause = GenerationCause::kRecovery;
      else {
        return absl::InvalidArgumentError(absl::StrCat(
            "generation record: field 'cause' must be bootstrap|planned|recovery, got '", kv.second,
            "'"));
      }
    } else if (key == "members") {
      auto ids = DecodeIdList("generation record: members", kv.second);
      if (!ids.ok()) return ids.status();
      record.members = *std::move(ids);
    } else if (key == "nodes") {
      // One entry per member, "" where a member's node is unknown.
      record.nodes = absl::StrSplit(kv.second, ',');
      for (const std::string& node : record.nodes) {
        if (!node.empty()) MALLE_RETURN_IF_ERROR(ValidateNodeName("generation record: nodes", node));
      }
    } else if (key == "consumed") {
      if (!absl::SimpleAtoi(kv.second, &record.requests_consumed) || record.requests_consumed < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "generation record: field 'consumed' must be an integer >= 0, got '", kv.second, "'"));
      }
    } else if (key == "deferred") {
      auto ids = DecodeIdList("generation record: deferred", kv.second);
      if (!ids.ok()) return ids.status();
      record.deferred_joins = *std::move(ids);
    } else if (key == "reason") {
      record.reason = std::string(kv.second);
    } else if (key == "park") {
      MALLE_RETURN_IF_ERROR(ValidateId("generation record: park", kv.second));
      record.park = std::string(kv.second);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("generation record: unknown field '", key, "'"));
    }
  }
  for (const char* required : {"v", "generation", "cause", "members", "consumed"}) {
    if (!seen.contains(required)) {
      return absl::InvalidArgumentError(
          absl::StrCat("generation record: missing field '", required, "'"));
    }
  }
  if (record.members.empty()) {
    return absl::InvalidArgumentError("generation record: field 'members' is empty");
  }
  if (seen.contains("nodes") && record.nodes.size() != record.members.size()) {
    return absl::InvalidArgumentError(absl::StrCat("generation record: field 'nodes' has ", record.nodes.size(),
                                                   " entries for ", record.members.size(), " members"));
  }
  absl::flat_hash_set<std::string> unique(record.members.begin(), record.members.end());
  if (unique.size() != record.members.size()) {
    return absl::InvalidArgumentError("generation record: field 'members' lists a member twice");
  }
  return record;
}

std::string EncodeRequest(const ChangeRequest& request) {
  return absl::StrCat(request.kind == ChangeRequest::Kind::kJoin ? "join " : "leave ",
                      request.member);
}

absl::StatusOr<ChangeRequest> DecodeRequest(absl::string_view text) {
  std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(text, absl::MaxSplits(' ', 1));
  ChangeRequest request;
  if (parts.first == "join") {
    request.kind = ChangeRequest::Kind::kJoin;
  } else if (parts.first == "leave") {
    request.kind = ChangeRequest::Kind::kLeave;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("change request: kind must be 'join' or 'leave', got '", parts.first, "'"));
  }
  absl::Status valid = ValidateId("change request: member", parts.second);
  if (!valid.ok()) return valid;
  request.member = std::string(parts.second);
  return request;
}

std::string EncodeLeaves(absl::Span<const std::string> members) {
  return absl::StrCat("leave ", absl::StrJoin(members, ","));
}

absl::StatusOr<std::vector<ChangeRequest>> DecodeRequests(absl::string_view text) {
  std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(text, absl::MaxSplits(' ', 1));
  if (parts.first != "leave" || !absl::StrContains(parts.second, ',')) {
    MALLE_ASSIGN_OR_RETURN(ChangeRequest one, DecodeRequest(text));
    return std::vector<ChangeRequest>{std::move(one)};
  }
  std::vector<ChangeRequest> requests;
  for (absl::string_view member : absl::StrSplit(parts.second, ',')) {
    MALLE_RETURN_IF_ERROR(ValidateId("change request: member", member));
    requests.push_back({ChangeRequest::Kind::kLeave, std::string(member)});
  }
  return requests;
}

PlannedChange PlanNextMembers(const GenerationRecord& current,
                              absl::Span<const ChangeRequest> requests, int max_size) {
  PlannedChange change;
  change.requests_consumed = current.requests_consumed + static_cast<int64_t>(requests.size());
  std::vector<std::string> survivors = current.members;
  std::vector<std::string> waiting = current.deferred_joins;  // joins not yet admitted, in order
  auto contains = [](const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  auto erase = [](std::vector<std::string>& v, const std::string& x) {
    v.erase(std::remove(v.begin(), v.end(), x), v.end());
  };
  for (const ChangeRequest& request : requests) {
    if (request.kind == ChangeRequest::Kind::kJoin) {
      if (contains(survivors, request.member) || contains(waiting, request.member)) {
        change.notes.push_back(absl::StrCat("join of ", request.member, " ignored: already ",
                                            contains(survivors, request.member) ? "a member"
                                                                                : "waiting"));
      } else {
        waiting.push_back(request.member);
      }
    } else if (contains(waiting, request.member)) {
      erase(waiting, request.member);
      change.notes.push_back(absl::StrCat("join of ", request.member, " cancelled by its leave"));
    } else if (!contains(survivors, request.member)) {
      change.notes.push_back(
          absl::StrCat("leave of ", request.member, " ignored: not a member"));
    } else if (survivors.size() == 1) {
      change.park = request.member;
      change.notes.push_back(absl::StrCat("leave of ", request.member,
                                          ": it is the last member, it parks the job"));
    } else {
      erase(survivors, request.member);
      change.removed.push_back(request.member);
    }
  }
  change.next = survivors;
  for (const std::string& joiner : waiting) {
    if (static_cast<int>(change.next.size()) < max_size) {
      change.next.push_back(joiner);
      change.joined.push_back(joiner);
    } else {
      change.deferred.push_back(joiner);
    }
  }
  if (!change.park.empty() && !change.joined.empty()) {
    // Someone else will hold the state: no need to park. The joiners are
    // admitted with the leaver still a member (it sends them the state), and
    // it leaves at the next boundary, as any member would.
    const std::string parks = absl::StrCat("leave of ", change.park, ": it is the last member, it parks the job");
    change.notes.erase(std::remove(change.notes.begin(), change.notes.end(), parks), change.notes.end());
    change.notes.push_back(absl::StrCat("leave of ", change.park, ": joiners are admitted first, ",
                                        "it leaves at the next boundary instead of parking"));
    change.leave_again = std::exchange(change.park, std::string());
  }
  change.changed = change.next != current.members;
  return change;
}

std::vector<std::string> SurvivingMembers(absl::Span<const std::string> old_members,
                                          const absl::flat_hash_set<std::string>& checked_in,
                                          const absl::flat_hash_set<std::string>& dead) {
  std::vector<std::string> survivors;
  for (const std::string& member : old_members) {
    if (checked_in.contains(member) && !dead.contains(member)) survivors.push_back(member);
  }
  if (!survivors.empty() || dead.empty()) return survivors;
  return SurvivingMembers(old_members, checked_in);
}

ResumePoint ChooseResumePoint(absl::Span<const int64_t> committed_by_rank) {
  ResumePoint point;
  int64_t newest = -1;
  for (size_t r = 0; r < committed_by_rank.size(); ++r) {
    if (committed_by_rank[r] > newest) {
      newest = committed_by_rank[r];
      point.source_rank = static_cast<int>(r);
    }
  }
  point.resume_step = newest + 1;
  return point;
}

void HeartbeatTracker::Reset(absl::Span<const std::string> members, absl::Time now) {
  order_.assign(members.begin(), members.end());
  absl::flat_hash_map<std::string, Entry> entries;
  for (const std::string& member : members) {
    Entry entry;
    auto it = entries_.find(member);
    if (it != entries_.end()) entry.counter = it->second.counter;
    entry.last_change = now;  // everyone starts fresh in a new generation
    entries[member] = entry;
  }
  entries_ = std::move(entries);
}

void HeartbeatTracker::Observe(absl::string_view member, int64_t counter, absl::Time now) {
  auto it = entries_.find(member);
  if (it == entries_.end()) return;
  if (counter != it->second.counter) {
    it->second.counter = counter;
    it->second.last_change = now;
  }
}

std::vector<std::string> HeartbeatTracker::Stale(absl::Time now) const {
  std::vector<std::string> stale;
  for (const std::string& member : order_) {
    if (now - entries_.at(member).last_change >= timeout_) stale.push_back(member);
  }
  return stale;
}

absl::Duration HeartbeatTracker::SilentFor(absl::string_view member, absl::Time now) const {
  auto it = entries_.find(member);
  if (it == entries_.end()) return absl::ZeroDuration();
  return now - it->second.last_change;
}

}  // namespace malle::comm
