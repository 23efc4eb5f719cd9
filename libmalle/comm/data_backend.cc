// The data-backend registry of backend.h (no c10d headers: the factories
// live in their own translation units).
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "libmalle/comm/backend.h"

namespace malle::comm {
namespace {

using Maker = std::function<std::shared_ptr<const BackendFactory>()>;

absl::Mutex registry_mu(absl::kConstInit);

std::map<std::string, Maker>& Registry() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu) {
  static auto* registry = new std::map<std::string, Maker>{
      {"gloo-cuda",
       [] {
         GlooBackendOptions o;
         o.device_type = c10::DeviceType::CUDA;
         return MakeGlooBackend(o);
       }},
  };
  return *registry;
}

}  // namespace

void RegisterDataBackend(const std::string& name, Maker make) {
  absl::MutexLock lock(&registry_mu);
  Registry()[name] = std::move(make);
}

absl::StatusOr<std::shared_ptr<const BackendFactory>> MakeDataBackend(const std::string& name) {
  if (name == "gloo") return std::shared_ptr<const BackendFactory>();  // the control group reduces CPU tensors
  absl::MutexLock lock(&registry_mu);
  auto it = Registry().find(name);
  if (it == Registry().end()) {
    std::vector<std::string> known = {"gloo"};
    for (const auto& [n, make] : Registry()) known.push_back(n);
    std::string hint = name == "nccl" ? " (this program has no NCCL backend: build with MALLE_WITH_NCCL=ON, link "
                                        "malle_comm_nccl and call RegisterNcclBackend())"
                                      : "";
    return absl::InvalidArgumentError(absl::StrCat("data_backend: got '", name, "'", hint, "; expected one of ",
                                                   absl::StrJoin(known, ", ")));
  }
  return it->second();
}

}  // namespace malle::comm
