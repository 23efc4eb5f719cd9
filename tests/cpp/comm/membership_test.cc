#include "libmalle/comm/membership.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::comm {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using Kind = ChangeRequest::Kind;

GenerationRecord Gen(std::vector<std::string> members, int64_t consumed = 0,
                     std::vector<std::string> deferred = {}) {
  GenerationRecord r;
  r.generation = 3;
  r.members = std::move(members);
  r.requests_consumed = consumed;
  r.deferred_joins = std::move(deferred);
  return r;
}

struct PlanCase {
  std::string name;
  GenerationRecord current;
  std::vector<ChangeRequest> requests;
  int max_size;
  std::vector<std::string> next;
  std::vector<std::string> joined;
  std::vector<std::string> removed;
  std::vector<std::string> deferred;
  size_t notes;
  std::string park = "";
  std::string leave_again = "";
};

class PlanNextMembersTest : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PlanNextMembersTest, Decides) {
  const PlanCase& c = GetParam();
  PlannedChange change = PlanNextMembers(c.current, c.requests, c.max_size);
  EXPECT_EQ(change.next, c.next);
  EXPECT_EQ(change.joined, c.joined);
  EXPECT_EQ(change.removed, c.removed);
  EXPECT_EQ(change.deferred, c.deferred);
  EXPECT_EQ(change.notes.size(), c.notes) << ::testing::PrintToString(change.notes);
  EXPECT_EQ(change.park, c.park);
  EXPECT_EQ(change.leave_again, c.leave_again);
  EXPECT_EQ(change.changed, c.next != c.current.members);
  EXPECT_EQ(change.requests_consumed,
            c.current.requests_consumed + static_cast<int64_t>(c.requests.size()));
}

INSTANTIATE_TEST_SUITE_P(
    Table, PlanNextMembersTest,
    ::testing::Values(
        PlanCase{"nothing", Gen({"a", "b"}), {}, 8, {"a", "b"}, {}, {}, {}, 0},
        PlanCase{"leave_keeps_order", Gen({"a", "b", "c", "d"}), {{Kind::kLeave, "b"}}, 8,
                 {"a", "c", "d"}, {}, {"b"}, {}, 0},
        PlanCase{"leader_leaves_next_oldest_leads", Gen({"a", "b", "c"}), {{Kind::kLeave, "a"}}, 8,
                 {"b", "c"}, {}, {"a"}, {}, 0},
        PlanCase{"joins_append_in_queue_order", Gen({"a"}),
                 {{Kind::kJoin, "x"}, {Kind::kJoin, "y"}}, 8, {"a", "x", "y"}, {"x", "y"}, {}, {}, 0},
        PlanCase{"join_and_leave_together", Gen({"a", "b"}),
                 {{Kind::kLeave, "a"}, {Kind::kJoin, "x"}}, 8, {"b", "x"}, {"x"}, {"a"}, {}, 0},
        PlanCase{"max_size_defers", Gen({"a", "b"}), {{Kind::kJoin, "x"}, {Kind::kJoin, "y"}}, 3,
                 {"a", "b", "x"}, {"x"}, {}, {"y"}, 0},
        PlanCase{"deferred_admitted_first_when_room", Gen({"a", "b"}, 5, {"w"}),
                 {{Kind::kLeave, "b"}, {Kind::kJoin, "x"}}, 3, {"a", "w", "x"}, {"w", "x"}, {"b"},
                 {}, 0},
        PlanCase{"leave_cancels_deferred_join", Gen({"a"}, 0, {"w"}), {{Kind::kLeave, "w"}}, 1,
                 {"a"}, {}, {}, {}, 1},
        PlanCase{"last_member_stays_and_parks", Gen({"a"}), {{Kind::kLeave, "a"}}, 8, {"a"}, {}, {},
                 {}, 1, "a"},
        PlanCase{"everyone_leaves_the_last_one_parks", Gen({"a", "b", "c"}),
                 {{Kind::kLeave, "a"}, {Kind::kLeave, "b"}, {Kind::kLeave, "c"}}, 8, {"c"}, {},
                 {"a", "b"}, {}, 1, "c"},
        PlanCase{"last_member_with_a_joiner_hands_over_instead_of_parking", Gen({"a"}),
                 {{Kind::kLeave, "a"}, {Kind::kJoin, "x"}}, 8, {"a", "x"}, {"x"}, {}, {}, 1, "",
                 "a"},
        PlanCase{"leave_of_stranger_noted", Gen({"a", "b"}), {{Kind::kLeave, "z"}}, 8, {"a", "b"},
                 {}, {}, {}, 1},
        PlanCase{"duplicate_join_noted", Gen({"a", "b"}), {{Kind::kJoin, "b"}, {Kind::kJoin, "x"},
                 {Kind::kJoin, "x"}}, 8, {"a", "b", "x"}, {"x"}, {}, {}, 2},
        PlanCase{"shrink_to_one_then_grow", Gen({"a", "b", "c", "d"}),
                 {{Kind::kLeave, "b"}, {Kind::kLeave, "c"}, {Kind::kLeave, "d"},
                  {Kind::kJoin, "x"}, {Kind::kJoin, "y"}},
                 8, {"a", "x", "y"}, {"x", "y"}, {"b", "c", "d"}, {}, 0}),
    [](const ::testing::TestParamInfo<PlanCase>& info) { return info.param.name; });

TEST(RecordTest, RoundTrips) {
  GenerationRecord r = Gen({"w0", "w1.a", "host-1_2"}, 17, {"w9"});
  r.cause = GenerationCause::kRecovery;
  r.reason = "recovery from generation 2: peer\ngone";
  r.park = "w1.a";
  ASSERT_OK_AND_ASSIGN(GenerationRecord back, DecodeRecord(EncodeRecord(r)));
  r.reason = "recovery from generation 2: peer gone";  // newlines are flattened
  EXPECT_EQ(back, r);
}

TEST(RecordTest, NodesRoundTripAndAreOptional) {
  GenerationRecord r = Gen({"w0", "w1", "w2"});
  r.nodes = {"node-a", "", "10.0.0.2:host"};  // "": that member did not say
  ASSERT_OK_AND_ASSIGN(GenerationRecord back, DecodeRecord(EncodeRecord(r)));
  EXPECT_EQ(back, r);
  EXPECT_EQ(back.NodeOf("w2"), "10.0.0.2:host");
  EXPECT_EQ(back.NodeOf("w1"), "");
  EXPECT_EQ(back.NodeOf("stranger"), "");
  // No node known: no field, and the record reads as it did before nodes existed.
  GenerationRecord plain = Gen({"w0"});
  EXPECT_THAT(EncodeRecord(plain), Not(HasSubstr("nodes=")));
  ASSERT_OK_AND_ASSIGN(GenerationRecord back_plain, DecodeRecord(EncodeRecord(plain)));
  EXPECT_TRUE(back_plain.nodes.empty());
  EXPECT_EQ(back_plain.NodeOf("w0"), "");
}

TEST(RecordTest, RejectsMalformedRecordsNamingTheField) {
  const std::string good = EncodeRecord(Gen({"a", "b"}));
  struct Bad {
    std::string text;
    std::string mentions;
  };
  const std::vector<Bad> cases = {
      {"", "missing field 'v'"},
      {"v=2\n", "unsupported version '2'"},
      {"v=1\ngeneration=x\ncause=planned\nmembers=a\nconsumed=0\n", "'generation'"},
      {"v=1\ngeneration=-4\ncause=planned\nmembers=a\nconsumed=0\n", "'generation'"},
      {"v=1\ngeneration=1\ncause=magic\nmembers=a\nconsumed=0\n", "'cause'"},
      {"v=1\ngeneration=1\ncause=planned\nmembers=\nconsumed=0\n", "'members' is empty"},
      {"v=1\ngeneration=1\ncause=planned\nmembers=a,a\nconsumed=0\n", "twice"},
      {"v=1\ngeneration=1\ncause=planned\nmembers=a,b c\nconsumed=0\n", "character ' '"},
      {"v=1\ngeneration=1\ncause=planned\nmembers=a\nconsumed=0\nextra=1\n", "unknown field 'extra'"},
      {"v=1\ngeneration=1\ngeneration=2\ncause=planned\nmembers=a\nconsumed=0\n", "duplicate field"},
      {"v=1\ngeneration=1\ncause=planned\nmembers=a\n", "missing field 'consumed'"},
      {"v=1\ngeneration=1\ncause=planned\nmembers=a\nconsumed=0\npark=a b\n", "park"},
      {"v=1\ngeneration=1\ncause=planned\nmembers=a,b\nnodes=n1\nconsumed=0\n", "'nodes' has 1 entries for 2"},
      {"v=1\ngeneration=1\ncause=planned\nmembers=a,b\nnodes=n1,n 2\nconsumed=0\n", "nodes 'n 2'"},
  };
  for (const Bad& bad : cases) {
    EXPECT_THAT(DecodeRecord(bad.text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(bad.mentions)))
        << bad.text;
  }
  EXPECT_THAT(DecodeRecord(good), IsOk());
}

TEST(RequestTest, RoundTripsAndRejectsGarbage) {
  ASSERT_OK_AND_ASSIGN(ChangeRequest r, DecodeRequest(EncodeRequest({Kind::kLeave, "w3"})));
  EXPECT_EQ(r, (ChangeRequest{Kind::kLeave, "w3"}));
  EXPECT_THAT(DecodeRequest("evict w3"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kind")));
  EXPECT_THAT(DecodeRequest("join "), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("member")));
  EXPECT_THAT(DecodeRequest("join a/b"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(RequestTest, ANodesLeavesAreOneEntryAndOneChange) {
  // A node agent with 2 slots asks its two ranks to leave: one queue entry,
  // which a leader reads whole, so both go in the same generation change.
  const std::string entry = EncodeLeaves({"n1-5-r3", "n1-5-r4"});
  EXPECT_EQ(entry, "leave n1-5-r3,n1-5-r4");
  ASSERT_OK_AND_ASSIGN(std::vector<ChangeRequest> rs, DecodeRequests(entry));
  EXPECT_THAT(rs, ElementsAre(ChangeRequest{Kind::kLeave, "n1-5-r3"}, ChangeRequest{Kind::kLeave, "n1-5-r4"}));
  PlannedChange change = PlanNextMembers(Gen({"n0-1-r1", "n0-1-r2", "n1-5-r3", "n1-5-r4"}), rs, 8);
  EXPECT_TRUE(change.changed);
  EXPECT_THAT(change.next, ElementsAre("n0-1-r1", "n0-1-r2"));
  EXPECT_THAT(change.removed, ElementsAre("n1-5-r3", "n1-5-r4"));
  // A single request decodes as before.
  ASSERT_OK_AND_ASSIGN(std::vector<ChangeRequest> one, DecodeRequests("join x"));
  EXPECT_THAT(one, ElementsAre(ChangeRequest{Kind::kJoin, "x"}));
  // Only leaves come in groups; a malformed list names the field.
  EXPECT_THAT(DecodeRequests("join a,b"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("member")));
  EXPECT_THAT(DecodeRequests("leave a,,b"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("member")));
  EXPECT_THAT(DecodeRequests("leave a,b/c"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("member")));
}

TEST(ValidateIdTest, NamesTheFieldAndTheProblem) {
  EXPECT_THAT(ValidateId("job_id", "mnist-1.v2_a"), IsOk());
  EXPECT_THAT(ValidateId("job_id", ""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id")));
  EXPECT_THAT(ValidateId("job_id", std::string(129, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1..128")));
  EXPECT_THAT(ValidateId("member_id", "a/b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("member_id 'a/b'")));
}

TEST(SurvivingMembersTest, KeepsOldOrder) {
  EXPECT_THAT(SurvivingMembers({"d", "a", "c", "b"}, {"b", "d", "c"}), ElementsAre("d", "c", "b"));
  EXPECT_THAT(SurvivingMembers({"a"}, {}), ElementsAre());
}

TEST(SurvivingMembersTest, CheckedInButReportedDeadIsLeftOut) {
  struct Case {
    std::vector<std::string> old_members;
    absl::flat_hash_set<std::string> checked_in;
    absl::flat_hash_set<std::string> dead;
    std::vector<std::string> expected;
  };
  for (const Case& c : std::vector<Case>{
           // A member that checked in and then closed its group (or whose
           // launcher saw it exit) must not be waited for in the next one.
           {{"a", "b", "c"}, {"a", "b", "c"}, {"c"}, {"a", "b"}},
           {{"a", "b", "c"}, {"a", "c"}, {"b"}, {"a", "c"}},  // dead, never checked in
           {{"a", "b", "c"}, {"b", "c"}, {"a"}, {"b", "c"}},  // the old leader
           {{"a", "b"}, {"a", "b"}, {"x"}, {"a", "b"}},       // a stranger's report
           // Never empty: if every check-in is reported dead, reports are ignored.
           {{"a", "b"}, {"b"}, {"b"}, {"b"}},
       }) {
    EXPECT_EQ(SurvivingMembers(c.old_members, c.checked_in, c.dead), c.expected)
        << ::testing::PrintToString(c.old_members);
  }
}

TEST(ChooseResumePointTest, NewestCommitLowestRank) {
  struct Case {
    std::vector<int64_t> committed;
    int64_t resume;
    int source;
  };
  for (const Case& c : std::vector<Case>{{{-1, -1}, 0, 0},
                                         {{9, 9, 9}, 10, 0},
                                         {{9, 10, 10}, 11, 1},
                                         {{-1, 41, 40}, 42, 1},
                                         {{5}, 6, 0}}) {
    ResumePoint p = ChooseResumePoint(c.committed);
    EXPECT_EQ(p.resume_step, c.resume) << ::testing::PrintToString(c.committed);
    EXPECT_EQ(p.source_rank, c.source) << ::testing::PrintToString(c.committed);
  }
}

TEST(HeartbeatTrackerTest, StaleOnlyWhenCounterStops) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  HeartbeatTracker tracker(absl::Seconds(1));
  tracker.Reset({"a", "b"}, t0);
  tracker.Observe("a", 1, t0);
  tracker.Observe("b", 1, t0);
  tracker.Observe("a", 2, t0 + absl::Milliseconds(600));
  EXPECT_TRUE(tracker.Stale(t0 + absl::Milliseconds(900)).empty());
  tracker.Observe("a", 3, t0 + absl::Milliseconds(1200));
  tracker.Observe("b", 1, t0 + absl::Milliseconds(1200));  // unchanged counter
  EXPECT_THAT(tracker.Stale(t0 + absl::Milliseconds(1200)), ElementsAre("b"));
  EXPECT_EQ(tracker.SilentFor("b", t0 + absl::Milliseconds(1200)), absl::Milliseconds(1200));
  // A new generation starts everyone fresh (a member that froze in the old one
  // is not blamed before it had a chance in the new one).
  tracker.Reset({"b"}, t0 + absl::Seconds(5));
  EXPECT_TRUE(tracker.Stale(t0 + absl::Milliseconds(5500)).empty());
  EXPECT_THAT(tracker.Stale(t0 + absl::Seconds(6)), ElementsAre("b"));
  tracker.Observe("zz", 9, t0);  // unknown members are ignored
  EXPECT_THAT(tracker.Stale(t0 + absl::Seconds(6)), ElementsAre("b"));
}

}  // namespace
}  // namespace malle::comm
