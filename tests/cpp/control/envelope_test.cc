#include "libmalle/control/wire/envelope.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "libmalle/control/wire/hmac.h"
#include "libmalle/control/wire/messages.h"
#include "libmalle/control/wire/secret.h"

namespace malle::control {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::IsOkAndHolds;
using ::malle::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Optional;
using ::testing::StartsWith;

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

Secret TestSecret(char fill = 'k') { return *Secret::FromBytes(std::string(32, fill)); }

NodeLeave Leave(const std::string& node = "n1") { return NodeLeave{node, "drained"}; }

std::string MustSign(const Message& m, const std::string& sender, uint64_t seq,
                     absl::Time ts = kNow, const Secret& secret = TestSecret()) {
  absl::StatusOr<std::string> wire = Sign(m, secret, sender, seq, ts);
  EXPECT_OK(wire.status());
  return wire.ok() ? *wire : "";
}

// Signs arbitrary envelope text the way Sign does, to test what happens
// after a valid MAC (a buggy or newer sender holding the secret).
std::string SignRaw(const std::string& json, const Secret& secret = TestSecret()) {
  return absl::StrCat(json, " ", MacToHex(HmacSha256(secret, absl::StrCat(kMacContext, json))));
}

std::vector<Message> OneOfEach() {
  NodeRegister reg;
  reg.node = "n1";
  reg.agent = "agent-1";
  reg.node_class = {"cpu", 1};
  JobSubmit submit;
  submit.job = "j";
  submit.command = {"/bin/true"};
  AllocationPlan plan;
  plan.plan = 3;
  plan.decided_at = kNow;
  plan.assignments = {{"n1", "j"}, {"n2", std::nullopt}};
  plan.sizes = {{"j", 1}};
  return {reg,
          NodeReclaim{"n1", absl::Seconds(10), "owner"},
          Leave(),
          AgentHeartbeat{"n1", RunningRank{"j", "m0", 77}},
          RankExit{"n1", "j", "m0", 1, 0},
          submit,
          JobCancel{"j", "user"},
          AdvisorReport{"j", R"({"rec":"grow"})"},
          JobComplete{"j", JobStatus::kSucceeded, 10, 640, "done"},
          plan};
}

TEST(SignVerifyTest, EveryTypeRoundTrips) {
  ReplayGuard guard;
  const Secret secret = TestSecret();
  uint64_t seq = 1;
  for (const Message& m : OneOfEach()) {
    SCOPED_TRACE(MessageTypeName(TypeOf(m)));
    ASSERT_OK_AND_ASSIGN(std::string wire, Sign(m, secret, "allocator", seq, kNow));
    ASSERT_OK_AND_ASSIGN(Envelope got, Verify(wire, secret, guard, kNow));
    EXPECT_EQ(got.sender, "allocator");
    EXPECT_EQ(got.seq, seq);
    EXPECT_EQ(got.ts, kNow);
    EXPECT_TRUE(got.message == m);
    ++seq;
  }
  EXPECT_THAT(guard.HighestSeq("allocator"), Optional(seq - 1));
}

TEST(SignVerifyTest, WireIsTheEnvelopeJsonASpaceAndTheHexMac) {
  const Secret secret = TestSecret();
  const std::string wire = MustSign(Leave(), "agent-1", 5);
  Envelope envelope;
  envelope.sender = "agent-1";
  envelope.seq = 5;
  envelope.ts = kNow;
  envelope.message = Leave();
  ASSERT_OK_AND_ASSIGN(std::string json, EncodeEnvelopeJson(envelope));
  EXPECT_EQ(wire, SignRaw(json));
  EXPECT_THAT(wire, MatchesRegex("\\{[^\n]*\\} [0-9a-f]{64}"));
  // The MAC is over the context and the JSON, not the JSON alone.
  EXPECT_NE(wire, absl::StrCat(json, " ", MacToHex(HmacSha256(secret, json))));
}

// Known answer, computed independently in Python:
//   data = json.dumps(envelope, separators=(",", ":")).encode()
//   data + b" " + hmac.new(b"k" * 32, b"malle-control-mac-v1\n" + data, hashlib.sha256).hexdigest()
TEST(SignVerifyTest, WireMatchesAnIndependentImplementation) {
  constexpr char kWire[] =
      R"({"v":1,"type":"node_leave","sender":"agent-1","seq":5,"ts":1700000000.25,)"
      R"("body":{"node":"n1","reason":"drained"}} )"
      "b5774f2e395e0784713908153886c2061051b7e531f9419d5faa496fd1ae9100";
  const absl::Time ts = kNow + absl::Milliseconds(250);
  EXPECT_THAT(Sign(Leave(), TestSecret(), "agent-1", 5, ts), IsOkAndHolds(std::string(kWire)));
  ReplayGuard guard;
  ASSERT_OK_AND_ASSIGN(Envelope got, Verify(kWire, TestSecret(), guard, kNow));
  EXPECT_TRUE(got.message == Message(Leave()));
  EXPECT_EQ(got.ts, ts);
}

TEST(SignVerifyTest, SignRejectsInvalidMessagesAndHeaders) {
  const Secret secret = TestSecret();
  EXPECT_THAT(Sign(Leave("bad node"), secret, "a", 1, kNow),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("body.node: ")));
  EXPECT_THAT(Sign(Leave(), secret, "a b", 1, kNow),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("sender: ")));
  EXPECT_THAT(Sign(Leave(), secret, "a", 0, kNow),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("seq: ")));
}

TEST(SignVerifyTest, SignRefusesAMessageReceiversWouldRefuseAsTooLarge) {
  AllocationPlan plan;
  for (int i = 0; i < 40000; ++i) plan.assignments.push_back({absl::StrCat("node-", i), "job"});
  EXPECT_THAT(Sign(plan, TestSecret(), "allocator", 1, kNow),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("allocation_plan"), HasSubstr("1048576-byte limit"))));
}

TEST(VerifyTest, OversizedIsRejectedBeforeAnythingElse) {
  ReplayGuard guard;
  const std::string huge(kDefaultMaxMessageBytes + 1, 'x');
  EXPECT_THAT(Verify(huge, TestSecret(), guard, kNow),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1048577 bytes exceeds the limit of 1048576 bytes")));
  // A correctly signed message over a configured limit is refused for its size.
  const std::string wire = MustSign(Leave(), "a", 1);
  VerifyOptions small;
  small.max_message_bytes = 128;
  ASSERT_GT(wire.size(), 128u);
  EXPECT_THAT(Verify(wire, TestSecret(), guard, kNow, small),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds the limit")));
}

TEST(VerifyTest, UnsignedIsUnauthenticated) {
  ReplayGuard guard;
  Envelope envelope;
  envelope.sender = "a";
  envelope.seq = 1;
  envelope.ts = kNow;
  envelope.message = Leave();
  ASSERT_OK_AND_ASSIGN(std::string json, EncodeEnvelopeJson(envelope));
  for (const std::string& wire :
       {json, std::string(), std::string("x"), json + " ", json + " " + std::string(63, 'a')}) {
    EXPECT_THAT(Verify(wire, TestSecret(), guard, kNow),
                StatusIs(absl::StatusCode::kUnauthenticated, StartsWith("unsigned")));
  }
  // Uppercase hex is not the format.
  std::string wire = MustSign(Leave(), "a", 1);
  for (size_t i = wire.size() - 64; i < wire.size(); ++i) wire[i] = 'A';
  EXPECT_THAT(Verify(wire, TestSecret(), guard, kNow),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("malformed MAC")));
}

TEST(VerifyTest, TruncatedIsRejected) {
  ReplayGuard guard;
  const std::string wire = MustSign(Leave(), "a", 1);
  for (size_t keep : {wire.size() - 1, wire.size() - 64, wire.size() / 2, size_t{10}}) {
    SCOPED_TRACE(keep);
    EXPECT_THAT(Verify(wire.substr(0, keep), TestSecret(), guard, kNow),
                StatusIs(absl::StatusCode::kUnauthenticated));
  }
  // Cut from the front: the MAC no longer matches.
  EXPECT_THAT(Verify(wire.substr(1), TestSecret(), guard, kNow),
              StatusIs(absl::StatusCode::kUnauthenticated, StartsWith("forged")));
  EXPECT_EQ(guard.size(), 0u);
}

TEST(VerifyTest, EverySingleBitFlipIsUnauthenticated) {
  const std::string wire = MustSign(Leave(), "a", 1);
  for (size_t i = 0; i < wire.size(); ++i) {
    for (int bit : {0, 5}) {
      std::string flipped = wire;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      ReplayGuard guard;
      EXPECT_THAT(Verify(flipped, TestSecret(), guard, kNow),
                  StatusIs(absl::StatusCode::kUnauthenticated))
          << "byte " << i << " bit " << bit;
    }
  }
}

TEST(VerifyTest, BodyFlipInTheJsonIsForged) {
  ReplayGuard guard;
  std::string wire = MustSign(Leave(), "a", 1);
  const size_t at = wire.find("drained");
  wire[at] ^= 1;  // "erained"
  EXPECT_THAT(Verify(wire, TestSecret(), guard, kNow),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       "forged or corrupted control message: the MAC does not match (the message "
                       "was altered, or it was signed with a different secret)"));
}

TEST(VerifyTest, WrongSecretIsForged) {
  ReplayGuard guard;
  const std::string wire = MustSign(Leave(), "a", 1, kNow, TestSecret('x'));
  EXPECT_THAT(Verify(wire, TestSecret('k'), guard, kNow),
              StatusIs(absl::StatusCode::kUnauthenticated, StartsWith("forged")));
  EXPECT_THAT(Verify(wire, TestSecret('x'), guard, kNow), IsOk());
}

TEST(VerifyTest, MacIsCheckedBeforeJson) {
  ReplayGuard guard;
  // Garbage with a well-formed (but wrong) MAC: forged, not "malformed JSON".
  const std::string garbage = absl::StrCat("{not json", " ", std::string(64, 'a'));
  EXPECT_THAT(Verify(garbage, TestSecret(), guard, kNow),
              StatusIs(absl::StatusCode::kUnauthenticated, StartsWith("forged")));
  // The same garbage correctly signed reaches the parser.
  EXPECT_THAT(Verify(SignRaw("{not json"), TestSecret(), guard, kNow),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("malformed JSON")));
  // Even an empty JSON part, correctly signed, is malformed rather than unsigned.
  EXPECT_THAT(Verify(SignRaw(""), TestSecret(), guard, kNow),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("malformed JSON")));
}

TEST(VerifyTest, AuthenticatedButUnsupportedVersionOrTypeIsInvalid) {
  ReplayGuard guard;
  const std::string v2 =
      R"({"v":2,"type":"node_leave","sender":"a","seq":1,"ts":1700000000,"body":{}})";
  EXPECT_THAT(Verify(SignRaw(v2), TestSecret(), guard, kNow),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("v: unsupported protocol version 2")));
  const std::string type =
      R"({"v":1,"type":"node_fly","sender":"a","seq":1,"ts":1700000000,"body":{}})";
  EXPECT_THAT(Verify(SignRaw(type), TestSecret(), guard, kNow),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("type: unknown")));
}

TEST(VerifyTest, ReplayedIsAlreadyExists) {
  ReplayGuard guard;
  const std::string first = MustSign(Leave(), "a", 10);
  ASSERT_OK(Verify(first, TestSecret(), guard, kNow).status());
  EXPECT_THAT(Verify(first, TestSecret(), guard, kNow),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       "replayed control message from sender 'a': seq 10 is not above the last "
                       "accepted seq 10"));
  // An older seq, even never seen, is refused too.
  EXPECT_THAT(Verify(MustSign(Leave(), "a", 9), TestSecret(), guard, kNow),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("seq 9")));
  EXPECT_OK(Verify(MustSign(Leave(), "a", 11), TestSecret(), guard, kNow).status());
}

TEST(VerifyTest, SeqOrderIsPerSender) {
  ReplayGuard guard;
  const Secret secret = TestSecret();
  EXPECT_OK(Verify(MustSign(Leave(), "a", 100), secret, guard, kNow).status());
  EXPECT_OK(Verify(MustSign(Leave(), "b", 1), secret, guard, kNow).status());
  EXPECT_THAT(Verify(MustSign(Leave(), "a", 50), secret, guard, kNow),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_OK(Verify(MustSign(Leave(), "b", 2), secret, guard, kNow).status());
  EXPECT_OK(Verify(MustSign(Leave(), "c", 50), secret, guard, kNow).status());
  EXPECT_THAT(guard.HighestSeq("a"), Optional(uint64_t{100}));
  EXPECT_THAT(guard.HighestSeq("b"), Optional(uint64_t{2}));
  EXPECT_THAT(guard.HighestSeq("c"), Optional(uint64_t{50}));
  EXPECT_EQ(guard.HighestSeq("d"), std::nullopt);
}

TEST(VerifyTest, StaleIsFailedPreconditionInBothDirections) {
  ReplayGuard guard;
  const Secret secret = TestSecret();
  const std::string old = MustSign(Leave(), "a", 1, kNow - absl::Seconds(31));
  EXPECT_THAT(Verify(old, secret, guard, kNow),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(StartsWith("stale control message from sender 'a' seq 1"),
                             HasSubstr("31s behind now"), HasSubstr("the limit is 30s"))));
  const std::string ahead = MustSign(Leave(), "a", 2, kNow + absl::Seconds(31));
  EXPECT_THAT(Verify(ahead, secret, guard, kNow),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("31s ahead of now")));
  EXPECT_EQ(guard.size(), 0u);  // nothing recorded
  // Exactly at the limit is accepted; a wider limit accepts more.
  EXPECT_OK(
      Verify(MustSign(Leave(), "a", 3, kNow - absl::Seconds(30)), secret, guard, kNow).status());
  VerifyOptions wide;
  wide.max_skew = absl::Minutes(5);
  EXPECT_OK(Verify(MustSign(Leave(), "a", 4, kNow - absl::Seconds(200)), secret, guard, kNow, wide)
                .status());
}

TEST(VerifyTest, StalenessIsCheckedBeforeReplayAndReplayBeforeTheBody) {
  ReplayGuard guard;
  const Secret secret = TestSecret();
  ASSERT_OK(Verify(MustSign(Leave(), "a", 5), secret, guard, kNow).status());
  // Stale and replayed: reported as stale.
  EXPECT_THAT(Verify(MustSign(Leave(), "a", 5, kNow - absl::Minutes(5)), secret, guard, kNow),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // Replayed with a bad body: reported as replayed.
  const std::string bad_body = R"({"v":1,"type":"node_leave","sender":"a","seq":5,"ts":1700000000,)"
                               R"("body":{"node":"bad node","reason":""}})";
  EXPECT_THAT(Verify(SignRaw(bad_body), secret, guard, kNow),
              StatusIs(absl::StatusCode::kAlreadyExists));
  // Fresh with a bad body: the body's field, and the seq is not consumed.
  const std::string fresh_bad = absl::StrReplaceAll(bad_body, {{"\"seq\":5", "\"seq\":6"}});
  EXPECT_THAT(Verify(SignRaw(fresh_bad), secret, guard, kNow),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("body.node: ")));
  EXPECT_THAT(guard.HighestSeq("a"), Optional(uint64_t{5}));
  EXPECT_OK(Verify(MustSign(Leave(), "a", 6), secret, guard, kNow).status());
}

TEST(VerifyTest, InvalidOptionsAreRejected) {
  ReplayGuard guard;
  const std::string wire = MustSign(Leave(), "a", 1);
  VerifyOptions options;
  options.max_skew = -absl::Seconds(1);
  EXPECT_THAT(Verify(wire, TestSecret(), guard, kNow, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("VerifyOptions.max_skew")));
  options = VerifyOptions();
  options.max_message_bytes = 10;
  EXPECT_THAT(
      Verify(wire, TestSecret(), guard, kNow, options),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("VerifyOptions.max_message_bytes")));
}

// --- ReplayGuard ---------------------------------------------------------------------------------

TEST(ReplayGuardTest, EvictsTheLeastRecentlyAcceptedSenderAndRaisesTheWatermark) {
  ReplayGuardOptions options;
  options.max_senders = 2;
  ReplayGuard guard(options);
  guard.Record("a", 1, kNow);
  guard.Record("b", 1, kNow + absl::Seconds(1));
  guard.Record("a", 2, kNow + absl::Seconds(2));  // a is now the most recent
  EXPECT_EQ(guard.watermark(), absl::InfinitePast());
  guard.Record("c", 1, kNow + absl::Seconds(3));  // evicts b
  EXPECT_EQ(guard.size(), 2u);
  EXPECT_EQ(guard.HighestSeq("b"), std::nullopt);
  EXPECT_THAT(guard.HighestSeq("a"), Optional(uint64_t{2}));
  EXPECT_EQ(guard.watermark(), kNow + absl::Seconds(1));
  // Anything b sent before its eviction is refused...
  EXPECT_THAT(guard.Check("b", 1, kNow + absl::Seconds(1)),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       AllOf(HasSubstr("not tracked"), HasSubstr("eviction watermark"))));
  // ...as is a new sender with an old ts; later messages are fresh.
  EXPECT_THAT(guard.Check("d", 1, kNow), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_OK(guard.Check("b", 1, kNow + absl::Seconds(1) + absl::Microseconds(1)));
  EXPECT_OK(guard.Check("d", 1, kNow + absl::Seconds(5)));
}

TEST(ReplayGuardTest, WatermarkIsTheLatestTsOfTheEvictedSenderNotItsLast) {
  ReplayGuardOptions options;
  options.max_senders = 1;
  ReplayGuard guard(options);
  guard.Record("a", 1, kNow + absl::Seconds(10));
  guard.Record("a", 2, kNow);  // ts went back (a clock step); seq still rose
  guard.Record("b", 1, kNow + absl::Seconds(20));
  EXPECT_EQ(guard.watermark(), kNow + absl::Seconds(10));
  EXPECT_THAT(guard.Check("a", 1, kNow + absl::Seconds(10)),
              StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST(ReplayGuardTest, SaveAndLoadRestoreSeqsWatermarkAndOrder) {
  ReplayGuardOptions options;
  options.max_senders = 3;
  ReplayGuard guard(options);
  const Secret secret = TestSecret();
  const std::string accepted = MustSign(Leave(), "agent-1", 7);
  ASSERT_OK(Verify(accepted, secret, guard, kNow).status());
  guard.Record("agent-2", 3, kNow + absl::Nanoseconds(1500));  // rounded up when saved
  guard.Record("agent-3", uint64_t{1} << 62, kNow);
  guard.Record("agent-4", 1, kNow);                     // evicts agent-1
  guard.Record("agent-1", 8, kNow + absl::Seconds(1));  // evicts agent-2
  const std::string saved = guard.Save();
  EXPECT_THAT(saved, StartsWith("malle-replay-guard v1\n"));

  ASSERT_OK_AND_ASSIGN(ReplayGuard loaded, ReplayGuard::Load(saved, options));
  EXPECT_EQ(loaded.Save(), saved);
  EXPECT_EQ(loaded.size(), 3u);
  EXPECT_THAT(loaded.HighestSeq("agent-1"), Optional(uint64_t{8}));
  EXPECT_THAT(loaded.HighestSeq("agent-3"), Optional(uint64_t{1} << 62));
  EXPECT_EQ(loaded.HighestSeq("agent-2"), std::nullopt);
  EXPECT_EQ(loaded.watermark(), kNow + absl::Microseconds(2));
  // The restored guard still refuses the message accepted before the save.
  EXPECT_THAT(Verify(accepted, secret, loaded, kNow), StatusIs(absl::StatusCode::kAlreadyExists));
  // LRU order survived: the next new sender evicts agent-3, the least recent.
  loaded.Record("agent-5", 1, kNow);
  EXPECT_EQ(loaded.HighestSeq("agent-3"), std::nullopt);
  EXPECT_THAT(loaded.HighestSeq("agent-4"), Optional(uint64_t{1}));
}

TEST(ReplayGuardTest, LoadIntoASmallerGuardEvictsTheOldest) {
  ReplayGuard guard;
  guard.Record("a", 1, kNow);
  guard.Record("b", 1, kNow + absl::Seconds(1));
  guard.Record("c", 1, kNow + absl::Seconds(2));
  ReplayGuardOptions small;
  small.max_senders = 1;
  ASSERT_OK_AND_ASSIGN(ReplayGuard loaded, ReplayGuard::Load(guard.Save(), small));
  EXPECT_EQ(loaded.size(), 1u);
  EXPECT_THAT(loaded.HighestSeq("c"), Optional(uint64_t{1}));
  EXPECT_EQ(loaded.watermark(), kNow + absl::Seconds(1));
}

TEST(ReplayGuardTest, LoadRejectsMalformedText) {
  ReplayGuard empty;
  const std::string good = empty.Save();
  EXPECT_THAT(ReplayGuard::Load(good), IsOk());
  const std::string header = "malle-replay-guard v1\nwatermark_us none\n";
  const struct {
    std::string text;
    std::string expected;
  } cases[] = {
      {"", "line 1: expected the header"},
      {"malle-replay-guard v2\nwatermark_us none\nsenders 0\n", "line 1: expected the header"},
      {"malle-replay-guard v1\nwatermark_us soon\nsenders 0\n", "line 2: watermark_us"},
      {header + "senders 2\na 1 5\n", "line 3: expected \"senders 1\""},
      {header + "senders 1\na 0 5\n", "line 4: seq"},
      {header + "senders 1\na x 5\n", "line 4: seq"},
      {header + "senders 1\na 1\n", "line 4: expected \"<sender> <seq>"},
      {header + "senders 1\na/b 1 5\n", "line 4: sender: expected an id"},
      {header + "senders 1\na 1 5.5\n", "line 4: latest ts"},
      {header + "senders 2\na 1 5\na 2 6\n", "line 5: sender 'a' appears twice"},
      {header + "senders 0", "does not end with a newline"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    EXPECT_THAT(ReplayGuard::Load(c.text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.expected)));
  }
  ReplayGuardOptions zero;
  zero.max_senders = 0;
  EXPECT_THAT(ReplayGuard::Load(good, zero),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_senders")));
}

// --- SequenceCounter -----------------------------------------------------------------------------

TEST(SequenceCounterTest, IncreasesAndFollowsTheClockAcrossRestarts) {
  SequenceCounter counter;
  const uint64_t first = counter.Next(kNow);
  EXPECT_EQ(first, static_cast<uint64_t>(absl::ToUnixMicros(kNow)));
  EXPECT_EQ(counter.Next(kNow), first + 1);                     // same instant: still increasing
  EXPECT_EQ(counter.Next(kNow - absl::Seconds(1)), first + 2);  // clock stepped back
  // A restarted sender a second later starts above everything sent before.
  SequenceCounter restarted;
  EXPECT_GT(restarted.Next(kNow + absl::Seconds(1)), first + 2);
}

}  // namespace
}  // namespace malle::control
