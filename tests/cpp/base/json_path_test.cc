#include "libmalle/base/json_path.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::json_path {
namespace {

using ::malle::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(JsonPathTest, OddKeysAreQuotedSoNoInputShapesTheMessage) {
  EXPECT_EQ(Member("jobs[2]", "min_nodes"), "jobs[2].min_nodes");
  EXPECT_EQ(Member("", "v"), "v");
  EXPECT_EQ(Member("body", "a.b"), "body[\"a.b\"]");
  EXPECT_EQ(Member("body", "x\ny"), "body[\"x\\x0ay\"]");
  EXPECT_EQ(Member("body", ""), "body[\"\"]");
  EXPECT_EQ(Quote(std::string(50, 'a')), "\"" + std::string(40, 'a') + "...\"");
}

TEST(JsonPathTest, DepthIsLimitedBeforeParsingCountingTheEnclosingLevels) {
  const std::string deep = "[[[[1]]]]";  // 4 levels
  EXPECT_TRUE(ParseStrictJson(deep, "", 4).ok());
  EXPECT_THAT(ParseStrictJson(deep, "", 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nested deeper than 3 levels")));
  EXPECT_THAT(ParseStrictJson(deep, "body.report", 5, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("body.report: malformed JSON: nested deeper than 5 levels")));
  // Brackets inside strings do not count.
  EXPECT_TRUE(ParseStrictJson("{\"a\":\"[[[[[[\"}", "", 1).ok());
}

TEST(JsonPathTest, DuplicateKeysAreNamedFromThePrefix) {
  EXPECT_THAT(ParseStrictJson("{\"a\":{\"b\":1,\"b\":2}}", "body", 64),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("body.a.b: duplicate key")));
  EXPECT_THAT(ParseStrictJson("[{\"b\":1,\"b\":2}]", "body.list", 64),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("body.list[0].b: duplicate key")));
  EXPECT_THAT(ParseStrictJson("{\"b\":1,\"b\":2}"),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("b: duplicate key")));
  EXPECT_THAT(ParseStrictJson("{", "body", 64),
              StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("body: malformed JSON")));
}

}  // namespace
}  // namespace malle::json_path
