#include "libmalle/sim/job_mix.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/alloc/problem.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::sim {
namespace {

using ::malle::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kHeader[] =
    "name,submit_time,min_nodes,max_nodes,work_samples,rescale_up_s,rescale_down_s,nodes,"
    "throughput\n";
const JobMixOptions kStrict{/*strict=*/true};
constexpr char kGood[] = "a,100,1,4,1000,2.5,1.5,0;1;2;4,0;10;18;30\n";

std::string DataPath(const std::string& name) {
  return absl::StrCat(MALLE_SHARED_DATA_DIR, "/", name);
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

#define SKIP_IF_MISSING(path)                                                              \
  if (!Exists(path))                                                                       \
  GTEST_SKIP() << "real data file " << path                                                \
               << " is absent (MALLE_SHARED_DATA_DIR=" << MALLE_SHARED_DATA_DIR            \
               << "); CI has it, a checkout without ../shared/data does not"

TEST(JobMixRealData, ImageNet1001) {
  const std::string path = DataPath("jobs-imagenet-1001.csv");
  SKIP_IF_MISSING(path);
  ASSERT_OK_AND_ASSIGN(JobMix mix, LoadJobMix(path, kStrict));
  ASSERT_EQ(mix.jobs.size(), 1001u);
  EXPECT_TRUE(mix.rejected.empty());

  const MixJob& first = mix.jobs.front();
  EXPECT_EQ(first.name, "J00000-AlexNet");
  EXPECT_EQ(first.submit_time, absl::FromUnixSeconds(1612988475));
  EXPECT_EQ(first.min_nodes, 1);
  EXPECT_EQ(first.max_nodes, 64);
  EXPECT_DOUBLE_EQ(first.work_samples, 130000000.0);
  EXPECT_EQ(first.rescale_up, absl::Milliseconds(17788));
  EXPECT_EQ(first.rescale_down, absl::Milliseconds(11273));
  ASSERT_EQ(first.throughput.size(), 8u);
  EXPECT_EQ(first.throughput[0].nodes, 0);
  EXPECT_DOUBLE_EQ(first.throughput[0].samples_per_s, 0.0);
  EXPECT_EQ(first.throughput[1].nodes, 1);
  EXPECT_DOUBLE_EQ(first.throughput[1].samples_per_s, 7115.3);
  EXPECT_EQ(first.throughput[7].nodes, 64);
  EXPECT_DOUBLE_EQ(first.throughput[7].samples_per_s, 202135.0);

  const MixJob& j1 = mix.jobs[1];
  EXPECT_EQ(j1.name, "J00001-vgg16");
  EXPECT_DOUBLE_EQ(j1.throughput[4].samples_per_s, 9257.9);  // 8 nodes

  const MixJob& last = mix.jobs.back();
  EXPECT_EQ(last.name, "J01000-mobilenet");
  EXPECT_EQ(last.submit_time, absl::FromUnixSeconds(1613024475));
  EXPECT_EQ(last.rescale_up, absl::Milliseconds(18995));
  EXPECT_EQ(last.rescale_down, absl::Milliseconds(11458));
  EXPECT_DOUBLE_EQ(last.throughput.back().samples_per_s, 155214.0);

  // Every job is a valid allocator job.
  alloc::Problem problem;
  for (int i = 0; i < 64; ++i) problem.nodes.push_back(alloc::Node{absl::StrCat("n", i)});
  for (const MixJob& job : mix.jobs) problem.jobs.push_back(ToJobSpec(job));
  EXPECT_OK(alloc::ValidateProblem(problem));
}

TEST(JobMixRealData, HpoShuffleNet10) {
  const std::string path = DataPath("jobs-hpo-shufflenet-10.csv");
  SKIP_IF_MISSING(path);
  ASSERT_OK_AND_ASSIGN(JobMix mix, LoadJobMix(path, kStrict));
  ASSERT_EQ(mix.jobs.size(), 10u);
  EXPECT_TRUE(mix.rejected.empty());
  for (const MixJob& job : mix.jobs) {
    EXPECT_EQ(job.rescale_up, absl::Seconds(18));
    EXPECT_EQ(job.rescale_down, absl::Seconds(12));
    ASSERT_EQ(job.throughput.size(), 8u);
    EXPECT_DOUBLE_EQ(job.throughput[5].samples_per_s, 38895.3);  // 16 nodes
  }
  EXPECT_EQ(mix.jobs[9].name, "J00009");
  EXPECT_EQ(mix.jobs[9].submit_time, absl::FromUnixSeconds(1613024475));
  EXPECT_EQ(mix.jobs[9].submit_time - mix.jobs[8].submit_time, absl::Seconds(4000));
}

TEST(JobMixTest, ParsesCommentsBlankLinesAndCrLf) {
  const std::string text = absl::StrCat("# a comment\n\n", kHeader, "# another\r\n", kGood,
                                        "b , 200 ,2,2,5e3,0,0, 1 ; 2 ,7;11.5\r\n", "\n");
  ASSERT_OK_AND_ASSIGN(JobMix mix, ParseJobMix(text, "t.csv", kStrict));
  ASSERT_EQ(mix.jobs.size(), 2u);
  const MixJob& a = mix.jobs[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.submit_time, absl::FromUnixSeconds(100));
  EXPECT_EQ(a.min_nodes, 1);
  EXPECT_EQ(a.max_nodes, 4);
  EXPECT_DOUBLE_EQ(a.work_samples, 1000);
  EXPECT_EQ(a.rescale_up, absl::Milliseconds(2500));
  EXPECT_EQ(a.rescale_down, absl::Milliseconds(1500));
  ASSERT_EQ(a.throughput.size(), 4u);
  EXPECT_EQ(a.throughput[3].nodes, 4);
  EXPECT_DOUBLE_EQ(a.throughput[3].samples_per_s, 30);
  const MixJob& b = mix.jobs[1];
  EXPECT_EQ(b.name, "b");
  EXPECT_EQ(b.min_nodes, 2);
  EXPECT_DOUBLE_EQ(b.work_samples, 5000);
  ASSERT_EQ(b.throughput.size(), 2u);
  EXPECT_DOUBLE_EQ(b.throughput[1].samples_per_s, 11.5);
}

TEST(JobMixTest, HeaderOnlyIsAnEmptyMix) {
  ASSERT_OK_AND_ASSIGN(JobMix mix, ParseJobMix(kHeader, "t.csv"));
  EXPECT_TRUE(mix.jobs.empty());
  EXPECT_TRUE(mix.rejected.empty());
}

TEST(JobMixTest, ToJobSpec) {
  ASSERT_OK_AND_ASSIGN(JobMix mix, ParseJobMix(absl::StrCat(kHeader, kGood), "t.csv"));
  const alloc::JobSpec spec = ToJobSpec(mix.jobs[0]);
  EXPECT_EQ(spec.id, "a");
  EXPECT_EQ(spec.min_nodes, 1);
  EXPECT_EQ(spec.max_nodes, 4);
  EXPECT_EQ(spec.resize_up_pause, absl::Milliseconds(2500));
  EXPECT_EQ(spec.resize_down_pause, absl::Milliseconds(1500));
  EXPECT_EQ(spec.weight, 1.0);
  EXPECT_TRUE(spec.current_nodes.empty());
  ASSERT_EQ(spec.throughput.size(), 4u);
  EXPECT_DOUBLE_EQ(spec.throughput[2].samples_per_s, 18);
}

// Header errors fail the parse in both modes.
TEST(JobMixTest, BadHeaderIsAnErrorEvenWhenLenient) {
  struct Case {
    std::string text;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"", "t.csv: no header line"},
      {"# only comments\n\n", "t.csv: no header line"},
      {absl::StrCat(kGood), "t.csv:1: header: expected"},  // data, no header
      {"name,submit_time,max_nodes,min_nodes,work_samples,rescale_up_s,rescale_down_s,nodes,"
       "throughput\n",
       "t.csv:1: header: expected"},  // reordered columns
      {"# c\nname,submit_time,min_nodes,max_nodes\n", "t.csv:2: header: expected"},
  };
  for (const Case& c : cases) {
    for (bool strict : {false, true}) {
      EXPECT_THAT(ParseJobMix(c.text, "t.csv", JobMixOptions{strict}),
                  StatusIs(absl::StatusCode::kInvalidArgument, StartsWith(c.expected)))
          << "text: " << c.text << " strict: " << strict;
    }
  }
}

// One corrupt data line (line 3, between two good ones): strict fails with
// file:line: column; lenient keeps the good lines and reports the bad one.
TEST(JobMixTest, EveryCorruptionIsReportedWithFileLineAndColumn) {
  struct Case {
    std::string line;
    std::string message;  // expected prefix after "file:line: "
  };
  const std::vector<Case> cases = {
      {"x,100,1,4,1000,2.5,1.5,0;1;2;4", "expected 9 comma-separated columns, got 8"},
      {"x,100,1,4,1000,2.5,1.5,0;1;2;4,0;10;18;30,extra", "expected 9 comma-separated columns"},
      {",100,1,4,1000,2.5,1.5,0;1;2;4,0;10;18;30", "name: empty"},
      {absl::StrCat(std::string(129, 'n'), ",100,1,4,1000,2.5,1.5,0;1;2;4,0;10;18;30"),
       "name: 'nnnn"},
      {"x,soon,1,4,1000,2.5,1.5,0;1;2;4,0;10;18;30", "submit_time: 'soon' is not an integer"},
      {"x,100.5,1,4,1000,2.5,1.5,0;1;2;4,0;10;18;30", "submit_time: '100.5' is not an integer"},
      {"x,-1,1,4,1000,2.5,1.5,0;1;2;4,0;10;18;30", "submit_time: -1 is out of range"},
      {"x,100,one,4,1000,2.5,1.5,0;1;2;4,0;10;18;30", "min_nodes: 'one' is not an integer"},
      {"x,100,0,4,1000,2.5,1.5,0;1;2;4,0;10;18;30", "min_nodes: 0 is out of range"},
      {"x,100,1,,1000,2.5,1.5,0;1;2;4,0;10;18;30", "max_nodes: empty"},
      {"x,100,1,99999999999,1000,2.5,1.5,0;1;2;4,0;10;18;30", "max_nodes:"},
      {"x,100,3,2,1000,2.5,1.5,0;1;2;4,0;10;18;30", "max_nodes: 2 is less than min_nodes = 3"},
      {"x,100,1,4,nan,2.5,1.5,0;1;2;4,0;10;18;30", "work_samples: 'nan' is not finite"},
      {"x,100,1,4,0,2.5,1.5,0;1;2;4,0;10;18;30", "work_samples: 0 must be > 0"},
      {"x,100,1,4,1000,inf,1.5,0;1;2;4,0;10;18;30", "rescale_up_s: 'inf' is not finite"},
      {"x,100,1,4,1000,2.5,-1,0;1;2;4,0;10;18;30", "rescale_down_s: -1 must be >= 0"},
      {"x,100,1,4,1000,2.5,1.5,0;1;2;4,0;10;18", "throughput: has 3 entries but nodes has 4"},
      {"x,100,1,4,1000,2.5,1.5,0;1;2;4;,0;10;18;30;", "nodes[4]: empty"},
      {"x,100,1,4,1000,2.5,1.5,0;1;2.5;4,0;10;18;30", "nodes[2]: '2.5' is not an integer"},
      {"x,100,1,4,1000,2.5,1.5,0;2;2;4,0;10;18;30", "nodes[2]: 2 is not greater than nodes[1]"},
      {"x,100,1,4,1000,2.5,1.5,0;4;2;1,0;10;18;30", "nodes[2]: 2 is not greater than nodes[1]"},
      {"x,100,1,4,1000,2.5,1.5,0;1;2;4,0;10;-18;30", "throughput[2]: -18 must be >= 0"},
      {"x,100,1,4,1000,2.5,1.5,0;1;2;4,0;10;fast;30", "throughput[2]: 'fast' is not a number"},
      {"x,100,1,4,1000,2.5,1.5,0;1;2;4,0;10;18;1e999", "throughput[3]:"},
      {"x,100,1,8,1000,2.5,1.5,0;1;2;4,0;10;18;30", "nodes: curve covers [0, 4], which does not"},
      {"x,100,1,4,1000,2.5,1.5,2;4,18;30", "nodes: curve covers [2, 4], which does not"},
      {"a,100,1,4,1000,2.5,1.5,0;1;2;4,0;10;18;30", "name: 'a' duplicates the job on line 2"},
  };
  const std::string last = "z,300,1,2,10,0,0,1;2,1;2\n";
  for (const Case& c : cases) {
    const std::string text = absl::StrCat(kHeader, kGood, c.line, "\n", last);
    SCOPED_TRACE(c.line);
    EXPECT_THAT(ParseJobMix(text, "mix.csv", kStrict),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         StartsWith(absl::StrCat("mix.csv:3: ", c.message))));
    ASSERT_OK_AND_ASSIGN(JobMix mix, ParseJobMix(text, "mix.csv", JobMixOptions{}));
    ASSERT_EQ(mix.jobs.size(), 2u);
    EXPECT_EQ(mix.jobs[0].name, "a");
    EXPECT_EQ(mix.jobs[1].name, "z");
    ASSERT_EQ(mix.rejected.size(), 1u);
    EXPECT_EQ(mix.rejected[0].file, "mix.csv");
    EXPECT_EQ(mix.rejected[0].line, 3);
    EXPECT_THAT(mix.rejected[0].message, StartsWith(c.message));
  }
}

TEST(JobMixTest, LenientCollectsEveryBadLineInOrder) {
  const std::string text =
      absl::StrCat("# comment\n", kHeader, "bad1,x,1,4,1000,0,0,0;4,0;1\n", kGood,
                   "\n", "bad2,1,1,4,1000,0,0,0;4,0\n", kGood /* duplicate of line 4 */);
  ASSERT_OK_AND_ASSIGN(JobMix mix, ParseJobMix(text, "m.csv"));
  ASSERT_EQ(mix.jobs.size(), 1u);
  ASSERT_EQ(mix.rejected.size(), 3u);
  EXPECT_EQ(mix.rejected[0].line, 3);
  EXPECT_THAT(mix.rejected[0].message, HasSubstr("submit_time"));
  EXPECT_EQ(mix.rejected[1].line, 6);
  EXPECT_THAT(mix.rejected[1].message, HasSubstr("throughput"));
  EXPECT_EQ(mix.rejected[2].line, 7);
  EXPECT_THAT(mix.rejected[2].message, HasSubstr("duplicates the job on line 4"));
  // Strict stops at the first.
  EXPECT_THAT(ParseJobMix(text, "m.csv", kStrict),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("m.csv:3: submit_time")));
}

TEST(JobMixTest, LoadMissingFileIsNotFound) {
  EXPECT_THAT(LoadJobMix("/nonexistent/dir/mix.csv"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/dir/mix.csv")));
}

TEST(JobMixTest, LoadReportsThePathInLineErrors) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/job_mix_test_bad.csv");
  {
    std::ofstream out(path);
    out << kHeader << "q,1,1,1,1,0,0,1,-1\n";
  }
  EXPECT_THAT(LoadJobMix(path, kStrict),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith(absl::StrCat(path, ":2: throughput[0]"))));
  ASSERT_OK_AND_ASSIGN(JobMix mix, LoadJobMix(path));
  ASSERT_EQ(mix.rejected.size(), 1u);
  EXPECT_EQ(mix.rejected[0].file, path);
  std::remove(path.c_str());
}

// Same seed, same mix; another seed, another mix.
TEST(SyntheticJobMixTest, SameSeedSameMix) {
  ASSERT_OK_AND_ASSIGN(JobMix a, SyntheticJobMix(50, 7));
  ASSERT_OK_AND_ASSIGN(JobMix b, SyntheticJobMix(50, 7));
  ASSERT_OK_AND_ASSIGN(JobMix c, SyntheticJobMix(50, 8));
  EXPECT_EQ(JobMixToCsv(a.jobs), JobMixToCsv(b.jobs));
  EXPECT_NE(JobMixToCsv(a.jobs), JobMixToCsv(c.jobs));
  // A prefix of a longer mix is the shorter mix: job k depends on the seed
  // and k only.
  ASSERT_OK_AND_ASSIGN(JobMix longer, SyntheticJobMix(80, 7));
  longer.jobs.resize(50);
  EXPECT_EQ(JobMixToCsv(longer.jobs), JobMixToCsv(a.jobs));
}

TEST(SyntheticJobMixTest, JobsFollowTheOptions) {
  SyntheticMixOptions o;
  o.first_submit = absl::FromUnixSeconds(1000);
  o.mean_interarrival = absl::Seconds(60);
  o.min_nodes_lo = 2;
  o.min_nodes_hi = 4;
  o.max_nodes_lo = 3;
  o.max_nodes_hi = 48;
  o.serial_lo = 0.01;
  o.serial_hi = 0.05;
  constexpr int kJobs = 2000;
  ASSERT_OK_AND_ASSIGN(JobMix mix, SyntheticJobMix(kJobs, 42, o));
  ASSERT_EQ(mix.jobs.size(), static_cast<size_t>(kJobs));
  EXPECT_EQ(mix.jobs[0].name, "S00000");
  EXPECT_EQ(mix.jobs[0].submit_time, absl::FromUnixSeconds(1000));
  absl::Time last = o.first_submit;
  for (const MixJob& j : mix.jobs) {
    SCOPED_TRACE(j.name);
    EXPECT_GE(j.submit_time, last);
    last = j.submit_time;
    EXPECT_GE(j.min_nodes, 2);
    EXPECT_LE(j.min_nodes, 4);
    EXPECT_GE(j.max_nodes, std::max(3, j.min_nodes));
    EXPECT_LE(j.max_nodes, 48);
    EXPECT_GE(absl::ToDoubleSeconds(j.rescale_up), 15);
    EXPECT_LT(absl::ToDoubleSeconds(j.rescale_up), 20);
    // Amdahl: r(n) = r1 n / (1 + s (n - 1)) with s in [0.01, 0.05], at 0, the
    // powers of two below max_nodes, min_nodes and max_nodes.
    ASSERT_GE(j.throughput.size(), 3u);
    EXPECT_EQ(j.throughput.front().nodes, 0);
    EXPECT_EQ(j.throughput.front().samples_per_s, 0);
    EXPECT_EQ(j.throughput.back().nodes, j.max_nodes);
    const double r1 = alloc::Interpolate(j.throughput, 1);
    EXPECT_GE(r1, 1000);
    EXPECT_LE(r1, 8000);
    for (const alloc::Breakpoint& b : j.throughput) {
      if (b.nodes <= 1) continue;
      const double s = (r1 * b.nodes / b.samples_per_s - 1) / (b.nodes - 1);
      EXPECT_GE(s, 0.01 - 1e-9);
      EXPECT_LE(s, 0.05 + 1e-9);
    }
    const double hours = j.work_samples / r1 / 3600;
    EXPECT_GE(hours, 5 - 1e-9);
    EXPECT_LE(hours, 40 + 1e-9);
  }
  // Poisson arrivals: the mean gap is near 60 s (2,000 draws: 3 sigma ~ 4 s;
  // flooring to seconds shortens it by < 1 s).
  const double mean_gap = absl::ToDoubleSeconds(last - o.first_submit) / (kJobs - 1);
  EXPECT_NEAR(mean_gap, 60, 5);
}

TEST(SyntheticJobMixTest, CsvRoundTripsThroughTheParser) {
  ASSERT_OK_AND_ASSIGN(JobMix mix, SyntheticJobMix(20, 3));
  const std::string csv = JobMixToCsv(mix.jobs);
  ASSERT_OK_AND_ASSIGN(JobMix back, ParseJobMix(csv, "synthetic.csv", kStrict));
  ASSERT_EQ(back.jobs.size(), mix.jobs.size());
  for (size_t k = 0; k < mix.jobs.size(); ++k) {
    const MixJob& a = mix.jobs[k];
    const MixJob& b = back.jobs[k];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.submit_time, b.submit_time);
    EXPECT_EQ(a.min_nodes, b.min_nodes);
    EXPECT_EQ(a.max_nodes, b.max_nodes);
    EXPECT_EQ(a.work_samples, b.work_samples);
    EXPECT_LE(absl::AbsDuration(a.rescale_up - b.rescale_up), absl::Nanoseconds(1));
    ASSERT_EQ(a.throughput.size(), b.throughput.size());
    for (size_t i = 0; i < a.throughput.size(); ++i) {
      EXPECT_EQ(a.throughput[i].nodes, b.throughput[i].nodes);
      EXPECT_EQ(a.throughput[i].samples_per_s, b.throughput[i].samples_per_s);
    }
  }
}

TEST(SyntheticJobMixTest, BadOptionsNameTheField) {
  EXPECT_THAT(SyntheticJobMix(-1, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("n: -1")));
  struct Case {
    void (*set)(SyntheticMixOptions&);
    const char* field;
  };
  const Case cases[] = {
      {[](SyntheticMixOptions& o) { o.mean_interarrival = absl::ZeroDuration(); },
       "mean_interarrival"},
      {[](SyntheticMixOptions& o) { o.min_nodes_lo = 0; }, "min_nodes_lo..min_nodes_hi"},
      {[](SyntheticMixOptions& o) { o.max_nodes_lo = 9, o.max_nodes_hi = 8; },
       "max_nodes_lo..max_nodes_hi"},
      {[](SyntheticMixOptions& o) { o.min_nodes_lo = 4, o.min_nodes_hi = 4, o.max_nodes_lo = 2,
                                    o.max_nodes_hi = 3; },
       "max_nodes_hi: 3 is less than min_nodes_lo = 4"},
      {[](SyntheticMixOptions& o) { o.rate_lo = 0; }, "rate_lo..rate_hi"},
      {[](SyntheticMixOptions& o) { o.serial_hi = 1.5; }, "serial_lo..serial_hi"},
      {[](SyntheticMixOptions& o) { o.work_hours_hi = 1; }, "work_hours_lo..work_hours_hi"},
      {[](SyntheticMixOptions& o) { o.rescale_down_s_lo = -1; }, "rescale_down_s_lo"},
  };
  for (const Case& c : cases) {
    SyntheticMixOptions o;
    c.set(o);
    EXPECT_THAT(SyntheticJobMix(3, 1, o).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.field;
  }
  ASSERT_OK_AND_ASSIGN(JobMix empty, SyntheticJobMix(0, 1));
  EXPECT_TRUE(empty.jobs.empty());
}

}  // namespace
}  // namespace malle::sim

namespace malle::sim {
namespace {

TEST(RepeatMixTest, CopiesAreShiftedAndRenamed) {
  ASSERT_OK_AND_ASSIGN(JobMix mix, SyntheticJobMix(2, 7));
  ASSERT_OK_AND_ASSIGN(std::vector<MixJob> jobs, RepeatMix(mix.jobs, 3, absl::Hours(10)));
  ASSERT_EQ(jobs.size(), 6u);
  EXPECT_EQ(jobs[0].name, "S00000");
  EXPECT_EQ(jobs[3].name, "S00001~1");
  EXPECT_EQ(jobs[5].name, "S00001~2");
  EXPECT_EQ(jobs[2].submit_time, mix.jobs[0].submit_time + absl::Hours(10));
  EXPECT_EQ(jobs[5].submit_time, mix.jobs[1].submit_time + absl::Hours(20));
  EXPECT_EQ(jobs[4].work_samples, mix.jobs[0].work_samples);
  EXPECT_THAT(RepeatMix(mix.jobs, 0, absl::Hours(1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("copies: must be in [1, 1000], got 0")));
  EXPECT_THAT(
      RepeatMix(mix.jobs, 2, -absl::Hours(1)).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("period: must be finite and >= 0")));
}

}  // namespace
}  // namespace malle::sim
