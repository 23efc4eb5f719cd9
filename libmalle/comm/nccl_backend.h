// The NCCL data backend (built only with -DMALLE_WITH_NCCL=ON).
//
// NCCL reduces CUDA tensors; the group's control traffic and CPU tensors stay
// on Gloo. Each rank must use its own GPU (NCCL rejects two ranks of one
// communicator on one device): set the current device before Join().
//
//   ElasticGroupOptions options;
//   options.data_backend = malle::comm::MakeNcclBackend();
//
// Thread-safety: as BackendFactory.
#ifndef MALLE_COMM_NCCL_BACKEND_H_
#define MALLE_COMM_NCCL_BACKEND_H_

#include <memory>

#include "libmalle/comm/backend.h"

namespace malle::comm {

// Number of CUDA devices this process can see (0 on a machine without a GPU).
int CudaDeviceCount();

// Create() fails with kFailedPrecondition when no CUDA device is visible.
std::shared_ptr<const BackendFactory> MakeNcclBackend();

// Makes "nccl" known to MakeDataBackend (backend.h), e.g. for the elastic
// engine's `backend = "nccl"`. Call once, before creating the engine.
void RegisterNcclBackend();

}  // namespace malle::comm

#endif  // MALLE_COMM_NCCL_BACKEND_H_
