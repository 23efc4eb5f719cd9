// BucketSync: the elastic comm hook, shared by the C++ and the Python API.
//
// c10d's Reducer hands each full gradient bucket to a communication hook and
// waits, at the end of the backward pass, on the future the hook returned.
// The elastic hook starts the bucket's sum over the generation the step runs
// in and completes the future on a private waiter thread once the sum is
// done. It does not divide: the callers divide each gradient by the number of
// logical workers right after it is accumulated, while it is still in cache,
// as DDP's Reducer does with gradient_as_bucket_view (a division of the whole
// bucket here, when it is handed over, reads it from memory again: measured
// 10-12 ms of a 210 ms step for 21 M parameters on 2 cores). The C++
// GradReducer and the Python ElasticModel (through the binding) register the
// same hook on their Reducer, so no Python runs per bucket and no Python
// thread waits on collectives.
//
//   auto sync = std::make_shared<BucketSync>();
//   MALLE_RETURN_IF_ERROR(RegisterCommHook(reducer, sync));   // once, before the first backward
//   // each step, before the backward that reduces (comm: the step's generation):
//   sync->Arm(&comm);
//   loss.backward();
//   BucketSync::Tally t = sync->Take();  // t.error: OK, or why to redo the step
//
// A bucket whose collective fails (a peer died) is handed back unreduced and
// the first error is kept until Take(); once an error is kept, later buckets
// are handed back at once without communicating (the generation is aborted
// anyway). CUDA buffers get a future that carries their device, so the
// Reducer's wait orders its stream after the collective.
//
// Thread-safety: Launch() (the hook) on one thread at a time (collectives are
// issued in order); Arm(), Take() and Close() from any thread.
#ifndef MALLE_ELASTIC_BUCKET_SYNC_H_
#define MALLE_ELASTIC_BUCKET_SYNC_H_

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <thread>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "libmalle/comm/communicator.h"

namespace c10d {
class Reducer;
}  // namespace c10d

namespace malle::elastic {

class BucketSync {
 public:
  BucketSync();   // starts the waiter thread
  ~BucketSync();  // Close()

  // Completes what is in flight (each wait is bounded by the communicator's op
  // timeout or its abort) and joins the waiter thread. Launch() then completes
  // every bucket at once, unreduced. Idempotent.
  void Close();
  BucketSync(const BucketSync&) = delete;
  BucketSync& operator=(const BucketSync&) = delete;

  // What the hook does with the next buckets: sum them over `comm`'s ranks;
  // `comm` == nullptr: hand them back unreduced (nothing to reduce over, e.g.
  // the step already failed). The Communicator must outlive the buckets
  // launched while it is armed.
  void Arm(comm::Communicator* comm);

  // The hook: starts the sum of `buffer` (in place) over the armed
  // communicator; the returned future completes with `buffer` when the sum is
  // done or has failed. Not armed, disarmed (nullptr), closed, or an error
  // kept since the last Take(): completes at once with `buffer` unchanged.
  c10::intrusive_ptr<c10::ivalue::Future> Launch(const at::Tensor& buffer);

  // What happened since the last Take(), and resets it. `launched` buckets
  // that are not `completed` are still in flight (after a backward pass the
  // Reducer has waited for all of its buckets); they count in the next tally.
  struct Tally {
    int launched = 0;
    int completed = 0;
    absl::Status error;  // the first failed collective's, else OK
    std::optional<std::chrono::steady_clock::time_point> last_launch;  // the last bucket's hook
  };
  Tally Take();

 private:
  struct InFlight {
    comm::PendingCollective pending;
    at::Tensor buffer;
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); }
  void WaitLoop();

  absl::Mutex mu_;
  comm::Communicator* comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  Tally tally_ ABSL_GUARDED_BY(mu_);
  std::deque<InFlight> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex close_mu_;  // serialises Close()
  std::thread waiter_ ABSL_GUARDED_BY(close_mu_);
};

// Makes `sync` the communication hook of `reducer` (c10d allows one hook per
// Reducer, registered before its first backward). Errors: kFailedPrecondition
// (c10d refused: a hook is already registered or the Reducer has run).
absl::Status RegisterCommHook(c10d::Reducer& reducer, std::shared_ptr<BucketSync> sync);

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_BUCKET_SYNC_H_
