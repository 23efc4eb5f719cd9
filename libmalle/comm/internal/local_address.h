// The address a rank's own sockets (its Gloo pairs, its liveness listener)
// bind to and announce to the other members through the control store.
//
// On one host every member can bind loopback. Across hosts a member must
// announce an address the others can reach, and the one place a rank knows
// is reachable from the rest of the deployment is the route it uses to reach
// the control store: LocalAddressFor() returns the source address the kernel
// picks for that route (a connected UDP socket; nothing is sent). When
// GLOO_SOCKET_IFNAME is set (torch's variable for the same choice), the IPv4
// address of that interface wins.
//
//   MALLE_ASSIGN_OR_RETURN(std::string host, internal::LocalAddressFor(*store));
//   // "10.0.3.7" on a node that reaches the store at 10.0.3.1:29400
//
// Thread-safe (reads the environment; no shared state).
#ifndef MALLE_COMM_INTERNAL_LOCAL_ADDRESS_H_
#define MALLE_COMM_INTERNAL_LOCAL_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace malle::comm {
class ControlStore;
}  // namespace malle::comm

namespace malle::comm::internal {

inline constexpr char kEnvGlooSocketIfname[] = "GLOO_SOCKET_IFNAME";

// The local IPv4 address on the route to host:port ("127.0.0.1" for a
// loopback host). Errors: kInvalidArgument (host does not resolve to IPv4),
// kUnavailable (no route).
absl::StatusOr<std::string> LocalAddressToward(absl::string_view host, int port);

// The IPv4 address of interface `ifname`. kNotFound naming the interface.
absl::StatusOr<std::string> InterfaceAddress(absl::string_view ifname);

// What a member of a job on `store` binds to: GLOO_SOCKET_IFNAME's address if
// set, else LocalAddressToward() the store (an etcd store: its first endpoint
// that has a route); "127.0.0.1" for an in-memory store. Errors name the
// store and the cause.
absl::StatusOr<std::string> LocalAddressFor(const ControlStore& store);

}  // namespace malle::comm::internal

#endif  // MALLE_COMM_INTERNAL_LOCAL_ADDRESS_H_
