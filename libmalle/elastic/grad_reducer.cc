// The one translation unit that includes c10d's Reducer (reducer.hpp pulls in
// autograd and c10d headers; keep it out of elastic_trainer.cc).
#include "libmalle/elastic/grad_reducer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <string>
#include <unordered_map>
#include <utility>

#include <ATen/ops/mul.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/elastic/bucket_sync.h"

namespace malle::elastic {
namespace {

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

// What the parameters' DivideGradHooks share with the GradReducer.
struct GradScaling {
  // The armed backward's divisor; 0: off (micro-batches that only accumulate,
  // a step that already failed). Stored with release after `views` is set.
  std::atomic<double> divisor{0.0};
  // Each parameter's view of its bucket, known after the first reducing
  // backward (the Reducer keeps its buckets for life); undefined before.
  std::vector<at::Tensor> views;
};

// Divides a parameter's gradient right after autograd accumulated it, while
// it is still in cache, then runs the hook that was there before, if any.
// A gradient that is not (any more) its bucket view, e.g. after
// zero_grad(set_to_none=true), is scaled straight into the bucket, one pass
// instead of a division and the Reducer's copy. DDP's Reducer does the same
// when it has no comm hook.
class DivideGradHook : public torch::autograd::PostAccumulateGradHook {
 public:
  DivideGradHook(std::shared_ptr<GradScaling> scaling, size_t index,
                 std::unique_ptr<torch::autograd::PostAccumulateGradHook> next)
      : scaling_(std::move(scaling)), index_(index), next_(std::move(next)) {}
  void operator()(const torch::autograd::Variable& param) override {
    const double d = scaling_->divisor.load(std::memory_order_acquire);
    const at::Tensor& grad = param.grad();
    if (d != 0.0 && grad.defined()) {
      const at::Tensor& view = scaling_->views[index_];
      if (view.defined() && grad.data_ptr() != view.data_ptr() && grad.sizes() == view.sizes()) {
        at::mul_out(const_cast<at::Tensor&>(view), grad, at::scalar_tensor(1.0 / d, grad.options()));
        param.mutable_grad() = view;
      } else {
        grad.mul_(1.0 / d);
      }
    }
    if (next_) (*next_)(param);
  }
  std::unique_ptr<torch::autograd::PostAccumulateGradHook> TakeNext() { return std::move(next_); }

 private:
  std::shared_ptr<GradScaling> scaling_;
  size_t index_;
  std::unique_ptr<torch::autograd::PostAccumulateGradHook> next_;
};

}  // namespace

struct GradReducer::State {
  std::unique_ptr<c10d::Reducer> reducer;
  c10::intrusive_ptr<c10d::ProcessGroup> local_group;
  int num_buckets = 0;
  std::vector<std::vector<size_t>> layout;  // parameter indices per bucket, in launch order
  // The comm hook: the collectives and the futures' waiter thread.
  std::shared_ptr<BucketSync> sync = std::make_shared<BucketSync>();
  // Read by the parameters' DivideGradHooks.
  std::shared_ptr<GradScaling> scaling = std::make_shared<GradScaling>();
  std::vector<at::Tensor> params;
  std::vector<DivideGradHook*> hooks;  // owned by the parameters' autograd metadata
  absl::Mutex mu;
  bool armed ABSL_GUARDED_BY(mu) = false;
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

// The size cap of each bucket, in launch order, for c10d's Reducer (whose
// rebuild follows this list when it is given): the first one small.
std::vector<int64_t> BucketCaps(int num_buckets, int64_t first_bucket_bytes, int64_t bucket_bytes) {
  std::vector<int64_t> caps(static_cast<size_t>(num_buckets), bucket_bytes);
  if (!caps.empty()) caps.front() = first_bucket_bytes;
  return caps;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GradReducer>> GradReducer::Create(std::vector<at::Tensor> params,
                                                                 int64_t bucket_bytes, int64_t first_bucket_bytes) {
  if (params.empty()) return absl::InvalidArgumentError("GradReducer: no parameters to reduce");
  if (bucket_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("GradReducer: bucket_bytes must be > 0, got ", bucket_bytes));
  }
  if (first_bucket_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GradReducer: first_bucket_bytes must be > 0, got ", first_bucket_bytes));
  }
  first_bucket_bytes = std::min(first_bucket_bytes, bucket_bytes);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined() || params[i].is_sparse() || params[i].device() != params.front().device() ||
        (!params[i].is_cpu() && !params[i].is_cuda())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GradReducer: parameter ", i, " is not a dense tensor on the first one's device (CPU or CUDA)"));
    }
  }
  auto state = std::make_shared<State>();
  MALLE_ASSIGN_OR_RETURN(state->local_group, comm::MakeLocalProcessGroup());
  try {
    // Buckets in reverse parameter order (the last layers' gradients are ready
    // first, and buckets are launched in index order), filled from the last
    // parameter on, the first one small: DDP's layout after its rebuild. A
    // small first bucket starts communication early in the backward; with
    // one large bucket nothing is sent before the backward ends.
    const size_t n = params.size();
    std::vector<at::Tensor> reversed(params.rbegin(), params.rend());
    auto [rev_indices, limits] = c10d::compute_bucket_assignment_by_size(
        reversed, {static_cast<size_t>(first_bucket_bytes), static_cast<size_t>(bucket_bytes)},
        std::vector<bool>(n, false));
    std::vector<std::vector<size_t>> indices;
    for (const std::vector<size_t>& bucket : rev_indices) {
      std::vector<size_t>& b = indices.emplace_back();
      for (size_t j : bucket) b.push_back(n - 1 - j);
    }
    state->num_buckets = static_cast<int>(indices.size());
    state->layout = indices;
    std::unordered_map<size_t, std::string> names;
    auto reducer = std::make_unique<FixedLayoutReducer>(
        params, std::move(indices), state->local_group, std::vector<bool>(params.size(), false),
        // The gradients become views of the buckets, so a reduced bucket is
        // the gradient: no copy back after the backward (DDP's default copies).
        bucket_bytes, /*find_unused_parameters=*/false, /*gradient_as_bucket_view=*/true,
        std::move(names), /*first_bucket_bytes_cap=*/first_bucket_bytes,
        /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
        BucketCaps(state->num_buckets, first_bucket_bytes, bucket_bytes));
    if (!reducer->FixLayout(params.size())) {
      return absl::InternalError("GradReducer: c10d::Reducer refused to fix its bucket layout");
    }
    state->num_buckets = static_cast<int>(reducer->get_grad_buckets(/*return_zero_tensors=*/true).size());
    MALLE_RETURN_IF_ERROR(RegisterCommHook(*reducer, state->sync));
    state->reducer = std::move(reducer);
    state->scaling->views.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      auto hook = std::make_unique<DivideGradHook>(
          state->scaling, i, std::move(torch::autograd::impl::post_acc_grad_hooks(params[i])));
      state->hooks.push_back(hook.get());
      torch::autograd::impl::set_post_acc_grad_hooks(params[i], std::move(hook));
    }
    state->params = params;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("GradReducer: c10d::Reducer: ", FirstLine(e)));
  }
  return std::unique_ptr<GradReducer>(new GradReducer(std::move(state)));
}

GradReducer::GradReducer(std::shared_ptr<State> state) : state_(std::move(state)) {}

GradReducer::~GradReducer() {
  // The Reducer first (no hook runs after this); then State's BucketSync
  // completes what is in flight (each wait is bounded by the communicator's op
  // timeout or its abort) and joins its waiter.
  state_->reducer.reset();
  // Give the parameters back their previous post-accumulate hooks, where ours
  // is still the one installed.
  for (size_t i = 0; i < state_->params.size(); ++i) {
    auto& slot = torch::autograd::impl::post_acc_grad_hooks(state_->params[i]);
    if (slot.get() == state_->hooks[i] && dynamic_cast<DivideGradHook*>(slot.get()) != nullptr) {
      slot = state_->hooks[i]->TakeNext();
    }
  }
}

absl::Status GradReducer::Arm(comm::Communicator* comm, double divisor) {
  if (!(divisor > 0.0) || !std::isfinite(divisor)) {
    return absl::InvalidArgumentError(absl::StrCat("GradReducer::Arm: divisor must be finite and > 0, got ", divisor));
  }
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->armed) {
      return absl::FailedPreconditionError("GradReducer::Arm: already armed (Finish() was not called)");
    }
    state_->armed = true;
  }
  // A hook registered on a parameter later (Python's
  // register_post_accumulate_grad_hook replaces the slot) would silently drop
  // the division: put ours back in front of it.
  for (size_t i = 0; i < state_->params.size(); ++i) {
    auto& slot = torch::autograd::impl::post_acc_grad_hooks(state_->params[i]);
    // By type too: a freed hook's address may be reused by its replacement.
    if (slot.get() == state_->hooks[i] && dynamic_cast<DivideGradHook*>(slot.get()) != nullptr) continue;
    auto hook = std::make_unique<DivideGradHook>(state_->scaling, i, std::move(slot));
    state_->hooks[i] = hook.get();
    torch::autograd::impl::set_post_acc_grad_hooks(state_->params[i], std::move(hook));
  }
  state_->sync->Take();  // a fresh tally for this backward
  state_->sync->Arm(comm);
  // Nothing to divide by 1 (one logical worker): the hooks stay off.
  state_->scaling->divisor.store(comm != nullptr && divisor != 1.0 ? divisor : 0.0,
                                 std::memory_order_release);
  try {
    state_->reducer->prepare_for_backward({});
  } catch (const std::exception& e) {
    absl::MutexLock lock(&state_->mu);
    state_->armed = false;
    return absl::FailedPreconditionError(absl::StrCat("GradReducer::Arm: ", FirstLine(e)));
  }
  return absl::OkStatus();
}

absl::Status GradReducer::Finish(absl::Status* sync_error,
                                 std::optional<std::chrono::steady_clock::time_point>* last_launch) {
  absl::MutexLock lock(&state_->mu);
  *sync_error = absl::OkStatus();
  if (!state_->armed) return absl::FailedPreconditionError("GradReducer::Finish: not armed");
  state_->armed = false;
  state_->sync->Arm(nullptr);
  state_->scaling->divisor.store(0.0, std::memory_order_relaxed);
  BucketSync::Tally t = state_->sync->Take();
  if (t.launched != state_->num_buckets || t.completed != t.launched) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GradReducer::Finish: the backward pass reduced ", t.completed, " of ", state_->num_buckets,
        " gradient buckets (every parameter must get a gradient in the step's last micro-batch)"));
  }
  *sync_error = t.error;
  if (last_launch != nullptr) *last_launch = t.last_launch;
  // The first reducing backward made every gradient a view of its bucket.
  std::vector<at::Tensor>& views = state_->scaling->views;
  for (size_t i = 0; i < views.size(); ++i) {
    const at::Tensor& g = state_->params[i].grad();
    if (!views[i].defined() && g.defined() && g.is_view()) views[i] = g;
  }
  return absl::OkStatus();
}

int GradReducer::num_buckets() const { return state_->num_buckets; }

const std::vector<std::vector<size_t>>& GradReducer::buckets() const { return state_->layout; }

}  // namespace malle::elastic
