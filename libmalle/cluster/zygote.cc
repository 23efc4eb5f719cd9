#include "libmalle/cluster/zygote.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/cluster/local_process.h"

extern char** environ;

namespace malle::cluster {
namespace {

// Read when an interpreter starts or by the modules a zygote imports (their
// thread pools, allocators, locale, logging): a warm process must have the
// zygote's values. Prefixes end in '*'.
constexpr const char* kImportTime[] = {
    "PYTHON*", "LD_*", "LANG", "LANGUAGE", "LC_*", "TZ", "HOME",
    "OMP_*", "GOMP_*", "KMP_*", "MKL_*", "OPENBLAS_*", "GOTO*", "BLIS_*", "VECLIB_*",
    "NUMEXPR_*", "NUMPY_*", "TORCH*", "PYTORCH_*", "TRITON_*", "MALLOC_*", "GLIBC_TUNABLES",
    "MALLE_LOG_LEVEL",
};

bool Matches(const std::string& pattern, const std::string& name) {
  if (!pattern.empty() && pattern.back() == '*') {
    return absl::StartsWith(name, absl::string_view(pattern).substr(0, pattern.size() - 1));
  }
  return name == pattern;
}

bool ValidModule(const std::string& m) {
  if (m.empty() || m.front() == '.' || m.back() == '.') return false;
  for (char c : m) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  }
  return true;
}

std::map<std::string, std::string> EnvMap(const std::vector<std::string>& env) {
  std::map<std::string, std::string> out;
  for (const std::string& e : env) {
    const size_t eq = e.find('=');
    if (eq == std::string::npos) continue;
    out[e.substr(0, eq)] = e.substr(eq + 1);
  }
  return out;
}

// Sends one message, with descriptors if any.
absl::Status SendMessage(int sock, const std::vector<std::string>& fields, const std::vector<int>& fds) {
  std::string data = absl::StrJoin(fields, std::string(1, '\0'));
  struct iovec iov;
  iov.iov_base = data.data();
  iov.iov_len = data.size();
  struct msghdr msg;
  std::memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) return absl::OkStatus();
    if (errno == EINTR) continue;
    return absl::UnavailableError(absl::StrCat("zygote: send: ", std::strerror(errno)));
  }
}

}  // namespace

bool ImportTimeVariable(const std::string& name) {
  for (const char* p : kImportTime) {
    if (Matches(p, name)) return true;
  }
  return false;
}

absl::StatusOr<std::shared_ptr<Zygote>> Zygote::Start(ZygoteOptions options) {
  if (options.python.empty()) return absl::InvalidArgumentError("ZygoteOptions.python is empty");
  for (const std::string& m : options.preload) {
    if (!ValidModule(m)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ZygoteOptions.preload: '", m, "' is not a module name ([A-Za-z0-9_.])"));
    }
  }
  MALLE_ASSIGN_OR_RETURN(std::string python, ResolveProgram(options.python));
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  ProcessSpec spec;
  spec.argv = {python, "-m", "malletrain._zygote", absl::StrCat("--fd=", fds[1]),
               absl::StrCat("--preload=", absl::StrJoin(options.preload, ","))};
  spec.env = options.env;
  spec.stdout_path = options.log_path;
  spec.stderr_to_stdout = true;
  spec.inherit_fds = {fds[1]};
  std::shared_ptr<Zygote> z(new Zygote());
  z->python_ = python;
  z->extra_import_env_ = options.import_time_env;
  z->started_ = absl::Now();
  absl::StatusOr<std::unique_ptr<LocalProcess>> process = LocalProcess::Spawn(spec);
  ::close(fds[1]);
  if (!process.ok()) {
    ::close(fds[0]);
    return process.status();
  }
  absl::MutexLock lock(&z->mu_);
  z->pid_ = (*process)->pid();
  z->process_ = *std::move(process);
  z->sock_ = fds[0];
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) z->env_[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : options.env) z->env_[k] = v;
  return z;
}

Zygote::~Zygote() {
  absl::MutexLock lock(&mu_);
  if (process_) (void)process_->Kill(absl::Seconds(10));
  if (sock_ >= 0) ::close(sock_);
}

void Zygote::MarkDeadLocked(const std::string& why) {
  if (failed_.empty()) {
    failed_ = why;
    MALLE_LOG(WARNING) << "zygote " << pid_ << " (" << python_ << ") is unusable: " << why;
  }
  ready_ = false;
  if (sock_ >= 0) {
    ::close(sock_);
    sock_ = -1;
  }
  // Its children got SIGKILL from PR_SET_PDEATHSIG; so does whatever they
  // started in their own groups (the group outlives its leader otherwise).
  if (process_ && process_->PollStatus().has_value()) {
    for (pid_t pid : live_) ::kill(-pid, SIGKILL);
  }
}

void Zygote::DrainLocked(absl::Duration timeout, std::optional<std::vector<std::string>>* reply) {
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (sock_ < 0) return;
    struct pollfd pfd{sock_, POLLIN, 0};
    const absl::Duration left = std::max(absl::ZeroDuration(), deadline - absl::Now());
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(left));
    const int r = ::poll(&pfd, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return;
    std::string buf(1 << 16, '\0');
    const ssize_t n = ::recv(sock_, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) {
      std::optional<ExitStatus> e = process_ ? process_->PollStatus() : std::nullopt;
      if (!e && process_) e = process_->WaitStatus(absl::Seconds(2)).value_or(ExitStatus{0, SIGKILL});
      MarkDeadLocked(failed_.empty() ? absl::StrCat("it exited (status ", e ? e->ShellCode() : -1, ")")
                                     : failed_);
      return;
    }
    buf.resize(n);
    std::vector<std::string> fields = absl::StrSplit(buf, '\0');
    const std::string& what = fields[0];
    if (what == "ready" && fields.size() >= 4) {
      int count = 0;
      (void)absl::SimpleAtoi(fields[3], &count);
      for (int i = 0; i < count && 4 + i < static_cast<int>(fields.size()); ++i) {
        const std::string& kv = fields[4 + i];
        const size_t eq = kv.find('=');
        if (eq != std::string::npos) import_env_[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      ready_ = true;
      warmup_s_ = absl::ToDoubleSeconds(absl::Now() - started_);
      MALLE_LOG(INFO) << "zygote " << pid_ << " ready in " << *warmup_s_ << " s (" << fields[2]
                      << " thread(s) before its first fork)";
    } else if (what == "failed") {
      MarkDeadLocked(fields.size() > 1 ? fields[1] : "its imports failed");
    } else if (what == "exit" && fields.size() == 4) {
      pid_t pid = 0;
      int code = 0, sig = 0;
      if (absl::SimpleAtoi(fields[1], &pid) && absl::SimpleAtoi(fields[2], &code) &&
          absl::SimpleAtoi(fields[3], &sig)) {
        exits_[pid] = {code, sig};
      }
    } else if (what == "pid" || what == "error") {
      if (reply != nullptr) {
        *reply = std::move(fields);
        return;
      }
      MALLE_LOG(WARNING) << "zygote " << pid_ << ": unexpected '" << what << "' reply";
    } else {
      MALLE_LOG(WARNING) << "zygote " << pid_ << ": unknown message '" << what.substr(0, 32) << "'";
    }
    // More may be queued: read them without waiting.
    deadline = absl::Now();
  }
}

bool Zygote::Ready() {
  absl::MutexLock lock(&mu_);
  DrainLocked(absl::ZeroDuration(), nullptr);
  if (ready_ && process_ && process_->PollStatus().has_value()) MarkDeadLocked("it exited");
  return ready_;
}

absl::Status Zygote::WaitReady(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (ready_) return absl::OkStatus();
    if (!failed_.empty()) return absl::UnavailableError(absl::StrCat("zygote: ", failed_));
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("zygote ", pid_, " not ready after ", absl::FormatDuration(timeout)));
    }
    DrainLocked(std::min(deadline - now, absl::Milliseconds(200)), nullptr);
    if (!ready_ && failed_.empty() && process_ && process_->PollStatus().has_value()) {
      DrainLocked(absl::ZeroDuration(), nullptr);  // its last words ("failed ...")
      MarkDeadLocked(absl::StrCat("it exited (status ", process_->PollStatus()->ShellCode(),
                                  ") before it was ready"));
    }
  }
}

std::string Zygote::failure() {
  absl::MutexLock lock(&mu_);
  DrainLocked(absl::ZeroDuration(), nullptr);
  if (failed_.empty() && process_ && process_->PollStatus().has_value()) {
    DrainLocked(absl::ZeroDuration(), nullptr);
    MarkDeadLocked(absl::StrCat("it exited (status ", process_->PollStatus()->ShellCode(), ")"));
  }
  return failed_;
}

std::optional<double> Zygote::warmup_seconds() const {
  absl::MutexLock lock(&mu_);
  return warmup_s_;
}

std::string Zygote::Refusal(const std::string& program, const std::vector<std::string>& argv,
                            const std::vector<std::string>& env, const std::string& cwd) {
  if (!Ready()) {
    absl::MutexLock lock(&mu_);
    return failed_.empty() ? "the zygote is not ready yet" : absl::StrCat("the zygote is unusable: ", failed_);
  }
  if (program != python_) {
    return absl::StrCat("'", program, "' is not the zygote's interpreter '", python_, "'");
  }
  if (argv.size() < 2) return "no script to run (an interactive interpreter)";
  if (argv[1] == "-m") {
    if (argv.size() < 3 || argv[2].empty() || argv[2][0] == '-') return "-m without a module name";
  } else if (argv[1].empty() || argv[1][0] == '-') {
    return absl::StrCat("interpreter option '", argv[1], "' (only `python SCRIPT` and `python -m MODULE` are forked)");
  } else {
    const std::string path = argv[1][0] == '/' ? argv[1] : absl::StrCat(cwd, "/", argv[1]);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::StrCat("script '", argv[1], "' is not a regular file");
    }
    std::ifstream f(path, std::ios::binary);
    char magic[4] = {0, 0, 0, 0};
    f.read(magic, 4);
    if (!f) return absl::StrCat("script '", argv[1], "' cannot be read");
    if (std::memcmp(magic, "PK\x03\x04", 4) == 0) return absl::StrCat("script '", argv[1], "' is a zip archive");
  }
  const std::map<std::string, std::string> want = EnvMap(env);
  absl::MutexLock lock(&mu_);
  auto import_time = [&](const std::string& name) {
    if (ImportTimeVariable(name)) return true;
    for (const std::string& p : extra_import_env_) {
      if (Matches(p, name)) return true;
    }
    return false;
  };
  for (const auto& [k, v] : want) {
    if (import_env_.count(k)) {
      return absl::StrCat("the environment sets ", k, ", which the zygote's imports set themselves");
    }
    if (!import_time(k)) continue;
    auto it = env_.find(k);
    if (it == env_.end() || it->second != v) {
      return absl::StrCat("environment variable ", k, " differs from the zygote's (read when the interpreter "
                          "starts or a module is imported)");
    }
  }
  for (const auto& [k, v] : env_) {
    if (import_time(k) && !want.count(k)) {
      return absl::StrCat("environment variable ", k, " is unset, the zygote has it (read when the "
                          "interpreter starts or a module is imported)");
    }
  }
  return "";
}

absl::StatusOr<pid_t> Zygote::Fork(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                   const std::string& cwd, bool new_group, int out_fd, int err_fd,
                                   absl::Duration timeout) {
  absl::MutexLock serial(&fork_mu_);
  absl::MutexLock lock(&mu_);
  if (sock_ < 0 || !ready_) return absl::UnavailableError(absl::StrCat("zygote: ", failed_.empty() ? "not ready" : failed_));
  std::vector<std::string> fields = {"spawn", cwd, new_group ? "g" : "", std::to_string(argv.size())};
  fields.insert(fields.end(), argv.begin(), argv.end());
  fields.push_back(std::to_string(env.size()));
  fields.insert(fields.end(), env.begin(), env.end());
  size_t bytes = 0;
  for (const std::string& f : fields) bytes += f.size() + 1;
  if (bytes > (1 << 20) - 4096) return absl::UnavailableError("zygote: the request is over 1 MiB");
  if (absl::Status s = SendMessage(sock_, fields, {out_fd, err_fd}); !s.ok()) {
    MarkDeadLocked(std::string(s.message()));
    return s;
  }
  std::optional<std::vector<std::string>> reply;
  const absl::Time deadline = absl::Now() + timeout;
  while (!reply && sock_ >= 0 && absl::Now() < deadline) DrainLocked(deadline - absl::Now(), &reply);
  if (!reply) {
    // No answer: the zygote is stuck or gone; not to be used again.
    if (process_) (void)process_->Kill(absl::Seconds(10));
    MarkDeadLocked(failed_.empty() ? "no answer to a spawn request" : failed_);
    return absl::UnavailableError(absl::StrCat("zygote: ", failed_));
  }
  if ((*reply)[0] == "error") {
    return absl::UnavailableError(absl::StrCat("zygote: ", reply->size() > 1 ? (*reply)[1] : "refused"));
  }
  pid_t pid = 0;
  if (reply->size() != 2 || !absl::SimpleAtoi((*reply)[1], &pid) || pid <= 0) {
    return absl::InternalError("zygote: malformed pid reply");
  }
  live_.insert(pid);
  return pid;
}

std::optional<ExitStatus> Zygote::PollExit(pid_t pid) {
  absl::MutexLock lock(&mu_);
  DrainLocked(absl::ZeroDuration(), nullptr);
  if (auto it = exits_.find(pid); it != exits_.end()) {
    return ExitStatus{it->second.first, it->second.second};
  }
  if (sock_ >= 0) return std::nullopt;
  // The zygote is gone: the process got SIGKILL with it (PR_SET_PDEATHSIG).
  // Dead once it no longer exists or is a zombie (init reaps it).
  if (::kill(pid, 0) == 0) {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z') return std::nullopt;
  }
  exits_[pid] = {0, SIGKILL};
  return ExitStatus{0, SIGKILL};
}

void Zygote::Release(pid_t pid) {
  absl::MutexLock lock(&mu_);
  live_.erase(pid);
  exits_.erase(pid);
  if (sock_ >= 0) (void)SendMessage(sock_, {"reap", std::to_string(pid)}, {});
}

}  // namespace malle::cluster
