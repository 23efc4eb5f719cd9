// Real processes (elastic_trainer_worker) on loopback train a small MLP with
// Adam through ElasticTrainer, L = 4 logical workers:
//   - a run through 4 -> 2 -> 3 -> 4 ranks (planned leaves, joiners started
//     by the test) ends with the parameters of a fixed 4-rank run: relative
//     difference < 1e-5, bitwise in deterministic mode;
//   - all finishing replicas hold the same state digest;
//   - kill -9 of a member during a step and of the rank-0 process: the whole
//     state (parameters, batch-norm statistics and counter, a tracked
//     counter) ends as in the fixed run, and redone_steps counts the steps
//     each rank ran twice;
//   - a joiner with a different model fails with "model mismatch".
// The test orders resizes by step through the "ctl/gate" key the workers
// honour. Every wait is bounded; TearDown kills leftovers by pid.
#include <csignal>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "libmalle/cluster/local_process.h"
#include "libmalle/comm/elastic_group.h"
#include "libmalle/elastic/elastic_trainer.h"
#include "nlohmann/json.hpp"

namespace malle::elastic {
namespace {

using cluster::LocalProcess;
using comm::ControlStore;
using comm::ElasticGroup;
using nlohmann::json;

constexpr absl::Duration kWait = absl::Seconds(60);
constexpr int64_t kSteps = 40;

class ElasticTrainerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, ControlStore::Host("127.0.0.1", 0));
    char dir[] = "/tmp/malle-trainer-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
  }

  void TearDown() override {
    for (auto& [key, process] : procs_) {
      if (!process->Poll().has_value()) {
        ADD_FAILURE() << key << " (pid " << process->pid() << ") was still running; killed";
        (void)process->Kill();
      }
    }
    if (HasFailure()) {
      for (auto& [key, process] : procs_) {
        std::ifstream err(absl::StrCat(dir_, "/", key, ".err"));
        std::stringstream text;
        text << err.rdbuf();
        std::string s = text.str();
        if (s.size() > 3000) s = s.substr(s.size() - 3000);
        std::cerr << "---- " << key << " stderr (tail) ----\n" << s;
        std::cerr << "---- " << key << " events ----\n";
        for (const json& e : Events(key)) std::cerr << e.dump() << "\n";
      }
    }
  }

  static std::string Key(const std::string& job, const std::string& member) { return job + "." + member; }
  std::string Path(const std::string& key, const std::string& ext) const {
    return absl::StrCat(dir_, "/", key, ".", ext);
  }

  void Start(const std::string& job, const std::string& member, int bootstrap, bool deterministic,
             std::vector<std::string> extra = {}) {
    const std::string key = Key(job, member);
    std::vector<std::string> argv = {MALLE_TRAINER_WORKER_PATH,
                                     absl::StrCat("--store=127.0.0.1:", store_->port()),
                                     "--job=" + job,
                                     "--member=" + member,
                                     absl::StrCat("--bootstrap=", bootstrap),
                                     absl::StrCat("--steps=", kSteps),
                                     "--logical_workers=4",
                                     deterministic ? "--deterministic" : "--nodeterministic",
                                     "--events=" + Path(key, "jsonl"),
                                     "--params=" + Path(key, "bin")};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = LocalProcess::Spawn({argv, "", Path(key, "err"), {{"MALLE_LOG_LEVEL", "warning"}}});
    ASSERT_TRUE(p.ok()) << p.status();
    procs_[key] = *std::move(p);
  }

  std::vector<json> Events(const std::string& key) {
    std::vector<json> events;
    std::ifstream in(Path(key, "jsonl"));
    std::string line;
    while (std::getline(in, line)) {
      json e = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!e.is_discarded()) events.push_back(std::move(e));
    }
    return events;
  }

  std::shared_ptr<ControlStore> Job(const std::string& job) { return store_->WithPrefix(comm::JobPrefix(job)); }

  void SetGate(const std::string& job, int64_t step) { ASSERT_OK(Job(job)->Set("ctl/gate", absl::StrCat(step))); }

  // Polls until `done()`; fails the test on timeout.
  void WaitUntil(const std::string& what, const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + kWait;
    while (absl::Now() < deadline) {
      if (done()) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << "timed out waiting for " << what;
  }

  int64_t Progress(const std::string& job) {
    auto v = store_->TryGet(ProgressKey(job));
    int64_t n = 0;
    if (v.ok() && v->has_value()) (void)absl::SimpleAtoi(**v, &n);
    return n;
  }
  void WaitProgress(const std::string& job, int64_t steps) {
    WaitUntil(absl::StrCat(job, " progress ", steps), [&] { return Progress(job) >= steps; });
  }
  // Join/leave requests ever queued in the job.
  void WaitRequests(const std::string& job, int64_t n) {
    WaitUntil(absl::StrCat(job, " requests ", n), [&] {
      auto v = Job(job)->Add("req/ticket", 0);
      return v.ok() && *v >= n;
    });
  }

  int WaitExit(const std::string& key) {
    auto code = procs_.at(key)->Wait(kWait);
    EXPECT_TRUE(code.ok()) << key << ": " << code.status();
    return code.ok() ? *code : -1;
  }

  std::vector<float> Params(const std::string& key) {
    std::ifstream in(Path(key, "bin"), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
    return out;
  }

  json Done(const std::string& key) {
    for (const json& e : Events(key)) {
      if (e["ev"] == "done") return e;
    }
    ADD_FAILURE() << key << " reported no done event";
    return json::object();
  }

  // Finishing members: exit 0, the same digest and parameters; returns them.
  std::vector<float> CheckFinished(const std::string& job, const std::vector<std::string>& members,
                                   int64_t max_redone) {
    std::string digest;
    std::vector<float> params;
    for (const std::string& m : members) {
      const std::string key = Key(job, m);
      EXPECT_EQ(WaitExit(key), 0) << key;
      json done = Done(key);
      EXPECT_EQ(done.value("how", ""), "finished") << key;
      EXPECT_EQ(done.value("step", int64_t{-1}), kSteps) << key;
      EXPECT_LE(done.value("redone", int64_t{99}), max_redone) << key;
      EXPECT_EQ(done.value("redone", int64_t{-1}), done.value("repeated", int64_t{-2})) << key;
      // The tracked counter is stepped after every FinishStep(), committed or
      // not: the failed attempts' increments are rolled back.
      EXPECT_EQ(done.value("schedule", int64_t{-1}), kSteps) << key;
      if (digest.empty()) {
        digest = done.value("digest", "");
        params = Params(key);
        EXPECT_FALSE(params.empty()) << key;
      } else {
        EXPECT_EQ(done.value("digest", ""), digest) << key << " diverged";
        EXPECT_EQ(Params(key), params) << key;
      }
    }
    return params;
  }

  // The bootstrap members start from the same weights (as a user who seeds
  // the model), so the fixed and the elastic run start alike whichever member
  // becomes rank 0; joiners start from their own random weights and only the
  // state sync can give them the job's.
  static constexpr const char* kSameStart = "--init_seed=42";

  std::vector<float> RunFixed(const std::string& job, bool deterministic) {
    for (int i = 0; i < 4; ++i) Start(job, absl::StrCat("w", i), 4, deterministic, {kSameStart});
    return CheckFinished(job, {"w0", "w1", "w2", "w3"}, 0);
  }

  // kill -9 of w2 after the forward of its first micro-batch of step 8 (the
  // survivors' buffers have moved, nothing is reduced) and of w0, rank 0,
  // after its last backward of step 20 (its buckets may have been reduced;
  // the buffer broadcast from rank 0 fails). Both steps are redone.
  std::vector<float> RunKilled(const std::string& job, bool deterministic) {
    Start(job, "w0", 4, deterministic, {kSameStart, "--die_at=20:backward"});
    Start(job, "w1", 4, deterministic, {kSameStart});
    Start(job, "w2", 4, deterministic, {kSameStart, "--die_at=8:forward"});
    Start(job, "w3", 4, deterministic, {kSameStart});
    EXPECT_EQ(WaitExit(Key(job, "w2")), 128 + SIGKILL);
    EXPECT_EQ(WaitExit(Key(job, "w0")), 128 + SIGKILL);
    std::vector<float> params = CheckFinished(job, {"w1", "w3"}, 2);
    for (const char* m : {"w1", "w3"}) {
      EXPECT_EQ(Done(Key(job, m)).value("redone", int64_t{-1}), 2) << m << ": steps 8 and 20 redone";
    }
    return params;
  }

  // 4 -> 2 (step 10) -> 3 (step 20) -> 4 (step 30) -> end at step 40.
  std::vector<float> RunElastic(const std::string& job, bool deterministic) {
    SetGate(job, 10);
    for (int i = 0; i < 4; ++i) Start(job, absl::StrCat("w", i), 4, deterministic, {kSameStart});
    WaitProgress(job, 10);
    EXPECT_OK(ElasticGroup::RequestLeave(*store_, job, "w1"));
    EXPECT_OK(ElasticGroup::RequestLeave(*store_, job, "w2"));
    SetGate(job, 20);
    for (const char* m : {"w1", "w2"}) {
      EXPECT_EQ(WaitExit(Key(job, m)), 0) << m;
      EXPECT_EQ(Done(Key(job, m)).value("how", ""), "left") << m;
    }
    WaitProgress(job, 20);
    Start(job, "w4", 0, deterministic);
    WaitRequests(job, 3);
    SetGate(job, 30);
    WaitProgress(job, 30);
    Start(job, "w5", 0, deterministic);
    WaitRequests(job, 4);
    SetGate(job, kSteps);
    std::vector<float> params = CheckFinished(job, {"w0", "w3", "w4", "w5"}, 0);
    // w0 went through all four sizes; the joiners received state.
    std::vector<int> sizes;
    for (const json& e : Events(Key(job, "w0"))) {
      if (e["ev"] == "transition") sizes.push_back(e["size"]);
    }
    EXPECT_THAT(sizes, ::testing::ElementsAre(4, 2, 3, 4));
    for (const char* m : {"w4", "w5"}) {
      bool got_state = false, in_place = false, landed = false;
      for (const json& e : Events(Key(job, m))) {
        if (e["ev"] == "transition" && e["kind"] == "joined") {
          got_state = e["state_bytes"].get<int64_t>() > 0;
          in_place = e["state_in_place"].get<int64_t>() > 0;  // its parameters, received into them
          // Adam's state (a joiner has none yet), into memory it faulted in
          // before joining, from the layout rank 0 published.
          landed = e["state_landed"].get<int64_t>() > 0;
        }
      }
      EXPECT_TRUE(got_state) << m << " joined without receiving state";
      EXPECT_TRUE(in_place) << m << " received nothing in place";
      EXPECT_TRUE(landed) << m << " received its optimizer state into fresh memory";
    }
    return params;
  }

  std::shared_ptr<ControlStore> store_;
  std::string dir_;
  std::map<std::string, std::unique_ptr<LocalProcess>> procs_;
};

double MaxRelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(a[i])));
  }
  return diff / std::max(scale, 1e-30);
}

TEST_F(ElasticTrainerProcessTest, Resize_4_2_3_4_MatchesFixedRun) {
  std::vector<float> fixed = RunFixed("fixed", /*deterministic=*/false);
  std::vector<float> elastic = RunElastic("elastic", /*deterministic=*/false);
  ASSERT_EQ(fixed.size(), elastic.size());
  ASSERT_FALSE(fixed.empty());
  const double rel = MaxRelativeDifference(fixed, elastic);
  std::cout << "max relative difference elastic vs fixed: " << rel << "\n";
  EXPECT_LT(rel, 1e-5);
}

TEST_F(ElasticTrainerProcessTest, Resize_4_2_3_4_DeterministicIsBitwise) {
  std::vector<float> fixed = RunFixed("fixed", /*deterministic=*/true);
  std::vector<float> elastic = RunElastic("elastic", /*deterministic=*/true);
  ASSERT_EQ(fixed.size(), elastic.size());
  ASSERT_FALSE(fixed.empty());
  EXPECT_EQ(std::memcmp(fixed.data(), elastic.data(), fixed.size() * sizeof(float)), 0)
      << "max relative difference " << MaxRelativeDifference(fixed, elastic);
}

// kill -9 of w2 after the forward of its first micro-batch of step 8 (the
// survivors' buffers have moved, nothing is reduced) and of w0, rank 0, after
// its last backward of step 20 (its gradients may have been reduced; the
// buffer broadcast from rank 0 fails).
TEST_F(ElasticTrainerProcessTest, KillsDuringStepsKeepTheWholeStateExact) {
  std::vector<float> fixed = RunFixed("fixed", /*deterministic=*/false);
  std::vector<float> killed = RunKilled("killed", /*deterministic=*/false);
  ASSERT_EQ(fixed.size(), killed.size());
  ASSERT_FALSE(fixed.empty());
  const double rel = MaxRelativeDifference(fixed, killed);
  std::cout << "max relative difference killed vs fixed (parameters and buffers): " << rel << "\n";
  EXPECT_LT(rel, 1e-5);
}

TEST_F(ElasticTrainerProcessTest, KillsDuringStepsDeterministicIsBitwise) {
  std::vector<float> fixed = RunFixed("fixed", /*deterministic=*/true);
  std::vector<float> killed = RunKilled("killed", /*deterministic=*/true);
  ASSERT_EQ(fixed.size(), killed.size());
  ASSERT_FALSE(fixed.empty());
  EXPECT_EQ(std::memcmp(fixed.data(), killed.data(), fixed.size() * sizeof(float)), 0)
      << "max relative difference " << MaxRelativeDifference(fixed, killed);
}

// A joiner left alone before it committed a step (seen in test_cluster.py: an
// agent killed right after its job grew). w0 trains alone to step 10, w1 joins
// and receives the state, and w0 is killed after its backward of the first
// step they share. w1 recovers alone: it holds the state it received and must
// resume at the step it joined at, not at 0 (which would train the steps
// before it again on top of that state and serve their samples twice).
TEST_F(ElasticTrainerProcessTest, JoinerLeftAloneBeforeItsFirstCommitResumesWhereItJoined) {
  std::vector<float> fixed = RunFixed("fixed", /*deterministic=*/true);
  const std::string job = "alone";
  SetGate(job, 10);
  Start(job, "w0", 1, /*deterministic=*/true, {kSameStart, "--die_after_join"});
  WaitProgress(job, 10);
  Start(job, "w1", 0, /*deterministic=*/true);
  WaitRequests(job, 1);
  SetGate(job, kSteps);
  EXPECT_EQ(WaitExit(Key(job, "w0")), 128 + SIGKILL);
  std::vector<float> params = CheckFinished(job, {"w1"}, 1);
  std::vector<std::string> kinds;
  std::vector<int64_t> resumes;
  for (const json& e : Events(Key(job, "w1"))) {
    if (e["ev"] == "transition") {
      kinds.push_back(e["kind"].get<std::string>());
      resumes.push_back(e["resume"].get<int64_t>());
    }
  }
  EXPECT_THAT(kinds, ::testing::ElementsAre("joined", "recovered"));
  ASSERT_EQ(resumes.size(), 2u);
  EXPECT_GE(resumes[0], 10);
  EXPECT_EQ(resumes[1], resumes[0]) << "recovered at another step than it joined at";
  EXPECT_EQ(Done(Key(job, "w1")).value("redone", int64_t{-1}), 1) << "the shared step redone";
  ASSERT_EQ(fixed.size(), params.size());
  ASSERT_FALSE(fixed.empty());
  EXPECT_EQ(std::memcmp(fixed.data(), params.data(), fixed.size() * sizeof(float)), 0)
      << "max relative difference " << MaxRelativeDifference(fixed, params);
}

TEST_F(ElasticTrainerProcessTest, JoinerWithAnotherModelGetsModelMismatch) {
  SetGate("job", 5);
  for (int i = 0; i < 2; ++i) Start("job", absl::StrCat("w", i), 2, false);
  WaitProgress("job", 5);
  Start("job", "w9", 0, false, {"--hidden=33"});
  WaitRequests("job", 1);
  SetGate("job", kSteps);
  EXPECT_EQ(WaitExit(Key("job", "w9")), 5);
  bool mismatch = false;
  for (const json& e : Events(Key("job", "w9"))) {
    if (e["ev"] == "error") {
      mismatch = e["status"].get<std::string>().find("model mismatch") != std::string::npos;
      EXPECT_TRUE(mismatch) << e.dump();
    }
  }
  EXPECT_TRUE(mismatch);
  // The others notice w9 is gone, recover without it and finish.
  CheckFinished("job", {"w0", "w1"}, 1);
}

}  // namespace
}  // namespace malle::elastic
