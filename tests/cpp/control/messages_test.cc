#include "libmalle/control/wire/messages.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "nlohmann/json.hpp"

namespace malle::control {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::IsOkAndHolds;
using ::malle::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;
using Json = nlohmann::json;

const absl::Time kT0 = absl::FromUnixMicros(1'700'000'000'250'000);  // 1700000000.25

// One message of every type, every field set and none at its default.
NodeRegister MakeNodeRegister() {
  NodeRegister m;
  m.node = "n7";
  m.agent = "agent-n7.3";
  m.node_class = {"a100_80g", 0.75};
  m.idle_until = kT0 + absl::Seconds(3600.125);
  m.slots = 4;
  return m;
}
NodeReclaim MakeNodeReclaim() { return {"n7", absl::Milliseconds(30500), "slurm job 991 starts"}; }
NodeLeave MakeNodeLeave() { return {"n7", "agent shutting down"}; }
AgentHeartbeat MakeAgentHeartbeat() {
  return {"n7", RunningRank{"resnet", "w3", 4242, RankPhase::kStarting,
                            absl::FromUnixMicros(1'700'000'000'250'000)}};
}
RankExit MakeRankExit() { return {"n7", "resnet", "w3", 137, 9, RankExitCause::kStopped}; }
JobSubmit MakeJobSubmit() {
  JobSubmit m;
  m.job = "resnet-50_v2";
  m.command = {"/usr/bin/python3", "train.py", "--lr=0.1", "with space", "\"quoted\""};
  m.env = {{"OMP_NUM_THREADS", "4"}, {"_X", ""}, {"PATH", "/usr/bin:/bin"}};
  m.cwd = "/home/u/run";
  m.min_nodes = 2;
  m.max_nodes = 16;
  m.logical_workers = 8;
  m.weight = 2.5;
  m.priority = -3;
  m.total_steps = 90'000;
  return m;
}
JobCancel MakeJobCancel() { return {"resnet", "user request"}; }
AdvisorReport MakeAdvisorReport() {
  return {"resnet", R"({"a":[1,2.5,"x"],"b":{"c":null,"d":true}})"};
}
JobComplete MakeJobComplete() {
  return {"resnet", JobStatus::kFailed, 1200, int64_t{1} << 40, "rank 3 died"};
}
AllocationPlan MakeAllocationPlan() {
  AllocationPlan m;
  m.plan = 17;
  m.decided_at = kT0;
  m.policy = "milp";
  m.reason = "job resnet submitted";
  m.assignments = {{"n0", "resnet"}, {"n1", std::nullopt}, {"n2", "vgg"}};
  m.sizes = {{"resnet", 1}, {"vgg", 1}};
  m.launches = {{"resnet", "resnet.i1", "n0"}, {"vgg", "vgg.i3", "n2"}};
  return m;
}
AllocatorStatus MakeAllocatorStatus() { return {R"({"jobs":[{"job":"resnet"}],"now":1.5})"}; }
JobSaved MakeJobSaved() {
  return {"resnet", "resnet.i3", SaveKind::kSnapshot, 1234, int64_t{250} << 20,
          absl::Microseconds(1'750'250)};
}

std::vector<Message> AllMessages() {
  return {MakeNodeRegister(), MakeNodeReclaim(),   MakeNodeLeave(), MakeAgentHeartbeat(),
          MakeRankExit(),     MakeJobSubmit(),     MakeJobCancel(), MakeAdvisorReport(),
          MakeJobComplete(),  MakeAllocationPlan(), MakeAllocatorStatus(), MakeJobSaved()};
}

Envelope Wrap(Message message, uint64_t seq = 1) {
  Envelope envelope;
  envelope.sender = "agent-n7";
  envelope.seq = seq;
  envelope.ts = kT0;
  envelope.message = std::move(message);
  return envelope;
}

TEST(MessagesTest, EveryTypeHasADistinctWireName) {
  const std::vector<Message> all = AllMessages();
  ASSERT_EQ(all.size(), std::variant_size_v<Message>);
  std::vector<std::string> names;
  for (const Message& m : all) {
    names.emplace_back(MessageTypeName(TypeOf(m)));
    EXPECT_THAT(ParseMessageType(names.back()), IsOkAndHolds(TypeOf(m)));
  }
  EXPECT_THAT(names, ElementsAre("node_register", "node_reclaim", "node_leave", "agent_heartbeat",
                                 "rank_exit", "job_submit", "job_cancel", "advisor_report",
                                 "job_complete", "allocation_plan", "allocator_status",
                                 "job_saved"));
}

TEST(MessagesTest, EveryTypeRoundTripsThroughItsBody) {
  for (const Message& m : AllMessages()) {
    SCOPED_TRACE(MessageTypeName(TypeOf(m)));
    ASSERT_OK_AND_ASSIGN(std::string body, EncodeBody(m));
    ASSERT_OK_AND_ASSIGN(Message back, DecodeBody(TypeOf(m), body));
    EXPECT_TRUE(back == m) << body;
    EXPECT_THAT(EncodeBody(back), IsOkAndHolds(body));  // stable
  }
}

TEST(MessagesTest, EveryTypeRoundTripsThroughAnEnvelope) {
  uint64_t seq = 1;
  for (const Message& m : AllMessages()) {
    SCOPED_TRACE(MessageTypeName(TypeOf(m)));
    const Envelope envelope = Wrap(m, seq++);
    ASSERT_OK_AND_ASSIGN(std::string json, EncodeEnvelopeJson(envelope));
    ASSERT_OK_AND_ASSIGN(Envelope back, DecodeEnvelopeJson(json));
    EXPECT_TRUE(back == envelope) << json;
  }
}

TEST(MessagesTest, EnvelopeJsonHasTheDocumentedShape) {
  ASSERT_OK_AND_ASSIGN(std::string json, EncodeEnvelopeJson(Wrap(MakeNodeReclaim(), 42)));
  EXPECT_EQ(json, R"({"v":1,"type":"node_reclaim","sender":"agent-n7","seq":42,"ts":1700000000.25,)"
                  R"("body":{"node":"n7","grace_s":30.5,"reason":"slurm job 991 starts"}})");
}

TEST(MessagesTest, JobSavedHasTheDocumentedShape) {
  JobSaved m = MakeJobSaved();
  m.kind = SaveKind::kPark;
  ASSERT_OK_AND_ASSIGN(std::string body, EncodeBody(m));
  EXPECT_EQ(body, R"({"job":"resnet","runtime_id":"resnet.i3","kind":"park","step":1234,)"
                  R"("bytes":262144000,"write_s":1.75025})");
  EXPECT_EQ(SaveKindName(SaveKind::kSnapshot), "snapshot");
}

TEST(MessagesTest, NonAsciiTextRoundTripsAndTheWireIsAscii) {
  NodeLeave m{"n7", "Wartung \xc3\xa4 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x94\xa7 \"q\"\n\t"};
  ASSERT_OK_AND_ASSIGN(std::string json, EncodeEnvelopeJson(Wrap(m)));
  for (char c : json) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << static_cast<int>(c);
  ASSERT_OK_AND_ASSIGN(Envelope back, DecodeEnvelopeJson(json));
  EXPECT_TRUE(back.message == Message(m));
}

TEST(MessagesTest, OptionalFieldsMayBeAbsentOrNullAndDefaultsApply) {
  ASSERT_OK_AND_ASSIGN(
      Message reg, DecodeBody(MessageType::kNodeRegister,
                              R"({"node":"n1","agent":"a","node_class":{"group":"g","speed":1}})"));
  const auto& r = std::get<NodeRegister>(reg);
  EXPECT_EQ(r.slots, 1);
  EXPECT_FALSE(r.idle_until.has_value());
  ASSERT_OK_AND_ASSIGN(Message hb,
                       DecodeBody(MessageType::kAgentHeartbeat, R"({"node":"n1","running":null})"));
  EXPECT_FALSE(std::get<AgentHeartbeat>(hb).running.has_value());
  // phase and phase_since are optional (absent: not said).
  ASSERT_OK_AND_ASSIGN(Message bare, DecodeBody(MessageType::kAgentHeartbeat,
                                                R"({"node":"n1","running":{"job":"j","member":"m","pid":3}})"));
  EXPECT_FALSE(std::get<AgentHeartbeat>(bare).running->phase.has_value());
  EXPECT_FALSE(std::get<AgentHeartbeat>(bare).running->phase_since.has_value());
  ASSERT_OK_AND_ASSIGN(Message submit,
                       DecodeBody(MessageType::kJobSubmit,
                                  R"({"job":"j","command":["x"],"min_nodes":1,"max_nodes":3,)"
                                  R"("logical_workers":null})"));
  const auto& s = std::get<JobSubmit>(submit);
  EXPECT_THAT(s.env, IsEmpty());
  EXPECT_EQ(s.cwd, "");
  EXPECT_EQ(s.weight, 1.0);
  EXPECT_EQ(s.priority, 0);
  EXPECT_FALSE(s.logical_workers.has_value());
  EXPECT_FALSE(s.total_steps.has_value());
  EXPECT_EQ(s.EffectiveMaxNodes(), 3);
}

// total_steps is written only when given: an allocator from before the field
// (it refuses unknown keys) still reads a submit that does not use it.
TEST(MessagesTest, TotalStepsIsWrittenOnlyWhenGiven) {
  JobSubmit m = MakeJobSubmit();
  ASSERT_OK_AND_ASSIGN(std::string with, EncodeBody(m));
  EXPECT_EQ(Json::parse(with)["total_steps"], 90000);
  m.total_steps.reset();
  ASSERT_OK_AND_ASSIGN(std::string without, EncodeBody(m));
  EXPECT_FALSE(Json::parse(without).contains("total_steps")) << without;
  ASSERT_OK_AND_ASSIGN(Message back, DecodeBody(MessageType::kJobSubmit, without));
  EXPECT_FALSE(std::get<JobSubmit>(back).total_steps.has_value());
}

TEST(MessagesTest, EffectiveMaxNodesIsCappedByLogicalWorkers) {
  JobSubmit m = MakeJobSubmit();
  EXPECT_EQ(m.EffectiveMaxNodes(), 8);  // max 16, L = 8
  m.logical_workers = 32;
  EXPECT_EQ(m.EffectiveMaxNodes(), 16);
}

TEST(MessagesTest, ReportKeepsItsContentWithSortedKeys) {
  AdvisorReport m{"resnet", R"( { "z": 1, "a": {"y": [1, 2], "b": "\u00e4"} } )"};
  ASSERT_OK_AND_ASSIGN(std::string body, EncodeBody(m));
  ASSERT_OK_AND_ASSIGN(Message back, DecodeBody(MessageType::kAdvisorReport, body));
  EXPECT_EQ(std::get<AdvisorReport>(back).report_json,
            "{\"a\":{\"b\":\"\xc3\xa4\",\"y\":[1,2]},\"z\":1}");
}

TEST(MessagesTest, TimesHaveMicrosecondResolution) {
  Envelope envelope = Wrap(MakeNodeLeave());
  envelope.ts = kT0 + absl::Nanoseconds(1999);
  ASSERT_OK_AND_ASSIGN(std::string json, EncodeEnvelopeJson(envelope));
  ASSERT_OK_AND_ASSIGN(Envelope back, DecodeEnvelopeJson(json));
  EXPECT_EQ(back.ts, kT0 + absl::Microseconds(1));
}

TEST(MessagesTest, ValidateIdFollowsThePattern) {
  EXPECT_OK(ValidateId("x", "Az09._-"));
  EXPECT_OK(ValidateId("x", std::string(128, 'a')));
  for (const std::string& bad :
       std::vector<std::string>{"", "a b", "a/b", "a:b", "\xc3\xa4", std::string(129, 'a')}) {
    EXPECT_THAT(ValidateId("body.node", bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(StartsWith("body.node: "), HasSubstr("^[A-Za-z0-9._-]{1,128}$"))));
  }
}

// --- every rule, decoded from JSON
// -----------------------------------------------------------------

Json BodyOf(const Message& m) {
  absl::StatusOr<std::string> body = EncodeBody(m);
  EXPECT_OK(body.status());
  return Json::parse(body.ok() ? *body : "{}");
}

struct RuleCase {
  std::string name;
  Message base;
  std::function<void(Json&)> patch;
  std::string field;     // the message starts with "<field>: "
  std::string expected;  // and contains this (the allowed range, usually)
};

std::vector<RuleCase> RuleCases() {
  const std::string long257(257, 'r');
  const std::string long4097(4097, 'x');
  return {
      {"unknown key", MakeNodeLeave(), [](Json& b) { b["extra"] = 1; }, "body.extra",
       "unknown key; expected one of node, reason"},
      {"odd unknown key", MakeNodeLeave(), [](Json& b) { b["a.b\n"] = 1; }, "body[\"a.b\\x0a\"]",
       "unknown key"},
      {"missing field", MakeNodeLeave(), [](Json& b) { b.erase("node"); }, "body.node",
       "missing (required)"},
      {"body not an object", MakeNodeLeave(), [](Json& b) { b = Json::array(); }, "body",
       "expected an object, got an array"},
      {"string instead of int", MakeNodeRegister(), [](Json& b) { b["slots"] = "2"; }, "body.slots",
       "expected an integer in [1, 1024], got the string \"2\""},
      {"float instead of int", MakeNodeRegister(), [](Json& b) { b["slots"] = 2.0; }, "body.slots",
       "expected an integer in [1, 1024], got 2.0"},
      {"slots 0", MakeNodeRegister(), [](Json& b) { b["slots"] = 0; }, "body.slots",
       "[1, 1024], got 0"},
      {"slots huge", MakeNodeRegister(), [](Json& b) { b["slots"] = uint64_t{1} << 63; },
       "body.slots", "[1, 1024]"},
      {"id with space", MakeNodeRegister(), [](Json& b) { b["node"] = "n 7"; }, "body.node",
       "expected an id matching ^[A-Za-z0-9._-]{1,128}$, got \"n 7\""},
      {"id too long", MakeNodeRegister(), [](Json& b) { b["agent"] = std::string(129, 'a'); },
       "body.agent", "{1,128}$, got a string of 129 bytes"},
      {"empty id", MakeNodeRegister(), [](Json& b) { b["node_class"]["group"] = ""; },
       "body.node_class.group", "{1,128}$"},
      {"speed 0", MakeNodeRegister(), [](Json& b) { b["node_class"]["speed"] = 0; },
       "body.node_class.speed", "(0, 100], got 0"},
      {"speed > 100", MakeNodeRegister(), [](Json& b) { b["node_class"]["speed"] = 100.5; },
       "body.node_class.speed", "(0, 100]"},
      {"speed string", MakeNodeRegister(), [](Json& b) { b["node_class"]["speed"] = "fast"; },
       "body.node_class.speed", "expected a number"},
      {"node_class unknown key", MakeNodeRegister(),
       [](Json& b) { b["node_class"]["locality"] = "r1"; }, "body.node_class.locality",
       "unknown key"},
      {"idle_until negative", MakeNodeRegister(), [](Json& b) { b["idle_until"] = -1; },
       "body.idle_until", "unix seconds in [0, 1e10]"},
      {"idle_until far future", MakeNodeRegister(), [](Json& b) { b["idle_until"] = 2e10; },
       "body.idle_until", "unix seconds in [0, 1e10]"},
      {"grace negative", MakeNodeReclaim(), [](Json& b) { b["grace_s"] = -0.5; }, "body.grace_s",
       "seconds in [0, 3600]"},
      {"grace over an hour", MakeNodeReclaim(), [](Json& b) { b["grace_s"] = 3600.5; },
       "body.grace_s", "seconds in [0, 3600]"},
      {"reclaim reason too long", MakeNodeReclaim(), [=](Json& b) { b["reason"] = long257; },
       "body.reason", "at most 256 bytes, got 257"},
      {"leave reason too long", MakeNodeLeave(), [=](Json& b) { b["reason"] = long257; },
       "body.reason", "at most 256 bytes, got 257"},
      {"reason with NUL", MakeNodeLeave(), [](Json& b) { b["reason"] = std::string("a\0b", 3); },
       "body.reason", "NUL"},
      {"running not an object", MakeAgentHeartbeat(), [](Json& b) { b["running"] = 5; },
       "body.running", "expected an object"},
      {"running job id", MakeAgentHeartbeat(), [](Json& b) { b["running"]["job"] = "a/b"; },
       "body.running.job", "{1,128}$"},
      {"unknown phase", MakeAgentHeartbeat(), [](Json& b) { b["running"]["phase"] = "warm"; },
       "body.running.phase", "expected one of \"starting\", \"training\", \"draining\""},
      {"phase_since in the future", MakeAgentHeartbeat(),
       [](Json& b) { b["running"]["phase_since"] = 2e10; }, "body.running.phase_since",
       "unix seconds in [0, 1e10]"},
      {"pid 0", MakeAgentHeartbeat(), [](Json& b) { b["running"]["pid"] = 0; }, "body.running.pid",
       "[1, 2147483647], got 0"},
      {"exit code 256", MakeRankExit(), [](Json& b) { b["exit_code"] = 256; }, "body.exit_code",
       "[0, 255], got 256"},
      {"negative exit code", MakeRankExit(), [](Json& b) { b["exit_code"] = -1; }, "body.exit_code",
       "[0, 255], got -1"},
      {"signal 128", MakeRankExit(), [](Json& b) { b["signal"] = 128; }, "body.signal",
       "[0, 127], got 128"},
      {"unknown exit cause", MakeRankExit(), [](Json& b) { b["cause"] = "vanished"; }, "body.cause",
       "expected one of \"exited\", \"left\", \"stopped\", got \"vanished\""},
      {"missing exit cause", MakeRankExit(), [](Json& b) { b.erase("cause"); }, "body.cause",
       "missing"},
      {"empty command", MakeJobSubmit(), [](Json& b) { b["command"] = Json::array(); },
       "body.command", "expected 1 to 256 entries, got 0"},
      {"command too long", MakeJobSubmit(),
       [](Json& b) { b["command"] = std::vector<std::string>(257, "x"); }, "body.command",
       "at most 256 entries, got 257"},
      {"command arg too long", MakeJobSubmit(), [=](Json& b) { b["command"][3] = long4097; },
       "body.command[3]", "at most 4096 bytes, got 4097"},
      {"command arg not a string", MakeJobSubmit(), [](Json& b) { b["command"][1] = 7; },
       "body.command[1]", "expected a string, got 7"},
      {"empty program", MakeJobSubmit(), [](Json& b) { b["command"][0] = ""; }, "body.command[0]",
       "must not be empty"},
      {"too many env entries", MakeJobSubmit(),
       [](Json& b) {
         for (int i = 0; i < 65; ++i) b["env"][absl::StrCat("V", i)] = "1";
       },
       "body.env", "at most 64 entries"},
      {"env name", MakeJobSubmit(), [](Json& b) { b["env"]["1BAD"] = "x"; }, "body.env",
       "key \"1BAD\" is not a variable name"},
      {"env value not a string", MakeJobSubmit(), [](Json& b) { b["env"]["X"] = 1; }, "body.env.X",
       "expected a string"},
      {"env value too long", MakeJobSubmit(), [=](Json& b) { b["env"]["X"] = long4097; },
       "body.env.X", "at most 4096 bytes"},
      {"relative cwd", MakeJobSubmit(), [](Json& b) { b["cwd"] = "run"; }, "body.cwd",
       "expected an absolute path or \"\""},
      {"cwd too long", MakeJobSubmit(), [=](Json& b) { b["cwd"] = "/" + long4097; }, "body.cwd",
       "at most 4096 bytes"},
      {"min_nodes 0", MakeJobSubmit(), [](Json& b) { b["min_nodes"] = 0; }, "body.min_nodes",
       "[1, 100000], got 0"},
      {"max below min", MakeJobSubmit(), [](Json& b) { b["max_nodes"] = 1; }, "body.max_nodes",
       "[min_nodes = 2, 100000], got 1"},
      {"max_nodes too large", MakeJobSubmit(), [](Json& b) { b["max_nodes"] = 100001; },
       "body.max_nodes", "[1, 100000], got 100001"},
      {"logical workers below min", MakeJobSubmit(), [](Json& b) { b["logical_workers"] = 1; },
       "body.logical_workers", "[min_nodes = 2, 1000000], got 1"},
      {"weight 0", MakeJobSubmit(), [](Json& b) { b["weight"] = 0; }, "body.weight",
       "(0, 1e+06], got 0"},
      {"weight too large", MakeJobSubmit(), [](Json& b) { b["weight"] = 2e6; }, "body.weight",
       "(0, 1e+06]"},
      {"priority too large", MakeJobSubmit(), [](Json& b) { b["priority"] = 1000001; },
       "body.priority", "[-1000000, 1000000], got 1000001"},
      {"total_steps 0", MakeJobSubmit(), [](Json& b) { b["total_steps"] = 0; }, "body.total_steps",
       "got 0"},
      {"total_steps fractional", MakeJobSubmit(), [](Json& b) { b["total_steps"] = 2.5; },
       "body.total_steps", "got 2.5"},
      {"cancel reason too long", MakeJobCancel(), [=](Json& b) { b["reason"] = long257; },
       "body.reason", "at most 256 bytes"},
      {"report not an object", MakeAdvisorReport(), [](Json& b) { b["report"] = "{}"; },
       "body.report", "expected a JSON object, got the string"},
      {"report too large", MakeAdvisorReport(),
       [](Json& b) { b["report"]["blob"] = std::string(64 * 1024, 'x'); }, "body.report",
       "at most 65536 bytes when serialised compactly"},
      {"unknown status", MakeJobComplete(), [](Json& b) { b["status"] = "exploded"; },
       "body.status", "expected one of \"succeeded\", \"failed\", \"cancelled\""},
      {"negative steps", MakeJobComplete(), [](Json& b) { b["steps"] = -1; }, "body.steps",
       "[0, 9007199254740992], got -1"},
      {"samples beyond 2^53", MakeJobComplete(),
       [](Json& b) { b["samples"] = (uint64_t{1} << 53) + 1; }, "body.samples",
       "[0, 9007199254740992]"},
      {"message too long", MakeJobComplete(), [=](Json& b) { b["message"] = long4097; },
       "body.message", "at most 4096 bytes"},
      {"negative plan id", MakeAllocationPlan(), [](Json& b) { b["plan"] = -1; }, "body.plan",
       "[0, 9007199254740992], got -1"},
      {"decided_at string", MakeAllocationPlan(), [](Json& b) { b["decided_at"] = "now"; },
       "body.decided_at", "expected a number"},
      {"policy too long", MakeAllocationPlan(),
       [](Json& b) { b["policy"] = std::string(129, 'p'); }, "body.policy", "at most 128 bytes"},
      {"plan reason too long", MakeAllocationPlan(), [=](Json& b) { b["reason"] = long4097; },
       "body.reason", "at most 4096 bytes"},
      {"assignment node id", MakeAllocationPlan(),
       [](Json& b) {
         for (int i = 0; i < 3; ++i) b["assignments"].push_back({{"node", "m"}, {"job", nullptr}});
         b["assignments"][3]["node"] = "bad node";
       },
       "body.assignments[3].node", "{1,128}$, got \"bad node\""},
      {"assignment job not id or null", MakeAllocationPlan(),
       [](Json& b) { b["assignments"][1]["job"] = 5; }, "body.assignments[1].job",
       "expected a job id or null"},
      {"assignment job missing", MakeAllocationPlan(),
       [](Json& b) { b["assignments"][1].erase("job"); }, "body.assignments[1].job",
       "missing (required)"},
      {"node assigned twice", MakeAllocationPlan(),
       [](Json& b) { b["assignments"][2]["node"] = "n0"; }, "body.assignments[2].node",
       "node \"n0\" is assigned more than once"},
      {"too many assignments", MakeAllocationPlan(),
       [](Json& b) {
         Json many = Json::array();
         for (int i = 0; i <= 100000; ++i) many.push_back({{"node", "n"}, {"job", nullptr}});
         b["assignments"] = std::move(many);
       },
       "body.assignments", "at most 100000 entries, got 100001"},
      {"job sized twice", MakeAllocationPlan(), [](Json& b) { b["sizes"][1]["job"] = "resnet"; },
       "body.sizes[1].job", "job \"resnet\" is listed more than once"},
      {"size too large", MakeAllocationPlan(), [](Json& b) { b["sizes"][0]["nodes"] = 100001; },
       "body.sizes[0].nodes", "[0, 100000], got 100001"},
      {"sizes not an array", MakeAllocationPlan(), [](Json& b) { b["sizes"] = Json::object(); },
       "body.sizes", "expected an array, got an object"},
      {"job launched twice", MakeAllocationPlan(),
       [](Json& b) { b["launches"][1]["job"] = "resnet"; }, "body.launches[1].job",
       "job \"resnet\" is listed more than once"},
      {"runtime id not an id", MakeAllocationPlan(),
       [](Json& b) { b["launches"][0]["runtime_id"] = "resnet i1"; }, "body.launches[0].runtime_id",
       "{1,128}$"},
      {"launch without bootstrap node", MakeAllocationPlan(),
       [](Json& b) { b["launches"][0].erase("bootstrap_node"); }, "body.launches[0].bootstrap_node",
       "missing"},
      {"status not an object", MakeAllocatorStatus(), [](Json& b) { b["status"] = Json::array(); },
       "body.status", "expected a JSON object"},
      {"saved: unknown key", MakeJobSaved(), [](Json& b) { b["snapshot_step"] = 3; },
       "body.snapshot_step",
       "unknown key; expected one of job, runtime_id, kind, step, bytes, write_s"},
      {"saved: job missing", MakeJobSaved(), [](Json& b) { b.erase("job"); }, "body.job",
       "missing (required)"},
      {"saved: runtime id not an id", MakeJobSaved(), [](Json& b) { b["runtime_id"] = "r/i1"; },
       "body.runtime_id", "{1,128}$, got \"r/i1\""},
      {"saved: unknown kind", MakeJobSaved(), [](Json& b) { b["kind"] = "checkpoint"; },
       "body.kind", "expected one of \"park\", \"snapshot\", got \"checkpoint\""},
      {"saved: kind missing", MakeJobSaved(), [](Json& b) { b.erase("kind"); }, "body.kind",
       "missing (required)"},
      {"saved: negative step", MakeJobSaved(), [](Json& b) { b["step"] = -1; }, "body.step",
       "[0, 9007199254740992], got -1"},
      {"saved: step not an integer", MakeJobSaved(), [](Json& b) { b["step"] = 12.5; }, "body.step",
       "expected an integer in [0, 9007199254740992], got 12.5"},
      {"saved: bytes beyond 2^53", MakeJobSaved(),
       [](Json& b) { b["bytes"] = (uint64_t{1} << 53) + 1; }, "body.bytes",
       "[0, 9007199254740992]"},
      {"saved: bytes a string", MakeJobSaved(), [](Json& b) { b["bytes"] = "250MB"; }, "body.bytes",
       "expected an integer"},
      {"saved: negative write time", MakeJobSaved(), [](Json& b) { b["write_s"] = -0.1; },
       "body.write_s", "expected seconds in [0, 86400]"},
      {"saved: write time over a day", MakeJobSaved(), [](Json& b) { b["write_s"] = 86401; },
       "body.write_s", "expected seconds in [0, 86400], got 86401"},
      {"saved: write time missing", MakeJobSaved(), [](Json& b) { b.erase("write_s"); },
       "body.write_s", "missing (required)"},
  };
}

TEST(MessagesRulesTest, EveryRuleIsRejectedNamingTheFieldAndTheRange) {
  for (const RuleCase& c : RuleCases()) {
    SCOPED_TRACE(c.name);
    Json body = BodyOf(c.base);
    c.patch(body);
    EXPECT_THAT(DecodeBody(TypeOf(c.base), body.dump()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(StartsWith(c.field + ": "), HasSubstr(c.expected))));
  }
}

TEST(MessagesRulesTest, TheSameRulesApplyWhenEncoding) {
  NodeRegister reg = MakeNodeRegister();
  reg.slots = 0;
  EXPECT_THAT(EncodeBody(reg),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("body.slots: expected an integer in [1, 1024]")));
  JobSubmit submit = MakeJobSubmit();
  submit.max_nodes = 1;
  EXPECT_THAT(ValidateMessage(submit),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("body.max_nodes: ")));
  NodeReclaim reclaim = MakeNodeReclaim();
  reclaim.grace = absl::Hours(2);
  EXPECT_THAT(EncodeBody(reclaim), StatusIs(absl::StatusCode::kInvalidArgument,
                                            StartsWith("body.grace_s: expected seconds in")));
  NodeLeave leave = MakeNodeLeave();
  leave.reason = "bad \xff byte";
  EXPECT_THAT(EncodeBody(leave), StatusIs(absl::StatusCode::kInvalidArgument,
                                          StartsWith("body.reason: not valid UTF-8 (byte 4)")));
  leave.reason = "\xed\xa0\x80";  // an encoded surrogate
  EXPECT_THAT(EncodeBody(leave),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid UTF-8")));
  leave.reason = "\xc0\xaf";  // overlong '/'
  EXPECT_THAT(EncodeBody(leave),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid UTF-8")));
  AdvisorReport report = MakeAdvisorReport();
  report.report_json = "[1]";
  EXPECT_THAT(EncodeBody(report),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("body.report: expected a JSON object, got an array")));
  report.report_json = "{\"a\":1,\"a\":2}";
  EXPECT_THAT(EncodeBody(report), StatusIs(absl::StatusCode::kInvalidArgument,
                                           StartsWith("body.report.a: duplicate key")));
  AllocationPlan plan = MakeAllocationPlan();
  plan.assignments[2].job = "";
  EXPECT_THAT(EncodeBody(plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                         StartsWith("body.assignments[2].job: ")));
  JobComplete complete = MakeJobComplete();
  complete.status = static_cast<JobStatus>(9);
  EXPECT_THAT(EncodeBody(complete),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("body.status: ")));
  JobSaved saved = MakeJobSaved();
  saved.kind = static_cast<SaveKind>(7);
  EXPECT_THAT(EncodeBody(saved), StatusIs(absl::StatusCode::kInvalidArgument,
                                          StartsWith("body.kind: unknown SaveKind 7")));
  saved = MakeJobSaved();
  saved.write_time = absl::Hours(25);
  EXPECT_THAT(EncodeBody(saved), StatusIs(absl::StatusCode::kInvalidArgument,
                                          StartsWith("body.write_s: expected seconds in [0, 86400]")));
  saved = MakeJobSaved();
  saved.bytes = -1;
  EXPECT_THAT(EncodeBody(saved), StatusIs(absl::StatusCode::kInvalidArgument,
                                          StartsWith("body.bytes: expected an integer in [0, ")));
}

TEST(MessagesRulesTest, DuplicateKeysAreRejected) {
  EXPECT_THAT(DecodeBody(MessageType::kNodeLeave, R"({"node":"a","reason":"x","node":"b"})"),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("body.node: duplicate key")));
}

TEST(MessagesRulesTest, DeepNestingIsRejectedBeforeParsing) {
  std::string report;
  for (int i = 0; i < 100; ++i) report += "[";
  for (int i = 0; i < 100; ++i) report += "]";
  EXPECT_THAT(DecodeBody(MessageType::kAdvisorReport,
                         absl::StrCat(R"({"job":"j","report":{"x":)", report, "}}")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nested deeper than 64")));
  // Brackets inside strings do not count.
  EXPECT_THAT(DecodeBody(MessageType::kAdvisorReport,
                         absl::StrCat(R"({"job":"j","report":{"x":")", report, "\"}}")),
              IsOk());
}

// A report may nest as deep as still fits in an envelope (64 levels with the
// envelope and the body), so every valid message encodes and decodes.
TEST(MessagesRulesTest, ReportDepthLeavesRoomForTheEnvelope) {
  auto nested = [](int depth) {
    std::string text = "{\"x\":";
    for (int i = 1; i < depth; ++i) text += "[";
    text += "1";
    for (int i = 1; i < depth; ++i) text += "]";
    return text + "}";
  };
  AdvisorReport report{"j", nested(62)};
  ASSERT_OK_AND_ASSIGN(std::string json, EncodeEnvelopeJson(Wrap(report)));
  EXPECT_THAT(DecodeEnvelopeJson(json), IsOk());
  report.report_json = nested(63);
  EXPECT_THAT(EncodeEnvelopeJson(Wrap(report)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("body.report: malformed JSON: nested deeper than 64 levels")));
}

TEST(MessagesRulesTest, MalformedJsonIsRejected) {
  EXPECT_THAT(DecodeBody(MessageType::kNodeLeave, R"({"node":"a","reason":)"),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("body: malformed JSON")));
  EXPECT_THAT(DecodeBody(MessageType::kNodeLeave, "{\"node\":\"a\",\"reason\":\"\xff\"}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed JSON")));
}

// --- envelope rules ------------------------------------------------------------------------------

Json EnvelopeOf(const Message& m) {
  absl::StatusOr<std::string> json = EncodeEnvelopeJson(Wrap(m));
  EXPECT_OK(json.status());
  return Json::parse(json.ok() ? *json : "{}");
}

TEST(EnvelopeJsonTest, HeaderRulesNameTheField) {
  const struct {
    std::string name;
    std::function<void(Json&)> patch;
    std::string field;
    std::string expected;
  } cases[] = {
      {"no version", [](Json& e) { e.erase("v"); }, "v", "missing (required)"},
      {"version 2", [](Json& e) { e["v"] = 2; }, "v",
       "unsupported protocol version 2; this build speaks version 1"},
      {"version string", [](Json& e) { e["v"] = "1"; }, "v", "unsupported protocol version"},
      {"unknown key", [](Json& e) { e["mac"] = "x"; }, "mac",
       "unknown key; expected one of v, type, sender, seq, ts, body"},
      {"unknown type", [](Json& e) { e["type"] = "node_explode"; }, "type",
       "unknown message type \"node_explode\"; expected one of node_register"},
      {"type not a string", [](Json& e) { e["type"] = 3; }, "type", "expected a string"},
      {"no sender", [](Json& e) { e.erase("sender"); }, "sender", "missing (required)"},
      {"bad sender", [](Json& e) { e["sender"] = "a b"; }, "sender", "{1,128}$"},
      {"seq 0", [](Json& e) { e["seq"] = 0; }, "seq", "[1, 2^64 - 1], got 0"},
      {"seq negative", [](Json& e) { e["seq"] = -4; }, "seq", "[1, 2^64 - 1], got -4"},
      {"seq float", [](Json& e) { e["seq"] = 4.5; }, "seq", "[1, 2^64 - 1], got 4.5"},
      {"ts string", [](Json& e) { e["ts"] = "now"; }, "ts", "expected a number"},
      {"ts negative", [](Json& e) { e["ts"] = -1.5; }, "ts", "unix seconds in [0, 1e10]"},
      {"no body", [](Json& e) { e.erase("body"); }, "body", "missing (required)"},
      {"body null", [](Json& e) { e["body"] = nullptr; }, "body", "expected an object, got null"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Json envelope = EnvelopeOf(MakeNodeLeave());
    c.patch(envelope);
    EXPECT_THAT(DecodeEnvelopeJson(envelope.dump()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(StartsWith(c.field + ": "), HasSubstr(c.expected))));
  }
}

TEST(EnvelopeJsonTest, LargestSeqIsAccepted) {
  Json envelope = EnvelopeOf(MakeNodeLeave());
  envelope["seq"] = UINT64_MAX;
  ASSERT_OK_AND_ASSIGN(Envelope back, DecodeEnvelopeJson(envelope.dump()));
  EXPECT_EQ(back.seq, UINT64_MAX);
  envelope["seq"] = 18446744073709551616.0;  // 2^64 parses as a float
  EXPECT_THAT(DecodeEnvelopeJson(envelope.dump()),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("seq: ")));
}

TEST(EnvelopeJsonTest, NotAnObjectOrNotJson) {
  EXPECT_THAT(DecodeEnvelopeJson("[1,2]"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("(top level): expected an envelope object, got an array")));
  EXPECT_THAT(DecodeEnvelopeJson(""),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("malformed JSON")));
  ASSERT_OK_AND_ASSIGN(std::string json, EncodeEnvelopeJson(Wrap(MakeNodeLeave())));
  EXPECT_THAT(DecodeEnvelopeJson(json.substr(0, json.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("malformed JSON")));
  EXPECT_THAT(DecodeEnvelopeJson(json + "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("malformed JSON")));
}

TEST(EnvelopeJsonTest, HeaderCheckRunsAfterTheHeaderAndBeforeTheBody) {
  Json envelope = EnvelopeOf(MakeNodeLeave());
  envelope["body"]["node"] = "bad node";
  std::vector<std::string> seen;
  auto check = [&](const EnvelopeHeader& h) {
    seen.push_back(absl::StrCat(MessageTypeName(h.type), " ", h.sender, " ", h.seq, " ",
                                absl::ToUnixMicros(h.ts)));
    return absl::FailedPreconditionError("header refused");
  };
  EXPECT_THAT(DecodeEnvelopeJson(envelope.dump(), check),
              StatusIs(absl::StatusCode::kFailedPrecondition, "header refused"));
  EXPECT_THAT(seen, ElementsAre("node_leave agent-n7 1 1700000000250000"));
  // With the header accepted, the body is checked.
  EXPECT_THAT(
      DecodeEnvelopeJson(envelope.dump(), [](const EnvelopeHeader&) { return absl::OkStatus(); }),
      StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("body.node: ")));
  // A bad header never reaches the check.
  envelope["seq"] = 0;
  seen.clear();
  EXPECT_THAT(DecodeEnvelopeJson(envelope.dump(), check),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("seq: ")));
  EXPECT_THAT(seen, IsEmpty());
}

TEST(EnvelopeJsonTest, EncodingChecksTheHeader) {
  Envelope envelope = Wrap(MakeNodeLeave());
  envelope.seq = 0;
  EXPECT_THAT(EncodeEnvelopeJson(envelope),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("seq: ")));
  envelope = Wrap(MakeNodeLeave());
  envelope.sender = "";
  EXPECT_THAT(EncodeEnvelopeJson(envelope),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("sender: ")));
  envelope = Wrap(MakeNodeLeave());
  envelope.ts = absl::UnixEpoch() - absl::Seconds(1);
  EXPECT_THAT(EncodeEnvelopeJson(envelope),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("ts: ")));
  envelope.ts = absl::InfiniteFuture();
  EXPECT_THAT(EncodeEnvelopeJson(envelope),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("ts: ")));
}

}  // namespace
}  // namespace malle::control
