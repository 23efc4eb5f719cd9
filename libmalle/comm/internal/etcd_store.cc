// The etcd backend of the control store (etcd_store.h): the only translation
// unit that includes libcurl. It throws what c10d stores throw (c10d's
// callers, and ControlStore's Guard, expect exceptions from a c10d::Store).
#include "libmalle/comm/internal/etcd_store.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace malle::comm::internal {
namespace {

using Json = nlohmann::json;

std::string B64(absl::string_view s) { return absl::Base64Escape(s); }

std::string Unb64(const Json& v) {
  std::string out;
  if (v.is_string()) absl::Base64Unescape(v.get<std::string>(), &out);
  return out;
}

int64_t Int(const Json& j, const char* key) {  // proto3 JSON: int64 as a string, 0 omitted
  auto it = j.find(key);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  int64_t v = 0;
  if (it->is_string()) (void)absl::SimpleAtoi(it->get<std::string>(), &v);
  return v;
}

// One failed attempt: worth trying the next member (true), or final (false).
struct Attempt {
  bool ok = false;
  bool retry = false;
  std::string error;
  Json body;
};

size_t Collect(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

std::once_flag curl_once;

class EtcdStore final : public c10d::Store {
 public:
  EtcdStore(EtcdAddress address, std::chrono::milliseconds timeout)
      : address_(std::move(address)) {
    std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    curl_ = curl_easy_init();
    timeout_ = timeout;
  }
  ~EtcdStore() override {
    if (curl_ != nullptr) curl_easy_cleanup(curl_);
  }

  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<EtcdStore>(address_, timeout_);
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Call("/v3/kv/put", {{"key", B64(Key(key))}, {"value", B64(Text(value))}});
  }

  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    const std::string k = B64(Key(key));
    Json compare = expected.empty()
                       ? Json{{"key", k}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}}
                       : Json{{"key", k}, {"target", "VALUE"}, {"result", "EQUAL"}, {"value", B64(Text(expected))}};
    Json r = Call("/v3/kv/txn", {{"compare", Json::array({compare})},
                                 {"success", Json::array({{{"request_put", {{"key", k}, {"value", B64(Text(desired))}}}}})},
                                 {"failure", Json::array({{{"request_range", {{"key", k}}}}})}});
    if (r.value("succeeded", false)) return desired;
    std::optional<std::string> current = FirstValue(r);
    // c10d's contract: a missing key with a non-empty `expected` returns `expected`.
    if (!current) return expected;
    return Bytes(*current);
  }

  std::vector<uint8_t> get(const std::string& key) override {
    wait({key}, timeout_);
    std::optional<std::string> v = Range(Key(key));
    if (!v) throw std::runtime_error(absl::StrCat("etcd: key '", key, "' vanished after it appeared"));
    return Bytes(*v);
  }

  int64_t add(const std::string& key, int64_t value) override {
    const std::string k = Key(key);
    // Optimistic: read the counter, write it back if nobody else did meanwhile.
    for (;;) {
      Json r = Call("/v3/kv/range", {{"key", B64(k)}});
      int64_t current = 0, mod = 0;
      bool exists = false;
      if (auto kvs = r.find("kvs"); kvs != r.end() && kvs->is_array() && !kvs->empty()) {
        exists = true;
        mod = Int((*kvs)[0], "mod_revision");
        const std::string text = Unb64((*kvs)[0]["value"]);
        if (!absl::SimpleAtoi(text, &current)) {
          throw std::runtime_error(absl::StrCat("etcd: add('", key, "'): not an integer: '", text, "'"));
        }
      }
      if (value == 0 && exists) return current;
      const int64_t next = current + value;
      Json compare = exists ? Json{{"key", B64(k)}, {"target", "MOD"}, {"result", "EQUAL"},
                                   {"mod_revision", absl::StrCat(mod)}}
                            : Json{{"key", B64(k)}, {"target", "CREATE"}, {"result", "EQUAL"},
                                   {"create_revision", "0"}};
      Json t = Call("/v3/kv/txn",
                    {{"compare", Json::array({compare})},
                     {"success", Json::array({{{"request_put", {{"key", B64(k)}, {"value", B64(absl::StrCat(next))}}}}})}});
      if (t.value("succeeded", false)) return next;
    }
  }

  bool deleteKey(const std::string& key) override {
    Json r = Call("/v3/kv/deleterange", {{"key", B64(Key(key))}});
    return Int(r, "deleted") > 0;
  }

  bool check(const std::vector<std::string>& keys) override {
    for (const std::string& key : keys) {
      Json r = Call("/v3/kv/range", {{"key", B64(Key(key))}, {"count_only", true}});
      if (Int(r, "count") == 0) return false;
    }
    return true;
  }

  int64_t getNumKeys() override {
    // Every key under the namespace: [ns, ns with its last byte + 1).
    std::string end = address_.ns;
    end.back() = static_cast<char>(end.back() + 1);
    Json r = Call("/v3/kv/range", {{"key", B64(address_.ns)}, {"range_end", B64(end)}, {"count_only", true}});
    return Int(r, "count");
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
    absl::Duration pause = absl::Milliseconds(2);
    for (;;) {
      if (check(keys)) return;
      if (absl::Now() >= deadline) {
        C10_THROW_ERROR(DistStoreError, absl::StrCat("etcd: wait timeout after ", timeout.count(), " ms for '",
                                               keys.empty() ? "" : keys.front(), "'"));
      }
      absl::SleepFor(std::min(pause, deadline - absl::Now()));
      pause = std::min(pause * 2, absl::Milliseconds(50));
    }
  }

  // One request to prove a member answers.
  void Ping() { Call("/v3/kv/range", {{"key", B64(Key("ping"))}, {"count_only", true}}); }

 private:
  static std::string Text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
  static std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
  std::string Key(absl::string_view key) const { return absl::StrCat(address_.ns, key); }

  std::optional<std::string> Range(const std::string& full_key) {
    Json r = Call("/v3/kv/range", {{"key", B64(full_key)}});
    return FirstValue(r);
  }

  static std::optional<std::string> FirstValue(const Json& r) {
    const Json* kvs = nullptr;
    if (auto it = r.find("kvs"); it != r.end()) kvs = &*it;
    if (auto rs = r.find("responses"); kvs == nullptr && rs != r.end() && rs->is_array() && !rs->empty()) {
      const Json& range = (*rs)[0]["response_range"];
      if (auto it = range.find("kvs"); it != range.end()) kvs = &*it;
    }
    if (kvs == nullptr || !kvs->is_array() || kvs->empty()) return std::nullopt;
    return Unb64((*kvs)[0]["value"]);
  }

  // POSTs `request` to the current member; on a failure that another member
  // may not have, moves to the next one, until the store's timeout.
  Json Call(const char* path, const Json& request) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string body = request.dump();
    const absl::Time deadline = absl::Now() + absl::FromChrono(timeout_);
    std::string last;
    for (int attempt = 0;; ++attempt) {
      const std::string& endpoint = address_.endpoints[current_ % address_.endpoints.size()];
      Attempt a = Post(endpoint, path, body, deadline);
      if (a.ok) return std::move(a.body);
      last = absl::StrCat(endpoint, ": ", a.error);
      if (!a.retry || absl::Now() >= deadline) break;
      ++current_;  // the next member
      if (attempt + 1 >= static_cast<int>(address_.endpoints.size())) {
        absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
      }
    }
    C10_THROW_ERROR(DistNetworkError, absl::StrCat("etcd ", path, " unavailable (", last, ")"));
  }

  Attempt Post(const std::string& endpoint, const char* path, const std::string& body, absl::Time deadline) {
    Attempt a;
    if (curl_ == nullptr) {
      a.error = "curl_easy_init failed";
      return a;
    }
    const std::string url = absl::StrCat("http://", endpoint, path);
    std::string response;
    // One request at most 2 s (a stopped member must not eat the whole budget).
    const long left_ms = static_cast<long>(std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
    curl_easy_reset(curl_);
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_POST, 1L);
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, &Collect);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &response);
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, std::min(left_ms, 2000L));
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS, std::min(left_ms, 500L));
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl_, CURLOPT_PROXY, "");  // never through a proxy
    struct curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers);
    const CURLcode rc = curl_easy_perform(curl_);
    long status = 0;
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    if (rc != CURLE_OK) {
      a.retry = true;
      a.error = curl_easy_strerror(rc);
      return a;
    }
    Json parsed = Json::parse(response, nullptr, /*allow_exceptions=*/false);
    if (status != 200 || parsed.is_discarded() || parsed.contains("error")) {
      a.error = absl::StrCat("HTTP ", status, ": ", response.substr(0, 200));
      // 5xx and etcd's own transient errors (no leader, leader changed, timed
      // out, too many requests) are worth another member; a 4xx is our bug.
      a.retry = status >= 500 || status == 429 || absl::StrContains(response, "leader") ||
                absl::StrContains(response, "timed out") || absl::StrContains(response, "unavailable");
      return a;
    }
    a.ok = true;
    a.body = std::move(parsed);
    return a;
  }

  const EtcdAddress address_;
  std::mutex mu_;
  CURL* curl_ = nullptr;
  size_t current_ = 0;
};

}  // namespace

absl::StatusOr<EtcdAddress> ParseEtcdAddress(absl::string_view address) {
  constexpr absl::string_view kScheme = "etcd://";
  if (!absl::StartsWith(address, kScheme)) {
    return absl::InvalidArgumentError(absl::StrCat("etcd address must start with etcd://, got '", address, "'"));
  }
  absl::string_view rest = address.substr(kScheme.size());
  EtcdAddress out;
  if (const size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    absl::string_view ns = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (!ns.empty()) out.ns = absl::StrCat(absl::StripSuffix(ns, "/"), "/");
  }
  for (absl::string_view ep : absl::StrSplit(rest, ',')) {
    const size_t colon = ep.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 || !absl::SimpleAtoi(ep.substr(colon + 1), &port) ||
        port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd address '", address, "': endpoint '", ep, "' is not host:port"));
    }
    out.endpoints.emplace_back(ep);
  }
  if (out.endpoints.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd address '", address, "' names no endpoint"));
  }
  return out;
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> MakeEtcdStore(const EtcdAddress& address,
                                                              absl::Duration timeout) {
  auto store = c10::make_intrusive<EtcdStore>(
      address, std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout))));
  try {
    store->Ping();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("control store ", absl::StrJoin(address.endpoints, ","),
                                               ": no etcd member answered: ", e.what()));
  }
  return c10::intrusive_ptr<c10d::Store>(std::move(store));
}

}  // namespace malle::comm::internal
