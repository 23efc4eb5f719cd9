// ElasticTrainer: elastic data parallelism for a LibTorch C++ training loop.
//
// The C++ counterpart of malletrain.elastic (docs/elastic.md has the
// semantics; docs/elastic_cpp.md the C++ guide). The job declares L logical
// workers; every step trains one global batch of L x B samples, each physical
// rank runs its contiguous block of logical workers one after the other
// (gradients accumulate), and the optimizer sees the average over the L
// workers. The sequence of updates does not depend on how many processes run
// it or when that changed; with `deterministic` it is bitwise the same.
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
// Step boundary (NextStep): joins the job on first use (so a joiner builds its
// model first and the running members only pause for agreement, group build
// and state transfer), runs ElasticGroup::AtStepBoundary, and on a change
// sends the job state (parameters, buffers, optimizer state, tracked extras)
// from the rank with the newest commit to the members that need it (joiners,
// laggards; a broadcast when that is everyone else, else point to point), then
// re-plans the logical workers. A failed state transfer (a peer died) is
// recovered from at once by another boundary.
//
// Gradient synchronisation: by default (use_reducer) the last micro-batch's
// backward runs through LibTorch's DDP engine: c10d::Reducer's autograd hooks
// fill buckets of about `bucket_bytes` as gradients become ready and an
// elastic comm hook allreduces each one over the current generation
// (GradReducer, grad_reducer.h), so communication overlaps backward, as in
// the Python API. Earlier micro-batches only accumulate. With use_reducer =
// false, FinishStep packs the gradients into flat buckets after the backward
// and reduces them (Communicator::AllReduceAsync; packing overlaps
// communication, backward does not). Deterministic mode keeps a [L, P] buffer of per-worker
// gradients (rows of other ranks zero), allreduces it and sums the rows in
// worker order on every rank: L times the gradient memory and traffic.
// Device (CUDA) models are not supported yet: state sync and buckets are CPU.
//
// Thread-safety: one thread (the training loop) calls every member function.
// The ElasticGroup runs its own watchdog thread (docs/threading.md).
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
#include "absl/time/time.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/comm/elastic_group.h"
#include "libmalle/elastic/grad_reducer.h"
#include "libmalle/elastic/sampler.h"
#include "libmalle/elastic/state_pack.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn
namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace malle::elastic {

struct ElasticTrainerOptions {
  int logical_workers = 0;  // L >= 1, required; the job never has more ranks than this
  uint64_t seed = 0;        // data order and every logical worker's RNG stream
  // Bitwise-reproducible updates whatever the schedule (L x gradient memory and
  // traffic; needs the same intra-op thread count on every rank).
  bool deterministic = false;
  int64_t bucket_bytes = 25 << 20;  // gradient bucket size (not deterministic mode)
  // Not deterministic mode: reduce gradients during the last micro-batch's
  // backward with LibTorch's DDP engine (c10d::Reducer and an elastic comm
  // hook; grad_reducer.h), overlapping communication with backward. False:
  // pack and reduce flat buckets after the backward (no overlap). Every
  // trained parameter must then get a gradient in each step's last
  // micro-batch, as with DDP.
  bool use_reducer = true;
  // Data: N samples, B per logical worker per step, and how long to train:
  // exactly one of `steps` (> 0) and `epochs` (> 0; whole steps that fit).
  int64_t num_samples = 0;
  int64_t batch_size = 0;
  int64_t steps = 0;
  double epochs = 0;
  bool shuffle = true;
  // Rank 0 writes the number of committed steps to "malle/job/<id>/progress"
  // (ProgressKey) after each commit; the local launcher's step triggers read it.
  bool publish_progress = true;
  // State sync: tensors sharing a storage are sent from it, without a copy,
  // when they reference at least this many bytes of it (state_pack.h). The
  // trainer keeps parameters, buffers and optimizer state in one buffer per
  // dtype, so a model with Adam is two or three messages.
  int64_t state_direct_min_bytes = kDirectMinBytes;

  absl::Status Validate() const;  // kInvalidArgument naming the field
};

// The tensors that make up the model: parameters (trained; gradients reduced)
// and buffers (e.g. BatchNorm statistics: after each step every rank takes
// logical worker 0's). Names are compared with the state source's at a sync.
struct ModelState {
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  std::vector<std::pair<std::string, at::Tensor>> buffers;

  // Named "p<i>" / "b<i>".
  static ModelState FromTensors(std::vector<at::Tensor> parameters, std::vector<at::Tensor> buffers = {});
  // named_parameters() / named_buffers(), recursively.
  static ModelState FromModule(torch::nn::Module& module);
};

// User state joiners receive with the model (an LR schedule, counters, ...).
struct ExtraState {
  std::vector<at::Tensor> tensors;
  std::string bytes;
};

// A logical worker's random streams at a step: the model stream (dropout,
// anything drawn between BeginMicroBatch and EndMicroBatch) and the data stream
// (augmentation of its micro-batch, wherever that is fetched: a loader thread
// seeds its own generator with it). The same numbers as the Python API's.
inline constexpr int64_t kDataStream = 0x64617461;  // "data"

struct WorkerPlan {
  int worker = 0;                // logical worker id
  uint64_t rng_seed = 0;         // MixSeed(seed, step, worker); BeginMicroBatch seeds with it
  uint64_t data_seed = 0;        // MixSeed(seed, step, worker, kDataStream)
  std::vector<int64_t> indices;  // its B dataset indices at this step
};

struct StepPlan {
  int64_t step = 0;
  int64_t generation = 0;
  int rank = 0;
  int size = 0;
  std::vector<WorkerPlan> workers;  // this rank's share, in worker order
};

// One membership change as this rank saw it (Python's ResizeEvent).
struct ResizeEvent {
  comm::Transition::Kind kind = comm::Transition::Kind::kNone;
  int64_t generation = 0;
  int size = 0;
  int rank = 0;
  int64_t resume_step = 0;
  std::vector<std::string> joined;
  std::vector<std::string> removed;
  int64_t state_bytes = 0;  // job state received or sent (0: no transfer needed)
  int64_t state_in_place = 0;  // of which received straight into this rank's own tensors
  int64_t state_landed = 0;    // of which received into memory faulted in while warming up
  struct Phases {
    absl::Duration detect, wait, agree, build, sync;  // from the membership protocol
    absl::Duration state;                       // state transfer
    absl::Duration total;
  } phases;
  std::string reason;
};

// "malle/job/<id>/progress".
std::string ProgressKey(absl::string_view job_id);
// "malle/job/<id>/state_layout": rank 0 publishes the segments of its state
// there (state_pack.h's EncodeLayout) when they change, i.e. once the
// optimizer's state exists; a trainer created afterwards (a joiner) faults in
// memory for the segments it cannot receive in place (LandingBuffers) before
// it joins, so that its first state sync does not wait on page faults.
std::string StateLayoutKey(absl::string_view job_id);

class ElasticTrainer {
 public:
  // Joins later, at the first NextStep(). `group_options.max_size` is capped
  // at L. The model's tensors and the optimizer must outlive the trainer.
  // Reads StateLayoutKey and zero-fills the memory the first state sync will
  // land in (the job's optimizer state: tens of ms per 100 MB; blocks).
  // Errors: kInvalidArgument (options; bootstrap_size > L; an optimizer
  // parameter that is not in the model), kUnimplemented (an optimizer whose
  // state cannot be synced).
  static absl::StatusOr<std::unique_ptr<ElasticTrainer>> Create(std::shared_ptr<comm::ControlStore> store,
                                                                comm::ElasticGroupOptions group_options,
                                                                ElasticTrainerOptions options, ModelState model,
                                                                torch::optim::Optimizer& optimizer);
  // Over a group that has already joined (its join transition is handled at
  // the first NextStep()).
  static absl::StatusOr<std::unique_ptr<ElasticTrainer>> Create(std::unique_ptr<comm::ElasticGroup> group,
                                                                ElasticTrainerOptions options, ModelState model,
                                                                torch::optim::Optimizer& optimizer);
  ~ElasticTrainer();

  // Adds user state to what joiners receive. `save` runs on the state source,
  // `load` on receivers. It is job state like the model's: `save` also runs
  // when a step starts and `load` puts that back if the step does not commit
  // (a failure), so a schedule stepped after FinishStep() whatever it
  // returned is not stepped twice. Call before the first NextStep(), in the
  // same order on every rank. Errors: kInvalidArgument (empty or duplicate name).
  absl::Status Track(std::string name, std::function<ExtraState()> save,
                     std::function<absl::Status(const ExtraState&)> load);

  // The step boundary, then this rank's plan for the next step (gradients
  // zeroed); nullopt when training is done or this member left (left()).
  // Blocks for the boundary's collective and, on a change, the state sync.
  // Errors: kFailedPrecondition (the previous step was not finished),
  // kInvalidArgument ("model mismatch: ..." / "job mismatch: ..." from a
  // state sync), kAborted (this member was declared failed and must start
  // again as a new member), the group's errors (store unreachable: kUnavailable
  // / kDeadlineExceeded; Join's errors on the first call).
  absl::StatusOr<std::optional<StepPlan>> NextStep();

  // Before micro-batch `index` of the plan: seeds the default CPU generator
  // with the worker's seed (rng_seed) and restores the buffers to their
  // start-of-step values. A batch fetched after it, on this thread, draws from
  // the model stream; one fetched elsewhere should use data_seed. Does not
  // block. MALLE_CHECK: index in range, in order.
  void BeginMicroBatch(size_t index);
  // After its backward. Deterministic mode moves the gradients into the
  // worker's row; with use_reducer the last micro-batch's backward has
  // reduced the gradients and this collects the outcome. Errors:
  // kFailedPrecondition (no matching BeginMicroBatch; with use_reducer, a
  // last backward that did not reach every trained parameter).
  absl::Status EndMicroBatch();

  // After the last micro-batch: reduces gradients over the current generation
  // (divided by L; with use_reducer that already happened during the last
  // backward), syncs buffers, and if all of it succeeded steps the
  // optimizer and commits the step: returns true. Returns false when the
  // synchronisation failed (a peer died or hung): the optimizer did not step
  // and the step is redone after the next NextStep()'s recovery.
  // Before the optimizer steps it starts the next boundary's vote
  // (ElasticGroup::BeginStepBoundary), which completes meanwhile.
  // Blocks for the collectives. Errors: kFailedPrecondition (not every
  // micro-batch of the plan ran), kUnavailable / kDeadlineExceeded (rank 0's
  // look at the control store for change requests).
  absl::StatusOr<bool> FinishStep();

  // Asks to leave at the next step boundary (NextStep then returns nullopt).
  // Errors: kFailedPrecondition before joining; the store's errors.
  absl::Status RequestLeave();

  // FNV-1a 64 (hex) of parameters, buffers and optimizer state: equal on every
  // replica after a commit. Errors: kUnimplemented (unsupported optimizer).
  absl::StatusOr<std::string> StateDigest() const;
  // The job state as one PackedState (what a state sync sends).
  absl::StatusOr<PackedState> PackJobState() const;
  // Loads a PackedState (all-or-nothing). Errors: kInvalidArgument on any mismatch.
  absl::Status LoadJobState(PackedState state);

  int rank() const;      // -1 before joining
  int size() const;      // 0 before joining
  int64_t generation() const;
  int64_t step() const { return step_; }  // the step being run, or next to run
  int64_t total_steps() const { return total_steps_; }
  bool left() const { return left_; }
  // Steps this rank started again: a failed attempt redone (or a step whose result
  // was lost). Counted when NextStep returns the plan of such a step.
  int64_t redone_steps() const { return redone_steps_; }
  const std::vector<int>& workers() const { return workers_; }
  const std::vector<ResizeEvent>& history() const { return history_; }
  const std::string& member_id() const;
  ElasticSampler& sampler() { return sampler_; }
  comm::ElasticGroup* group() { return group_.get(); }

 private:
  ElasticTrainer(ElasticTrainerOptions options, ModelState model, torch::optim::Optimizer& optimizer,
                 ElasticSampler sampler);
  static absl::StatusOr<std::unique_ptr<ElasticTrainer>> CreateCommon(ElasticTrainerOptions options,
                                                                      ModelState model,
                                                                      torch::optim::Optimizer& optimizer);
  absl::Status EnsureJoined();
  absl::StatusOr<bool> Boundary();
  absl::Status OnChange(const comm::Transition& t, absl::Time start);
  // `in_place`: this rank holds no committed state (a joiner); it may receive
  // into its own tensors (`*in_place_bytes`).
  absl::Status SyncState(int source, const std::vector<int>& receivers, bool in_place, int64_t* bytes,
                         int64_t* in_place_bytes, int64_t* landed_bytes);
  // StateLayoutKey: a joiner's landing_ before it joins; rank 0 publishing.
  // Both only save time; failures are logged.
  void PrepareLanding();
  void PublishLayout();
  // Moves the optimizer's state tensors into one buffer per dtype (after its
  // first step creates them), so a state sync sends them without packing.
  absl::Status FlattenOptimizerState();
  bool ReduceBuckets();
  bool ReduceRows();
  bool SyncBuffers();
  std::vector<at::Tensor> TrainedParams() const;
  void MarkFailed(const absl::Status& why);
  // Before a step boundary: undoes what an attempt that did not commit changed
  // (buffers, tracked extras, the optimizer's options), so the redo, or a
  // state sync from this rank, starts from the committed state.
  void RollBackFailedStep();
  void ZeroGrads();

  ElasticTrainerOptions options_;
  ModelState model_;
  torch::optim::Optimizer& optimizer_;
  ElasticSampler sampler_;
  int64_t total_steps_ = 0;

  std::shared_ptr<comm::ControlStore> store_;  // deferred join; progress key
  comm::ElasticGroupOptions group_options_;
  std::unique_ptr<comm::ElasticGroup> group_;
  std::optional<comm::Transition> pending_;  // the join's transition

  struct Extra {
    std::string name;
    std::function<ExtraState()> save;
    std::function<absl::Status(const ExtraState&)> load;
  };
  std::vector<Extra> extras_;

  int64_t step_ = 0;
  std::vector<int> workers_;
  bool in_step_ = false;   // NextStep returned a plan that FinishStep has not closed
  size_t begun_ = 0;       // micro-batches begun in this step
  size_t ended_ = 0;       // micro-batches ended
  bool failed_ = false;    // this step's synchronisation failed
  bool finished_ = false;  // the final boundary ran
  bool left_ = false;
  int64_t redone_steps_ = 0;
  int64_t max_started_ = -1;         // the highest step this rank started
  bool attempt_ = false;             // a step started and not committed yet
  std::vector<ExtraState> extras0_;  // tracked extras at the start of that attempt
  std::vector<std::vector<double>> optimizer_options0_;  // the optimizer's options then
  size_t optimizer_state_count_ = 0;  // optimizer_.state().size() when last flattened
  std::vector<at::Tensor> landing_;   // receive memory for the first state sync
  std::string published_layout_;      // rank 0: what it last wrote to StateLayoutKey
  std::vector<ResizeEvent> history_;

  std::unique_ptr<GradReducer> reducer_;  // use_reducer and not deterministic
  absl::Status arm_error_;                // GradReducer::Arm's, reported by EndMicroBatch
  at::Tensor rows_;                      // deterministic mode: [L, P]
  std::vector<at::Tensor> buffers0_;     // buffers at the start of the step
  std::vector<at::Tensor> buffers_w0_;   // buffers after logical worker 0's micro-batch
};

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_ELASTIC_TRAINER_H_
