// ControlStore: the key-value store that elastic groups agree through.
//
// A thin, Status-returning adapter over a c10d::Store, the store interface.
// Backends: c10d's TCPStore (the default: one server, hosted by a process that
// outlives the ranks, never by rank 0), an etcd cluster (replicated: it
// survives the loss of a minority of its members; internal/etcd_store.h), and
// c10d's HashStore in single-process tests. Every backend is a c10d::Store, so
// the Gloo rendezvous of each generation runs on whichever one is in use.
// Open() takes the address: "host:port" or "etcd://h1:p1,h2:p2,h3:p3[/ns]".
//
//   ASSIGN_OR_RETURN(auto server, ControlStore::Host("127.0.0.1", /*port=*/0));
//   // in a rank process:
//   ASSIGN_OR_RETURN(auto store, ControlStore::Connect("127.0.0.1", port, absl::Seconds(10)));
//   auto job = store->WithPrefix("malle/job/mnist/");
//   ASSIGN_OR_RETURN(std::string v, job->CreateIfAbsent("gen/1/record", proposal));
//
// Every operation blocks for at most the timeout it is given (or the timeout
// the store was opened with) and returns kUnavailable when the server cannot be
// reached and kDeadlineExceeded when a key did not appear in time. A client of
// a TCPStore server replaces a lost connection by itself: while the server is
// unreachable operations fail at once (kUnavailable), and the first one after
// it is back reconnects (its contents are whatever the server kept: a server
// that restarted has lost them). An etcd client moves to the next member.
//
// Thread-safety: a ControlStore may be used from several threads, but c10d's
// TCPStore client serialises operations on one connection, so a thread that
// blocks in Wait() delays the others. Threads that must not be delayed (the
// heartbeat watchdog, a group build) use their own connection from Clone().
#ifndef MALLE_COMM_CONTROL_STORE_H_
#define MALLE_COMM_CONTROL_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "c10/util/intrusive_ptr.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace malle::comm {

class ControlStore {
 public:
  // Starts a TCPStore server listening on host:port (port 0 picks a free
  // ephemeral port; the default host is loopback only) and returns a client
  // connected to it. The server lives as long as any handle derived from the
  // returned one. Errors: kInvalidArgument (bad host/port), kUnavailable.
  static absl::StatusOr<std::shared_ptr<ControlStore>> Host(absl::string_view host = "127.0.0.1",
                                                            int port = 0,
                                                            absl::Duration timeout = absl::Seconds(30));
  // Connects to a running server, retrying until `timeout`.
  // Errors: kInvalidArgument, kUnavailable / kDeadlineExceeded (unreachable).
  // Connect(host, port) is Open(host + ":" + port): a caller that splits an
  // address at its last colon (as ranks do with MALLE_STORE) reaches an etcd
  // cluster too.
  static absl::StatusOr<std::shared_ptr<ControlStore>> Connect(absl::string_view host, int port,
                                                               absl::Duration timeout);
  // "host:port": a TCPStore server (Connect). "etcd://h1:p1,h2:p2[/ns]": an
  // etcd v3 cluster (keys under ns, default "malle/"); requests go to the
  // next member when one fails, until `timeout`. Errors: kInvalidArgument (a
  // malformed address), kUnavailable (nothing answered in time).
  static absl::StatusOr<std::shared_ptr<ControlStore>> Open(absl::string_view address,
                                                            absl::Duration timeout);
  // A process-local store (c10d HashStore), for tests with ranks as threads.
  static std::shared_ptr<ControlStore> InMemory();

  ~ControlStore();
  ControlStore(const ControlStore&) = delete;
  ControlStore& operator=(const ControlStore&) = delete;

  const std::string& host() const { return host_; }
  int port() const { return port_; }  // 0 for an in-memory or etcd store
  // What Open() takes to reach this store ("" for an in-memory one).
  std::string address() const;
  const std::string& prefix() const { return prefix_; }
  absl::Duration timeout() const { return timeout_; }

  // A handle whose keys all live under prefix()+`prefix`, sharing this
  // handle's connection.
  std::shared_ptr<ControlStore> WithPrefix(absl::string_view prefix) const;
  // A handle with the same prefix over a new connection.
  absl::StatusOr<std::shared_ptr<ControlStore>> Clone() const;
  // Clone() whose every operation returns within `op_timeout` (kUnavailable
  // after it). A TCP connection to a host that went silent (a network
  // partition: no reset, no error) otherwise blocks until the kernel gives
  // up on it, many minutes later. An operation that ran out of time is left
  // to finish on a helper thread; until it does, the next ones fail at once.
  // For a thread that must keep its own pace (the heartbeat watchdog).
  absl::StatusOr<std::shared_ptr<ControlStore>> CloneBounded(absl::Duration op_timeout) const;

  absl::Status Set(absl::string_view key, absl::string_view value);
  // Waits up to `timeout` for the key, then returns its value.
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout);
  // The value, or nullopt if the key does not exist (does not wait).
  absl::StatusOr<std::optional<std::string>> TryGet(absl::string_view key);
  // Atomically adds `delta` to the integer at `key` (created as 0) and returns
  // the new value. Add(key, 0) reads a counter without waiting.
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);
  // Atomically stores `value` if `key` does not exist. Returns the value the
  // key holds afterwards: `value` if this call created it, the existing value
  // otherwise. This is the agreement primitive: the first writer wins.
  absl::StatusOr<std::string> CreateIfAbsent(absl::string_view key, absl::string_view value);
  absl::StatusOr<bool> Exists(absl::string_view key);
  // Waits until all keys exist (kDeadlineExceeded after `timeout`).
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout);
  // Values of keys that must all exist.
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys);
  absl::StatusOr<bool> Delete(absl::string_view key);

  // The underlying c10d store (with this handle's prefix), for building
  // process groups. Part of the adapter layer; not for application code.
  c10::intrusive_ptr<c10d::Store> c10d_store() const;

 private:
  struct Server;
  ControlStore(c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<Server> server,
               std::string host, int port, std::string prefix, absl::Duration timeout);

  c10::intrusive_ptr<c10d::Store> store_;  // prefixed view (or root)
  std::shared_ptr<Server> server_;         // keeps a hosted server alive
  std::string host_;
  int port_;
  std::string prefix_;
  absl::Duration timeout_;
};

// Status payload naming the Python exception class for an error (read by the
// binding's translator): control-store failures carry "StoreError".
inline constexpr char kErrorClassPayload[] = "malletrain/error_class";

// How many times a connection to a TCPStore server was replaced after it was
// lost, in this process (the metrics export it).
int64_t ControlStoreReconnects();

// Key of job `job_id` inside a deployment's store: "malle/job/<id>/".
std::string JobPrefix(absl::string_view job_id);

}  // namespace malle::comm

#endif  // MALLE_COMM_CONTROL_STORE_H_
