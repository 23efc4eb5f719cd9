#include "libmalle/elastic/engine.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "libmalle/advisor/advisor.h"
#include "libmalle/advisor/report_json.h"
#include "libmalle/base/check.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/comm/backend.h"
#include "libmalle/elastic/grad_reducer.h"

namespace malle::elastic {
namespace {

using comm::Transition;

// The ranks that need the job state from t.state_source_rank: every other rank
// at a bootstrap; otherwise the joiners and the ranks whose committed step
// differs from the source's. The same on every rank (it only reads the
// transition, which every member of the generation shares).
std::vector<int> StateReceivers(const Transition& t) {
  std::vector<int> out;
  const int source = t.state_source_rank;
  if (source < 0) return out;
  std::set<std::string> joined(t.joined.begin(), t.joined.end());
  for (int r = 0; r < t.size; ++r) {
    if (r == source) continue;
    if (t.kind == Transition::Kind::kBootstrap || joined.count(t.members[r]) ||
        t.committed_by_rank[r] != t.committed_by_rank[source]) {
      out.push_back(r);
    }
  }
  return out;
}

std::pair<int, int> DeviceKey(const at::Tensor& t) {
  return {static_cast<int>(t.device().type()), t.device().index()};
}

double ScaleOf(const std::string& rule, int size) {
  return rule == "sqrt" ? std::sqrt(static_cast<double>(size)) : static_cast<double>(size);
}

}  // namespace

PartSpec TrackedPart(std::string name, std::function<absl::StatusOr<PartState>()> save,
                     std::function<absl::Status(PartState)> load) {
  PartSpec p;
  p.name = std::move(name);
  p.checkpoint = [save]() -> absl::StatusOr<PartState> {
    MALLE_ASSIGN_OR_RETURN(PartState s, save());
    // A copy, not the live tensors (which the step may change in place).
    for (at::Tensor& t : s.tensors) t = t.defined() ? t.detach().clone() : t;
    return s;
  };
  p.restore = load;
  p.save = std::move(save);
  p.load = std::move(load);
  return p;
}

advisor::StepSample SampleOfStep(const StepTimes& t, int size, bool deterministic) {
  auto pos = [](absl::Duration d) { return std::max(absl::ZeroDuration(), d); };
  advisor::StepSample s;
  s.world_size = size;
  absl::Duration comm = absl::ZeroDuration();
  if (deterministic) {
    comm = pos(t.reduced - t.sync);  // the rows' allreduce, after the backward
  } else if (t.last_hook) {
    comm = pos(t.sync - *t.last_hook);  // the backward waited this long for the buckets
  }
  absl::Duration total = pos(t.end);
  total += t.since_prev_end ? pos(*t.since_prev_end - t.resize_pause) : t.boundary;
  s.data_wait = t.data_wait;
  s.compute = pos(t.sync - t.data_wait - comm);
  s.comm = size > 1 ? comm + t.boundary : comm;
  s.optimizer = pos(t.end - t.reduced);
  s.resize_pause = t.resize_pause;
  s.total = total;
  return s;
}

comm::ElasticGroupOptions GroupOptionsFor(const cluster::RankEnv& env) {
  comm::ElasticGroupOptions o;
  o.job_id = env.job_id;
  o.member_id = env.member_id.empty() ? cluster::GeneratedMemberId() : env.member_id;
  o.bootstrap_size = env.bootstrap_size;
  o.node = env.node;
  return o;
}

std::string ProgressKey(absl::string_view job_id) { return absl::StrCat(comm::JobPrefix(job_id), "progress"); }
std::string StateLayoutKey(absl::string_view job_id) {
  return absl::StrCat(comm::JobPrefix(job_id), "state_layout");
}

absl::Status EngineOptions::Validate() const {
  if (logical_workers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("logical_workers: must be a positive integer (or 0: none), got ", logical_workers));
  }
  if (logical_workers > 0 && !lr_scaling.empty()) {
    return absl::InvalidArgumentError(
        "lr_scaling: only without logical workers (a global batch that follows the world size); with "
        "logical workers the global batch is constant");
  }
  if (logical_workers == 0 && lr_scaling != "linear" && lr_scaling != "sqrt") {
    return absl::InvalidArgumentError(absl::StrCat(
        "lr_scaling: must be 'linear' or 'sqrt' when there are no logical workers, got '", lr_scaling, "'"));
  }
  if (deterministic && logical_workers == 0) {
    return absl::InvalidArgumentError("deterministic: needs logical_workers (a constant global batch)");
  }
  if (bucket_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("bucket_bytes: must be positive, got ", bucket_bytes));
  }
  if (first_bucket_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("first_bucket_bytes: must be positive, got ", first_bucket_bytes));
  }
  if (state_direct_min_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("state_direct_min_bytes: must be >= 0, got ", state_direct_min_bytes));
  }
  if (min_nodes < 1 || max_nodes < 0 || (max_nodes > 0 && max_nodes < min_nodes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_nodes/max_nodes: need 1 <= min_nodes <= max_nodes (0: default), got ", min_nodes, "/",
                     max_nodes));
  }
  if (ranks_per_node < 1 || ranks_per_node > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks_per_node: must be in [1, 1024] (the node's slots), got ", ranks_per_node));
  }
  if (backend != "gloo" && backend != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat("backend: must be 'gloo' or 'nccl', got '", backend, "'"));
  }
  if (!(snapshot_budget > 0.0 && snapshot_budget < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("snapshot_budget: must be in (0, 1), got ", snapshot_budget));
  }
  if (!resume_from.empty() && ::access(resume_from.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("resume_from: cannot read '", resume_from, "'"));
  }
  if (!(report_interval > absl::ZeroDuration())) {
    return absl::InvalidArgumentError("report_interval: must be positive");
  }
  return absl::OkStatus();
}

// Sends rank 0's advisor report to the sink every interval, off the training
// thread (fitting never delays a step).
struct Engine::Reporter {
  absl::Mutex mu;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::thread thread;
};

// Writes the snapshots rank 0 copied, one at a time, off the training thread,
// at the lowest CPU priority (nice 19): where the cores are busy with
// training, training goes first, and the write takes only CPU nobody else
// wants (its wall time then grows, which costs nothing but the snapshot's
// age). A park cancels a write in flight (it writes a newer state).
struct Engine::Snapshotter {
  static constexpr int kNice = 19;
  absl::Mutex mu;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::optional<std::pair<PackedState, int64_t>> job ABSL_GUARDED_BY(mu);  // the state and its step
  bool busy ABSL_GUARDED_BY(mu) = false;
  int64_t written_step ABSL_GUARDED_BY(mu) = -1;
  absl::Duration last_write ABSL_GUARDED_BY(mu);      // the newest write's wall time
  absl::Duration last_write_cpu ABSL_GUARDED_BY(mu);  // and the CPU it took, all its threads
  std::atomic<bool> cancel{false};
  std::thread thread;

  Snapshotter(std::shared_ptr<ParkStore> store, std::shared_ptr<advisor::ReportSink> sink) {
    thread = std::thread([this, store, sink] {
      // Per thread on Linux; the write's own threads inherit it. Advisory.
      if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), kNice) != 0) {
        MALLE_LOG(DEBUG) << "snapshot writer: cannot lower its priority: " << std::strerror(errno);
      }
      for (;;) {
        std::pair<PackedState, int64_t> next;
        {
          absl::MutexLock lock(&mu);
          auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stop || job.has_value(); };
          mu.Await(absl::Condition(&ready));
          if (!job.has_value()) return;  // stopping, nothing left to write
          next = *std::move(job);
          job.reset();
          busy = true;
        }
        const absl::Time w0 = absl::Now();
        // The hash on this thread: a second hashing thread would shorten
        // the write but take a core from training (2-core machines).
        StateIoOptions io;
        io.helper_threads = 0;
        io.cancel = &cancel;
        double cpu = 0;
        io.cpu_seconds = &cpu;
        absl::Status s = store->Write(next.first, next.second, io);
        const absl::Duration took = absl::Now() - w0;
        if (s.ok() && sink != nullptr) {
          // The allocator shows the snapshot's age (advisory: a lost report loses nothing).
          absl::Status r = sink->SendSnapshot(next.second, next.first.bytes(), absl::ToDoubleSeconds(took));
          if (!r.ok()) MALLE_LOG(DEBUG) << "snapshot not reported: " << r;
        }
        if (absl::IsCancelled(s)) {
          MALLE_LOG(INFO) << "snapshot of step " << next.second << " cancelled: the job parks a newer state";
        } else if (!s.ok()) {
          MALLE_LOG(WARNING) << "snapshot of step " << next.second << " not written (" << s
                             << "); the previous one stays";
        }
        absl::MutexLock lock(&mu);
        busy = false;
        if (s.ok()) {
          last_write = took;
          last_write_cpu = absl::Seconds(cpu);
          written_step = std::max(written_step, next.second);
        }
      }
    });
  }
  // Hands a copy over unless a write is in flight; true if taken.
  bool Offer(PackedState state, int64_t step) {
    absl::MutexLock lock(&mu);
    if (busy || job.has_value()) return false;
    job.emplace(std::move(state), step);
    return true;
  }
  bool Busy() {
    absl::MutexLock lock(&mu);
    return busy || job.has_value();
  }
  absl::Duration LastWrite() {
    absl::MutexLock lock(&mu);
    return last_write;
  }
  absl::Duration LastWriteCpu() {
    absl::MutexLock lock(&mu);
    return last_write_cpu;
  }
  // Drops a snapshot not started yet, stops the one being written (its
  // temporary file removed; the previous snapshots stay) and waits for it.
  void Cancel() {
    {
      absl::MutexLock lock(&mu);
      job.reset();
      cancel.store(true);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !busy; };
      mu.Await(absl::Condition(&idle));
    }
    cancel.store(false);
  }
  // Waits until nothing is queued or being written.
  void Drain() {
    absl::MutexLock lock(&mu);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !busy && !job.has_value(); };
    mu.Await(absl::Condition(&idle));
  }
  void Stop() {
    {
      absl::MutexLock lock(&mu);
      stop = true;
    }
    if (thread.joinable()) thread.join();
  }
};

Engine::Engine(EngineOptions options) : options_(std::move(options)) {}

Engine::~Engine() { Close(); }

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<comm::ControlStore> store,
                                                       comm::ElasticGroupOptions group_options,
                                                       EngineOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("store: is null");
  MALLE_RETURN_IF_ERROR(options.Validate());
  if (options.logical_workers > 0 && group_options.bootstrap_size > options.logical_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logical_workers: ", options.logical_workers, " is smaller than the job's starting size ",
        group_options.bootstrap_size, "; every rank needs at least one logical worker"));
  }
  if (options.logical_workers > 0) {
    group_options.max_size = std::min(group_options.max_size, options.logical_workers);
  }
  MALLE_RETURN_IF_ERROR(group_options.Validate());
  std::unique_ptr<Engine> e(new Engine(std::move(options)));
  e->store_ = std::move(store);
  e->group_options_ = std::move(group_options);
  return e;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<comm::ElasticGroup> group,
                                                       EngineOptions options) {
  if (group == nullptr || !group->active()) return absl::InvalidArgumentError("group: null or no longer active");
  MALLE_RETURN_IF_ERROR(options.Validate());
  if (options.logical_workers > 0 && group->size() > options.logical_workers) {
    return absl::InvalidArgumentError(absl::StrCat("logical_workers: ", options.logical_workers,
                                                   " is smaller than the group's size ", group->size()));
  }
  std::unique_ptr<Engine> e(new Engine(std::move(options)));
  e->pending_ = group->last_transition();
  e->group_options_.job_id = group->job_id();
  e->group_options_.member_id = group->member_id();
  e->group_ = std::move(group);
  return e;
}

int Engine::rank() const { return group_ ? group_->rank() : last_rank_; }
int Engine::size() const { return group_ ? group_->size() : last_size_; }
int64_t Engine::generation() const { return group_ ? group_->generation() : last_generation_; }
const std::string& Engine::member_id() const { return group_ ? group_->member_id() : group_options_.member_id; }
const std::string& Engine::job_id() const { return group_options_.job_id; }

// --- set-up --------------------------------------------------------------------

absl::Status Engine::SetModel(std::vector<NamedTensor> parameters, std::vector<NamedTensor> buffers) {
  if (model_set_) return absl::FailedPreconditionError("SetModel: this job already has a model");
  std::optional<c10::Device> device;
  int trained = 0;
  for (const NamedTensor& p : parameters) {
    if (!p.tensor.defined() || p.tensor.layout() != at::kStrided) {
      return absl::InvalidArgumentError(absl::StrCat("model: parameter '", p.name, "' must be a defined dense tensor"));
    }
    if (device && p.tensor.device() != *device) {
      return absl::InvalidArgumentError(absl::StrCat("model: parameter '", p.name, "' is on ",
                                                     p.tensor.device().str(), ", others on ", device->str(),
                                                     "; a model must be on one device"));
    }
    device = p.tensor.device();
    if (!p.tensor.is_cpu() && !p.tensor.is_cuda()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: parameter '", p.name, "' is on ", device->str(), "; CPU and CUDA only"));
    }
    trained += p.tensor.requires_grad() ? 1 : 0;
  }
  if (trained == 0) return absl::InvalidArgumentError("model: has no parameter that requires a gradient");
  for (const NamedTensor& b : buffers) {
    if (!b.tensor.defined() || b.tensor.layout() != at::kStrided) {
      return absl::InvalidArgumentError(absl::StrCat("model: buffer '", b.name, "' must be a defined dense tensor"));
    }
  }
  // One flat buffer per dtype and device (same TensorImpls, new storage),
  // which a state transfer sends as it is. Before the Reducer, which must see
  // the final storage.
  {
    std::vector<at::Tensor> all;
    for (const NamedTensor& t : parameters) all.push_back(t.tensor);
    for (const NamedTensor& t : buffers) all.push_back(t.tensor);
    std::map<std::pair<int, int>, std::vector<at::Tensor>> by_device;  // (device type, index)
    for (const at::Tensor& t : all) by_device[DeviceKey(t)].push_back(t);
    for (auto& [d, list] : by_device) FlattenTensors(list);
  }
  // The data backend follows the model's device (before joining: a group that
  // exists already keeps its own).
  const bool cuda = device->is_cuda();
  if (options_.backend == "nccl" && !cuda) {
    return absl::InvalidArgumentError(
        "backend='nccl' reduces CUDA tensors and this job's model is not on a CUDA device; use backend='gloo' "
        "for CPU training");
  }
  if (group_ == nullptr) {
    MALLE_ASSIGN_OR_RETURN(group_options_.data_backend,
                           comm::MakeDataBackend(!cuda ? "gloo" : options_.backend == "nccl" ? "nccl" : "gloo-cuda"));
  }
  parameters_ = std::move(parameters);
  buffers_ = std::move(buffers);
  model_set_ = true;
  if (!options_.deterministic && options_.use_reducer) {
    MALLE_ASSIGN_OR_RETURN(reducer_, GradReducer::Create(TrainedParams(), options_.bucket_bytes,
                                                                options_.first_bucket_bytes));
  }
  return absl::OkStatus();
}

absl::Status Engine::AddPart(PartSpec part) {
  if (started_) return absl::FailedPreconditionError("AddPart: after the first step");
  if (part.name.empty() || !part.save || !part.load || !part.checkpoint != !part.restore) {
    return absl::InvalidArgumentError(
        "AddPart: needs a name, a save and a load function, and a restore with a checkpoint");
  }
  for (const Part& p : parts_) {
    if (p.spec.name == part.name) {
      return absl::InvalidArgumentError(absl::StrCat("AddPart: '", part.name, "' is already part of the state"));
    }
  }
  parts_.push_back({std::move(part), 0});
  // A state loaded before, if any, into one buffer per dtype.
  return FlattenParts(/*force=*/false).status();
}

namespace {

// The seed of logical worker k's data stream at `step`.
uint64_t DataStreamSeed(uint64_t seed, int64_t step, int k) {
  return MixSeed({static_cast<int64_t>(seed), step, k, kDataStream});
}

// Logical worker k's micro-batch at `step`; `position`: the stream position
// of that step (follow mode, where worker k is rank k).
WorkerPlan PlanWorker(ElasticSampler& sampler, uint64_t seed, int logical_workers, int64_t step, int k,
                      int64_t position) {
  WorkerPlan w;
  w.worker = k;
  w.rng_seed = MixSeed({static_cast<int64_t>(seed), step, k});
  w.data_seed = DataStreamSeed(seed, step, k);
  if (logical_workers > 0) {
    w.indices = sampler.Indices(step, k);
  } else {
    w.indices = sampler.Stream(position + k * sampler.batch_size(), sampler.batch_size());
  }
  return w;
}

}  // namespace

BatchKeys::BatchKeys(ElasticSampler sampler, uint64_t seed, int logical_workers, const StepPlan& plan,
                     int64_t position, int64_t total_steps)
    : sampler_(std::move(sampler)),
      seed_(seed),
      logical_workers_(logical_workers),
      size_(plan.size),
      first_step_(plan.step),
      first_position_(position),
      total_steps_(total_steps),
      loop_step_(plan.step),
      next_step_(plan.step) {
  for (const WorkerPlan& w : plan.workers) workers_.push_back(w.worker);
}

int64_t BatchKeys::PositionOf(int64_t step) const {
  return first_position_ + (step - first_step_) * size_ * sampler_.batch_size();
}

std::optional<WorkerPlan> BatchKeys::Next() {
  if (workers_.empty() || next_step_ >= total_steps_) return std::nullopt;
  WorkerPlan w = PlanWorker(sampler_, seed_, logical_workers_, next_step_, workers_[next_worker_],
                            PositionOf(next_step_));
  if (++next_worker_ == workers_.size()) {
    next_worker_ = 0;
    ++next_step_;
  }
  return w;
}

bool BatchKeys::Follows(const StepPlan& plan, int64_t position) {
  if (plan.step != loop_step_ + 1 || plan.size != size_ || plan.workers.size() != workers_.size()) return false;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (plan.workers[i].worker != workers_[i]) return false;
  }
  if (logical_workers_ == 0 && position != PositionOf(plan.step)) return false;
  loop_step_ = plan.step;
  return true;
}

absl::StatusOr<BatchKeys> Engine::KeysFrom(const StepPlan& plan) const {
  if (!sampler_) return absl::FailedPreconditionError("KeysFrom: no data yet (SetData, or a loader in Python)");
  return BatchKeys(*sampler_, options_.seed, options_.logical_workers, plan, position_, total_steps_);
}

uint64_t Engine::DataSeed(int64_t step, int worker) const { return DataStreamSeed(options_.seed, step, worker); }

absl::Status Engine::SetData(const DataOptions& data) {
  if (sampler_) return absl::FailedPreconditionError("SetData: this job already has its data");
  if (data.steps.has_value() == data.epochs.has_value()) {
    return absl::InvalidArgumentError("loader: give exactly one of steps= or epochs=");
  }
  if (data.steps && *data.steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("steps: must be a non-negative integer, got ", *data.steps));
  }
  if (data.epochs && !(*data.epochs > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("epochs: must be positive, got ", *data.epochs));
  }
  if (data.epochs && options_.logical_workers == 0) {
    return absl::InvalidArgumentError(
        "epochs: needs logical_workers (a constant global batch); give steps= instead");
  }
  if (!data.drop_last && !data.epochs) {
    return absl::InvalidArgumentError("drop_last=False: only with epochs= (steps= is exact)");
  }
  if (options_.logical_workers == 0 && data.batch_size > 0 && size() > 0 &&
      size() * data.batch_size > data.num_samples) {
    return absl::InvalidArgumentError(absl::StrCat("dataset: has ", data.num_samples,
                                                   " samples, fewer than one global batch (", size(),
                                                   " ranks x batch_size ", data.batch_size, ")"));
  }
  SamplerOptions so;
  so.num_samples = data.num_samples;
  so.logical_workers = std::max(1, options_.logical_workers);
  so.batch_size = data.batch_size;
  so.seed = options_.seed;
  so.shuffle = data.shuffle;
  MALLE_ASSIGN_OR_RETURN(ElasticSampler sampler, ElasticSampler::Create(so));
  total_steps_ = data.steps ? *data.steps : sampler.StepsForEpochs(*data.epochs, data.drop_last);
  batch_size_ = data.batch_size;
  sampler_.emplace(std::move(sampler));
  return absl::OkStatus();
}

// --- state ----------------------------------------------------------------------

absl::StatusOr<JobState> Engine::CaptureState() const {
  JobState s;
  s.logical_workers = options_.logical_workers;
  s.seed = options_.seed;
  s.step = step_;
  s.position = position_;
  s.lr_factor = lr_factor_;
  for (const NamedTensor& t : parameters_) s.parameters.push_back({t.name, t.tensor.detach()});
  for (const NamedTensor& t : buffers_) s.buffers.push_back({t.name, t.tensor.detach()});
  for (const Part& p : parts_) {
    MALLE_ASSIGN_OR_RETURN(PartState ps, p.spec.save());
    s.parts.push_back({p.spec.name, std::move(ps)});
  }
  return s;
}

absl::Status Engine::RestoreState(JobState state) {
  MALLE_ASSIGN_OR_RETURN(JobState mine, CaptureState());
  MALLE_RETURN_IF_ERROR(JobState::CheckCompatible(mine, state));
  // Parts first: they check before they change anything (an optimizer that
  // does not match refuses), so a refused state leaves the model untouched.
  for (Part& p : parts_) {
    const StatePartRecord* rec = state.part(p.spec.name);
    MALLE_RETURN_IF_ERROR(p.spec.load(rec->state));
  }
  auto copy = [](const std::vector<NamedTensor>& to, const std::vector<NamedTensor>& from) {
    for (size_t i = 0; i < to.size(); ++i) {
      if (to[i].tensor.data_ptr() != from[i].tensor.data_ptr()) to[i].tensor.detach().copy_(from[i].tensor);
    }
  };
  copy(parameters_, state.parameters);
  copy(buffers_, state.buffers);
  step_ = state.step;
  position_ = state.position;
  lr_factor_ = state.lr_factor;
  // The parts' loaded tensors are views of the received segments; keep them
  // in one buffer per dtype for the next transfer.
  return FlattenParts(/*force=*/true).status();
}

absl::StatusOr<std::string> Engine::StateDigest() const {
  MALLE_ASSIGN_OR_RETURN(JobState s, CaptureState());
  return s.Digest();
}

absl::StatusOr<bool> Engine::FlattenParts(bool force) {
  bool changed = false;
  for (Part& p : parts_) {
    MALLE_ASSIGN_OR_RETURN(PartState s, p.spec.save());
    if (!force && s.tensors.size() == p.tensors) continue;
    p.tensors = s.tensors.size();
    std::map<std::pair<int, int>, std::vector<at::Tensor>> by_device;  // (device type, index)
    for (const at::Tensor& t : s.tensors) {
      if (t.defined() && t.layout() == at::kStrided) by_device[DeviceKey(t)].push_back(t);
    }
    for (auto& [d, list] : by_device) changed = FlattenTensors(list) || changed;
  }
  return changed;
}

int64_t Engine::landing_bytes() const {
  int64_t n = 0;
  for (const at::Tensor& t : landing_) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

void Engine::PrepareLanding() {
  landing_.clear();
  if (store_ == nullptr) return;
  absl::StatusOr<std::optional<std::string>> data = store_->TryGet(StateLayoutKey(group_options_.job_id));
  if (!data.ok()) {
    MALLE_LOG(WARNING) << "state layout not read (" << data.status() << "); receiving into fresh memory";
    return;
  }
  if (!data->has_value()) return;  // a new job
  absl::StatusOr<std::vector<SegmentLayout>> expected = DecodeLayout(**data);
  if (!expected.ok()) {
    MALLE_LOG(WARNING) << "ignoring the published " << expected.status() << "; receiving into fresh memory";
    return;
  }
  absl::StatusOr<JobState> own = CaptureState();
  absl::StatusOr<std::vector<SegmentLayout>> mine =
      own.ok() ? LayoutOf(own->Pack(options_.state_direct_min_bytes)) : own.status();
  if (!mine.ok()) {
    MALLE_LOG(WARNING) << "own state layout: " << mine.status();
    return;
  }
  landing_ = LandingBuffers(*expected, *mine, options_.state_direct_min_bytes);
}

void Engine::PublishLayout() {
  absl::StatusOr<JobState> s = CaptureState();
  absl::StatusOr<std::vector<SegmentLayout>> layout =
      s.ok() ? LayoutOf(s->Pack(options_.state_direct_min_bytes)) : s.status();
  absl::Status st = layout.status();
  if (st.ok()) {
    std::string data = EncodeLayout(*layout);
    if (data == published_layout_) return;
    st = store_->Set(StateLayoutKey(group_->job_id()), data);
    if (st.ok()) published_layout_ = std::move(data);
  }
  if (!st.ok()) MALLE_LOG(WARNING) << "state layout not published: " << st;  // advisory
}

absl::Status Engine::SyncState(int source, const std::vector<int>& receivers, const std::vector<std::string>& nodes,
                               bool in_place, ResizeEvent* ev) {
  comm::Communicator& comm = group_->comm();
  const bool is_source = comm.rank() == source;
  if (!is_source && std::find(receivers.begin(), receivers.end(), comm.rank()) == receivers.end()) {
    return absl::OkStatus();
  }
  if (is_source) {
    MALLE_ASSIGN_OR_RETURN(JobState s, CaptureState());
    PackedState packed = s.Pack(options_.state_direct_min_bytes);
    NodeTransferCounts counts;
    MALLE_RETURN_IF_ERROR(
        TransferStateByNode(comm, source, receivers, nodes, &packed, nullptr, nullptr, &counts).status());
    ev->state_bytes = counts.state_bytes;
    ev->state_sent_remote = counts.sent_remote;
    ev->state_sent_local = counts.sent_local;
    return absl::OkStatus();
  }
  // A rank that holds no committed state (a joiner) receives into its own
  // tensors where the layouts match; the others into fresh memory, so that a
  // transfer cut by a failure never leaves them half overwritten.
  std::optional<PackedState> own;
  if (in_place) {
    MALLE_ASSIGN_OR_RETURN(JobState mine, CaptureState());
    own = mine.Pack(options_.state_direct_min_bytes);
  }
  if (!options_.fault_exit_in_state_sync.empty() && options_.fault_exit_in_state_sync == member_id()) {
    ::_exit(137);  // tests: die like kill -9 in the middle of a state transfer
  }
  const std::vector<at::Tensor> landing_before = landing_;
  // Ranks sharing a node: the state crosses into the node once, to its
  // first receiver, which copies it to the others there.
  NodeTransferCounts counts;
  MALLE_ASSIGN_OR_RETURN(PackedState got, TransferStateByNode(comm, source, receivers, nodes, nullptr,
                                                              own ? &*own : nullptr, &landing_, &counts));
  ev->state_bytes = got.bytes();
  ev->state_received_remote = counts.received_remote;
  ev->state_sent_remote = counts.sent_remote;
  ev->state_sent_local = counts.sent_local;
  for (size_t i = 0; i < got.buffers.size(); ++i) {
    const int64_t n = got.buffers[i].numel() * static_cast<int64_t>(got.buffers[i].element_size());
    if (i < got.direct.size() && got.direct[i]) {
      ev->state_in_place += n;
    } else {
      for (const at::Tensor& b : landing_before) {
        if (b.data_ptr() == got.buffers[i].data_ptr()) ev->state_landed += n;
      }
    }
  }
  MALLE_ASSIGN_OR_RETURN(JobState theirs, JobState::Unpack(std::move(got)));
  return RestoreState(std::move(theirs));
}

// --- step boundary ------------------------------------------------------------

absl::Status Engine::Join() {
  if (group_ == nullptr && !model_set_ && at::globalContext().hasCUDA()) {
    MALLE_ASSIGN_OR_RETURN(group_options_.data_backend,
                           comm::MakeDataBackend(options_.backend == "nccl" ? "nccl" : "gloo-cuda"));
  }
  return EnsureJoined();
}

absl::Status Engine::EnsureJoined() {
  if (group_) return absl::OkStatus();
  MALLE_ASSIGN_OR_RETURN(group_, comm::ElasticGroup::Join(store_, group_options_));
  pending_ = group_->last_transition();
  return absl::OkStatus();
}

absl::StatusOr<bool> Engine::Boundary() {
  MALLE_RETURN_IF_ERROR(EnsureJoined());
  for (;;) {
    Transition t;
    if (pending_) {
      t = std::move(*pending_);
      pending_.reset();
    } else {
      MALLE_ASSIGN_OR_RETURN(t, group_->AtStepBoundary());
    }
    if (t.kind == Transition::Kind::kLeft) {
      left_ = true;
      return false;
    }
    if (t.kind == Transition::Kind::kExcluded) {
      excluded_ = true;
      return absl::AbortedError(absl::StrCat("member ", group_->member_id(), " was declared failed by job ",
                                             group_->job_id(), ": ", t.reason,
                                             "; it must join again as a new member"));
    }
    if (t.park) park_requested_ = true;
    if (!t.changed()) return true;
    absl::Status s = OnChange(t);
    if (s.ok()) return true;
    if (absl::IsInvalidArgument(s)) return s;  // a mismatch: retrying cannot help
    // A member died during the state transfer: the next boundary recovers.
    MALLE_LOG(WARNING) << "state sync in generation " << t.generation << " failed (" << s << "); recovering";
  }
}

absl::Status Engine::OnChange(const Transition& t) {
  ResizeEvent ev;
  // Nobody receives after a planned shrink or a recovery in which every
  // survivor committed the same step: then no transfer at all.
  const std::vector<int> receivers = StateReceivers(t);
  const absl::Time s0 = absl::Now();
  if (t.kind == Transition::Kind::kBootstrap && t.rank == t.state_source_rank) {
    // A new incarnation of a job that parked (or a user's checkpoint): the
    // source loads it, and the bootstrap's transfer gives it to everyone.
    MALLE_RETURN_IF_ERROR(ResumeFromStore());
  }
  if (!receivers.empty()) {
    MALLE_RETURN_IF_ERROR(
        SyncState(t.state_source_rank, receivers, t.nodes, t.committed_by_rank[t.rank] < 0, &ev));
  }
  const absl::Duration state_time = absl::Now() - s0;
  landing_.clear();  // what the first transfer did not use is not needed any more
  // The protocol's resume step is the truth, except at a bootstrap, where no
  // member has committed yet and a resumed state says where it stopped.
  step_ = t.kind == Transition::Kind::kBootstrap ? std::max(step_, t.resume_step) : t.resume_step;
  // Every member now holds the state after step step_ - 1: say so to the
  // group, so that the next generation's resume point counts it. A joiner
  // (or a resumed bootstrap) has committed no step of its own yet; without
  // this, a joiner left alone before its first commit resumed at step 0, on
  // top of the state it had received.
  if (step_ > 0) group_->Commit(step_ - 1);
  // The state a job starts (or resumes) with needs no snapshot: the first is
  // an interval later.
  if (t.kind == Transition::Kind::kBootstrap) last_snapshot_try_ = step_;
  if (options_.logical_workers > 0) {
    workers_ = AssignWorkers(options_.logical_workers, t.size, t.rank);
  } else {
    workers_ = {t.rank};
  }
  ev.kind = t.kind;
  ev.generation = t.generation;
  ev.size = t.size;
  ev.rank = t.rank;
  ev.resume_step = t.resume_step;
  ev.joined = t.joined;
  ev.removed = t.removed;
  ev.phases = {t.phases.detect, t.phases.wait, t.phases.agree, t.phases.build, t.phases.sync, state_time,
               t.phases.total + state_time};
  ev.reason = t.reason;
  MALLE_LOG(INFO) << "generation " << t.generation << ": " << comm::TransitionKindName(t.kind) << ", size "
                  << t.size << ", rank " << t.rank << ", resume at step " << t.resume_step << ", state "
                  << ev.state_bytes << " B in " << absl::FormatDuration(state_time);
  history_.push_back(std::move(ev));
  return absl::OkStatus();
}

void Engine::RollBackFailedStep() {
  if (!attempt_) return;
  attempt_ = false;
  if (buffers0_.size() == buffers_.size()) {
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].tensor.detach().copy_(buffers0_[i]);
  }
  for (size_t i = 0; i < parts_.size() && i < parts0_.size(); ++i) {
    if (!parts0_[i]) continue;
    absl::Status s = parts_[i].spec.restore(*std::move(parts0_[i]));
    if (!s.ok()) MALLE_LOG(WARNING) << "'" << parts_[i].spec.name << "' not rolled back: " << s;
  }
  parts0_.clear();
  buffers_w0_.clear();
}

absl::StatusOr<std::optional<StepPlan>> Engine::NextStep() {
  if (in_step_ || synchronized_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NextStep: step ", step_, " was not finished (FinishStep(), or optimizer.step() in Python, after its "
        "last micro-batch)"));
  }
  if (!model_set_ || !sampler_) {
    return absl::FailedPreconditionError("NextStep: give the model (SetModel) and the data (SetData) first");
  }
  if (left_ || finished_ || closed_) return std::optional<StepPlan>();
  started_ = true;
  RollBackFailedStep();
  const Clock::time_point t_boundary = Clock::now();
  const size_t events = history_.size();
  if (step_ >= total_steps_ && group_ != nullptr) {
    Finish();
    Complete();
    return std::optional<StepPlan>();
  }
  MALLE_ASSIGN_OR_RETURN(bool active, Boundary());
  if (!active) return std::optional<StepPlan>();
  if (std::exchange(park_requested_, false)) {
    if (options_.park_store != nullptr) {
      // The last member, asked to leave: nobody is left to hold the state.
      MALLE_RETURN_IF_ERROR(Park());
      left_ = true;
      group_->Finish();
      return std::optional<StepPlan>();
    }
    // Nowhere to park: leaving would throw the progress away. It keeps
    // training (joiners may still come and take the state over; whoever
    // asked for the leave stops the process at its own deadline).
    MALLE_LOG(WARNING) << "job " << job_id() << ": the last member was asked to leave and the job has no "
                       << "park store (MALLE_PARK_DIR): it stays, so as not to lose step " << step_;
  }
  if (step_ >= total_steps_) {
    // That boundary was the others' last one (a joiner admitted at the end,
    // or a laggard that caught up): no further boundary.
    finished_ = true;
    Complete();
    return std::optional<StepPlan>();
  }
  // Here the state is what a joiner would be sent: the committed step and
  // whatever the user's code did after it (a scheduler's step).
  MaybeSnapshot();
  StepPlan plan;
  plan.step = step_;
  plan.generation = group_->generation();
  plan.rank = group_->rank();
  plan.size = group_->size();
  if (options_.logical_workers == 0) {
    const double f = ScaleOf(options_.lr_scaling, plan.size);
    if (lr_factor_ == 0) {
      lr_factor_ = f;  // the learning rate the user set is the one for this size
    } else if (f != lr_factor_) {
      plan.lr_rescale = f / lr_factor_;
      lr_factor_ = f;
    }
  }
  for (int k : workers_) {
    plan.workers.push_back(PlanWorker(*sampler_, options_.seed, options_.logical_workers, step_, k, position_));
  }
  ZeroGrads();
  in_step_ = true;
  begun_ = ended_ = 0;
  failed_ = false;
  if (step_ <= max_started_) ++redone_steps_;
  max_started_ = std::max(max_started_, step_);
  attempt_ = true;
  parts0_.clear();
  for (Part& p : parts_) {
    if (!p.spec.checkpoint) {
      parts0_.emplace_back();
      continue;
    }
    absl::StatusOr<PartState> s = p.spec.checkpoint();
    if (!s.ok()) return s.status();
    parts0_.emplace_back(*std::move(s));
  }
  // Advisor timings.
  profile_.start = Clock::now();
  profile_.data_wait = absl::ZeroDuration();
  profile_.last_hook.reset();
  profile_.after_resize = history_.size() > events;
  profile_.after_failure = profile_.after_resize && history_.back().kind == Transition::Kind::kRecovered;
  const absl::Duration pause = absl::FromChrono(profile_.start - t_boundary);
  profile_.resize_pause = profile_.after_resize ? pause : absl::ZeroDuration();
  profile_.boundary = profile_.after_resize ? absl::ZeroDuration() : pause;
  return std::optional<StepPlan>(std::move(plan));
}

// --- micro-batches --------------------------------------------------------------

void Engine::BeginMicroBatch(size_t index) {
  MALLE_CHECK(in_step_ && index == begun_ && index == ended_ && index < workers_.size())
      << "BeginMicroBatch(" << index << "): micro-batches must run in plan order, each ended";
  ++begun_;
  if (reducer_ != nullptr && index + 1 == workers_.size()) {
    // The step's last micro-batch: its backward reduces the accumulated
    // gradients over this generation (nothing to reduce over once failed).
    const int n = options_.logical_workers > 0 ? options_.logical_workers : size();
    arm_error_ = reducer_->Arm(failed_ ? nullptr : &group_->comm(), static_cast<double>(n));
  }
  // torch's generators (CPU and every CUDA device) follow the worker's model stream.
  at::manual_seed(MixSeed({static_cast<int64_t>(options_.seed), step_, workers_[index]}));
  if (buffers_.empty()) return;
  if (index == 0) {
    buffers0_.clear();
    buffers_w0_.clear();
    for (const NamedTensor& b : buffers_) buffers0_.push_back(b.tensor.detach().clone());
    return;
  }
  if (workers_[index - 1] == 0) {
    for (const NamedTensor& b : buffers_) buffers_w0_.push_back(b.tensor.detach().clone());
  }
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].tensor.detach().copy_(buffers0_[i]);
}

void Engine::AddDataWait(absl::Duration wait) { profile_.data_wait += wait; }

std::vector<at::Tensor> Engine::TrainedParams() const {
  std::vector<at::Tensor> out;
  for (const NamedTensor& p : parameters_) {
    if (p.tensor.requires_grad()) out.push_back(p.tensor);
  }
  return out;
}

absl::Status Engine::EndMicroBatch() {
  if (!in_step_ || begun_ != ended_ + 1) {
    return absl::FailedPreconditionError("EndMicroBatch: no BeginMicroBatch to end");
  }
  ++ended_;
  if (reducer_ != nullptr && ended_ == workers_.size()) {
    if (!arm_error_.ok()) return std::exchange(arm_error_, absl::OkStatus());
    absl::Status sync;
    MALLE_RETURN_IF_ERROR(reducer_->Finish(&sync, &profile_.last_hook));
    if (!sync.ok()) MarkFailed(sync);
  }
  if (!options_.deterministic) return absl::OkStatus();
  std::vector<at::Tensor> params = TrainedParams();
  int64_t numel = 0;
  for (const at::Tensor& p : params) numel += p.numel();
  if (!rows_.defined() || rows_.size(0) != options_.logical_workers || rows_.size(1) != numel) {
    rows_ = at::zeros({options_.logical_workers, numel}, params.front().options().requires_grad(false));
  }
  at::Tensor row = rows_[workers_[ended_ - 1]];
  int64_t off = 0;
  for (at::Tensor& p : params) {
    at::Tensor slice = row.narrow(0, off, p.numel());
    const at::Tensor& g = p.grad();
    if (g.defined()) {
      slice.copy_(g.reshape({-1}));
      p.mutable_grad() = at::Tensor();
    } else {
      slice.zero_();
    }
    off += p.numel();
  }
  return absl::OkStatus();
}

// --- end of step ----------------------------------------------------------------

void Engine::MarkFailed(const absl::Status& why) {
  if (!failed_) {
    MALLE_LOG(WARNING) << "step " << step_ << ": gradient sync failed (" << why << "); the step will be redone";
  }
  failed_ = true;
}

void Engine::ZeroGrads() {
  for (NamedTensor& p : parameters_) {
    if (p.tensor.grad().defined()) p.tensor.mutable_grad() = at::Tensor();
  }
}

bool Engine::ReduceBuckets() {
  struct Bucket {
    std::vector<at::Tensor> params;
    std::vector<at::Tensor> flat;  // one tensor: the argument of AllReduceAsync
    std::optional<comm::PendingCollective> pending;
  };
  std::vector<at::Tensor> params = TrainedParams();
  std::vector<Bucket> buckets;
  size_t i = 0;
  while (i < params.size()) {
    Bucket b;
    int64_t bytes = 0;
    int64_t numel = 0;
    const at::ScalarType dtype = params[i].scalar_type();
    while (i < params.size() && params[i].scalar_type() == dtype &&
           (b.params.empty() ||
            bytes + params[i].numel() * static_cast<int64_t>(params[i].element_size()) <= options_.bucket_bytes)) {
      bytes += params[i].numel() * static_cast<int64_t>(params[i].element_size());
      numel += params[i].numel();
      b.params.push_back(params[i++]);
    }
    at::Tensor flat = at::empty({numel}, b.params.front().options().requires_grad(false));
    int64_t off = 0;
    for (const at::Tensor& p : b.params) {
      at::Tensor slice = flat.narrow(0, off, p.numel());
      const at::Tensor& g = p.grad();
      if (g.defined()) {
        slice.copy_(g.reshape({-1}));
      } else {
        slice.zero_();
      }
      off += p.numel();
    }
    b.flat.push_back(flat);
    // Start this bucket's allreduce now: the next bucket is packed meanwhile.
    if (!failed_) {
      auto pending = group_->comm().AllReduceAsync(b.flat);
      if (pending.ok()) {
        b.pending = *std::move(pending);
      } else {
        MarkFailed(pending.status());
      }
    }
    buckets.push_back(std::move(b));
  }
  for (Bucket& b : buckets) {
    if (!b.pending) continue;
    absl::Status s = b.pending->Wait();
    if (!s.ok()) MarkFailed(s);
  }
  if (failed_) return false;
  const double n = static_cast<double>(options_.logical_workers > 0 ? options_.logical_workers : size());
  for (Bucket& b : buckets) {
    at::Tensor flat = b.flat.front();
    if (n != 1.0) flat.div_(n);
    int64_t off = 0;
    for (at::Tensor& p : b.params) {
      at::Tensor slice = flat.narrow(0, off, p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(slice);
      } else {
        p.mutable_grad() = slice.clone();
      }
      off += p.numel();
    }
  }
  return true;
}

bool Engine::ReduceRows() {
  MALLE_CHECK(rows_.defined()) << "deterministic mode: no gradient rows captured";
  std::set<int> mine(workers_.begin(), workers_.end());
  for (int k = 0; k < options_.logical_workers; ++k) {
    if (!mine.count(k)) rows_[k].zero_();
  }
  // Adding zeros is exact: every row arrives unchanged on every rank.
  absl::Status s = group_->comm().AllReduce(rows_);
  if (!s.ok()) {
    MarkFailed(s);
    return false;
  }
  at::Tensor total = rows_[0].clone();
  for (int k = 1; k < options_.logical_workers; ++k) total.add_(rows_[k]);
  total.div_(static_cast<double>(options_.logical_workers));
  int64_t off = 0;
  for (at::Tensor& p : TrainedParams()) {
    p.mutable_grad() = total.narrow(0, off, p.numel()).view(p.sizes()).clone();
    off += p.numel();
  }
  return true;
}

bool Engine::SyncBuffers() {
  if (buffers_.empty()) return true;
  const bool has_worker0 = std::find(workers_.begin(), workers_.end(), 0) != workers_.end();
  if (has_worker0 && !buffers_w0_.empty()) {
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].tensor.detach().copy_(buffers_w0_[i]);
  }
  // One flat broadcast per dtype and device from rank 0 (which always runs worker 0).
  std::map<std::pair<at::ScalarType, std::pair<int, int>>, std::vector<at::Tensor>> groups;
  for (const NamedTensor& b : buffers_) groups[{b.tensor.scalar_type(), DeviceKey(b.tensor)}].push_back(b.tensor);
  for (auto& [key, list] : groups) {
    int64_t numel = 0;
    for (const at::Tensor& b : list) numel += b.numel();
    at::Tensor flat = at::empty({numel}, list.front().options().requires_grad(false));
    int64_t off = 0;
    for (const at::Tensor& b : list) {
      flat.narrow(0, off, b.numel()).copy_(b.detach().reshape({-1}));
      off += b.numel();
    }
    at::Tensor wire = key.first == at::kBool ? flat.view(at::kByte) : flat;
    absl::Status s = group_->comm().Broadcast(wire, 0);
    if (!s.ok()) {
      MarkFailed(s);
      return false;
    }
    if (group_->rank() != 0) {
      off = 0;
      for (const at::Tensor& b : list) {
        b.detach().copy_(flat.narrow(0, off, b.numel()).view(b.sizes()));
        off += b.numel();
      }
    }
  }
  return true;
}

absl::StatusOr<bool> Engine::Synchronize() {
  if (!in_step_) return absl::FailedPreconditionError("Synchronize: no step in progress (call NextStep)");
  if (ended_ != workers_.size() || begun_ != ended_) {
    return absl::FailedPreconditionError(absl::StrCat(ended_, " of ", workers_.size(),
                                                      " micro-batches of step ", step_, " ran"));
  }
  in_step_ = false;
  const Clock::time_point t_sync = Clock::now();
  // With the Reducer the gradients were reduced during the last backward.
  bool ok = options_.deterministic ? ReduceRows() : reducer_ != nullptr ? !failed_ : ReduceBuckets();
  if (ok) ok = SyncBuffers();
  if (!ok) {
    ZeroGrads();
    profile_.prev_end.reset();  // the redone step's time is not a step time
    return false;  // not committed: the next boundary rolls back, recovers and redoes the step
  }
  // The gradients are reduced: the next boundary's vote goes now and
  // completes while the optimizer runs (one synchronisation per step).
  MALLE_RETURN_IF_ERROR(group_->BeginStepBoundary());
  synchronized_ = true;
  profile_.t_sync = t_sync;
  profile_.t_reduced = Clock::now();
  return true;
}

absl::Status Engine::Commit() {
  if (!synchronized_) return absl::FailedPreconditionError("Commit: no synchronised step (call Synchronize)");
  synchronized_ = false;
  // New state tensors (Adam's moments after its first step): one buffer per
  // dtype, so that a transfer sends them without packing; the layout rank 0
  // publishes for joiners changes with them (in practice once).
  absl::StatusOr<bool> flat = FlattenParts(/*force=*/false);
  if (!flat.ok()) MALLE_LOG(WARNING) << "state not flattened: " << flat.status();  // only slower transfers
  if (store_ != nullptr && group_->rank() == 0 && flat.ok() && (*flat || published_layout_.empty())) {
    PublishLayout();
  }
  group_->Commit(step_);
  attempt_ = false;
  RecordStep();
  ++step_;
  if (options_.logical_workers == 0) position_ += static_cast<int64_t>(size()) * batch_size_;
  const Clock::time_point now = Clock::now();
  if (last_commit_) {
    const absl::Duration took = absl::FromChrono(now - *last_commit_);
    step_time_ = step_time_ == absl::ZeroDuration() ? took : step_time_ * 0.9 + took * 0.1;
  }
  last_commit_ = now;
  if (options_.publish_progress && store_ != nullptr && group_->rank() == 0) {
    absl::Status s = store_->Set(ProgressKey(group_->job_id()), absl::StrCat(step_));
    if (!s.ok()) MALLE_LOG(DEBUG) << "progress key not written: " << s;  // advisory
  }
  return absl::OkStatus();
}

// --- profiling advisor ------------------------------------------------------------

void Engine::RecordStep() {
  Profile& prof = profile_;
  const Clock::time_point now = Clock::now();
  if (!options_.advisor) {
    prof.prev_end = now;
    prof.after_resize = prof.after_failure = false;
    return;
  }
  // The advisor counts nodes, as the allocator does: a job on k nodes of N
  // slots runs k x N ranks (a node that lost a rank still counts as a node).
  const int rpn = std::max(1, options_.ranks_per_node);
  const int n = (size() + rpn - 1) / rpn;
  const int workers = options_.logical_workers > 0 ? options_.logical_workers : size();
  if (advisor_ == nullptr) {
    advisor::AdvisorOptions o;
    o.job_id = options_.advisor_job.empty() ? job_id() : options_.advisor_job;
    const int lw_nodes = options_.logical_workers > 0 ? std::max(1, options_.logical_workers / rpn) : 0;
    int hi = options_.max_nodes > 0 ? options_.max_nodes : (lw_nodes > 0 ? lw_nodes : std::max(8, n));
    if (lw_nodes > 0) hi = std::min(hi, lw_nodes);
    o.max_nodes = std::max(hi, 1);
    o.min_nodes = std::min(options_.min_nodes, o.max_nodes);
    absl::StatusOr<std::unique_ptr<advisor::Advisor>> a = advisor::Advisor::Create(o);
    if (!a.ok()) {
      MALLE_LOG(WARNING) << "profiling advisor off: " << a.status();
      options_.report_sink.reset();
      return;
    }
    advisor_ = std::shared_ptr<advisor::Advisor>(std::move(*a));
  }
  auto since = [&](Clock::time_point t) { return absl::FromChrono(t - prof.start); };
  StepTimes t;
  t.data_wait = prof.data_wait;
  t.sync = since(prof.t_sync);
  t.reduced = since(prof.t_reduced);
  t.end = since(now);
  if (prof.last_hook && *prof.last_hook >= prof.start) t.last_hook = since(*prof.last_hook);
  if (prof.prev_end) t.since_prev_end = absl::FromChrono(prof.start - *prof.prev_end);
  t.boundary = prof.boundary;
  t.resize_pause = prof.resize_pause;
  advisor::StepSample s = SampleOfStep(t, n, options_.deterministic);
  s.step = step_;
  s.logical_workers = workers;
  const int64_t bs = batch_size_ > 0 ? batch_size_ : 1;
  s.local_batch = static_cast<int64_t>(workers_.size()) * bs;
  s.global_batch = workers * bs;
  s.after_resize = prof.after_resize;
  s.after_failure = prof.after_failure;
  s.warmup = prof.steps_in_process < 1;
  absl::Status st = advisor_->Record(s);
  if (!st.ok()) MALLE_LOG(DEBUG) << "advisor sample of step " << step_ << " not recorded: " << st;
  ++prof.steps_in_process;
  prof.prev_end = now;
  prof.after_resize = prof.after_failure = false;
  advisor_time_ += absl::FromChrono(Clock::now() - now);
  if (options_.report_sink != nullptr && reporter_ == nullptr && group_->rank() == 0) StartReporter();
}

std::string Engine::ReportJson() const {
  std::shared_ptr<advisor::Advisor> a = advisor_;
  return a == nullptr ? std::string() : advisor::ReportToJson(a->Report());
}

std::string Engine::ReportTable() const {
  std::shared_ptr<advisor::Advisor> a = advisor_;
  return a == nullptr ? std::string() : advisor::FormatReportTable(a->Report());
}

void Engine::StartReporter() {
  reporter_ = std::make_unique<Reporter>();
  std::shared_ptr<advisor::Advisor> a = advisor_;
  std::shared_ptr<advisor::ReportSink> sink = options_.report_sink;
  const absl::Duration interval = std::max(options_.report_interval, absl::Milliseconds(500));
  Reporter* r = reporter_.get();
  r->thread = std::thread([r, a, sink, interval] {
    for (;;) {
      {
        absl::MutexLock lock(&r->mu);
        auto stop = [r]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu) { return r->stop; };
        if (r->mu.AwaitWithTimeout(absl::Condition(&stop), interval)) return;
      }
      absl::Status s = sink->SendReport(advisor::ReportToJson(a->Report()));
      if (!s.ok()) MALLE_LOG(WARNING) << "advisor report not sent: " << s;  // advisory
    }
  });
}

void Engine::StopReporter() {
  if (reporter_ == nullptr) return;
  {
    absl::MutexLock lock(&reporter_->mu);
    reporter_->stop = true;
  }
  if (reporter_->thread.joinable()) reporter_->thread.join();
}

void Engine::Complete() {
  // Every step is done: rank 0 tells the allocator (a last report, then the completion).
  if (completed_ || group_ == nullptr || rank() != 0) return;
  completed_ = true;
  StopReporter();
  if (options_.report_sink == nullptr) return;
  if (advisor_ != nullptr) {
    absl::Status s = options_.report_sink->SendReport(advisor::ReportToJson(advisor_->Report()));
    if (!s.ok()) MALLE_LOG(WARNING) << "advisor report not sent: " << s;
  }
  const int workers = options_.logical_workers > 0 ? options_.logical_workers : size();
  absl::Status s = options_.report_sink->SendComplete(total_steps_, total_steps_ * workers * batch_size_);
  if (!s.ok()) MALLE_LOG(WARNING) << "job completion not sent to the allocator: " << s;
}

// --- end ----------------------------------------------------------------------

absl::Status Engine::RequestLeave() {
  if (!group_) return absl::FailedPreconditionError("RequestLeave: this member has not joined yet");
  return group_->RequestLeave();
}

void Engine::Finish() {
  if (finished_ || left_ || closed_ || group_ == nullptr || !group_->active()) return;
  finished_ = true;
  // A last boundary, so that no member exits while the others still reduce (a
  // member admitted now still receives the final state).
  absl::StatusOr<bool> active = Boundary();
  if (!active.ok()) {
    MALLE_LOG(WARNING) << "final step boundary failed: " << active.status();
    return;
  }
  if (*active && group_->active()) group_->Finish();
}

void Engine::Close() {
  if (closed_) return;
  closed_ = true;
  if (group_ != nullptr) {
    last_rank_ = group_->rank();
    last_size_ = group_->size();
    last_generation_ = group_->generation();
  }
  StopReporter();
  StopSnapshots();
  reducer_.reset();
  group_.reset();
}

void Engine::StopSnapshots() {
  if (snapshotter_ == nullptr) return;
  snapshotter_->Stop();  // a write in flight completes first
}

int64_t Engine::snapshot_step() const {
  if (snapshotter_ == nullptr) return -1;
  absl::MutexLock lock(&snapshotter_->mu);
  return snapshotter_->written_step;
}

absl::Status Engine::Save(const std::string& path) {
  if (in_step_ || synchronized_) return absl::FailedPreconditionError("Save: inside a step; call it between steps");
  MALLE_ASSIGN_OR_RETURN(JobState s, CaptureState());
  return WriteStateFile(path, s.Pack(options_.state_direct_min_bytes), job_id(), step_, options_.secret);
}

absl::Status Engine::ResumeFromStore() {
  // Every error here is final for this job (kInvalidArgument: the boundary
  // does not retry it): training from scratch instead would lose the progress
  // the user expects, silently.
  std::optional<ParkedState> found;
  const Clock::time_point t0 = Clock::now();
  // Segments whose layout matches this incarnation's own flat buffers (its
  // parameters, the model being the same) are read straight into them: no
  // fresh memory, no second copy. They have nothing to lose here: a state
  // that is refused ends the job with an error.
  MALLE_ASSIGN_OR_RETURN(JobState mine, CaptureState());
  const PackedState own = mine.Pack(options_.state_direct_min_bytes);
  StateIoOptions io;
  io.own = &own;
  if (!options_.resume_from.empty()) {
    ParkedState p;
    absl::StatusOr<PackedState> read = ReadStateFile(options_.resume_from, options_.secret, &p.info, io);
    if (!read.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("resume_from: ", read.status().message()));
    }
    p.state = *std::move(read);
    p.path = options_.resume_from;
    found = std::move(p);
  } else if (options_.park_store != nullptr) {
    std::vector<std::string> refused;
    absl::StatusOr<std::optional<ParkedState>> newest = options_.park_store->ReadNewest(&refused, io);
    for (const std::string& why : refused) MALLE_LOG(WARNING) << "parked state refused: " << why;
    if (!newest.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("park store ", options_.park_store->where(),
                                                     " cannot be read: ", newest.status().message()));
    }
    found = *std::move(newest);
    if (!found && !refused.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("park store ", options_.park_store->where(), " holds ",
                                                     refused.size(), " state file(s) and none verifies: ",
                                                     refused.front()));
    }
  }
  if (!found) return absl::OkStatus();  // a new job
  const Clock::time_point t_read = Clock::now();
  MALLE_ASSIGN_OR_RETURN(JobState state, JobState::Unpack(std::move(found->state)));
  absl::Status restored = RestoreState(std::move(state));
  if (!restored.ok()) {
    // Another model's or job's state: the user must know, not train from scratch.
    return absl::InvalidArgumentError(absl::StrCat(found->path, ": ", restored.message()));
  }
  resumed_from_ = found->path;
  const auto seconds = [](Clock::duration d) { return absl::ToDoubleSeconds(absl::FromChrono(d)); };
  MALLE_LOG(INFO) << "resumed from " << found->path << " at step " << step_ << " (" << found->info.bytes
                  << " B: read + verify " << seconds(t_read - t0) << " s, unpack + restore "
                  << seconds(Clock::now() - t_read) << " s)";
  return absl::OkStatus();
}

absl::Status Engine::Park() {
  if (options_.park_store == nullptr) {
    MALLE_LOG(ERROR) << "job " << job_id() << ": the last member was asked to leave and there is no park store: "
                     << "the job's state (step " << step_ << ") is lost; it will start over";
    return absl::OkStatus();
  }
  if (snapshotter_ != nullptr) snapshotter_->Cancel();  // one writer at a time; the park's state is newer
  const Clock::time_point t0 = Clock::now();
  MALLE_ASSIGN_OR_RETURN(JobState s, CaptureState());
  PackedState packed = s.Pack(options_.state_direct_min_bytes);
  const int64_t bytes = packed.bytes();
  const Clock::time_point t_packed = Clock::now();
  MALLE_RETURN_IF_ERROR(options_.park_store->Write(packed, step_));
  const auto since = [](Clock::time_point t) { return absl::ToDoubleSeconds(absl::FromChrono(Clock::now() - t)); };
  const double seconds = since(t0);
  parked_ = true;
  MALLE_LOG(INFO) << "job " << job_id() << " parked at step " << step_ << " (" << bytes << " B in " << seconds
                  << " s; durable write " << since(t_packed) << " s) in " << options_.park_store->where();
  if (options_.report_sink != nullptr) {
    absl::Status st = options_.report_sink->SendParked(step_, bytes, seconds);
    if (!st.ok()) MALLE_LOG(WARNING) << "park not reported to the allocator: " << st;
  }
  return absl::OkStatus();
}

void Engine::MaybeSnapshot() {
  if (options_.park_store == nullptr || options_.snapshot_every < 0 || group_ == nullptr || group_->rank() != 0) {
    return;
  }
  const int interval = options_.snapshot_every > 0 ? options_.snapshot_every : std::max(1, snapshot_interval_);
  if (last_snapshot_try_ >= 0 && step_ - last_snapshot_try_ < interval) return;
  if (last_snapshot_try_ == step_) return;  // a redo of a step already snapshotted
  if (snapshotter_ == nullptr) snapshotter_ = std::make_unique<Snapshotter>(options_.park_store, options_.report_sink);
  if (options_.snapshot_every > 0) {
    // An interval the user set is kept: wait for the previous write (the
    // step pays it only when writes take longer than the interval).
    snapshotter_->Drain();
  } else if (snapshotter_->Busy()) {
    return;  // adaptive: the previous one is still being written, no copy now
  } else if (last_snapshot_try_ >= 0 && snapshot_copy_ > absl::ZeroDuration()) {
    // The interval set when the previous snapshot was handed over priced its
    // copy only (its write was not done yet; for the first, no write was
    // known at all: a second snapshot followed a few steps later). The write
    // is over now: price it too before taking another.
    UpdateSnapshotInterval();
    if (step_ - last_snapshot_try_ < snapshot_interval_) return;
  }
  const Clock::time_point t0 = Clock::now();
  absl::StatusOr<JobState> s = CaptureState();
  if (!s.ok()) {
    MALLE_LOG(WARNING) << "snapshot not taken: " << s.status();
    return;
  }
  PackedState copy = s->Pack(options_.state_direct_min_bytes);
  // Direct segments are views of the live buffers, which the next step
  // changes: the writer gets copies (the only cost the step pays), into
  // staging buffers kept from one snapshot to the next (fresh memory costs
  // page faults; the previous write is over, so they are free).
  snapshot_staging_.resize(copy.buffers.size());
  for (size_t i = 0; i < copy.buffers.size(); ++i) {
    if (!copy.direct[i]) continue;
    at::Tensor& st = snapshot_staging_[i];
    const at::Tensor& live = copy.buffers[i];
    if (!st.defined() || st.numel() != live.numel() || st.scalar_type() != live.scalar_type() ||
        st.device() != live.device()) {
      st = at::empty_like(live);
    }
    st.copy_(live);
    copy.buffers[i] = st;
    copy.direct[i] = false;
  }
  snapshot_copy_ = absl::FromChrono(Clock::now() - t0);
  if (snapshotter_->Offer(std::move(copy), step_)) last_snapshot_try_ = step_;
  if (options_.snapshot_every == 0) UpdateSnapshotInterval();
}

void Engine::UpdateSnapshotInterval() {
  if (step_time_ <= absl::ZeroDuration()) return;
  // Keep the snapshots under the budget: (copy + write) / interval <=
  // budget x step time. The write counts too: it runs beside training, on
  // the same cores and memory bandwidth. It counts as the CPU it took (on
  // every thread of the write): at nice 19 its wall time is how long it
  // waited for CPU that training did not want.
  const absl::Duration cost = snapshot_copy_ + snapshotter_->LastWriteCpu();
  const double steps = absl::FDivDuration(cost, step_time_) / options_.snapshot_budget;
  snapshot_interval_ = static_cast<int>(std::clamp(std::ceil(steps), 1.0, 1e6));
}

absl::Duration Engine::snapshot_write_time() const {
  if (snapshotter_ == nullptr) return absl::ZeroDuration();
  return snapshotter_->LastWrite();
}

absl::Duration Engine::snapshot_write_cpu_time() const {
  if (snapshotter_ == nullptr) return absl::ZeroDuration();
  return snapshotter_->LastWriteCpu();
}

}  // namespace malle::elastic
