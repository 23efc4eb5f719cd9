#include "libmalle/cluster/local_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace malle::cluster {
namespace {

int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalProcess>> LocalProcess::Spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("ProcessSpec.argv is empty");
  std::string program = spec.argv[0];
  if (program.find('/') == std::string::npos) {
    const char* path = std::getenv("PATH");
    std::string found;
    for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
      std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
      struct stat st;
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          ::access(candidate.c_str(), X_OK) == 0) {
        found = std::move(candidate);
        break;
      }
    }
    if (found.empty()) return absl::NotFoundError(absl::StrCat("'", program, "' is not in PATH"));
    program = std::move(found);
  } else if (::access(program.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("'", program, "' is not an executable file"));
  }
  if (!spec.cwd.empty()) {
    struct stat st;
    if (::stat(spec.cwd.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::NotFoundError(absl::StrCat("working directory '", spec.cwd, "' is not a directory"));
    }
  }
  // Everything the child needs is prepared before fork: between fork and exec
  // only async-signal-safe calls are allowed (the parent has threads).
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const auto& [k, v] : spec.env) env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> envp;
  for (const std::string& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // A parent that takes signals with sigwait has them blocked; the child
    // must not inherit that (SIGTERM would not reach it).
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    if (!spec.stdout_path.empty()) {
      int fd = ::open(spec.stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) ::dup2(fd, STDOUT_FILENO);
    }
    if (!spec.stderr_path.empty()) {
      int fd = ::open(spec.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) ::dup2(fd, STDERR_FILENO);
    }
    if (!spec.cwd.empty() && ::chdir(spec.cwd.c_str()) != 0) ::_exit(127);
    ::execve(program.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  return std::unique_ptr<LocalProcess>(new LocalProcess(pid));
}

LocalProcess::~LocalProcess() {
  if (!Poll().has_value()) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);  // SIGKILL cannot be ignored: this returns
  }
}

absl::Status LocalProcess::Signal(int signal) {
  if (Poll().has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("process ", pid_, " has already exited"));
  }
  if (::kill(pid_, signal) != 0) {
    return absl::InternalError(absl::StrCat("kill(", pid_, ", ", signal, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::optional<int> LocalProcess::Poll() {
  if (exit_status_.has_value()) return exit_status_;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) exit_status_ = DecodeWaitStatus(status);
  return exit_status_;
}

absl::StatusOr<int> LocalProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  for (;;) {
    if (auto code = Poll()) return *code;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
}

absl::StatusOr<int> LocalProcess::Kill(absl::Duration timeout) {
  if (!Poll().has_value()) ::kill(pid_, SIGKILL);
  return Wait(timeout);
}

}  // namespace malle::cluster
