// The one translation unit that includes c10d's Reducer (reducer.hpp pulls in
// autograd and c10d headers; keep it out of elastic_trainer.cc).
#include "libmalle/elastic/grad_reducer.h"

#include <algorithm>
#include <deque>
#include <exception>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"

namespace malle::elastic {
namespace {

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

}  // namespace

struct GradReducer::State {
  // One bucket in flight: its collective, the buffer it reduces in place and
  // the future the Reducer waits on.
  struct InFlight {
    comm::PendingCollective pending;
    at::Tensor buffer;
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };

  std::unique_ptr<c10d::Reducer> reducer;
  c10::intrusive_ptr<c10d::ProcessGroup> local_group;
  int num_buckets = 0;

  absl::Mutex mu;
  comm::Communicator* comm ABSL_GUARDED_BY(mu) = nullptr;
  double divisor ABSL_GUARDED_BY(mu) = 1.0;
  bool armed ABSL_GUARDED_BY(mu) = false;
  int launched ABSL_GUARDED_BY(mu) = 0;   // buckets handed to the hook in this backward
  int completed ABSL_GUARDED_BY(mu) = 0;  // their futures completed
  absl::Status error ABSL_GUARDED_BY(mu);
  std::deque<InFlight> queue ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::thread waiter;

  // On the autograd thread: start the bucket's allreduce, or hand it back at
  // once when there is nothing to reduce over (failed step, no communicator).
  c10::intrusive_ptr<c10::ivalue::Future> RunHook(at::Tensor& buffer) {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
    absl::MutexLock lock(&mu);
    ++launched;
    if (comm != nullptr && error.ok()) {
      // Divide before the sum, on this (the autograd) thread, as DDP's
      // built-in allreduce does; the waiter thread only waits.
      buffer.div_(divisor);
      std::vector<at::Tensor> tensors = {buffer};
      absl::StatusOr<comm::PendingCollective> pending = comm->AllReduceAsync(tensors);
      if (pending.ok()) {
        queue.push_back({*std::move(pending), buffer, future});
        return future;
      }
      error = pending.status();
    }
    ++completed;
    future->markCompleted(c10::IValue(buffer));
    return future;
  }

  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stopping || !queue.empty(); }

  // The waiter thread: completes the futures in launch order.
  void WaitLoop() {
    for (;;) {
      InFlight item;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(this, &State::HasWork));
        if (queue.empty()) return;  // stopping
        item = std::move(queue.front());
        queue.pop_front();
      }
      absl::Status s = item.pending.Wait();
      {
        absl::MutexLock lock(&mu);
        if (!s.ok() && error.ok()) error = s;
        ++completed;
      }
      item.future->markCompleted(c10::IValue(item.buffer));
    }
  }
};

namespace {

// A Reducer whose bucket layout is fixed at creation. A c10d::Reducer
// otherwise records the order in which gradients become ready until its
// buckets are rebuilt (DDP rebuilds once, after the first iteration); that
// order may differ between ranks, which must share one layout, and without a
// rebuild the record grows by one entry per parameter every step. So the
// record is filled once, in reverse parameter order (DDP's initial order), and
// the buckets are rebuilt from it at once.
class FixedLayoutReducer : public c10d::Reducer {
 public:
  using c10d::Reducer::Reducer;
  bool FixLayout(size_t num_params) {
    for (size_t i = num_params; i-- > 0;) push_rebuilt_params(i);
    return rebuild_buckets();
  }
};

class ElasticCommHook : public c10d::CommHookInterface {
 public:
  explicit ElasticCommHook(GradReducer::State* state) : state_(state) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    return state_->RunHook(bucket.getBufferRef());
  }
  at::Tensor parseHookResult(const c10::IValue& result) override {
    return c10d::detail::parseCppCommHookResult(result);
  }

 private:
  GradReducer::State* state_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GradReducer>> GradReducer::Create(std::vector<at::Tensor> params,
                                                                 int64_t bucket_bytes) {
  if (params.empty()) return absl::InvalidArgumentError("GradReducer: no parameters to reduce");
  if (bucket_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("GradReducer: bucket_bytes must be > 0, got ", bucket_bytes));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined() || params[i].is_sparse() || !params[i].device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GradReducer: parameter ", i, " is not a dense CPU tensor"));
    }
  }
  auto state = std::make_shared<State>();
  MALLE_ASSIGN_OR_RETURN(state->local_group, comm::MakeLocalProcessGroup());
  try {
    // Buckets in reverse parameter order: the last layers' gradients are
    // ready first, and buckets are launched in index order.
    auto [indices, limits] = c10d::compute_bucket_assignment_by_size(
        params, {static_cast<size_t>(bucket_bytes)}, std::vector<bool>(params.size(), false));
    std::reverse(indices.begin(), indices.end());
    state->num_buckets = static_cast<int>(indices.size());
    std::unordered_map<size_t, std::string> names;
    auto reducer = std::make_unique<FixedLayoutReducer>(
        params, std::move(indices), state->local_group, std::vector<bool>(params.size(), false),
        // The gradients become views of the buckets, so a reduced bucket is
        // the gradient: no copy back after the backward (DDP's default copies).
        bucket_bytes, /*find_unused_parameters=*/false, /*gradient_as_bucket_view=*/true,
        std::move(names), /*first_bucket_bytes_cap=*/bucket_bytes,
        /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
        std::vector<int64_t>(static_cast<size_t>(state->num_buckets), bucket_bytes));
    if (!reducer->FixLayout(params.size())) {
      return absl::InternalError("GradReducer: c10d::Reducer refused to fix its bucket layout");
    }
    state->num_buckets = static_cast<int>(reducer->get_grad_buckets(/*return_zero_tensors=*/true).size());
    reducer->register_comm_hook(std::make_unique<ElasticCommHook>(state.get()));
    state->reducer = std::move(reducer);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("GradReducer: c10d::Reducer: ", FirstLine(e)));
  }
  State* raw = state.get();
  state->waiter = std::thread([raw] { raw->WaitLoop(); });
  return std::unique_ptr<GradReducer>(new GradReducer(std::move(state)));
}

GradReducer::GradReducer(std::shared_ptr<State> state) : state_(std::move(state)) {}

GradReducer::~GradReducer() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
  }
  // The waiter drains what is queued (each Wait() is bounded by the
  // communicator's op timeout or its abort) and exits.
  state_->waiter.join();
  state_->reducer.reset();
}

absl::Status GradReducer::Arm(comm::Communicator* comm, double divisor) {
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->armed) {
      return absl::FailedPreconditionError("GradReducer::Arm: already armed (Finish() was not called)");
    }
    state_->comm = comm;
    state_->divisor = divisor;
    state_->armed = true;
    state_->launched = 0;
    state_->completed = 0;
    state_->error = absl::OkStatus();
  }
  try {
    state_->reducer->prepare_for_backward({});
  } catch (const std::exception& e) {
    absl::MutexLock lock(&state_->mu);
    state_->armed = false;
    return absl::FailedPreconditionError(absl::StrCat("GradReducer::Arm: ", FirstLine(e)));
  }
  return absl::OkStatus();
}

absl::Status GradReducer::Finish(absl::Status* sync_error) {
  absl::MutexLock lock(&state_->mu);
  *sync_error = absl::OkStatus();
  if (!state_->armed) return absl::FailedPreconditionError("GradReducer::Finish: not armed");
  state_->armed = false;
  state_->comm = nullptr;
  if (state_->launched != state_->num_buckets || state_->completed != state_->launched) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GradReducer::Finish: the backward pass reduced ", state_->launched, " of ", state_->num_buckets,
        " gradient buckets (every parameter must get a gradient in the step's last micro-batch)"));
  }
  *sync_error = state_->error;
  return absl::OkStatus();
}

int GradReducer::num_buckets() const { return state_->num_buckets; }

}  // namespace malle::elastic
