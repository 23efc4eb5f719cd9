#include "libmalle/advisor/step_sample.h"

#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::advisor {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

StepSample Good() {
  StepSample s;
  s.step = 10;
  s.world_size = 4;
  s.logical_workers = 16;
  s.global_batch = 512;
  s.local_batch = 128;
  s.data_wait = absl::Milliseconds(2);
  s.compute = absl::Milliseconds(100);
  s.comm = absl::Milliseconds(20);
  s.optimizer = absl::Milliseconds(8);
  s.total = absl::Milliseconds(135);
  return s;
}

TEST(StepSampleTest, AcceptsAConsistentSample) {
  EXPECT_THAT(Validate(Good()), IsOk());
  StepSample s = Good();
  s.after_resize = true;
  s.after_failure = true;
  s.resize_pause = absl::Seconds(12);
  EXPECT_THAT(Validate(s), IsOk());
  // Timers may overshoot the total by a little (2% or 1 ms).
  s = Good();
  s.total = absl::Milliseconds(128);  // phases sum to 130
  EXPECT_THAT(Validate(s), IsOk());
}

struct BadCase {
  std::string name;
  void (*mutate)(StepSample&);
  std::string message;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadSampleTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadSampleTest, IsRejectedNamingTheFieldAndRange) {
  StepSample s = Good();
  GetParam().mutate(s);
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, BadSampleTest,
    ::testing::Values(
        BadCase{"NegativeStep", [](StepSample& s) { s.step = -1; }, "step = -1 must be >= 0"},
        BadCase{"ZeroWorld", [](StepSample& s) { s.world_size = 0; },
                "world_size = 0 must be in [1, 100000]"},
        BadCase{"HugeWorld", [](StepSample& s) { s.world_size = 100001; },
                "world_size = 100001 must be in [1, 100000]"},
        BadCase{"ZeroLogical", [](StepSample& s) { s.logical_workers = 0; },
                "logical_workers = 0 must be in [1, 100000]"},
        BadCase{"ZeroGlobalBatch", [](StepSample& s) { s.global_batch = 0; },
                "global_batch = 0 must be in [1, "},
        BadCase{"ZeroLocalBatch", [](StepSample& s) { s.local_batch = 0; },
                "local_batch = 0 must be in [1, global_batch = 512]"},
        BadCase{"LocalAboveGlobal", [](StepSample& s) { s.local_batch = 600; },
                "local_batch = 600 must be in [1, global_batch = 512]"},
        BadCase{"NegativeCompute", [](StepSample& s) { s.compute = absl::Milliseconds(-1); },
                "compute = -1ms must be >= 0"},
        BadCase{"InfiniteComm", [](StepSample& s) { s.comm = absl::InfiniteDuration(); },
                "comm = inf must be finite and >= 0"},
        BadCase{"NegativeData", [](StepSample& s) { s.data_wait = absl::Seconds(-2); },
                "data_wait = -2s must be >= 0"},
        BadCase{"NegativeOptimizer", [](StepSample& s) { s.optimizer = absl::Seconds(-2); },
                "optimizer = -2s"},
        BadCase{"NegativePause", [](StepSample& s) { s.resize_pause = absl::Seconds(-2); },
                "resize_pause = -2s must be >= 0"},
        BadCase{"ZeroTotal", [](StepSample& s) { s = StepSample{}; }, "total = 0 must be > 0"},
        BadCase{"TotalBelowPhases", [](StepSample& s) { s.total = absl::Milliseconds(120); },
                "total = 120ms must be >= data_wait + compute + comm + optimizer = 130ms"},
        BadCase{"PauseWithoutResize", [](StepSample& s) { s.resize_pause = absl::Seconds(3); },
                "resize_pause = 3s must be 0 unless after_resize is true"},
        BadCase{"FailureWithoutResize", [](StepSample& s) { s.after_failure = true; },
                "after_failure = true requires after_resize = true"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

struct SlowestCase {
  int64_t global_batch;
  int logical_workers;
  int world_size;
  double expected;
};

TEST(StepSampleTest, SlowestLocalBatchIsCeilOfLogicalWorkersPerRank) {
  const SlowestCase cases[] = {
      {512, 16, 1, 512},      {512, 16, 2, 256}, {512, 16, 4, 128},
      {512, 16, 5, 128},                                             // ceil(16/5) = 4
      {512, 16, 6, 96},       {512, 16, 16, 32}, {512, 16, 32, 32},  // idle ranks
      {100, 3, 2, 200.0 / 3},                                        // 2 of 3 workers
  };
  for (const SlowestCase& c : cases) {
    EXPECT_DOUBLE_EQ(SlowestLocalBatch(c.global_batch, c.logical_workers, c.world_size), c.expected)
        << c.global_batch << " " << c.logical_workers << " " << c.world_size;
  }
}

}  // namespace
}  // namespace malle::advisor
