// cluster::Zygote without Python: fake interpreters (shell scripts) that fail, exit or never
// get ready, so that the client's side of the protocol is tested on its own. The real zygote
// (python/malletrain/_zygote.py) is tested against cold starts in tests/python/test_zygote.py.
#include "libmalle/cluster/zygote.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/cluster/local_process.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::cluster {
namespace {

using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

// An executable shell script standing in for the interpreter: it is run as
// `<path> -m malletrain._zygote --fd=N --preload=...` ($3 names the socket).
std::string FakePython(const std::string& name, const std::string& body) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << "#!/bin/bash\n" << body << "\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

TEST(ZygoteTest, ImportTimeVariablesAreTheOnesReadAtStartOrImport) {
  for (const char* name : {"PYTHONPATH", "PYTHONHASHSEED", "LD_PRELOAD", "LANG", "LC_ALL", "HOME",
                           "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCH_LOGS",
                           "TORCHINDUCTOR_CACHE_DIR", "PYTORCH_CUDA_ALLOC_CONF", "MALLOC_ARENA_MAX",
                           "MALLE_LOG_LEVEL"}) {
    EXPECT_TRUE(ImportTimeVariable(name)) << name;
  }
  // Read when used, after the fork: the rank environment, devices, NCCL, the user's own.
  for (const char* name : {"MALLE_STORE", "MALLE_MEMBER_ID", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES",
                           "NCCL_DEBUG", "PATH", "MY_JOB_SETTING"}) {
    EXPECT_FALSE(ImportTimeVariable(name)) << name;
  }
}

TEST(ZygoteTest, BadOptionsAreRefused) {
  ZygoteOptions o;
  EXPECT_THAT(Zygote::Start(o).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("python")));
  o.python = "/bin/sh";
  o.preload = {"torch", "bad name"};
  EXPECT_THAT(Zygote::Start(o).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad name")));
  o.preload = {"torch"};
  o.python = "no-such-python-for-the-zygote-test";
  EXPECT_THAT(Zygote::Start(o).status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("not in PATH")));
}

TEST(ZygoteTest, AFailedImportIsReportedAndProcessesStartCold) {
  ZygoteOptions o;
  // Says "failed <why>" on its socket, as the real one does when a preload fails.
  o.python = FakePython("fails.sh", "fd=${3#--fd=}\nprintf 'failed\\000import torch: boom' >&$fd\nexit 1");
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Zygote> z, Zygote::Start(o));
  EXPECT_THAT(z->WaitReady(absl::Seconds(30)), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("boom")));
  EXPECT_FALSE(z->Ready());
  EXPECT_THAT(z->failure(), HasSubstr("import torch: boom"));
  ProcessSpec spec{{o.python, "script.py"}};
  spec.zygote = z;
  ASSERT_OK_AND_ASSIGN(auto p, LocalProcess::Spawn(spec));  // the fake runs as a plain program
  EXPECT_FALSE(p->warm());
  EXPECT_THAT(p->cold_reason(), HasSubstr("unusable: import torch: boom"));
  EXPECT_TRUE(p->Wait(absl::Seconds(30)).ok());
}

TEST(ZygoteTest, AZygoteThatDiesBeforeItIsReadySaysSo) {
  ZygoteOptions o;
  o.python = FakePython("exits.sh", "exit 3");
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Zygote> z, Zygote::Start(o));
  EXPECT_THAT(z->WaitReady(absl::Seconds(30)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("exited (status 3)")));
}

TEST(ZygoteTest, NotReadyYetMeansColdAndTheDestructorKillsIt) {
  ZygoteOptions o;
  o.python = FakePython("slow.sh", "exec sleep 60");
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Zygote> z, Zygote::Start(o));
  const pid_t pid = z->pid();
  EXPECT_THAT(z->WaitReady(absl::Milliseconds(100)), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(z->failure(), "");
  ProcessSpec spec{{"/bin/true"}};
  spec.zygote = z;
  ASSERT_OK_AND_ASSIGN(auto p, LocalProcess::Spawn(spec));
  EXPECT_FALSE(p->warm());
  EXPECT_THAT(p->cold_reason(), HasSubstr("not ready yet"));
  EXPECT_TRUE(p->Wait(absl::Seconds(30)).ok());
  spec.zygote.reset();
  z.reset();  // the last reference: kills the zygote (SIGKILL) and reaps it
  EXPECT_NE(::kill(pid, 0), 0);
}

}  // namespace
}  // namespace malle::cluster
