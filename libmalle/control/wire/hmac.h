// HMAC-SHA256, constant-time comparison and random bytes: the cryptographic
// primitives of the control plane.
//
// They are implemented in internal/hmac_openssl.cc, the only file of
// malletrain that includes OpenSSL; nothing else in libmalle calls OpenSSL.
//
//   Mac mac = HmacSha256(secret, bytes);
//   if (!MacEquals(mac, received)) return absl::UnauthenticatedError("forged");
//   MALLE_ASSIGN_OR_RETURN(std::string nonce, RandomBytes(16));
//
// Thread-safety: every function is thread-safe (OpenSSL 3 needs no locking
// callbacks).
#ifndef MALLE_CONTROL_HMAC_H_
#define MALLE_CONTROL_HMAC_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libmalle/control/wire/secret.h"

namespace malle::control {

inline constexpr size_t kMacBytes = 32;  // SHA-256 output
using Mac = std::array<uint8_t, kMacBytes>;

// HMAC-SHA256 (RFC 2104, FIPS 198-1) of `data` keyed with `key`. Any key
// length is accepted (RFC 4231's test keys are 4 to 131 bytes). Does not
// fail: OpenSSL's HMAC with SHA-256 fails only on allocation failure, which
// aborts with a MALLE_CHECK.
Mac HmacSha256(absl::string_view key, absl::string_view data);
Mac HmacSha256(const Secret& secret, absl::string_view data);

// Whether `a` and `b` are equal, in time that does not depend on where they
// differ (CRYPTO_memcmp). Use it for every comparison of a MAC.
bool MacEquals(const Mac& a, const Mac& b);

// Lowercase hex (64 digits) and back. MacFromHex accepts exactly 64
// lowercase hex digits; kInvalidArgument otherwise, saying what was wrong.
std::string MacToHex(const Mac& mac);
absl::StatusOr<Mac> MacFromHex(absl::string_view hex);

// `n` bytes from OpenSSL's CSPRNG (RAND_bytes). kUnavailable if it is not
// seeded or fails; kInvalidArgument if n > 1 MiB.
absl::StatusOr<std::string> RandomBytes(size_t n);

}  // namespace malle::control

#endif  // MALLE_CONTROL_HMAC_H_
