#include "libmalle/cluster/local_process.h"

#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include <sys/stat.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/cluster/zygote.h"

namespace malle::cluster {
namespace {

// Closes its descriptor when it goes out of scope (after fork, in the parent).
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd = -1) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not
// the process. So every fork happens on one process-wide thread that never
// ends: a child started from a short-lived thread (LocalCluster's trace
// follower, a Python worker thread) lives as long as this process, and dies
// with it. The thread blocks every signal (they belong to the process's own
// handlers); the child unblocks them.
pid_t OnSpawnerThread(const std::function<pid_t()>& fork_child) {
  struct Spawner {
    std::mutex mu;
    std::condition_variable cv;
    const std::function<pid_t()>* job = nullptr;
    pid_t result = 0;
    bool done = false;
    std::mutex serial;  // one Spawn at a time
  };
  static Spawner* spawner = [] {
    auto* s = new Spawner;  // leaked on purpose: lives until the process exits
    std::thread([s] {
      sigset_t all;
      sigfillset(&all);
      ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
      for (;;) {
        std::unique_lock<std::mutex> lock(s->mu);
        s->cv.wait(lock, [s] { return s->job != nullptr; });
        s->result = (*s->job)();
        s->job = nullptr;
        s->done = true;
        s->cv.notify_all();
      }
    }).detach();
    return s;
  }();
  std::lock_guard<std::mutex> one(spawner->serial);
  std::unique_lock<std::mutex> lock(spawner->mu);
  spawner->done = false;
  spawner->job = &fork_child;
  spawner->cv.notify_all();
  spawner->cv.wait(lock, [] { return spawner->done; });
  return spawner->result;
}

}  // namespace

absl::StatusOr<std::string> ResolveProgram(const std::string& program) {
  if (program.find('/') == std::string::npos) {
    const char* path = std::getenv("PATH");
    for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
      std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
      struct stat st;
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          ::access(candidate.c_str(), X_OK) == 0) {
        return candidate;
      }
    }
    return absl::NotFoundError(absl::StrCat("'", program, "' is not in PATH"));
  }
  if (::access(program.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("'", program, "' is not an executable file"));
  }
  return program;
}

LocalProcess::LocalProcess(pid_t pid, bool group, std::shared_ptr<Zygote> zygote, std::string cold_reason)
    : pid_(pid), group_(group), zygote_(std::move(zygote)), cold_reason_(std::move(cold_reason)) {}

absl::StatusOr<std::unique_ptr<LocalProcess>> LocalProcess::Spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("ProcessSpec.argv is empty");
  if (spec.rank_env) {
    if (absl::Status s = spec.rank_env->Validate(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("ProcessSpec.rank_env: ", s.message()));
    }
  }
  MALLE_ASSIGN_OR_RETURN(std::string program, ResolveProgram(spec.argv[0]));
  if (spec.zygote != nullptr && !spec.inherit_fds.empty()) {
    return absl::InvalidArgumentError("ProcessSpec: inherit_fds cannot be given with a zygote");
  }
  if (!spec.cwd.empty()) {
    struct stat st;
    if (::stat(spec.cwd.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::NotFoundError(absl::StrCat("working directory '", spec.cwd, "' is not a directory"));
    }
  }
  // Log files are opened here, in the parent: a path that cannot be written
  // is an error of Spawn, not output lost without a word in the child.
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (spec.truncate_logs ? O_TRUNC : O_APPEND);
  auto open_log = [&](const std::string& path, const char* what) -> absl::StatusOr<FileDescriptor> {
    if (path.empty()) return FileDescriptor();
    FileDescriptor fd(::open(path.c_str(), flags, 0644));
    if (fd.get() < 0) {
      const std::string error = std::strerror(errno);
      const auto make = errno == EACCES ? absl::PermissionDeniedError : absl::NotFoundError;
      return make(absl::StrCat(what, " file '", path, "' cannot be opened: ", error));
    }
    return fd;
  };
  MALLE_ASSIGN_OR_RETURN(FileDescriptor out, open_log(spec.stdout_path, "stdout"));
  MALLE_ASSIGN_OR_RETURN(FileDescriptor err, open_log(spec.stderr_path, "stderr"));
  const int out_fd = out.get();
  const int err_fd = spec.stderr_to_stdout ? out_fd : err.get();
  const bool err_to_out = spec.stderr_to_stdout && out_fd < 0;  // both to the inherited stdout
  // Everything the child needs is prepared before fork: between fork and exec
  // only async-signal-safe calls are allowed (the parent has threads).
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  if (!spec.clear_env) {
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  }
  std::vector<std::pair<std::string, std::string>> added = spec.env;
  if (spec.rank_env) {
    for (auto& kv : RankEnvVars(*spec.rank_env)) added.push_back(std::move(kv));
  }
  for (const auto& [k, v] : added) {
    // A later value of a name replaces an earlier one (execve would keep both).
    const std::string prefix = absl::StrCat(k, "=");
    env_strings.erase(std::remove_if(env_strings.begin(), env_strings.end(),
                                     [&](const std::string& e) { return absl::StartsWith(e, prefix); }),
                      env_strings.end());
    env_strings.push_back(absl::StrCat(k, "=", v));
  }
  std::vector<char*> envp;
  for (const std::string& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const bool group = spec.new_process_group;

  std::string cold_reason;
  if (spec.zygote != nullptr) {
    std::string cwd = spec.cwd;
    if (cwd.empty()) {
      char buf[4096];
      if (::getcwd(buf, sizeof(buf)) != nullptr) cwd = buf;
    }
    cold_reason = cwd.empty() ? "the working directory is unknown"
                              : spec.zygote->Refusal(program, spec.argv, env_strings, cwd);
    if (cold_reason.empty()) {
      // Where the output goes: the spec's files, or this process's own
      // stdout/stderr (what a child started here would inherit).
      const int fork_out = out_fd >= 0 ? out_fd : STDOUT_FILENO;
      const int fork_err = err_fd >= 0 ? err_fd : (err_to_out ? fork_out : STDERR_FILENO);
      absl::StatusOr<pid_t> pid = spec.zygote->Fork(spec.argv, env_strings, cwd, group, fork_out, fork_err);
      if (pid.ok()) return std::unique_ptr<LocalProcess>(new LocalProcess(*pid, group, spec.zygote, ""));
      cold_reason = std::string(pid.status().message());
    }
  }
  std::vector<int> inherit = spec.inherit_fds;

  int fork_errno = 0;
  const pid_t pid = OnSpawnerThread([&]() -> pid_t {
  const pid_t pid = ::fork();
  if (pid < 0) fork_errno = errno;
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // A parent that takes signals with sigwait has them blocked; the child
    // must not inherit that (SIGTERM would not reach it).
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    if (group) ::setpgid(0, 0);
    if (out_fd >= 0) ::dup2(out_fd, STDOUT_FILENO);
    if (err_fd >= 0) ::dup2(err_fd, STDERR_FILENO);
    if (err_to_out) ::dup2(STDOUT_FILENO, STDERR_FILENO);
    for (int fd : inherit) ::fcntl(fd, F_SETFD, 0);
    if (!spec.cwd.empty() && ::chdir(spec.cwd.c_str()) != 0) ::_exit(127);
    ::execve(program.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
  });
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(fork_errno)));
  // Also in the parent, so that a signal to the group right after Spawn
  // cannot race the child's own setpgid.
  if (group) ::setpgid(pid, pid);
  return std::unique_ptr<LocalProcess>(new LocalProcess(pid, group, nullptr, std::move(cold_reason)));
}

LocalProcess::~LocalProcess() {
  if (!PollStatus().has_value()) {
    ::kill(group_ ? -pid_ : pid_, SIGKILL);
    if (zygote_ != nullptr) {
      (void)WaitStatus(absl::Seconds(10));  // the zygote reports it, then reaps it
    } else {
      int status = 0;
      ::waitpid(pid_, &status, 0);  // SIGKILL cannot be ignored: this returns
    }
  }
}

absl::Status LocalProcess::Signal(int signal) {
  if (PollStatus().has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("process ", pid_, " has already exited"));
  }
  // The group only while its leader is not reaped: after that its pid (the
  // group id) could name somebody else's group.
  if (::kill(group_ ? -pid_ : pid_, signal) != 0) {
    return absl::InternalError(absl::StrCat("kill(", group_ ? "-" : "", pid_, ", ", signal, "): ",
                                            std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::optional<ExitStatus> LocalProcess::PollStatus() {
  if (exit_.has_value()) return exit_;
  if (zygote_ != nullptr) {
    exit_ = zygote_->PollExit(pid_);
    if (exit_.has_value()) zygote_->Release(pid_);
    return exit_;
  }
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    ExitStatus e;
    if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
    exit_ = e;
  }
  return exit_;
}

std::optional<int> LocalProcess::Poll() {
  std::optional<ExitStatus> e = PollStatus();
  if (!e) return std::nullopt;
  return e->ShellCode();
}

absl::StatusOr<ExitStatus> LocalProcess::WaitStatus(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  for (;;) {
    if (auto e = PollStatus()) return *e;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
}

absl::StatusOr<int> LocalProcess::Wait(absl::Duration timeout) {
  MALLE_ASSIGN_OR_RETURN(ExitStatus e, WaitStatus(timeout));
  return e.ShellCode();
}

absl::StatusOr<int> LocalProcess::Kill(absl::Duration timeout) {
  if (!PollStatus().has_value()) ::kill(group_ ? -pid_ : pid_, SIGKILL);
  return Wait(timeout);
}

}  // namespace malle::cluster
