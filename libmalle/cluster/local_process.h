// LocalProcess: a child process owned by the object that started it. The one
// way libmalle and malletrain start rank processes (the node agent, the local
// launcher through its binding _C.LocalProcess, LocalCluster's daemons, the
// multi-process tests and benchmarks).
//
// Every child gets PR_SET_PDEATHSIG(SIGKILL), so it cannot outlive a parent
// that crashes, and starts with no signal blocked. The signal follows the
// thread that forks, so every fork runs on one process-wide thread that never
// ends (docs/threading.md): a child started from a short-lived thread lives as
// long as the process. Its output can go to log
// files (opened by Spawn, so a bad path is Spawn's error, not a silent loss),
// its environment can be the parent's plus additions or only what the spec
// gives, with the rank environment contract (rank_env.h) added last; it can
// lead a process group of its own, so that a signal reaches whatever it
// started too. With a zygote (zygote.h) in the spec, a Python process is
// forked from that warm interpreter instead, when that gives exactly what
// execve would (else it is started cold, and cold_reason() says why); the
// object behaves the same either way.
//
//   ProcessSpec spec{{"/bin/sleep", "10"}};
//   spec.rank_env = env;                   // MALLE_STORE, MALLE_JOB_ID, ...
//   spec.new_process_group = true;
//   MALLE_ASSIGN_OR_RETURN(auto p, LocalProcess::Spawn(spec));
//   MALLE_RETURN_IF_ERROR(p->Signal(SIGTERM));               // the whole group
//   MALLE_ASSIGN_OR_RETURN(int code, p->Wait(absl::Seconds(5)));   // 128 + 15
//
// Thread-safety: one owner thread per object. The destructor kills (SIGKILL,
// the group too) and reaps a child that is still running.
#ifndef MALLE_CLUSTER_LOCAL_PROCESS_H_
#define MALLE_CLUSTER_LOCAL_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libmalle/cluster/rank_env.h"

namespace malle::cluster {

class Zygote;

// `program` as execvp would find it: a path containing '/' must be an
// executable file; a bare name is looked up in PATH. kNotFound otherwise.
absl::StatusOr<std::string> ResolveProgram(const std::string& program);

struct ProcessSpec {
  // argv[0] is the executable: a path, or a bare name looked up in PATH
  // (as execvp would, but before fork, so a missing program is an error of
  // Spawn rather than an exit code 127).
  std::vector<std::string> argv;
  std::string stdout_path;        // empty = inherit
  std::string stderr_path;        // empty = inherit (or stdout's, see stderr_to_stdout)
  std::vector<std::pair<std::string, std::string>> env;  // added to the environment
  std::string cwd;  // empty = the parent's
  // The rank environment contract: RankEnvVars(*rank_env) are added after
  // `env`, so they win. Validated by Spawn.
  std::optional<RankEnv> rank_env;
  bool clear_env = false;          // start from an empty environment, not the parent's
  bool stderr_to_stdout = false;   // stderr goes where stdout goes (one log file)
  bool truncate_logs = false;      // log files are truncated instead of appended to
  // The child leads a new process group (setpgid): Signal and Kill reach
  // every process it starts, not only itself.
  bool new_process_group = false;
  // Descriptors the child keeps (their close-on-exec flag is cleared in it).
  std::vector<int> inherit_fds;
  // Start it through this warm interpreter when it can (zygote.h); its
  // inherit_fds must be empty then.
  std::shared_ptr<Zygote> zygote;
};

// How a child ended: by itself with `code`, or killed by `signal` (then code is 0).
struct ExitStatus {
  int code = 0;
  int signal = 0;
  // The shell's convention: code, or 128 + signal.
  int ShellCode() const { return signal != 0 ? 128 + signal : code; }
  // subprocess.Popen's convention: code, or -signal.
  int PythonCode() const { return signal != 0 ? -signal : code; }
};

class LocalProcess {
 public:
  // Errors: kInvalidArgument (empty argv, an invalid rank_env naming its
  // variable), kNotFound (not executable, not in PATH, or cwd is not a
  // directory), kPermissionDenied / kNotFound (a log file cannot be opened),
  // kInternal (fork failed).
  static absl::StatusOr<std::unique_ptr<LocalProcess>> Spawn(const ProcessSpec& spec);
  ~LocalProcess();

  pid_t pid() const { return pid_; }
  bool leads_group() const { return group_; }
  // Forked from the spec's zygote (not a new interpreter).
  bool warm() const { return zygote_ != nullptr; }
  // Why the spec's zygote did not start it (empty: warm, or no zygote given).
  const std::string& cold_reason() const { return cold_reason_; }
  // Sends `signal` to this child (to its whole group if it leads one).
  // kFailedPrecondition once it has exited. Does not block.
  absl::Status Signal(int signal);
  // How the child ended, if it has (reaps it). Does not block.
  std::optional<ExitStatus> PollStatus();
  // The exit status in the shell's convention (ExitStatus::ShellCode), if it has exited.
  std::optional<int> Poll();
  // Blocks until the child exits (returns as Poll) or kDeadlineExceeded.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  absl::StatusOr<ExitStatus> WaitStatus(absl::Duration timeout);
  // SIGKILL (the group too), then Wait(timeout).
  absl::StatusOr<int> Kill(absl::Duration timeout = absl::Seconds(10));

 private:
  LocalProcess(pid_t pid, bool group, std::shared_ptr<Zygote> zygote, std::string cold_reason);
  pid_t pid_;
  bool group_;
  std::shared_ptr<Zygote> zygote_;  // the parent, when warm
  std::string cold_reason_;
  std::optional<ExitStatus> exit_;
};

}  // namespace malle::cluster

#endif  // MALLE_CLUSTER_LOCAL_PROCESS_H_
