// BucketSync with ranks as threads over an in-memory store: a bucket is
// summed over the generation, its future completes with it, and
// a failed or absent communicator hands the bucket back unreduced with the
// error kept until Take().
#include "libmalle/elastic/bucket_sync.h"

#include <thread>

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "libmalle/comm/elastic_group.h"
#include "tests/cpp/testing/group_options.h"

namespace malle::elastic {
namespace {

using ::malle::comm::testing::GroupOptions;
using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

// Blocks until `future` completes (bounded: a sum on loopback takes
// milliseconds) and returns its tensor.
at::Tensor Result(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!future->completed() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_TRUE(future->completed()) << "the bucket's future did not complete within 20 s";
  return future->completed() ? future->value().toTensor() : at::Tensor();
}

TEST(BucketSyncTest, TwoRanksGetTheSumOfTheirBuckets) {
  auto store = comm::ControlStore::InMemory();
  std::vector<at::Tensor> got(2);
  std::vector<BucketSync::Tally> tallies(2);
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto g = comm::ElasticGroup::Join(store, GroupOptions("sum", "m" + std::to_string(i), 2));
      if (!g.ok()) {
        status[i] = g.status();
        return;
      }
      BucketSync sync;
      sync.Arm(&(*g)->comm());
      const float base = static_cast<float>((*g)->rank() + 1);  // rank 0: 1, 2, 3; rank 1: 2, 4, 6
      at::Tensor first = at::tensor({base, 2 * base, 3 * base});
      at::Tensor second = at::tensor({10 * base});
      auto f1 = sync.Launch(first);
      auto f2 = sync.Launch(second);
      at::Tensor r1 = Result(f1);
      Result(f2);
      EXPECT_TRUE(r1.is_same(first)) << "the future must hold the bucket itself";
      got[i] = first;
      tallies[i] = sync.Take();
      EXPECT_TRUE(at::allclose(second, at::tensor({30.0f})));
      (*g)->Finish();
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(status[i]) << "member " << i;
    EXPECT_TRUE(at::allclose(got[i], at::tensor({3.0f, 6.0f, 9.0f}))) << got[i];
    EXPECT_EQ(tallies[i].launched, 2);
    EXPECT_EQ(tallies[i].completed, 2);
    EXPECT_OK(tallies[i].error);
  }
}

TEST(BucketSyncTest, UnarmedOrDisarmedHandsTheBucketBackUnchanged) {
  BucketSync sync;
  at::Tensor a = at::tensor({4.0f, 8.0f});
  auto f = sync.Launch(a);  // never armed
  ASSERT_TRUE(f->completed());
  EXPECT_TRUE(at::equal(Result(f), at::tensor({4.0f, 8.0f})));
  sync.Arm(nullptr);
  at::Tensor b = at::tensor({4.0f});
  ASSERT_TRUE(sync.Launch(b)->completed());
  EXPECT_TRUE(at::equal(b, at::tensor({4.0f})));
  BucketSync::Tally t = sync.Take();
  EXPECT_EQ(t.launched, 2);
  EXPECT_EQ(t.completed, 2);
  EXPECT_OK(t.error);
  EXPECT_TRUE(t.last_launch.has_value());
  EXPECT_FALSE(sync.Take().last_launch.has_value()) << "Take() resets the tally";
}

TEST(BucketSyncTest, AFailedSumIsKeptUntilTakeAndLaterBucketsSkipTheSum) {
  auto store = comm::ControlStore::InMemory();
  ASSERT_OK_AND_ASSIGN(auto g, comm::ElasticGroup::Join(store, GroupOptions("abort", "m0", 1)));
  BucketSync sync;
  g->comm().Abort(absl::UnavailableError("test: peer lost"));
  sync.Arm(&g->comm());
  at::Tensor a = at::tensor({2.0f});
  at::Tensor b = at::tensor({6.0f});
  Result(sync.Launch(a));
  auto fb = sync.Launch(b);
  ASSERT_TRUE(fb->completed()) << "after a failure, a bucket is handed back at once";
  EXPECT_TRUE(at::equal(b, at::tensor({6.0f})));
  BucketSync::Tally t = sync.Take();
  EXPECT_EQ(t.launched, 2);
  EXPECT_EQ(t.completed, 2);
  EXPECT_THAT(t.error, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("peer lost")));
  EXPECT_OK(sync.Take().error) << "Take() resets the tally";
  g->Finish();
}

TEST(BucketSyncTest, AfterCloseBucketsAreHandedBackWithoutACollective) {
  auto store = comm::ControlStore::InMemory();
  ASSERT_OK_AND_ASSIGN(auto g, comm::ElasticGroup::Join(store, GroupOptions("close", "m0", 1)));
  BucketSync sync;
  sync.Arm(&g->comm());
  at::Tensor a = at::tensor({3.0f});
  EXPECT_TRUE(at::equal(Result(sync.Launch(a)), at::tensor({3.0f})));  // one rank: the sum is a
  EXPECT_OK(sync.Take().error);
  sync.Close();
  sync.Close();  // idempotent
  // An aborted communicator fails every collective at once: a bucket that
  // reached it would leave that error in the tally.
  g->comm().Abort(absl::UnavailableError("test: aborted after close"));
  auto f = sync.Launch(at::tensor({3.0f}));
  ASSERT_TRUE(f->completed());
  BucketSync::Tally t = sync.Take();
  EXPECT_EQ(t.launched, 1);
  EXPECT_EQ(t.completed, 1);
  EXPECT_OK(t.error) << "a closed BucketSync started a collective";
  g->Finish();
}

}  // namespace
}  // namespace malle::elastic
