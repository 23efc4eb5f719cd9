// Engine: the elastic training engine, once, for every API.
//
// Defines Engine and its options. One Engine is one process's membership in
// an elastic data-parallel job and everything that makes the job's result
// independent of how many processes run it: membership generations
// (comm::ElasticGroup), the step boundary (vote, commit, redo of a failed
// step, leave), logical workers and their random streams, the exactly-once
// sampler and its position, the LR factor of a global batch that follows the
// world size, gradient synchronisation (c10d's Reducer with the elastic comm
// hook, or flat buckets, or per-worker rows in deterministic mode), buffer
// sync, rollback of a failed step, the job state (JobState) and its transfer
// to joiners, the profiling advisor's samples and reports, the progress key.
//
// Language adapters are thin: the Python API (python/malletrain/elastic.py)
// and the LibTorch convenience ElasticTrainer (elastic_trainer.h) wrap their
// model and optimizer, feed micro-batches, and run the optimizer's update.
// What only they understand enters the job state as *parts* (AddPart): a
// torch.optim state_dict's pickled skeleton, a torch::optim record.
//
//   MALLE_ASSIGN_OR_RETURN(auto engine, Engine::Create(store, group_options, options));
//   MALLE_RETURN_IF_ERROR(engine->SetModel(params, buffers));
//   MALLE_RETURN_IF_ERROR(engine->AddPart({"optimizer", save, load, false}));
//   MALLE_RETURN_IF_ERROR(engine->SetData(data));
//   engine->PrepareLanding();                       // a joiner faults in its receive memory
//   for (;;) {
//     MALLE_ASSIGN_OR_RETURN(std::optional<StepPlan> plan, engine->NextStep());
//     if (!plan) break;                               // done, or this member left
//     for (size_t i = 0; i < plan->workers.size(); ++i) {
//       engine->BeginMicroBatch(i);                   // RNG, buffers; the last one arms the reduction
//       Loss(Batch(plan->workers[i].indices)).backward();
//       MALLE_RETURN_IF_ERROR(engine->EndMicroBatch());
//     }
//     MALLE_ASSIGN_OR_RETURN(bool ok, engine->Synchronize());  // gradients and buffers
//     if (ok) { optimizer.step(); MALLE_RETURN_IF_ERROR(engine->Commit()); }
//   }
//
// A step that does not commit (a peer died or hung while it synchronised)
// leaves no trace: the optimizer did not step, and before the next boundary
// the buffers and every part's checkpoint (PartSpec) return to what they were
// when the attempt started; the step then runs again (redone_steps counts it).
//
// Thread-safety: one thread (the training loop) calls every member function
// except the accessors marked otherwise. The engine runs the ElasticGroup's
// watchdog thread, the comm hook's waiter thread and, with a report sink, a
// reporter thread (docs/threading.md).
#ifndef MALLE_ELASTIC_ENGINE_H_
#define MALLE_ELASTIC_ENGINE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libmalle/advisor/report_sink.h"
#include "libmalle/advisor/step_sample.h"
#include "libmalle/cluster/rank_env.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/comm/elastic_group.h"
#include "libmalle/elastic/grad_reducer.h"
#include "libmalle/elastic/job_state.h"
#include "libmalle/elastic/park_store.h"
#include "libmalle/elastic/sampler.h"

namespace malle::advisor {
class Advisor;
}  // namespace malle::advisor

namespace malle::elastic {

class GradReducer;

struct EngineOptions {
  // L >= 1 logical workers: a constant global batch of L x B, the same updates
  // whatever the physical size (the job never has more than L ranks). 0: every
  // rank is one worker and the global batch follows the world size; then
  // `lr_scaling` ("linear" or "sqrt") rescales the learning rates at resizes.
  int logical_workers = 0;
  std::string lr_scaling;
  uint64_t seed = 0;  // data order and every logical worker's random streams
  // Bitwise-reproducible updates whatever the schedule (L x gradient memory
  // and traffic; needs the same intra-op thread count on every rank).
  bool deterministic = false;
  int64_t bucket_bytes = 25 << 20;  // gradient bucket size
  // The first bucket launched (the last layers' gradients): small, so that
  // communication starts early in the backward (DDP's 1 MiB).
  int64_t first_bucket_bytes = GradReducer::kDefaultFirstBucketBytes;
  // What reduces a CUDA model's gradients: "gloo" (through host memory; works
  // with several ranks on one GPU) or "nccl" (one GPU per rank; the program
  // must call comm::RegisterNcclBackend()). CPU tensors always go through Gloo.
  std::string backend = "gloo";
  // Not deterministic: reduce during the last micro-batch's backward with
  // c10d's Reducer and the elastic comm hook (overlaps communication with
  // backward). False: pack and reduce flat buckets after the backward.
  bool use_reducer = true;
  // Rank 0 writes the committed step count to ProgressKey after each commit.
  bool publish_progress = true;
  // State transfer: tensors sharing a storage are sent from it as they are
  // when they reference at least this many bytes of it (state_pack.h).
  int64_t state_direct_min_bytes = kDirectMinBytes;
  // Profiling advisor: on (one sample per committed step), its job name and
  // node range (0: up to L, or 8).
  bool advisor = true;
  std::string advisor_job;
  int min_nodes = 1;
  int max_nodes = 0;
  // Ranks each node runs (its agent's slots, LOCAL_WORLD_SIZE), [1, 1024]: the
  // advisor learns in nodes (ceil(world size / ranks_per_node)), the unit the
  // allocator allocates, so that its curves and probes stay in nodes.
  int ranks_per_node = 1;
  // Rank 0 sends the advisor's report there every `report_interval` (on a
  // thread of its own) and the job's completion at the end.
  std::shared_ptr<advisor::ReportSink> report_sink;
  absl::Duration report_interval = absl::Seconds(5);
  // Parking (park_store.h): where the job's state goes when its last member is
  // asked to leave (its node reclaimed, the allocator stopping the job, a
  // SIGTERM turned into a leave), where snapshots are kept, and what a new
  // incarnation resumes from at its bootstrap. Null: none (a job that loses
  // every node then starts over).
  std::shared_ptr<ParkStore> park_store;
  // Asynchronous snapshots to the park store, for the unplanned case (every
  // rank gone at once): rank 0 copies the state at a step boundary and a
  // background thread writes it, so a step pays at most the copy. Every
  // `snapshot_every` steps (if the previous write is still going on then,
  // the step waits for it); 0: adaptive, so that the copy and the write stay
  // under `snapshot_budget` of the step time (a snapshot due while the previous one
  // is being written is taken at a later step); < 0: none. The first is an
  // interval after the job started or resumed.
  int snapshot_every = 0;
  double snapshot_budget = 0.01;
  // A state file to start from at the bootstrap (a user checkpoint, see
  // Save()), instead of the park store's newest state; verified with `secret`
  // (the deployment secret; empty: unsigned files only).
  std::string resume_from;
  std::string secret;
  // Tests only: the member with this id exits (137) in the middle of
  // receiving a state, like a kill -9 (MALLE_FAULT_EXIT_IN_STATE_SYNC).
  std::string fault_exit_in_state_sync;

  // kInvalidArgument naming the field.
  absl::Status Validate() const;
};

// How long a job trains and on what: N samples, B per logical worker (per
// rank in follow mode) per step, exactly one of `steps` (>= 0) and `epochs`
// (> 0; constant global batch only). With epochs, `drop_last` trains the
// whole steps that fit; false adds one more step when a tail is left, which
// takes the rest of its global batch from the next epoch's order (as
// DistributedSampler pads).
struct DataOptions {
  int64_t num_samples = 0;
  int64_t batch_size = 0;
  std::optional<int64_t> steps;
  std::optional<double> epochs;
  bool shuffle = true;
  bool drop_last = true;
};

// A part of the job state that only the adapter understands.
struct PartSpec {
  std::string name;
  // Its current state: the tensors themselves (not copies: the engine keeps
  // them in flat buffers by moving their storage). Runs on the training thread.
  std::function<absl::StatusOr<PartState>()> save;
  // Takes a state: tensors are views of received segments (keep them: no copy).
  // Should check before it changes anything ("optimizer mismatch: ...").
  std::function<absl::Status(PartState)> load;
  // What a step that does not commit must undo. The engine keeps what
  // `checkpoint` returns when each step starts and gives it to `restore` when
  // the step does not commit. An optimizer's state changes only when a step
  // commits, its hyperparameters after any step (a schedule sets the learning
  // rate): it checkpoints those only. A tracked object the user steps after
  // every step: all of it (TrackedPart does that). Unset: nothing to undo.
  std::function<absl::StatusOr<PartState>()> checkpoint;
  std::function<absl::Status(PartState)> restore;
};

// A part whose checkpoint is a copy of its whole state (a tracked object).
PartSpec TrackedPart(std::string name, std::function<absl::StatusOr<PartState>()> save,
                     std::function<absl::Status(PartState)> load);

// A logical worker's random streams at a step: the model stream (dropout, any
// draw between BeginMicroBatch and the backward) and the data stream
// (augmentation while its micro-batch is fetched, wherever that is).
inline constexpr int64_t kDataStream = 0x64617461;  // "data"

struct WorkerPlan {
  int worker = 0;                // logical worker id
  uint64_t rng_seed = 0;         // MixSeed(seed, step, worker): BeginMicroBatch seeds with it
  uint64_t data_seed = 0;        // MixSeed(seed, step, worker, kDataStream)
  std::vector<int64_t> indices;  // its B dataset indices at this step
};

struct StepPlan {
  int64_t step = 0;
  int64_t generation = 0;
  int rank = 0;
  int size = 0;
  std::vector<WorkerPlan> workers;  // this rank's share, in worker order
  // Follow mode: multiply every learning rate by this before the step (a
  // resize changed the world size); 1 otherwise.
  double lr_rescale = 1.0;
};

// The micro-batches a loader fetches for this rank from a plan's step on,
// for as long as that plan's membership lasts (a DataLoader prefetches
// across steps): one WorkerPlan per micro-batch, this rank's workers in
// order, step after step, up to the job's last step. Made by
// Engine::KeysFrom(); holds its own copy of the sampler, so it may be used
// on another thread than the engine's, by one thread at a time.
class BatchKeys {
 public:
  // The next micro-batch (its worker, seeds and indices); nullopt after the
  // last step.
  std::optional<WorkerPlan> Next();
  // Whether `plan`, which starts at stream position `position`, is the step
  // right after the last one the loop was at (the first plan, then each
  // plan this returned true for), with the same workers and size and, in
  // follow mode, the position these keys assumed for it: then the keys
  // already fetched are the right ones, and this moves on to plan.step.
  // False for a redone step, a resize or a restored state: take new keys.
  bool Follows(const StepPlan& plan, int64_t position);

 private:
  friend class Engine;
  BatchKeys(ElasticSampler sampler, uint64_t seed, int logical_workers, const StepPlan& plan, int64_t position,
            int64_t total_steps);
  // The stream position of `step` in follow mode (every step takes size x B).
  int64_t PositionOf(int64_t step) const;

  ElasticSampler sampler_;
  uint64_t seed_;
  int logical_workers_;  // 0: follow mode
  std::vector<int> workers_;
  int size_;
  int64_t first_step_, first_position_, total_steps_;
  int64_t loop_step_;                // the step the loop is at
  int64_t next_step_;                // of the next micro-batch Next() serves
  size_t next_worker_ = 0;           // index into workers_
};

// One membership change as this rank saw it.
struct ResizeEvent {
  comm::Transition::Kind kind = comm::Transition::Kind::kNone;
  int64_t generation = 0;
  int size = 0;
  int rank = 0;
  int64_t resume_step = 0;
  std::vector<std::string> joined;
  std::vector<std::string> removed;
  int64_t state_bytes = 0;     // job state received or sent (0: no transfer needed)
  int64_t state_in_place = 0;  // of which received straight into this rank's own tensors
  int64_t state_landed = 0;    // of which received into memory faulted in while warming up
  // Across node boundaries (the generation's node names; an unknown node is
  // another node): the job state this rank received from a rank on another
  // node, and sent to ranks on other nodes / on its own node (a relay's local
  // copies, state_pack.h PlanNodeTransfer). Summed over the ranks,
  // state_received_remote is what the transfer put on the network.
  int64_t state_received_remote = 0;
  int64_t state_sent_remote = 0;
  int64_t state_sent_local = 0;
  struct Phases {
    absl::Duration detect, wait, agree, build, sync;  // from the membership protocol
    absl::Duration state;                             // state transfer
    absl::Duration total;
  } phases;
  std::string reason;
};

// When the moments of one committed step happened, relative to the moment
// NextStep() returned its plan (`start`); what the advisor's sample is made of.
struct StepTimes {
  absl::Duration data_wait;                     // waiting for data (AddDataWait)
  absl::Duration sync;                          // Synchronize() began
  absl::Duration reduced;                       // gradients and buffers synchronised
  absl::Duration end;                           // committed
  std::optional<absl::Duration> last_hook;      // the last gradient bucket was launched
  std::optional<absl::Duration> since_prev_end;  // start - the previous committed step's end
  absl::Duration boundary;                      // the boundary before it, when it changed nothing
  absl::Duration resize_pause;                  // the boundary before it, when it changed the membership
};

// The timing fields of the advisor's sample (compute, comm, optimizer, total,
// data wait, resize pause) for one step at `size` ranks. Pure. The boundary
// is a collective that waits for the slowest rank: exposed communication at
// size > 1 (the network term models it); at size 1 it stays in the rest.
// What the loop does between two steps belongs to the step's total; a resize
// pause is measured apart.
advisor::StepSample SampleOfStep(const StepTimes& t, int size, bool deterministic);

// The group options a rank started by a launcher or node agent uses (job id,
// member id, bootstrap size; a member id made up when none is given).
comm::ElasticGroupOptions GroupOptionsFor(const cluster::RankEnv& env);

// "malle/job/<id>/progress": the committed step count (ASCII), from rank 0.
std::string ProgressKey(absl::string_view job_id);
// "malle/job/<id>/state_layout": the segments of rank 0's state (EncodeLayout),
// published when they change (once the optimizer's state exists), so that a
// joiner faults in the memory its first state sync lands in while it warms up.
std::string StateLayoutKey(absl::string_view job_id);

class Engine {
 public:
  // Joins later, at the first NextStep() (a joiner builds its model first, so
  // the running members pause only for agreement, group build and state
  // transfer). `group_options.max_size` is capped at L. Errors:
  // kInvalidArgument (options; bootstrap_size > L).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::shared_ptr<comm::ControlStore> store,
                                                        comm::ElasticGroupOptions group_options, EngineOptions options);
  // Over a group that has already joined (its join transition is handled at
  // the first NextStep()). Errors: kInvalidArgument.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<comm::ElasticGroup> group,
                                                        EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The model, once, before the first step: its parameters (those that
  // require a gradient are trained) and buffers (BatchNorm statistics: after
  // each step every rank takes logical worker 0's). They become views of one
  // flat buffer per dtype and device (same TensorImpls; values kept), which a
  // state transfer sends as it is. Errors: kInvalidArgument (no trained
  // parameter, a sparse one, parameters on several devices), kFailedPrecondition
  // (called twice), kInternal (c10d refused the Reducer).
  absl::Status SetModel(std::vector<NamedTensor> parameters, std::vector<NamedTensor> buffers);
  // Adds a part of the job state, before the first step, in the same order on
  // every rank. Errors: kInvalidArgument (empty or duplicate name, no
  // functions), kFailedPrecondition (after the first step).
  absl::Status AddPart(PartSpec part);
  // The data, once. Errors: kInvalidArgument naming the field (N < one global
  // batch, both or neither of steps/epochs, epochs in follow mode).
  absl::Status SetData(const DataOptions& data);
  // Reads the layout the job's leader published and zero-fills the memory the
  // first state sync will land in (a joiner's optimizer state: tens of ms per
  // 100 MB; blocks). Call once the parts exist. Only saves time; failures are
  // logged.
  void PrepareLanding();

  // Joins the job now (NextStep() does it at the first step; call this only to
  // know rank and size earlier). Without a model yet, a CUDA data backend is
  // chosen if a GPU is visible. Blocks for the rendezvous. Errors: the
  // group's (kInvalidArgument for its options, kUnavailable, kDeadlineExceeded).
  absl::Status Join();

  // The step boundary, then this rank's plan for the next step (gradients
  // zeroed); nullopt when training is done or this member left (left()).
  // First undoes an attempt that did not commit. Blocks for the boundary's
  // collective and, on a change, the state transfer. Errors:
  // kFailedPrecondition (the previous step is not finished; no model or
  // data), kInvalidArgument ("model mismatch: ..." / "job mismatch: ..."
  // from a transfer), kAborted (this member was declared failed and must
  // start again as a new member), the group's errors (kUnavailable /
  // kDeadlineExceeded).
  absl::StatusOr<std::optional<StepPlan>> NextStep();

  // Before micro-batch `index` of the plan: seeds torch's generators (CPU and
  // CUDA) with the worker's model stream, puts the buffers back to their
  // start-of-step values, and before the last one arms the gradient
  // reduction. Does not block. MALLE_CHECK: index in range, in order.
  void BeginMicroBatch(size_t index);
  // After its backward. Errors: kFailedPrecondition (no matching
  // BeginMicroBatch; with the Reducer, a last backward that did not reach
  // every trained parameter).
  absl::Status EndMicroBatch();
  // Seconds this step waited for its data (the advisor's data-wait term).
  void AddDataWait(absl::Duration wait);

  // After the last micro-batch: reduces the gradients over the generation
  // (divided by L), syncs the buffers, and starts the next boundary's vote.
  // True: the caller runs its optimizer's update, then Commit(). False: the
  // synchronisation failed (a peer died or hung); gradients are cleared and
  // the step runs again after the next NextStep()'s recovery. Blocks for the
  // collectives. Errors: kFailedPrecondition (not every micro-batch ran).
  absl::StatusOr<bool> Synchronize();
  // After the optimizer's update of a synchronised step: commits it. Errors:
  // kFailedPrecondition (no synchronised step).
  absl::Status Commit();

  // Asks to leave at the next step boundary (NextStep then returns nullopt).
  // Errors: kFailedPrecondition before joining; the store's errors.
  absl::Status RequestLeave();
  // A last boundary, so that no member exits while the others still need it,
  // then marks this member done with the job (closing does not fail the
  // generation for the others). Blocks. Errors are logged, not returned.
  void Finish();
  // Leaves the group now (the others recover at once if it was still a
  // member), stops the reporter thread.
  void Close();

  // Writes the job state as it is now (at a step boundary: between steps) to
  // `path` in the park store's file format (park_store.h), signed with
  // options().secret: a user's own checkpoint; resume_from reads it. Blocks
  // for the I/O. Errors: kFailedPrecondition (inside a step), WriteStateFile's.
  absl::Status Save(const std::string& path);

  // The job state as it is now: tensors referenced, not copied.
  // Errors: a part's save().
  absl::StatusOr<JobState> CaptureState() const;
  // Makes this rank's state `state` (all or nothing as far as the parts'
  // loads allow: everything is checked first). Errors: kInvalidArgument
  // (mismatch), a part's load().
  absl::Status RestoreState(JobState state);
  // JobState::Digest of CaptureState(): equal on every replica after a commit.
  absl::StatusOr<std::string> StateDigest() const;

  // Turns the advisor's per-step sample on or off from the next commit (the
  // advisor overhead benchmark alternates it); the time spent taking samples.
  void SetAdvisorEnabled(bool on) { options_.advisor = on; }
  absl::Duration advisor_time() const { return advisor_time_; }

  // The advisor's report (advisor/report_json.h) and as a table; empty
  // before the first committed step. Blocks for a fit. Any thread.
  std::string ReportJson() const;
  std::string ReportTable() const;

  int rank() const;   // -1 before joining
  int size() const;   // 0 before joining
  int64_t generation() const;
  const std::string& member_id() const;
  const std::string& job_id() const;
  int64_t step() const { return step_; }  // the step being run, or next to run
  int64_t total_steps() const { return total_steps_; }
  int micro_batch() const { return static_cast<int>(begun_) - 1; }
  bool left() const { return left_; }
  // This member was the job's last, was asked to leave, and parked the job's
  // state (left() is true too).
  bool parked() const { return parked_; }
  // Where the state this job resumed from came from ('' : it started afresh).
  const std::string& resumed_from() const { return resumed_from_; }
  // Snapshots: the step of the newest one written (-1: none yet), the current
  // interval in steps, what the last copy cost the training thread, how long
  // the last write took (wall time, at the writer's nice 19) and the CPU it
  // took on all its threads, which the adaptive interval prices (zero: none
  // done yet).
  int64_t snapshot_step() const;
  int snapshot_interval() const { return snapshot_interval_; }
  absl::Duration snapshot_copy_time() const { return snapshot_copy_; }
  absl::Duration snapshot_write_time() const;
  absl::Duration snapshot_write_cpu_time() const;
  bool in_step() const { return in_step_; }
  // This member was declared failed by the others (NextStep returned kAborted).
  bool excluded() const { return excluded_; }
  int64_t position() const { return position_; }  // follow mode: stream position of step()
  // Receive memory faulted in by PrepareLanding() and not used yet, in bytes.
  int64_t landing_bytes() const;
  // Steps this rank started again: a failed attempt redone, or a step whose
  // result was lost.
  int64_t redone_steps() const { return redone_steps_; }
  const std::vector<int>& workers() const { return workers_; }
  const std::vector<ResizeEvent>& history() const { return history_; }
  const EngineOptions& options() const { return options_; }
  const std::optional<ElasticSampler>& sampler() const { return sampler_; }
  // This rank's micro-batches from `plan` on (BatchKeys). Errors:
  // kFailedPrecondition (no data yet).
  absl::StatusOr<BatchKeys> KeysFrom(const StepPlan& plan) const;
  // Logical worker `worker`'s data seed at `step` (WorkerPlan::data_seed),
  // for loaders that read every worker's samples (a stream).
  uint64_t DataSeed(int64_t step, int worker) const;
  double lr_factor() const { return lr_factor_; }
  comm::ElasticGroup* group() { return group_.get(); }

 private:
  Engine(EngineOptions options);
  absl::Status EnsureJoined();
  absl::StatusOr<bool> Boundary();
  absl::Status OnChange(const comm::Transition& t);
  absl::Status SyncState(int source, const std::vector<int>& receivers, const std::vector<std::string>& nodes,
                         bool in_place, ResizeEvent* ev);
  void RollBackFailedStep();
  // At the bootstrap, on the state source: the state to resume from
  // (resume_from, else the park store's newest), restored. Nothing if none.
  absl::Status ResumeFromStore();
  // The last member, asked to leave: writes the state to the park store.
  absl::Status Park();
  void MaybeSnapshot();
  void UpdateSnapshotInterval();  // adaptive snapshots: from the last copy and write
  void StopSnapshots();
  void PublishLayout();
  // Moves the parts' tensors into one buffer per dtype and device when their
  // number changed (or always: `force`); true if anything moved.
  absl::StatusOr<bool> FlattenParts(bool force);
  bool ReduceBuckets();
  bool ReduceRows();
  bool SyncBuffers();
  std::vector<at::Tensor> TrainedParams() const;
  void MarkFailed(const absl::Status& why);
  void ZeroGrads();
  void RecordStep();
  void Complete();
  void StartReporter();
  void StopReporter();

  EngineOptions options_;
  std::optional<ElasticSampler> sampler_;
  int64_t total_steps_ = 0;
  int64_t batch_size_ = 0;

  std::shared_ptr<comm::ControlStore> store_;  // deferred join; progress and layout keys
  comm::ElasticGroupOptions group_options_;
  std::unique_ptr<comm::ElasticGroup> group_;
  std::optional<comm::Transition> pending_;  // the join's transition

  bool model_set_ = false;
  std::vector<NamedTensor> parameters_;
  std::vector<NamedTensor> buffers_;
  struct Part {
    PartSpec spec;
    size_t tensors = 0;  // tensors when last flattened
  };
  std::vector<Part> parts_;

  int64_t step_ = 0;
  int64_t position_ = 0;    // follow mode: stream position at the start of step_
  double lr_factor_ = 0;    // follow mode: f(size) the learning rates are scaled for
  std::vector<int> workers_;
  bool started_ = false;    // the first NextStep ran
  bool in_step_ = false;    // NextStep returned a plan that is not synchronised
  bool synchronized_ = false;  // Synchronize() returned true; Commit() pending
  size_t begun_ = 0;
  size_t ended_ = 0;
  bool failed_ = false;
  bool finished_ = false;
  bool left_ = false;
  bool parked_ = false;
  bool park_requested_ = false;
  std::string resumed_from_;
  bool excluded_ = false;
  bool completed_ = false;
  bool closed_ = false;
  int last_rank_ = -1;           // rank(), size(), generation() after Close()
  int last_size_ = 0;
  int64_t last_generation_ = -1;
  int64_t redone_steps_ = 0;
  int64_t max_started_ = -1;
  bool attempt_ = false;                 // a step started and not committed yet
  std::vector<std::optional<PartState>> parts0_;  // the parts' checkpoints at its start
  std::vector<at::Tensor> landing_;
  std::string published_layout_;
  std::vector<ResizeEvent> history_;

  std::unique_ptr<GradReducer> reducer_;
  absl::Status arm_error_;
  at::Tensor rows_;                      // deterministic mode: [L, P]
  std::vector<at::Tensor> buffers0_;     // buffers at the start of the step
  std::vector<at::Tensor> buffers_w0_;   // after logical worker 0's micro-batch

  // Advisor: one sample per committed step.
  using Clock = std::chrono::steady_clock;
  struct Profile {
    int64_t steps_in_process = 0;
    std::optional<Clock::time_point> prev_end;  // when the last committed step ended
    Clock::time_point start;                    // the plan was returned
    Clock::time_point t_sync;                   // Synchronize() began
    Clock::time_point t_reduced;                // gradients and buffers synchronised
    std::optional<Clock::time_point> last_hook; // the last gradient bucket was launched
    absl::Duration data_wait;
    absl::Duration resize_pause;
    absl::Duration boundary;                    // the boundary before the step, when it changed nothing
    bool after_resize = false;
    bool after_failure = false;
  } profile_;
  std::shared_ptr<advisor::Advisor> advisor_;
  absl::Duration advisor_time_;
  struct Reporter;
  std::unique_ptr<Reporter> reporter_;

  // Snapshots (rank 0): one write in flight at most, on its own thread.
  struct Snapshotter;
  std::unique_ptr<Snapshotter> snapshotter_;
  int snapshot_interval_ = 0;   // steps; 0 until the first copy was timed
  std::vector<at::Tensor> snapshot_staging_;  // copies of direct segments, reused
  int64_t last_snapshot_try_ = -1;  // the step of the last snapshot handed over
  absl::Duration snapshot_copy_;
  absl::Duration step_time_;    // an average of committed steps' wall time
  std::optional<Clock::time_point> last_commit_;
};

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_ENGINE_H_
