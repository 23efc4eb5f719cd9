#include "libmalle/comm/internal/reaper.h"

#include <deque>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace malle::comm::internal {
namespace {

class Reaper {
 public:
  Reaper() { std::thread([this] { Run(); }).detach(); }

  void Add(std::function<void()> release) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(release));
    ++submitted_;
  }

  void Drain() {
    absl::MutexLock lock(&mu_);
    const uint64_t target = submitted_;
    auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return released_ >= target; };
    mu_.Await(absl::Condition(&done));
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> item;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      if (item) item();
      item = nullptr;  // drops the captured references here, on this thread
      absl::MutexLock lock(&mu_);
      ++released_;
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t released_ ABSL_GUARDED_BY(mu_) = 0;
};

Reaper& Instance() {
  static Reaper* reaper = new Reaper();  // leaked: its thread may be blocked at exit
  return *reaper;
}

}  // namespace

void Reap(std::function<void()> release) { Instance().Add(std::move(release)); }
void DrainReaper() { Instance().Drain(); }

}  // namespace malle::comm::internal
