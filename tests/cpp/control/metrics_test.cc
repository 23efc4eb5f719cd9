#include "libmalle/control/service/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::control {
namespace {

using ::malle::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(MetricsTextTest, WritesTheTextFormatWithEscapedLabels) {
  MetricsText m;
  m.Counter("malle_x_total", "Things.", 3, {{"kind", "a\"b\\c\nd"}});
  m.Counter("malle_x_total", "Things.", 4, {{"kind", "plain"}});
  m.Gauge("malle_y", "A level.", 0.5);
  m.Summary("malle_z_seconds", "Latency.", {3, 1, 2}, 6, 3);
  EXPECT_EQ(m.text(),
            "# HELP malle_x_total Things.\n# TYPE malle_x_total counter\n"
            "malle_x_total{kind=\"a\\\"b\\\\c\\nd\"} 3\nmalle_x_total{kind=\"plain\"} 4\n"
            "# HELP malle_y A level.\n# TYPE malle_y gauge\nmalle_y 0.5\n"
            "# HELP malle_z_seconds Latency.\n# TYPE malle_z_seconds summary\n"
            "malle_z_seconds{quantile=\"0.5\"} 2\nmalle_z_seconds{quantile=\"0.9\"} 3\n"
            "malle_z_seconds{quantile=\"0.99\"} 3\nmalle_z_seconds_sum 6\nmalle_z_seconds_count 3\n");
}

std::string Get(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  ::send(fd, request.data(), request.size(), 0);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

TEST(MetricsEndpointTest, ServesMetricsOnLoopbackAndNothingElse) {
  std::atomic<int> scrapes{0};
  ASSERT_OK_AND_ASSIGN(auto endpoint, MetricsEndpoint::Start("127.0.0.1", 0, [&] {
                         ++scrapes;
                         return std::string("malle_up 1\n");
                       }));
  ASSERT_GT(endpoint->port(), 0);
  const std::string ok = Get(endpoint->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(ok, StartsWith("HTTP/1.0 200 OK\r\n"));
  EXPECT_THAT(ok, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(ok, HasSubstr("\r\n\r\nmalle_up 1\n"));
  EXPECT_THAT(Get(endpoint->port(), "GET / HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.0 404"));
  EXPECT_EQ(scrapes.load(), 1);
  EXPECT_THAT(MetricsEndpoint::Start("example.org", 0, [] { return std::string(); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("IPv4")));
}

}  // namespace
}  // namespace malle::control
