// Zygote: a Python interpreter that has already imported torch and malletrain
// (python/malletrain/_zygote.py) and forks rank processes from that warm state.
// LocalProcess::Spawn starts a process through it when ProcessSpec::zygote is
// set and the process is one it can start exactly as execve would; otherwise
// it forks and execs as always (LocalProcess::cold_reason says why).
//
// Why: a rank's warm-up (interpreter start, `import torch`, imports of the
// job's script) costs seconds, and it used to be paid on an allocated node's
// clock: the node is held by the job but does not train. A node agent starts
// its zygote while its node sits idle in the pool; a rank is then a fork (a
// few milliseconds), and only the script's own work (model build, joining)
// is left on the node's clock.
//
//   ZygoteOptions o;
//   o.python = "/path/to/venv/bin/python";            // ranks naming it are served
//   MALLE_ASSIGN_OR_RETURN(std::shared_ptr<Zygote> z, Zygote::Start(o));
//   MALLE_RETURN_IF_ERROR(z->WaitReady(absl::Seconds(60)));
//   ProcessSpec spec{{"/path/to/venv/bin/python", "train.py", "--epochs", "3"}};
//   spec.zygote = z;
//   MALLE_ASSIGN_OR_RETURN(auto p, LocalProcess::Spawn(spec));   // p->warm()
//
// What a warm process gets, the same as from execve of the same spec: its
// exact environment (the spec's, as LocalProcess builds it), working
// directory, argv (sys.argv, sys.orig_argv), sys.path (the script's real
// directory, or the working directory for -m, then the interpreter's path),
// a fresh __main__, stdout/stderr where the spec sends them, default signal
// dispositions, an empty signal mask, PR_SET_PDEATHSIG(SIGKILL) (it dies with
// the zygote, which dies with its owner), its own process group if asked, new
// random seeds; its own pid, which LocalProcess signals and waits for as for
// any child. It is a child of the zygote, not of the caller: the zygote
// reports its exit and keeps it a zombie until LocalProcess has read the
// status, so its pid cannot be reused while it may still be signalled.
//
// Served only when that is exact: argv[0] is the zygote's interpreter (the
// same path after the PATH lookup), argv[1] a script file (not a zip) or
// `-m MODULE` (no interpreter options), and the process's environment equals
// the zygote's in every variable read when an interpreter starts or a module
// is imported (ImportTimeVariable: PYTHON*, locale, thread pools, allocator,
// torch's own, and any the preloaded imports set themselves). A fork happens
// only from a single-threaded zygote: it checks, after each fork, that no
// thread lived through it (numpy's OpenBLAS joins its workers in its own
// pthread_atfork handler), and refuses otherwise.
//
// Protocol (SOCK_SEQPACKET, one message per datagram, fields separated by
// NUL): zygote -> client "ready pid threads n k=v..." (the n variables its
// imports set) or "failed why"; client -> zygote "spawn cwd flags argc
// argv... envc env..." with SCM_RIGHTS [stdout, stderr] (flags: "g" = new
// process group), answered "pid N" or "error why"; at any time "exit pid code
// signal"; client -> zygote "reap pid" once the exit is recorded.
//
// Thread-safety: thread-safe (one mutex); Fork calls are serialised.
#ifndef MALLE_CLUSTER_ZYGOTE_H_
#define MALLE_CLUSTER_ZYGOTE_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace malle::cluster {

class LocalProcess;
struct ExitStatus;

struct ZygoteOptions {
  // The interpreter: a path, or a bare name looked up in PATH. Processes whose
  // argv[0] resolves to the same path are served.
  std::string python;
  // Modules imported before it serves (import errors: Ready() never, WaitReady
  // says which). Ids of modules: [A-Za-z0-9_.].
  std::vector<std::string> preload = {"torch", "torch._dynamo", "malletrain"};
  // Added to the caller's environment for the zygote (and so expected, equal,
  // in the processes it serves where ImportTimeVariable says so).
  std::vector<std::pair<std::string, std::string>> env;
  // The zygote's own stdout and stderr (one file, appended); empty: inherit.
  std::string log_path;
  // More variable names (or prefixes ending in '*') to treat as read at import.
  std::vector<std::string> import_time_env;
};

// Whether a variable may have been read when the interpreter started or a
// preloaded module was imported (so a warm process must have the zygote's value).
bool ImportTimeVariable(const std::string& name);

class Zygote {
 public:
  // Starts the zygote process; does not wait for its imports (Ready, WaitReady).
  // Errors: kInvalidArgument (empty python, a bad module name), kNotFound (no
  // such interpreter), LocalProcess::Spawn's errors.
  static absl::StatusOr<std::shared_ptr<Zygote>> Start(ZygoteOptions options);
  // Kills the zygote (SIGKILL); the processes it forked die with it.
  ~Zygote();

  pid_t pid() const { return pid_; }
  const std::string& python() const { return python_; }
  // The zygote has finished its imports and is alive. Does not block.
  bool Ready();
  // Blocks until Ready: kDeadlineExceeded after `timeout`, kUnavailable if it
  // failed (the message says why: an import error, it died).
  absl::Status WaitReady(absl::Duration timeout);
  // Why it is unusable (its imports failed, it died); empty while it is
  // importing or ready. Does not block.
  std::string failure();
  // Seconds from Start to ready (nullopt until then).
  std::optional<double> warmup_seconds() const;

  // Why a process with this resolved program, argv, final environment
  // ("K=V") and working directory cannot be started by this zygote exactly
  // as execve would start it; empty: it can. Does not block.
  std::string Refusal(const std::string& program, const std::vector<std::string>& argv,
                      const std::vector<std::string>& env, const std::string& cwd);

 private:
  friend class LocalProcess;
  Zygote() = default;

  // Forks a process (see the protocol); kUnavailable when the zygote refused
  // or died (the caller then starts it cold). Blocks up to `timeout`.
  absl::StatusOr<pid_t> Fork(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                             const std::string& cwd, bool new_group, int out_fd, int err_fd,
                             absl::Duration timeout = absl::Seconds(30));
  // How a forked process ended, if it has. Does not block.
  std::optional<ExitStatus> PollExit(pid_t pid);
  // The status was recorded: the zygote may reap the zombie.
  void Release(pid_t pid);

  // Reads what the zygote sent, waiting up to `timeout` for the first message;
  // a reply to a spawn goes to `reply`. Called with mu_ held.
  void DrainLocked(absl::Duration timeout, std::optional<std::vector<std::string>>* reply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDeadLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string python_;
  std::vector<std::string> extra_import_env_;
  pid_t pid_ = -1;
  absl::Time started_;
  mutable absl::Mutex mu_;
  absl::Mutex fork_mu_;  // one Fork at a time (its reply is the next "pid"/"error")
  int sock_ ABSL_GUARDED_BY(mu_) = -1;
  std::unique_ptr<LocalProcess> process_ ABSL_GUARDED_BY(mu_);
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<double> warmup_s_ ABSL_GUARDED_BY(mu_);
  std::string failed_ ABSL_GUARDED_BY(mu_);  // non-empty: unusable, and why
  std::map<std::string, std::string> env_ ABSL_GUARDED_BY(mu_);         // its environment at start
  std::map<std::string, std::string> import_env_ ABSL_GUARDED_BY(mu_);  // set by its imports
  std::set<pid_t> live_ ABSL_GUARDED_BY(mu_);
  std::map<pid_t, std::pair<int, int>> exits_ ABSL_GUARDED_BY(mu_);  // pid -> (code, signal)
};

}  // namespace malle::cluster

#endif  // MALLE_CLUSTER_ZYGOTE_H_
