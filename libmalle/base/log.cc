#include "libmalle/base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace malle::base {
namespace {

LogLevel InitialLevel() {
  LogLevel level = LogLevel::kInfo;
  if (const char* env = std::getenv("MALLE_LOG_LEVEL")) {
    if (!ParseLogLevel(env, &level)) {
      // Not a Status: logging must work before anything else does. Say so once.
      std::fprintf(stderr, "malletrain: ignoring MALLE_LOG_LEVEL=%s (expected debug|info|warning|error)\n",
                   env);
    }
  }
  return level;
}

std::atomic<int>& LevelStore() {
  static std::atomic<int> level{static_cast<int>(InitialLevel())};
  return level;
}

struct Context {
  std::mutex mu;
  std::string prefix;
};

Context& GetContext() {
  static Context* context = new Context();  // leaked: used by exit-time logs
  return *context;
}

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return 'D';
    case LogLevel::kInfo: return 'I';
    case LogLevel::kWarning: return 'W';
    case LogLevel::kError: return 'E';
  }
  return '?';
}

}  // namespace

void SetLogContext(absl::string_view job, int rank, int size, int64_t generation) {
  std::string prefix;
  if (!job.empty()) absl::StrAppendFormat(&prefix, " job=%s", job);
  if (rank >= 0) absl::StrAppendFormat(&prefix, " rank=%d/%d gen=%d", rank, size, generation);
  Context& context = GetContext();
  std::lock_guard<std::mutex> lock(context.mu);
  context.prefix = std::move(prefix);
}

void ClearLogContext() {
  Context& context = GetContext();
  std::lock_guard<std::mutex> lock(context.mu);
  context.prefix.clear();
}

void SetLogLevel(LogLevel level) { LevelStore().store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(LevelStore().load()); }
bool LogLevelEnabled(LogLevel level) {
  return static_cast<int>(level) >= LevelStore().load(std::memory_order_relaxed);
}

bool ParseLogLevel(absl::string_view text, LogLevel* level) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "debug") *level = LogLevel::kDebug;
  else if (lower == "info") *level = LogLevel::kInfo;
  else if (lower == "warning" || lower == "warn") *level = LogLevel::kWarning;
  else if (lower == "error") *level = LogLevel::kError;
  else return false;
  return true;
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  const absl::Time now = absl::Now();
  std::string prefix;
  {
    Context& context = GetContext();
    std::lock_guard<std::mutex> lock(context.mu);
    prefix = context.prefix;
  }
  const char* base = file;
  for (const char* p = file; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  stream_ << LevelLetter(level_) << absl::FormatTime("%m%d %H:%M:%E6S", now, absl::LocalTimeZone())
          << " pid=" << ::getpid() << prefix << " " << base << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string text = stream_.str();
  // One write(2) per line keeps lines of concurrent threads and ranks intact.
  ssize_t unused = ::write(STDERR_FILENO, text.data(), text.size());
  (void)unused;
}

}  // namespace internal
}  // namespace malle::base
