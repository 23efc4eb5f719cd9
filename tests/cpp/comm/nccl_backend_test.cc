// The NCCL path: skipped (not failed) where no GPU is visible.
#include "libmalle/comm/nccl_backend.h"

#include <ATen/ops/full.h>

#include "gtest/gtest.h"
#include "libmalle/base/testing/status_matchers.h"
#include "libmalle/comm/elastic_group.h"

namespace malle::comm {
namespace {

using ::malle::testing::StatusIs;

TEST(NcclBackendTest, WithoutAGpuTheFactorySaysSo) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  GroupSpec spec;
  EXPECT_THAT(MakeNcclBackend()->Create(spec), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(NcclBackendTest, SingleRankGroupReducesCudaTensors) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  ElasticGroupOptions o;
  o.job_id = "nccl";
  o.member_id = "g0";
  o.bootstrap_size = 1;
  o.data_backend = MakeNcclBackend();
  ASSERT_OK_AND_ASSIGN(auto group, ElasticGroup::Join(ControlStore::InMemory(), o));
  at::Tensor x = at::full({1024}, 3.0f, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0));
  ASSERT_OK(group->comm().AllReduce(x));
  EXPECT_EQ(x.cpu().data_ptr<float>()[0], 3.0f);
  EXPECT_EQ(group->comm().data_backend_name(), "nccl");
}

}  // namespace
}  // namespace malle::comm
