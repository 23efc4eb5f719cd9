// AllocatorService over an in-process store, driven step by step with
// explicit times: messages in, plans out, attacks rejected, holes skipped,
// and a restart from the journal that loses nothing.
#include "libmalle/control/service/allocator_service.h"

#include <cmath>
#include <string>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "libmalle/control/service/channel.h"
#include "libmalle/control/service/report_sink.h"
#include "nlohmann/json.hpp"

namespace malle::control {
namespace {

using ::malle::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

Secret TestSecret(const std::string& bytes = "0123456789abcdef0123456789abcdef") {
  absl::StatusOr<Secret> s = Secret::FromBytes(bytes);
  EXPECT_OK(s.status());
  return *s;
}

class AllocatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = comm::ControlStore::InMemory();
    journal_ = ::testing::TempDir() + "/service_journal_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::remove(journal_.c_str());
  }

  std::unique_ptr<AllocatorService> NewService() {
    AllocatorServiceOptions o;
    o.journal_path = journal_;
    o.decide.policy = alloc::PolicyKind::kDp;
    o.debounce = absl::Milliseconds(100);
    o.hole_timeout = absl::Seconds(2);
    absl::StatusOr<std::unique_ptr<AllocatorService>> s = AllocatorService::Create(store_, TestSecret(), o);
    EXPECT_OK(s.status());
    return *std::move(s);
  }

  Outbox Agent(const std::string& node) { return Outbox(store_, TestSecret(), "agent." + node); }

  void RegisterNode(const std::string& node) {
    NodeRegister r;
    r.node = node;
    r.agent = "agent." + node;
    ASSERT_OK(Agent(node).Send(r));
  }

  std::optional<AllocationPlan> Plan() {
    absl::StatusOr<std::optional<Envelope>> doc = ReadDocument(*store_, keys::kPlan, TestSecret(), absl::Now());
    EXPECT_OK(doc.status());
    if (!doc.ok() || !doc->has_value()) return std::nullopt;
    return std::get<AllocationPlan>((*doc)->message);
  }

  std::shared_ptr<comm::ControlStore> store_;
  std::string journal_;
};

TEST_F(AllocatorServiceTest, MessagesBecomeAPlanAndTheJobSpecIsPublished) {
  auto service = NewService();
  const absl::Time t0 = absl::Now();
  ASSERT_OK(service->Begin(t0));
  RegisterNode("n0");
  RegisterNode("n1");
  Outbox client(store_, TestSecret(), "client.test");
  JobSubmit job;
  job.job = "digits";
  job.command = {"python", "train.py"};
  job.max_nodes = 2;
  ASSERT_OK(client.Send(job));
  ASSERT_OK(service->Step(t0));
  EXPECT_FALSE(Plan().has_value()) << "decided before the debounce";
  ASSERT_OK(service->Step(t0 + absl::Milliseconds(150)));
  std::optional<AllocationPlan> plan = Plan();
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->plan, 1);
  ASSERT_THAT(plan->assignments, SizeIs(2));
  EXPECT_EQ(plan->assignments[0].job, "digits");
  EXPECT_EQ(plan->assignments[1].job, "digits");
  ASSERT_THAT(plan->launches, SizeIs(1));
  EXPECT_EQ(plan->launches[0].runtime_id, "digits.i1");
  ASSERT_OK_AND_ASSIGN(std::optional<std::string> id, store_->TryGet(keys::kPlanId));
  EXPECT_EQ(id, "1");
  ASSERT_OK_AND_ASSIGN(std::optional<Envelope> spec,
                       ReadDocument(*store_, keys::JobSpecKey("digits"), TestSecret(), absl::Now()));
  ASSERT_TRUE(spec.has_value());
  EXPECT_EQ(std::get<JobSubmit>(spec->message).command, job.command);
  nlohmann::json status = nlohmann::json::parse(service->StatusJson());
  EXPECT_EQ(status["allocator"]["accepted"], 3);
  EXPECT_EQ(status["jobs"][0]["phase"], "running");
  // The inbox keys were consumed.
  EXPECT_THAT(store_->TryGet(keys::InboxKey(1)), ::malle::testing::IsOkAndHolds(std::nullopt));
}

TEST_F(AllocatorServiceTest, ForgedReplayedMalformedAndRefusedMessagesAreDroppedAndCounted) {
  auto service = NewService();
  const absl::Time t0 = absl::Now();
  ASSERT_OK(service->Begin(t0));
  RegisterNode("n0");
  // Signed with another secret.
  Outbox forger(store_, TestSecret("another-secret-of-32-bytes-length"), "agent.n9");
  NodeRegister r;
  r.node = "n9";
  r.agent = "agent.n9";
  ASSERT_OK(forger.Send(r));
  // Replayed: the exact bytes of an accepted message again.
  Outbox agent = Agent("n1");
  r.node = "n1";
  r.agent = "agent.n1";
  ASSERT_OK_AND_ASSIGN(std::string wire, agent.SignNow(r));
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK_AND_ASSIGN(int64_t ticket, store_->Add(keys::kInboxNext, 1));
    ASSERT_OK(store_->Set(keys::InboxKey(ticket), wire));
  }
  // Unsigned and truncated garbage.
  for (const std::string& junk : {std::string(R"({"v":1,"type":"node_leave"})"), wire.substr(0, wire.size() / 2)}) {
    ASSERT_OK_AND_ASSIGN(int64_t ticket, store_->Add(keys::kInboxNext, 1));
    ASSERT_OK(store_->Set(keys::InboxKey(ticket), junk));
  }
  // Valid but refused: the same node from a second live agent.
  NodeRegister twice;
  twice.node = "n0";
  twice.agent = "agent.other";
  ASSERT_OK(Outbox(store_, TestSecret(), "agent.other").Send(twice));
  ASSERT_OK(service->Step(t0));
  AllocatorStats st = service->stats();
  EXPECT_EQ(st.accepted, 2);  // n0, n1
  EXPECT_EQ(st.rejected, 5);
  EXPECT_THAT(st.last_rejection, HasSubstr("already registered"));
  EXPECT_EQ(st.cursor, 7);
}

TEST_F(AllocatorServiceTest, ATicketNeverWrittenIsSkippedAfterTheHoleTimeout) {
  auto service = NewService();
  const absl::Time t0 = absl::Now();
  ASSERT_OK(service->Begin(t0));
  ASSERT_OK(store_->Add(keys::kInboxNext, 1).status());  // a sender that died after taking a ticket
  RegisterNode("n0");
  ASSERT_OK(service->Step(t0));
  EXPECT_EQ(service->stats().accepted, 0);
  ASSERT_OK(service->Step(t0 + absl::Seconds(1)));
  EXPECT_EQ(service->stats().accepted, 0);
  ASSERT_OK(service->Step(t0 + absl::Seconds(3)));
  EXPECT_EQ(service->stats().holes_skipped, 1);
  EXPECT_EQ(service->stats().accepted, 1);
}

TEST_F(AllocatorServiceTest, ARestartFromTheJournalLosesNothingAndFencesTheOldInstance) {
  const absl::Time t0 = absl::Now();
  std::string before;
  auto old_service = NewService();
  ASSERT_OK(old_service->Begin(t0));
  for (const char* n : {"n0", "n1", "n2"}) RegisterNode(n);
  Outbox client(store_, TestSecret(), "client.test");
  for (const char* j : {"a", "b"}) {
    JobSubmit job;
    job.job = j;
    job.command = {"true"};
    job.max_nodes = 3;
    ASSERT_OK(client.Send(job));
  }
  ASSERT_OK(old_service->Step(t0));
  ASSERT_OK(old_service->Step(t0 + absl::Seconds(1)));
  ASSERT_OK_AND_ASSIGN(std::optional<std::string> id_before, store_->TryGet(keys::kPlanId));
  ASSERT_EQ(id_before, "1");
  before = nlohmann::json::parse(old_service->StatusJson())["jobs"].dump();

  // "kill -9": the old object is simply abandoned; a new one replays.
  auto service = NewService();
  ASSERT_OK(service->Begin(t0 + absl::Seconds(2)));
  nlohmann::json after = nlohmann::json::parse(service->StatusJson());
  EXPECT_EQ(after["jobs"].dump(), before);
  EXPECT_EQ(after["allocator"]["epoch"], 2);
  EXPECT_EQ(after["last_decision"]["plan"], 1);
  // Messages sent while it was down are consumed once, from where it stopped.
  RegisterNode("n3");
  ASSERT_OK(service->Step(t0 + absl::Seconds(3)));
  ASSERT_OK(service->Step(t0 + absl::Seconds(4)));
  EXPECT_EQ(service->stats().accepted, 1);
  ASSERT_OK_AND_ASSIGN(std::optional<std::string> id_after, store_->TryGet(keys::kPlanId));
  EXPECT_EQ(id_after, "2");
  // The old instance, still alive somewhere, may not publish any more.
  RegisterNode("n4");
  EXPECT_THAT(old_service->Step(t0 + absl::Seconds(10)),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("another allocator took over")));
}

// A rank's ControlReportSink reports a park through the inbox: the job is
// parked, counted in the metrics, and still parked after a restart from the
// journal. A value the wire refuses never leaves the rank.
TEST_F(AllocatorServiceTest, AParkSentByTheReportSinkIsJournaledAndCounted) {
  const absl::Time t0 = absl::Now();
  auto old_service = NewService();
  ASSERT_OK(old_service->Begin(t0));
  RegisterNode("n0");
  JobSubmit job;
  job.job = "p";
  job.command = {"true"};
  ASSERT_OK(Outbox(store_, TestSecret(), "client.test").Send(job));
  ASSERT_OK(old_service->Step(t0));
  ASSERT_OK(old_service->Step(t0 + absl::Seconds(1)));
  ASSERT_TRUE(Plan().has_value());

  ControlReportSink sink(store_, TestSecret(), "rank.p-m0", "p", "p.i1");
  EXPECT_THAT(sink.SendParked(-1, 10, 0.5),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("body.step")));
  EXPECT_THAT(sink.SendParked(12, 10, std::nan("")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("body.write_s")));
  ASSERT_OK(sink.SendParked(12, 4096, 0.5));
  ASSERT_OK(old_service->Step(t0 + absl::Seconds(2)));
  nlohmann::json job_status = nlohmann::json::parse(old_service->StatusJson())["jobs"][0];
  EXPECT_EQ(job_status["phase"], "parked");
  EXPECT_EQ(job_status["park"]["step"], 12);
  EXPECT_EQ(job_status["park"]["bytes"], 4096);
  EXPECT_THAT(old_service->MetricsText(), HasSubstr("malle_allocator_parks_total 1\n"));
  EXPECT_THAT(old_service->MetricsText(), HasSubstr("malle_allocator_jobs{phase=\"parked\"} 1\n"));

  auto service = NewService();
  ASSERT_OK(service->Begin(t0 + absl::Seconds(3)));
  nlohmann::json replayed = nlohmann::json::parse(service->StatusJson())["jobs"][0];
  EXPECT_EQ(replayed["phase"], "parked");
  EXPECT_EQ(replayed["park"]["step"], 12);
  EXPECT_THAT(service->MetricsText(), HasSubstr("malle_allocator_parks_total 1\n"));
}

}  // namespace
}  // namespace malle::control
