#include "libmalle/base/clock.h"

#include "absl/time/clock.h"

namespace malle::base {

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();  // leaked on purpose
  return clock;
}

absl::Time RealClock::Now() const { return absl::Now(); }
void RealClock::SleepFor(absl::Duration d) { absl::SleepFor(d); }

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::SleepFor(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  const absl::Time wake = now_ + d;
  auto reached = [this, wake]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return now_ >= wake; };
  ++sleepers_;
  mu_.Await(absl::Condition(&reached));
  --sleepers_;
}

int FakeClock::sleepers() const {
  absl::MutexLock lock(&mu_);
  return sleepers_;
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

void FakeClock::SetTime(absl::Time t) {
  absl::MutexLock lock(&mu_);
  now_ = t;
}

}  // namespace malle::base
