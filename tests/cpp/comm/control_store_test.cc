// ControlStore beyond what elastic_group_test covers: the bounded handle the
// heartbeat watchdog uses (CloneBounded).
#include "libmalle/comm/control_store.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::comm {
namespace {

// An operation of a bounded handle that runs out of time goes on on a helper
// thread after the call has returned, so it must own its key and value. It
// used to read the caller's, gone by then: under load (the helper starting
// after the timeout) ranks crashed with SIGSEGV or wrote another key.
TEST(ControlStoreBoundedTest, AnOperationThatRunsOutOfTimeOwnsItsArguments) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ControlStore> host, ControlStore::Host("127.0.0.1", 0));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ControlStore> bounded, host->CloneBounded(absl::Milliseconds(1)));
  // Busy cores make the helpers start late, after their caller gave up.
  std::atomic<bool> stop{false};
  std::vector<std::thread> burners;
  for (int i = 0; i < 8; ++i) {
    burners.emplace_back([&stop] {
      volatile uint64_t x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  }
  std::vector<std::string> sent;  // keys whose add reached a helper thread
  int timed_out = 0;
  const absl::Time until = absl::Now() + absl::Seconds(3);
  for (int i = 0; absl::Now() < until && timed_out < 60; ++i) {
    // Long keys live on the heap; the next one reuses the freed block.
    const std::string key = absl::StrCat("bounded/", i, "/", std::string(100, static_cast<char>('a' + i % 26)));
    absl::StatusOr<int64_t> r = bounded->Add(key, 1);
    if (r.ok()) {
      sent.push_back(key);
    } else if (absl::StrContains(r.status().message(), "no answer within")) {
      sent.push_back(key);
      ++timed_out;
    }  // else "still unanswered": an earlier one is still running; nothing was sent
  }
  stop = true;
  for (std::thread& t : burners) t.join();
  // The last helper finishes: then operations go through again.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!bounded->Add("bounded/probe", 0).ok()) {
    ASSERT_LT(absl::Now(), deadline) << "the bounded handle never recovered";
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GT(timed_out, 0) << "no operation ran out of time: the test proved nothing";
  for (const std::string& key : sent) {
    ASSERT_OK_AND_ASSIGN(int64_t n, host->Add(key, 0));
    EXPECT_EQ(n, 1) << key.substr(0, 16) << "... was not added once";
  }
}

}  // namespace
}  // namespace malle::comm
