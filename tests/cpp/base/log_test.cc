#include "libmalle/base/log.h"

#include "gtest/gtest.h"

namespace malle::base {
namespace {

TEST(LogTest, ParsesLevelsCaseInsensitively) {
  LogLevel level;
  ASSERT_TRUE(ParseLogLevel("DEBUG", &level));
  EXPECT_EQ(level, LogLevel::kDebug);
  ASSERT_TRUE(ParseLogLevel("warn", &level));
  EXPECT_EQ(level, LogLevel::kWarning);
  EXPECT_FALSE(ParseLogLevel("loud", &level));
}

TEST(LogTest, LinesCarryTheRankAndGenerationPrefix) {
  SetLogLevel(LogLevel::kInfo);
  SetLogContext("mnist", 2, 4, 7);
  ::testing::internal::CaptureStderr();
  MALLE_LOG(INFO) << "hello " << 42;
  MALLE_LOG(DEBUG) << "hidden";
  const std::string out = ::testing::internal::GetCapturedStderr();
  ClearLogContext();
  EXPECT_NE(out.find("job=mnist rank=2/4 gen=7"), std::string::npos) << out;
  EXPECT_NE(out.find("log_test.cc"), std::string::npos) << out;
  EXPECT_NE(out.find("] hello 42\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("hidden"), std::string::npos) << out;
  EXPECT_EQ(out[0], 'I');
}

TEST(LogTest, DisabledLevelsDoNotEvaluateTheMessage) {
  SetLogLevel(LogLevel::kError);
  int evaluated = 0;
  MALLE_LOG(INFO) << ++evaluated;
  EXPECT_EQ(evaluated, 0);
  SetLogLevel(LogLevel::kInfo);
}

}  // namespace
}  // namespace malle::base
