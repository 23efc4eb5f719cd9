#include "libmalle/cluster/local_process.h"

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

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

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(LocalProcessTest, ExitStatusTellsCodeFromSignal) {
  ASSERT_OK_AND_ASSIGN(auto exited, LocalProcess::Spawn({{"/bin/sh", "-c", "exit 137"}}));
  ASSERT_OK_AND_ASSIGN(ExitStatus e, exited->WaitStatus(absl::Seconds(10)));
  EXPECT_EQ(e.code, 137);
  EXPECT_EQ(e.signal, 0);
  ASSERT_OK_AND_ASSIGN(auto killed, LocalProcess::Spawn({{"/bin/sleep", "30"}}));
  ASSERT_OK_AND_ASSIGN(int shell, killed->Kill());
  EXPECT_EQ(shell, 128 + SIGKILL);
  ASSERT_TRUE(killed->PollStatus().has_value());
  EXPECT_EQ(killed->PollStatus()->signal, SIGKILL);
  EXPECT_EQ(killed->PollStatus()->PythonCode(), -SIGKILL);
}

TEST(LocalProcessTest, RankEnvIsAddedLastAndAnEmptyEnvironmentIsPossible) {
  const std::string out = ::testing::TempDir() + "/lp_env.txt";
  ProcessSpec spec{{"/bin/sh", "-c", "echo \"$MALLE_STORE|$MALLE_JOB_ID|$MALLE_MEMBER_ID|${HOME-unset}\""}, out};
  spec.env = {{"MALLE_JOB_ID", "overridden"}};
  spec.rank_env = RankEnv();
  spec.rank_env->store = "127.0.0.1:1234";
  spec.rank_env->job_id = "j.i1";
  spec.rank_env->member_id = "m1";
  spec.clear_env = true;
  spec.truncate_logs = true;
  ASSERT_OK_AND_ASSIGN(auto p, LocalProcess::Spawn(spec));
  EXPECT_THAT(p->Wait(absl::Seconds(10)), IsOkAndHolds(0));
  EXPECT_EQ(ReadAll(out), "127.0.0.1:1234|j.i1|m1|unset\n");

  spec.rank_env->store = "no-port";
  EXPECT_THAT(LocalProcess::Spawn(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("MALLE_STORE")));
}

TEST(LocalProcessTest, OneLogFileForBothStreamsAndBadPathsAreErrors) {
  const std::string out = ::testing::TempDir() + "/lp_both.txt";
  ProcessSpec spec{{"/bin/sh", "-c", "echo out; echo err >&2"}, out};
  spec.stderr_to_stdout = true;
  spec.truncate_logs = true;
  for (int run = 0; run < 2; ++run) {  // truncated: the second run does not append
    ASSERT_OK_AND_ASSIGN(auto p, LocalProcess::Spawn(spec));
    EXPECT_THAT(p->Wait(absl::Seconds(10)), IsOkAndHolds(0));
  }
  EXPECT_EQ(ReadAll(out), "out\nerr\n");
  ProcessSpec bad{{"/bin/true"}, "/no/such/dir/out.log"};
  EXPECT_THAT(LocalProcess::Spawn(bad),
              StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("/no/such/dir/out.log")));
}

TEST(LocalProcessTest, AGroupSignalReachesWhatTheChildStarted) {
  const std::string pidfile = ::testing::TempDir() + "/lp_grandchild.pid";
  std::remove(pidfile.c_str());
  ProcessSpec spec{{"/bin/sh", "-c", "sleep 30 & echo $! > " + pidfile + "; wait"}};
  spec.new_process_group = true;
  ASSERT_OK_AND_ASSIGN(auto p, LocalProcess::Spawn(spec));
  EXPECT_TRUE(p->leads_group());
  pid_t grandchild = 0;
  for (int i = 0; i < 500 && grandchild == 0; ++i) {
    std::ifstream in(pidfile);
    if (!(in >> grandchild)) grandchild = 0;
    if (grandchild == 0) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(grandchild, 0);
  ASSERT_EQ(::kill(grandchild, 0), 0);
  ASSERT_TRUE(p->Signal(SIGTERM).ok());
  EXPECT_THAT(p->Wait(absl::Seconds(10)), IsOkAndHolds(128 + SIGTERM));
  // The grandchild got the SIGTERM too (it is reparented and reaped by init;
  // give it a moment to go).
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = ::kill(grandchild, 0) != 0;
    if (!gone) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(gone) << "grandchild " << grandchild << " survived the group signal";
}

}  // namespace
}  // namespace malle::cluster
