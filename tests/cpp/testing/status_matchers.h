// GoogleTest matchers for absl::Status and absl::StatusOr (Debian 12's Abseil
// ships none).
//
//   EXPECT_THAT(DoIt(), IsOk());
//   EXPECT_THAT(Parse("x"), StatusIs(absl::StatusCode::kInvalidArgument,
//                                    HasSubstr("port")));
//   EXPECT_THAT(Parse("80"), IsOkAndHolds(80));
//   ASSERT_OK_AND_ASSIGN(auto port, Parse("80"));
//
// Thread-safety: test-only helpers, use from the test thread.
#ifndef MALLE_TESTS_CPP_TESTING_STATUS_MATCHERS_H_
#define MALLE_TESTS_CPP_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace malle::testing {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

MATCHER(IsOkMatcher, "is OK") {
  const absl::Status& status = GetStatus(arg);
  if (!status.ok()) *result_listener << "status is " << status.ToString();
  return status.ok();
}

template <typename CodeMatcher, typename MessageMatcher>
class StatusIsMatcher {
 public:
  StatusIsMatcher(CodeMatcher code, MessageMatcher message)
      : code_(std::move(code)), message_(std::move(message)) {}

  template <typename T>
  operator ::testing::Matcher<const T&>() const {  // NOLINT: implicit on purpose
    return ::testing::MakeMatcher(new Impl<T>(code_, message_));
  }

 private:
  template <typename T>
  class Impl : public ::testing::MatcherInterface<const T&> {
   public:
    Impl(CodeMatcher code, MessageMatcher message)
        : code_(::testing::SafeMatcherCast<absl::StatusCode>(code)),
          message_(::testing::SafeMatcherCast<const std::string&>(message)) {}
    bool MatchAndExplain(const T& value, ::testing::MatchResultListener* listener) const override {
      const absl::Status& status = GetStatus(value);
      *listener << "status is " << status.ToString();
      return code_.Matches(status.code()) && message_.Matches(std::string(status.message()));
    }
    void DescribeTo(std::ostream* os) const override {
      *os << "has a status code that ";
      code_.DescribeTo(os);
      *os << " and a message that ";
      message_.DescribeTo(os);
    }

   private:
    ::testing::Matcher<absl::StatusCode> code_;
    ::testing::Matcher<const std::string&> message_;
  };

  CodeMatcher code_;
  MessageMatcher message_;
};

template <typename ValueMatcher>
class IsOkAndHoldsMatcher {
 public:
  explicit IsOkAndHoldsMatcher(ValueMatcher value) : value_(std::move(value)) {}
  template <typename StatusOrT>
  operator ::testing::Matcher<const StatusOrT&>() const {  // NOLINT
    using T = typename std::decay_t<StatusOrT>::value_type;
    const ::testing::Matcher<const T&> inner = ::testing::SafeMatcherCast<const T&>(value_);
    return ::testing::Truly([inner](const StatusOrT& s) { return s.ok() && inner.Matches(*s); });
  }

 private:
  ValueMatcher value_;
};

}  // namespace internal

inline auto IsOk() { return internal::IsOkMatcher(); }

template <typename CodeMatcher>
auto StatusIs(CodeMatcher code) {
  return internal::StatusIsMatcher<CodeMatcher, decltype(::testing::_)>(std::move(code),
                                                                       ::testing::_);
}

template <typename CodeMatcher, typename MessageMatcher>
auto StatusIs(CodeMatcher code, MessageMatcher message) {
  return internal::StatusIsMatcher<CodeMatcher, MessageMatcher>(std::move(code),
                                                                std::move(message));
}

template <typename ValueMatcher>
auto IsOkAndHolds(ValueMatcher value) {
  return internal::IsOkAndHoldsMatcher<ValueMatcher>(std::move(value));
}

}  // namespace malle::testing

#define MALLE_TESTING_CONCAT_INNER_(a, b) a##b
#define MALLE_TESTING_CONCAT_(a, b) MALLE_TESTING_CONCAT_INNER_(a, b)

#define EXPECT_OK(expr) EXPECT_THAT((expr), ::malle::testing::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::malle::testing::IsOk())
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                          \
  auto MALLE_TESTING_CONCAT_(malle_statusor_, __LINE__) = (rexpr);                \
  ASSERT_TRUE(MALLE_TESTING_CONCAT_(malle_statusor_, __LINE__).ok())              \
      << MALLE_TESTING_CONCAT_(malle_statusor_, __LINE__).status().ToString();    \
  lhs = std::move(MALLE_TESTING_CONCAT_(malle_statusor_, __LINE__)).value()

#endif  // MALLE_TESTS_CPP_TESTING_STATUS_MATCHERS_H_
