#include "libmalle/base/check.h"

#include "gtest/gtest.h"

namespace malle::base {
namespace {

TEST(CheckDeathTest, FailingCheckAbortsWithContext) {
  int rank = 5, size = 4;
  EXPECT_DEATH({ MALLE_CHECK(rank < size) << "rank " << rank << " of " << size; },
               "MALLE_CHECK failed at .*check_test.cc:[0-9]+: rank < size rank 5 of 4");
}

TEST(CheckDeathTest, CheckOkPrintsStatus) {
  EXPECT_DEATH({ MALLE_CHECK_OK(absl::NotFoundError("no such key")) << "ctx"; },
               "NOT_FOUND: no such key ctx");
}

TEST(CheckTest, PassingChecksDoNotEvaluateTheMessage) {
  int evaluated = 0;
  auto message = [&] { return ++evaluated; };
  MALLE_CHECK(true) << message();
  MALLE_CHECK_OK(absl::OkStatus()) << message();
  EXPECT_EQ(evaluated, 0);
}

}  // namespace
}  // namespace malle::base
