// Node slots: how many ranks a node agent runs per job (`malle-agent --slots N`),
// and which GPUs the node offers them (`--gpus auto` or a list).
//
// A node with N slots runs N ranks of the job it is assigned, LOCAL_RANK
// 0..N-1 (rank_env.h); on NCCL each uses CUDA device LOCAL_RANK of the devices
// it sees. `--gpus auto` asks the node, or the Slurm allocation it runs in,
// which GPUs are this agent's, in this order of precedence:
//   1. CUDA_VISIBLE_DEVICES, when set: what CUDA shows every process started
//      here (the ranks inherit it). Set but empty, "-1" or "NoDevFiles": none.
//   2. SLURM_STEP_GPUS, then SLURM_JOB_GPUS: the GPU indices Slurm's GRES
//      gave the step or the job; the ranks get them as CUDA_VISIBLE_DEVICES.
//   3. SLURM_GPUS_ON_NODE: a count (Slurm's device cgroup shows those as 0..n-1).
//   4. The driver's devices (/dev/nvidia<N>).
// Everything here is a pure function of an environment lookup and a device
// count, so it is tested without a GPU.
//
//   MALLE_ASSIGN_OR_RETURN(NodeGpus gpus, DetectGpus(ProcessEnvRaw, CountDriverDevices()));
//   MALLE_ASSIGN_OR_RETURN(int slots, ResolveSlots(/*slots=*/-1, gpus));   // one rank per GPU
//
// Thread-safety: pure functions; CountDriverDevices reads a directory.
#ifndef MALLE_CLUSTER_NODE_SLOTS_H_
#define MALLE_CLUSTER_NODE_SLOTS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libmalle/cluster/rank_env.h"

namespace malle::cluster {

inline constexpr int kMaxNodeSlots = 1024;  // the wire's NodeRegister.slots bound

// The variables DetectGpus reads (spelled once, here).
inline constexpr char kEnvCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";
inline constexpr char kEnvSlurmStepGpus[] = "SLURM_STEP_GPUS";
inline constexpr char kEnvSlurmJobGpus[] = "SLURM_JOB_GPUS";
inline constexpr char kEnvSlurmGpusOnNode[] = "SLURM_GPUS_ON_NODE";

struct NodeGpus {
  int count = 0;
  // CUDA_VISIBLE_DEVICES the agent sets for its ranks; empty: they inherit
  // the agent's environment as it is.
  std::string visible_devices;
  std::string source;  // where the answer came from, e.g. "SLURM_JOB_GPUS=2,3"
};

// The GPUs of this node or allocation (see the precedence above).
// `lookup` must tell a variable set to "" (returned as "") from an unset one
// (nullopt): ProcessEnvRaw does. `driver_devices`: the devices the driver
// shows, -1 when unknown. Errors: kInvalidArgument naming the variable (a
// malformed list, a duplicate index, an index the driver does not have),
// kNotFound (no GPU anywhere: the message names every place looked at).
absl::StatusOr<NodeGpus> DetectGpus(const EnvLookup& lookup, int driver_devices);

// An explicit list "0,1,3" (`--gpus 0,1,3`): those devices, as
// CUDA_VISIBLE_DEVICES of the ranks. kInvalidArgument as DetectGpus.
absl::StatusOr<NodeGpus> ParseGpuList(absl::string_view list, int driver_devices);

// The slots the agent offers: `slots` (-1: not given) checked against the
// GPUs, if any. Not given: one per GPU, or 1 without GPUs. Errors:
// kInvalidArgument for slots outside [1, kMaxNodeSlots], or more slots than
// GPUs (each rank needs its own device).
absl::StatusOr<int> ResolveSlots(int slots, const std::optional<NodeGpus>& gpus);

// The CUDA device a rank uses on NCCL: LOCAL_RANK of the `visible_devices`
// this process sees (torch.cuda.device_count(), comm::CudaDeviceCount()).
// kInvalidArgument naming the problem when there is no device for it (no
// GPU visible, or more ranks on the node than GPUs).
//   MALLE_ASSIGN_OR_RETURN(int dev, RankCudaDevice(env, comm::CudaDeviceCount()));
//   c10::cuda::set_device(dev);   // before building the model
absl::StatusOr<int> RankCudaDevice(const RankEnv& env, int visible_devices);

// The process environment, telling "set to empty" from "unset" (std::getenv).
std::optional<std::string> ProcessEnvRaw(const char* name);

// NVIDIA devices the driver shows: entries /dev/nvidia<N> of `dev_dir`.
int CountDriverDevices(const std::string& dev_dir = "/dev");

}  // namespace malle::cluster

#endif  // MALLE_CLUSTER_NODE_SLOTS_H_
