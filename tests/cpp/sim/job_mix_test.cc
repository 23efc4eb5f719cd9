#include "libmalle/sim/job_mix.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/alloc/problem.h"
#include "libmalle/base/testing/status_matchers.h"

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

}  // namespace
}  // namespace malle::sim
