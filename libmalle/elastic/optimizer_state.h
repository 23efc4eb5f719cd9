// Optimizer state of torch::optim optimizers as StatePacker records.
//
// Defines PackOptimizer / UnpackOptimizer (and SaveOptimizer / LoadOptimizer,
// the same as a PartState of the job state): every parameter group's options
// (learning rate, betas, momentum, ... so LR schedules survive a resize) and
// every parameter's state (moments, momentum buffers, and non-tensor state
// such as Adam's step count), in param_groups order. Supported: Adam, AdamW,
// SGD, RMSprop, Adagrad. LBFGS and user-defined optimizers give
// kUnimplemented naming the optimizer (torch::optim has no generic,
// archive-free view of an optimizer's state).
//
//   MALLE_ASSIGN_OR_RETURN(PartState s, SaveOptimizer(adam));   // tensors referenced
//   ...
//   MALLE_RETURN_IF_ERROR(LoadOptimizer(std::move(s), other_adam));   // same kind, same shapes
//
// Thread-safety: none; call with the optimizer not in use.
#ifndef MALLE_ELASTIC_OPTIMIZER_STATE_H_
#define MALLE_ELASTIC_OPTIMIZER_STATE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libmalle/elastic/job_state.h"
#include "libmalle/elastic/state_pack.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace malle::elastic {

// "adam", "adamw", "sgd", "rmsprop", "adagrad", or "" if not supported.
std::string OptimizerKind(const torch::optim::Optimizer& optimizer);

// Errors: kUnimplemented (unsupported optimizer).
absl::Status PackOptimizer(const torch::optim::Optimizer& optimizer, RecordWriter& out);

// Reads what PackOptimizer wrote and, only if all of it matches `optimizer`
// (kind, groups, parameter shapes and dtypes), replaces its options and state
// (tensors are views of the unpacker's segments, which they keep alive).
// Errors: kInvalidArgument ("optimizer mismatch: ..." or a corrupt message),
// kUnimplemented (unsupported optimizer).
absl::Status UnpackOptimizer(RecordReader& in, torch::optim::Optimizer& optimizer);

// The optimizer's state as a part of the job state (tensors referenced, not
// copied) and back (the optimizer keeps views of the part's tensors). Errors
// as above; LoadOptimizer also refuses trailing records.
absl::StatusOr<PartState> SaveOptimizer(const torch::optim::Optimizer& optimizer);
absl::Status LoadOptimizer(PartState state, torch::optim::Optimizer& optimizer);

// Every parameter group's options (learning rate, betas, ...), in group
// order, and back: what a step may change outside a commit (a schedule sets
// the learning rate). Errors: kUnimplemented (unsupported optimizer),
// kInvalidArgument (another number of groups).
absl::StatusOr<std::vector<std::vector<double>>> OptimizerOptions(const torch::optim::Optimizer& optimizer);
absl::Status SetOptimizerOptions(torch::optim::Optimizer& optimizer, const std::vector<std::vector<double>>& options);

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_OPTIMIZER_STATE_H_
