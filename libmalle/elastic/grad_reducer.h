// GradReducer: LibTorch's DDP engine (c10d::Reducer) with an elastic comm hook.
//
// The Reducer installs autograd hooks on the parameters, copies gradients into
// buckets as they become ready during backward and hands each full bucket to
// a communication hook, so communication overlaps the rest of the backward
// pass; at the end of backward it waits for every bucket. The gradients are
// views of the buckets (c10d's gradient_as_bucket_view), so the reduced
// buckets are the gradients, with no copy back. The Reducer is bound, for its whole life,
// to a one-rank process group it never communicates through (as in
// python/malletrain/elastic.py); the hook sends each bucket to whatever
// generation's Communicator the step runs in, so membership changes never
// reach the Reducer. A bucket whose collective fails (a peer died) is handed
// back unreduced and the failure is reported by Finish(): the trainer then
// discards the step.
//
//   MALLE_ASSIGN_OR_RETURN(auto reducer, GradReducer::Create(params, 25 << 20));
//   // each step: micro-batches 0..k-2 accumulate locally; before the last one
//   MALLE_RETURN_IF_ERROR(reducer->Arm(&comm, /*divisor=*/L));
//   loss.backward();                      // buckets are reduced during backward
//   absl::Status sync;
//   MALLE_RETURN_IF_ERROR(reducer->Finish(&sync));  // sync: OK, or why to redo the step
//
// Buckets follow the reverse parameter order (the order in which gradients
// usually become ready), the first one small (DDP's 1 MiB), and never change: every rank, including a joiner,
// uses the same layout. Dense parameters on one device (CPU or CUDA); every
// parameter must receive a gradient in an armed backward (as with DDP without
// find_unused_parameters). A post-accumulate-grad hook registered on a
// parameter after Create() (Python replaces the slot) runs after the
// division: Arm() puts the division back in front of it.
//
// Thread-safety: Arm/Finish on the training thread; the hooks run on the
// autograd thread; the comm hook is a BucketSync (bucket_sync.h), whose
// private waiter thread completes the buckets' futures.
#ifndef MALLE_ELASTIC_GRAD_REDUCER_H_
#define MALLE_ELASTIC_GRAD_REDUCER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libmalle/comm/communicator.h"

namespace malle::elastic {

class GradReducer {
 public:
  // torch.distributed's default size of DDP's first bucket (1 MiB).
  static constexpr int64_t kDefaultFirstBucketBytes = 1 << 20;

  // `params`: the trained parameters, in model order (the same on every
  // rank). `bucket_bytes`: the size of a bucket; the first one launched
  // holds `first_bucket_bytes` (at most `bucket_bytes`), as DDP's does, so
  // that communication starts early in the backward. Errors:
  // kInvalidArgument (no parameters, a sparse or non-CPU one, a size <= 0),
  // kInternal (c10d refused).
  static absl::StatusOr<std::unique_ptr<GradReducer>> Create(
      std::vector<at::Tensor> params, int64_t bucket_bytes,
      int64_t first_bucket_bytes = kDefaultFirstBucketBytes);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Makes the next backward pass reduce: each gradient is divided by
  // `divisor` right after autograd accumulated it (a post-accumulate-grad
  // hook, while it is still in cache), then its bucket is summed over
  // `comm`'s ranks (nullptr: neither, e.g. after a failure). Errors:
  // kInvalidArgument (`divisor` not finite and > 0), kFailedPrecondition (the
  // previous armed backward did not finish; c10d's message).
  absl::Status Arm(comm::Communicator* comm, double divisor);
  // After the armed backward; disarms. `*sync_error` receives OK when every
  // bucket was reduced, else the first collective's error (the step must be
  // redone); `*last_launch`, if given, when the last bucket was handed to the
  // hook (the advisor's exposed-communication term). Errors:
  // kFailedPrecondition (not armed, or the backward did not reach every
  // parameter).
  absl::Status Finish(absl::Status* sync_error,
                      std::optional<std::chrono::steady_clock::time_point>* last_launch = nullptr);

  int num_buckets() const;
  // The parameters (indices into Create's list) of each bucket, in the order
  // buckets are launched: the same on every rank, whatever order gradients
  // become ready in.
  const std::vector<std::vector<size_t>>& buckets() const;

  struct State;  // grad_reducer.cc (public only for its comm hook class)

 private:
  explicit GradReducer(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_GRAD_REDUCER_H_
