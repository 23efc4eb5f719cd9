// Journal: records survive a reopen, a torn last line (a crash inside
// Append) is dropped and cut off, any other damage is DataLoss naming the line.
#include "libmalle/control/state/journal.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::control {
namespace {

using ::malle::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

std::string Path(const std::string& name) {
  const std::string p = ::testing::TempDir() + "/journal_" + name;
  std::remove(p.c_str());
  return p;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const absl::Time kT0 = absl::FromUnixMicros(1'700'000'000'123'456);

TEST(JournalTest, RecordsSurviveAReopenInOrder) {
  const std::string path = Path("reopen");
  {
    ASSERT_OK_AND_ASSIGN(auto j, Journal::Open(path));
    EXPECT_THAT(j->records(), SizeIs(0));
    ASSERT_OK(j->Append({kT0, 1, R"({"v":1,"type":"a"})"}));
    ASSERT_OK(j->Append({kT0 + absl::Seconds(1), 5, R"({"v":1,"type":"b","s":"x\"y"})"}));
  }
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_OK_AND_ASSIGN(auto j, Journal::Open(path));
  ASSERT_THAT(j->records(), SizeIs(2));
  EXPECT_EQ(j->records()[0].at, kT0);
  EXPECT_EQ(j->records()[0].cursor, 1);
  EXPECT_EQ(j->records()[1].envelope_json, R"({"v":1,"type":"b","s":"x\"y"})");
  EXPECT_FALSE(j->dropped_torn_tail());
  ASSERT_OK(j->Append({kT0, 6, "{}"}));  // appends after what was there
  ASSERT_OK_AND_ASSIGN(auto again, Journal::Open(path));
  EXPECT_THAT(again->records(), SizeIs(3));
}

TEST(JournalTest, ATornLastLineIsDroppedAndCutOff) {
  const std::string path = Path("torn");
  {
    ASSERT_OK_AND_ASSIGN(auto j, Journal::Open(path));
    ASSERT_OK(j->Append({kT0, 1, "{}"}));
  }
  const std::string good = Read(path);
  { std::ofstream(path, std::ios::app) << R"({"at_us":1,"cursor":2,"envel)"; }
  ASSERT_OK_AND_ASSIGN(auto j, Journal::Open(path));
  EXPECT_TRUE(j->dropped_torn_tail());
  EXPECT_THAT(j->records(), SizeIs(1));
  EXPECT_EQ(Read(path), good);
  ASSERT_OK(j->Append({kT0, 2, "{}"}));
  ASSERT_OK_AND_ASSIGN(auto reopened, Journal::Open(path));
  EXPECT_THAT(reopened->records(), SizeIs(2));
}

TEST(JournalTest, DamageBeforeTheLastLineIsDataLossNamingTheLine) {
  const std::string path = Path("damaged");
  {
    std::ofstream out(path);
    out << R"({"at_us":1,"cursor":1,"envelope":"{}"})" << "\n";
    out << R"({"at_us":"soon","cursor":2,"envelope":"{}"})" << "\n";
    out << R"({"at_us":3,"cursor":3,"envelope":"{}"})" << "\n";
  }
  EXPECT_THAT(Journal::Open(path), StatusIs(absl::StatusCode::kDataLoss,
                                            HasSubstr(path + ":2: \"at_us\" and \"cursor\" must be integers")));
  {
    std::ofstream out(path);
    out << "not json\n";
  }
  EXPECT_THAT(Journal::Open(path), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(":1: not a JSON object")));
  {
    std::ofstream out(path);
    out << R"({"at_us":1,"cursor":-4,"envelope":"{}"})" << "\n";
  }
  EXPECT_THAT(Journal::Open(path), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("cursor")));
}

TEST(JournalTest, BadArgumentsAreRefused) {
  EXPECT_THAT(Journal::Open(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Journal::Open("/no/such/dir/journal"), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("/no/such/dir")));
  ASSERT_OK_AND_ASSIGN(auto j, Journal::Open(Path("newline")));
  EXPECT_THAT(j->Append({kT0, 1, "{\n}"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("newline")));
}

}  // namespace
}  // namespace malle::control
