// The OpenSSL side of hmac.h. This is the only file of malletrain that
// includes <openssl/...>; keep it that way (docs/protocol.md, conventions 3).
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "libmalle/base/check.h"
#include "libmalle/control/wire/hmac.h"
#include "libmalle/control/wire/secret.h"

namespace malle::control {
namespace {

constexpr size_t kMaxRandomBytes = size_t{1} << 20;

// The first error on OpenSSL's queue of this thread, for a status message;
// clears the queue.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type
  ERR_clear_error();
  if (code == 0) return "no OpenSSL error recorded";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

Mac HmacSha256(absl::string_view key, absl::string_view data) {
  // HMAC() reads `key` only when key_len > 0, but refuses a null pointer on
  // some versions: give it a valid one for the empty key.
  static const unsigned char kEmpty = 0;
  const unsigned char* key_bytes =
      key.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(key.data());
  const unsigned char* data_bytes =
      data.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(data.data());
  Mac mac{};
  unsigned int length = 0;
  const unsigned char* result = HMAC(EVP_sha256(), key_bytes, static_cast<int>(key.size()),
                                     data_bytes, data.size(), mac.data(), &length);
  MALLE_CHECK(result != nullptr && length == kMacBytes) << "HMAC-SHA256 failed: " << OpenSslError();
  return mac;
}

Mac HmacSha256(const Secret& secret, absl::string_view data) {
  return HmacSha256(secret.bytes(), data);
}

bool MacEquals(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), kMacBytes) == 0;
}

std::string MacToHex(const Mac& mac) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(2 * kMacBytes, '0');
  for (size_t i = 0; i < kMacBytes; ++i) {
    hex[2 * i] = kDigits[mac[i] >> 4];
    hex[2 * i + 1] = kDigits[mac[i] & 0xf];
  }
  return hex;
}

absl::StatusOr<Mac> MacFromHex(absl::string_view hex) {
  if (hex.size() != 2 * kMacBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a MAC is ", 2 * kMacBytes, " lowercase hex digits, got ", hex.size(), " characters"));
  }
  Mac mac{};
  for (size_t i = 0; i < kMacBytes; ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("a MAC is ", 2 * kMacBytes, " lowercase hex digits [0-9a-f], found ",
                       "another character at offset ", hi < 0 ? 2 * i : 2 * i + 1));
    }
    mac[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return mac;
}

absl::StatusOr<std::string> RandomBytes(size_t n) {
  if (n > kMaxRandomBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("RandomBytes: n must be in [0, ", kMaxRandomBytes, "], got ", n));
  }
  std::string bytes(n, '\0');
  if (n == 0) return bytes;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(n)) != 1) {
    return absl::UnavailableError(
        absl::StrCat("OpenSSL RAND_bytes failed (CSPRNG not seeded?): ", OpenSslError()));
  }
  return bytes;
}

}  // namespace malle::control
