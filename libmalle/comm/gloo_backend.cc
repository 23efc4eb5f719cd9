// The only translation unit that includes c10d's ProcessGroupGloo.hpp.
//
// The PyPI wheel ships no Gloo headers; Debian's libgloo-dev provides them.
// This file only calls out-of-line members of ProcessGroupGloo (constructor,
// Options, device creation), whose layout does not depend on Gloo's headers,
// so the older headers are safe here. Keep it that way: do not call inline
// members that touch gloo:: types.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <exception>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "libmalle/comm/backend.h"

namespace malle::comm {
namespace {

// Gloo writes to its peers with writev(), which raises SIGPIPE when a peer
// was killed: the default action ends this process too, so one kill -9 took a
// survivor with it (exit 141). Library-wide, the first Gloo group ignores
// SIGPIPE unless the program installed its own handler; the write then fails
// with EPIPE and the collective fails like any other (Python ignores SIGPIPE
// already).
void IgnoreSigpipeOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  });
}

// c10d's flight recorder (a process-wide trace of collectives, on by default)
// inserts a group's status into a shared map before it takes its lock, so two
// groups enqueueing at once can corrupt it: seen as a crash in
// FlightRecorder::recordWithResetEnabled when three members of one process (a
// test) recovered while another enqueued. malletrain builds a group per
// generation, often beside an old one, so it turns the recorder off unless the
// program asked for a buffer size itself. It must happen before c10d first
// reads the setting, i.e. before the first process group of the process.
void DisableFlightRecorderOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
  });
}

constexpr char kLoopback[] = "127.0.0.1";

class GlooFactory final : public BackendFactory {
 public:
  explicit GlooFactory(GlooBackendOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "gloo"; }
  c10::DeviceType device_type() const override { return options_.device_type; }

  absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> Create(const GroupSpec& spec) const override {
    IgnoreSigpipeOnce();
    DisableFlightRecorderOnce();
    if (options_.device_type != c10::DeviceType::CPU && options_.device_type != c10::DeviceType::CUDA) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the Gloo backend reduces CPU or CUDA tensors, not ", c10::DeviceTypeName(options_.device_type)));
    }
    try {
      auto opts = c10d::ProcessGroupGloo::Options::create(
          std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(spec.timeout))));
      const std::string& host = !options_.hostname.empty()   ? options_.hostname
                                : !spec.local_address.empty() ? spec.local_address
                                                              : kLoopback;
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
      opts->threads = options_.threads;
      return c10::intrusive_ptr<c10d::Backend>(
          c10::make_intrusive<c10d::ProcessGroupGloo>(spec.store, spec.rank, spec.size, opts));
    } catch (const std::exception& e) {
      std::string what = e.what();
      if (size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
      const std::string message = absl::StrCat("building Gloo group of generation ", spec.generation,
                                               " (rank ", spec.rank, " of ", spec.size, "): ", what);
      if (what.find("imeout") != std::string::npos || what.find("timed out") != std::string::npos) {
        return absl::DeadlineExceededError(message);
      }
      return absl::UnavailableError(message);
    }
  }

 private:
  GlooBackendOptions options_;
};

}  // namespace

std::shared_ptr<const BackendFactory> MakeGlooBackend(GlooBackendOptions options) {
  return std::make_shared<GlooFactory>(std::move(options));
}

}  // namespace malle::comm
