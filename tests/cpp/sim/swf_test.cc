#include "libmalle/sim/swf.h"

#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "libmalle/sim/engine.h"
#include "libmalle/sim/job_mix.h"

namespace malle::sim {
namespace {

using ::malle::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

struct Ev {
  double t;  // seconds after the log's UnixStartTime
  std::string node;
  bool idle;
  bool operator==(const Ev& o) const { return t == o.t && node == o.node && idle == o.idle; }
};
std::ostream& operator<<(std::ostream& os, const Ev& e) {
  return os << e.t << ":" << e.node << "=" << (e.idle ? "idle" : "busy");
}
std::vector<Ev> Events(const IdleTrace& t, int64_t origin = 0) {
  std::vector<Ev> out;
  for (const IdleEvent& e : t.events) {
    out.push_back(
        {absl::ToDoubleSeconds(e.time - absl::FromUnixSeconds(origin)), t.nodes[e.node], e.idle});
  }
  return out;
}

// A job line: number, submit, wait, run, allocated procs, status; the other
// fields unknown (-1), requested procs = allocated.
std::string Job(int id, double submit, double wait, double run, int procs, int status = 1) {
  return absl::StrCat(id, " ", submit, " ", wait, " ", run, " ", procs, " -1 -1 ", procs, " -1 -1 ",
                      status, " -1 -1 -1 -1 -1 -1 -1\n");
}

SwfTrace Replay(const std::string& text, const SwfReplayOptions& options = {}) {
  absl::StatusOr<SwfLog> log = ParseSwf(text, "t.swf");
  EXPECT_TRUE(log.ok()) << log.status();
  EXPECT_THAT(log->rejected, IsEmpty());
  absl::StatusOr<SwfTrace> t = SwfToIdleTrace(*log, options);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

TEST(SwfTest, ParsesHeaderAndFields) {
  const std::string text =
      "; Version: 2.2\n"
      ";   MaxNodes:  128 (the batch partition)\n"
      "; MaxProcs: 512\n"
      "; UnixStartTime: 1000000\n"
      "; Note: free text, even with a colon: ignored\n"
      "\n"
      "  1  0 10.5 100 64 -1 -1 64 3600 -1 1 7 1 -1 1 -1 -1 -1\r\n"
      "2\t5\t0\t50\t-1\t1.5\t-1\t32\t-1\t-1\t0\t7\t1\t-1\t1\t-1\t-1\t-1\n";
  ASSERT_OK_AND_ASSIGN(SwfLog log, ParseSwf(text, "h.swf"));
  EXPECT_EQ(log.header.max_nodes, 128);
  EXPECT_EQ(log.header.max_procs, 512);
  EXPECT_TRUE(log.header.has_unix_start_time);
  EXPECT_EQ(log.header.unix_start_time, 1000000);
  EXPECT_EQ(log.lines, 2);
  ASSERT_EQ(log.jobs.size(), 2u);
  EXPECT_EQ(log.jobs[0].line, 7);
  EXPECT_EQ(log.jobs[0].id, 1);
  EXPECT_EQ(log.jobs[0].wait, 10.5);
  EXPECT_EQ(log.jobs[0].run, 100);
  EXPECT_EQ(log.jobs[0].allocated_procs, 64);
  EXPECT_EQ(log.jobs[0].status, 1);
  EXPECT_EQ(log.jobs[1].line, 8);
  EXPECT_EQ(log.jobs[1].allocated_procs, -1);
  EXPECT_EQ(log.jobs[1].requested_procs, 32);
  EXPECT_EQ(log.jobs[1].status, 0);
}

TEST(SwfTest, BadLinesAreListedLenientlyAndFailStrictly) {
  const std::string text =
      absl::StrCat("; MaxNodes: 4\n",                                      // 1
                   Job(1, 0, 0, 10, 1),                                    // 2
                   "2 0 0 10 1 -1 -1 1 -1 -1 1 -1 -1 -1 -1 -1 -1\n",       // 3: 17 fields
                   "3 0 x 10 1 -1 -1 1 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n",    // 4
                   "4 0 -5 10 1 -1 -1 1 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n",   // 5
                   "5 0 0 10 1.5 -1 -1 1 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n",  // 6
                   "6 0 0 10 1 -1 -1 1 -1 -1 9 -1 -1 -1 -1 -1 -1 -1\n",    // 7
                   Job(1, 5, 0, 10, 1),                                    // 8: duplicate
                   "; MaxProcs: many\n",                                   // 9
                   "; MaxNodes: 8\n",                                      // 10: repeated
                   "-1 0 0 10 1 -1 -1 1 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n",   // 11
                   "7 0 0 nan 1 -1 -1 1 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n",   // 12
                   Job(8, 1, 0, 10, 1));                                   // 13
  ASSERT_OK_AND_ASSIGN(SwfLog log, ParseSwf(text, "bad.swf"));
  const std::vector<std::pair<int, std::string>> want = {
      {3, "expected 18 whitespace-separated fields, got 17"},
      {4, "field 3 (wait_time): 'x' is not a number"},
      {5, "field 3 (wait_time): -5 is negative; only -1 (unknown) is allowed"},
      {6, "field 5 (allocated_procs): '1.5' is not an integer"},
      {7, "field 11 (status): 9 is not a status"},
      {8, "field 1 (job_number): 1 duplicates the job on line 2"},
      {9, "MaxProcs: 'many' is not an integer"},
      {10, "MaxNodes: given again (first on line 1)"},
      {11, "field 1 (job_number): -1: a job needs a number"},
      {12, "field 4 (run_time): 'nan' is not a number"},
  };
  ASSERT_EQ(log.rejected.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(log.rejected[k].file, "bad.swf");
    EXPECT_EQ(log.rejected[k].line, want[k].first);
    EXPECT_THAT(log.rejected[k].message, HasSubstr(want[k].second)) << "line " << want[k].first;
  }
  ASSERT_EQ(log.jobs.size(), 2u);
  EXPECT_EQ(log.jobs[0].line, 2);
  EXPECT_EQ(log.jobs[1].line, 13);
  EXPECT_EQ(log.lines, 10);            // job lines, rejected ones included (not header lines)
  EXPECT_EQ(log.header.max_nodes, 4);  // the repeated MaxNodes did not override it

  ASSERT_OK_AND_ASSIGN(SwfTrace t, SwfToIdleTrace(log));
  EXPECT_EQ(t.trace.rejected.size(), want.size());  // carried into the trace
  EXPECT_EQ(t.trace.rows, 10);

  SwfOptions strict;
  strict.strict = true;
  EXPECT_THAT(ParseSwf(text, "bad.swf", strict).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad.swf:3: expected 18 whitespace-separated fields, got 17")));
  EXPECT_THAT(ParseSwf("; MaxNodes: 0\n", "z.swf", strict).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("z.swf:1: MaxNodes: 0 is out of range")));
}

// ppn = 8 / 4 = 2. Job 2 takes n0 at 5, job 1 (4 procs = 2 nodes) the lowest
// free nodes n1, n2 at 10; job 3 (3 procs = 2 nodes) starts at 60 after job 2
// freed n0 at 55, so it takes n0 and n3.
TEST(SwfTest, ReplaysStartAndEndTimesOntoLowestFreeNodes) {
  const SwfTrace t =
      Replay(absl::StrCat("; MaxNodes: 4\n; MaxProcs: 8\n; UnixStartTime: 1000\n",
                          Job(1, 0, 10, 100, 4), Job(2, 5, 0, 50, 2), Job(3, 20, 40, 200, 3)));
  EXPECT_THAT(t.trace.nodes, ElementsAre("n0", "n1", "n2", "n3"));
  EXPECT_THAT(Events(t.trace, 1000),
              ElementsAre(Ev{0, "n0", true}, Ev{0, "n1", true}, Ev{0, "n2", true},
                          Ev{0, "n3", true},                         // the log's time 0
                          Ev{5, "n0", false},                        // job 2
                          Ev{10, "n1", false}, Ev{10, "n2", false},  // job 1
                          Ev{55, "n0", true},                        // job 2 ends
                          Ev{60, "n0", false}, Ev{60, "n3", false},  // job 3
                          Ev{110, "n1", true}, Ev{110, "n2", true},  // job 1 ends
                          Ev{260, "n0", true}, Ev{260, "n3", true}));
  EXPECT_EQ(t.trace.start, absl::FromUnixSeconds(1000));
  EXPECT_EQ(t.trace.end, absl::FromUnixSeconds(1260));
  EXPECT_EQ(t.report.nodes, 4);
  EXPECT_EQ(t.report.procs_per_node, 2);
  EXPECT_EQ(t.report.jobs_replayed, 3);
  EXPECT_EQ(t.report.oversubscribed_jobs, 0);
  EXPECT_EQ(t.report.oversubscribed_node_seconds, 0);
  // 1 x 5 + 3 x 45 + 2 x 5 + 4 x 50 + 2 x 150.
  EXPECT_EQ(t.report.asked_node_seconds, 650);
  EXPECT_EQ(t.report.busy_node_seconds, 650);
  EXPECT_EQ(t.report.peak_asked_nodes, 4);
}

TEST(SwfTest, NodeFreedAndTakenAtOneTimeStaysBusy) {
  // Job 1 ends at 100 when job 2 starts: n0 goes from job 1 to job 2 without
  // an event (ends are applied before starts).
  const SwfTrace t =
      Replay(absl::StrCat("; MaxNodes: 2\n", Job(1, 0, 0, 100, 1), Job(2, 50, 50, 100, 1)));
  EXPECT_THAT(Events(t.trace), ElementsAre(Ev{0, "n1", true}, Ev{200, "n0", true}));
}

// Over-subscription on 2 nodes (MaxProcs only: one processor per node).
// A holds both nodes 0..100; B (1 node) starts at 10 with nothing free; C asks
// for 3 > 2 nodes at 20..30. At 100 A's nodes go first to B's deficit (n0),
// the other becomes idle; B ends at 110.
TEST(SwfTest, OversubscriptionIsReportedAndFilledInStartOrder) {
  const SwfTrace t = Replay(absl::StrCat("; MaxProcs: 2\n", Job(1, 0, 0, 100, 2),
                                         Job(2, 10, 0, 100, 1), Job(3, 20, 0, 10, 3)));
  EXPECT_EQ(t.report.nodes, 2);
  EXPECT_EQ(t.report.procs_per_node, 1);
  EXPECT_THAT(Events(t.trace), ElementsAre(Ev{100, "n1", true}, Ev{110, "n0", true}));
  EXPECT_EQ(t.report.oversized_jobs, 1);
  EXPECT_EQ(t.report.oversubscribed_jobs, 2);
  // Asked beyond 2 nodes: 1 x 10 (10..20) + 4 x 10 (20..30) + 1 x 70 (30..100).
  EXPECT_EQ(t.report.oversubscribed_node_seconds, 120);
  // 2 x 10 + 3 x 10 + 6 x 10 + 3 x 70 + 1 x 10.
  EXPECT_EQ(t.report.asked_node_seconds, 330);
  EXPECT_EQ(t.report.busy_node_seconds, 210);
  EXPECT_EQ(t.report.peak_asked_nodes, 6);
}

TEST(SwfTest, EveryJobLineIsCountedOnce) {
  const SwfTrace t = Replay(
      absl::StrCat("; MaxNodes: 4\n", Job(1, 0, -1, 10, 1),                // unknown wait
                   Job(2, 0, 0, 0, 1, 5),                                  // cancelled, zero length
                   "3 0 0 10 -1 -1 -1 -1 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n",  // no processor count
                   "4 0 0 10 -1 -1 -1 2 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n",   // requested procs only
                   // Job 5 ran in two parts (status 2, then 3); its summary line says 300 s.
                   Job(5, 0, 0, 300, 1, 1), Job(5, 0, 20, 30, 1, 2), Job(5, 100, 0, 40, 1, 3)));
  const SwfReplayReport& r = t.report;
  EXPECT_EQ(r.jobs_unknown_times, 1);
  EXPECT_EQ(r.jobs_zero_length, 1);
  EXPECT_EQ(r.jobs_unknown_procs, 1);
  EXPECT_EQ(r.jobs_requested_procs, 1);
  EXPECT_EQ(r.summary_lines_replaced, 1);
  EXPECT_EQ(r.jobs_replayed, 3);  // job 4 and job 5's two parts
  EXPECT_EQ(r.jobs_unknown_times + r.jobs_zero_length + r.jobs_unknown_procs +
                r.summary_lines_replaced + r.jobs_replayed,
            t.trace.rows);
  // Job 4 on n0, n1 (0..10); job 5 on n0 (20..50) and n0 again (100..140).
  EXPECT_THAT(Events(t.trace),
              ElementsAre(Ev{0, "n2", true}, Ev{0, "n3", true}, Ev{10, "n0", true},
                          Ev{10, "n1", true}, Ev{20, "n0", false}, Ev{50, "n0", true},
                          Ev{100, "n0", false}, Ev{140, "n0", true}));
}

// Logs whose submit times are start times record no wait (-1): replayed
// with wait 0 when asked, counted apart; otherwise the error says what to do.
TEST(SwfTest, UnknownWaitsReplayedAsZeroWhenAsked) {
  const std::string text =
      absl::StrCat("; MaxNodes: 2\n", Job(1, 0, -1, 100, 1), Job(2, 50, -1, 100, 2));
  ASSERT_OK_AND_ASSIGN(SwfLog log, ParseSwf(text, "w.swf"));
  EXPECT_THAT(SwfToIdleTrace(log).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("2 with an unknown submit, wait or run time); if the log records "
                                 "no wait times because its submit times are start times, replay "
                                 "unknown waits as 0 (unknown_wait_is_zero)")));
  SwfReplayOptions o;
  o.unknown_wait_is_zero = true;
  ASSERT_OK_AND_ASSIGN(SwfTrace t, SwfToIdleTrace(log, o));
  EXPECT_EQ(t.report.jobs_wait_assumed_zero, 2);
  EXPECT_EQ(t.report.jobs_replayed, 2);
  EXPECT_EQ(t.report.jobs_unknown_times, 0);
  // Job 1 on n0 0..100; job 2 asks for both at 50: n1 at once, n0 at 100.
  EXPECT_THAT(Events(t.trace), ElementsAre(Ev{0, "n1", true}, Ev{50, "n1", false},
                                           Ev{150, "n0", true}, Ev{150, "n1", true}));
}

TEST(SwfTest, MachineSizeFromHeaderOrOptions) {
  const std::string jobs = Job(1, 0, 0, 10, 4);
  ASSERT_OK_AND_ASSIGN(SwfLog bare, ParseSwf(jobs, "bare.swf"));
  EXPECT_THAT(SwfToIdleTrace(bare).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("nodes: bare.swf has neither '; MaxNodes:' nor '; MaxProcs:'")));
  SwfReplayOptions o;
  o.nodes = 16;
  o.procs_per_node = 4;
  ASSERT_OK_AND_ASSIGN(SwfTrace t, SwfToIdleTrace(bare, o));
  EXPECT_EQ(t.trace.nodes.size(), 16u);
  EXPECT_EQ(t.trace.nodes.front(), "n00");     // zero-padded: names sort like indices
  EXPECT_EQ(t.report.asked_node_seconds, 10);  // 4 procs = 1 node for 10 s

  ASSERT_OK_AND_ASSIGN(SwfLog odd, ParseSwf("; MaxNodes: 3\n; MaxProcs: 8\n" + jobs, "odd.swf"));
  EXPECT_THAT(SwfToIdleTrace(odd).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("procs_per_node: odd.swf's MaxProcs (8) is not a multiple of "
                                 "MaxNodes (3)")));
  o.nodes = -1;
  EXPECT_THAT(SwfToIdleTrace(odd, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nodes: -1")));

  ASSERT_OK_AND_ASSIGN(SwfLog empty, ParseSwf("; MaxNodes: 3\n" + Job(1, 0, 0, 0, 1), "e.swf"));
  EXPECT_THAT(SwfToIdleTrace(empty).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no job occupies a node for a positive time")));
}

// tests/data/tiny.swf, plain and gzipped, worked out by hand.
TEST(SwfTest, LoadsTheTinyLogPlainAndGzipped) {
  const std::string path = absl::StrCat(MALLE_TEST_DATA_DIR, "/tiny.swf");
  ASSERT_OK_AND_ASSIGN(SwfLog log, LoadSwf(path));
  ASSERT_EQ(log.rejected.size(), 1u);
  EXPECT_EQ(log.rejected[0].file, path);
  EXPECT_EQ(log.rejected[0].line, 16);
  EXPECT_THAT(log.rejected[0].message, HasSubstr("got 17"));
  ASSERT_OK_AND_ASSIGN(SwfTrace t, SwfToIdleTrace(log));
  EXPECT_THAT(Events(t.trace, 1600000000),
              ElementsAre(Ev{0, "n0", true}, Ev{0, "n1", true}, Ev{0, "n2", true},
                          Ev{0, "n3", true}, Ev{5, "n0", false}, Ev{10, "n1", false},
                          Ev{10, "n2", false}, Ev{55, "n0", true}, Ev{60, "n0", false},
                          Ev{60, "n3", false}, Ev{110, "n1", true}, Ev{110, "n2", true},
                          Ev{120, "n1", false}, Ev{120, "n2", false}, Ev{150, "n1", true},
                          Ev{150, "n2", true}, Ev{260, "n0", true}, Ev{260, "n3", true}));
  EXPECT_EQ(t.report.jobs_replayed, 4);
  EXPECT_EQ(t.report.jobs_zero_length, 1);
  EXPECT_EQ(t.report.jobs_unknown_times, 1);
  EXPECT_EQ(t.report.oversized_jobs, 1);
  EXPECT_EQ(t.report.oversubscribed_jobs, 1);
  EXPECT_EQ(t.report.oversubscribed_node_seconds, 90);  // job 6: 3 nodes short for 30 s
  EXPECT_EQ(t.report.asked_node_seconds, 800);
  EXPECT_EQ(t.report.busy_node_seconds, 710);
  EXPECT_EQ(t.report.peak_asked_nodes, 7);

  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string gz = absl::StrCat(::testing::TempDir(), "/swf_test_", getpid(), ".swf.gz");
  gzFile f = gzopen(gz.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), text.size()), static_cast<int>(text.size()));
  gzclose(f);
  ASSERT_OK_AND_ASSIGN(SwfLog zipped, LoadSwf(gz));
  std::remove(gz.c_str());
  ASSERT_OK_AND_ASSIGN(SwfTrace tz, SwfToIdleTrace(zipped));
  EXPECT_EQ(Events(tz.trace, 1600000000), Events(t.trace, 1600000000));
  EXPECT_THAT(LoadSwf(path + ".missing").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("tiny.swf.missing")));
}

// The derived trace drives the simulator. Two nodes: job A holds n0 0..100,
// job B holds n0 200..1000, n1 is never used by the log. A malleable job
// (10 samples/s per node, 10 s up, 5 s down) starts on n1 at 0, grows onto n0
// at 100 (pays 10/s x 10 s), is shrunk by B at 200 (pays 20/s x 5 s), and
// runs on n1 until the log ends at 1000:
// 10 x 100 + 20 x 100 + 10 x 800 - 100 - 100 = 10,800 samples.
TEST(SwfTest, DerivedTraceDrivesTheSimulator) {
  const SwfTrace t =
      Replay(absl::StrCat("; MaxNodes: 2\n", Job(1, 0, 0, 100, 1), Job(2, 150, 50, 800, 1)));
  ASSERT_OK_AND_ASSIGN(JobMix mix, ParseJobMix("name,submit_time,min_nodes,max_nodes,work_samples,"
                                               "rescale_up_s,rescale_down_s,nodes,throughput\n"
                                               "j,0,1,2,1e9,10,5,0;1;2,0;10;20\n",
                                               "mix.csv"));
  SimOptions o;
  o.decide.policy = alloc::PolicyKind::kDp;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(t.trace, mix.jobs, o));
  EXPECT_DOUBLE_EQ(r.summary.samples_trained, 10800);
  EXPECT_EQ(r.summary.resizes, 2);
  EXPECT_EQ(r.summary.reclaims, 1);
  EXPECT_DOUBLE_EQ(r.summary.idle_node_hours, (1000 + 100) / 3600.0);
}

// A log with absolute Unix submit times and no UnixStartTime header (as
// several published logs are): the replay starts at its first event, not at
// 1970 with every node idle for fifty years.
TEST(SwfTest, AbsoluteTimesStartAtTheFirstEvent) {
  ASSERT_OK_AND_ASSIGN(SwfLog log, LoadSwf(absl::StrCat(MALLE_TEST_DATA_DIR, "/forecast.swf")));
  EXPECT_FALSE(log.header.has_unix_start_time);
  ASSERT_OK_AND_ASSIGN(SwfTrace t, SwfToIdleTrace(log));
  EXPECT_TRUE(t.report.absolute_times);
  EXPECT_EQ(t.report.ignored_unix_start_time, -1);
  EXPECT_DOUBLE_EQ(t.report.skipped_lead_s, 1600000000);
  EXPECT_DOUBLE_EQ(t.report.span_s, 500);
  EXPECT_EQ(t.trace.start, absl::FromUnixSeconds(1600000000));
  EXPECT_EQ(t.trace.end, absl::FromUnixSeconds(1600000500));
  EXPECT_THAT(Events(t.trace, 1600000000),
              ElementsAre(Ev{0, "n1", true}, Ev{100, "n0", true}, Ev{200, "n0", false},
                          Ev{200, "n1", false}, Ev{300, "n0", true}, Ev{300, "n1", true},
                          Ev{400, "n0", false}, Ev{500, "n0", true}));
  // Each reclaim is announced when the job that takes the node is submitted.
  std::vector<std::string> announced;
  for (const IdleEvent& e : t.trace.events) {
    if (!e.idle) {
      announced.push_back(
          absl::StrCat(t.trace.nodes[e.node], "@", absl::ToUnixSeconds(e.announced) - 1600000000));
    }
  }
  EXPECT_THAT(announced, ElementsAre("n0@50", "n1@50", "n0@400"));

  // Idle node-hours are those of the log's 500 s, not of 50 years:
  // n1 0..200, n0 100..200, both 300..400, n1 400..500.
  ASSERT_OK_AND_ASSIGN(JobMix mix, ParseJobMix("name,submit_time,min_nodes,max_nodes,work_samples,"
                                               "rescale_up_s,rescale_down_s,nodes,throughput\n"
                                               "j,0,1,2,1e9,10,5,0;1;2,0;10;20\n",
                                               "mix.csv"));
  SimOptions o;
  o.decide.policy = alloc::PolicyKind::kDp;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(t.trace, mix.jobs, o));
  EXPECT_DOUBLE_EQ(r.summary.idle_node_hours, 600 / 3600.0);
  EXPECT_THAT(r.summary.warnings,
              ::testing::Not(::testing::Contains(HasSubstr("cannot be right"))));
}

// Absolute times under a UnixStartTime header (ALCF's Theta log as converted
// by one public project says 0): the header is not added, the replay starts
// at the first event all the same, and the report keeps the header's value
// for the warning.
TEST(SwfTest, AbsoluteTimesUnderAUnixStartTimeHeader) {
  for (int64_t header : {0, 1000}) {
    const SwfTrace t = Replay(absl::StrCat("; MaxNodes: 2\n; UnixStartTime: ", header, "\n",
                                           Job(1, 1640000000, 10, 100, 1)));
    EXPECT_TRUE(t.report.absolute_times) << header;
    EXPECT_EQ(t.report.ignored_unix_start_time, header);
    EXPECT_EQ(t.trace.start, absl::FromUnixSeconds(1640000000)) << header;
    EXPECT_DOUBLE_EQ(t.report.span_s, 110) << header;
  }
}

// A relative log whose first job arrives late starts there too.
TEST(SwfTest, RelativeLogStartsAtItsFirstSubmit) {
  const SwfTrace t =
      Replay(absl::StrCat("; MaxNodes: 2\n; UnixStartTime: 1000\n", Job(1, 5000, 10, 100, 1)));
  EXPECT_FALSE(t.report.absolute_times);
  EXPECT_DOUBLE_EQ(t.report.skipped_lead_s, 5000);
  EXPECT_EQ(t.trace.start, absl::FromUnixSeconds(6000));
  EXPECT_THAT(Events(t.trace, 1000), ElementsAre(Ev{5000, "n0", true}, Ev{5000, "n1", true},
                                                 Ev{5010, "n0", false}, Ev{5110, "n0", true}));
}

// What each forecast mode tells the policy, decision by decision, on the
// hand-written log (times after its first event): the reservation knows a
// reclaim from the submit of the job that makes it, the oracle always.
TEST(SwfTest, ReservationForecastFromTheLog) {
  ASSERT_OK_AND_ASSIGN(SwfLog log, LoadSwf(absl::StrCat(MALLE_TEST_DATA_DIR, "/forecast.swf")));
  ASSERT_OK_AND_ASSIGN(SwfTrace t, SwfToIdleTrace(log));
  ASSERT_OK_AND_ASSIGN(JobMix mix, ParseJobMix("name,submit_time,min_nodes,max_nodes,work_samples,"
                                               "rescale_up_s,rescale_down_s,nodes,throughput\n"
                                               "j,0,1,2,1e9,10,5,0;1;2,0;10;20\n",
                                               "mix.csv"));
  auto forecasts = [&](ForecastMode mode) {
    std::vector<std::string> seen;
    SimOptions o;
    o.decide.policy = alloc::PolicyKind::kDp;
    o.forecast = mode;
    o.on_decision = [&seen](const alloc::Problem& p, const alloc::Decision&, absl::Duration) {
      std::string line;
      for (const alloc::Node& n : p.nodes) {
        absl::StrAppend(&line, line.empty() ? "" : " ", n.id, "=",
                        n.expected_idle == absl::InfiniteDuration()
                            ? std::string("?")
                            : absl::StrCat(absl::ToInt64Seconds(n.expected_idle)));
      }
      seen.push_back(line);
    };
    absl::StatusOr<SimResult> r = Simulate(t.trace, mix.jobs, o);
    EXPECT_TRUE(r.ok()) << r.status();
    return seen;
  };
  // Decisions at 0, 100, 200 (no idle node), 300 and 400.
  EXPECT_THAT(forecasts(ForecastMode::kReservation),
              ElementsAre("n1=?", "n0=100 n1=100", "", "n0=? n1=?", "n1=?"));
  EXPECT_THAT(forecasts(ForecastMode::kOracle),
              ElementsAre("n1=200", "n0=100 n1=100", "", "n0=100 n1=?", "n1=?"));
  EXPECT_THAT(forecasts(ForecastMode::kNone),
              ElementsAre("n1=?", "n0=? n1=?", "", "n0=? n1=?", "n1=?"));
}

}  // namespace
}  // namespace malle::sim
