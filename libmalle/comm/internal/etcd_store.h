// An etcd v3 cluster as a c10d::Store: the replicated backend of ControlStore
// (ControlStore::Open("etcd://host:port,host:port,...")). Being a c10d::Store,
// it serves both ControlStore's operations and the Gloo rendezvous of every
// generation's process group, so nothing above comm/ knows which backend runs.
//
// It speaks etcd's v3 JSON gateway over HTTP (libcurl; loopback or a
// management network, no TLS). Every key lives under a namespace prefix
// ("malle/" unless the address says "etcd://.../<ns>"). Agreement is etcd's:
// compareSet and add are transactions on create/mod revisions, so a value is
// decided once however many members answer. A request that fails (connection
// refused, timeout, "no leader", "leader changed") is retried on the next
// endpoint until the store's timeout: a member killed, or a leader election,
// is a pause of a second or two, not an error.
//
// Thread-safety: one EtcdStore serialises its requests (one HTTP connection);
// clone() gives an independent one, as TCPStore's clone does.
#ifndef MALLE_COMM_INTERNAL_ETCD_STORE_H_
#define MALLE_COMM_INTERNAL_ETCD_STORE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "c10/util/intrusive_ptr.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace malle::comm::internal {

struct EtcdAddress {
  std::vector<std::string> endpoints;  // "host:port"
  std::string ns = "malle/";           // key prefix, ends with '/'
};

// "etcd://h1:p1,h2:p2[/ns]". kInvalidArgument naming what is wrong.
absl::StatusOr<EtcdAddress> ParseEtcdAddress(absl::string_view address);

// Connects (one request to prove a member answers, retried until `timeout`).
// Errors: kUnavailable (no member answered in time).
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> MakeEtcdStore(const EtcdAddress& address,
                                                              absl::Duration timeout);

}  // namespace malle::comm::internal

#endif  // MALLE_COMM_INTERNAL_ETCD_STORE_H_
