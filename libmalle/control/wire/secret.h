// Secret: the shared key that authenticates control messages, and the file it
// lives in.
//
// Every process of one malletrain deployment (allocator, node agents, jobs)
// reads the same secret file; control messages carry an HMAC-SHA256 keyed
// with its bytes (hmac.h, envelope.h). The file is the trust boundary, so
// LoadSecret refuses one that other users could read or replace:
//
//   MALLE_RETURN_IF_ERROR(WriteNewSecret("/etc/malle/secret"));  // once, at setup
//   MALLE_ASSIGN_OR_RETURN(Secret secret, LoadSecret("/etc/malle/secret"));
//   MALLE_LOG(INFO) << "loaded " << secret.Redacted();  // never the bytes
//
// The key is the file's bytes as they are (one trailing "\n" or "\r\n"
// removed), not a decoding of them: WriteNewSecret writes 64 hex digits, an
// operator may use any other text of 16 bytes to 4 KiB.
//
// Secret has no operator<< and no AbslStringify on purpose: only Redacted()
// turns it into text. The bytes are overwritten when a Secret is destroyed.
//
// Thread-safety: LoadSecret and WriteNewSecret are thread-safe (they touch
// only the named file). A const Secret may be shared between threads.
#ifndef MALLE_CONTROL_SECRET_H_
#define MALLE_CONTROL_SECRET_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace malle::control {

// Bounds of a key, after the trailing newline is removed. 16 bytes is the
// least that HMAC-SHA256 should be keyed with (RFC 2104 section 3 asks for at
// least the hash length; 16 random bytes already resist brute force). 4 KiB
// keeps a wrong path (a log, a binary) from being read as a key.
inline constexpr size_t kMinSecretBytes = 16;
inline constexpr size_t kMaxSecretFileBytes = 4096;
// WriteNewSecret draws this many random bytes and writes them as hex.
inline constexpr size_t kNewSecretRandomBytes = 32;

class Secret {
 public:
  // A key held in memory, for tests and for callers that have the key from
  // elsewhere. kInvalidArgument unless kMinSecretBytes <= size <= kMaxSecretFileBytes.
  static absl::StatusOr<Secret> FromBytes(std::string bytes);

  Secret(const Secret& other) = default;
  Secret& operator=(const Secret& other);
  Secret(Secret&& other) noexcept = default;
  Secret& operator=(Secret&& other) noexcept;
  ~Secret();

  // The key. Pass it to HMAC only; do not log or copy it into messages.
  absl::string_view bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }

  // "Secret(<N> bytes, redacted)": what a log line may show.
  std::string Redacted() const;

 private:
  explicit Secret(std::string bytes) : bytes_(std::move(bytes)) {}
  void Wipe();

  std::string bytes_;
};

// Reads the secret file at `path`. Does not block beyond reading a local
// file. Returns kNotFound if the file does not exist; kPermissionDenied if it
// cannot be opened, is accessible to group or others (mode & 077 != 0; use
// 0600 or 0400) or is owned by another user than the effective uid;
// kInvalidArgument if it is a symbolic link, not a regular file, empty,
// larger than 4 KiB or shorter than 16 bytes after the trailing newline is
// removed; kInternal if reading fails. Every message names the path.
absl::StatusOr<Secret> LoadSecret(const std::string& path);

// Creates `path` with mode 0600 holding 64 lowercase hex digits (32 bytes
// from OpenSSL's CSPRNG) and a newline, and fsyncs it. Never replaces a file:
// kAlreadyExists if `path` exists (also as a symbolic link). kPermissionDenied
// / kNotFound / kInternal for other open or write failures (a partially
// written file is removed); kUnavailable if the CSPRNG fails.
absl::Status WriteNewSecret(const std::string& path);

}  // namespace malle::control

#endif  // MALLE_CONTROL_SECRET_H_
