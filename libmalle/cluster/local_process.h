// LocalProcess: a child process owned by the object that started it.
//
// Used by the local launcher, the demo, the benchmarks and the multi-process
// tests, which must stop every process they start, by pid, with a timeout on
// every wait. The child gets PR_SET_PDEATHSIG(SIGKILL), so it cannot outlive
// a parent that crashes, and starts with no signal blocked.
//
//   ProcessSpec spec{{"/bin/sleep", "10"}};
//   ASSIGN_OR_RETURN(auto p, LocalProcess::Spawn(spec));
//   RETURN_IF_ERROR(p->Signal(SIGKILL));
//   ASSIGN_OR_RETURN(int code, p->Wait(absl::Seconds(5)));   // 128 + 9
//
// Thread-safety: one owner thread per object. The destructor kills (SIGKILL)
// and reaps a child that is still running.
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

namespace malle::cluster {

struct ProcessSpec {
  // argv[0] is the executable: a path, or a bare name looked up in PATH
  // (as execvp would, but before fork, so a missing program is an error of
  // Spawn rather than an exit code 127).
  std::vector<std::string> argv;
  std::string stdout_path;        // empty = inherit
  std::string stderr_path;        // empty = inherit
  std::vector<std::pair<std::string, std::string>> env;  // added to the parent's environment
  std::string cwd;  // empty = the parent's
};

class LocalProcess {
 public:
  // Errors: kInvalidArgument (empty argv), kNotFound (not executable, not
  // in PATH, or cwd is not a directory), kInternal (fork failed).
  static absl::StatusOr<std::unique_ptr<LocalProcess>> Spawn(const ProcessSpec& spec);
  ~LocalProcess();

  pid_t pid() const { return pid_; }
  // Sends `signal` to this child only. kFailedPrecondition once it has exited.
  absl::Status Signal(int signal);
  // The exit status if the child has exited: its exit code, or 128 + signal.
  std::optional<int> Poll();
  // Blocks until the child exits (returns as Poll) or kDeadlineExceeded.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // SIGKILL, then Wait(timeout).
  absl::StatusOr<int> Kill(absl::Duration timeout = absl::Seconds(10));

 private:
  explicit LocalProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  std::optional<int> exit_status_;
};

}  // namespace malle::cluster

#endif  // MALLE_CLUSTER_LOCAL_PROCESS_H_
