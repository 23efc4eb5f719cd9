// The only translation unit that calls c10d's Store API (TCPStore, HashStore,
// PrefixStore). c10d throws; everything here returns absl::Status.
#include "libmalle/comm/control_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <atomic>
#include <exception>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/comm/internal/etcd_store.h"

namespace malle::comm {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

std::vector<uint8_t> Bytes(absl::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string Text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// Turns an exception thrown by c10d into a Status. c10d reports timeouts and
// lost connections with several exception types whose names moved between
// releases, so the classification uses the elapsed time and the message.
absl::Status FromException(const std::exception& e, absl::string_view op, absl::string_view key,
                           absl::Time started, absl::Duration timeout) {
  std::string what = e.what();
  // c10 errors carry a multi-line C++ backtrace; keep the first line.
  if (size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
  const std::string message = absl::StrCat("control store ", op, "('", key, "'): ", what);
  absl::Status status;
  const std::string lower = absl::AsciiStrToLower(what);
  const bool timed_out = absl::StrContains(lower, "timeout") || absl::StrContains(lower, "timed out") ||
                         absl::Now() - started >= timeout;
  status = timed_out ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
  // The Python binding raises malletrain.errors.StoreError for these.
  status.SetPayload(kErrorClassPayload, absl::Cord("StoreError"));
  return status;
}

template <typename F>
auto Guard(absl::string_view op, absl::string_view key, absl::Duration timeout, F&& f)
    -> absl::StatusOr<decltype(f())> {
  const absl::Time started = absl::Now();
  try {
    return f();
  } catch (const std::exception& e) {
    return FromException(e, op, key, started, timeout);
  }
}

absl::Status ValidateEndpoint(absl::string_view host, int port) {
  if (host.empty()) return absl::InvalidArgumentError("control store host must not be empty");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("control store port must be in [0, 65535], got ", port));
  }
  return absl::OkStatus();
}

absl::Status ValidateTimeout(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration() || timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("control store timeout must be positive and finite, got ",
                     absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

// Binds host:port (IPv4) and listens, so that the TCPStore server takes over a
// socket bound to exactly this address (loopback by default; c10d alone would
// bind every interface) and an ephemeral port is known without a race.
absl::StatusOr<int> ListenOn(absl::string_view host, int port, int* bound_port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string host_str(host == "localhost" ? "127.0.0.1" : host);
  if (::inet_pton(AF_INET, host_str.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("control store host must be an IPv4 address, got '", host, "'"));
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket(): ", std::strerror(errno)));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 1024) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("control store cannot listen on ", host, ":", port, ": ", error));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *bound_port = ntohs(addr.sin_port);
  return fd;
}

// Whether something accepts connections on host:port, within `timeout`. A
// plain non-blocking connect: c10d's client would retry a refused connection
// for its whole timeout, blocking the caller each time the server is still down.
bool Accepts(const std::string& host, int port, absl::Duration timeout) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) {
    return false;
  }
  bool ok = false;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int rc = ::connect(fd, found->ai_addr, found->ai_addrlen);
    if (rc == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1) {
        int error = 0;
        socklen_t len = sizeof(error);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
        ok = error == 0;
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return ok;
}

// A TCPStore client that replaces its connection after losing it. c10d's
// client does not reconnect: once its server restarted, or an operation ran
// out of time (its reply may still arrive and be taken for the next one's),
// the connection is useless. While the server is unreachable, operations fail
// at once (DistNetworkError, kUnavailable for ControlStore) instead of each
// waiting out the timeout, and a new connection is tried at most every
// `backoff` (100 ms, doubling to 2 s), each try bounded by 1 s. This is what
// lets a job train through a store outage at its current size: its per-step
// store reads fail fast and are skipped, and the next one after the outage
// reconnects.
class ReconnectingStore final : public c10d::Store {
 public:
  ReconnectingStore(std::string host, int port, std::chrono::milliseconds timeout,
                    c10::intrusive_ptr<c10d::Store> connected)
      : host_(std::move(host)), port_(port), inner_(std::move(connected)) {
    timeout_ = timeout;
  }

  c10::intrusive_ptr<c10d::Store> clone() override {
    auto inner = Acquire();
    try {
      return c10::make_intrusive<ReconnectingStore>(host_, port_, timeout_, inner->clone());
    } catch (const std::exception&) {
      MarkDown(inner);
      throw;
    }
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Do([&](c10d::Store& s) { s.set(key, value); return 0; });
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return Do([&](c10d::Store& s) { return s.compareSet(key, expected, desired); });
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return Do([&](c10d::Store& s) { return s.get(key); }, /*waits=*/true);
  }
  int64_t add(const std::string& key, int64_t value) override {
    return Do([&](c10d::Store& s) { return s.add(key, value); });
  }
  bool deleteKey(const std::string& key) override {
    return Do([&](c10d::Store& s) { return s.deleteKey(key); });
  }
  bool check(const std::vector<std::string>& keys) override {
    return Do([&](c10d::Store& s) { return s.check(keys); });
  }
  int64_t getNumKeys() override {
    return Do([&](c10d::Store& s) { return s.getNumKeys(); });
  }
  void wait(const std::vector<std::string>& keys) override {
    Do([&](c10d::Store& s) { s.wait(keys); return 0; }, /*waits=*/true);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    Do([&](c10d::Store& s) { s.wait(keys, timeout); return 0; }, /*waits=*/true);
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    return Do([&](c10d::Store& s) { return s.multiGet(keys); });
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override {
    Do([&](c10d::Store& s) { s.multiSet(keys, values); return 0; });
  }
  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    Do([&](c10d::Store& s) { s.append(key, value); return 0; });
  }
  bool hasExtendedApi() const override { return true; }

 private:
  template <typename F>
  auto Do(F f, bool waits = false) -> decltype(f(std::declval<c10d::Store&>())) {
    c10::intrusive_ptr<c10d::Store> inner = Acquire();
    try {
      return f(*inner);
    } catch (const std::exception& e) {
      // A wait that ran out of time on a live server is an answer, not a lost connection.
      const std::string what = absl::AsciiStrToLower(e.what());
      const bool timed_out = absl::StrContains(what, "timeout") || absl::StrContains(what, "timed out");
      if (!(waits && timed_out)) MarkDown(inner);
      throw;
    }
  }

  c10::intrusive_ptr<c10d::Store> Acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!down_) return inner_;
    const absl::Time now = absl::Now();
    if (now < retry_at_) {
      C10_THROW_ERROR(DistNetworkError, absl::StrCat("control store ", host_, ":", port_, " unreachable since ",
                                               absl::FormatTime("%H:%M:%E3S", down_since_, absl::LocalTimeZone()),
                                               "; next reconnect in ",
                                               absl::FormatDuration(absl::Trunc(retry_at_ - now, absl::Milliseconds(1)))));
    }
    if (!Accepts(host_, port_, absl::Milliseconds(300))) {
      retry_at_ = now + backoff_;
      backoff_ = std::min(backoff_ * 2, absl::Seconds(1));
      C10_THROW_ERROR(DistNetworkError, absl::StrCat("control store ", host_, ":", port_,
                                                     " unreachable (nothing accepts connections)"));
    }
    try {
      c10d::TCPStoreOptions opts;
      opts.port = static_cast<uint16_t>(port_);
      opts.isServer = false;
      opts.waitWorkers = false;
      opts.timeout = std::chrono::milliseconds(1000);
      auto fresh = c10::make_intrusive<c10d::TCPStore>(host_, opts);
      fresh->setTimeout(timeout_);
      inner_ = fresh;
      down_ = false;
      backoff_ = absl::Milliseconds(100);
      reconnects_.fetch_add(1);
      MALLE_LOG(WARNING) << "control store " << host_ << ":" << port_ << " reachable again after "
                         << absl::FormatDuration(absl::Trunc(absl::Now() - down_since_, absl::Milliseconds(1)));
      return inner_;
    } catch (const std::exception& e) {
      retry_at_ = absl::Now() + backoff_;
      backoff_ = std::min(backoff_ * 2, absl::Seconds(2));
      C10_THROW_ERROR(DistNetworkError, absl::StrCat("control store ", host_, ":", port_, " unreachable: ", e.what()));
    }
  }

  void MarkDown(const c10::intrusive_ptr<c10d::Store>& failed) {
    std::lock_guard<std::mutex> lock(mu_);
    if (down_ || failed.get() != inner_.get()) return;  // already replaced or known
    down_ = true;
    down_since_ = absl::Now();
    retry_at_ = down_since_;  // the next operation tries once at once
    MALLE_LOG(WARNING) << "control store " << host_ << ":" << port_ << " lost; reconnecting";
  }

  const std::string host_;
  const int port_;
  std::mutex mu_;
  c10::intrusive_ptr<c10d::Store> inner_;
  bool down_ = false;
  absl::Time down_since_;
  absl::Time retry_at_;
  absl::Duration backoff_ = absl::Milliseconds(100);
  static std::atomic<int64_t> reconnects_;

 public:
  static int64_t reconnects() { return reconnects_.load(); }
};

std::atomic<int64_t> ReconnectingStore::reconnects_{0};

// Every operation of an inner store, bounded in time: it runs on a helper
// thread and the caller waits at most `op_timeout`. A c10d TCPStore client
// blocks in recv() without a timeout of its own, so on a partitioned network
// (packets dropped, no reset) an operation would block until the kernel gives
// up on the connection. An operation that ran out of time keeps its thread
// and the inner store (shared ownership: nothing dangles) until it returns;
// meanwhile every call fails at once.
class BoundedStore final : public c10d::Store {
 public:
  BoundedStore(c10::intrusive_ptr<c10d::Store> inner, std::chrono::milliseconds op_timeout)
      : inner_(std::move(inner)), op_timeout_(op_timeout) {
    timeout_ = inner_->getTimeout();
  }

  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<BoundedStore>(Run([](c10d::Store& s) { return s.clone(); }), op_timeout_);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Run([key, value](c10d::Store& s) { s.set(key, value); return 0; });
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return Run([key, expected, desired](c10d::Store& s) { return s.compareSet(key, expected, desired); });
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return Run([key](c10d::Store& s) { return s.get(key); });
  }
  int64_t add(const std::string& key, int64_t value) override {
    return Run([key, value](c10d::Store& s) { return s.add(key, value); });
  }
  bool deleteKey(const std::string& key) override {
    return Run([key](c10d::Store& s) { return s.deleteKey(key); });
  }
  bool check(const std::vector<std::string>& keys) override {
    return Run([keys](c10d::Store& s) { return s.check(keys); });
  }
  int64_t getNumKeys() override {
    return Run([](c10d::Store& s) { return s.getNumKeys(); });
  }
  void wait(const std::vector<std::string>& keys) override {
    Run([keys](c10d::Store& s) { s.wait(keys); return 0; });
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    Run([keys, timeout](c10d::Store& s) { s.wait(keys, timeout); return 0; }, timeout);
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    return Run([keys](c10d::Store& s) { return s.multiGet(keys); });
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override {
    Run([keys, values](c10d::Store& s) { s.multiSet(keys, values); return 0; });
  }
  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    Run([key, value](c10d::Store& s) { s.append(key, value); return 0; });
  }
  bool hasExtendedApi() const override { return inner_->hasExtendedApi(); }

 private:
  struct Op {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };

  template <typename F>
  auto Run(F f, std::chrono::milliseconds extra = std::chrono::milliseconds(0))
      -> decltype(f(std::declval<c10d::Store&>())) {
    using R = decltype(f(std::declval<c10d::Store&>()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stuck_) {
        std::lock_guard<std::mutex> op_lock(stuck_->mu);
        if (!stuck_->done) {
          C10_THROW_ERROR(DistNetworkError,
                          absl::StrCat("control store: an operation is still unanswered after ",
                                       absl::FormatDuration(absl::Trunc(absl::Now() - stuck_since_,
                                                                        absl::Milliseconds(1))),
                                       " (network partition?)"));
        }
      }
      stuck_.reset();
    }
    struct Result {
      std::optional<R> value;
      std::exception_ptr error;
    };
    auto op = std::make_shared<Op>();
    auto result = std::make_shared<Result>();
    // The helper owns copies of everything it touches: the caller may be gone
    // when a timed-out operation finally returns, or even before the helper
    // starts (a loaded machine can delay a new thread past the timeout). So
    // every `f` captures its arguments by value: a reference to the caller's
    // key was read after the caller returned (a crash in PrefixStore::joinKey).
    std::thread([op, result, inner = inner_, f]() mutable {
      try {
        result->value.emplace(f(*inner));
      } catch (...) {
        result->error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(op->mu);
      op->done = true;
      op->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(op->mu);
    if (!op->cv.wait_for(lock, op_timeout_ + extra, [&] { return op->done; })) {
      lock.unlock();
      std::lock_guard<std::mutex> guard(mu_);
      stuck_ = op;
      stuck_since_ = absl::Now();
      C10_THROW_ERROR(DistNetworkError,
                      absl::StrCat("control store: no answer within ",
                                   absl::FormatDuration(absl::FromChrono(op_timeout_ + extra)),
                                   " (network partition?)"));
    }
    if (result->error) std::rethrow_exception(result->error);
    return std::move(*result->value);
  }

  const c10::intrusive_ptr<c10d::Store> inner_;
  const std::chrono::milliseconds op_timeout_;
  std::mutex mu_;
  std::shared_ptr<Op> stuck_;  // an operation that ran out of time, until it returns
  absl::Time stuck_since_;
};

}  // namespace

int64_t ControlStoreReconnects() { return ReconnectingStore::reconnects(); }

struct ControlStore::Server {
  c10::intrusive_ptr<c10d::Store> server;
};

ControlStore::ControlStore(c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<Server> server,
                           std::string host, int port, std::string prefix, absl::Duration timeout)
    : store_(std::move(store)),
      server_(std::move(server)),
      host_(std::move(host)),
      port_(port),
      prefix_(std::move(prefix)),
      timeout_(timeout) {}

ControlStore::~ControlStore() = default;

absl::StatusOr<std::shared_ptr<ControlStore>> ControlStore::Host(absl::string_view host, int port,
                                                                 absl::Duration timeout) {
  MALLE_RETURN_IF_ERROR(ValidateEndpoint(host, port));
  MALLE_RETURN_IF_ERROR(ValidateTimeout(timeout));
  int bound_port = 0;
  MALLE_ASSIGN_OR_RETURN(int fd, ListenOn(host, port, &bound_port));
  const std::string host_str(host);
  auto created = Guard("host", host_str, timeout, [&]() {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(bound_port);
    opts.isServer = true;
    opts.waitWorkers = false;
    opts.numWorkers = std::nullopt;
    opts.timeout = ToChrono(timeout);
    opts.masterListenFd = fd;
    opts.useLibUV = true;
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::TCPStore>(host_str, opts));
  });
  if (!created.ok()) {
    ::close(fd);
    return created.status();
  }
  auto server = std::make_shared<Server>();
  server->server = *created;
  return std::shared_ptr<ControlStore>(
      new ControlStore(*created, server, host_str, bound_port, "", timeout));
}

absl::StatusOr<std::shared_ptr<ControlStore>> ControlStore::Open(absl::string_view address,
                                                                 absl::Duration timeout) {
  MALLE_RETURN_IF_ERROR(ValidateTimeout(timeout));
  if (absl::StartsWith(address, "etcd://")) {
    MALLE_ASSIGN_OR_RETURN(internal::EtcdAddress etcd, internal::ParseEtcdAddress(address));
    MALLE_ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store, internal::MakeEtcdStore(etcd, timeout));
    return std::shared_ptr<ControlStore>(new ControlStore(store, nullptr, std::string(address), 0, "", timeout));
  }
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "control store address must be host:port or etcd://host:port,..., got '", address, "'"));
  }
  return Connect(address.substr(0, colon), port, timeout);
}

std::string ControlStore::address() const {
  if (absl::StartsWith(host_, "etcd://")) return host_;
  if (port_ == 0) return "";
  return absl::StrCat(host_, ":", port_);
}

absl::StatusOr<std::shared_ptr<ControlStore>> ControlStore::Connect(absl::string_view host, int port,
                                                                    absl::Duration timeout) {
  if (absl::StartsWith(host, "etcd://")) return Open(absl::StrCat(host, ":", port), timeout);
  MALLE_RETURN_IF_ERROR(ValidateEndpoint(host, port));
  MALLE_RETURN_IF_ERROR(ValidateTimeout(timeout));
  if (port == 0) return absl::InvalidArgumentError("control store port must not be 0 to connect");
  const std::string host_str(host);
  MALLE_ASSIGN_OR_RETURN(auto store, Guard("connect", absl::StrCat(host, ":", port), timeout, [&]() {
                           c10d::TCPStoreOptions opts;
                           opts.port = static_cast<uint16_t>(port);
                           opts.isServer = false;
                           opts.waitWorkers = false;
                           opts.timeout = ToChrono(timeout);
                           return c10::intrusive_ptr<c10d::Store>(
                               c10::make_intrusive<c10d::TCPStore>(host_str, opts));
                         }));
  auto reconnecting = c10::make_intrusive<ReconnectingStore>(host_str, port, ToChrono(timeout), store);
  return std::shared_ptr<ControlStore>(new ControlStore(reconnecting, nullptr, host_str, port, "", timeout));
}

std::shared_ptr<ControlStore> ControlStore::InMemory() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  return std::shared_ptr<ControlStore>(
      new ControlStore(store, nullptr, "", 0, "", absl::Seconds(30)));
}

std::shared_ptr<ControlStore> ControlStore::WithPrefix(absl::string_view prefix) const {
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), store_);
  return std::shared_ptr<ControlStore>(new ControlStore(
      prefixed, server_, host_, port_, absl::StrCat(prefix_, prefix), timeout_));
}

absl::StatusOr<std::shared_ptr<ControlStore>> ControlStore::Clone() const {
  MALLE_ASSIGN_OR_RETURN(auto cloned, Guard("clone", prefix_, timeout_, [&]() { return store_->clone(); }));
  return std::shared_ptr<ControlStore>(
      new ControlStore(cloned, server_, host_, port_, prefix_, timeout_));
}

absl::Status ControlStore::Set(absl::string_view key, absl::string_view value) {
  return Guard("set", key, timeout_, [&]() {
           store_->set(std::string(key), Bytes(value));
           return true;
         })
      .status();
}

absl::StatusOr<std::string> ControlStore::Get(absl::string_view key, absl::Duration timeout) {
  MALLE_RETURN_IF_ERROR(Wait({std::string(key)}, timeout));
  return Guard("get", key, timeout_, [&]() { return Text(store_->get(std::string(key))); });
}

absl::StatusOr<std::optional<std::string>> ControlStore::TryGet(absl::string_view key) {
  MALLE_ASSIGN_OR_RETURN(bool exists, Exists(key));
  if (!exists) return std::optional<std::string>();
  MALLE_ASSIGN_OR_RETURN(std::string value, Get(key, timeout_));
  return std::optional<std::string>(std::move(value));
}

absl::StatusOr<int64_t> ControlStore::Add(absl::string_view key, int64_t delta) {
  return Guard("add", key, timeout_, [&]() { return store_->add(std::string(key), delta); });
}

absl::StatusOr<std::string> ControlStore::CreateIfAbsent(absl::string_view key,
                                                         absl::string_view value) {
  if (value.empty()) {
    return absl::InvalidArgumentError("CreateIfAbsent: value must not be empty");
  }
  return Guard("compare_set", key, timeout_, [&]() {
    return Text(store_->compareSet(std::string(key), {}, Bytes(value)));
  });
}

absl::StatusOr<bool> ControlStore::Exists(absl::string_view key) {
  return Guard("check", key, timeout_, [&]() { return store_->check({std::string(key)}); });
}

absl::Status ControlStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  MALLE_RETURN_IF_ERROR(ValidateTimeout(timeout));
  const std::string what = keys.empty() ? std::string() : keys.front();
  return Guard("wait", what, timeout, [&]() {
           store_->wait(keys, ToChrono(timeout));
           return true;
         })
      .status();
}

absl::StatusOr<std::vector<std::string>> ControlStore::MultiGet(const std::vector<std::string>& keys) {
  const std::string what = keys.empty() ? std::string() : keys.front();
  return Guard("multi_get", what, timeout_, [&]() {
    std::vector<std::string> values;
    for (const auto& v : store_->multiGet(keys)) values.push_back(Text(v));
    return values;
  });
}

absl::StatusOr<bool> ControlStore::Delete(absl::string_view key) {
  return Guard("delete", key, timeout_, [&]() { return store_->deleteKey(std::string(key)); });
}

absl::StatusOr<std::shared_ptr<ControlStore>> ControlStore::CloneBounded(absl::Duration op_timeout) const {
  if (op_timeout <= absl::ZeroDuration() || op_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CloneBounded: op_timeout must be positive and finite, got ", absl::FormatDuration(op_timeout)));
  }
  MALLE_ASSIGN_OR_RETURN(std::shared_ptr<ControlStore> cloned, Clone());
  auto bounded = c10::make_intrusive<BoundedStore>(cloned->store_, ToChrono(op_timeout));
  return std::shared_ptr<ControlStore>(new ControlStore(bounded, server_, host_, port_, prefix_, timeout_));
}

c10::intrusive_ptr<c10d::Store> ControlStore::c10d_store() const { return store_; }

std::string JobPrefix(absl::string_view job_id) { return absl::StrCat("malle/job/", job_id, "/"); }

}  // namespace malle::comm
