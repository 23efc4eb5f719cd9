#include "libmalle/control/service/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libmalle/base/log.h"

namespace malle::control {
namespace {

// Label values are escaped as the format requires (\\, \", \n).
std::string Escape(absl::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.17g", v);
}

void SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

void MetricsText::Sample(absl::string_view name, absl::string_view help, absl::string_view type, double value,
                         const MetricLabels& labels, absl::string_view suffix) {
  if (name != last_name_) {
    absl::StrAppend(&text_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
    last_name_ = std::string(name);
  }
  absl::StrAppend(&text_, name, suffix);
  if (!labels.empty()) {
    text_ += "{";
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&text_, i ? "," : "", labels[i].first, "=\"", Escape(labels[i].second), "\"");
    }
    text_ += "}";
  }
  absl::StrAppend(&text_, " ", Number(value), "\n");
}

void MetricsText::Counter(absl::string_view name, absl::string_view help, double value,
                          const MetricLabels& labels) {
  Sample(name, help, "counter", value, labels);
}

void MetricsText::Gauge(absl::string_view name, absl::string_view help, double value, const MetricLabels& labels) {
  Sample(name, help, "gauge", value, labels);
}

void MetricsText::Summary(absl::string_view name, absl::string_view help, std::vector<double> values,
                          double sum, double count) {
  std::sort(values.begin(), values.end());
  for (double q : {0.5, 0.9, 0.99}) {
    double v = std::nan("");
    if (!values.empty()) {
      v = values[std::min(values.size() - 1, static_cast<size_t>(q * static_cast<double>(values.size())))];
    }
    Sample(name, help, "summary", v, {{"quantile", absl::StrCat(q)}});
  }
  Sample(name, help, "summary", sum, {}, "_sum");
  Sample(name, help, "summary", count, {}, "_count");
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(absl::string_view host, int port,
                                                                       std::function<std::string()> render) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string h(host == "localhost" ? "127.0.0.1" : host);
  if (port < 0 || port > 65535 || ::inet_pton(AF_INET, h.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address must be an IPv4 HOST:PORT, got '", host, ":", port, "'"));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket(): ", std::strerror(errno)));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 16) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("metrics endpoint cannot listen on ", h, ":", port, ": ", error));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(fd, ntohs(addr.sin_port), std::move(render)));
}

MetricsEndpoint::MetricsEndpoint(int fd, int port, std::function<std::string()> render)
    : fd_(fd), port_(port), render_(std::move(render)) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  stop_.store(true);
  thread_.join();
  ::close(fd_);
}

void MetricsEndpoint::Serve() {
  while (!stop_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;  // wakes every 100 ms to see stop_
    const int client = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    Answer(client);
    ::close(client);
  }
}

void MetricsEndpoint::Answer(int client) {
  // The request head, until the blank line, at most 8 KiB, at most 2 s.
  std::string request;
  char buf[1024];
  while (request.size() < 8192 && !absl::StrContains(request, "\r\n\r\n") && !absl::StrContains(request, "\n\n")) {
    pollfd p{client, POLLIN, 0};
    if (::poll(&p, 1, 2000) <= 0) return;
    const ssize_t n = ::recv(client, buf, sizeof(buf), 0);
    if (n <= 0) break;
    request.append(buf, static_cast<size_t>(n));
  }
  if (absl::StartsWith(request, "GET /metrics ") || absl::StartsWith(request, "GET /metrics?")) {
    const std::string body = render_();
    SendAll(client, absl::StrCat("HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n",
                                 "Content-Length: ", body.size(), "\r\n\r\n", body));
  } else {
    SendAll(client, "HTTP/1.0 404 Not Found\r\nContent-Length: 25\r\n\r\nonly GET /metrics is here");
  }
}

}  // namespace malle::control
