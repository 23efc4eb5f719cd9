// Is a member's process still there? A probe that needs no reporter.
//
// Every member listens on a TCP port of its own (on the address its Gloo
// groups use) for as long as its group exists, and publishes the address in
// the store. When the kernel refuses a connection to that port, nobody
// listens any more: the process died (kill -9 included) or closed its group.
// A process that is alive but frozen (SIGSTOP) or busy still has its
// connections accepted by the kernel, so it counts as alive; a host that does
// not answer gives no verdict. A recovery uses a refusal to stop waiting for
// the member's check-in instead of waiting out recovery_grace.
//
// Thread-safety: Drain() from one thread at a time; Probe() from any thread.
#ifndef MALLE_COMM_INTERNAL_LIVENESS_H_
#define MALLE_COMM_INTERNAL_LIVENESS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace malle::comm::internal {

class LivenessListener {
 public:
  // Listens on `host` (an IPv4 address), port chosen by the kernel.
  // Errors: kInvalidArgument (not an IPv4 address), kUnavailable (socket calls failed).
  static absl::StatusOr<std::unique_ptr<LivenessListener>> Listen(absl::string_view host);
  ~LivenessListener();
  LivenessListener(const LivenessListener&) = delete;
  LivenessListener& operator=(const LivenessListener&) = delete;

  const std::string& address() const { return address_; }  // "host:port"
  // Accepts and closes the probes' connections (never blocks).
  void Drain();

 private:
  LivenessListener(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  int fd_;
  std::string address_;
};

enum class Liveness { kAlive, kGone, kUnknown };

// Connects to `address` ("host:port") once, waiting at most `timeout`:
// kGone if refused, kAlive if accepted, kUnknown otherwise (no answer, a
// malformed address, no route).
Liveness Probe(absl::string_view address, absl::Duration timeout);

}  // namespace malle::comm::internal

#endif  // MALLE_COMM_INTERNAL_LIVENESS_H_
