#include "libmalle/control/wire/secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::control {
namespace {

using ::malle::testing::IsOk;
using ::malle::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

// Secret must not be printable by accident (a log line, a gtest failure).
template <class T, class = void>
struct Streamable : std::false_type {};
template <class T>
struct Streamable<T, std::void_t<decltype(std::declval<std::ostream&>() << std::declval<T>())>>
    : std::true_type {};
static_assert(!Streamable<Secret>::value, "Secret must have no operator<<");

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = absl::StrCat(::testing::TempDir(), "/secret_test.XXXXXX");
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    // Only what the tests created: files, one link, one FIFO, one directory.
    for (const char* name : {"s", "link", "fifo", "other", "new", "nested"}) {
      const std::string path = Path(name);
      ::unlink(path.c_str());
      ::rmdir(path.c_str());
    }
    ::rmdir(dir_.c_str());
  }

  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

  // Writes `content` to dir/name with exactly `mode`.
  std::string Write(const std::string& name, const std::string& content, mode_t mode) {
    const std::string path = Path(name);
    ::unlink(path.c_str());  // a previous 0400 file could not be reopened for writing
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::write(fd, content.data(), content.size()), static_cast<ssize_t>(content.size()));
    EXPECT_EQ(::fchmod(fd, mode), 0);
    ::close(fd);
    return path;
  }

  std::string dir_;
};

constexpr char kKey[] = "0123456789abcdef0123456789abcdef";  // 32 bytes

TEST_F(SecretFileTest, Mode0600IsAcceptedAndTheTrailingNewlineIsNotPartOfTheKey) {
  ASSERT_OK_AND_ASSIGN(Secret secret, LoadSecret(Write("s", absl::StrCat(kKey, "\n"), 0600)));
  EXPECT_EQ(secret.bytes(), kKey);
}

TEST_F(SecretFileTest, Mode0400IsAccepted) {
  ASSERT_OK_AND_ASSIGN(Secret secret, LoadSecret(Write("s", kKey, 0400)));
  EXPECT_EQ(secret.bytes(), kKey);  // no newline: nothing trimmed
}

TEST_F(SecretFileTest, CrLfIsTrimmedButOnlyOneNewline) {
  ASSERT_OK_AND_ASSIGN(Secret crlf, LoadSecret(Write("s", absl::StrCat(kKey, "\r\n"), 0600)));
  EXPECT_EQ(crlf.bytes(), kKey);
  ASSERT_OK_AND_ASSIGN(Secret two, LoadSecret(Write("s", absl::StrCat(kKey, "\n\n"), 0600)));
  EXPECT_EQ(two.bytes(), absl::StrCat(kKey, "\n"));
}

TEST_F(SecretFileTest, GroupOrOtherAccessIsRejectedWithTheMode) {
  for (mode_t mode : {0644, 0640, 0604, 0610, 0601, 0660}) {
    SCOPED_TRACE(mode);
    const std::string path = Write("s", kKey, mode);
    char octal[8];
    std::snprintf(octal, sizeof(octal), "%04o", static_cast<unsigned>(mode));
    EXPECT_THAT(LoadSecret(path),
                StatusIs(absl::StatusCode::kPermissionDenied,
                         AllOf(HasSubstr(path), HasSubstr(octal), HasSubstr("chmod 600"))));
  }
}

TEST_F(SecretFileTest, MissingFileIsNotFound) {
  const std::string path = Path("absent");
  EXPECT_THAT(LoadSecret(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(LoadSecret(""), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(SecretFileTest, EmptyFileIsRejected) {
  const std::string path = Write("s", "", 0600);
  EXPECT_THAT(LoadSecret(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                         AllOf(HasSubstr(path), HasSubstr("is empty"))));
}

TEST_F(SecretFileTest, ShorterThan16BytesAfterTheNewlineIsRejected) {
  // 15 bytes + newline: 16 bytes on disk, 15 in the key.
  const std::string path = Write("s", "0123456789abcde\n", 0600);
  EXPECT_THAT(LoadSecret(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path), HasSubstr("holds 15 bytes"), HasSubstr("16"))));
  EXPECT_THAT(LoadSecret(Write("s", "0123456789abcdef\n", 0600)), IsOk());
}

TEST_F(SecretFileTest, LargerThan4KiBIsRejected) {
  EXPECT_THAT(LoadSecret(Write("s", std::string(4096, 'k'), 0600)), IsOk());
  const std::string path = Write("s", std::string(4097, 'k'), 0600);
  EXPECT_THAT(LoadSecret(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path), HasSubstr("4097 bytes"), HasSubstr("4096"))));
}

TEST_F(SecretFileTest, SymbolicLinkIsRejectedEvenToAGoodFile) {
  const std::string target = Write("s", kKey, 0600);
  const std::string link = Path("link");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_THAT(LoadSecret(link), StatusIs(absl::StatusCode::kInvalidArgument,
                                         AllOf(HasSubstr(link), HasSubstr("symbolic link"))));
}

TEST_F(SecretFileTest, DirectoryAndFifoAreNotRegularFiles) {
  const std::string dir = Path("nested");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  EXPECT_THAT(LoadSecret(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                        AllOf(HasSubstr(dir), HasSubstr("not a regular file"),
                                              HasSubstr("directory"))));
  const std::string fifo = Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Must not block waiting for a writer.
  EXPECT_THAT(LoadSecret(fifo),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

TEST_F(SecretFileTest, FileOwnedByAnotherUserIsRejected) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file away";
  const std::string path = Write("s", kKey, 0600);
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  EXPECT_THAT(LoadSecret(path), StatusIs(absl::StatusCode::kPermissionDenied,
                                         AllOf(HasSubstr(path), HasSubstr("owned by uid 65534"))));
}

TEST_F(SecretFileTest, WriteNewSecretCreates64HexDigitsWithMode0600) {
  const std::string path = Path("new");
  const mode_t old_umask = ::umask(0);  // the mode must not depend on the umask
  absl::Status written = WriteNewSecret(path);
  ::umask(old_umask);
  ASSERT_OK(written);
  struct stat info {};
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0600u);
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_THAT(content.str(), MatchesRegex("[0-9a-f]{64}\n"));
  ASSERT_OK_AND_ASSIGN(Secret secret, LoadSecret(path));
  EXPECT_EQ(secret.bytes(), content.str().substr(0, 64));
}

TEST_F(SecretFileTest, WriteNewSecretNeverReplacesAFile) {
  const std::string path = Write("s", kKey, 0600);
  EXPECT_THAT(WriteNewSecret(path), StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(path)));
  ASSERT_OK_AND_ASSIGN(Secret secret, LoadSecret(path));
  EXPECT_EQ(secret.bytes(), kKey);  // untouched
  // Nor writes through a link (even a dangling one).
  const std::string link = Path("link");
  ASSERT_EQ(::symlink(Path("other").c_str(), link.c_str()), 0);
  EXPECT_THAT(WriteNewSecret(link), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_NE(::access(Path("other").c_str(), F_OK), 0);
}

TEST_F(SecretFileTest, WriteNewSecretInAMissingDirectoryIsNotFound) {
  EXPECT_THAT(WriteNewSecret(Path("nodir/s")), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(SecretFileTest, TwoNewSecretsDiffer) {
  ASSERT_OK(WriteNewSecret(Path("new")));
  ASSERT_OK(WriteNewSecret(Path("other")));
  ASSERT_OK_AND_ASSIGN(Secret a, LoadSecret(Path("new")));
  ASSERT_OK_AND_ASSIGN(Secret b, LoadSecret(Path("other")));
  EXPECT_NE(a.bytes(), b.bytes());
}

TEST(SecretTest, FromBytesChecksTheLength) {
  EXPECT_THAT(Secret::FromBytes(std::string(15, 'k')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("16 to 4096 bytes, got 15")));
  EXPECT_THAT(Secret::FromBytes(std::string(4097, 'k')),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Secret::FromBytes(std::string(16, 'k')), IsOk());
}

TEST(SecretTest, RedactedNeverShowsTheBytes) {
  ASSERT_OK_AND_ASSIGN(Secret secret, Secret::FromBytes(kKey));
  EXPECT_EQ(secret.Redacted(), "Secret(32 bytes, redacted)");
  EXPECT_THAT(secret.Redacted(), Not(HasSubstr("0123")));
}

TEST(SecretTest, CopiesAndMovesKeepTheKey) {
  ASSERT_OK_AND_ASSIGN(Secret a, Secret::FromBytes(kKey));
  Secret b = a;
  EXPECT_EQ(b.bytes(), kKey);
  ASSERT_OK_AND_ASSIGN(Secret c, Secret::FromBytes(std::string(20, 'c')));
  c = b;
  EXPECT_EQ(c.bytes(), kKey);
  Secret d = std::move(b);
  EXPECT_EQ(d.bytes(), kKey);
  ASSERT_OK_AND_ASSIGN(Secret e, Secret::FromBytes(std::string(20, 'e')));
  e = std::move(d);
  EXPECT_EQ(e.bytes(), kKey);
}

}  // namespace
}  // namespace malle::control
