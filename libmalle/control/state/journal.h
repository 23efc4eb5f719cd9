// Journal: the allocator service's write-ahead log, so that a kill -9 and a
// restart lose no job, node or decision.
//
// One record per line (JSON): when the service took it, the inbox position
// after it, and the envelope JSON of an accepted message or of a plan it
// published. A record is appended and fdatasync'ed before the service acts
// on it (publishes the plan, deletes the inbox key). Soft state is not
// journaled: heartbeats (agents resend them every second) and advisor reports
// (jobs resend them every few seconds).
//
//   MALLE_ASSIGN_OR_RETURN(auto journal, Journal::Open("/var/lib/malle/journal"));
//   for (const JournalRecord& r : journal->records()) Replay(r);
//   MALLE_RETURN_IF_ERROR(journal->Append({absl::Now(), cursor, envelope_json}));
//
// A crash can leave the last line incomplete: Open drops it (it was never
// acted upon) and truncates the file there. Any other malformed line is
// DataLoss naming the line: the journal is not guessed at.
//
// Thread-safety: not synchronised; one owner.
#ifndef MALLE_CONTROL_JOURNAL_H_
#define MALLE_CONTROL_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace malle::control {

struct JournalRecord {
  absl::Time at;               // when the service took it
  int64_t cursor = 0;          // inbox messages consumed, this one included
  std::string envelope_json;   // messages.h envelope (unsigned JSON)
};

class Journal {
 public:
  // Opens (creating it, mode 0600) and reads the journal at `path`.
  // Errors: kInvalidArgument (empty path), kUnavailable (cannot open or
  // read), kDataLoss "path:line: ..." (a malformed line before the last).
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& path);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // What the file held when it was opened, in order.
  const std::vector<JournalRecord>& records() const { return records_; }
  // True if Open dropped an incomplete last line.
  bool dropped_torn_tail() const { return dropped_torn_tail_; }
  const std::string& path() const { return path_; }

  // Appends one record and waits until it is on disk (fdatasync). Blocks.
  // Errors: kInvalidArgument (envelope_json contains a newline),
  // kUnavailable (write or sync failed).
  absl::Status Append(const JournalRecord& record);

 private:
  Journal(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  std::vector<JournalRecord> records_;
  bool dropped_torn_tail_ = false;
};

}  // namespace malle::control

#endif  // MALLE_CONTROL_JOURNAL_H_
