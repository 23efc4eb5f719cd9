// Signing and verification of control messages (envelope.h,
// docs/protocol.md "Envelope and signature").
#include "libmalle/control/wire/envelope.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/control/wire/hmac.h"
#include "libmalle/control/wire/messages.h"

namespace malle::control {
namespace {

constexpr size_t kMinMaxMessageBytes = 128;
constexpr size_t kMaxMaxMessageBytes = size_t{64} << 20;
constexpr absl::Duration kMaxMaxSkew = absl::Hours(24);
constexpr size_t kMaxMaxSenders = 10'000'000;
// " " + 64 hex digits after the envelope JSON.
constexpr size_t kMacSuffixBytes = 1 + 2 * kMacBytes;
constexpr absl::string_view kSaveHeader = "malle-replay-guard v1";

Mac ComputeMac(const Secret& secret, absl::string_view json) {
  return HmacSha256(secret, absl::StrCat(kMacContext, json));
}

std::string Rfc3339(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

absl::Status ValidateOptions(const VerifyOptions& options) {
  if (options.max_message_bytes < kMinMaxMessageBytes ||
      options.max_message_bytes > kMaxMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("VerifyOptions.max_message_bytes must be in [",
                                                   kMinMaxMessageBytes, ", ", kMaxMaxMessageBytes,
                                                   "], got ", options.max_message_bytes));
  }
  if (options.max_skew < absl::ZeroDuration() || options.max_skew > kMaxMaxSkew) {
    return absl::InvalidArgumentError(absl::StrCat("VerifyOptions.max_skew must be in [0s, ",
                                                   absl::FormatDuration(kMaxMaxSkew), "], got ",
                                                   absl::FormatDuration(options.max_skew)));
  }
  return absl::OkStatus();
}

// Whole microseconds since the epoch, rounded up, so that a saved watermark
// or latest ts is never earlier than the real one.
int64_t CeilUnixMicros(absl::Time t) {
  const int64_t floor = absl::ToUnixMicros(t);  // saturates for infinite times
  if (floor == std::numeric_limits<int64_t>::max()) return floor;
  return absl::FromUnixMicros(floor) < t ? floor + 1 : floor;
}

}  // namespace

// --- ReplayGuard ---------------------------------------------------------------------------------

ReplayGuard::ReplayGuard(ReplayGuardOptions options) : options_(options) {
  // Constructors never fail: an out-of-range option is clamped; Load
  // reports it.
  options_.max_senders = std::clamp<size_t>(options_.max_senders, 1, kMaxMaxSenders);
}

absl::Status ReplayGuard::Check(absl::string_view sender, uint64_t seq, absl::Time ts) const {
  auto it = index_.find(sender);
  if (it != index_.end()) {
    const uint64_t highest = it->second->seq;
    if (seq <= highest) {
      return absl::AlreadyExistsError(
          absl::StrCat("replayed control message from sender '", sender, "': seq ", seq,
                       " is not above the last accepted seq ", highest));
    }
    return absl::OkStatus();
  }
  if (ts <= watermark_) {
    return absl::AlreadyExistsError(absl::StrCat(
        "possibly replayed control message from sender '", sender,
        "': the sender is not tracked (the replay guard evicted it or never saw it) and ts ",
        Rfc3339(ts), " is not after the eviction watermark ", Rfc3339(watermark_),
        " (raise ReplayGuardOptions.max_senders if this is a new sender)"));
  }
  return absl::OkStatus();
}

void ReplayGuard::Record(absl::string_view sender, uint64_t seq, absl::Time ts) {
  auto it = index_.find(sender);
  if (it != index_.end()) {
    Entry& entry = *it->second;
    entry.seq = std::max(entry.seq, seq);
    entry.latest_ts = std::max(entry.latest_ts, ts);
    lru_.splice(lru_.end(), lru_, it->second);  // most recently accepted
    return;
  }
  if (index_.size() >= options_.max_senders) {
    const Entry& oldest = lru_.front();
    watermark_ = std::max(watermark_, oldest.latest_ts);
    index_.erase(oldest.sender);
    lru_.pop_front();
  }
  lru_.push_back(Entry{std::string(sender), seq, ts});
  index_.emplace(lru_.back().sender, std::prev(lru_.end()));
}

std::optional<uint64_t> ReplayGuard::HighestSeq(absl::string_view sender) const {
  auto it = index_.find(sender);
  if (it == index_.end()) return std::nullopt;
  return it->second->seq;
}

std::string ReplayGuard::Save() const {
  // Text, one record per line; ids never contain spaces or newlines.
  std::string out = absl::StrCat(kSaveHeader, "\n");
  absl::StrAppend(&out, "watermark_us ",
                  watermark_ == absl::InfinitePast() ? std::string("none")
                                                     : absl::StrCat(CeilUnixMicros(watermark_)),
                  "\n");
  absl::StrAppend(&out, "senders ", lru_.size(), "\n");
  for (const Entry& entry : lru_) {
    absl::StrAppend(&out, entry.sender, " ", entry.seq, " ", CeilUnixMicros(entry.latest_ts), "\n");
  }
  return out;
}

absl::StatusOr<ReplayGuard> ReplayGuard::Load(absl::string_view saved, ReplayGuardOptions options) {
  if (options.max_senders < 1 || options.max_senders > kMaxMaxSenders) {
    return absl::InvalidArgumentError(absl::StrCat("ReplayGuardOptions.max_senders must be in [1, ",
                                                   kMaxMaxSenders, "], got ", options.max_senders));
  }
  std::vector<absl::string_view> lines = absl::StrSplit(saved, '\n');
  // Save() ends every line with "\n": the last piece is empty.
  if (lines.empty() || !lines.back().empty()) {
    return absl::InvalidArgumentError("saved replay guard: does not end with a newline");
  }
  lines.pop_back();
  auto error = [](size_t line, absl::string_view message) {
    return absl::InvalidArgumentError(
        absl::StrCat("saved replay guard, line ", line + 1, ": ", message));
  };
  if (lines.size() < 3 || lines[0] != kSaveHeader) {
    return error(0, absl::StrCat("expected the header \"", kSaveHeader, "\""));
  }
  ReplayGuard guard(options);
  std::vector<absl::string_view> words = absl::StrSplit(lines[1], ' ');
  if (words.size() != 2 || words[0] != "watermark_us") {
    return error(1, "expected \"watermark_us <integer>|none\"");
  }
  if (words[1] != "none") {
    int64_t micros = 0;
    if (!absl::SimpleAtoi(words[1], &micros)) {
      return error(
          1, absl::StrCat("watermark_us: expected an integer or none, got \"", words[1], "\""));
    }
    guard.watermark_ = absl::FromUnixMicros(micros);
  }
  words = absl::StrSplit(lines[2], ' ');
  size_t count = 0;
  if (words.size() != 2 || words[0] != "senders" || !absl::SimpleAtoi(words[1], &count) ||
      count != lines.size() - 3) {
    return error(2, absl::StrCat("expected \"senders ", lines.size() - 3, "\""));
  }
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t i = 3; i < lines.size(); ++i) {
    words = absl::StrSplit(lines[i], ' ');
    uint64_t seq = 0;
    int64_t micros = 0;
    if (words.size() != 3) return error(i, "expected \"<sender> <seq> <latest ts in unix us>\"");
    if (absl::Status id = ValidateId("sender", words[0]); !id.ok()) {
      return error(i, id.message());
    }
    if (!absl::SimpleAtoi(words[1], &seq) || seq == 0) {
      return error(
          i, absl::StrCat("seq: expected an integer in [1, 2^64 - 1], got \"", words[1], "\""));
    }
    if (!absl::SimpleAtoi(words[2], &micros)) {
      return error(i, absl::StrCat("latest ts: expected an integer (unix microseconds), got \"",
                                   words[2], "\""));
    }
    if (!seen.insert(words[0]).second) {
      return error(i, absl::StrCat("sender '", words[0], "' appears twice"));
    }
    guard.Record(words[0], seq, absl::FromUnixMicros(micros));
  }
  return guard;
}

// --- Sign / Verify -------------------------------------------------------------------------------

absl::StatusOr<std::string> Sign(const Message& message, const Secret& secret,
                                 absl::string_view sender, uint64_t seq, absl::Time ts) {
  Envelope envelope;
  envelope.sender = std::string(sender);
  envelope.seq = seq;
  envelope.ts = ts;
  envelope.message = message;
  MALLE_ASSIGN_OR_RETURN(std::string json, EncodeEnvelopeJson(envelope));
  if (json.size() + kMacSuffixBytes > kDefaultMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "signed ", MessageTypeName(TypeOf(message)), " would be ", json.size() + kMacSuffixBytes,
        " bytes, over the ", kDefaultMaxMessageBytes, "-byte limit receivers apply by default"));
  }
  const Mac mac = ComputeMac(secret, json);
  json.push_back(' ');
  json += MacToHex(mac);
  return json;
}

absl::StatusOr<Envelope> Verify(absl::string_view wire, const Secret& secret, ReplayGuard& guard,
                                absl::Time now, const VerifyOptions& options) {
  MALLE_RETURN_IF_ERROR(ValidateOptions(options));
  // 1. Size, before reading anything.
  if (wire.size() > options.max_message_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("control message of ", wire.size(), " bytes exceeds the limit of ",
                     options.max_message_bytes, " bytes (VerifyOptions.max_message_bytes)"));
  }
  // 2. A MAC is present. Only the last 65 bytes are looked at; the JSON is
  // not parsed (nor even scanned) before the MAC is checked.
  if (wire.size() < kMacSuffixBytes || wire[wire.size() - kMacSuffixBytes] != ' ') {
    return absl::UnauthenticatedError(
        "unsigned control message: expected the envelope JSON, one space and 64 lowercase hex "
        "digits of HMAC-SHA256");
  }
  const absl::string_view json = wire.substr(0, wire.size() - kMacSuffixBytes);
  absl::StatusOr<Mac> received = MacFromHex(wire.substr(wire.size() - kMacSuffixBytes + 1));
  if (!received.ok()) {
    return absl::UnauthenticatedError(
        absl::StrCat("unsigned control message: malformed MAC: ", received.status().message()));
  }
  // 3. The MAC matches, compared in constant time.
  if (!MacEquals(ComputeMac(secret, json), *received)) {
    return absl::UnauthenticatedError(
        "forged or corrupted control message: the MAC does not match (the message was altered, "
        "or it was signed with a different secret)");
  }
  // 4-7. Authenticated from here on: parse, then staleness and replay on
  // the header, then the body.
  auto check_header = [&](const EnvelopeHeader& header) -> absl::Status {
    const absl::Duration age = now - header.ts;
    if (absl::AbsDuration(age) > options.max_skew) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stale control message from sender '", header.sender, "' seq ", header.seq, ": ts ",
          Rfc3339(header.ts), " is ", absl::FormatDuration(absl::AbsDuration(age)),
          age > absl::ZeroDuration() ? " behind" : " ahead of", " now ", Rfc3339(now),
          "; the limit is ", absl::FormatDuration(options.max_skew),
          " (VerifyOptions.max_skew; check the clocks)"));
    }
    return guard.Check(header.sender, header.seq, header.ts);
  };
  MALLE_ASSIGN_OR_RETURN(Envelope envelope, DecodeEnvelopeJson(json, check_header));
  guard.Record(envelope.sender, envelope.seq, envelope.ts);
  return envelope;
}

uint64_t SequenceCounter::Next(absl::Time now) {
  const int64_t micros = absl::ToUnixMicros(now);
  absl::MutexLock lock(&mu_);
  const uint64_t next = last_ == UINT64_MAX ? last_ : last_ + 1;  // saturate, never wrap
  last_ = std::max(next, micros > 0 ? static_cast<uint64_t>(micros) : uint64_t{0});
  return last_;
}

}  // namespace malle::control
