#include "libmalle/cluster/local_process.h"

#include <signal.h>

#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/base/testing/status_matchers.h"

namespace malle::cluster {
namespace {

using ::malle::testing::IsOkAndHolds;
using ::malle::testing::StatusIs;

TEST(LocalProcessTest, ReportsExitCodeAndRedirectsOutput) {
  const std::string out = ::testing::TempDir() + "/lp_out.txt";
  std::remove(out.c_str());
  ProcessSpec spec{{"/bin/sh", "-c", "echo hello $MALLE_X; exit 7"}, out, "", {{"MALLE_X", "there"}}};
  ASSERT_OK_AND_ASSIGN(auto p, LocalProcess::Spawn(spec));
  EXPECT_THAT(p->Wait(absl::Seconds(10)), IsOkAndHolds(7));
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "hello there\n");
}

TEST(LocalProcessTest, SignalsByPidAndWaitIsBounded) {
  ASSERT_OK_AND_ASSIGN(auto p, LocalProcess::Spawn({{"/bin/sleep", "30"}}));
  EXPECT_THAT(p->Wait(absl::Milliseconds(50)), StatusIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_TRUE(p->Signal(SIGTERM).ok());
  EXPECT_THAT(p->Wait(absl::Seconds(10)), IsOkAndHolds(128 + SIGTERM));
  EXPECT_THAT(p->Signal(SIGKILL), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(LocalProcessTest, DestructorKillsARunningChild) {
  pid_t pid;
  {
    ASSERT_OK_AND_ASSIGN(auto p, LocalProcess::Spawn({{"/bin/sleep", "30"}}));
    pid = p->pid();
  }
  EXPECT_NE(::kill(pid, 0), 0);  // gone and reaped
}

TEST(LocalProcessTest, RejectsMissingExecutable) {
  EXPECT_THAT(LocalProcess::Spawn({{"/no/such/binary"}}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(LocalProcess::Spawn({}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(LocalProcess::Spawn({{"no-such-program-in-path"}}),
              StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("not in PATH")));
  ProcessSpec bad_cwd{{"/bin/true"}};
  bad_cwd.cwd = "/no/such/dir";
  EXPECT_THAT(LocalProcess::Spawn(bad_cwd),
              StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("/no/such/dir")));
}

TEST(LocalProcessTest, FindsProgramsInPathAndRunsInCwd) {
  const std::string dir = ::testing::TempDir();
  const std::string out = dir + "/lp_pwd.txt";
  std::remove(out.c_str());
  ProcessSpec spec{{"sh", "-c", "pwd"}, out};
  spec.cwd = "/tmp";
  ASSERT_OK_AND_ASSIGN(auto p, LocalProcess::Spawn(spec));
  EXPECT_THAT(p->Wait(absl::Seconds(10)), IsOkAndHolds(0));
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "/tmp\n");
}

}  // namespace
}  // namespace malle::cluster
