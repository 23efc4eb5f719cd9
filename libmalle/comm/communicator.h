// Communicator: the collectives of one generation, with abortable waits.
//
// An ElasticGroup hands out one Communicator per generation. Its rank and size
// never change (a resize builds a new generation and a new Communicator). Every
// blocking call returns early with the abort reason as soon as the generation
// is aborted (a peer failed, a heartbeat went stale), so no rank is held by a
// dead or frozen peer for longer than the failure-detection time.
//
//   malle::comm::Communicator& comm = group->comm();
//   at::Tensor grad = ...;
//   absl::Status s = comm.AllReduce(grad);        // sums over the generation
//   if (!s.ok()) { /* step failed: call group->AtStepBoundary() to recover */ }
//
// CPU tensors go over Gloo; device tensors over the data backend (NCCL when
// configured). After a failed collective (not after arguments rejected with
// kInvalidArgument) the Communicator is aborted and every further call fails
// fast with the same status.
//
// Thread-safety: collectives must be issued in the same order on every rank,
// from one thread at a time (c10d's rule). Abort(), aborted() and the
// accessors are safe from any thread.
#ifndef MALLE_COMM_COMMUNICATOR_H_
#define MALLE_COMM_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "c10/util/intrusive_ptr.h"
#include "libmalle/comm/backend.h"

namespace c10d {
class ProcessGroup;
class Work;
}  // namespace c10d

namespace malle::comm {

class ControlStore;

// A one-shot abort flag with a reason. Waiters blocked in WaitUntil() wake as
// soon as it is raised. Thread-safe.
class AbortSignal {
 public:
  // Raises the signal; the first reason wins and later calls are no-ops.
  // Returns true if this call raised it.
  bool Abort(absl::Status reason);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  absl::Status reason() const;
  absl::Time aborted_at() const;  // InfinitePast() if not aborted
  // When the oldest WaitUntil() still blocked began (a collective or a group
  // build this rank is waiting on); InfiniteFuture() if none is blocked.
  absl::Time waiting_since() const;

  // Blocks until `done()` is true (returns OK), the signal is raised (returns
  // the reason) or `deadline` passes (kDeadlineExceeded). `done` is evaluated
  // with the signal's lock held; whoever makes it true must call Notify().
  absl::Status WaitUntil(const std::function<bool()>& done, absl::Time deadline);
  void Notify();

  // Called once, on the thread that raises the signal, after raising it.
  void SetListener(std::function<void(const absl::Status&)> listener);

 private:
  mutable absl::Mutex mu_;
  std::atomic<bool> aborted_{false};
  absl::Status reason_ ABSL_GUARDED_BY(mu_);
  absl::Time aborted_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::function<void(const absl::Status&)> listener_ ABSL_GUARDED_BY(mu_);
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time waiting_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

enum class ReduceOp { kSum, kMax, kMin, kProduct };

// An operation in flight, for callers that overlap communication with work
// (e.g. a DDP comm hook). Wait() blocks like the synchronous calls do.
class PendingCollective {
 public:
  absl::Status Wait();
  bool done() const;

 private:
  friend class Communicator;
  struct State;
  std::shared_ptr<State> state_;
};

struct CommunicatorOptions {
  // Upper bound for one collective; past it the generation is aborted.
  absl::Duration op_timeout = absl::Seconds(60);
};

class Communicator {
 public:
  // Builds the groups of one generation. Blocks until every rank has joined,
  // `abort` is raised (returns its reason) or `timeout` passes. The builds run
  // on a helper thread over a private clone of `store`'s connection, so an
  // abandoned build never blocks the caller. `data` may equal `control`.
  static absl::StatusOr<std::unique_ptr<Communicator>> Build(
      const std::shared_ptr<ControlStore>& store, int rank, int size, int64_t generation,
      std::shared_ptr<const BackendFactory> control, std::shared_ptr<const BackendFactory> data,
      std::shared_ptr<AbortSignal> abort, absl::Duration timeout, CommunicatorOptions options = {});

  ~Communicator();  // hands the groups to a background thread for teardown
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t generation() const { return generation_; }

  // In-place collectives over every rank of this generation. All tensors of a
  // call must be on one device. Errors: the abort reason (kAborted or
  // kUnavailable) when the generation failed, kDeadlineExceeded past
  // op_timeout, kInvalidArgument for unusable tensors.
  absl::Status AllReduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum);
  absl::Status AllReduce(std::vector<at::Tensor>& tensors, ReduceOp op = ReduceOp::kSum);
  absl::Status Broadcast(at::Tensor tensor, int root);
  absl::Status Broadcast(std::vector<at::Tensor>& tensors, int root);
  // Point-to-point: `tensor` to rank `peer` / from rank `peer` into `tensor`
  // (same size on both sides), matched by `tag` (>= 0). Blocking; bounded by
  // op_timeout, but an abort raised meanwhile is only seen when the peer's
  // connection fails or the timeout passes. Errors as above, and
  // kInvalidArgument for a peer outside [0, size) or equal to this rank.
  absl::Status Send(at::Tensor tensor, int peer, int tag);
  absl::Status Recv(at::Tensor tensor, int peer, int tag);
  absl::Status Barrier();
  // Starts an allreduce and returns at once.
  absl::StatusOr<PendingCollective> AllReduceAsync(std::vector<at::Tensor>& tensors,
                                                   ReduceOp op = ReduceOp::kSum);

  // Aborts the generation locally: every blocked and future call returns
  // `reason`. Safe from any thread.
  void Abort(absl::Status reason) { abort_->Abort(std::move(reason)); }
  bool aborted() const { return abort_->aborted(); }
  absl::Status abort_reason() const { return abort_->reason(); }
  const std::shared_ptr<AbortSignal>& abort_signal() const { return abort_; }

  // The c10d process group of this generation (CPU: Gloo; the data backend's
  // device: that backend), for code that needs c10d directly (DDP's Reducer,
  // torch.distributed in Python). Valid while this Communicator lives.
  c10::intrusive_ptr<c10d::ProcessGroup> process_group() const;
  const std::string& data_backend_name() const { return data_name_; }

 private:
  Communicator(int rank, int size, int64_t generation, std::shared_ptr<AbortSignal> abort,
               CommunicatorOptions options);
  absl::Status PointToPoint(absl::string_view op, at::Tensor tensor, int peer, int tag);
  absl::StatusOr<PendingCollective> Issue(absl::string_view op, const at::Tensor& sample,
                                          const std::function<c10::intrusive_ptr<c10d::Work>(
                                              c10d::Backend&)>& start);
  c10d::Backend* BackendFor(const at::Tensor& tensor);

  const int rank_;
  const int size_;
  const int64_t generation_;
  std::shared_ptr<AbortSignal> abort_;
  CommunicatorOptions options_;
  c10::intrusive_ptr<c10d::Backend> control_;  // Gloo, CPU tensors
  c10::intrusive_ptr<c10d::Backend> data_;     // == control_ unless a device backend is set
  c10::DeviceType data_device_ = c10::DeviceType::CPU;
  std::string data_name_;
  c10::intrusive_ptr<c10d::ProcessGroup> process_group_;
};

// A one-rank CPU (Gloo) process group over a process-local store: it never
// talks to another process. For c10d components that must be bound to a group
// for life although their traffic goes elsewhere (DDP's Reducer with a comm
// hook). Errors: kInternal (c10d refused).
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> MakeLocalProcessGroup();

}  // namespace malle::comm

#endif  // MALLE_COMM_COMMUNICATOR_H_
