#include "libmalle/cluster/rank_env.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::cluster {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::malle::testing::StatusIs;

EnvLookup From(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

TEST(RankEnvTest, ReadsEveryVariable) {
  auto env = ReadRankEnv(From({{"MALLE_STORE", "10.0.0.2:29400"},
                               {"MALLE_JOB_ID", "digits.i2"},
                               {"MALLE_MEMBER_ID", "n3-1"},
                               {"MALLE_BOOTSTRAP_SIZE", "1"},
                               {"MALLE_CONTROL_JOB", "digits"},
                               {"MALLE_CONTROL_SECRET", "/run/secret"},
                               {"MALLE_NODE", "n3"},
                               {"MALLE_MIN_NODES", "1"},
                               {"MALLE_MAX_NODES", "4"},
                               {"MALLE_BACKEND", "nccl"},
                               {"MALLE_PARK_DIR", "/shared/park/digits"},
                               {"LOCAL_RANK", "2"},
                               {"LOCAL_WORLD_SIZE", "4"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->store_host(), "10.0.0.2");
  EXPECT_EQ(env->store_port(), 29400);
  EXPECT_EQ(env->job_id, "digits.i2");
  EXPECT_EQ(env->member_id, "n3-1");
  EXPECT_EQ(env->bootstrap_size, 1);
  EXPECT_EQ(env->control_job, "digits");
  EXPECT_EQ(env->control_secret, "/run/secret");
  EXPECT_EQ(env->node, "n3");
  EXPECT_EQ(env->min_nodes, 1);
  EXPECT_EQ(env->max_nodes, 4);
  EXPECT_EQ(env->backend, "nccl");
  EXPECT_EQ(env->park_dir, "/shared/park/digits");
  EXPECT_EQ(env->local_rank, 2);
  EXPECT_EQ(env->local_world_size, 4);
}

TEST(RankEnvTest, DefaultsWhenOnlyTheStoreIsGiven) {
  auto env = ReadRankEnv(From({{"MALLE_STORE", "127.0.0.1:5"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->job_id, "local");
  EXPECT_EQ(env->member_id, "");
  EXPECT_EQ(env->bootstrap_size, 0);
  EXPECT_EQ(env->control_job, "");
  EXPECT_EQ(env->max_nodes, 0);
  EXPECT_EQ(env->local_rank, 0);
  EXPECT_EQ(env->local_world_size, 0);
}

TEST(RankEnvTest, LocalRankAndSizeRoundTrip) {
  // A node agent with 3 slots starts its third rank.
  RankEnv env;
  env.store = "127.0.0.1:4000";
  env.local_rank = 2;
  env.local_world_size = 3;
  const auto vars = RankEnvVars(env);
  std::map<std::string, std::string> m(vars.begin(), vars.end());
  EXPECT_EQ(m.at("LOCAL_RANK"), "2");
  EXPECT_EQ(m.at("LOCAL_WORLD_SIZE"), "3");
  auto back = ReadRankEnv(From(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->local_rank, 2);
  EXPECT_EQ(back->local_world_size, 3);
}

TEST(RankEnvTest, WritesWhatItReads) {
  RankEnv env;
  env.store = "127.0.0.1:4000";
  env.job_id = "j.i0";
  env.member_id = "node0";
  env.bootstrap_size = 2;
  env.control_job = "j";
  env.max_nodes = 8;
  const auto vars = RankEnvVars(env);
  std::map<std::string, std::string> m(vars.begin(), vars.end());
  EXPECT_EQ(m.size(), 6u);  // the defaults (min nodes, node, secret, backend) are not written
  auto back = ReadRankEnv(From(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->store, env.store);
  EXPECT_EQ(back->job_id, env.job_id);
  EXPECT_EQ(back->member_id, env.member_id);
  EXPECT_EQ(back->bootstrap_size, 2);
  EXPECT_EQ(back->control_job, "j");
  EXPECT_EQ(back->max_nodes, 8);
  EXPECT_EQ(back->min_nodes, 0);
}

TEST(RankEnvTest, BadInputNamesTheVariable) {
  struct Case {
    std::map<std::string, std::string> vars;
    std::string want;
  };
  const Case cases[] = {
      {{}, "MALLE_STORE: no control store given"},
      {{{"MALLE_STORE", "localhost"}}, "MALLE_STORE: expected 'host:port'"},
      {{{"MALLE_STORE", "h:0"}}, "MALLE_STORE: expected 'host:port'"},
      {{{"MALLE_STORE", "h:70000"}}, "MALLE_STORE: expected 'host:port'"},
      {{{"MALLE_STORE", ":80"}}, "MALLE_STORE: expected 'host:port'"},
      {{{"MALLE_STORE", "h:1"}, {"MALLE_BOOTSTRAP_SIZE", "two"}}, "MALLE_BOOTSTRAP_SIZE: must be a non-negative"},
      {{{"MALLE_STORE", "h:1"}, {"MALLE_BOOTSTRAP_SIZE", "-1"}}, "MALLE_BOOTSTRAP_SIZE: must be a non-negative"},
      {{{"MALLE_STORE", "h:1"}, {"MALLE_MAX_NODES", "1.5"}}, "MALLE_MAX_NODES: must be a non-negative"},
      {{{"MALLE_STORE", "h:1"}, {"MALLE_MIN_NODES", "3"}, {"MALLE_MAX_NODES", "2"}},
       "MALLE_MIN_NODES=3 is larger than MALLE_MAX_NODES=2"},
      {{{"MALLE_STORE", "h:1"}, {"MALLE_BACKEND", "mpi"}}, "MALLE_BACKEND: must be 'gloo' or 'nccl'"},
      {{{"MALLE_STORE", "h:1"}, {"MALLE_JOB_ID", "a/b"}}, "MALLE_JOB_ID: 'a/b' has a character outside"},
      {{{"MALLE_STORE", "h:1"}, {"MALLE_MEMBER_ID", std::string(129, 'x')}}, "MALLE_MEMBER_ID: must be 1..128"},
      {{{"MALLE_STORE", "h:1"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
       "LOCAL_RANK=2: must be in [0, LOCAL_WORLD_SIZE=2)"},
      {{{"MALLE_STORE", "h:1"}, {"LOCAL_RANK", "1"}}, "LOCAL_RANK=1: must be in [0, LOCAL_WORLD_SIZE=0)"},
      {{{"MALLE_STORE", "h:1"}, {"LOCAL_RANK", "-1"}}, "LOCAL_RANK: must be a non-negative"},
      {{{"MALLE_STORE", "h:1"}, {"LOCAL_WORLD_SIZE", "x"}}, "LOCAL_WORLD_SIZE: must be a non-negative"},
  };
  for (const Case& c : cases) {
    auto env = ReadRankEnv(From(c.vars));
    ASSERT_FALSE(env.ok()) << c.want;
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(env.status().message()), HasSubstr(c.want));
  }
}

TEST(RankEnvTest, NamesListEveryVariableOnce) {
  const auto names = RankEnvNames();
  EXPECT_EQ(names.size(), 13u);
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
}

TEST(RankEnvTest, ToolVariablesAreNotRankVariables) {
  // A starter clears or sets RankEnvNames() for a rank; the tools' own
  // variables must not be caught up in that.
  const auto names = RankEnvNames();
  for (const char* tool : {kEnvSecret, kEnvLogLevel, kEnvBinDir}) {
    EXPECT_EQ(std::count(names.begin(), names.end(), tool), 0) << tool;
    EXPECT_THAT(tool, MatchesRegex("MALLE_[A-Z_]+"));
  }
}

TEST(RankEnvTest, GeneratedMemberIdIsAValidId) {
  const std::string id = GeneratedMemberId();
  EXPECT_THAT(id, MatchesRegex("[A-Za-z0-9-]+-[0-9]+-[0-9a-f]{8}"));
  RankEnv env;
  env.store = "h:1";
  env.member_id = id;
  EXPECT_TRUE(env.Validate().ok());
}

// --- the launchers users already have (ReadLaunchEnv) -----------------------

TEST(LaunchEnvTest, TorchrunWithItsAgentStore) {
  ASSERT_OK_AND_ASSIGN(LaunchEnv env, ReadLaunchEnv(From({{"RANK", "1"},
                                                           {"WORLD_SIZE", "2"},
                                                           {"LOCAL_RANK", "1"},
                                                           {"LOCAL_WORLD_SIZE", "2"},
                                                           {"MASTER_ADDR", "localhost"},
                                                           {"MASTER_PORT", "43367"},
                                                           {"TORCHELASTIC_RUN_ID", "2c2c-3c8a"},
                                                           {"TORCHELASTIC_RESTART_COUNT", "0"},
                                                           {"TORCHELASTIC_USE_AGENT_STORE", "True"}})));
  EXPECT_EQ(env.launcher, Launcher::kTorchrun);
  EXPECT_EQ(env.global_rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.rank.store, "localhost:43367");
  EXPECT_EQ(env.rank.bootstrap_size, 2);  // a fixed-size job
  EXPECT_EQ(env.rank.job_id, "torchrun-2c2c-3c8a-r0");
  EXPECT_EQ(env.rank.member_id, "rank1");
  EXPECT_EQ(env.rank.local_rank, 1);  // torchrun's own LOCAL_RANK / LOCAL_WORLD_SIZE
  EXPECT_EQ(env.rank.local_world_size, 2);
  EXPECT_FALSE(env.host_store);  // torchrun's agent hosts it
}

TEST(LaunchEnvTest, EnvConventionWithoutAgentStoreRankZeroHosts) {
  auto vars = std::map<std::string, std::string>{
      {"RANK", "0"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}};
  ASSERT_OK_AND_ASSIGN(LaunchEnv env, ReadLaunchEnv(From(vars)));
  EXPECT_TRUE(env.host_store);
  EXPECT_EQ(env.store_bind, "10.1.2.3");
  EXPECT_EQ(env.rank.job_id, "torch-env");
  vars["RANK"] = "2";
  ASSERT_OK_AND_ASSIGN(env, ReadLaunchEnv(From(vars)));
  EXPECT_FALSE(env.host_store);
  vars["RANK"] = "0";
  vars["MASTER_ADDR"] = "node07";  // a name: the host listens on every interface
  ASSERT_OK_AND_ASSIGN(env, ReadLaunchEnv(From(vars)));
  EXPECT_EQ(env.store_bind, "0.0.0.0");
}

TEST(LaunchEnvTest, MalleVariablesComeFirst) {
  // malletrain local inside a Slurm allocation, or started by torchrun: its own contract wins.
  ASSERT_OK_AND_ASSIGN(LaunchEnv env, ReadLaunchEnv(From({{"MALLE_STORE", "127.0.0.1:5"},
                                                           {"MALLE_MEMBER_ID", "node3"},
                                                           {"RANK", "1"},
                                                           {"WORLD_SIZE", "2"},
                                                           {"SLURM_PROCID", "0"},
                                                           {"SLURM_STEP_ID", "0"}})));
  EXPECT_EQ(env.launcher, Launcher::kMalle);
  EXPECT_EQ(env.rank.store, "127.0.0.1:5");
  EXPECT_EQ(env.rank.member_id, "node3");
  EXPECT_EQ(env.global_rank, -1);
  EXPECT_FALSE(env.host_store);
  // Without MALLE_STORE, the other MALLE_* variables still apply on top of torchrun's.
  ASSERT_OK_AND_ASSIGN(env, ReadLaunchEnv(From({{"RANK", "0"},
                                                 {"WORLD_SIZE", "2"},
                                                 {"MASTER_ADDR", "127.0.0.1"},
                                                 {"MASTER_PORT", "29500"},
                                                 {"MALLE_JOB_ID", "mine"},
                                                 {"MALLE_BACKEND", "nccl"},
                                                 {"SLURM_PROCID", "1"},
                                                 {"SLURM_STEP_ID", "0"}})));
  EXPECT_EQ(env.launcher, Launcher::kTorchrun);  // torchrun before srun (srun starting torchrun)
  EXPECT_EQ(env.global_rank, 0);
  EXPECT_EQ(env.rank.job_id, "mine");
  EXPECT_EQ(env.rank.backend, "nccl");
}

TEST(LaunchEnvTest, SrunDerivesTheStoreFromTheStep) {
  auto vars = std::map<std::string, std::string>{
      {"SLURM_PROCID", "0"},       {"SLURM_NTASKS", "8"},      {"SLURM_STEP_NUM_TASKS", "4"},
      {"SLURM_LOCALID", "0"},      {"SLURM_NODEID", "0"},      {"SLURM_JOB_ID", "123456"},
      {"SLURM_STEP_ID", "2"},      {"SLURM_STEP_NODELIST", "nid00[0100-0101],login1"},
      {"SLURM_JOB_NODELIST", "x"}};
  ASSERT_OK_AND_ASSIGN(LaunchEnv env, ReadLaunchEnv(From(vars)));
  EXPECT_EQ(env.launcher, Launcher::kSlurm);
  EXPECT_EQ(env.world_size, 4);  // the step's tasks, not the allocation's
  EXPECT_EQ(env.global_rank, 0);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.rank.store, absl::StrCat("nid000100:", SlurmStorePort(123456, 2)));
  EXPECT_EQ(SlurmStorePort(123456, 2), 10000 + (123456 * 8 + 2) % 20000);
  EXPECT_EQ(env.rank.job_id, "slurm-123456.2");
  EXPECT_EQ(env.rank.member_id, "task0");
  EXPECT_EQ(env.rank.bootstrap_size, 4);
  EXPECT_TRUE(env.host_store);
  EXPECT_EQ(env.store_bind, "0.0.0.0");
  vars["SLURM_PROCID"] = "3";
  vars["SLURM_NODEID"] = "1";
  ASSERT_OK_AND_ASSIGN(env, ReadLaunchEnv(From(vars)));
  EXPECT_FALSE(env.host_store);
  EXPECT_EQ(env.rank.member_id, "task3");
  // MASTER_ADDR / MASTER_PORT (set by the batch script) win over the derivation.
  vars["MASTER_ADDR"] = "127.0.0.1";
  vars["MASTER_PORT"] = "29555";
  ASSERT_OK_AND_ASSIGN(env, ReadLaunchEnv(From(vars)));
  EXPECT_EQ(env.rank.store, "127.0.0.1:29555");
  // A node's tasks get LOCAL_RANK / LOCAL_WORLD_SIZE (a GPU each on NCCL) from
  // SLURM_LOCALID and the step's tasks on this node; without the list, none.
  EXPECT_EQ(env.rank.local_world_size, 0);
  vars["SLURM_LOCALID"] = "1";
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  ASSERT_OK_AND_ASSIGN(env, ReadLaunchEnv(From(vars)));
  EXPECT_EQ(env.rank.local_rank, 1);
  EXPECT_EQ(env.rank.local_world_size, 2);
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x";
  EXPECT_THAT(ReadLaunchEnv(From(vars)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("SLURM_STEP_TASKS_PER_NODE")));
}

TEST(LaunchEnvTest, SlurmPortsStayBelowTheEphemeralRange) {
  std::set<int> ports;
  for (int64_t job : std::vector<int64_t>{0, 1, 2, 2499, 99999, int64_t{1} << 39}) {
    for (int64_t step = 0; step < 8; ++step) {
      const int p = SlurmStorePort(job, step);
      EXPECT_GE(p, 10000);
      EXPECT_LE(p, 29999);
      ports.insert(p);
    }
  }
  EXPECT_EQ(ports.size(), 6u * 8 - 8);  // 2499 and 99999 differ by a multiple of 2500: alike
}

TEST(LaunchEnvTest, SlurmTasksOnNode) {
  EXPECT_EQ(*SlurmTasksOnNode("4", 0), 4);
  EXPECT_EQ(*SlurmTasksOnNode("2(x3),1", 0), 2);
  EXPECT_EQ(*SlurmTasksOnNode("2(x3),1", 2), 2);
  EXPECT_EQ(*SlurmTasksOnNode("2(x3),1", 3), 1);
  EXPECT_THAT(SlurmTasksOnNode("2(x3),1", 4), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("beyond")));
  for (const char* bad : {"", "x", "0", "2(x0)", "2(x3", "2(3)", "-1"}) {
    EXPECT_THAT(SlurmTasksOnNode(bad, 0), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed")))
        << bad;
  }
}

TEST(LaunchEnvTest, FirstSlurmHost) {
  EXPECT_EQ(*FirstSlurmHost("vm"), "vm");
  EXPECT_EQ(*FirstSlurmHost("n[01-04,07],gpu3"), "n01");
  EXPECT_EQ(*FirstSlurmHost("r[2-3]-n[5,9]"), "r2-n5");
  EXPECT_EQ(*FirstSlurmHost("nid00[0100]"), "nid000100");
  for (const char* bad : {"", "n[", "n]1", "n[a-b]", "[]", ",n1", "bad host"}) {
    EXPECT_THAT(FirstSlurmHost(bad).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hostlist")))
        << bad;
  }
}

TEST(LaunchEnvTest, InconsistentInputGetsAnErrorNamingTheVariable) {
  struct Case {
    std::map<std::string, std::string> vars;
    std::string error;
  };
  const std::map<std::string, std::string> torch = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto with = [&](std::map<std::string, std::string> base, std::map<std::string, std::string> change) {
    for (auto& [k, v] : change) {
      if (v.empty()) {
        base.erase(k);
      } else {
        base[k] = v;
      }
    }
    return base;
  };
  const std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "0"},   {"SLURM_NTASKS", "2"},
                                                    {"SLURM_JOB_ID", "77"},  {"SLURM_STEP_ID", "0"},
                                                    {"SLURM_NODEID", "0"},   {"SLURM_STEP_NODELIST", "n[1-2]"}};
  const std::vector<Case> cases = {
      {with(torch, {{"RANK", "2"}}), "RANK=2 is not below WORLD_SIZE=2"},
      {with(torch, {{"RANK", "-1"}}), "RANK: must be an integer in [0,"},
      {with(torch, {{"WORLD_SIZE", "0"}}), "WORLD_SIZE: must be an integer in [1,"},
      {with(torch, {{"WORLD_SIZE", "two"}}), "WORLD_SIZE: must be an integer"},
      {with(torch, {{"MASTER_ADDR", ""}}), "WORLD_SIZE=2 is set but MASTER_ADDR is not"},
      {with(torch, {{"MASTER_PORT", ""}}), "MASTER_PORT is not set"},
      {with(torch, {{"MASTER_PORT", "0"}}), "MASTER_PORT: must be an integer in [1, 65535], got '0'"},
      {with(torch, {{"RANK", ""}}), "RANK is not set"},
      {with(torch, {{"WORLD_SIZE", ""}}), "WORLD_SIZE is not set"},
      {with(torch, {{"LOCAL_RANK", "x"}}), "LOCAL_RANK: must be a non-negative integer"},
      {with(torch, {{"MALLE_BOOTSTRAP_SIZE", "3"}}), "MALLE_BOOTSTRAP_SIZE=3 contradicts the torchrun job's world size 2"},
      {with(torch, {{"MALLE_JOB_ID", "a b"}}), "MALLE_JOB_ID"},
      {with(slurm, {{"SLURM_PROCID", "2"}}), "SLURM_PROCID=2 is not below SLURM_NTASKS=2"},
      {with(slurm, {{"SLURM_NTASKS", ""}}), "SLURM_NTASKS is not set"},
      {with(slurm, {{"SLURM_JOB_ID", ""}}), "SLURM_JOB_ID is not set"},
      {with(slurm, {{"SLURM_STEP_NODELIST", "n[1-"}}), "SLURM_STEP_NODELIST: hostlist 'n[1-'"},
      {with(slurm, {{"SLURM_STEP_NODELIST", ""}}), "no host for the control store"},
      {with(slurm, {{"SLURM_NODEID", "1"}}), "SLURM_PROCID=0 runs on SLURM_NODEID=1, not on the first node"},
      {with(slurm, {{"MASTER_PORT", "70000"}}), "MASTER_PORT: must be an integer in [1, 65535]"},
      {{}, "MALLE_STORE: no control store given"},
  };
  for (const Case& c : cases) {
    auto env = ReadLaunchEnv(From(c.vars));
    EXPECT_THAT(env.status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error))) << c.error;
  }
  // Nothing at all names every launcher it looked for.
  EXPECT_THAT(ReadLaunchEnv(From({})).status().message(), HasSubstr("torchrun (RANK, WORLD_SIZE"));
  // A batch script (SLURM_PROCID but no step) is not an srun step.
  EXPECT_THAT(ReadLaunchEnv(From(with(slurm, {{"SLURM_STEP_ID", ""}}))).status().message(),
              HasSubstr("no control store given"));
}

}  // namespace
}  // namespace malle::cluster
