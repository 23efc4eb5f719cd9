// The only translation unit that includes c10d's ProcessGroupNCCL.hpp. It is
// compiled against the nccl.h of the wheel's own NCCL (nvidia-nccl), so the
// NCCL_HAS_* feature macros that shape ProcessGroupNCCL's Options match the
// library torch was built with.
#include "libmalle/comm/nccl_backend.h"

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <exception>

#include "absl/strings/str_cat.h"

namespace malle::comm {
namespace {

class NcclFactory final : public BackendFactory {
 public:
  std::string name() const override { return "nccl"; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CUDA; }

  absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> Create(const GroupSpec& spec) const override {
    if (CudaDeviceCount() == 0) {
      return absl::FailedPreconditionError(
          "the NCCL backend needs a CUDA device and this process sees none");
    }
    try {
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = std::chrono::milliseconds(
          std::max<int64_t>(1, absl::ToInt64Milliseconds(spec.timeout)));
      return c10::intrusive_ptr<c10d::Backend>(
          c10::make_intrusive<c10d::ProcessGroupNCCL>(spec.store, spec.rank, spec.size, opts));
    } catch (const std::exception& e) {
      std::string what = e.what();
      if (size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
      return absl::UnavailableError(absl::StrCat("building NCCL group of generation ",
                                                 spec.generation, ": ", what));
    }
  }
};

}  // namespace

int CudaDeviceCount() {
  try {
    return static_cast<int>(c10::cuda::device_count());
  } catch (const std::exception&) {
    return 0;  // no driver: same as no device
  }
}

std::shared_ptr<const BackendFactory> MakeNcclBackend() { return std::make_shared<NcclFactory>(); }

void RegisterNcclBackend() { RegisterDataBackend("nccl", MakeNcclBackend); }

}  // namespace malle::comm
