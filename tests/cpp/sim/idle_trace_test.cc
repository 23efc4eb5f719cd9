#include "libmalle/sim/idle_trace.h"

#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::sim {
namespace {

using ::malle::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kTrace[] =
    "# a comment\n"
    "time,node,idle\n"
    "100,a,0\n"
    "100,b,1\n"
    "100,c,0\r\n"
    "\n"
    "160,a,1\n"
    "160,b,1\n"   // repeats b's state
    "200,b,0\n"
    "250,d,1\n";  // a node seen first later

struct Ev {
  int64_t t;
  std::string node;
  bool idle;
  bool operator==(const Ev& o) const { return t == o.t && node == o.node && idle == o.idle; }
};
std::ostream& operator<<(std::ostream& os, const Ev& e) {
  return os << e.t << ":" << e.node << "=" << e.idle;
}
std::vector<Ev> Events(const IdleTrace& t) {
  std::vector<Ev> out;
  for (const IdleEvent& e : t.events) {
    out.push_back({absl::ToUnixSeconds(e.time), t.nodes[e.node], e.idle});
  }
  return out;
}

TEST(IdleTraceTest, ParsesStateChangesOnly) {
  ASSERT_OK_AND_ASSIGN(IdleTrace t, ParseIdleTrace(kTrace, "t.csv"));
  EXPECT_THAT(t.nodes, ElementsAre("a", "b", "c", "d"));
  EXPECT_THAT(Events(t), ElementsAre(Ev{100, "b", true}, Ev{160, "a", true}, Ev{200, "b", false},
                                     Ev{250, "d", true}));
  EXPECT_EQ(t.rows, 7);
  EXPECT_EQ(t.redundant_rows, 1);
  EXPECT_EQ(absl::ToUnixSeconds(t.start), 100);
  EXPECT_EQ(absl::ToUnixSeconds(t.end), 250);
  EXPECT_TRUE(t.rejected.empty());
}

TEST(IdleTraceTest, BadRowsAreListedLenientlyAndFailStrictly) {
  const std::string text =
      "time,node,idle\n"
      "10,a,1\n"
      "x1,a,0\n"         // line 3
      "11,,1\n"          // line 4
      "12,a,2\n"         // line 5
      "13,a\n"           // line 6
      "9,b,1\n"          // line 7: goes back in time
      "14,a,0,extra\n"   // line 8
      "15,a,0\n";
  ASSERT_OK_AND_ASSIGN(IdleTrace t, ParseIdleTrace(text, "bad.csv"));
  ASSERT_EQ(t.rejected.size(), 6u);
  const int lines[] = {3, 4, 5, 6, 7, 8};
  const char* words[] = {"time: 'x1'", "node: empty", "idle: '2' is not 0 or 1",
                         "expected 3 columns", "earlier than the previous row's 10",
                         "expected 3 columns (time,node,idle), got 4"};
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(t.rejected[k].file, "bad.csv");
    EXPECT_EQ(t.rejected[k].line, lines[k]);
    EXPECT_THAT(t.rejected[k].message, HasSubstr(words[k]));
  }
  EXPECT_THAT(Events(t), ElementsAre(Ev{10, "a", true}, Ev{15, "a", false}));
  IdleTraceOptions strict;
  strict.strict = true;
  EXPECT_THAT(ParseIdleTrace(text, "bad.csv", strict).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad.csv:3: time: 'x1'")));
}

TEST(IdleTraceTest, WrongOrMissingHeaderIsAnError) {
  EXPECT_THAT(ParseIdleTrace("t,node,idle\n1,a,1\n", "h.csv").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("h.csv:1: expected the header")));
  EXPECT_THAT(ParseIdleTrace("# only comments\n", "e.csv").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no header")));
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/idle_trace_test_", getpid(), "_", name);
}

TEST(IdleTraceTest, GzipReadsLikePlainAndCorruptionIsDataLoss) {
  const std::string plain = TempPath("t.csv");
  const std::string gz = TempPath("t.csv.gz");
  {
    std::ofstream(plain) << kTrace;
    gzFile f = gzopen(gz.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, kTrace, sizeof(kTrace) - 1), static_cast<int>(sizeof(kTrace) - 1));
    gzclose(f);
  }
  ASSERT_OK_AND_ASSIGN(IdleTrace a, LoadIdleTrace(plain));
  ASSERT_OK_AND_ASSIGN(IdleTrace b, LoadIdleTrace(gz));
  EXPECT_EQ(Events(a), Events(b));
  EXPECT_EQ(b.rejected.size(), 0u);
  // Truncate the compressed file: the stream ends early.
  {
    std::ifstream in(gz, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(gz, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  }
  EXPECT_THAT(LoadIdleTrace(gz).status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(gz)));
  std::remove(plain.c_str());
  std::remove(gz.c_str());
  EXPECT_THAT(LoadIdleTrace(TempPath("missing.csv")).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.csv")));
}

TEST(IdleTraceRealData, Summit) {
  const std::string path = absl::StrCat(MALLE_SHARED_DATA_DIR, "/summit-idle-2021-02.csv.gz");
  if (access(path.c_str(), R_OK) != 0) GTEST_SKIP() << path << " is absent";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(IdleTrace t, LoadIdleTrace(path));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("loaded %s: %lld rows, %zu nodes, %zu state changes, %lld redundant, %.2f s\n",
              path.c_str(), t.rows, t.nodes.size(), t.events.size(), t.redundant_rows, s);
  EXPECT_EQ(t.rows, 851590);
  EXPECT_EQ(t.nodes.size(), 4734u);
  EXPECT_TRUE(t.rejected.empty());
  // 2021-02-10 .. 2021-02-24 (../shared/data/README.md).
  EXPECT_EQ(absl::FormatTime("%Y-%m-%d", t.start, absl::UTCTimeZone()), "2021-02-10");
  EXPECT_EQ(absl::FormatTime("%Y-%m-%d", t.end, absl::UTCTimeZone()), "2021-02-24");
}

}  // namespace
}  // namespace malle::sim
