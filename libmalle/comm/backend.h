// Backend factories: how one generation's process group is created.
//
// An ElasticGroup builds, for every generation, a Gloo group for control
// traffic and CPU tensors and, when a data backend such as NCCL is configured,
// a second group for device tensors. Each factory lives in its own translation
// unit because its c10d header (ProcessGroupGloo.hpp, ProcessGroupNCCL.hpp)
// is heavy and its API moves between PyTorch releases.
//
//   ElasticGroupOptions options;
//   options.data_backend = MakeGlooBackend();           // the default (CPU tensors)
//   // CUDA tensors through Gloo: GlooBackendOptions g; g.device_type =
//   // c10::DeviceType::CUDA; options.data_backend = MakeGlooBackend(g);
//   // or, built with MALLE_WITH_NCCL: options.data_backend = MakeNcclBackend();
//
// Thread-safety: factories are immutable after creation; Create() may be
// called from several threads at once.
#ifndef MALLE_COMM_BACKEND_H_
#define MALLE_COMM_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "c10/core/DeviceType.h"
#include "c10/util/intrusive_ptr.h"

namespace malle::comm {

// What a factory needs to build one group: a store private to this group's
// rendezvous (already prefixed, on its own connection), and the group shape.
struct GroupSpec {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int size = 1;
  int64_t generation = 0;
  // The address this rank's sockets bind to and announce (Communicator::Build:
  // the local address on the route to the control store, or GLOO_SOCKET_IFNAME's;
  // internal/local_address.h). Empty: the factory's own choice.
  std::string local_address;
  // Bounds the rendezvous and, for backends that have one, every operation.
  absl::Duration timeout = absl::Seconds(30);
};

class BackendFactory {
 public:
  virtual ~BackendFactory() = default;
  virtual std::string name() const = 0;  // "gloo", "nccl"
  // The device type whose tensors this backend reduces.
  virtual c10::DeviceType device_type() const = 0;
  // Blocks until every rank of `spec` has joined (or spec.timeout).
  // Errors: kUnavailable, kDeadlineExceeded, kFailedPrecondition (e.g. no GPU).
  virtual absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> Create(const GroupSpec& spec) const = 0;
};

struct GlooBackendOptions {
  // Address the group's sockets bind to. Empty (the default): the spec's
  // local_address (the one that reaches the control store), else loopback.
  std::string hostname;
  int threads = 2;  // Gloo worker threads per group
  // The tensors this group reduces. CPU for the control group. CUDA: a second
  // Gloo group that reduces CUDA tensors through host memory (torch's CUDA
  // Gloo work, registered by libtorch_cuda); slower than NCCL, but it works
  // with several ranks on one GPU, which NCCL refuses.
  c10::DeviceType device_type = c10::DeviceType::CPU;
};

std::shared_ptr<const BackendFactory> MakeGlooBackend(GlooBackendOptions options = {});

// Data backends by name, for code that chooses at run time (the elastic
// engine, the Python API): "gloo" (nullptr: CPU tensors only, reduced by the
// control group), "gloo-cuda" (CUDA tensors through Gloo and host memory)
// and what programs registered, e.g. "nccl" (RegisterNcclBackend() in
// nccl_backend.h: only programs that link the NCCL library load CUDA).
// Thread-safe. Errors: kInvalidArgument naming the known backends.
void RegisterDataBackend(const std::string& name, std::function<std::shared_ptr<const BackendFactory>()> make);
absl::StatusOr<std::shared_ptr<const BackendFactory>> MakeDataBackend(const std::string& name);

}  // namespace malle::comm

#endif  // MALLE_COMM_BACKEND_H_
