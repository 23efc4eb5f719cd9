#include "libmalle/control/wire/hmac.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"
#include "libmalle/control/wire/secret.h"

namespace malle::control {
namespace {

using ::malle::testing::IsOkAndHolds;
using ::malle::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

// RFC 4231 section 4.3, test case 2: a key shorter than the block size.
TEST(HmacSha256Test, Rfc4231TestCase2) {
  EXPECT_EQ(MacToHex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

// RFC 4231 section 4.2, test case 1.
TEST(HmacSha256Test, Rfc4231TestCase1) {
  EXPECT_EQ(MacToHex(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

// RFC 4231 section 4.7, test case 6: a key longer than the block size is hashed first.
TEST(HmacSha256Test, Rfc4231TestCase6) {
  EXPECT_EQ(MacToHex(HmacSha256(std::string(131, '\xaa'),
                                "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacSha256Test, SecretOverloadUsesTheSecretBytesAsKey) {
  ASSERT_OK_AND_ASSIGN(Secret secret, Secret::FromBytes("0123456789abcdef0123"));
  EXPECT_EQ(HmacSha256(secret, "data"), HmacSha256("0123456789abcdef0123", "data"));
  EXPECT_NE(HmacSha256(secret, "data"), HmacSha256(secret, "datb"));
}

TEST(HmacSha256Test, EmptyKeyAndDataAreAccepted) {
  // Python: hmac.new(b"", b"", hashlib.sha256).hexdigest()
  EXPECT_EQ(MacToHex(HmacSha256("", "")),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

TEST(MacEqualsTest, ComparesEveryByte) {
  const Mac a = HmacSha256("key", "a");
  Mac first = a;
  first[0] ^= 1;
  Mac last = a;
  last[kMacBytes - 1] ^= 0x80;
  EXPECT_TRUE(MacEquals(a, a));
  EXPECT_FALSE(MacEquals(a, first));
  EXPECT_FALSE(MacEquals(a, last));
}

TEST(MacHexTest, RoundTrips) {
  const Mac mac = HmacSha256("key", "data");
  const std::string hex = MacToHex(mac);
  EXPECT_THAT(hex, SizeIs(64));
  EXPECT_THAT(MacFromHex(hex), IsOkAndHolds(mac));
}

TEST(MacHexTest, RejectsWrongLengthUppercaseAndNonHex) {
  const std::string hex = MacToHex(HmacSha256("key", "data"));
  EXPECT_THAT(MacFromHex(hex.substr(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 63 characters")));
  EXPECT_THAT(MacFromHex(hex + "0"), StatusIs(absl::StatusCode::kInvalidArgument));
  std::string upper = hex;
  upper[10] = 'A';
  EXPECT_THAT(MacFromHex(upper),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("offset 10")));
  std::string other = hex;
  other[63] = 'g';
  EXPECT_THAT(MacFromHex(other),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("offset 63")));
}

TEST(RandomBytesTest, ReturnsFreshBytesOfTheRequestedLength) {
  ASSERT_OK_AND_ASSIGN(std::string a, RandomBytes(32));
  ASSERT_OK_AND_ASSIGN(std::string b, RandomBytes(32));
  EXPECT_THAT(a, SizeIs(32));
  EXPECT_NE(a, b);  // 2^-256
  EXPECT_THAT(RandomBytes(0), IsOkAndHolds(""));
  EXPECT_THAT(RandomBytes((size_t{1} << 20) + 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RandomBytes: n")));
}

}  // namespace
}  // namespace malle::control
