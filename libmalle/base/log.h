// Leveled logging with a rank/generation prefix: MALLE_LOG(INFO) << "...";
//
// Every line reads
//   I1122 12:34:56.789012 pid=4242 job=mnist rank=2/4 gen=7] message
// so that interleaved output of many ranks can be read and grepped. The
// job/rank/generation part comes from SetLogContext(), which the elastic layer
// calls whenever a new generation starts.
//
// Levels: DEBUG, INFO, WARNING, ERROR. The threshold is read once from the
// environment variable MALLE_LOG_LEVEL (default INFO) and can be changed with
// SetLogLevel().
//
// Thread-safety: all functions and MALLE_LOG are safe from any thread; a line
// is written to stderr with a single write.
#ifndef MALLE_BASE_LOG_H_
#define MALLE_BASE_LOG_H_

#include <cstdint>
#include <sstream>
#include <string>

#include "absl/strings/string_view.h"

namespace malle::base {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Sets the prefix fields of every later line. rank < 0 omits rank and gen.
void SetLogContext(absl::string_view job, int rank, int size, int64_t generation);
void ClearLogContext();

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
bool LogLevelEnabled(LogLevel level);

// Parses "debug", "info", "warning" or "error" (any case); false otherwise.
bool ParseLogLevel(absl::string_view text, LogLevel* level);

namespace internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace malle::base

#define MALLE_LOG_LEVEL_DEBUG ::malle::base::LogLevel::kDebug
#define MALLE_LOG_LEVEL_INFO ::malle::base::LogLevel::kInfo
#define MALLE_LOG_LEVEL_WARNING ::malle::base::LogLevel::kWarning
#define MALLE_LOG_LEVEL_ERROR ::malle::base::LogLevel::kError

#define MALLE_LOG(severity)                                                  \
  !::malle::base::LogLevelEnabled(MALLE_LOG_LEVEL_##severity)                \
      ? (void)0                                                              \
      : ::malle::base::internal::LogVoidify() &                              \
            ::malle::base::internal::LogMessage(MALLE_LOG_LEVEL_##severity,  \
                                                __FILE__, __LINE__)          \
                .stream()

#endif  // MALLE_BASE_LOG_H_
