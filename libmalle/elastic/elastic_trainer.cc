#include "libmalle/elastic/elastic_trainer.h"

#include <set>
#include <utility>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "absl/strings/str_cat.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/elastic/optimizer_state.h"

namespace malle::elastic {
namespace {

std::vector<NamedTensor> Named(const std::vector<std::pair<std::string, at::Tensor>>& items) {
  std::vector<NamedTensor> out;
  for (const auto& [name, t] : items) out.push_back({name, t});
  return out;
}

}  // namespace

absl::Status ElasticTrainerOptions::Validate() const {
  if (logical_workers < 1 && lr_scaling.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("logical_workers: must be >= 1, got ", logical_workers,
                                                   " (or set lr_scaling for a global batch that follows the "
                                                   "world size)"));
  }
  MALLE_RETURN_IF_ERROR(EngineOptions::Validate());
  if ((steps > 0) == (epochs > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "steps/epochs: give exactly one of them (positive), got steps=", steps, ", epochs=", epochs));
  }
  if (steps < 0 || epochs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("steps/epochs: must not be negative, got steps=", steps, ", epochs=", epochs));
  }
  return absl::OkStatus();
}

ModelState ModelState::FromTensors(std::vector<at::Tensor> parameters, std::vector<at::Tensor> buffers) {
  ModelState m;
  for (size_t i = 0; i < parameters.size(); ++i) m.parameters.emplace_back(absl::StrCat("p", i), parameters[i]);
  for (size_t i = 0; i < buffers.size(); ++i) m.buffers.emplace_back(absl::StrCat("b", i), buffers[i]);
  return m;
}

ModelState ModelState::FromModule(torch::nn::Module& module) {
  ModelState m;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) m.parameters.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) m.buffers.emplace_back(item.key(), item.value());
  return m;
}

absl::StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::Create(std::shared_ptr<comm::ControlStore> store,
                                                                       comm::ElasticGroupOptions group_options,
                                                                       ElasticTrainerOptions options, ModelState model,
                                                                       torch::optim::Optimizer& optimizer) {
  MALLE_RETURN_IF_ERROR(options.Validate());
  MALLE_ASSIGN_OR_RETURN(auto engine, Engine::Create(std::move(store), std::move(group_options), options));
  return Finish(std::move(engine), options, std::move(model), optimizer);
}

absl::StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::Create(std::unique_ptr<comm::ElasticGroup> group,
                                                                       ElasticTrainerOptions options, ModelState model,
                                                                       torch::optim::Optimizer& optimizer) {
  MALLE_RETURN_IF_ERROR(options.Validate());
  MALLE_ASSIGN_OR_RETURN(auto engine, Engine::Create(std::move(group), options));
  return Finish(std::move(engine), options, std::move(model), optimizer);
}

absl::StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::Create(std::unique_ptr<Engine> engine,
                                                                       const ElasticTrainerOptions& options,
                                                                       ModelState model,
                                                                       torch::optim::Optimizer& optimizer) {
  if (engine == nullptr) return absl::InvalidArgumentError("ElasticTrainer::Create: no engine");
  ElasticTrainerOptions checked = options;
  static_cast<EngineOptions&>(checked) = engine->options();  // only the data fields are this call's
  MALLE_RETURN_IF_ERROR(checked.Validate());
  return Finish(std::move(engine), checked, std::move(model), optimizer);
}

absl::StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::Finish(std::unique_ptr<Engine> engine,
                                                                       const ElasticTrainerOptions& options,
                                                                       ModelState model,
                                                                       torch::optim::Optimizer& optimizer) {
  std::set<const void*> mine;
  for (const auto& [name, p] : model.parameters) mine.insert(p.unsafeGetTensorImpl());
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      if (!mine.count(p.unsafeGetTensorImpl())) {
        return absl::InvalidArgumentError("optimizer: has a parameter that is not in the model");
      }
    }
  }
  MALLE_RETURN_IF_ERROR(SaveOptimizer(optimizer).status());  // kUnimplemented naming an unsupported one
  MALLE_RETURN_IF_ERROR(engine->SetModel(Named(model.parameters), Named(model.buffers)));
  PartSpec part;
  part.name = "optimizer";
  part.save = [&optimizer] { return SaveOptimizer(optimizer); };
  part.load = [&optimizer](PartState s) { return LoadOptimizer(std::move(s), optimizer); };
  // Its state changes only when a step commits; its options (a schedule sets
  // the learning rate) may change after any step: those roll back.
  part.checkpoint = [&optimizer]() -> absl::StatusOr<PartState> {
    MALLE_ASSIGN_OR_RETURN(std::vector<std::vector<double>> options, OptimizerOptions(optimizer));
    RecordWriter out;
    out.PutInt(static_cast<int64_t>(options.size()));
    for (const std::vector<double>& group : options) {
      out.PutInt(static_cast<int64_t>(group.size()));
      for (double v : group) out.PutDouble(v);
    }
    return PartState{{}, std::move(out.bytes())};
  };
  part.restore = [&optimizer](PartState s) -> absl::Status {
    RecordReader in(s.bytes, {});
    MALLE_ASSIGN_OR_RETURN(int64_t groups, in.Int());
    std::vector<std::vector<double>> options(static_cast<size_t>(groups));
    for (std::vector<double>& group : options) {
      MALLE_ASSIGN_OR_RETURN(int64_t n, in.Int());
      for (int64_t i = 0; i < n; ++i) {
        MALLE_ASSIGN_OR_RETURN(double v, in.Double());
        group.push_back(v);
      }
    }
    return SetOptimizerOptions(optimizer, options);
  };
  MALLE_RETURN_IF_ERROR(engine->AddPart(std::move(part)));
  DataOptions data;
  data.num_samples = options.num_samples;
  data.batch_size = options.batch_size;
  if (options.steps > 0) data.steps = options.steps;
  if (options.epochs > 0) data.epochs = options.epochs;
  data.shuffle = options.shuffle;
  MALLE_RETURN_IF_ERROR(engine->SetData(data));
  engine->PrepareLanding();
  return std::unique_ptr<ElasticTrainer>(new ElasticTrainer(std::move(engine), optimizer));
}

absl::Status ElasticTrainer::Track(std::string name, std::function<ExtraState()> save,
                                   std::function<absl::Status(const ExtraState&)> load) {
  if (name.empty() || !save || !load) {
    return absl::InvalidArgumentError("Track: needs a name, a save and a load function");
  }
  return engine_->AddPart(TrackedPart(
      absl::StrCat("track:", name), [save = std::move(save)]() -> absl::StatusOr<PartState> { return save(); },
      [load = std::move(load)](PartState s) { return load(s); }));
}

absl::StatusOr<std::optional<StepPlan>> ElasticTrainer::NextStep() {
  MALLE_ASSIGN_OR_RETURN(std::optional<StepPlan> plan, engine_->NextStep());
  if (plan && plan->lr_rescale != 1.0) {
    // The global batch follows the world size: so do the learning rates.
    for (auto& group : optimizer_.param_groups()) {
      group.options().set_lr(group.options().get_lr() * plan->lr_rescale);
    }
  }
  return plan;
}

absl::StatusOr<bool> ElasticTrainer::FinishStep() { return FinishStep(nullptr); }

absl::StatusOr<bool> ElasticTrainer::FinishStep(const std::function<absl::Status()>& on_gradient) {
  MALLE_ASSIGN_OR_RETURN(bool ok, engine_->Synchronize());
  if (!ok) return false;  // not committed: the next boundary rolls back, recovers and redoes it
  if (on_gradient) MALLE_RETURN_IF_ERROR(on_gradient());
  optimizer_.step();
  MALLE_RETURN_IF_ERROR(engine_->Commit());
  return true;
}

absl::StatusOr<PackedState> ElasticTrainer::PackJobState() const {
  MALLE_ASSIGN_OR_RETURN(JobState s, engine_->CaptureState());
  return s.Pack(engine_->options().state_direct_min_bytes);
}

absl::Status ElasticTrainer::LoadJobState(PackedState state) {
  // A direct segment is a view of someone's own tensors. Ours (received in
  // place): keep it. Another trainer's (its PackJobState handed over in this
  // process): copy it, or the two would share their state.
  MALLE_ASSIGN_OR_RETURN(JobState mine, engine_->CaptureState());
  std::set<const void*> own;
  for (const auto* list : {&mine.parameters, &mine.buffers}) {
    for (const NamedTensor& t : *list) {
      if (t.tensor.defined()) own.insert(t.tensor.storage().data());
    }
  }
  for (size_t i = 0; i < state.buffers.size() && i < state.direct.size(); ++i) {
    if (state.direct[i] && !own.count(state.buffers[i].storage().data())) state.buffers[i] = state.buffers[i].clone();
  }
  MALLE_ASSIGN_OR_RETURN(JobState theirs, JobState::Unpack(std::move(state)));
  return engine_->RestoreState(std::move(theirs));
}

}  // namespace malle::elastic
