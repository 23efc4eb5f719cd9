#include "libmalle/elastic/elastic_trainer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "libmalle/base/check.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/elastic/optimizer_state.h"

namespace malle::elastic {
namespace {

using comm::Transition;

constexpr int64_t kStateVersion = 1;

std::string Describe(const at::Tensor& t) {
  std::string s = c10::toString(t.scalar_type());
  absl::StrAppend(&s, "[");
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&s, i ? "," : "", t.size(i));
  absl::StrAppend(&s, "]");
  return s;
}

// The same bytes in the same order on every replica hash the same.
uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace

std::string ProgressKey(absl::string_view job_id) { return absl::StrCat(comm::JobPrefix(job_id), "progress"); }
std::string StateLayoutKey(absl::string_view job_id) { return absl::StrCat(comm::JobPrefix(job_id), "state_layout"); }

absl::Status ElasticTrainerOptions::Validate() const {
  if (logical_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("logical_workers: must be >= 1, got ", logical_workers));
  }
  if (state_direct_min_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("state_direct_min_bytes: must be >= 0, got ", state_direct_min_bytes));
  }
  if (bucket_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("bucket_bytes: must be positive, got ", bucket_bytes));
  }
  if ((steps > 0) == (epochs > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "steps/epochs: give exactly one of them (positive), got steps=", steps, ", epochs=", epochs));
  }
  if (steps < 0 || epochs < 0) {
    return absl::InvalidArgumentError(absl::StrCat("steps/epochs: must not be negative, got steps=", steps,
                                                   ", epochs=", epochs));
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

ElasticTrainer::ElasticTrainer(ElasticTrainerOptions options, ModelState model, torch::optim::Optimizer& optimizer,
                               ElasticSampler sampler)
    : options_(std::move(options)), model_(std::move(model)), optimizer_(optimizer), sampler_(std::move(sampler)) {
  total_steps_ = options_.steps > 0 ? options_.steps : sampler_.StepsForEpochs(options_.epochs);
}

ElasticTrainer::~ElasticTrainer() = default;

absl::StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::CreateCommon(ElasticTrainerOptions options,
                                                                             ModelState model,
                                                                             torch::optim::Optimizer& optimizer) {
  MALLE_RETURN_IF_ERROR(options.Validate());
  SamplerOptions so;
  so.num_samples = options.num_samples;
  so.logical_workers = options.logical_workers;
  so.batch_size = options.batch_size;
  so.seed = options.seed;
  so.shuffle = options.shuffle;
  MALLE_ASSIGN_OR_RETURN(ElasticSampler sampler, ElasticSampler::Create(so));
  if (model.parameters.empty()) return absl::InvalidArgumentError("model: has no parameters");
  std::set<const void*> mine;
  for (const auto& [name, p] : model.parameters) {
    if (!p.defined() || p.layout() != at::kStrided || !p.device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: parameter '", name, "' must be a defined, dense CPU tensor"));
    }
    mine.insert(p.unsafeGetTensorImpl());
  }
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      if (!mine.count(p.unsafeGetTensorImpl())) {
        return absl::InvalidArgumentError("optimizer: has a parameter that is not in the model");
      }
    }
  }
  if (OptimizerKind(optimizer).empty()) {
    StatePacker probe;
    MALLE_RETURN_IF_ERROR(PackOptimizer(optimizer, probe));  // kUnimplemented naming it
  }
  // Parameters and buffers live in one buffer per dtype (the same TensorImpls,
  // new storage), which a state sync sends as it is. Before the Reducer, which
  // must see the final storage.
  {
    std::vector<at::Tensor> all;
    for (const auto& [name, t] : model.parameters) all.push_back(t);
    for (const auto& [name, t] : model.buffers) all.push_back(t);
    FlattenTensors(all);
  }
  std::unique_ptr<ElasticTrainer> trainer(
      new ElasticTrainer(std::move(options), std::move(model), optimizer, std::move(sampler)));
  MALLE_RETURN_IF_ERROR(trainer->FlattenOptimizerState());  // a state loaded before, if any
  if (!trainer->options_.deterministic && trainer->options_.use_reducer) {
    MALLE_ASSIGN_OR_RETURN(trainer->reducer_,
                           GradReducer::Create(trainer->TrainedParams(), trainer->options_.bucket_bytes));
  }
  return trainer;
}

absl::StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::Create(std::shared_ptr<comm::ControlStore> store,
                                                                       comm::ElasticGroupOptions group_options,
                                                                       ElasticTrainerOptions options, ModelState model,
                                                                       torch::optim::Optimizer& optimizer) {
  if (store == nullptr) return absl::InvalidArgumentError("store: is null");
  if (group_options.bootstrap_size > options.logical_workers && options.logical_workers >= 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logical_workers: ", options.logical_workers, " is smaller than the job's starting size ",
        group_options.bootstrap_size, "; every rank needs at least one logical worker"));
  }
  MALLE_ASSIGN_OR_RETURN(auto trainer, CreateCommon(std::move(options), std::move(model), optimizer));
  group_options.max_size = std::min(group_options.max_size, trainer->options_.logical_workers);
  MALLE_RETURN_IF_ERROR(group_options.Validate());
  trainer->store_ = std::move(store);
  trainer->group_options_ = std::move(group_options);
  trainer->PrepareLanding();
  return trainer;
}

absl::StatusOr<std::unique_ptr<ElasticTrainer>> ElasticTrainer::Create(std::unique_ptr<comm::ElasticGroup> group,
                                                                       ElasticTrainerOptions options, ModelState model,
                                                                       torch::optim::Optimizer& optimizer) {
  if (group == nullptr || !group->active()) return absl::InvalidArgumentError("group: null or no longer active");
  if (group->size() > options.logical_workers) {
    return absl::InvalidArgumentError(absl::StrCat("logical_workers: ", options.logical_workers,
                                                   " is smaller than the group's size ", group->size()));
  }
  MALLE_ASSIGN_OR_RETURN(auto trainer, CreateCommon(std::move(options), std::move(model), optimizer));
  trainer->pending_ = group->last_transition();
  trainer->group_options_.job_id = group->job_id();
  trainer->group_options_.member_id = group->member_id();
  trainer->group_ = std::move(group);
  return trainer;
}

int ElasticTrainer::rank() const { return group_ ? group_->rank() : -1; }
int ElasticTrainer::size() const { return group_ ? group_->size() : 0; }
int64_t ElasticTrainer::generation() const { return group_ ? group_->generation() : -1; }
const std::string& ElasticTrainer::member_id() const {
  return group_ ? group_->member_id() : group_options_.member_id;
}

absl::Status ElasticTrainer::Track(std::string name, std::function<ExtraState()> save,
                                   std::function<absl::Status(const ExtraState&)> load) {
  if (name.empty() || !save || !load) {
    return absl::InvalidArgumentError("Track: needs a name, a save and a load function");
  }
  for (const Extra& e : extras_) {
    if (e.name == name) return absl::InvalidArgumentError(absl::StrCat("Track: '", name, "' is already tracked"));
  }
  extras_.push_back({std::move(name), std::move(save), std::move(load)});
  return absl::OkStatus();
}

absl::Status ElasticTrainer::RequestLeave() {
  if (!group_) return absl::FailedPreconditionError("RequestLeave: this member has not joined yet");
  return group_->RequestLeave();
}

// --- state ------------------------------------------------------------------

absl::StatusOr<PackedState> ElasticTrainer::PackJobState() const {
  StatePacker out(options_.state_direct_min_bytes);
  out.PutInt(kStateVersion);
  out.PutInt(options_.logical_workers);
  out.PutInt(static_cast<int64_t>(options_.seed));
  out.PutInt(static_cast<int64_t>(model_.parameters.size()));
  for (const auto& [name, t] : model_.parameters) {
    out.PutString(name);
    out.PutTensor(t);
  }
  out.PutInt(static_cast<int64_t>(model_.buffers.size()));
  for (const auto& [name, t] : model_.buffers) {
    out.PutString(name);
    out.PutTensor(t);
  }
  out.PutInt(static_cast<int64_t>(extras_.size()));
  for (const Extra& e : extras_) {
    ExtraState s = e.save();
    out.PutString(e.name);
    out.PutInt(static_cast<int64_t>(s.tensors.size()));
    for (const at::Tensor& t : s.tensors) out.PutTensor(t);
    out.PutString(s.bytes);
  }
  MALLE_RETURN_IF_ERROR(PackOptimizer(optimizer_, out));
  return std::move(out).Finish();
}

absl::Status ElasticTrainer::LoadJobState(PackedState state) {
  // A direct segment is a view of someone's own tensors. Ours (received in
  // place): keep it. Another trainer's (its PackJobState handed over in this
  // process): copy it, or the optimizers would share their state.
  std::set<const void*> own;
  for (const auto* list : {&model_.parameters, &model_.buffers}) {
    for (const auto& [name, t] : *list) {
      if (t.defined()) own.insert(t.storage().data());
    }
  }
  for (size_t i = 0; i < state.buffers.size() && i < state.direct.size(); ++i) {
    if (state.direct[i] && !own.count(state.buffers[i].storage().data())) state.buffers[i] = state.buffers[i].clone();
  }
  MALLE_ASSIGN_OR_RETURN(StateUnpacker in, StateUnpacker::Open(std::move(state)));
  MALLE_ASSIGN_OR_RETURN(int64_t version, in.Int());
  if (version != kStateVersion) {
    return absl::InvalidArgumentError(absl::StrCat("state: version ", version, " is not ", kStateVersion));
  }
  MALLE_ASSIGN_OR_RETURN(int64_t workers, in.Int());
  MALLE_ASSIGN_OR_RETURN(int64_t seed, in.Int());
  if (workers != options_.logical_workers || static_cast<uint64_t>(seed) != options_.seed) {
    return absl::InvalidArgumentError(absl::StrCat("job mismatch: state source has logical_workers=", workers,
                                                   ", seed=", static_cast<uint64_t>(seed), "; this rank has ",
                                                   options_.logical_workers, ", ", options_.seed));
  }
  // Model: read both lists, compare names, shapes and dtypes, report the first differences.
  std::vector<std::pair<std::string, at::Tensor>> theirs[2];
  for (auto& list : theirs) {
    MALLE_ASSIGN_OR_RETURN(int64_t n, in.Int());
    if (n < 0 || n > (int64_t{1} << 24)) return absl::InvalidArgumentError("state: corrupt tensor count");
    for (int64_t i = 0; i < n; ++i) {
      MALLE_ASSIGN_OR_RETURN(std::string name, in.String());
      MALLE_ASSIGN_OR_RETURN(at::Tensor t, in.Tensor());
      list.emplace_back(std::move(name), std::move(t));
    }
  }
  std::vector<std::string> diffs;
  const std::vector<std::pair<std::string, at::Tensor>>* mine[2] = {&model_.parameters, &model_.buffers};
  const char* kinds[2] = {"parameter", "buffer"};
  for (int k = 0; k < 2; ++k) {
    const size_t n = std::max(mine[k]->size(), theirs[k].size());
    for (size_t i = 0; i < n && diffs.size() < 5; ++i) {
      if (i >= mine[k]->size()) {
        diffs.push_back(absl::StrCat(kinds[k], " '", theirs[k][i].first, "' only at the source"));
      } else if (i >= theirs[k].size()) {
        diffs.push_back(absl::StrCat(kinds[k], " '", (*mine[k])[i].first, "' only on this rank"));
      } else {
        const auto& [a_name, a] = (*mine[k])[i];
        const auto& [b_name, b] = theirs[k][i];
        if (a_name != b_name || !b.defined() || a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
          diffs.push_back(absl::StrCat(kinds[k], " ", i, ": here '", a_name, "' ", Describe(a), ", source '",
                                       b_name, "' ", b.defined() ? Describe(b) : "undefined"));
        }
      }
    }
  }
  if (!diffs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model mismatch: this rank's model differs from the state source's (first differences: ",
        absl::StrJoin(diffs, "; "), "); every rank must build the same model"));
  }
  MALLE_ASSIGN_OR_RETURN(int64_t num_extras, in.Int());
  std::map<std::string, ExtraState> extras;
  for (int64_t i = 0; i < num_extras; ++i) {
    MALLE_ASSIGN_OR_RETURN(std::string name, in.String());
    MALLE_ASSIGN_OR_RETURN(int64_t nt, in.Int());
    if (nt < 0 || nt > (int64_t{1} << 24)) return absl::InvalidArgumentError("state: corrupt extra tensor count");
    ExtraState s;
    for (int64_t j = 0; j < nt; ++j) {
      MALLE_ASSIGN_OR_RETURN(at::Tensor t, in.Tensor());
      s.tensors.push_back(t.defined() ? t.clone() : t);
    }
    MALLE_ASSIGN_OR_RETURN(s.bytes, in.String());
    extras[name] = std::move(s);
  }
  for (const Extra& e : extras_) {
    if (!extras.count(e.name)) {
      return absl::InvalidArgumentError(absl::StrCat("state: tracked object '", e.name, "' is missing at the source"));
    }
  }
  // The optimizer checks everything before it changes anything.
  MALLE_RETURN_IF_ERROR(UnpackOptimizer(in, optimizer_));
  if (!in.done()) return absl::InvalidArgumentError("state: trailing bytes after the job state");
  for (int k = 0; k < 2; ++k) {
    for (size_t i = 0; i < mine[k]->size(); ++i) {
      const at::Tensor& t = (*mine[k])[i].second;
      const at::Tensor& src = theirs[k][i].second;
      if (t.data_ptr() != src.data_ptr()) t.detach().copy_(src);  // else received in place
    }
  }
  optimizer_state_count_ = optimizer_.state().size();  // views of the received segments
  for (const Extra& e : extras_) MALLE_RETURN_IF_ERROR(e.load(extras[e.name]));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ElasticTrainer::StateDigest() const {
  StatePacker out(kNeverDirect);  // a layout that depends only on the values
  for (const auto* list : {&model_.parameters, &model_.buffers}) {
    for (const auto& [name, t] : *list) {
      out.PutString(name);
      out.PutTensor(t);
    }
  }
  MALLE_RETURN_IF_ERROR(PackOptimizer(optimizer_, out));
  PackedState packed = std::move(out).Finish();
  uint64_t h = 0xcbf29ce484222325ULL;
  h = Fnv1a(h, packed.skeleton.data(), packed.skeleton.size());
  for (const at::Tensor& buffer : packed.buffers) {
    at::Tensor b = buffer.contiguous();
    h = Fnv1a(h, b.data_ptr(), b.numel() * b.element_size());
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return std::string(hex);
}

namespace {

// The ranks that need the job state from t.state_source_rank: every other
// rank at a bootstrap; else the joiners and the ranks whose committed step
// differs from the source's. Every member computes the same list from the
// transition they share.
std::vector<int> StateReceivers(const Transition& t) {
  std::vector<int> out;
  const int source = t.state_source_rank;
  for (int r = 0; r < t.size; ++r) {
    if (r == source) continue;
    const bool joined = std::find(t.joined.begin(), t.joined.end(), t.members[r]) != t.joined.end();
    if (t.kind == Transition::Kind::kBootstrap || joined || t.committed_by_rank[r] != t.committed_by_rank[source]) {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace

absl::Status ElasticTrainer::SyncState(int source, const std::vector<int>& receivers, bool in_place,
                                       int64_t* bytes, int64_t* in_place_bytes, int64_t* landed_bytes) {
  comm::Communicator& comm = group_->comm();
  *bytes = 0;
  *in_place_bytes = 0;
  *landed_bytes = 0;
  const bool receives = std::find(receivers.begin(), receivers.end(), comm.rank()) != receivers.end();
  if (comm.rank() != source && !receives) return absl::OkStatus();
  std::optional<PackedState> mine, own;
  if (comm.rank() == source) {
    MALLE_ASSIGN_OR_RETURN(PackedState packed, PackJobState());
    mine = std::move(packed);
  } else if (in_place) {
    MALLE_ASSIGN_OR_RETURN(PackedState packed, PackJobState());  // direct segments: no copy
    own = std::move(packed);
  }
  std::set<const void*> landing;
  for (const at::Tensor& b : landing_) landing.insert(b.data_ptr());
  MALLE_ASSIGN_OR_RETURN(PackedState got, TransferState(comm, source, receivers, mine ? &*mine : nullptr,
                                                        own ? &*own : nullptr, &landing_));
  *bytes = got.bytes();
  if (comm.rank() == source) return absl::OkStatus();
  for (size_t i = 0; i < got.buffers.size(); ++i) {
    const int64_t n = got.buffers[i].numel() * static_cast<int64_t>(got.buffers[i].element_size());
    if (got.direct[i]) *in_place_bytes += n;
    if (landing.count(got.buffers[i].data_ptr())) *landed_bytes += n;
  }
  return LoadJobState(std::move(got));
}

void ElasticTrainer::PrepareLanding() {
  landing_.clear();
  absl::StatusOr<std::optional<std::string>> data = store_->TryGet(StateLayoutKey(group_options_.job_id));
  if (!data.ok()) {
    MALLE_LOG(WARNING) << "state layout not read (" << data.status() << "); receiving into fresh memory";
    return;
  }
  if (!data->has_value()) return;  // a new job
  absl::StatusOr<std::vector<SegmentLayout>> expected = DecodeLayout(**data);
  absl::StatusOr<PackedState> own = PackJobState();  // direct segments: no copy
  absl::StatusOr<std::vector<SegmentLayout>> mine = own.ok() ? LayoutOf(*own) : own.status();
  if (!expected.ok() || !mine.ok()) {
    MALLE_LOG(WARNING) << "ignoring the published state layout ("
                       << (expected.ok() ? mine.status() : expected.status()) << "); receiving into fresh memory";
    return;
  }
  landing_ = LandingBuffers(*expected, *mine, options_.state_direct_min_bytes);
}

void ElasticTrainer::PublishLayout() {
  absl::StatusOr<PackedState> packed = PackJobState();
  absl::StatusOr<std::vector<SegmentLayout>> layout = packed.ok() ? LayoutOf(*packed) : packed.status();
  absl::Status s = layout.status();
  if (s.ok()) {
    std::string data = EncodeLayout(*layout);
    if (data == published_layout_) return;
    s = store_->Set(StateLayoutKey(group_->job_id()), data);
    if (s.ok()) published_layout_ = std::move(data);
  }
  if (!s.ok()) MALLE_LOG(WARNING) << "state layout not published: " << s;  // advisory
}

absl::Status ElasticTrainer::FlattenOptimizerState() {
  optimizer_state_count_ = optimizer_.state().size();
  if (optimizer_.state().empty()) return absl::OkStatus();
  // Packed by copying, one buffer per dtype holding only the optimizer's
  // tensors; UnpackOptimizer keeps views of it.
  StatePacker out(kNeverDirect);
  MALLE_RETURN_IF_ERROR(PackOptimizer(optimizer_, out));
  MALLE_ASSIGN_OR_RETURN(StateUnpacker in, StateUnpacker::Open(std::move(out).Finish()));
  return UnpackOptimizer(in, optimizer_);
}

// --- step boundary ----------------------------------------------------------

absl::Status ElasticTrainer::EnsureJoined() {
  if (group_) return absl::OkStatus();
  MALLE_ASSIGN_OR_RETURN(group_, comm::ElasticGroup::Join(store_, group_options_));
  pending_ = group_->last_transition();
  return absl::OkStatus();
}

absl::StatusOr<bool> ElasticTrainer::Boundary() {
  MALLE_RETURN_IF_ERROR(EnsureJoined());
  for (;;) {
    const absl::Time start = absl::Now();
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
      return absl::AbortedError(absl::StrCat("member ", group_->member_id(), " was declared failed by job ",
                                             group_->job_id(), ": ", t.reason,
                                             "; it must join again as a new member"));
    }
    if (!t.changed()) return true;
    absl::Status s = OnChange(t, start);
    if (s.ok()) return true;
    if (absl::IsInvalidArgument(s)) return s;  // a mismatch: retrying cannot help
    // A member died during the state sync: the next boundary recovers.
    MALLE_LOG(WARNING) << "state sync in generation " << t.generation << " failed (" << s
                       << "); recovering";
  }
}

absl::Status ElasticTrainer::OnChange(const Transition& t, absl::Time start) {
  // Nobody receives after a planned shrink or a recovery in which every
  // survivor committed the same step: no transfer at all.
  const std::vector<int> receivers = StateReceivers(t);
  const absl::Time s0 = absl::Now();
  int64_t moved = 0;
  int64_t in_place = 0;
  int64_t landed = 0;
  if (!receivers.empty()) {
    MALLE_RETURN_IF_ERROR(SyncState(t.state_source_rank, receivers, t.committed_by_rank[t.rank] < 0, &moved,
                                    &in_place, &landed));
  }
  const absl::Duration state_time = absl::Now() - s0;
  landing_.clear();  // what the first sync did not use is not needed any more
  step_ = t.resume_step;
  workers_ = AssignWorkers(options_.logical_workers, t.size, t.rank);
  ResizeEvent ev;
  ev.kind = t.kind;
  ev.generation = t.generation;
  ev.size = t.size;
  ev.rank = t.rank;
  ev.resume_step = t.resume_step;
  ev.joined = t.joined;
  ev.removed = t.removed;
  ev.state_bytes = moved;
  ev.state_in_place = in_place;
  ev.state_landed = landed;
  ev.phases = {t.phases.detect, t.phases.wait, t.phases.agree, t.phases.build, t.phases.sync, state_time,
               t.phases.total + state_time};
  ev.reason = t.reason;
  history_.push_back(std::move(ev));
  (void)start;
  MALLE_LOG(INFO) << "generation " << t.generation << ": " << comm::TransitionKindName(t.kind) << ", size "
                  << t.size << ", rank " << t.rank << ", resume at step " << t.resume_step << ", state " << moved
                  << " B in " << absl::FormatDuration(state_time);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<StepPlan>> ElasticTrainer::NextStep() {
  if (in_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("NextStep: FinishStep() was not called for step ", step_));
  }
  if (left_ || finished_) return std::optional<StepPlan>();
  RollBackFailedStep();
  if (step_ >= total_steps_ && group_ != nullptr) {
    // A last boundary, so no member exits while others still need it (a
    // member admitted now still receives the final state).
    finished_ = true;
    MALLE_ASSIGN_OR_RETURN(bool active, Boundary());
    (void)active;
    return std::optional<StepPlan>();
  }
  MALLE_ASSIGN_OR_RETURN(bool active, Boundary());
  if (!active) return std::optional<StepPlan>();
  if (step_ >= total_steps_) {
    // That boundary was the others' last one (a joiner admitted at the end,
    // or a laggard that caught up): no further boundary.
    finished_ = true;
    return std::optional<StepPlan>();
  }
  StepPlan plan;
  plan.step = step_;
  plan.generation = group_->generation();
  plan.rank = group_->rank();
  plan.size = group_->size();
  for (int k : workers_) {
    WorkerPlan w;
    w.worker = k;
    w.rng_seed = MixSeed({static_cast<int64_t>(options_.seed), step_, k});
    w.data_seed = MixSeed({static_cast<int64_t>(options_.seed), step_, k, kDataStream});
    w.indices = sampler_.Indices(step_, k);
    plan.workers.push_back(std::move(w));
  }
  ZeroGrads();
  in_step_ = true;
  begun_ = ended_ = 0;
  failed_ = false;
  // A new attempt at this step: what it changes besides parameters and optimizer state
  // (which change only when it commits) is snapshotted, so that a failed attempt leaves
  // no trace (RollBackFailedStep). Buffers: at BeginMicroBatch(0).
  if (step_ <= max_started_) ++redone_steps_;
  max_started_ = std::max(max_started_, step_);
  attempt_ = true;
  extras0_.clear();
  for (const Extra& e : extras_) extras0_.push_back(e.save());
  // The optimizer's state changes only when a step commits; its options (a
  // schedule sets the learning rate) may change after any step.
  absl::StatusOr<std::vector<std::vector<double>>> options = OptimizerOptions(optimizer_);
  if (options.ok()) optimizer_options0_ = *std::move(options);
  return std::optional<StepPlan>(std::move(plan));
}

void ElasticTrainer::RollBackFailedStep() {
  if (!attempt_) return;
  attempt_ = false;
  if (buffers0_.size() == model_.buffers.size()) {
    for (size_t i = 0; i < model_.buffers.size(); ++i) model_.buffers[i].second.detach().copy_(buffers0_[i]);
  }
  for (size_t i = 0; i < extras_.size() && i < extras0_.size(); ++i) {
    absl::Status s = extras_[i].load(extras0_[i]);
    if (!s.ok()) MALLE_LOG(WARNING) << "tracked state '" << extras_[i].name << "' not rolled back: " << s;
  }
  if (absl::Status s = SetOptimizerOptions(optimizer_, optimizer_options0_); !s.ok()) {
    MALLE_LOG(WARNING) << "optimizer options not rolled back: " << s;
  }
  buffers_w0_.clear();
}

// --- micro-batches ------------------------------------------------------------

void ElasticTrainer::BeginMicroBatch(size_t index) {
  MALLE_CHECK(in_step_ && index == begun_ && index == ended_ && index < workers_.size())
      << "BeginMicroBatch(" << index << "): micro-batches must run in plan order, each ended";
  ++begun_;
  if (reducer_ != nullptr && index + 1 == workers_.size()) {
    // The step's last micro-batch: its backward reduces the accumulated
    // gradients over this generation (nothing to reduce over once failed).
    arm_error_ = reducer_->Arm(failed_ ? nullptr : &group_->comm(),
                               static_cast<double>(options_.logical_workers));
  }
  const int worker = workers_[index];
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(MixSeed({static_cast<int64_t>(options_.seed), step_, worker}));
  }
  if (model_.buffers.empty()) return;
  if (index == 0) {
    buffers0_.clear();
    buffers_w0_.clear();
    for (const auto& [name, b] : model_.buffers) buffers0_.push_back(b.detach().clone());
    return;
  }
  if (workers_[index - 1] == 0) {
    for (const auto& [name, b] : model_.buffers) buffers_w0_.push_back(b.detach().clone());
  }
  for (size_t i = 0; i < model_.buffers.size(); ++i) model_.buffers[i].second.detach().copy_(buffers0_[i]);
}

std::vector<at::Tensor> ElasticTrainer::TrainedParams() const {
  std::vector<at::Tensor> out;
  for (const auto& [name, p] : model_.parameters) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

absl::Status ElasticTrainer::EndMicroBatch() {
  if (!in_step_ || begun_ != ended_ + 1) {
    return absl::FailedPreconditionError("EndMicroBatch: no BeginMicroBatch to end");
  }
  ++ended_;
  if (reducer_ != nullptr && ended_ == workers_.size()) {
    if (!arm_error_.ok()) return std::exchange(arm_error_, absl::OkStatus());
    absl::Status sync;
    MALLE_RETURN_IF_ERROR(reducer_->Finish(&sync));
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

void ElasticTrainer::MarkFailed(const absl::Status& why) {
  if (!failed_) {
    MALLE_LOG(WARNING) << "step " << step_ << ": gradient sync failed (" << why << "); the step will be redone";
  }
  failed_ = true;
}

void ElasticTrainer::ZeroGrads() {
  for (auto& [name, p] : model_.parameters) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

bool ElasticTrainer::ReduceBuckets() {
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
  const double n = static_cast<double>(options_.logical_workers);
  for (Bucket& b : buckets) {
    at::Tensor flat = b.flat.front();
    flat.div_(n);
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

bool ElasticTrainer::ReduceRows() {
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

bool ElasticTrainer::SyncBuffers() {
  if (model_.buffers.empty()) return true;
  const bool has_worker0 = std::find(workers_.begin(), workers_.end(), 0) != workers_.end();
  if (has_worker0 && !buffers_w0_.empty()) {
    for (size_t i = 0; i < model_.buffers.size(); ++i) model_.buffers[i].second.detach().copy_(buffers_w0_[i]);
  }
  // One flat broadcast per dtype from rank 0 (which always runs worker 0).
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& [name, b] : model_.buffers) by_dtype[b.scalar_type()].push_back(b);
  for (auto& [dtype, list] : by_dtype) {
    int64_t numel = 0;
    for (const at::Tensor& b : list) numel += b.numel();
    at::Tensor flat = at::empty({numel}, list.front().options());
    int64_t off = 0;
    for (const at::Tensor& b : list) {
      flat.narrow(0, off, b.numel()).copy_(b.detach().reshape({-1}));
      off += b.numel();
    }
    at::Tensor wire = dtype == at::kBool ? flat.view(at::kByte) : flat;
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

absl::StatusOr<bool> ElasticTrainer::FinishStep() {
  if (!in_step_) return absl::FailedPreconditionError("FinishStep: no step in progress (call NextStep)");
  if (ended_ != workers_.size() || begun_ != ended_) {
    return absl::FailedPreconditionError(absl::StrCat("FinishStep: ", ended_, " of ", workers_.size(),
                                                      " micro-batches of step ", step_, " ran"));
  }
  in_step_ = false;
  // With the Reducer the gradients were reduced during the last backward.
  bool ok = options_.deterministic ? ReduceRows() : reducer_ != nullptr ? !failed_ : ReduceBuckets();
  if (ok) ok = SyncBuffers();
  if (!ok) {
    ZeroGrads();
    return false;  // not committed: the next boundary recovers and redoes the step
  }
  // The gradients are reduced: the next boundary's vote goes now and completes
  // while the optimizer runs (one synchronisation per step, not two).
  MALLE_RETURN_IF_ERROR(group_->BeginStepBoundary());
  optimizer_.step();
  if (optimizer_.state().size() != optimizer_state_count_) {
    // New state tensors (Adam's moments after its first step): one buffer per
    // dtype, so a state sync sends them without packing.
    absl::Status flat = FlattenOptimizerState();
    if (!flat.ok()) MALLE_LOG(WARNING) << "optimizer state not flattened: " << flat;  // only slower syncs
    if (store_ != nullptr && group_->rank() == 0) PublishLayout();
  }
  group_->Commit(step_);
  attempt_ = false;
  ++step_;
  if (options_.publish_progress && store_ != nullptr && group_->rank() == 0) {
    absl::Status s = store_->Set(ProgressKey(group_->job_id()), absl::StrCat(step_));
    if (!s.ok()) MALLE_LOG(DEBUG) << "progress key not written: " << s;  // advisory
  }
  return true;
}

}  // namespace malle::elastic
