// Clock: the source of time for every decision in libmalle.
//
// Code that decides by time (heartbeat staleness, debouncing, deadlines) takes
// a Clock* so that tests can drive time by hand with FakeClock instead of
// sleeping.
//
//   malle::base::FakeClock clock(absl::UnixEpoch());
//   Watchdog watchdog(&clock, ...);
//   clock.Advance(absl::Seconds(2));     // heartbeat is now stale
//
// Thread-safety: RealClock and FakeClock are safe to use from any thread.
#ifndef MALLE_BASE_CLOCK_H_
#define MALLE_BASE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace malle::base {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Blocks the calling thread for `d` of this clock's time.
  virtual void SleepFor(absl::Duration d) = 0;

  // The process-wide real clock (never destroyed).
  static Clock* Real();
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override;
  void SleepFor(absl::Duration d) override;
};

// A clock that only moves when told to. SleepFor blocks until another thread
// advances the clock past the wake-up time.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch());
  absl::Time Now() const override;
  void SleepFor(absl::Duration d) override;
  void Advance(absl::Duration d);
  void SetTime(absl::Time t);
  // Threads currently blocked in SleepFor (lets tests advance time only once
  // a sleeper is waiting).
  int sleepers() const;

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  int sleepers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace malle::base

#endif  // MALLE_BASE_CLOCK_H_
