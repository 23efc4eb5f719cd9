// ElasticTrainer on a CUDA model with the NCCL data backend (one rank: the
// machines these tests ran on have one GPU). Skips without a visible GPU; the
// suite must pass without one. What runs: the model's flat buffer, the
// Reducer's buckets and the state live on the GPU, gradients are reduced by
// NCCL, and the result equals the same job on Gloo through host memory.
#include <ATen/ops/allclose.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <torch/optim/adam.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "libmalle/comm/nccl_backend.h"
#include "tests/cpp/testing/group_options.h"
#include "libmalle/elastic/elastic_trainer.h"

namespace malle::elastic {
namespace {

at::Tensor Train(const std::string& job, const std::string& backend) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({64, 8}).cuda();
  at::Tensor w = at::randn({8, 4}).cuda().set_requires_grad(true);
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.05));
  ElasticTrainerOptions o;
  o.logical_workers = 2;
  o.num_samples = 64;
  o.batch_size = 4;
  o.steps = 10;
  o.backend = backend;
  auto trainer = ElasticTrainer::Create(comm::ControlStore::InMemory(), comm::testing::GroupOptions(job, "m0", 1),
                                        o, ModelState::FromTensors({w}), adam);
  EXPECT_OK(trainer.status());
  if (!trainer.ok()) return at::Tensor();
  for (;;) {
    auto plan = (*trainer)->NextStep();
    EXPECT_OK(plan.status());
    if (!plan.ok() || !plan->has_value()) break;
    for (size_t i = 0; i < (*plan)->workers.size(); ++i) {
      (*trainer)->BeginMicroBatch(i);
      at::Tensor rows = at::tensor((*plan)->workers[i].indices, at::kLong).cuda();
      at::matmul(x.index_select(0, rows), w).pow(2).mean().backward();
      EXPECT_OK((*trainer)->EndMicroBatch());
    }
    auto committed = (*trainer)->FinishStep();
    EXPECT_TRUE(committed.ok() && *committed);
  }
  EXPECT_EQ((*trainer)->step(), 10);
  EXPECT_OK((*trainer)->StateDigest().status());
  return w.detach().cpu();
}

TEST(ElasticTrainerNcclTest, ACudaModelTrainsOnNcclLikeOnGloo) {
  if (comm::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  comm::RegisterNcclBackend();
  at::Tensor nccl = Train("nccl", "nccl");
  at::Tensor gloo = Train("gloo", "gloo");
  ASSERT_TRUE(nccl.defined() && gloo.defined());
  EXPECT_TRUE(at::allclose(nccl, gloo, 1e-5, 1e-6)) << nccl << gloo;
}

TEST(ElasticTrainerNcclTest, NcclForACpuModelIsNamed) {
  comm::RegisterNcclBackend();
  at::Tensor w = at::randn({8, 4}).set_requires_grad(true);
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.05));
  ElasticTrainerOptions o;
  o.logical_workers = 1;
  o.num_samples = 8;
  o.batch_size = 4;
  o.steps = 1;
  o.backend = "nccl";
  EXPECT_THAT(ElasticTrainer::Create(comm::ControlStore::InMemory(), comm::testing::GroupOptions("cpu", "m0", 1), o,
                                     ModelState::FromTensors({w}), adam),
              malle::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                       ::testing::HasSubstr("backend='nccl' reduces CUDA tensors")));
}

}  // namespace
}  // namespace malle::elastic
