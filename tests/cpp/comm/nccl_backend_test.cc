// The device (CUDA) data backends: NCCL, and Gloo for CUDA tensors. The GPU
// tests skip themselves (they do not fail) where no GPU is visible; they ran on
// an H100 (docs/benchmarks.md, "GPU").
#include "libmalle/comm/nccl_backend.h"

#include <thread>

#include <ATen/ops/full.h>

#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "libmalle/comm/elastic_group.h"
#include "libmalle/comm/internal/reaper.h"

namespace malle::comm {
namespace {

using ::malle::testing::StatusIs;

ElasticGroupOptions Options(const std::string& job, const std::string& member, int bootstrap,
                            std::shared_ptr<const BackendFactory> data) {
  ElasticGroupOptions o;
  o.job_id = job;
  o.member_id = member;
  o.bootstrap_size = bootstrap;
  o.rendezvous_timeout = absl::Seconds(60);
  o.data_backend = std::move(data);
  return o;
}

TEST(NcclBackendTest, WithoutAGpuTheFactorySaysSo) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  GroupSpec spec;
  EXPECT_THAT(MakeNcclBackend()->Create(spec), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(GlooBackendTest, OnlyCpuAndCudaTensors) {
  GlooBackendOptions o;
  o.device_type = c10::DeviceType::Meta;
  GroupSpec spec;
  EXPECT_THAT(MakeGlooBackend(o)->Create(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("CPU or CUDA")));
}

TEST(NcclBackendTest, SingleRankGroupReducesCudaTensors) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  {
    ASSERT_OK_AND_ASSIGN(auto group, ElasticGroup::Join(ControlStore::InMemory(),
                                                        Options("nccl", "g0", 1, MakeNcclBackend())));
    at::Tensor x = at::full({1024}, 3.0f, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0));
    ASSERT_OK(group->comm().AllReduce(x));
    EXPECT_EQ(x.cpu().data_ptr<float>()[0], 3.0f);
    EXPECT_EQ(group->comm().data_backend_name(), "nccl");
    // CPU tensors still go through the Gloo control group.
    at::Tensor y = at::full({4}, 2.0f, at::kFloat);
    ASSERT_OK(group->comm().AllReduce(y));
    EXPECT_EQ(y.data_ptr<float>()[0], 2.0f);
  }
  // The generation's NCCL group is shut down (not just destroyed) before exit.
  internal::DrainReaper();
}

// Several ranks on one GPU: NCCL refuses that, Gloo reduces the CUDA tensors
// through host memory.
TEST(GlooCudaBackendTest, TwoRanksOnOneGpuReduceCudaTensors) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  GlooBackendOptions gloo;
  gloo.device_type = c10::DeviceType::CUDA;
  auto data = MakeGlooBackend(gloo);
  auto store = ControlStore::InMemory();
  std::vector<absl::Status> errors(2);
  std::vector<float> got(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto g = ElasticGroup::Join(store, Options("gloo-cuda", "g" + std::to_string(i), 2, data));
      if (!g.ok()) {
        errors[i] = g.status();
        return;
      }
      at::Tensor x = at::full({1 << 20}, static_cast<float>((*g)->rank() + 1),
                              at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0));
      errors[i] = (*g)->comm().AllReduce(x);
      got[i] = x.cpu().data_ptr<float>()[(1 << 20) - 1];
      (*g)->Finish();
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(errors[i]);
    EXPECT_EQ(got[i], 3.0f);
  }
  internal::DrainReaper();
}

}  // namespace
}  // namespace malle::comm
