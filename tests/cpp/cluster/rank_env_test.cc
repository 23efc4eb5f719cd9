#include "libmalle/cluster/rank_env.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::cluster {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

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

}  // namespace
}  // namespace malle::cluster
