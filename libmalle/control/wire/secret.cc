// Secret files (secret.h). The checks run on the opened descriptor (fstat),
// not on the path, so that the file that is checked is the file that is
// read even if the path is replaced in between.
#include "libmalle/control/wire/secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/control/wire/hmac.h"

namespace malle::control {
namespace {

// Closes a descriptor on every return path.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  // Closes now and reports the error of close(2) (a write may surface there).
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// The status for a failed open/stat/read of the secret file.
absl::Status ErrnoError(int error, const std::string& path, absl::string_view what) {
  const std::string message =
      absl::StrCat("secret file '", path, "': ", what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    default:
      return absl::InternalError(message);
  }
}

// Overwrites `bytes` in a way the compiler may not drop as a dead store.
void SecureZero(std::string& bytes) {
  volatile char* p = bytes.data();
  for (size_t i = 0; i < bytes.size(); ++i) p[i] = 0;
}

absl::Status WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      const int error = errno;
      if (error == EINTR) continue;
      return absl::Status(absl::ErrnoToStatusCode(error),
                          absl::StrCat("write: ", std::strerror(error)));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Secret> Secret::FromBytes(std::string bytes) {
  if (bytes.size() < kMinSecretBytes || bytes.size() > kMaxSecretFileBytes) {
    const size_t size = bytes.size();
    SecureZero(bytes);
    return absl::InvalidArgumentError(absl::StrCat("a secret must be ", kMinSecretBytes, " to ",
                                                   kMaxSecretFileBytes, " bytes, got ", size));
  }
  return Secret(std::move(bytes));
}

Secret& Secret::operator=(const Secret& other) {
  if (this != &other) {
    Wipe();
    bytes_ = other.bytes_;
  }
  return *this;
}

Secret& Secret::operator=(Secret&& other) noexcept {
  if (this != &other) {
    Wipe();
    bytes_ = std::move(other.bytes_);
  }
  return *this;
}

Secret::~Secret() { Wipe(); }

void Secret::Wipe() { SecureZero(bytes_); }

std::string Secret::Redacted() const {
  return absl::StrCat("Secret(", size(), " bytes, redacted)");
}

absl::StatusOr<Secret> LoadSecret(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("secret file: the path is empty");
  // lstat first only to give a symbolic link its own message; O_NOFOLLOW
  // below is what actually refuses one (a link could be swapped in after).
  struct stat link_info {};
  if (::lstat(path.c_str(), &link_info) != 0) return ErrnoError(errno, path, "cannot stat");
  if (S_ISLNK(link_info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "secret file '", path,
        "' is a symbolic link; give the path of the file itself (a link lets whoever can write "
        "its directory point it elsewhere)"));
  }
  // O_NONBLOCK: a FIFO put in the file's place must not block the open; it
  // is refused by the S_ISREG check.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::InvalidArgumentError(
          absl::StrCat("secret file '", path, "' is a symbolic link; give the file itself"));
    }
    return ErrnoError(errno, path, "cannot open");
  }
  FdCloser closer(fd);
  struct stat info {};
  if (::fstat(fd, &info) != 0) return ErrnoError(errno, path, "cannot stat");
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secret file '", path, "' is not a regular file (",
                     S_ISDIR(info.st_mode) ? "a directory" : "a device, FIFO or socket", ")"));
  }
  if ((info.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "secret file '%s' has mode %04o: group and others must have no access (use chmod 600 "
        "or 400)",
        path, info.st_mode & 07777));
  }
  if (info.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("secret file '", path, "' is owned by uid ", info.st_uid,
                     ", not by this process's effective uid ", ::geteuid()));
  }
  if (info.st_size > static_cast<off_t>(kMaxSecretFileBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("secret file '", path, "' is ", info.st_size,
                                                   " bytes, more than the limit of ",
                                                   kMaxSecretFileBytes));
  }
  // Read one byte more than allowed, so that a file that grew after fstat
  // is still caught.
  std::string bytes(kMaxSecretFileBytes + 1, '\0');
  size_t length = 0;
  while (length < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + length, bytes.size() - length);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      SecureZero(bytes);
      return ErrnoError(error, path, "cannot read");
    }
    if (n == 0) break;
    length += static_cast<size_t>(n);
  }
  if (length > kMaxSecretFileBytes) {
    SecureZero(bytes);
    return absl::InvalidArgumentError(absl::StrCat(
        "secret file '", path, "' is more than the limit of ", kMaxSecretFileBytes, " bytes"));
  }
  if (length == 0) {
    return absl::InvalidArgumentError(absl::StrCat("secret file '", path, "' is empty"));
  }
  // Editors and `echo` add a newline; it is not part of the key.
  if (bytes[length - 1] == '\n') {
    --length;
    if (length > 0 && bytes[length - 1] == '\r') --length;
  }
  if (length < kMinSecretBytes) {
    SecureZero(bytes);
    return absl::InvalidArgumentError(
        absl::StrCat("secret file '", path, "' holds ", length,
                     " bytes (without the trailing newline); at least ", kMinSecretBytes,
                     " are required (WriteNewSecret / `malle secret new` writes 64)"));
  }
  std::string key(bytes.data(), length);
  SecureZero(bytes);
  return Secret::FromBytes(std::move(key));
}

absl::Status WriteNewSecret(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("secret file: the path is empty");
  // Draw the bytes first: a CSPRNG failure then leaves no file behind.
  MALLE_ASSIGN_OR_RETURN(std::string random, RandomBytes(kNewSecretRandomBytes));
  Mac scratch{};  // reuse the MAC hex encoder: kNewSecretRandomBytes == kMacBytes
  static_assert(kNewSecretRandomBytes == kMacBytes, "the hex encoder is sized for a MAC");
  std::copy(random.begin(), random.end(), scratch.begin());
  SecureZero(random);
  std::string text = absl::StrCat(MacToHex(scratch), "\n");
  scratch.fill(0);

  // O_EXCL|O_NOFOLLOW: never replace a file and never write through a link.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;
    SecureZero(text);
    return ErrnoError(error, path, "cannot create");
  }
  FdCloser closer(fd);
  absl::Status status = absl::OkStatus();
  // The umask may have removed bits of 0600 (never added any); make it exact.
  if (::fchmod(fd, 0600) != 0) {
    status = ErrnoError(errno, path, "cannot chmod 600");
  } else if (absl::Status written = WriteAll(fd, text); !written.ok()) {
    status = absl::InternalError(absl::StrCat("secret file '", path, "': ", written.message()));
  } else if (::fsync(fd) != 0) {
    status = ErrnoError(errno, path, "cannot fsync");
  } else if (closer.Close() != 0) {
    status = ErrnoError(errno, path, "cannot close");
  }
  SecureZero(text);
  if (!status.ok()) ::unlink(path.c_str());
  return status;
}

}  // namespace malle::control
