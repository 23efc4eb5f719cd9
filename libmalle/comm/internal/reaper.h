// Destroys objects on a background thread.
//
// Tearing down a c10d process group joins its worker threads, and a worker
// stuck in a collective with a dead or frozen peer only returns at the
// backend's timeout. Survivors must not wait for that, so old groups are
// handed here and destroyed off the critical path.
//
// Thread-safety: Reap() may be called from any thread. The reaper thread is
// started on first use and never joined (it may be blocked at exit).
#ifndef MALLE_COMM_INTERNAL_REAPER_H_
#define MALLE_COMM_INTERNAL_REAPER_H_

#include <functional>

namespace malle::comm::internal {

// Runs `release` (typically a lambda owning the last reference) on the reaper
// thread, then destroys it there.
void Reap(std::function<void()> release);

// Blocks until everything handed over so far has been released (tests).
void DrainReaper();

}  // namespace malle::comm::internal

#endif  // MALLE_COMM_INTERNAL_REAPER_H_
