#include "libmalle/advisor/resize_cost.h"

#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::advisor {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ResizeCostTest, ClassifiesByCauseThenDirection) {
  struct Case {
    int previous, nodes;
    bool failure;
    ResizeDirection expected;
  };
  const Case cases[] = {
      {4, 8, false, ResizeDirection::kGrow},   {8, 4, false, ResizeDirection::kShrink},
      {8, 7, true, ResizeDirection::kFailure}, {4, 8, true, ResizeDirection::kFailure},
      {4, 4, false, ResizeDirection::kGrow},   {0, 4, false, ResizeDirection::kGrow},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ClassifyResize(c.previous, c.nodes, c.failure), c.expected)
        << c.previous << " -> " << c.nodes << " failure " << c.failure;
  }
  EXPECT_EQ(ResizeDirectionName(ResizeDirection::kGrow), "grow");
  EXPECT_EQ(ResizeDirectionName(ResizeDirection::kShrink), "shrink");
  EXPECT_EQ(ResizeDirectionName(ResizeDirection::kFailure), "failure");
}

struct StatsCase {
  std::vector<double> pauses_s;
  double median_s, p90_s, last_s;
};

TEST(ResizeCostTest, MedianP90AndLastPerDirection) {
  const StatsCase cases[] = {
      {{7}, 7, 7, 7},
      {{10, 12}, 11, 12, 12},
      {{14, 10, 12}, 12, 14, 12},
      // Ten pauses: the nearest-rank p90 is the 9th smallest.
      {{1, 2, 3, 4, 5, 6, 7, 8, 9, 100}, 5.5, 9, 100},
  };
  for (const StatsCase& c : cases) {
    ResizeCostTracker tracker;
    for (double s : c.pauses_s)
      ASSERT_THAT(tracker.Add(ResizeDirection::kShrink, absl::Seconds(s)), IsOk());
    std::optional<ResizeCostStats> stats = tracker.Stats(ResizeDirection::kShrink);
    ASSERT_TRUE(stats.has_value());
    EXPECT_EQ(stats->count, static_cast<int64_t>(c.pauses_s.size()));
    EXPECT_EQ(stats->median, absl::Seconds(c.median_s));
    EXPECT_EQ(stats->p90, absl::Seconds(c.p90_s));
    EXPECT_EQ(stats->last, absl::Seconds(c.last_s));
    EXPECT_FALSE(tracker.Stats(ResizeDirection::kGrow).has_value());
    EXPECT_FALSE(tracker.Stats(ResizeDirection::kFailure).has_value());
  }
}

TEST(ResizeCostTest, WindowKeepsOnlyRecentPauses) {
  ResizeCostTracker tracker(/*window=*/4);
  for (int i = 0; i < 10; ++i)
    ASSERT_THAT(tracker.Add(ResizeDirection::kGrow, absl::Seconds(100)), IsOk());
  for (int i = 0; i < 4; ++i)
    ASSERT_THAT(tracker.Add(ResizeDirection::kGrow, absl::Seconds(5)), IsOk());
  std::optional<ResizeCostStats> stats = tracker.Stats(ResizeDirection::kGrow);
  ASSERT_TRUE(stats.has_value());
  EXPECT_EQ(stats->count, 14);
  EXPECT_EQ(stats->median, absl::Seconds(5));
  EXPECT_EQ(stats->p90, absl::Seconds(5));
}

TEST(ResizeCostTest, RejectsNegativeAndInfinitePauses) {
  ResizeCostTracker tracker;
  EXPECT_THAT(tracker.Add(ResizeDirection::kGrow, absl::Seconds(-1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("resize pause = -1s")));
  EXPECT_THAT(tracker.Add(ResizeDirection::kGrow, absl::InfiniteDuration()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("finite")));
  EXPECT_FALSE(tracker.Stats(ResizeDirection::kGrow).has_value());
}

}  // namespace
}  // namespace malle::advisor
