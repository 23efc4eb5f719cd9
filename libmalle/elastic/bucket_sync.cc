#include "libmalle/elastic/bucket_sync.h"

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "absl/strings/str_cat.h"

namespace malle::elastic {
namespace {

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

class ElasticCommHook : public c10d::CommHookInterface {
 public:
  explicit ElasticCommHook(std::shared_ptr<BucketSync> sync) : sync_(std::move(sync)) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    return sync_->Launch(bucket.getBufferRef());
  }
  at::Tensor parseHookResult(const c10::IValue& result) override {
    return c10d::detail::parseCppCommHookResult(result);
  }

 private:
  std::shared_ptr<BucketSync> sync_;
};

}  // namespace

BucketSync::BucketSync() : waiter_([this] { WaitLoop(); }) {}

BucketSync::~BucketSync() { Close(); }

void BucketSync::Close() {
  absl::MutexLock close_lock(&close_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (waiter_.joinable()) waiter_.join();
}

void BucketSync::Arm(comm::Communicator* comm) {
  absl::MutexLock lock(&mu_);
  comm_ = comm;
}

c10::intrusive_ptr<c10::ivalue::Future> BucketSync::Launch(const at::Tensor& buffer) {
  // A CUDA buffer's future names its device: completing it records an event
  // on the waiter's stream, and the Reducer's wait makes its stream wait on it.
  auto future = buffer.is_cuda()
                    ? c10::make_intrusive<c10::ivalue::Future>(
                          c10::TensorType::get(), std::vector<c10::Device>{buffer.device()})
                    : c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
  comm::Communicator* comm = nullptr;
  {
    absl::MutexLock lock(&mu_);
    ++tally_.launched;
    tally_.last_launch = std::chrono::steady_clock::now();
    if (tally_.error.ok() && !stopping_) comm = comm_;
  }
  absl::Status status;
  if (comm != nullptr) {
    std::vector<at::Tensor> tensors = {buffer};
    absl::StatusOr<comm::PendingCollective> pending = comm->AllReduceAsync(tensors);
    if (pending.ok()) {
      absl::MutexLock lock(&mu_);
      if (!stopping_) {
        queue_.push_back({*std::move(pending), buffer, future});
        return future;
      }
    }
    // Closed meanwhile: no waiter any more, so wait here (bounded by the op timeout).
    status = pending.ok() ? pending->Wait() : pending.status();
  }
  {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && tally_.error.ok()) tally_.error = status;
    ++tally_.completed;
  }
  future->markCompleted(c10::IValue(buffer));
  return future;
}

BucketSync::Tally BucketSync::Take() {
  absl::MutexLock lock(&mu_);
  Tally out = std::move(tally_);
  tally_ = Tally{};
  return out;
}

void BucketSync::WaitLoop() {
  for (;;) {
    InFlight item;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &BucketSync::HasWork));
      if (queue_.empty()) return;  // stopping, nothing left in flight
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status s = item.pending.Wait();
    {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && tally_.error.ok()) tally_.error = s;
      ++tally_.completed;
    }
    item.future->markCompleted(c10::IValue(item.buffer));
  }
}

absl::Status RegisterCommHook(c10d::Reducer& reducer, std::shared_ptr<BucketSync> sync) {
  if (sync == nullptr) return absl::InvalidArgumentError("RegisterCommHook: no BucketSync");
  try {
    reducer.register_comm_hook(std::make_unique<ElasticCommHook>(std::move(sync)));
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(absl::StrCat("RegisterCommHook: c10d::Reducer: ", FirstLine(e)));
  }
  return absl::OkStatus();
}

}  // namespace malle::elastic
