#include "libmalle/base/clock.h"

#include <thread>

#include "gtest/gtest.h"

namespace malle::base {
namespace {

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock(absl::FromUnixSeconds(100));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(100));
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(102));
}

TEST(FakeClockTest, SleepForWakesWhenAnotherThreadAdvances) {
  FakeClock clock(absl::UnixEpoch());
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(absl::Seconds(5));
    woke = true;
  });
  // Advance only once the sleeper has computed its wake-up time.
  for (int i = 0; i < 5000 && clock.sleepers() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(clock.sleepers(), 1);
  clock.Advance(absl::Seconds(4));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(woke.load());
  clock.Advance(absl::Seconds(1));
  sleeper.join();
  EXPECT_TRUE(woke.load());
}

TEST(RealClockTest, IsMonotoneEnough) {
  Clock* clock = Clock::Real();
  const absl::Time a = clock->Now();
  clock->SleepFor(absl::Milliseconds(2));
  EXPECT_GE(clock->Now() - a, absl::Milliseconds(2));
}

}  // namespace
}  // namespace malle::base
