// GradReducer on one rank (the sum over one rank is the identity, so what
// comes out is exactly the gradient divided by the divisor): both ways a
// gradient reaches its bucket (a fresh tensor from autograd after the
// gradients were dropped, and the bucket view itself when they were zeroed in
// place), micro-batches that only accumulate, and bad arguments.
#include "libmalle/elastic/grad_reducer.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tensor.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "libmalle/comm/elastic_group.h"
#include "tests/cpp/testing/group_options.h"

namespace malle::elastic {
namespace {

using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

class GradReducerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(group_, comm::ElasticGroup::Join(
                                     store_, comm::testing::GroupOptions("reducer", "m0", 1)));
    w_ = at::tensor({1.0f, 2.0f, 3.0f}).set_requires_grad(true);
    b_ = at::tensor({0.5f}).set_requires_grad(true);
    // Buckets of 4 bytes: b (the first in reverse order, 4 bytes) fills one,
    // w another.
    ASSERT_OK_AND_ASSIGN(reducer_, GradReducer::Create({w_, b_}, 4));
  }
  void TearDown() override {
    reducer_.reset();
    if (group_ != nullptr) group_->Finish();
  }

  // One backward of sum(x * w + b): d/dw = x, d/db = 3.
  void Backward(float scale) {
    at::Tensor x = at::tensor({scale, 2 * scale, 4 * scale});
    at::sum(x * w_ + b_).backward();
  }

  std::shared_ptr<comm::ControlStore> store_ = comm::ControlStore::InMemory();
  std::unique_ptr<comm::ElasticGroup> group_;
  at::Tensor w_, b_;
  std::unique_ptr<GradReducer> reducer_;
};

TEST_F(GradReducerTest, GradientsAreDividedAndBecomeTheirBuckets) {
  ASSERT_EQ(reducer_->num_buckets(), 2);
  for (int step = 0; step < 3; ++step) {
    // Step 0: no bucket view is known yet (the Reducer copies the gradient
    // in). Step 1: gradients dropped, autograd allocates fresh ones, which
    // the hook scales into the buckets. Step 2: zeroed in place, so autograd
    // accumulates into the bucket views and the hook divides in place.
    if (step < 2) {
      w_.mutable_grad() = at::Tensor();
      b_.mutable_grad() = at::Tensor();
    } else {
      w_.mutable_grad().zero_();
      b_.mutable_grad().zero_();
    }
    const at::Tensor w_bucket = w_.grad().defined() ? w_.grad() : at::Tensor();
    Backward(1.0f);  // a micro-batch that only accumulates: nothing divided
    ASSERT_OK(reducer_->Arm(&group_->comm(), 4.0));
    Backward(3.0f);
    absl::Status sync;
    ASSERT_OK(reducer_->Finish(&sync));
    ASSERT_OK(sync);
    // (x(1) + x(3)) / 4 and (3 + 3) / 4.
    EXPECT_TRUE(at::allclose(w_.grad(), at::tensor({1.0f, 2.0f, 4.0f}))) << "step " << step << ": " << w_.grad();
    EXPECT_TRUE(at::allclose(b_.grad(), at::tensor({1.5f}))) << "step " << step << ": " << b_.grad();
    EXPECT_TRUE(w_.grad().is_view()) << "step " << step << ": the gradient is not its bucket's view";
    if (w_bucket.defined()) {
      EXPECT_EQ(w_.grad().data_ptr(), w_bucket.data_ptr()) << "step " << step << ": the bucket moved";
    }
  }
}

TEST_F(GradReducerTest, ADivisorOfOneLeavesTheSumAsItIs) {
  ASSERT_OK(reducer_->Arm(&group_->comm(), 1.0));
  Backward(2.0f);
  absl::Status sync;
  ASSERT_OK(reducer_->Finish(&sync));
  ASSERT_OK(sync);
  EXPECT_TRUE(at::allclose(w_.grad(), at::tensor({2.0f, 4.0f, 8.0f}))) << w_.grad();
  EXPECT_TRUE(at::allclose(b_.grad(), at::tensor({3.0f}))) << b_.grad();
}

TEST_F(GradReducerTest, WithoutACommunicatorNothingIsDivided) {
  // After a failure the step is redone: its gradients are handed back as
  // they are, neither summed nor divided.
  ASSERT_OK(reducer_->Arm(nullptr, 4.0));
  Backward(2.0f);
  absl::Status sync;
  ASSERT_OK(reducer_->Finish(&sync));
  EXPECT_OK(sync);
  EXPECT_TRUE(at::allclose(w_.grad(), at::tensor({2.0f, 4.0f, 8.0f}))) << w_.grad();
}

TEST_F(GradReducerTest, BadDivisorAndMisuseAreNamed) {
  for (double d : {0.0, -2.0, std::nan(""), HUGE_VAL}) {
    EXPECT_THAT(reducer_->Arm(&group_->comm(), d),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("divisor must be finite and > 0")))
        << d;
  }
  absl::Status sync;
  EXPECT_THAT(reducer_->Finish(&sync), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not armed")));
  ASSERT_OK(reducer_->Arm(&group_->comm(), 2.0));
  EXPECT_THAT(reducer_->Arm(&group_->comm(), 2.0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already armed")));
}

TEST_F(GradReducerTest, BucketsFollowReverseParameterOrderWhateverTheReadyOrder) {
  // A joiner that has run no step and a survivor must reduce one layout: it is
  // fixed at creation, the last parameters first (their gradients are usually
  // ready first, and buckets are launched in order), and no backward changes it.
  EXPECT_THAT(reducer_->buckets(), ::testing::ElementsAre(::testing::ElementsAre(1u),
                                                          ::testing::ElementsAre(0u)));
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(reducer_->Arm(&group_->comm(), 2.0));
    at::sum(b_ * 3 + at::tensor({1.0f, 2.0f, 4.0f}) * w_).backward();  // b's gradient ready first
    absl::Status sync;
    ASSERT_OK(reducer_->Finish(&sync));
    ASSERT_OK(sync);
  }
  EXPECT_THAT(reducer_->buckets(), ::testing::ElementsAre(::testing::ElementsAre(1u),
                                                          ::testing::ElementsAre(0u)));
}

// A post-accumulate-grad hook registered on a parameter after the reducer was
// made (Python's register_post_accumulate_grad_hook replaces the slot) must
// not drop the division: Arm() puts the division back in front and the other
// hook still runs.
class CountingHook : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit CountingHook(int* calls) : calls_(calls) {}
  void operator()(const torch::autograd::Variable&) override { ++*calls_; }

 private:
  int* calls_;
};

TEST_F(GradReducerTest, AHookRegisteredLaterKeepsTheDivisionAndStillRuns) {
  int calls = 0;
  torch::autograd::impl::set_post_acc_grad_hooks(w_, std::make_unique<CountingHook>(&calls));
  ASSERT_OK(reducer_->Arm(&group_->comm(), 4.0));
  Backward(2.0f);
  absl::Status sync;
  ASSERT_OK(reducer_->Finish(&sync));
  ASSERT_OK(sync);
  EXPECT_TRUE(at::allclose(w_.grad(), at::tensor({0.5f, 1.0f, 2.0f}))) << w_.grad();  // x(2) / 4
  EXPECT_EQ(calls, 1);
}

TEST(GradReducerCreateTest, RefusesNoParametersAndBadBucketSize) {
  EXPECT_THAT(GradReducer::Create({}, 1024), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no parameters")));
  at::Tensor w = at::tensor({1.0f}).set_requires_grad(true);
  EXPECT_THAT(GradReducer::Create({w}, 0), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bucket_bytes")));
  EXPECT_THAT(GradReducer::Create({w}, 1024, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("first_bucket_bytes")));
}

TEST(GradReducerCreateTest, TheFirstBucketIsSmallAsDdpsSoCommunicationStartsEarly) {
  // DDP's layout: filled from the last parameter on, the first bucket capped
  // at first_bucket_bytes (1 MiB by default), the others at bucket_bytes.
  // With one cap for all, a model smaller than a bucket has one bucket, and
  // nothing is reduced before its backward has ended (measured on a GPU:
  // malletrain 1.1-1.2x DDP's step time, docs/benchmarks.md).
  std::shared_ptr<comm::ControlStore> store = comm::ControlStore::InMemory();
  ASSERT_OK_AND_ASSIGN(auto group,
                       comm::ElasticGroup::Join(store, comm::testing::GroupOptions("first", "m0", 1)));
  std::vector<at::Tensor> params;
  for (int n : {4, 4, 4, 1}) params.push_back(at::ones({n}).set_requires_grad(true));  // 16, 16, 16, 4 bytes
  // Reverse order: d (4 bytes) and c (16) reach the first cap of 20 bytes;
  // b and a share the next bucket (cap 1000).
  ASSERT_OK_AND_ASSIGN(auto reducer, GradReducer::Create(params, 1000, 20));
  EXPECT_EQ(reducer->num_buckets(), 2);  // c10d's own count, after it fixed its layout
  EXPECT_THAT(reducer->buckets(), ::testing::ElementsAre(::testing::ElementsAre(3u, 2u),
                                                         ::testing::ElementsAre(1u, 0u)));
  ASSERT_OK(reducer->Arm(&group->comm(), 2.0));
  at::Tensor loss = at::zeros({});
  for (const at::Tensor& p : params) loss = loss + at::sum(p * 3);
  loss.backward();
  absl::Status sync;
  ASSERT_OK(reducer->Finish(&sync));
  ASSERT_OK(sync);
  for (const at::Tensor& p : params) EXPECT_TRUE(at::allclose(p.grad(), at::full_like(p, 1.5))) << p.grad();
  // The default first cap is DDP's 1 MiB; a first cap above bucket_bytes is
  // bucket_bytes.
  ASSERT_OK_AND_ASSIGN(auto one_cap, GradReducer::Create(params, 20, 1000));
  EXPECT_THAT(one_cap->buckets(), ::testing::ElementsAre(::testing::ElementsAre(3u, 2u),
                                                         ::testing::ElementsAre(1u, 0u)));
  one_cap.reset();
  reducer.reset();
  group->Finish();
}

}  // namespace
}  // namespace malle::elastic
