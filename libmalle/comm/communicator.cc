// Adapter over c10d's Backend/ProcessGroup/Work API: every collective call and
// every c10d exception of the data path is handled here.
#include "libmalle/comm/communicator.h"

#include <exception>
#include <thread>

#include <ATen/Context.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/comm/internal/local_address.h"
#include "libmalle/comm/internal/reaper.h"

namespace malle::comm {
namespace {

std::string FirstLine(std::string text) {
  if (size_t nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  return text;
}

c10d::ReduceOp ToC10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    case ReduceOp::kProduct: return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

c10d::ProcessGroup::BackendType BackendTypeOf(const std::string& name) {
  if (name == "gloo") return c10d::ProcessGroup::BackendType::GLOO;
  if (name == "nccl") return c10d::ProcessGroup::BackendType::NCCL;
  return c10d::ProcessGroup::BackendType::CUSTOM;
}

}  // namespace

// ---------------------------------------------------------------------------
// AbortSignal

bool AbortSignal::Abort(absl::Status reason) {
  if (reason.ok()) reason = absl::AbortedError("aborted");
  std::function<void(const absl::Status&)> listener;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_.load(std::memory_order_relaxed)) return false;
    reason_ = reason;
    aborted_at_ = absl::Now();
    aborted_.store(true, std::memory_order_release);
    listener = listener_;
  }
  if (listener) listener(reason);
  return true;
}

absl::Status AbortSignal::reason() const {
  absl::MutexLock lock(&mu_);
  return reason_;
}

absl::Status AbortSignal::WaitUntil(const std::function<bool()>& done, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, &done]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done() || aborted_.load(std::memory_order_relaxed);
  };
  if (waiters_++ == 0) waiting_since_ = absl::Now();
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (--waiters_ == 0) waiting_since_ = absl::InfiniteFuture();
  if (done()) return absl::OkStatus();
  if (aborted_.load(std::memory_order_relaxed)) return reason_;
  return absl::DeadlineExceededError("deadline passed");
}

absl::Time AbortSignal::aborted_at() const {
  absl::MutexLock lock(&mu_);
  return aborted_at_;
}

absl::Time AbortSignal::waiting_since() const {
  absl::MutexLock lock(&mu_);
  return waiting_since_;
}

void AbortSignal::Notify() {
  // absl::Mutex re-evaluates waiters' conditions when it is released.
  absl::MutexLock lock(&mu_);
}

void AbortSignal::SetListener(std::function<void(const absl::Status&)> listener) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

// ---------------------------------------------------------------------------
// PendingCollective

struct PendingCollective::State {
  std::string op;
  int64_t generation = 0;
  c10::intrusive_ptr<c10d::Work> work;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  std::atomic<bool> done{false};
  std::shared_ptr<AbortSignal> abort;
  absl::Time deadline;
};

bool PendingCollective::done() const { return state_ && state_->done.load(); }

absl::Status PendingCollective::Wait() {
  if (!state_) return absl::FailedPreconditionError("PendingCollective::Wait on an empty handle");
  State& s = *state_;
  absl::Status waited = s.abort->WaitUntil([&s] { return s.done.load(); }, s.deadline);
  if (!waited.ok()) {
    if (absl::IsDeadlineExceeded(waited) && !s.abort->aborted()) {
      s.abort->Abort(absl::DeadlineExceededError(absl::StrCat(
          s.op, " in generation ", s.generation, " did not complete within the op timeout")));
    }
    // The work stays referenced by its completion callback until the backend
    // gives up on it; nothing here blocks on it.
    return s.abort->reason();
  }
  if (s.future->hasError()) {
    s.abort->Abort(absl::UnavailableError(absl::StrCat(s.op, " failed in generation ", s.generation,
                                                       ": ", FirstLine(s.future->tryRetrieveErrorMessage()))));
    return s.abort->reason();
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Communicator

Communicator::Communicator(int rank, int size, int64_t generation,
                           std::shared_ptr<AbortSignal> abort, CommunicatorOptions options)
    : rank_(rank), size_(size), generation_(generation), abort_(std::move(abort)), options_(options) {}

Communicator::~Communicator() {
  // Joining a c10d group's threads can block until its timeout if a peer
  // froze mid-operation, so teardown happens on the reaper thread.
  // A device backend (NCCL) is shut down explicitly: destroyed without it,
  // ProcessGroupNCCL warns and, if that happens at exit, fails against an
  // unloading CUDA runtime. After a failure it is aborted instead (a shutdown
  // would wait for collectives that a dead peer never completes).
  const bool separate = data_ && data_.get() != control_.get();
  const bool aborted = abort_ && abort_->aborted();
  internal::Reap([control = std::move(control_), data = std::move(data_),
                  pg = std::move(process_group_), separate, aborted]() mutable {
    pg.reset();
    if (separate) {
      try {
        if (aborted) {
          data->abort();
        } else {
          data->shutdown();
        }
      } catch (const std::exception&) {
        // Teardown of a generation that is gone: nothing to report it to.
      }
    }
    data.reset();
    control.reset();
  });
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Build(
    const std::shared_ptr<ControlStore>& store, int rank, int size, int64_t generation,
    std::shared_ptr<const BackendFactory> control, std::shared_ptr<const BackendFactory> data,
    std::shared_ptr<AbortSignal> abort, absl::Duration timeout, CommunicatorOptions options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Communicator: rank must be in [0, size) and size >= 1, got rank ", rank,
                     " of ", size));
  }
  if (!control) return absl::InvalidArgumentError("Communicator: control backend is null");
  if (!data) data = control;
  if (!abort) abort = std::make_shared<AbortSignal>();
  // A private connection: if this build is abandoned (a peer died), its
  // thread keeps blocking on this connection, not on the caller's.
  MALLE_ASSIGN_OR_RETURN(std::shared_ptr<ControlStore> connection, store->Clone());
  // Peers on other hosts reach this rank at the address it uses to reach the store.
  std::string local_address;
  if (absl::StatusOr<std::string> a = internal::LocalAddressFor(*store); a.ok()) {
    local_address = *std::move(a);
  } else {
    MALLE_LOG(WARNING) << "generation " << generation << ": " << a.status()
                       << "; binding loopback (only members on this host can connect)";
  }

  struct BuildState {
    std::atomic<bool> done{false};
    absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> control = absl::UnknownError("not built");
    absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> data = absl::UnknownError("not built");
  };
  auto state = std::make_shared<BuildState>();
  const bool separate_data = data.get() != control.get();
  std::thread([state, connection, control, data, abort, rank, size, generation, timeout,
               separate_data, local_address]() {
    GroupSpec spec;
    spec.local_address = local_address;
    spec.rank = rank;
    spec.size = size;
    spec.generation = generation;
    spec.timeout = timeout;
    spec.store = connection->WithPrefix(control->name() + "/")->c10d_store();
    auto built_control = control->Create(spec);
    absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> built_data = built_control;
    if (built_control.ok() && separate_data) {
      spec.store = connection->WithPrefix("data-" + data->name() + "/")->c10d_store();
      built_data = data->Create(spec);
    }
    state->control = std::move(built_control);
    state->data = std::move(built_data);
    state->done.store(true);
    abort->Notify();
  }).detach();

  absl::Status waited =
      abort->WaitUntil([&state] { return state->done.load(); }, absl::Now() + timeout);
  if (!waited.ok()) {
    if (absl::IsDeadlineExceeded(waited)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "building generation ", generation, " (rank ", rank, " of ", size, ") took longer than ",
          absl::FormatDuration(timeout), "; a member did not arrive"));
    }
    return waited;
  }
  MALLE_RETURN_IF_ERROR(state->control.status());
  MALLE_RETURN_IF_ERROR(state->data.status());

  std::unique_ptr<Communicator> comm(new Communicator(rank, size, generation, abort, options));
  comm->control_ = *state->control;
  comm->data_ = *state->data;
  comm->data_device_ = data->device_type();
  comm->data_name_ = data->name();
  try {
    auto pg = c10::make_intrusive<c10d::ProcessGroup>(connection->c10d_store(), rank, size);
    pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, comm->control_);
    if (separate_data) pg->setBackend(comm->data_device_, BackendTypeOf(data->name()), comm->data_);
    pg->setDefaultBackend(separate_data ? BackendTypeOf(data->name())
                                        : c10d::ProcessGroup::BackendType::GLOO);
    comm->process_group_ = pg;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("wrapping the backends in a c10d ProcessGroup: ",
                                            FirstLine(e.what())));
  }
  return comm;
}

c10d::Backend* Communicator::BackendFor(const at::Tensor& tensor) {
  if (tensor.device().type() == c10::DeviceType::CPU) return control_.get();
  if (tensor.device().type() == data_device_) return data_.get();
  return nullptr;
}

absl::StatusOr<PendingCollective> Communicator::Issue(
    absl::string_view op, const at::Tensor& sample,
    const std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)>& start) {
  if (abort_->aborted()) return abort_->reason();
  if (!sample.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": tensor is undefined"));
  }
  c10d::Backend* backend = BackendFor(sample);
  if (backend == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": tensors on ", sample.device().str(), " need a data backend for that device (this group's data backend is ",
        data_name_, ")"));
  }
  auto state = std::make_shared<PendingCollective::State>();
  state->op = std::string(op);
  state->generation = generation_;
  state->abort = abort_;
  state->deadline = absl::Now() + options_.op_timeout;
  try {
    state->work = start(*backend);
    state->future = state->work->getFuture();
  } catch (const std::exception& e) {
    abort_->Abort(absl::UnavailableError(
        absl::StrCat(op, " could not start in generation ", generation_, ": ", FirstLine(e.what()))));
    return abort_->reason();
  }
  // The callback runs on the backend's thread when the work completes (or at
  // once if it already has). It holds the state, so an abandoned work stays
  // alive until the backend lets go of it.
  state->future->addCallback([state](c10::ivalue::Future&) {
    state->done.store(true);
    state->abort->Notify();
  });
  PendingCollective pending;
  pending.state_ = std::move(state);
  return pending;
}

absl::StatusOr<PendingCollective> Communicator::AllReduceAsync(std::vector<at::Tensor>& tensors,
                                                               ReduceOp op) {
  if (tensors.empty()) return absl::InvalidArgumentError("AllReduce: no tensors");
  return Issue("allreduce", tensors.front(), [&](c10d::Backend& backend) {
    c10d::AllreduceOptions opts;
    opts.reduceOp = ToC10d(op);
    return backend.allreduce(tensors, opts);
  });
}

absl::Status Communicator::AllReduce(std::vector<at::Tensor>& tensors, ReduceOp op) {
  MALLE_ASSIGN_OR_RETURN(PendingCollective pending, AllReduceAsync(tensors, op));
  return pending.Wait();
}

absl::Status Communicator::AllReduce(at::Tensor tensor, ReduceOp op) {
  std::vector<at::Tensor> tensors{std::move(tensor)};
  return AllReduce(tensors, op);
}

absl::Status Communicator::Broadcast(std::vector<at::Tensor>& tensors, int root) {
  if (tensors.empty()) return absl::InvalidArgumentError("Broadcast: no tensors");
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root must be in [0, ", size_, "), got ", root));
  }
  MALLE_ASSIGN_OR_RETURN(PendingCollective pending,
                         Issue("broadcast", tensors.front(), [&](c10d::Backend& backend) {
                           c10d::BroadcastOptions opts;
                           opts.rootRank = root;
                           return backend.broadcast(tensors, opts);
                         }));
  return pending.Wait();
}

// Point-to-point work of c10d's Gloo backend has no future (getFuture throws),
// so these wait on the work itself, bounded by the op timeout. A peer that
// dies resets its connection and fails the wait at once; an abort of the
// generation is not seen until then.
absl::Status Communicator::PointToPoint(absl::string_view op, at::Tensor tensor, int peer, int tag) {
  if (peer < 0 || peer >= size_ || peer == rank_ || tag < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": peer must be another rank in [0, ", size_,
                                                   ") and tag >= 0, got peer ", peer, ", tag ", tag));
  }
  if (abort_->aborted()) return abort_->reason();
  if (!tensor.defined()) return absl::InvalidArgumentError(absl::StrCat(op, ": tensor is undefined"));
  c10d::Backend* backend = BackendFor(tensor);
  if (backend == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": tensors on ", tensor.device().str(),
                                                   " need a data backend for that device"));
  }
  // Gloo sends only host memory: a device tensor over a Gloo data backend
  // goes through a host copy (both ends decide alike: same device, same backend).
  at::Tensor device_tensor;
  if (tensor.device().type() != c10::DeviceType::CPU && data_name_.rfind("gloo", 0) == 0) {
    device_tensor = tensor;
    tensor = op == "send" ? tensor.cpu() : at::empty(tensor.sizes(), tensor.options().device(c10::kCPU));
    backend = control_.get();
  }
  std::vector<at::Tensor> tensors{std::move(tensor)};
  try {
    c10::intrusive_ptr<c10d::Work> work =
        op == "send" ? backend->send(tensors, peer, tag) : backend->recv(tensors, peer, tag);
    if (!work->wait(std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.op_timeout)))) {
      abort_->Abort(absl::UnavailableError(absl::StrCat(op, " failed in generation ", generation_)));
      return abort_->reason();
    }
  } catch (const std::exception& e) {
    abort_->Abort(absl::UnavailableError(
        absl::StrCat(op, " failed in generation ", generation_, ": ", FirstLine(e.what()))));
    return abort_->reason();
  }
  if (device_tensor.defined() && op == "recv") device_tensor.copy_(tensors.front());
  return absl::OkStatus();
}

absl::Status Communicator::Send(at::Tensor tensor, int peer, int tag) {
  return PointToPoint("send", std::move(tensor), peer, tag);
}

absl::Status Communicator::Recv(at::Tensor tensor, int peer, int tag) {
  return PointToPoint("recv", std::move(tensor), peer, tag);
}

absl::Status Communicator::Broadcast(at::Tensor tensor, int root) {
  std::vector<at::Tensor> tensors{std::move(tensor)};
  return Broadcast(tensors, root);
}

absl::Status Communicator::Barrier() {
  // A one-element allreduce: c10d's Gloo barrier cannot be abandoned cleanly
  // on every release, a tiny allreduce can.
  at::Tensor token = at::zeros({1}, at::kLong);
  return AllReduce(token);
}

c10::intrusive_ptr<c10d::ProcessGroup> Communicator::process_group() const { return process_group_; }

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> MakeLocalProcessGroup() {
  std::shared_ptr<ControlStore> store = ControlStore::InMemory();
  GroupSpec spec;
  spec.store = store->c10d_store();
  spec.rank = 0;
  spec.size = 1;
  MALLE_ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Backend> backend, MakeGlooBackend()->Create(spec));
  try {
    auto pg = c10::make_intrusive<c10d::ProcessGroup>(spec.store, 0, 1);
    pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
    // DDP's Reducer over CUDA parameters broadcasts its bucket layout on their
    // device once (to nobody: one rank); the same Gloo backend serves it.
    if (at::globalContext().hasCUDA()) {
      pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, backend);
    }
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    return pg;
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("a one-rank c10d ProcessGroup: ", FirstLine(e.what())));
  }
}

}  // namespace malle::comm
