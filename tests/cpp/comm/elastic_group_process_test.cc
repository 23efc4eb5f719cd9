// Real processes (malle-elastic-worker) on loopback: planned resizes, joins
// mid-step, kill -9 (in an allreduce, of the leader, of two at once), a member
// frozen with SIGSTOP. Each worker checks every allreduce result exactly and
// exits 3 if one is wrong; survivors must end with the same state checksum and
// the same member list. Every wait is bounded; TearDown kills leftovers by pid.
#include <signal.h>
#include <stdlib.h>

#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "libmalle/cluster/local_process.h"
#include "libmalle/comm/elastic_group.h"
#include "nlohmann/json.hpp"

namespace malle::comm {
namespace {

using cluster::LocalProcess;
using nlohmann::json;
using ::testing::Contains;
using ::testing::Not;

constexpr absl::Duration kWait = absl::Seconds(40);

class ElasticProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, ControlStore::Host("127.0.0.1", 0));
    char dir[] = "/tmp/malle-elastic-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    job_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  void TearDown() override {
    for (auto& [member, process] : procs_) {
      if (!process->Poll().has_value()) {
        ADD_FAILURE() << member << " (pid " << process->pid() << ") was still running; killed";
        (void)process->Kill();
      }
    }
    if (HasFailure()) {
      for (auto& [member, process] : procs_) {
        std::ifstream err(Path(member, "err"));
        std::stringstream text;
        text << err.rdbuf();
        std::string s = text.str();
        if (s.size() > 3000) s = s.substr(s.size() - 3000);
        std::cerr << "---- " << member << " stderr (tail) ----\n" << s;
      }
    }
  }

  std::string Path(const std::string& member, const std::string& ext) const {
    return absl::StrCat(dir_, "/", member, ".", ext);
  }

  // Default liveness settings are generous: tests that are not about hangs
  // must not see a loaded 2-core machine as a frozen peer.
  void Start(const std::string& member, std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {MALLE_WORKER_PATH,
                                     absl::StrCat("--store=127.0.0.1:", store_->port()),
                                     absl::StrCat("--job=", job_),
                                     absl::StrCat("--member=", member),
                                     absl::StrCat("--events=", Path(member, "jsonl")),
                                     "--heartbeat_timeout_ms=4000",
                                     "--grace_ms=300",
                                     "--rendezvous_timeout_s=30"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto p = LocalProcess::Spawn({argv, "", Path(member, "err"), {{"MALLE_LOG_LEVEL", "warning"}}});
    ASSERT_TRUE(p.ok()) << p.status();
    procs_[member] = *std::move(p);
  }

  void Bootstrap(int n, std::vector<std::string> flags = {}) {
    flags.push_back(absl::StrCat("--bootstrap=", n));
    for (int i = 0; i < n; ++i) Start(absl::StrCat("w", i), flags);
    for (int i = 0; i < n; ++i) {
      WaitFor(absl::StrCat("w", i), [](const json& e) { return e["ev"] == "transition" && e["gen"] == 0; });
    }
  }

  std::vector<json> Events(const std::string& member) {
    std::vector<json> events;
    std::ifstream in(Path(member, "jsonl"));
    std::string line;
    while (std::getline(in, line)) {
      json e = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!e.is_discarded()) events.push_back(std::move(e));
    }
    return events;
  }

  std::vector<json> Transitions(const std::string& member) {
    std::vector<json> out;
    for (json& e : Events(member)) {
      if (e["ev"] == "transition") out.push_back(std::move(e));
    }
    return out;
  }

  // Polls the member's events until one matches; fails the test on timeout.
  json WaitFor(const std::string& member, const std::function<bool(const json&)>& match,
               absl::Duration timeout = kWait) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      for (const json& e : Events(member)) {
        if (e.value("ev", "") == "mismatch") ADD_FAILURE() << member << ": " << e.dump();
        if (match(e)) return e;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "timed out waiting on " << member;
    return json();
  }

  // Waits for a generation newer than the last one waited for on `member`
  // that has `size` members.
  json WaitForSize(const std::string& member, int size) {
    const int64_t after = last_gen_[member];
    json t = WaitFor(member, [size, after](const json& e) {
      return e["ev"] == "transition" && e["size"] == size && e["gen"].get<int64_t>() > after;
    });
    if (t.contains("gen")) last_gen_[member] = t["gen"].get<int64_t>();
    return t;
  }

  void RequestLeave(const std::string& member) {
    ASSERT_OK(ElasticGroup::RequestLeave(*store_, job_, member));
  }

  void Signal(const std::string& member, int sig) { ASSERT_OK(procs_.at(member)->Signal(sig)); }

  int WaitExit(const std::string& member) {
    auto code = procs_.at(member)->Wait(kWait);
    EXPECT_TRUE(code.ok()) << member << ": " << code.status();
    return code.ok() ? *code : -1;
  }

  // Stops the job and checks every finishing member ends with the same state
  // and the same view of the group.
  void StopAndCheck(const std::vector<std::string>& survivors, int64_t max_redone) {
    ASSERT_OK(store_->WithPrefix(JobPrefix(job_))->Set("ctl/stop", "1"));
    std::optional<json> first;
    for (const std::string& m : survivors) {
      EXPECT_EQ(WaitExit(m), 0) << m;
      json done = WaitFor(m, [](const json& e) { return e["ev"] == "done"; }, absl::Seconds(5));
      EXPECT_EQ(done["how"], "finished") << m;
      EXPECT_LE(done["redone"].get<int64_t>(), max_redone) << m;
      if (!first) {
        first = done;
        continue;
      }
      EXPECT_EQ(done["checksum"], (*first)["checksum"]) << m << " diverged";
      EXPECT_EQ(done["members"], (*first)["members"]) << m;
      EXPECT_EQ(done["gen"], (*first)["gen"]) << m;
    }
    ASSERT_TRUE(first.has_value());
    std::vector<std::string> final_members = (*first)["members"];
    EXPECT_THAT(final_members, ::testing::UnorderedElementsAreArray(survivors));
  }

  std::shared_ptr<ControlStore> store_;
  std::string dir_;
  std::string job_;
  std::map<std::string, std::unique_ptr<LocalProcess>> procs_;
  std::map<std::string, int64_t> last_gen_;  // defaults to 0: generation 0 is the bootstrap
};

std::vector<int> Sizes(const std::vector<json>& transitions) {
  std::vector<int> sizes;
  for (const json& t : transitions) sizes.push_back(t["size"]);
  return sizes;
}

bool IsSubsequence(const std::vector<int>& needle, const std::vector<int>& hay) {
  size_t i = 0;
  for (int x : hay) {
    if (i < needle.size() && needle[i] == x) ++i;
  }
  return i == needle.size();
}

TEST_F(ElasticProcessTest, PlannedSequence_4_2_3_4_1_3) {
  Bootstrap(4);
  RequestLeave("w1");
  RequestLeave("w2");
  WaitForSize("w0", 2);
  Start("w4");
  WaitForSize("w0", 3);
  Start("w5");
  WaitForSize("w0", 4);
  for (const char* m : {"w3", "w4", "w5"}) RequestLeave(m);
  WaitForSize("w0", 1);
  Start("w6");
  Start("w7");
  WaitForSize("w0", 3);
  for (const char* m : {"w1", "w2", "w3", "w4", "w5"}) {
    EXPECT_EQ(WaitExit(m), 0) << m;
    EXPECT_EQ(WaitFor(m, [](const json& e) { return e["ev"] == "done"; })["how"], "left") << m;
  }
  StopAndCheck({"w0", "w6", "w7"}, /*max_redone=*/0);
  const std::vector<json> seen = Transitions("w0");
  EXPECT_TRUE(IsSubsequence({4, 2, 3, 4, 1, 3}, Sizes(seen))) << ::testing::PrintToString(Sizes(seen));
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_EQ(seen[i]["kind"], "planned") << seen[i].dump();
  // Every generation's members agree: each member saw the same list.
  for (const json& t : Transitions("w6")) {
    bool found = false;
    for (const json& u : seen) found |= (u["gen"] == t["gen"] && u["members"] == t["members"]);
    EXPECT_TRUE(found) << t.dump();
  }
}

TEST_F(ElasticProcessTest, JoinerArrivesWhileOthersAreMidStep) {
  Bootstrap(2, {"--step_ms=250"});
  Start("w2", {"--step_ms=250"});
  json joined = WaitFor("w2", [](const json& e) { return e["ev"] == "transition"; });
  EXPECT_EQ(joined["kind"], "joined");
  EXPECT_EQ(joined["size"], 3);
  EXPECT_EQ(joined["rank"], 2);  // joiners are appended; the survivors keep 0 and 1
  const std::vector<int64_t> committed = joined["committed"];
  EXPECT_EQ(committed[2], -1);
  EXPECT_EQ(joined["resume"].get<int64_t>(), std::max(committed[0], committed[1]) + 1);
  StopAndCheck({"w0", "w1", "w2"}, 0);
}

TEST_F(ElasticProcessTest, KillDuringAllreduceRedoesAtMostOneStep) {
  std::vector<std::string> flags = {"--numel=2000000"};
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> f = flags;
    f.push_back("--bootstrap=4");
    if (i == 2) f.push_back("--die_at_step=15");
    Start(absl::StrCat("w", i), f);
  }
  EXPECT_EQ(WaitExit("w2"), 128 + SIGKILL);
  json recovered = WaitFor("w0", [](const json& e) { return e.value("kind", "") == "recovered"; });
  std::vector<std::string> members = recovered["members"];
  EXPECT_THAT(members, Not(Contains("w2")));
  EXPECT_EQ(members.size(), 3u);
  const std::vector<int64_t> committed = recovered["committed"];
  const int64_t newest = *std::max_element(committed.begin(), committed.end());
  EXPECT_EQ(recovered["resume"].get<int64_t>(), newest + 1);
  EXPECT_GE(newest, 13);  // nobody lost more than the step in flight
  for (const char* m : {"w1", "w3"}) {
    WaitFor(m, [](const json& e) { return e.value("kind", "") == "recovered"; });
  }
  StopAndCheck({"w0", "w1", "w3"}, /*max_redone=*/1);
}

TEST_F(ElasticProcessTest, KillOfTheLeaderIsRecovered) {
  Bootstrap(4);
  const json gen0 = Transitions("w0").front();
  const std::string leader = gen0["members"][0];
  absl::SleepFor(absl::Milliseconds(300));
  Signal(leader, SIGKILL);
  std::vector<std::string> survivors;
  for (int i = 0; i < 4; ++i) {
    const std::string m = absl::StrCat("w", i);
    if (m != leader) survivors.push_back(m);
  }
  for (const std::string& m : survivors) {
    json r = WaitFor(m, [](const json& e) { return e.value("kind", "") == "recovered"; });
    EXPECT_EQ(r["size"], 3);
  }
  // The oldest survivor leads now: order is kept.
  json r = WaitFor(survivors[0], [](const json& e) { return e.value("kind", "") == "recovered"; });
  std::vector<std::string> old_order = gen0["members"];
  old_order.erase(old_order.begin());
  EXPECT_EQ(r["members"].get<std::vector<std::string>>(), old_order);
  StopAndCheck(survivors, 1);
}

TEST_F(ElasticProcessTest, TwoMembersKilledAtOnce) {
  Bootstrap(4);
  const std::vector<std::string> order = Transitions("w0").front()["members"];
  absl::SleepFor(absl::Milliseconds(300));
  Signal(order[1], SIGKILL);
  Signal(order[2], SIGKILL);
  const std::vector<std::string> survivors = {order[0], order[3]};
  for (const std::string& m : survivors) {
    WaitFor(m, [](const json& e) { return e["ev"] == "transition" && e["size"] == 2; });
  }
  StopAndCheck(survivors, 1);
}

// Nobody reports the kill and the grace is long: the survivors find the dead
// member's liveness port refused and recover at once instead of waiting 20 s.
TEST_F(ElasticProcessTest, UnreportedKillIsSeenWithoutWaitingOutTheGrace) {
  Bootstrap(3, {"--grace_ms=20000"});
  const std::vector<std::string> order = Transitions("w0").front()["members"];
  absl::SleepFor(absl::Milliseconds(300));
  Signal(order[1], SIGKILL);
  EXPECT_EQ(WaitExit(order[1]), 128 + SIGKILL);
  const std::vector<std::string> survivors = {order[0], order[2]};
  for (const std::string& m : survivors) {
    json r = WaitFor(
        m, [](const json& e) { return e.value("kind", "") == "recovered"; }, absl::Seconds(15));
    EXPECT_EQ(r["size"], 2) << m;
    EXPECT_LT(r["agree_ms"].get<double>(), 5000) << m << ": waited for the dead member's check-in";
  }
  StopAndCheck(survivors, 1);
}

// Members read the stop key at different moments (right after a recovery's
// state broadcast the root runs ahead of the others). The one that sees it
// first must not just exit: the others would be left in that step's allreduce
// and recover into a generation without it. Here one member alone "sees" it
// before step 30; everyone must stop after the same step, in generation 0.
TEST_F(ElasticProcessTest, StopSeenByOneMemberStopsEveryoneAfterTheSameStep) {
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> f = {"--bootstrap=3"};
    if (i == 1) f.push_back("--stop_at_step=30");
    Start(absl::StrCat("w", i), f);
  }
  std::optional<json> first;
  for (const char* m : {"w1", "w0", "w2"}) {
    EXPECT_EQ(WaitExit(m), 0) << m;
    json done = WaitFor(m, [](const json& e) { return e["ev"] == "done"; }, absl::Seconds(5));
    EXPECT_EQ(done["how"], "finished") << m;
    EXPECT_EQ(done["gen"], 0) << m << " went through a recovery";
    EXPECT_EQ(done["steps"], 31) << m;  // steps 0..30, the last one carried the vote
    if (!first) {
      first = done;
    } else {
      EXPECT_EQ(done["checksum"], (*first)["checksum"]) << m << " diverged";
    }
  }
}

TEST_F(ElasticProcessTest, FrozenMemberIsExcludedAndCannotRejoinOldGeneration) {
  Bootstrap(4, {"--heartbeat_ms=100", "--heartbeat_timeout_ms=1000"});
  const std::vector<std::string> order = Transitions("w0").front()["members"];
  const std::string frozen = order[2];
  absl::SleepFor(absl::Milliseconds(300));
  Signal(frozen, SIGSTOP);
  std::vector<std::string> survivors;
  for (const std::string& m : order) {
    if (m != frozen) survivors.push_back(m);
  }
  for (const std::string& m : survivors) {
    json r = WaitFor(m, [](const json& e) { return e.value("kind", "") == "recovered"; });
    EXPECT_EQ(r["size"], 3);
    EXPECT_THAT(r["members"].get<std::vector<std::string>>(), Not(Contains(frozen)));
  }
  // Training goes on without it; then it wakes up and finds itself excluded.
  absl::SleepFor(absl::Milliseconds(300));
  Signal(frozen, SIGCONT);
  EXPECT_EQ(WaitExit(frozen), 4);
  EXPECT_EQ(WaitFor(frozen, [](const json& e) { return e["ev"] == "done"; })["how"], "excluded");
  StopAndCheck(survivors, 1);
}

}  // namespace
}  // namespace malle::comm
