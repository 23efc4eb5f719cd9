// JobState: everything an elastic job is at a step boundary, as one value.
//
// Defines JobState (the model's named parameters and buffers, the job's
// counters, and language-specific parts: an optimizer's state, tracked
// objects), its wire form (Pack / Unpack over state_pack.h's segments), the
// checks a receiver makes (CheckCompatible) and its digest. Everything that
// moves or keeps a job's state goes through it: the transfer to joiners, the
// rollback of a failed step, parking, snapshots, user checkpoints and export.
//
// A JobState references tensors, it does not copy them: captured from a live
// job its tensors are the job's own (views of its flat buffers), and Pack()
// sends those buffers as they are; unpacked, they are views of the received
// segments. Parts are what only one language understands: `bytes` is opaque
// here (a pickled skeleton of a Python state_dict, a torch::optim param-group
// record), `tensors` travel in the flat segments like the model's.
//
//   JobState s = engine.CaptureState();           // no copy
//   PackedState wire = s.Pack(kDirectMinBytes);   // a few flat segments
//   MALLE_ASSIGN_OR_RETURN(JobState back, JobState::Unpack(std::move(wire)));
//   MALLE_RETURN_IF_ERROR(JobState::CheckCompatible(mine, back));
//
// Thread-safety: a value; no internal synchronisation.
#ifndef MALLE_ELASTIC_JOB_STATE_H_
#define MALLE_ELASTIC_JOB_STATE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libmalle/elastic/state_pack.h"

namespace malle::elastic {

// Bumped whenever the records below change; a receiver refuses another one.
inline constexpr int64_t kJobStateVersion = 3;

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// A language-specific piece of job state (an optimizer, a tracked object).
struct PartState {
  std::vector<at::Tensor> tensors;  // travel in flat segments
  std::string bytes;                // opaque to the engine
};

struct StatePartRecord {
  std::string name;  // "optimizer", "track:<name>"
  PartState state;
};

struct JobState {
  // Identity: a receiver with other values refuses the state ("job mismatch").
  int logical_workers = 0;  // 0: the global batch follows the world size
  uint64_t seed = 0;
  // Counters.
  int64_t step = 0;       // the next step to run (every earlier step is committed)
  int64_t position = 0;   // follow mode: stream position at the start of `step`
  double lr_factor = 0;   // follow mode: f(size) the learning rates are scaled for; 0: none yet
  // The model.
  std::vector<NamedTensor> parameters;
  std::vector<NamedTensor> buffers;
  // Parts, in registration order.
  std::vector<StatePartRecord> parts;

  // Bytes of tensor data (parameters, buffers, parts).
  int64_t tensor_bytes() const;
  const StatePartRecord* part(const std::string& name) const;

  // The wire form. Tensors sharing a storage are sent from it as one direct
  // segment when they reference at least `direct_min_bytes` of it (a live
  // job's flat buffers); the rest are packed by copying, one segment per
  // dtype and device. MALLE_CHECK: tensors are dense.
  PackedState Pack(int64_t direct_min_bytes = kDirectMinBytes) const;
  // Tensors are views of `packed`'s segments. Errors: kInvalidArgument
  // ("state: ..." naming what is corrupt, or another version).
  static absl::StatusOr<JobState> Unpack(PackedState packed);

  // Can `theirs` be loaded by a job whose state is `mine`? Compares identity
  // (logical workers, seed), then the model's names, shapes and dtypes, then
  // the part names. Errors: kInvalidArgument "job mismatch: ..." / "model
  // mismatch: ... (first differences: ...)" / "state mismatch: ...".
  static absl::Status CheckCompatible(const JobState& mine, const JobState& theirs);

  // FNV-1a 64 (hex) of the parameters, buffers and the "optimizer" part
  // (tensor bytes, shapes, dtypes; the part's bytes): equal on every replica
  // after a commit. Reads device tensors through host copies.
  std::string Digest() const;
};

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_JOB_STATE_H_
