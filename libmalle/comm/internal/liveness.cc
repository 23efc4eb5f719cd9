#include "libmalle/comm/internal/liveness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace malle::comm::internal {
namespace {

bool ParseIpv4(absl::string_view host, in_addr* out) {
  return ::inet_pton(AF_INET, std::string(host).c_str(), out) == 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LivenessListener>> LivenessListener::Listen(absl::string_view host) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (!ParseIpv4(host, &addr.sin_addr)) {
    return absl::InvalidArgumentError(absl::StrCat("liveness listener: '", host, "' is not an IPv4 address"));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("liveness listener: socket: ", std::strerror(errno)));
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("liveness listener on ", host, ": ", std::strerror(err)));
  }
  return std::unique_ptr<LivenessListener>(
      new LivenessListener(fd, absl::StrCat(host, ":", ntohs(addr.sin_port))));
}

LivenessListener::~LivenessListener() { ::close(fd_); }

void LivenessListener::Drain() {
  for (;;) {
    const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;  // EAGAIN: nothing pending (or an error: next time)
    ::close(c);
  }
}

Liveness Probe(absl::string_view address, absl::Duration timeout) {
  const size_t colon = address.rfind(':');
  int port = 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535 || !ParseIpv4(address.substr(0, colon), &addr.sin_addr)) {
    return Liveness::kUnknown;
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Liveness::kUnknown;
  Liveness verdict = Liveness::kUnknown;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    verdict = Liveness::kAlive;
  } else if (errno == ECONNREFUSED) {
    verdict = Liveness::kGone;
  } else if (errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    const int ms = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
    if (::poll(&p, 1, ms) == 1) {
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0) {
        if (err == 0) verdict = Liveness::kAlive;
        if (err == ECONNREFUSED) verdict = Liveness::kGone;
      }
    }
  }
  ::close(fd);
  return verdict;
}

}  // namespace malle::comm::internal
