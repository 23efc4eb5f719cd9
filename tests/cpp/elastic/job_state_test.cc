// JobState: the wire form (flat buffers sent as they are, the rest packed),
// parts that only one language understands, corrupt and mismatched states,
// the digest.
#include "libmalle/elastic/job_state.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::elastic {
namespace {

using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

// A state as a live job holds it: parameters in one flat buffer, an int64
// buffer, an optimizer part whose moments are another flat buffer, a tracked
// part with bytes only.
JobState LiveState() {
  JobState s;
  s.logical_workers = 4;
  s.seed = 9;
  s.step = 17;
  s.position = 0;
  s.lr_factor = 0;
  at::Tensor w = at::randn({600, 500});
  at::Tensor b = at::randn({500});
  FlattenTensors({w, b});
  s.parameters = {{"0.weight", w}, {"0.bias", b}};
  s.buffers = {{"1.num_batches_tracked", at::tensor({int64_t{17}})}};
  at::Tensor m1 = at::randn({600, 500}), m2 = at::randn({500});
  FlattenTensors({m1, m2});
  s.parts = {{"optimizer", {{m1, m2, at::ones({1})}, "adam-skeleton"}}, {"track:sched", {{}, "epoch=17"}}};
  return s;
}

std::vector<at::Tensor> Received(const PackedState& p) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : p.buffers) out.push_back(t.clone());  // other memory, as a transfer gives
  return out;
}

TEST(JobStateTest, FlatBuffersAreSentAsTheyAreAndEverythingRoundTrips) {
  const JobState s = LiveState();
  PackedState packed = s.Pack(kDirectMinBytes);
  ASSERT_OK_AND_ASSIGN(std::vector<SegmentSpec> specs, SegmentSpecs(packed.skeleton));
  // The parameters' buffer and the moments' are direct (no copy); the small
  // tensors are packed, one segment per dtype.
  ASSERT_EQ(specs.size(), 4u);
  EXPECT_TRUE(packed.direct[0] && packed.direct[1]);
  EXPECT_FALSE(packed.direct[2] || packed.direct[3]);
  EXPECT_EQ(packed.buffers[0].storage().data(), s.parameters[0].tensor.storage().data());
  PackedState wire;
  wire.skeleton = packed.skeleton;
  wire.buffers = Received(packed);
  ASSERT_OK_AND_ASSIGN(JobState back, JobState::Unpack(std::move(wire)));
  EXPECT_EQ(back.logical_workers, 4);
  EXPECT_EQ(back.seed, 9u);
  EXPECT_EQ(back.step, 17);
  ASSERT_EQ(back.parameters.size(), 2u);
  EXPECT_EQ(back.parameters[1].name, "0.bias");
  EXPECT_TRUE(at::equal(back.parameters[0].tensor, s.parameters[0].tensor));
  EXPECT_TRUE(at::equal(back.buffers[0].tensor, s.buffers[0].tensor));
  ASSERT_NE(back.part("optimizer"), nullptr);
  EXPECT_EQ(back.part("optimizer")->state.bytes, "adam-skeleton");
  ASSERT_EQ(back.part("optimizer")->state.tensors.size(), 3u);
  EXPECT_TRUE(at::equal(back.part("optimizer")->state.tensors[0], s.parts[0].state.tensors[0]));
  EXPECT_EQ(back.part("track:sched")->state.bytes, "epoch=17");
  EXPECT_EQ(back.Digest(), s.Digest());
  EXPECT_EQ(back.tensor_bytes(), s.tensor_bytes());
}

TEST(JobStateTest, CorruptTruncatedOrOtherVersionStatesAreRefused) {
  const PackedState good = LiveState().Pack(kDirectMinBytes);
  auto unpack = [&](std::string skeleton) {
    PackedState p;
    p.skeleton = std::move(skeleton);
    p.buffers = Received(good);
    return JobState::Unpack(std::move(p)).status();
  };
  // The version is the first record after the segment table: 'i' then int64.
  std::string other = good.skeleton;
  const size_t version_at = 8 + 4 * 10 + 1;
  other[version_at] = 2;
  EXPECT_THAT(unpack(other), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("format version 2")));
  EXPECT_THAT(unpack(good.skeleton.substr(0, good.skeleton.size() - 3)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(unpack(good.skeleton + "i"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(unpack("garbage"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("corrupt")));
}

TEST(JobStateTest, CompatibilityNamesWhatDiffers) {
  const JobState mine = LiveState();
  EXPECT_OK(JobState::CheckCompatible(mine, LiveState()));
  JobState other_job = LiveState();
  other_job.seed = 10;
  EXPECT_THAT(JobState::CheckCompatible(mine, other_job),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job mismatch: the state has logical_workers=4, seed=10")));
  JobState other_model = LiveState();
  other_model.parameters[0].tensor = at::zeros({500, 600});
  EXPECT_THAT(JobState::CheckCompatible(mine, other_model),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model mismatch: this rank's model differs from the state's (first differences: "
                                 "parameter 0: here '0.weight' Float[600,500], state '0.weight' Float[500,600])")));
  JobState fewer = LiveState();
  fewer.parts.pop_back();
  EXPECT_THAT(JobState::CheckCompatible(mine, fewer),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("state mismatch: 'track:sched' is not in the state (it has: optimizer)")));
}

TEST(JobStateTest, DigestSeesOneBitOfTheModelOrOptimizerAndNothingElse) {
  JobState s = LiveState();
  const std::string d0 = s.Digest();
  s.parts[1].state.bytes = "epoch=99";  // a tracked object: not part of the replica digest
  s.step = 99;
  EXPECT_EQ(s.Digest(), d0);
  s.parameters[1].tensor[3] = 0.0f;
  const std::string d1 = s.Digest();
  s.parameters[1].tensor[3] = -0.0f;  // equal value, another bit pattern
  EXPECT_NE(s.Digest(), d1);
  s.parts[0].state.bytes = "adam-skeleton2";
  EXPECT_NE(s.Digest(), d1);
}

}  // namespace
}  // namespace malle::elastic
