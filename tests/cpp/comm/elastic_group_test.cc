// In-process tests of ControlStore and ElasticGroup: bad input gets a clear,
// bounded error; ranks as threads over one store go through planned changes.
#include "libmalle/comm/elastic_group.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include <ATen/ops/full.h>
#include <ATen/ops/sum.h>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "tests/cpp/testing/group_options.h"

namespace malle::comm {
namespace {

using ::malle::comm::testing::GroupOptions;
using ::malle::testing::IsOk;
using ::malle::testing::IsOkAndHolds;
using ::malle::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;
using ::testing::HasSubstr;

int UnusedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(ElasticGroupOptionsTest, EachInvalidFieldIsNamed) {
  struct Case {
    std::function<void(ElasticGroupOptions&)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](auto& o) { o.job_id = ""; }, "job_id"},
      {[](auto& o) { o.gloo.device_type = c10::DeviceType::CUDA; }, "gloo.device_type"},
      {[](auto& o) { o.job_id = "a b"; }, "job_id"},
      {[](auto& o) { o.member_id = "x/y"; }, "member_id"},
      {[](auto& o) { o.max_size = 0; }, "max_size"},
      {[](auto& o) { o.bootstrap_size = -1; }, "bootstrap_size"},
      {[](auto& o) { o.bootstrap_size = 5, o.max_size = 4; }, "bootstrap_size"},
      {[](auto& o) { o.rendezvous_timeout = absl::ZeroDuration(); }, "rendezvous_timeout"},
      {[](auto& o) { o.op_timeout = -absl::Seconds(1); }, "op_timeout"},
      {[](auto& o) { o.heartbeat_interval = absl::InfiniteDuration(); }, "heartbeat_interval"},
      {[](auto& o) { o.heartbeat_timeout = absl::Milliseconds(150); }, "heartbeat_timeout"},
      {[](auto& o) { o.recovery_grace = absl::ZeroDuration(); }, "recovery_grace"},
      {[](auto& o) { o.recovery_grace = absl::Milliseconds(50); }, "must be at least heartbeat_interval"},
      {[](auto& o) { o.max_recoveries_without_commit = 0; }, "max_recoveries_without_commit"},
  };
  for (const Case& c : cases) {
    ElasticGroupOptions o = GroupOptions("job", "m0", 1);
    EXPECT_THAT(o.Validate(), IsOk());
    c.mutate(o);
    EXPECT_THAT(o.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)));
    // Join reports the same error before touching the store.
    EXPECT_THAT(ElasticGroup::Join(ControlStore::InMemory(), o),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)));
  }
}

TEST(ControlStoreTest, RejectsBadEndpoints) {
  EXPECT_THAT(ControlStore::Host("not-an-ip", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("IPv4")));
  EXPECT_THAT(ControlStore::Host("127.0.0.1", 70000),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[0, 65535]")));
  EXPECT_THAT(ControlStore::Connect("127.0.0.1", 0, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ControlStore::Connect("127.0.0.1", 1234, absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
}

TEST(ControlStoreTest, UnreachableStoreFailsWithinItsTimeout) {
  const absl::Time start = absl::Now();
  auto store = ControlStore::Connect("127.0.0.1", UnusedPort(), absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(store, StatusIs(AnyOf(absl::StatusCode::kUnavailable,
                                    absl::StatusCode::kDeadlineExceeded)));
  EXPECT_LT(took, absl::Seconds(10)) << "must not hang past the configured timeout";
}

TEST(ControlStoreTest, HostedStoreIsLoopbackAndAtomic) {
  ASSERT_OK_AND_ASSIGN(auto host, ControlStore::Host());
  EXPECT_GT(host->port(), 0);
  ASSERT_OK_AND_ASSIGN(auto client, ControlStore::Connect("127.0.0.1", host->port(), absl::Seconds(5)));
  auto a = client->WithPrefix("job/a/");
  auto b = host->WithPrefix("job/b/");
  EXPECT_THAT(a->CreateIfAbsent("k", "first"), IsOkAndHolds("first"));
  EXPECT_THAT(a->CreateIfAbsent("k", "second"), IsOkAndHolds("first"));
  EXPECT_THAT(b->TryGet("k"), IsOkAndHolds(std::optional<std::string>()));  // prefixes isolate
  EXPECT_THAT(a->Add("n", 2), IsOkAndHolds(2));
  EXPECT_THAT(a->Add("n", 0), IsOkAndHolds(2));
  ASSERT_OK_AND_ASSIGN(auto clone, a->Clone());
  EXPECT_THAT(clone->Get("k", absl::Seconds(1)), IsOkAndHolds("first"));
  const absl::Time start = absl::Now();
  EXPECT_THAT(a->Get("missing", absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(a->CreateIfAbsent("k2", ""), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ElasticGroupTest, JoiningAJobThatDoesNotExistIsNotFound) {
  auto store = ControlStore::InMemory();
  ElasticGroupOptions o = GroupOptions("no-such-job", "m0", /*bootstrap=*/0);
  o.rendezvous_timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  EXPECT_THAT(ElasticGroup::Join(store, o),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-job")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ElasticGroupTest, IncompleteBootstrapTimesOutAndSaysHowManyCame) {
  auto store = ControlStore::InMemory();
  ElasticGroupOptions o = GroupOptions("job", "m0", /*bootstrap=*/2);
  o.rendezvous_timeout = absl::Milliseconds(500);
  EXPECT_THAT(ElasticGroup::Join(store, o),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("only 1 of 2")));
}

TEST(ElasticGroupTest, DuplicateMemberIdIsRejected) {
  auto store = ControlStore::InMemory();
  ASSERT_OK_AND_ASSIGN(auto first, ElasticGroup::Join(store, GroupOptions("job", "m0", 1)));
  EXPECT_EQ(first->size(), 1);
  EXPECT_THAT(ElasticGroup::Join(store, GroupOptions("job", "m0", 1)),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("'m0'")));
}

// Ranks as threads: bootstrap 3, allreduce, one leaves, one joins.
TEST(ElasticGroupTest, ThreadsGoThroughPlannedLeaveAndJoin) {
  auto store = ControlStore::InMemory();
  std::vector<std::unique_ptr<ElasticGroup>> groups(4);
  std::vector<absl::Status> errors(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      auto g = ElasticGroup::Join(store, GroupOptions("threads", "t" + std::to_string(i), 3));
      errors[i] = g.status();
      if (g.ok()) groups[i] = *std::move(g);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (int i = 0; i < 3; ++i) ASSERT_OK(errors[i]);
  EXPECT_EQ(groups[0]->members(), groups[1]->members());
  EXPECT_EQ(groups[0]->last_transition().kind, Transition::Kind::kBootstrap);

  // One step: allreduce of each rank's (rank + 1) is exact.
  std::vector<float> sums(3);
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      at::Tensor x = at::full({8}, static_cast<float>(groups[i]->rank() + 1), at::kFloat);
      errors[i] = groups[i]->comm().AllReduce(x);
      sums[i] = x.data_ptr<float>()[7];
      groups[i]->Commit(0);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(errors[i]);
    EXPECT_EQ(sums[i], 6.0f);
  }

  // t1 asks to leave and t3 asks to join; one boundary applies both.
  ASSERT_OK(ElasticGroup::RequestLeave(*store, "threads", "t1"));
  std::vector<Transition> seen(4);
  threads.emplace_back([&] {
    auto g = ElasticGroup::Join(store, GroupOptions("threads", "t3", 3));
    errors[3] = g.status();
    if (g.ok()) {
      seen[3] = (*g)->last_transition();
      groups[3] = *std::move(g);
    }
  });
  absl::SleepFor(absl::Milliseconds(200));  // t3's join request is queued
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      // Boundaries until the membership changes (the join may land one later).
      for (int k = 0; k < 50; ++k) {
        auto t = groups[i]->AtStepBoundary();
        if (!t.ok()) {
          errors[i] = t.status();
          return;
        }
        if (t->kind != Transition::Kind::kNone) {
          seen[i] = *t;
          if (t->kind == Transition::Kind::kLeft || t->size == 3) return;
        }
        absl::SleepFor(absl::Milliseconds(20));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) ASSERT_OK(errors[i]) << i;
  EXPECT_EQ(seen[1].kind, Transition::Kind::kLeft);
  EXPECT_FALSE(groups[1]->active());
  EXPECT_THAT(groups[1]->AtStepBoundary(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(seen[3].kind, Transition::Kind::kJoined);
  EXPECT_EQ(seen[0].members, seen[3].members);
  EXPECT_EQ(seen[2].members, seen[3].members);
  EXPECT_EQ(seen[3].size, 3);
  EXPECT_EQ(seen[3].members.back(), "t3");  // joiners are appended
  EXPECT_EQ(seen[3].resume_step, 1);         // survivors committed step 0
  EXPECT_EQ(seen[3].committed_by_rank[seen[3].rank], -1);
  // Every member, the joiner included, names the same joiners (a joiner has
  // no previous membership of its own to compare with).
  EXPECT_THAT(seen[3].joined, ElementsAre("t3"));
  EXPECT_THAT(seen[0].joined, ElementsAre("t3"));
  EXPECT_THAT(seen[2].joined, ElementsAre("t3"));
  EXPECT_NE(seen[3].state_source_rank, seen[3].rank);
}

// Ranks as threads: `n` members bootstrap job `job` as t0..t{n-1}.
std::vector<std::unique_ptr<ElasticGroup>> BootstrapThreads(const std::shared_ptr<ControlStore>& store,
                                                            const ElasticGroupOptions& base, int n) {
  std::vector<std::unique_ptr<ElasticGroup>> groups(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ElasticGroupOptions o = base;
      o.member_id = "t" + std::to_string(i);
      o.bootstrap_size = n;
      auto g = ElasticGroup::Join(store, o);
      EXPECT_THAT(g.status(), IsOk()) << o.member_id;
      if (g.ok()) groups[i] = *std::move(g);
    });
  }
  for (auto& t : threads) t.join();
  return groups;
}

// The members in `groups` (null = gone) call AtStepBoundary until their
// generation changes, then allreduce (rank + 1) once in the new one.
struct AfterBoundary {
  Transition transition;
  float sum = 0;
  absl::Duration took;
};
std::vector<AfterBoundary> RecoverThreads(std::vector<std::unique_ptr<ElasticGroup>>& groups) {
  std::vector<AfterBoundary> out(groups.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (!groups[i]) continue;
    threads.emplace_back([&, i] {
      const absl::Time start = absl::Now();
      for (int k = 0; k < 200; ++k) {
        auto t = groups[i]->AtStepBoundary();
        ASSERT_OK(t.status());
        if (t->kind == Transition::Kind::kNone) continue;
        out[i].transition = *t;
        out[i].took = absl::Now() - start;
        if (!t->active()) return;
        at::Tensor x = at::full({4}, static_cast<float>(t->rank + 1), at::kFloat);
        ASSERT_OK(groups[i]->comm().AllReduce(x));
        out[i].sum = x.data_ptr<float>()[3];
        return;
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// A node agent's ranks leave with one request: one generation change takes
// both out, whatever the boundary timing.
TEST(ElasticGroupTest, ANodesRanksLeaveInOneGenerationChange) {
  auto store = ControlStore::InMemory();
  auto groups = BootstrapThreads(store, GroupOptions("node-leave", "", 4), 4);
  ASSERT_EQ(groups.size(), 4u);
  std::vector<std::string> node;  // the two non-leaders play one node's ranks
  for (auto& g : groups) {
    if (g->rank() >= 2) node.push_back(g->member_id());
  }
  ASSERT_EQ(node.size(), 2u);
  ASSERT_OK(ElasticGroup::RequestLeave(*store, "node-leave", absl::MakeConstSpan(node)));
  std::vector<AfterBoundary> after = RecoverThreads(groups);
  for (size_t i = 0; i < groups.size(); ++i) {
    const Transition& t = after[i].transition;
    EXPECT_EQ(t.generation, 1) << i;
    if (groups[i]->rank() < 0 || !t.active()) {
      EXPECT_EQ(t.kind, Transition::Kind::kLeft) << i;
    } else {
      EXPECT_EQ(t.kind, Transition::Kind::kPlanned) << i;
      EXPECT_EQ(t.size, 2);
      EXPECT_THAT(t.removed, ::testing::UnorderedElementsAreArray(node));
      EXPECT_EQ(after[i].sum, 3.0f);  // 1 + 2: the two survivors allreduce in generation 1
    }
  }
  ASSERT_OK_AND_ASSIGN(GenerationRecord latest, ElasticGroup::LatestGeneration(*store, "node-leave"));
  EXPECT_EQ(latest.generation, 1);
  EXPECT_EQ(latest.members.size(), 2u);
}

// BeginStepBoundary(): the vote goes before the optimizer step; a boundary
// that changes nothing then needs no collective of its own, and one with a
// queued request agrees on it as usual.
TEST(ElasticGroupTest, EarlyVoteAppliesQueuedRequestsAndNothingElse) {
  auto store = ControlStore::InMemory();
  auto groups = BootstrapThreads(store, GroupOptions("early", "", 3), 3);
  ASSERT_EQ(groups.size(), 3u);
  std::vector<std::vector<Transition::Kind>> kinds(3);
  std::vector<absl::Status> errors(3);
  // Round r: every rank allreduces, begins the boundary, commits, and takes
  // the boundary. The leader asks rank 1 to leave during round 2, after its
  // early vote, so that round changes nothing and round 3 applies the leave.
  int leader = -1, leaver = -1, other = -1;
  for (int i = 0; i < 3; ++i) {
    (groups[i]->rank() == 0 ? leader : groups[i]->rank() == 1 ? leaver : other) = i;
  }
  auto round = [&](int i, int r) {
    at::Tensor x = at::full({4}, 1.0f, at::kFloat);
    errors[i] = groups[i]->comm().AllReduce(x);
    if (!errors[i].ok()) return false;
    errors[i] = groups[i]->BeginStepBoundary();
    if (!errors[i].ok()) return false;
    EXPECT_OK(groups[i]->BeginStepBoundary());  // a second call does nothing
    // The leader has looked at the queue: a request made now waits a step.
    if (r == 2 && i == leader) {
      EXPECT_OK(ElasticGroup::RequestLeave(*store, "early", groups[leaver]->member_id()));
    }
    groups[i]->Commit(r);
    auto t = groups[i]->AtStepBoundary();
    if (!t.ok()) {
      errors[i] = t.status();
      return false;
    }
    kinds[i].push_back(t->kind);
    return t->kind != Transition::Kind::kLeft;
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      for (int r = 0; r < 4; ++r) {
        if (!round(i, r)) return;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3; ++i) ASSERT_OK(errors[i]) << i;
  using K = Transition::Kind;
  EXPECT_THAT(kinds[leader], ElementsAre(K::kNone, K::kNone, K::kNone, K::kPlanned));
  EXPECT_THAT(kinds[leaver], ElementsAre(K::kNone, K::kNone, K::kNone, K::kLeft));
  EXPECT_THAT(kinds[other], ElementsAre(K::kNone, K::kNone, K::kNone, K::kPlanned));
  EXPECT_EQ(groups[leader]->size(), 2);
  EXPECT_EQ(groups[other]->members(), groups[leader]->members());
}

// A member killed while the early vote is in flight: the others' boundary
// recovers without it.
TEST(ElasticGroupTest, EarlyVoteOfAGenerationThatFailsRecovers) {
  auto store = ControlStore::InMemory();
  ElasticGroupOptions base = GroupOptions("early-fail", "", 3);
  base.recovery_grace = absl::Seconds(2);
  auto groups = BootstrapThreads(store, base, 3);
  ASSERT_EQ(groups.size(), 3u);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] { EXPECT_OK(groups[i]->BeginStepBoundary()); });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  // t2 never votes: it goes away as a killed process would (closed, reported).
  const std::string gone = groups[2]->member_id();
  groups[2].reset();
  ASSERT_OK(ElasticGroup::ReportDead(*store, "early-fail", gone));
  auto after = RecoverThreads(groups);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(after[i].transition.kind, Transition::Kind::kRecovered) << i;
    EXPECT_EQ(after[i].transition.size, 2) << i;
    EXPECT_EQ(after[i].sum, 3.0f) << i;
  }
}

// A member that closes its group without leaving (its program finished, or
// decided to stop on its own) is a failure for the others, and they recover
// without it. Its watchdog, woken by the close, used to check it in to the
// failed generation on its way out, so the next generation listed a member
// that no longer existed: the survivors built it, waited for its heartbeat to
// go stale, and only then recovered again. The long grace and heartbeat
// timeouts make that visible as time; the close now reports the member dead,
// so the survivors do not even wait for the grace.
// Gloo writes with writev(): a write to a peer killed by -9 raises SIGPIPE,
// whose default action would end this process too (a survivor exiting 141).
TEST(ElasticGroupTest, BuildingAGroupIgnoresSigpipe) {
  auto store = ControlStore::InMemory();
  auto groups = BootstrapThreads(store, GroupOptions("sigpipe", "", 1), 1);
  ASSERT_NE(groups[0], nullptr);
  struct sigaction current {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &current), 0);
  EXPECT_EQ(current.sa_handler, SIG_IGN);
}

TEST(ElasticGroupTest, SendAndRecvPointToPointAndBadPeersAreNamed) {
  auto store = ControlStore::InMemory();
  auto groups = BootstrapThreads(store, GroupOptions("p2p", "", 3), 3);
  for (const auto& g : groups) ASSERT_NE(g, nullptr);
  // Rank of each group (the bootstrap order decides it).
  std::vector<Communicator*> by_rank(3);
  for (const auto& g : groups) by_rank[g->rank()] = &g->comm();
  // Rank 0 sends two tagged tensors to rank 2; rank 1 takes no part.
  at::Tensor got_a = at::full({4}, 0.0f), got_b = at::full({2}, 0.0f);
  absl::Status sent_a, sent_b, recv_a, recv_b;
  std::thread sender([&] {
    sent_a = by_rank[0]->Send(at::full({4}, 7.0f), 2, /*tag=*/5);
    sent_b = by_rank[0]->Send(at::full({2}, 9.0f), 2, /*tag=*/6);
  });
  std::thread receiver([&] {
    recv_a = by_rank[2]->Recv(got_a, 0, 5);
    recv_b = by_rank[2]->Recv(got_b, 0, 6);
  });
  sender.join();
  receiver.join();
  EXPECT_THAT(sent_a, IsOk());
  EXPECT_THAT(sent_b, IsOk());
  EXPECT_THAT(recv_a, IsOk());
  EXPECT_THAT(recv_b, IsOk());
  EXPECT_EQ(got_a.sum().item<float>(), 28.0f);
  EXPECT_EQ(got_b.sum().item<float>(), 18.0f);
  EXPECT_THAT(by_rank[1]->Send(at::full({1}, 1.0f), 1, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another rank")));
  EXPECT_THAT(by_rank[1]->Recv(at::full({1}, 1.0f), 3, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got peer 3")));
  EXPECT_THAT(by_rank[1]->Send(at::full({1}, 1.0f), 0, -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tag -1")));
}

TEST(ElasticGroupTest, MemberThatClosesItsGroupIsNotInTheNextGeneration) {
  auto store = ControlStore::InMemory();
  ElasticGroupOptions o = GroupOptions("closing", "", 3);
  o.recovery_grace = absl::Seconds(8);
  o.heartbeat_timeout = absl::Seconds(8);
  auto groups = BootstrapThreads(store, o, 3);
  for (const auto& g : groups) ASSERT_NE(g, nullptr);
  groups[2].reset();
  std::vector<AfterBoundary> after = RecoverThreads(groups);
  for (int i = 0; i < 2; ++i) {
    const Transition& t = after[i].transition;
    EXPECT_EQ(t.kind, Transition::Kind::kRecovered) << i;
    EXPECT_EQ(t.generation, 1) << i;
    EXPECT_THAT(t.members, UnorderedElementsAre("t0", "t1")) << i;  // old relative order
    EXPECT_EQ(after[i].sum, 3.0f) << i;
    EXPECT_LT(after[i].took, absl::Seconds(4)) << i << ": waited for the member that closed";
  }
}

// The same when the member had already checked in to the failed generation
// (its collective failed first) and then gave up and closed its group before
// the survivors decided: its check-in must not make it a survivor.
TEST(ElasticGroupTest, MemberThatCheckedInAndThenClosedIsNotInTheNextGeneration) {
  auto store = ControlStore::InMemory();
  ElasticGroupOptions o = GroupOptions("checked-in-then-closed", "", 3);
  o.recovery_grace = absl::Seconds(8);
  o.heartbeat_timeout = absl::Seconds(8);
  auto groups = BootstrapThreads(store, o, 3);
  for (const auto& g : groups) ASSERT_NE(g, nullptr);
  // t2's collective "fails": its watchdog publishes the abort and checks in.
  groups[2]->comm().Abort(absl::UnavailableError("injected: allreduce failed"));
  auto job = store->WithPrefix(JobPrefix("checked-in-then-closed"));
  ASSERT_OK(job->Wait({"gen/0/checkin/t2"}, absl::Seconds(10)));
  groups[2].reset();
  std::vector<AfterBoundary> after = RecoverThreads(groups);
  for (int i = 0; i < 2; ++i) {
    const Transition& t = after[i].transition;
    EXPECT_EQ(t.kind, Transition::Kind::kRecovered) << i;
    EXPECT_EQ(t.generation, 1) << i << ": generation 1 listed the closed member";
    EXPECT_THAT(t.members, UnorderedElementsAre("t0", "t1")) << i;  // old relative order
    EXPECT_EQ(after[i].sum, 3.0f) << i;
    EXPECT_LT(after[i].took, absl::Seconds(4)) << i;
  }
}


// A failure that comes back at every attempt (here: every generation is
// aborted as soon as it is built) must not make the job recover forever: the
// member gives up with kAborted after max_recoveries_without_commit recoveries
// in a row, naming the failure. A committed step starts the count again.
TEST(ElasticGroupTest, RepeatedFailureWithoutACommitGivesUp) {
  auto store = ControlStore::InMemory();
  ElasticGroupOptions o = GroupOptions("gives-up", "solo", 1);
  o.max_recoveries_without_commit = 3;
  o.recovery_grace = absl::Milliseconds(100);
  ASSERT_OK_AND_ASSIGN(auto group, ElasticGroup::Join(store, o));
  auto fail_and_recover = [&]() -> absl::StatusOr<Transition> {
    group->comm().Abort(absl::UnavailableError("injected: allreduce failed"));
    return group->AtStepBoundary();
  };
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK_AND_ASSIGN(Transition t, fail_and_recover());
    EXPECT_EQ(t.kind, Transition::Kind::kRecovered);
  }
  group->Commit(0);  // progress: the count starts again
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(Transition t, fail_and_recover());
    EXPECT_EQ(t.kind, Transition::Kind::kRecovered) << i;
  }
  EXPECT_THAT(fail_and_recover(),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("3 recoveries in a row without a committed step"),
                             HasSubstr("injected: allreduce failed"))));
}

}  // namespace
}  // namespace malle::comm
