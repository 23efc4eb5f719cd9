// The liveness probe: a listener's port accepts while it exists and refuses
// once it is gone; bad addresses give no verdict.
#include "libmalle/comm/internal/liveness.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::comm::internal {
namespace {

using ::malle::testing::StatusIs;

TEST(LivenessTest, AcceptedWhileListeningRefusedOnceGone) {
  ASSERT_OK_AND_ASSIGN(auto listener, LivenessListener::Listen("127.0.0.1"));
  const std::string address = listener->address();
  EXPECT_THAT(address, ::testing::StartsWith("127.0.0.1:"));
  for (int i = 0; i < 200; ++i) {  // more than the listen backlog: Drain keeps it open
    EXPECT_EQ(Probe(address, absl::Milliseconds(500)), Liveness::kAlive) << i;
    if (i % 50 == 0) listener->Drain();
  }
  listener->Drain();
  listener.reset();
  EXPECT_EQ(Probe(address, absl::Milliseconds(500)), Liveness::kGone);
}

TEST(LivenessTest, BadAddressesGiveNoVerdict) {
  EXPECT_THAT(LivenessListener::Listen("localhost"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(Probe("127.0.0.1", absl::Milliseconds(50)), Liveness::kUnknown);
  EXPECT_EQ(Probe("127.0.0.1:0", absl::Milliseconds(50)), Liveness::kUnknown);
  EXPECT_EQ(Probe("127.0.0.1:70000", absl::Milliseconds(50)), Liveness::kUnknown);
  EXPECT_EQ(Probe("not-an-ip:80", absl::Milliseconds(50)), Liveness::kUnknown);
}

}  // namespace
}  // namespace malle::comm::internal
