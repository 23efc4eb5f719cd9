#include "libmalle/comm/internal/local_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/comm/internal/etcd_store.h"

namespace malle::comm::internal {

absl::StatusOr<std::string> LocalAddressToward(absl::string_view host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;  // the liveness listener and probes are IPv4
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string h(host), p = absl::StrCat(port);
  if (const int rc = ::getaddrinfo(h.c_str(), p.c_str(), &hints, &found); rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", host, "' does not resolve to an IPv4 address: ", ::gai_strerror(rc)));
  }
  std::string error;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    // connect() on a UDP socket only picks the route and the source address.
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      ::close(fd);
      ::freeaddrinfo(found);
      char text[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
      return std::string(text);
    }
    error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("no route to ", host, ":", port, ": ", error));
}

absl::StatusOr<std::string> InterfaceAddress(absl::string_view ifname) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return absl::UnavailableError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  std::vector<std::string> names;
  std::string out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    names.emplace_back(i->ifa_name);
    if (out.empty() && ifname == i->ifa_name) {
      char text[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text));
      out = text;
    }
  }
  ::freeifaddrs(list);
  if (out.empty()) {
    return absl::NotFoundError(absl::StrCat("interface '", ifname, "' has no IPv4 address (interfaces with one: ",
                                            absl::StrJoin(names, ", "), ")"));
  }
  return out;
}

absl::StatusOr<std::string> LocalAddressFor(const ControlStore& store) {
  if (const char* ifname = std::getenv(kEnvGlooSocketIfname); ifname != nullptr && *ifname != '\0') {
    absl::StatusOr<std::string> a = InterfaceAddress(ifname);
    if (!a.ok()) return absl::Status(a.status().code(), absl::StrCat(kEnvGlooSocketIfname, ": ", a.status().message()));
    return a;
  }
  std::vector<std::pair<std::string, int>> endpoints;
  if (absl::StartsWith(store.host(), "etcd://")) {
    absl::StatusOr<EtcdAddress> etcd = ParseEtcdAddress(store.host());
    if (!etcd.ok()) return etcd.status();
    for (const std::string& e : etcd->endpoints) {
      const size_t colon = e.rfind(':');
      int port = 0;
      if (colon != std::string::npos && absl::SimpleAtoi(e.substr(colon + 1), &port)) {
        endpoints.emplace_back(e.substr(0, colon), port);
      }
    }
  } else if (store.port() != 0) {
    endpoints.emplace_back(store.host(), store.port());
  } else {
    return std::string("127.0.0.1");  // in-memory: every member is in this process
  }
  std::string errors;
  for (const auto& [host, port] : endpoints) {
    absl::StatusOr<std::string> a = LocalAddressToward(host, port);
    if (a.ok()) return a;
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", a.status().message());
  }
  return absl::UnavailableError(absl::StrCat("no local address reaches the control store ", store.address(), ": ",
                                             errors, " (set ", kEnvGlooSocketIfname, " to choose the interface)"));
}

}  // namespace malle::comm::internal
