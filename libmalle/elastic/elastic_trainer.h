// ElasticTrainer: the elastic engine (engine.h) for a LibTorch C++ training loop.
//
// The same engine the Python API runs on, with LibTorch conveniences: the
// model's tensors from a torch::nn::Module, a torch::optim optimizer whose
// state is part of the job state and which steps when a step is synchronised,
// tracked extras, learning rates rescaled when the global batch follows the
// world size. docs/elastic.md has the semantics (one engine, both APIs).
//
//   ElasticTrainerOptions o;
//   o.logical_workers = 4, o.num_samples = n, o.batch_size = 16, o.steps = 200;
//   MALLE_ASSIGN_OR_RETURN(auto trainer, ElasticTrainer::Create(
//       store, group_options, o, ModelState::FromModule(*net), adam));
//   for (;;) {
//     MALLE_ASSIGN_OR_RETURN(std::optional<StepPlan> plan, trainer->NextStep());
//     if (!plan) break;                                   // done, or this member left
//     for (size_t i = 0; i < plan->workers.size(); ++i) {
//       trainer->BeginMicroBatch(i);                      // RNG, buffers of worker k
//       Loss(*net, Batch(plan->workers[i].indices)).backward();
//       MALLE_RETURN_IF_ERROR(trainer->EndMicroBatch());
//     }
//     MALLE_ASSIGN_OR_RETURN(bool committed, trainer->FinishStep());  // reduce, step, commit
//   }
//
// CUDA models: move the module to the rank's device first; `backend` "nccl"
// reduces with NCCL (call comm::RegisterNcclBackend() once, from a program
// linking malle_comm_nccl), "gloo" through host memory.
//
// Thread-safety: one thread (the training loop) calls every member function.
#ifndef MALLE_ELASTIC_ELASTIC_TRAINER_H_
#define MALLE_ELASTIC_ELASTIC_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/comm/elastic_group.h"
#include "libmalle/elastic/engine.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn
namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace malle::elastic {

// The engine's options (logical workers, seed, deterministic mode, backend,
// advisor, ...) and the data.
struct ElasticTrainerOptions : EngineOptions {
  // Data: N samples, B per logical worker per step, and how long: exactly one
  // of `steps` (> 0) and `epochs` (> 0; whole steps that fit).
  int64_t num_samples = 0;
  int64_t batch_size = 0;
  int64_t steps = 0;
  double epochs = 0;
  bool shuffle = true;

  absl::Status Validate() const;  // kInvalidArgument naming the field
};

// The tensors that make up the model: parameters (trained; gradients reduced)
// and buffers (e.g. BatchNorm statistics: after each step every rank takes
// logical worker 0's). Names are compared with the state's at a transfer.
struct ModelState {
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  std::vector<std::pair<std::string, at::Tensor>> buffers;

  // Named "p<i>" / "b<i>".
  static ModelState FromTensors(std::vector<at::Tensor> parameters, std::vector<at::Tensor> buffers = {});
  // named_parameters() / named_buffers(), recursively.
  static ModelState FromModule(torch::nn::Module& module);
};

// User state that is part of the job state (an LR schedule, counters, ...).
using ExtraState = PartState;

class ElasticTrainer {
 public:
  // Joins later, at the first NextStep(). The model's tensors and the
  // optimizer must outlive the trainer. Reads StateLayoutKey and zero-fills
  // the memory the first state transfer will land in (blocks). Errors:
  // kInvalidArgument (options; bootstrap_size > L; an optimizer parameter
  // that is not in the model), kUnimplemented (an optimizer whose state
  // cannot be part of the job state).
  static absl::StatusOr<std::unique_ptr<ElasticTrainer>> Create(std::shared_ptr<comm::ControlStore> store,
                                                                comm::ElasticGroupOptions group_options,
                                                                ElasticTrainerOptions options, ModelState model,
                                                                torch::optim::Optimizer& optimizer);
  // Over a group that has already joined (its join transition is handled at
  // the first NextStep()).
  static absl::StatusOr<std::unique_ptr<ElasticTrainer>> Create(std::unique_ptr<comm::ElasticGroup> group,
                                                                ElasticTrainerOptions options, ModelState model,
                                                                torch::optim::Optimizer& optimizer);
  // Over an engine made elsewhere, e.g. CreateRankEngine (rank_engine.h) for a
  // rank a launcher or agent started; only the data fields of `options` are
  // used (the engine has its options).
  static absl::StatusOr<std::unique_ptr<ElasticTrainer>> Create(std::unique_ptr<Engine> engine,
                                                                const ElasticTrainerOptions& options, ModelState model,
                                                                torch::optim::Optimizer& optimizer);

  // Adds user state to the job state: joiners receive it, and a step that
  // does not commit gives it back what `save` returned when the step started
  // (so a schedule stepped after FinishStep() whatever it returned is not
  // stepped twice). Call before the first NextStep(), in the same order on
  // every rank. Errors: kInvalidArgument (empty or duplicate name).
  absl::Status Track(std::string name, std::function<ExtraState()> save,
                     std::function<absl::Status(const ExtraState&)> load);

  // The step boundary, then this rank's plan (Engine::NextStep); a follow-mode
  // learning-rate rescale is applied to the optimizer. Errors as Engine's.
  absl::StatusOr<std::optional<StepPlan>> NextStep();
  // Engine::BeginMicroBatch / EndMicroBatch.
  void BeginMicroBatch(size_t index) { engine_->BeginMicroBatch(index); }
  absl::Status EndMicroBatch() { return engine_->EndMicroBatch(); }
  // After the last micro-batch: synchronises, steps the optimizer and commits;
  // false when the synchronisation failed (the step is redone after the next
  // NextStep()). Blocks. Errors as Engine::Synchronize / Commit.
  absl::StatusOr<bool> FinishStep();
  // The same, calling `on_gradient` once between the synchronisation and the
  // optimizer's step, when every parameter's .grad() holds the step's full
  // gradient (averaged over the L logical workers, the same on every rank, in
  // deterministic mode too): the place to clip it
  // (torch::nn::utils::clip_grad_norm_) or log its norm. Not called when the
  // synchronisation failed. An error it returns is returned and the step is
  // not committed (a program error: the trainer cannot go on).
  absl::StatusOr<bool> FinishStep(const std::function<absl::Status()>& on_gradient);

  absl::Status RequestLeave() { return engine_->RequestLeave(); }
  // Parking (Engine::Save, parked, resumed_from, snapshot_step): a checkpoint
  // of the user's own, and what the park store did.
  absl::Status Save(const std::string& path) { return engine_->Save(path); }
  bool parked() const { return engine_->parked(); }
  const std::string& resumed_from() const { return engine_->resumed_from(); }
  int64_t snapshot_step() const { return engine_->snapshot_step(); }
  absl::StatusOr<std::string> StateDigest() const { return engine_->StateDigest(); }
  // The job state as one packed value (what a transfer sends), and back.
  absl::StatusOr<PackedState> PackJobState() const;
  absl::Status LoadJobState(PackedState state);

  int rank() const { return engine_->rank(); }
  int size() const { return engine_->size(); }
  int64_t generation() const { return engine_->generation(); }
  int64_t step() const { return engine_->step(); }
  int64_t total_steps() const { return engine_->total_steps(); }
  bool left() const { return engine_->left(); }
  int64_t redone_steps() const { return engine_->redone_steps(); }
  const std::vector<int>& workers() const { return engine_->workers(); }
  const std::vector<ResizeEvent>& history() const { return engine_->history(); }
  const std::string& member_id() const { return engine_->member_id(); }
  const std::optional<ElasticSampler>& sampler() const { return engine_->sampler(); }
  comm::ElasticGroup* group() { return engine_->group(); }
  Engine& engine() { return *engine_; }
  // The advisor's report as JSON / a table ('' before the first step).
  std::string ReportJson() const { return engine_->ReportJson(); }
  std::string ReportTable() const { return engine_->ReportTable(); }

 private:
  ElasticTrainer(std::unique_ptr<Engine> engine, torch::optim::Optimizer& optimizer)
      : engine_(std::move(engine)), optimizer_(optimizer) {}
  static absl::StatusOr<std::unique_ptr<ElasticTrainer>> Finish(std::unique_ptr<Engine> engine,
                                                                const ElasticTrainerOptions& options,
                                                                ModelState model,
                                                                torch::optim::Optimizer& optimizer);

  std::unique_ptr<Engine> engine_;
  torch::optim::Optimizer& optimizer_;
};

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_ELASTIC_TRAINER_H_
