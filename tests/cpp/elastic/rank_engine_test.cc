// CreateRankEngine: what a rank's environment gives its engine (park store,
// backend, node range, the allocator's report sink), and that bad input is
// refused by name before the control store is dialled.
#include "libmalle/elastic/rank_engine.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/time/clock.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/control/wire/secret.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::elastic {
namespace {

using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

// A new directory, removed when the test ends.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& name) {
    std::string tmpl = ::testing::TempDir() + "/rank_engine_" + name + "_XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

cluster::EnvLookup Lookup(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

RankEngineOptions Options() {
  RankEngineOptions o;
  o.engine.logical_workers = 2;
  o.group.rendezvous_timeout = absl::Seconds(5);
  return o;
}

TEST(CreateRankEngineTest, TheEnvironmentGivesTheParkStoreNodeRangeAndReportSink) {
  auto server = comm::ControlStore::Host("127.0.0.1", 0);
  ASSERT_OK(server.status());
  TempDir tmp("env");
  const std::string& dir = tmp.path;
  const std::string secret = dir + "/secret";
  ASSERT_OK(control::WriteNewSecret(secret));
  cluster::RankEnv env;
  env.store = "127.0.0.1:" + std::to_string((*server)->port());
  env.job_id = "digits.i1";
  env.member_id = "w0";
  env.min_nodes = 2;
  env.max_nodes = 3;
  env.local_world_size = 2;
  env.park_dir = dir + "/park";
  env.control_job = "digits";
  env.control_secret = secret;
  absl::StatusOr<std::unique_ptr<Engine>> e =
      CreateRankEngine(env, Options(), Lookup({{"MALLE_REPORT_INTERVAL", "0.5"}}));
  ASSERT_OK(e.status());
  const EngineOptions& o = (*e)->options();
  EXPECT_EQ(o.backend, "gloo");
  EXPECT_EQ(o.min_nodes, 2);
  EXPECT_EQ(o.max_nodes, 3);
  EXPECT_EQ(o.ranks_per_node, 2);
  EXPECT_EQ(o.advisor_job, "digits");
  EXPECT_EQ(o.report_interval, absl::Milliseconds(500));
  EXPECT_FALSE(o.secret.empty());
  ASSERT_NE(o.park_store, nullptr);
  EXPECT_THAT(o.park_store->where(), HasSubstr("/park"));
  EXPECT_NE(o.report_sink, nullptr);
  EXPECT_EQ((*e)->member_id(), "w0");
  EXPECT_EQ((*e)->job_id(), "digits.i1");

  // Without the allocator (no control job) and no park dir: neither.
  cluster::RankEnv plain;
  plain.store = env.store;
  plain.job_id = "plain";
  absl::StatusOr<std::unique_ptr<Engine>> p = CreateRankEngine(plain, Options(), Lookup({}));
  ASSERT_OK(p.status());
  EXPECT_EQ((*p)->options().park_store, nullptr);
  EXPECT_EQ((*p)->options().report_sink, nullptr);
  EXPECT_FALSE((*p)->member_id().empty()) << "a member id is made up";
}

TEST(CreateRankEngineTest, BadInputIsNamedBeforeTheStoreIsDialled) {
  // Nothing listens at this store: an error other than the one wanted would
  // come only after the rendezvous timeout (a minute).
  cluster::RankEnv env;
  env.store = "127.0.0.1:1";
  env.job_id = "bad";
  RankEngineOptions slow = Options();
  slow.group.rendezvous_timeout = absl::Seconds(60);
  struct Case {
    std::map<std::string, std::string> vars;
    std::function<void(cluster::RankEnv&, RankEngineOptions&)> edit;
    std::string want;
  };
  const Case cases[] = {
      {{{"MALLE_REPORT_INTERVAL", "soon"}}, nullptr, "MALLE_REPORT_INTERVAL: not a positive number"},
      {{{"MALLE_REPORT_INTERVAL", "-1"}}, nullptr, "MALLE_REPORT_INTERVAL: not a positive number"},
      {{{"MALLE_STATE_DIRECT_MIN_BYTES", "1MB"}}, nullptr, "MALLE_STATE_DIRECT_MIN_BYTES: not an integer"},
      {{}, [](cluster::RankEnv& e, RankEngineOptions&) { e.control_secret = "/nonexistent/secret"; },
       "MALLE_CONTROL_SECRET"},
      {{}, [](cluster::RankEnv& e, RankEngineOptions&) { e.bootstrap_size = 3; },
       "logical_workers: 2 is smaller than the job's starting size 3"},
      {{}, [](cluster::RankEnv& e, RankEngineOptions&) { e.backend = "mpi"; }, "MALLE_BACKEND"},
      {{}, [](cluster::RankEnv&, RankEngineOptions& o) { o.engine.logical_workers = -1; }, "logical_workers"},
  };
  for (const Case& c : cases) {
    cluster::RankEnv e = env;
    RankEngineOptions o = slow;
    if (c.edit) c.edit(e, o);
    const absl::Time t0 = absl::Now();
    absl::StatusOr<std::unique_ptr<Engine>> got = CreateRankEngine(e, o, Lookup(c.vars));
    EXPECT_THAT(got.status(), StatusIs(::testing::_, HasSubstr(c.want))) << c.want;
    EXPECT_NE(got.status().code(), absl::StatusCode::kUnavailable) << c.want;
    EXPECT_LT(absl::Now() - t0, absl::Seconds(10)) << c.want << ": the store was dialled first";
  }
}

}  // namespace
}  // namespace malle::elastic
