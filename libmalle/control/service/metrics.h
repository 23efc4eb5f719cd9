// Prometheus metrics of the control-plane daemons (malle-allocator,
// malle-agent): a text-exposition builder and a small HTTP endpoint.
//
//   MetricsText m;
//   m.Counter("malle_allocator_decisions_total", "Decisions taken.", 12);
//   m.Gauge("malle_allocator_nodes", "Nodes by phase.", 3, {{"phase", "active"}});
//   MALLE_ASSIGN_OR_RETURN(auto endpoint,
//                          MetricsEndpoint::Start("127.0.0.1", 0, [&] { return Render(); }));
//   // GET http://127.0.0.1:<endpoint->port()>/metrics
//
// The endpoint binds the address it is given (loopback unless told
// otherwise; only IPv4 literals and "localhost"), answers GET /metrics with
// the text format 0.0.4, anything else with 404, one request per connection
// (HTTP/1.0). It is for a scraper on the management network, not for the
// internet: no TLS, no authentication, requests over 8 KiB refused.
//
// Thread-safety: MetricsText is a value (one thread). The endpoint runs one
// thread of its own that calls `render` for every scrape: render must be
// thread-safe. The destructor stops and joins it.
#ifndef MALLE_CONTROL_SERVICE_METRICS_H_
#define MALLE_CONTROL_SERVICE_METRICS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace malle::control {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Builds the text exposition format. HELP/TYPE are written once per name, at
// its first sample; samples of one name must be added together.
class MetricsText {
 public:
  void Counter(absl::string_view name, absl::string_view help, double value, const MetricLabels& labels = {});
  void Gauge(absl::string_view name, absl::string_view help, double value, const MetricLabels& labels = {});
  // A summary: quantiles of `values` (any order), plus _sum and _count.
  void Summary(absl::string_view name, absl::string_view help, std::vector<double> values, double sum,
               double count);
  const std::string& text() const { return text_; }

 private:
  void Sample(absl::string_view name, absl::string_view help, absl::string_view type, double value,
              const MetricLabels& labels, absl::string_view suffix = "");
  std::string text_;
  std::string last_name_;
};

class MetricsEndpoint {
 public:
  // Listens on host:port (port 0: an ephemeral one, see port()).
  // Errors: kInvalidArgument (host), kUnavailable (cannot bind).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(absl::string_view host, int port,
                                                                std::function<std::string()> render);
  ~MetricsEndpoint();
  int port() const { return port_; }

 private:
  MetricsEndpoint(int fd, int port, std::function<std::string()> render);
  void Serve();
  void Answer(int client);

  const int fd_;
  const int port_;
  std::function<std::string()> render_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace malle::control

#endif  // MALLE_CONTROL_SERVICE_METRICS_H_
