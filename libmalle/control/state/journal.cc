#include "libmalle/control/state/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace malle::control {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(path, ": ", what, ": ", std::strerror(errno)));
}

absl::StatusOr<JournalRecord> ParseLine(absl::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::DataLossError("not a JSON object");
  for (const char* key : {"at_us", "cursor", "envelope"}) {
    if (!j.contains(key)) return absl::DataLossError(absl::StrCat("missing \"", key, "\""));
  }
  if (!j["at_us"].is_number_integer() || !j["cursor"].is_number_integer() || !j["envelope"].is_string()) {
    return absl::DataLossError("\"at_us\" and \"cursor\" must be integers, \"envelope\" a string");
  }
  JournalRecord r;
  r.at = absl::FromUnixMicros(j["at_us"].get<int64_t>());
  r.cursor = j["cursor"].get<int64_t>();
  r.envelope_json = j["envelope"].get<std::string>();
  if (r.cursor < 0) return absl::DataLossError("\"cursor\" must be >= 0");
  return r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("journal path is empty");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot open journal", path);
  std::unique_ptr<Journal> journal(new Journal(path, fd));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot read journal", path);
    }
    if (got == 0) break;
    text.append(buffer, static_cast<size_t>(got));
  }
  size_t good_end = 0;  // bytes up to the end of the last complete line
  int line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    ++line_no;
    if (nl == std::string::npos) {
      // An incomplete last line: a crash in the middle of Append. It was
      // never acted upon (Append returns only after the newline is synced).
      journal->dropped_torn_tail_ = true;
      break;
    }
    absl::StatusOr<JournalRecord> r = ParseLine(absl::string_view(text).substr(pos, nl - pos));
    if (!r.ok()) {
      return absl::DataLossError(absl::StrCat(path, ":", line_no, ": ", r.status().message()));
    }
    journal->records_.push_back(*std::move(r));
    pos = nl + 1;
    good_end = pos;
  }
  if (journal->dropped_torn_tail_ && ::ftruncate(fd, static_cast<off_t>(good_end)) != 0) {
    return Errno("cannot truncate the torn last line of the journal", path);
  }
  if (::lseek(fd, 0, SEEK_END) < 0) return Errno("cannot seek journal", path);
  return journal;
}

Journal::~Journal() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status Journal::Append(const JournalRecord& record) {
  if (record.envelope_json.find('\n') != std::string::npos) {
    return absl::InvalidArgumentError("journal record: envelope JSON contains a newline");
  }
  nlohmann::json j;
  j["at_us"] = absl::ToUnixMicros(record.at);
  j["cursor"] = record.cursor;
  j["envelope"] = record.envelope_json;
  const std::string line = j.dump() + "\n";
  size_t off = 0;
  while (off < line.size()) {
    const ssize_t put = ::write(fd_, line.data() + off, line.size() - off);
    if (put < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot append to journal", path_);
    }
    off += static_cast<size_t>(put);
  }
  if (::fdatasync(fd_) != 0) return Errno("cannot sync journal", path_);
  return absl::OkStatus();
}

}  // namespace malle::control
