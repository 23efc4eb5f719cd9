#include "libmalle/base/status_macros.h"

#include <memory>

#include "absl/strings/str_cat.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::base {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::IsOkAndHolds;
using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat("odd: ", x));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  MALLE_ASSIGN_OR_RETURN(int h, Half(x));
  MALLE_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

absl::Status CheckEven(int x, int* calls) {
  ++*calls;
  MALLE_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<int>> MoveOnly(bool ok) {
  if (!ok) return absl::NotFoundError("none");
  return std::make_unique<int>(7);
}

absl::StatusOr<int> UseMoveOnly(bool ok) {
  MALLE_ASSIGN_OR_RETURN(std::unique_ptr<int> p, MoveOnly(ok));
  return *p;
}

TEST(StatusMacrosTest, AssignOrReturnPropagatesFirstError) {
  EXPECT_THAT(Quarter(8), IsOkAndHolds(2));
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("odd: 3")));
  EXPECT_THAT(Quarter(5), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("odd: 5")));
}

TEST(StatusMacrosTest, ReturnIfErrorEvaluatesOnce) {
  int calls = 0;
  EXPECT_THAT(CheckEven(4, &calls), IsOk());
  EXPECT_THAT(CheckEven(3, &calls), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(calls, 2);
}

TEST(StatusMacrosTest, WorksWithMoveOnlyValues) {
  EXPECT_THAT(UseMoveOnly(true), IsOkAndHolds(7));
  EXPECT_THAT(UseMoveOnly(false), StatusIs(absl::StatusCode::kNotFound));
}

TEST(StatusMatchersTest, MatchersRejectWrongCodes) {
  EXPECT_THAT(absl::InternalError("x"), ::testing::Not(IsOk()));
  EXPECT_THAT(absl::InternalError("x"), ::testing::Not(StatusIs(absl::StatusCode::kNotFound)));
  EXPECT_THAT(absl::StatusOr<int>(3), ::testing::Not(IsOkAndHolds(4)));
}

}  // namespace
}  // namespace malle::base
