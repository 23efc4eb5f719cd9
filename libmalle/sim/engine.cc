#include "libmalle/sim/engine.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libmalle/alloc/problem.h"
#include "libmalle/base/check.h"
#include "libmalle/base/status_macros.h"

namespace malle::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Idle fragments kept for the estimated forecast (the most recent ones), and
// how many must have been seen before it says anything.
constexpr size_t kFragmentMemory = 4096;
constexpr size_t kMinFragments = 32;

double Sec(absl::Duration d) { return absl::ToDoubleSeconds(d); }

struct JobState {
  const MixJob* mix = nullptr;
  double submit = 0;  // replay seconds
  int rank = 0;       // position in submit order (FIFO), ties by mix order
  bool submitted = false, finished = false;
  double done = 0;
  std::vector<int> nodes;  // held, in holding order
  // The factor on the curve's rate the held nodes give (Replay::SpeedOf): 1
  // without node classes.
  double speed = 1.0;
  double paused_until = -kInf;
  double size_since = 0;           // when the current size started
  std::map<int, double> observed;  // learned mode: size -> measured rate
  // Preemption accounting (SimOptions::preemption): whether the park store
  // holds a state to resume from (a park, or a snapshot in kSnapshot mode),
  // and in kSnapshot mode the progress at the last snapshot and when the
  // next one is taken (replay seconds).
  bool stored = false;
  double snap_done = 0;
  double next_snap = kInf;
  JobOutcome out;
};

absl::Status ValidatePreemption(const PreemptionCostOptions& p) {
  auto positive = [](double v, const char* field) -> absl::Status {
    if (!(std::isfinite(v) && v > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("preemption.", field, ": must be finite and > 0, got ", v));
    }
    return absl::OkStatus();
  };
  auto duration = [](absl::Duration d, const char* field) -> absl::Status {
    if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "preemption.", field, ": must be finite and >= 0, got ", absl::FormatDuration(d)));
    }
    return absl::OkStatus();
  };
  switch (p.mode) {
    case PreemptionCost::kFree:
    case PreemptionCost::kPark:
    case PreemptionCost::kSnapshot:
    case PreemptionCost::kRestart:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("preemption.mode: ", static_cast<int>(p.mode), " is not a PreemptionCost"));
  }
  if (!(std::isfinite(p.state_bytes) && p.state_bytes >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("preemption.state_bytes: must be finite and >= 0, got ", p.state_bytes));
  }
  MALLE_RETURN_IF_ERROR(positive(p.write_bytes_per_s, "write_bytes_per_s"));
  MALLE_RETURN_IF_ERROR(positive(p.read_bytes_per_s, "read_bytes_per_s"));
  MALLE_RETURN_IF_ERROR(positive(p.copy_bytes_per_s, "copy_bytes_per_s"));
  MALLE_RETURN_IF_ERROR(duration(p.park_fixed, "park_fixed"));
  MALLE_RETURN_IF_ERROR(duration(p.unpark_fixed, "unpark_fixed"));
  MALLE_RETURN_IF_ERROR(duration(p.snapshot_interval, "snapshot_interval"));
  if (!(p.snapshot_budget > 0 && p.snapshot_budget < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("preemption.snapshot_budget: must be in (0, 1), got ", p.snapshot_budget));
  }
  if (p.mode == PreemptionCost::kSnapshot && p.SnapshotInterval() <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "preemption.snapshot_interval: the adaptive interval is 0 (state_bytes = 0); give one "
        "> 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const SimOptions& o) {
  if (o.max_waiting < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_waiting: must be >= 0, got ", o.max_waiting));
  }
  if (o.max_jobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_jobs: must be >= 0 (0 = no limit), got ", o.max_jobs));
  }
  if (o.debounce < absl::ZeroDuration() || o.debounce == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("debounce: must be finite and >= 0, got ", absl::FormatDuration(o.debounce)));
  }
  if (o.forward_window <= absl::ZeroDuration() || o.forward_window == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("forward_window: must be finite and > 0, got ",
                                                   absl::FormatDuration(o.forward_window)));
  }
  if (o.timeline_step <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("timeline_step: must be > 0, got ",
                                                   absl::FormatDuration(o.timeline_step)));
  }
  if (o.learned_warmup < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("learned_warmup: must be >= 0, got ",
                                                   absl::FormatDuration(o.learned_warmup)));
  }
  if (o.skip_snapshots < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("skip_snapshots: must be >= 0, got ", o.skip_snapshots));
  }
  if (!std::isfinite(o.resize_hysteresis) || o.resize_hysteresis < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("resize_hysteresis: must be finite and >= 1, got ", o.resize_hysteresis));
  }
  if (!std::isfinite(o.rank_weight_exponent) || o.rank_weight_exponent < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank_weight_exponent: must be finite and >= 0, got ", o.rank_weight_exponent));
  }
  if (std::string why = alloc::RankAgingProblem(o.rank_aging, o.rank_weight_exponent);
      !why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("rank_aging: ", why));
  }
  if (o.start >= o.end) return absl::InvalidArgumentError("start: must be before end");
  if (!(o.cross_locality_factor > 0 && o.cross_locality_factor <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cross_locality_factor: must be in (0, 1], got ", o.cross_locality_factor));
  }
  double shares = 0;
  absl::flat_hash_set<std::string> class_ids;
  for (size_t k = 0; k < o.node_classes.size(); ++k) {
    const NodeClassShare& c = o.node_classes[k];
    const std::string field = absl::StrCat("node_classes[", k, "]");
    if (c.node_class.id.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".id: must not be empty"));
    }
    if (!class_ids.insert(c.node_class.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".id: \"", c.node_class.id, "\" names two classes"));
    }
    if (!(std::isfinite(c.node_class.speed) && c.node_class.speed > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(field, " (", c.node_class.id,
                                                     ").speed: must be finite and > 0, got ",
                                                     c.node_class.speed));
    }
    if (!(std::isfinite(c.share) && c.share > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " (", c.node_class.id, ").share: must be finite and > 0, got ", c.share));
    }
    shares += c.share;
  }
  if (!o.node_classes.empty() && std::abs(shares - 1) > 1e-9) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_classes: the shares must sum to 1, they sum to ", shares));
  }
  return ValidatePreemption(o.preemption);
}

// The replay. Per-step work is O(running jobs), never O(all jobs) nor
// O(machine nodes): running jobs are kept in `running_`, waiting jobs in
// `waiting_` (both keyed by submit rank), so a 1,000-job mix on a
// 4,600-node machine costs what its running jobs and idle nodes cost.
class Replay {
 public:
  Replay(const IdleTrace& trace, const std::vector<MixJob>& jobs, const SimOptions& options)
      : trace_(trace), options_(options) {
    jobs_.resize(jobs.size());
    for (size_t j = 0; j < jobs.size(); ++j) jobs_[j].mix = &jobs[j];
  }

  absl::StatusOr<SimResult> Run();

 private:
  // Samples/s of job j on n nodes whose class factor is `speed` (SpeedOf).
  static double Rate(const JobState& j, int n, double speed) {
    return alloc::Interpolate(j.mix->throughput, n) * speed;
  }
  // At the nodes the job holds now.
  static double RateNow(const JobState& j) {
    return Rate(j, static_cast<int>(j.nodes.size()), j.speed);
  }
  // The smallest speed among `nodes`, times the cross-locality factor when
  // they span several groups (SimOptions::node_classes); 1 without classes.
  double SpeedOf(const std::vector<int>& nodes) const;
  void Advance(double to);
  void Record(const char* kind, int job, int node, int before, int after, double ms = 0);
  // `forced`: a reclaim, not the policy's decision (for the loss split).
  // `speed_before`: the factor of the nodes held before (j.speed is the
  // new one's).
  void ChargeResize(JobState& j, int before, double speed_before, int after, bool forced);
  // What a stop costs (SimOptions::preemption), `before` = nodes held before,
  // at factor `speed_before`.
  void ChargeStop(JobState& j, int before, double speed_before);
  // What a restart costs (reading the stored state), `after` = nodes now.
  void ChargeRestart(JobState& j, int after);
  void TakeSnapshots(JobState& j, double r, double to);
  void ReleaseAll(int job);
  void StartRunning(int job);
  void StopRunning(int job, bool wait_again);
  alloc::Curve CurveFor(const JobState& j) const;
  absl::Duration EstimatedIdle(int node);
  absl::Status Decide();
  double FinishTime(const JobState& j) const;
  void FinishJobs();
  void ApplyTraceEvents(size_t& ev, const std::vector<size_t>& next_of_node);
  void NoteIdle(int node, double t, size_t ev, const std::vector<size_t>& next_of_node);
  void AddFragment(double length);
  absl::Duration ForecastIdle(int node);
  void Summarise(double ideal);

  const IdleTrace& trace_;
  const SimOptions& options_;
  std::vector<JobState> jobs_;
  std::vector<int> by_rank_;     // job index by submit rank
  std::set<int> running_;        // ranks of jobs holding nodes
  std::set<int> waiting_;        // ranks of submitted jobs holding none (FIFO)
  absl::Time origin_;            // replay second 0
  double now_ = 0, end_ = 0;
  std::vector<char> idle_;
  std::vector<int> holder_;      // job index holding each node, -1 if none
  // Per node: its class in SimOptions::node_classes (empty without classes)
  // and that class's locality group, numbered.
  std::vector<int> node_class_, node_group_;
  absl::flat_hash_map<std::string, int> node_index_;
  std::vector<double> idle_since_;
  std::vector<double> next_busy_;  // oracle forecast, per node (replay seconds)
  std::vector<double> next_busy_announced_;  // when that reclaim was announced
  std::deque<double> fragments_;   // estimated forecast: recent idle fragment lengths
  std::vector<double> sorted_fragments_;
  bool fragments_dirty_ = false;
  int idle_count_ = 0, used_count_ = 0;
  double idle_node_s_ = 0, used_node_s_ = 0;
  // While jobs are present (submitted, unfinished): what they could use (sum
  // of max_nodes), how many there are, and the integrals behind the
  // summary's active_* and contended_fraction.
  long long demand_ = 0;
  int present_ = 0;
  double active_s_ = 0, active_idle_node_s_ = 0, active_used_node_s_ = 0, contended_s_ = 0;
  // The machine's reclaim history (SimOptions::reclaim_hazard): idle
  // node-seconds seen before the replay start, and reclaims of idle nodes.
  double history_idle_node_s_ = 0;
  long long reclaims_seen_ = 0;
  std::vector<double> latencies_ms_;
  SimResult result_;
  Summary& summary_ = result_.summary;
};

void Replay::Record(const char* kind, int job, int node, int before, int after, double ms) {
  if (!options_.record_events) return;
  EventRecord e;
  e.time = origin_ + absl::Seconds(now_);
  e.kind = kind;
  if (job >= 0) e.job = jobs_[job].mix->name;
  if (node >= 0) e.node = trace_.nodes[node];
  e.nodes_before = before;
  e.nodes_after = after;
  e.idle_nodes = idle_count_;
  e.used_nodes = used_count_;
  e.decision_ms = ms;
  result_.events.push_back(std::move(e));
}

void Replay::Advance(double to) {
  const double dt = to - now_;
  if (dt <= 0) return;
  idle_node_s_ += idle_count_ * dt;
  used_node_s_ += used_count_ * dt;
  if (present_ > 0) {
    active_s_ += dt;
    active_idle_node_s_ += idle_count_ * dt;
    active_used_node_s_ += used_count_ * dt;
    if (demand_ > idle_count_) contended_s_ += dt;
  }
  const double warmup = Sec(options_.learned_warmup);
  for (int rank : running_) {
    JobState& j = jobs_[by_rank_[rank]];
    const int n = static_cast<int>(j.nodes.size());
    const double r = RateNow(j);
    const double training = to - std::max(now_, std::min(to, j.paused_until));
    if (j.next_snap <= to) TakeSnapshots(j, r, to);
    j.done += r * std::max(0.0, training);
    j.out.ideal_samples += r * dt;
    j.out.node_seconds += n * dt;
    if (options_.curves == CurveMode::kLearned && to - j.size_since >= warmup) {
      // What the job's own step timer would report, per unit of speed (the
      // allocator applies the nodes' classes to the curve).
      j.observed[n] = r / j.speed;
    }
  }
  now_ = to;
}

double Replay::SpeedOf(const std::vector<int>& nodes) const {
  if (node_class_.empty() || nodes.empty()) return 1.0;
  double speed = kInf;
  bool one_group = true;
  for (int node : nodes) {
    speed = std::min(speed, options_.node_classes[node_class_[node]].node_class.speed);
    one_group = one_group && node_group_[node] == node_group_[nodes[0]];
  }
  return one_group ? speed : speed * options_.cross_locality_factor;
}

void Replay::ChargeResize(JobState& j, int before, double speed_before, int after, bool forced) {
  const double pause = Sec(after > before ? j.mix->rescale_up : j.mix->rescale_down);
  double lost = 0;
  if (options_.accounting == Accounting::kBftrainer) {
    lost = Rate(j, before, speed_before) * pause;  // r(0) = 0: a start is free
    j.done -= lost;
  } else {
    // Training stops for the pause (at the new size; a pause still running
    // is cut short by the new one).
    lost = Rate(j, after, j.speed) * pause;
    j.paused_until = now_ + pause;
  }
  (forced ? summary_.lost_to_reclaims : summary_.lost_to_resizes) += lost;
  j.size_since = now_;
}

// The snapshots a running job takes in (now_, to] (kSnapshot mode): each
// costs the step its copy (r x copy time); the last one is what a stop falls
// back to. Called before Advance adds the training of (now_, to].
void Replay::TakeSnapshots(JobState& j, double r, double to) {
  const double interval = Sec(options_.preemption.SnapshotInterval());
  const double copy = Sec(options_.preemption.SnapshotCopyTime());
  const double last = j.next_snap + std::floor((to - j.next_snap) / interval) * interval;
  const double count = std::floor((to - j.next_snap) / interval) + 1;
  const double copies = r * copy * count;
  j.done -= copies;
  summary_.lost_to_snapshots += copies;
  const double trained = last - std::max(now_, std::min(last, j.paused_until));
  j.snap_done = j.done + r * std::max(0.0, trained);
  j.next_snap = last + interval;
  j.stored = true;
}

void Replay::ChargeStop(JobState& j, int before, double speed_before) {
  const PreemptionCostOptions& p = options_.preemption;
  double lost = 0;
  switch (p.mode) {
    case PreemptionCost::kFree:
      break;
    case PreemptionCost::kPark:
      // The last member writes the state while it still trains nothing more.
      lost = Rate(j, before, speed_before) * Sec(p.ParkTime());
      j.stored = true;
      break;
    case PreemptionCost::kSnapshot:
      // Back to the last snapshot (the start's state if none was taken since).
      lost = std::max(0.0, j.done - j.snap_done);
      break;
    case PreemptionCost::kRestart:
      lost = std::max(0.0, j.done);
      j.stored = false;
      break;
  }
  j.done -= lost;
  j.next_snap = kInf;
  j.out.lost_to_preemptions += lost;
  summary_.lost_to_preemptions += lost;
}

void Replay::ChargeRestart(JobState& j, int after) {
  const PreemptionCostOptions& p = options_.preemption;
  if (p.mode == PreemptionCost::kSnapshot) {
    j.snap_done = j.done;  // what it resumes from is its newest snapshot
    j.next_snap = now_ + Sec(p.SnapshotInterval());
  }
  if (!j.stored || (p.mode != PreemptionCost::kPark && p.mode != PreemptionCost::kSnapshot)) {
    return;
  }
  const double unpark = Sec(p.UnparkTime());
  const double lost = Rate(j, after, j.speed) * unpark;
  if (options_.accounting == Accounting::kBftrainer) {
    j.done -= lost;
    if (p.mode == PreemptionCost::kSnapshot) j.snap_done = j.done;
  } else {
    j.paused_until = std::max(j.paused_until, now_) + unpark;
  }
  j.out.lost_to_preemptions += lost;
  summary_.lost_to_preemptions += lost;
}

void Replay::ReleaseAll(int job) {
  for (int node : jobs_[job].nodes) {
    holder_[node] = -1;
    --used_count_;
  }
  jobs_[job].nodes.clear();
  jobs_[job].speed = 1.0;
}

void Replay::StartRunning(int job) {
  waiting_.erase(jobs_[job].rank);
  running_.insert(jobs_[job].rank);
}

void Replay::StopRunning(int job, bool wait_again) {
  running_.erase(jobs_[job].rank);
  if (wait_again) waiting_.insert(jobs_[job].rank);
}

// When the job reaches its work at its current size (kInf if never).
double Replay::FinishTime(const JobState& j) const {
  const double r = RateNow(j);
  if (r <= 0) return kInf;
  return std::max(now_, j.paused_until) + std::max(0.0, j.mix->work_samples - j.done) / r;
}

void Replay::FinishJobs() {
  std::vector<int> finished;
  for (int rank : running_) {
    const int j = by_rank_[rank];
    const JobState& s = jobs_[j];
    // The second test guarantees progress when the remaining time is below
    // the resolution of `now_`.
    if (s.done >= s.mix->work_samples * (1 - 1e-12) || FinishTime(s) <= now_) {
      finished.push_back(j);
    }
  }
  for (int j : finished) {
    JobState& s = jobs_[j];
    s.finished = true;
    s.out.finish = origin_ + absl::Seconds(now_);
    --present_;
    demand_ -= s.mix->max_nodes;
    ++summary_.jobs_finished;
    const int n = static_cast<int>(s.nodes.size());
    ReleaseAll(j);
    StopRunning(j, /*wait_again=*/false);
    Record("finish", j, -1, n, 0);
  }
}

alloc::Curve Replay::CurveFor(const JobState& j) const {
  if (options_.curves == CurveMode::kOracle) return j.mix->throughput;
  const int lo = j.mix->min_nodes, hi = j.mix->max_nodes;
  std::map<int, double> points;
  if (options_.curves == CurveMode::kLearned) points = j.observed;
  if (points.empty()) points[lo] = Rate(j, lo, 1.0);  // a never-run job: one number, linear
  // Beyond the observed sizes: the nearest observation's per-node rate.
  const auto first = *points.begin();
  const auto last = *points.rbegin();
  if (lo < first.first) points[lo] = first.second * lo / first.first;
  if (hi > last.first) points[hi] = last.second * hi / last.first;
  alloc::Curve curve;
  curve.reserve(points.size());
  for (const auto& [n, r] : points) curve.push_back({n, r});
  return curve;
}

void Replay::AddFragment(double length) {
  if (options_.forecast != ForecastMode::kEstimated) return;
  fragments_.push_back(length);
  if (fragments_.size() > kFragmentMemory) fragments_.pop_front();
  fragments_dirty_ = true;
}

// Median remaining length of the past fragments that lasted longer than this
// node has been idle so far; unknown (infinite) until enough were seen or
// when none lasted that long.
absl::Duration Replay::EstimatedIdle(int node) {
  if (fragments_.size() < kMinFragments) return absl::InfiniteDuration();
  if (fragments_dirty_) {
    sorted_fragments_.assign(fragments_.begin(), fragments_.end());
    std::sort(sorted_fragments_.begin(), sorted_fragments_.end());
    fragments_dirty_ = false;
  }
  const double age = now_ - idle_since_[node];
  auto it = std::upper_bound(sorted_fragments_.begin(), sorted_fragments_.end(), age);
  const size_t longer = sorted_fragments_.end() - it;
  if (longer == 0) return absl::InfiniteDuration();
  return absl::Seconds(*(it + longer / 2) - age);
}

absl::Status Replay::Decide() {
  // Running jobs and the first max_waiting waiting ones, in submit order;
  // with max_jobs, only waiting jobs among the first max_jobs unfinished
  // ones. Running jobs are always among those (a job starts only when it is,
  // and the jobs ahead of it can only finish), so none is ever left out.
  std::vector<int> ranks(running_.begin(), running_.end());
  {
    int taken = 0;
    for (auto it = waiting_.begin(); it != waiting_.end() && taken < options_.max_waiting;
         ++it, ++taken) {
      if (options_.max_jobs > 0) {
        const auto running_ahead = std::distance(running_.begin(), running_.lower_bound(*it));
        if (running_ahead + taken >= options_.max_jobs) break;
      }
      ranks.push_back(*it);
    }
    std::sort(ranks.begin(), ranks.end());
  }
  if (ranks.empty()) return absl::OkStatus();  // nothing any policy could change

  alloc::Problem problem;
  problem.forward_window = options_.forward_window;
  problem.objective = options_.objective;
  problem.resize_cost = options_.resize_cost;
  problem.resize_hysteresis = options_.resize_hysteresis;
  problem.rank_weight_exponent = options_.rank_weight_exponent;
  problem.rank_aging = options_.rank_aging;
  if (options_.reclaim_hazard && reclaims_seen_ >= 32) {
    // Idle node-seconds so far: the history before the start and the replay.
    const double idle_s = history_idle_node_s_ + idle_node_s_;
    if (idle_s > 0) problem.reclaim_rate = reclaims_seen_ / idle_s;
  }
  problem.cross_locality_factor = options_.cross_locality_factor;
  for (const NodeClassShare& c : options_.node_classes) problem.classes.push_back(c.node_class);
  problem.nodes.reserve(idle_count_);
  for (size_t n = 0; n < idle_.size(); ++n) {
    if (!idle_[n]) continue;
    alloc::Node node;
    node.id = trace_.nodes[n];
    if (!node_class_.empty()) {
      node.class_id = options_.node_classes[node_class_[n]].node_class.id;
    }
    node.expected_idle = ForecastIdle(static_cast<int>(n));
    problem.nodes.push_back(std::move(node));
  }
  std::vector<int> considered;
  considered.reserve(ranks.size());
  problem.jobs.reserve(ranks.size());
  for (int rank : ranks) {
    const int j = by_rank_[rank];
    const JobState& s = jobs_[j];
    considered.push_back(j);
    alloc::JobSpec spec = ToJobSpec(*s.mix);
    if (options_.curves != CurveMode::kOracle) spec.throughput = CurveFor(s);
    // At least one sample: a job is finished (and not considered) once done.
    spec.remaining_samples = std::max(1.0, s.mix->work_samples - s.done);
    spec.age = absl::Seconds(std::max(0.0, now_ - s.submit));
    spec.current_nodes.reserve(s.nodes.size());
    for (int node : s.nodes) spec.current_nodes.push_back(trace_.nodes[node]);
    problem.jobs.push_back(std::move(spec));
  }

  const absl::Time t0 = absl::Now();
  absl::StatusOr<alloc::Decision> decision = alloc::Decide(problem, options_.decide);
  const absl::Duration took = absl::Now() - t0;
  const double ms = absl::ToDoubleMilliseconds(took);
  if (!decision.ok()) {
    return absl::Status(decision.status().code(),
                        absl::StrCat("decision at ", absl::FormatTime(origin_ + absl::Seconds(now_)),
                                     ": ", decision.status().message()));
  }
  latencies_ms_.push_back(ms);
  ++summary_.decisions;
  if (decision->result.fell_back && ++summary_.decisions_fell_back == 1) {
    summary_.first_fallback_reason = decision->result.reason;
  }
  Record("decide", -1, -1, 0, 0, ms);
  if (options_.on_decision) options_.on_decision(problem, *decision, took);
  // Two passes: a node one job releases may be taken by a job listed before
  // it, so every release happens before any take.
  std::vector<int> before(considered.size());
  std::vector<double> speed_before(considered.size());
  for (size_t k = 0; k < considered.size(); ++k) {
    const int j = considered[k];
    before[k] = static_cast<int>(jobs_[j].nodes.size());
    speed_before[k] = jobs_[j].speed;
    if (decision->allocation.jobs[k].nodes.size() != jobs_[j].nodes.size()) ReleaseAll(j);
  }
  for (size_t k = 0; k < considered.size(); ++k) {
    const int j = considered[k];
    JobState& s = jobs_[j];
    const alloc::JobAllocation& a = decision->allocation.jobs[k];
    const int after = static_cast<int>(a.nodes.size());
    if (before[k] == after) continue;
    for (const std::string& id : a.nodes) {
      const int node = node_index_.at(id);
      MALLE_CHECK(holder_[node] == -1) << "node " << id << " given to two jobs";
      MALLE_CHECK(idle_[node]) << "node " << id << " is busy";
      holder_[node] = j;
      ++used_count_;
      s.nodes.push_back(node);
    }
    s.speed = SpeedOf(s.nodes);
    ChargeResize(s, before[k], speed_before[k], after, /*forced=*/false);
    ++s.out.resizes;
    ++summary_.resizes;
    if (before[k] == 0) {
      ChargeRestart(s, after);
      StartRunning(j);
      if (s.out.first_start == absl::InfiniteFuture()) {
        s.out.first_start = origin_ + absl::Seconds(now_);
      }
    } else if (after == 0) {
      ChargeStop(s, before[k], speed_before[k]);
      StopRunning(j, /*wait_again=*/true);
      ++s.out.stops;
      ++summary_.stops;
    }
    Record("resize", j, -1, before[k], after);
  }
  return absl::OkStatus();
}

// Applies every trace event at `now_`. Nodes reclaimed from one job at one
// time are one forced shrink: the job sees one membership change and pays
// one down pause, whatever the number of nodes it lost.
void Replay::ApplyTraceEvents(size_t& ev, const std::vector<size_t>& next_of_node) {
  struct Shrunk {
    int job, before;  // nodes before this time
    double speed_before;
  };
  std::vector<Shrunk> shrunk;
  for (; ev < trace_.events.size() && Sec(trace_.events[ev].time - origin_) <= now_; ++ev) {
    const IdleEvent& e = trace_.events[ev];
    const int node = e.node;
    if (e.idle) {
      if (!idle_[node]) ++idle_count_;
      idle_[node] = 1;
      NoteIdle(node, now_, ev, next_of_node);
      Record("idle", -1, node, 0, 0);
      continue;
    }
    if (idle_[node]) {
      --idle_count_;
      ++reclaims_seen_;
      AddFragment(now_ - idle_since_[node]);
    }
    idle_[node] = 0;
    const int j = holder_[node];
    if (j >= 0) {
      JobState& s = jobs_[j];
      const int n = static_cast<int>(s.nodes.size());
      if (std::none_of(shrunk.begin(), shrunk.end(), [j](const Shrunk& p) { return p.job == j; })) {
        shrunk.push_back({j, n, s.speed});
      }
      s.nodes.erase(std::find(s.nodes.begin(), s.nodes.end(), node));
      holder_[node] = -1;
      --used_count_;
      ++s.out.reclaims;
      ++summary_.reclaims;
      Record("reclaim", j, node, n, n - 1);
    }
    Record("busy", -1, node, 0, 0);
  }
  for (const auto& [j, before, speed_before] : shrunk) {
    JobState& s = jobs_[j];
    const int after = static_cast<int>(s.nodes.size());
    s.speed = SpeedOf(s.nodes);
    ChargeResize(s, before, speed_before, after, /*forced=*/true);
    // A preemption: the job pays what SimOptions::preemption says (at the
    // size it had before the reclaim: its last member parks while it still
    // holds the nodes' grace period) and waits.
    if (after < s.mix->min_nodes) {
      ChargeStop(s, before, speed_before);
      ReleaseAll(j);
      StopRunning(j, /*wait_again=*/true);
      ++s.out.preemptions;
      ++summary_.preemptions;
      Record("preempt", j, -1, after, 0);
    }
  }
}

// A node became idle at `t` (trace event `ev`): when its next reclaim comes
// and when that reclaim was announced, for the forecasts.
void Replay::NoteIdle(int node, double t, size_t ev, const std::vector<size_t>& next_of_node) {
  idle_since_[node] = t;
  const size_t next = next_of_node[ev];
  if (next < trace_.events.size()) {
    next_busy_[node] = Sec(trace_.events[next].time - origin_);
    const absl::Time announced = trace_.events[next].announced;
    next_busy_announced_[node] =
        announced == absl::InfiniteFuture() ? kInf : Sec(announced - origin_);
  } else {
    next_busy_[node] = kInf;
    next_busy_announced_[node] = kInf;
  }
}

// What the policy is told of how long `node` stays idle (ForecastMode).
absl::Duration Replay::ForecastIdle(int node) {
  switch (options_.forecast) {
    case ForecastMode::kNone:
      return absl::InfiniteDuration();
    case ForecastMode::kOracle:
      if (!std::isfinite(next_busy_[node])) return absl::InfiniteDuration();
      return absl::Seconds(std::max(0.0, next_busy_[node] - now_));
    case ForecastMode::kReservation:
      // Known once announced (the job that takes the node is queued).
      if (!std::isfinite(next_busy_[node]) || next_busy_announced_[node] > now_) {
        return absl::InfiniteDuration();
      }
      return absl::Seconds(std::max(0.0, next_busy_[node] - now_));
    case ForecastMode::kEstimated:
      return EstimatedIdle(node);
  }
  return absl::InfiniteDuration();
}

// The summary's figures from what the replay accumulated, and the warnings
// for results that cannot be right or say little.
void Replay::Summarise(double ideal) {
  std::vector<double> jct;
  double first_arrival = kInf, last_finish = -kInf;
  for (const JobState& s : jobs_) {
    first_arrival = std::min(first_arrival, s.submit);
    if (!s.finished) continue;
    const double finish = Sec(s.out.finish - origin_);
    jct.push_back(finish - s.submit);
    last_finish = std::max(last_finish, finish);
  }
  if (!jct.empty()) {
    double sum = 0;
    for (double v : jct) sum += v;
    summary_.jct_mean_s = sum / jct.size();
    std::sort(jct.begin(), jct.end());
    const size_t m = jct.size() / 2;
    summary_.jct_median_s = jct.size() % 2 == 1 ? jct[m] : (jct[m - 1] + jct[m]) / 2;
    const size_t rank = static_cast<size_t>(std::ceil(0.95 * jct.size()));
    summary_.jct_p95_s = jct[std::max<size_t>(rank, 1) - 1];
    summary_.jct_max_s = jct.back();
  }
  if (!jobs_.empty() && jct.size() == jobs_.size()) {
    summary_.makespan_s = last_finish - first_arrival;
  }
  summary_.policy = std::string(alloc::PolicyName(options_.decide.policy));
  {
    const PreemptionCostOptions& p = options_.preemption;
    switch (p.mode) {
      case PreemptionCost::kFree:
        summary_.preemption_cost = "free (a stop keeps the job's progress)";
        break;
      case PreemptionCost::kPark:
        summary_.preemption_cost =
            absl::StrFormat("park (%.3g MB state: park %.2f s, unpark %.2f s)", p.state_bytes / 1e6,
                            Sec(p.ParkTime()), Sec(p.UnparkTime()));
        break;
      case PreemptionCost::kSnapshot:
        summary_.preemption_cost = absl::StrFormat(
            "snapshot (%.3g MB state: a snapshot every %.1f s, copy %.2f s; a stop loses the "
            "progress since; unpark %.2f s)",
            p.state_bytes / 1e6, Sec(p.SnapshotInterval()), Sec(p.SnapshotCopyTime()),
            Sec(p.UnparkTime()));
        break;
      case PreemptionCost::kRestart:
        summary_.preemption_cost = "restart (a stop loses all progress)";
        break;
    }
  }
  summary_.idle_node_hours = idle_node_s_ / 3600;
  summary_.used_node_hours = used_node_s_ / 3600;
  summary_.efficiency = ideal > 0 ? summary_.samples_trained / ideal : 0;
  summary_.utilisation = idle_node_s_ > 0 ? used_node_s_ / idle_node_s_ : 0;
  if (used_node_s_ > 0)
    summary_.samples_per_node_hour = summary_.samples_trained / (used_node_s_ / 3600);
  summary_.active_hours = active_s_ / 3600;
  summary_.active_idle_node_hours = active_idle_node_s_ / 3600;
  if (active_idle_node_s_ > 0)
    summary_.active_utilisation = active_used_node_s_ / active_idle_node_s_;
  if (active_s_ > 0) summary_.contended_fraction = contended_s_ / active_s_;
  if (!latencies_ms_.empty()) {
    std::sort(latencies_ms_.begin(), latencies_ms_.end());
    auto at = [&](double q) {
      const size_t k = static_cast<size_t>(std::ceil(q * latencies_ms_.size())) - 1;
      return latencies_ms_[std::min(k, latencies_ms_.size() - 1)];
    };
    summary_.decision_p50_ms = at(0.5);
    summary_.decision_p99_ms = at(0.99);
    summary_.decision_max_ms = latencies_ms_.back();
  }

  std::vector<std::string>& w = summary_.warnings;
  const double machine_node_hours = static_cast<double>(idle_.size()) * end_ / 3600;
  if (summary_.idle_node_hours > machine_node_hours * (1 + 1e-9)) {
    w.push_back(absl::StrFormat(
        "cannot be right: %.4g idle node-hours offered, more than the machine's %d nodes x the "
        "replay's %.1f h = %.4g",
        summary_.idle_node_hours, idle_.size(), end_ / 3600, machine_node_hours));
  }
  if (summary_.jobs_submitted > 0 && active_s_ < 0.1 * end_) {
    w.push_back(absl::StrFormat(
        "jobs were present during %.1f%% of the replay only (%.1f of %.1f h): utilisation and "
        "idle node-hours over the whole replay say little; see the active_* figures",
        100 * active_s_ / end_, active_s_ / 3600, end_ / 3600));
  }
  if (active_s_ > 0 && contended_s_ < 0.05 * active_s_) {
    w.push_back(absl::StrFormat(
        "the policies hardly competed: the jobs present could use more nodes than were idle "
        "during %.1f%% of their time only; any sensible policy gives every job its max_nodes",
        100 * contended_s_ / active_s_));
  }
  if (summary_.decisions_fell_back > 0) {
    w.push_back(absl::StrFormat(
        "%d of %d decisions were not answered by the policy's own method but by its fallback "
        "(the figures are partly another method's); the first: %s",
        summary_.decisions_fell_back, summary_.decisions, summary_.first_fallback_reason));
  }
  if (summary_.jobs_submitted > 0 && summary_.jobs_finished == 0) {
    w.push_back("no job finished: completion times and makespan are undefined");
  }
}

absl::StatusOr<SimResult> Replay::Run() {
  const absl::Time wall0 = absl::Now();
  MALLE_RETURN_IF_ERROR(ValidateOptions(options_));
  if (trace_.events.empty()) return absl::InvalidArgumentError("trace: has no events");
  const int num_nodes = static_cast<int>(trace_.nodes.size());
  for (size_t i = 0; i < trace_.events.size(); ++i) {
    const IdleEvent& e = trace_.events[i];
    if (e.node < 0 || e.node >= num_nodes) {
      return absl::InvalidArgumentError(absl::StrCat("trace: events[", i, "].node = ", e.node,
                                                     " is not a node index (", num_nodes,
                                                     " nodes)"));
    }
    if (i > 0 && e.time < trace_.events[i - 1].time) {
      return absl::InvalidArgumentError(
          absl::StrCat("trace: events[", i, "] is earlier than the event before it"));
    }
  }
  idle_.assign(num_nodes, 0);
  holder_.assign(num_nodes, -1);
  node_index_.reserve(num_nodes);
  for (int n = 0; n < num_nodes; ++n) node_index_[trace_.nodes[n]] = n;
  if (!options_.node_classes.empty()) {
    // Contiguous blocks in node order, boundaries at the rounded cumulative
    // shares (the last one at num_nodes).
    node_class_.assign(num_nodes, 0);
    node_group_.assign(num_nodes, 0);
    absl::flat_hash_map<std::string, int> groups;
    double cumulative = 0;
    int first = 0;
    const int num_classes = static_cast<int>(options_.node_classes.size());
    for (int k = 0; k < num_classes; ++k) {
      cumulative += options_.node_classes[k].share;
      const int last =
          k + 1 == num_classes
              ? num_nodes
              : std::min(num_nodes, static_cast<int>(std::lround(cumulative * num_nodes)));
      const int group = groups
                            .try_emplace(options_.node_classes[k].node_class.locality,
                                         static_cast<int>(groups.size()))
                            .first->second;
      for (int n = first; n < last; ++n) {
        node_class_[n] = k;
        node_group_[n] = group;
      }
      first = std::max(first, last);
    }
  }
  idle_since_.assign(num_nodes, 0);
  next_busy_.assign(num_nodes, kInf);
  next_busy_announced_.assign(num_nodes, kInf);

  // Replay start: the (skip_snapshots + 1)-th distinct event time.
  absl::Time start = trace_.events.front().time;
  int skipped = 0;
  for (size_t i = 1; i < trace_.events.size() && skipped < options_.skip_snapshots; ++i) {
    if (trace_.events[i].time != trace_.events[i - 1].time) {
      ++skipped;
      start = trace_.events[i].time;
    }
  }
  if (skipped < options_.skip_snapshots) {
    return absl::InvalidArgumentError(
        absl::StrCat("skip_snapshots: ", options_.skip_snapshots, " but the trace has only ",
                     skipped + 1, " distinct event times"));
  }
  start = std::max(start, options_.start);
  const absl::Time end = std::min(std::max(trace_.end, trace_.events.back().time), options_.end);
  if (end <= start) {
    return absl::InvalidArgumentError(
        absl::StrCat("start: the replay window [", absl::FormatTime(start), ", ",
                     absl::FormatTime(end), ") is empty"));
  }
  origin_ = start;
  end_ = Sec(end - start);

  // For the oracle forecast: each event's next event of the same node.
  std::vector<size_t> next_of_node(trace_.events.size(), trace_.events.size());
  {
    std::vector<size_t> later(num_nodes, trace_.events.size());
    for (size_t i = trace_.events.size(); i-- > 0;) {
      next_of_node[i] = later[trace_.events[i].node];
      later[trace_.events[i].node] = i;
    }
  }

  // Events before the start only set the initial state (and, for the
  // estimated forecast, the history of fragments).
  size_t ev = 0;
  double last_t = trace_.events.empty() ? 0 : Sec(trace_.events.front().time - origin_);
  for (; ev < trace_.events.size() && trace_.events[ev].time < start; ++ev) {
    const IdleEvent& e = trace_.events[ev];
    const double t = Sec(e.time - origin_);
    history_idle_node_s_ += idle_count_ * (t - last_t);
    last_t = t;
    if (e.idle) {
      if (!idle_[e.node]) ++idle_count_;
      NoteIdle(e.node, t, ev, next_of_node);
    } else if (idle_[e.node]) {
      --idle_count_;
      ++reclaims_seen_;
      AddFragment(t - idle_since_[e.node]);
    }
    idle_[e.node] = e.idle;
  }
  if (last_t < 0) history_idle_node_s_ += idle_count_ * -last_t;  // up to the start

  // Submit times, aligned to the replay start when asked.
  double shift = 0;
  if (options_.align_submit_times && !jobs_.empty()) {
    absl::Time first = jobs_[0].mix->submit_time;
    for (const JobState& j : jobs_) first = std::min(first, j.mix->submit_time);
    shift = Sec(start - first);
  }
  by_rank_.resize(jobs_.size());
  for (size_t j = 0; j < jobs_.size(); ++j) {
    const double submit = Sec(jobs_[j].mix->submit_time - origin_) + shift;
    // A job submitted before the replay start arrives at the start (its
    // outcome keeps the submit time it was given).
    jobs_[j].submit = std::max(0.0, submit);
    jobs_[j].out.name = jobs_[j].mix->name;
    jobs_[j].out.work_samples = jobs_[j].mix->work_samples;
    jobs_[j].out.submit = origin_ + absl::Seconds(submit);
    by_rank_[j] = static_cast<int>(j);
  }
  std::stable_sort(by_rank_.begin(), by_rank_.end(),
                   [&](int a, int b) { return jobs_[a].submit < jobs_[b].submit; });
  for (size_t r = 0; r < by_rank_.size(); ++r) jobs_[by_rank_[r]].rank = static_cast<int>(r);

  size_t next_submit = 0;
  double decision_at = kInf;
  double next_sample = 0;
  auto schedule = [&]() {
    if (decision_at == kInf) decision_at = now_ + Sec(options_.debounce);
  };
  double last_progress = -kInf;

  while (true) {
    const double t_event =
        ev < trace_.events.size() ? Sec(trace_.events[ev].time - origin_) : kInf;
    const double t_submit =
        next_submit < by_rank_.size() ? jobs_[by_rank_[next_submit]].submit : kInf;
    double t_finish = kInf;
    for (int rank : running_) t_finish = std::min(t_finish, FinishTime(jobs_[by_rank_[rank]]));
    const double t = std::min({t_event, t_submit, t_finish, decision_at, next_sample, end_});
    Advance(t);
    if (t >= end_) {
      FinishJobs();  // a job done exactly at the end counts as finished
      break;
    }

    const int running_before = static_cast<int>(running_.size());
    FinishJobs();
    if (static_cast<int>(running_.size()) != running_before) schedule();
    if (ev < trace_.events.size() && Sec(trace_.events[ev].time - origin_) <= now_) {
      ApplyTraceEvents(ev, next_of_node);
      schedule();
    }
    for (; next_submit < by_rank_.size() && jobs_[by_rank_[next_submit]].submit <= now_;
         ++next_submit) {
      const int j = by_rank_[next_submit];
      JobState& s = jobs_[j];
      s.submitted = true;
      s.size_since = now_;
      ++present_;
      demand_ += s.mix->max_nodes;
      waiting_.insert(s.rank);
      ++summary_.jobs_submitted;
      Record("submit", j, -1, 0, 0);
      schedule();
    }
    if (decision_at <= now_) {
      decision_at = kInf;
      MALLE_RETURN_IF_ERROR(Decide());
    }
    if (next_sample <= now_) {
      TimelineSample sample;
      sample.time = origin_ + absl::Seconds(now_);
      sample.idle_nodes = idle_count_;
      sample.used_nodes = used_count_;
      sample.running_jobs = static_cast<int>(running_.size());
      sample.waiting_jobs = static_cast<int>(waiting_.size());
      result_.timeline.push_back(sample);
      next_sample = now_ + Sec(options_.timeline_step);
    }
    if (options_.progress && now_ - last_progress >= end_ / 200) {
      last_progress = now_;
      options_.progress(now_ / end_);
    }
  }
  if (options_.progress) options_.progress(1.0);

  double ideal = 0;
  result_.jobs.reserve(jobs_.size());
  for (JobState& s : jobs_) {
    s.out.samples_done = std::max(0.0, std::min(s.done, s.mix->work_samples));
    summary_.samples_trained += s.out.samples_done;
    ideal += s.out.ideal_samples;
    result_.jobs.push_back(s.out);
  }
  Summarise(ideal);
  summary_.wall_s = absl::ToDoubleSeconds(absl::Now() - wall0);
  return std::move(result_);
}

std::string Csv(double v) { return absl::StrFormat("%.17g", v); }
std::string Unix(absl::Time t) {
  if (t == absl::InfiniteFuture() || t == absl::InfinitePast()) return "";
  return Csv(absl::ToDoubleSeconds(t - absl::UnixEpoch()));
}

}  // namespace

const char* PreemptionCostName(PreemptionCost mode) {
  switch (mode) {
    case PreemptionCost::kFree:
      return "free";
    case PreemptionCost::kPark:
      return "park";
    case PreemptionCost::kSnapshot:
      return "snapshot";
    case PreemptionCost::kRestart:
      return "restart";
  }
  return "?";
}

absl::StatusOr<PreemptionCost> ParsePreemptionCost(absl::string_view name) {
  for (PreemptionCost m : {PreemptionCost::kFree, PreemptionCost::kPark, PreemptionCost::kSnapshot,
                           PreemptionCost::kRestart}) {
    if (name == PreemptionCostName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("preemption cost: '", name, "' is not one of free, park, snapshot, restart"));
}

absl::StatusOr<std::vector<NodeClassShare>> ParseNodeClassShares(absl::string_view spec) {
  std::vector<NodeClassShare> out;
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    const std::string where = absl::StrCat("node classes: item ", out.size() + 1, " '", item, "'");
    const std::vector<absl::string_view> f = absl::StrSplit(item, ':');
    if (f.size() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected id:locality:speed:share, got ", f.size(), " fields"));
    }
    NodeClassShare c;
    c.node_class.id = std::string(f[0]);
    c.node_class.locality = std::string(f[1]);
    if (c.node_class.id.empty())
      return absl::InvalidArgumentError(absl::StrCat(where, ": empty id"));
    if (!absl::SimpleAtod(f[2], &c.node_class.speed)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": speed '", f[2], "' is not a number"));
    }
    if (!absl::SimpleAtod(f[3], &c.share)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": share '", f[3], "' is not a number"));
    }
    out.push_back(std::move(c));
  }
  return out;
}

absl::Duration PreemptionCostOptions::ParkTime() const {
  return park_fixed + absl::Seconds(state_bytes / write_bytes_per_s);
}

absl::Duration PreemptionCostOptions::UnparkTime() const {
  return unpark_fixed + absl::Seconds(state_bytes / read_bytes_per_s);
}

absl::Duration PreemptionCostOptions::SnapshotCopyTime() const {
  return absl::Seconds(state_bytes / copy_bytes_per_s);
}

absl::Duration PreemptionCostOptions::SnapshotInterval() const {
  if (snapshot_interval > absl::ZeroDuration()) return snapshot_interval;
  return std::max(SnapshotCopyTime() / snapshot_budget,
                  absl::Seconds(state_bytes / write_bytes_per_s));
}

absl::StatusOr<SimResult> Simulate(const IdleTrace& trace, const std::vector<MixJob>& jobs,
                                   const SimOptions& options) {
  Replay replay(trace, jobs, options);
  return replay.Run();
}

std::string EventsToCsv(const std::vector<EventRecord>& events) {
  std::string out =
      "time,kind,job,node,nodes_before,nodes_after,idle_nodes,used_nodes,decision_ms\n";
  for (const EventRecord& e : events) {
    absl::StrAppend(&out, Unix(e.time), ",", e.kind, ",", e.job, ",", e.node, ",", e.nodes_before,
                    ",", e.nodes_after, ",", e.idle_nodes, ",", e.used_nodes, ",",
                    Csv(e.decision_ms), "\n");
  }
  return out;
}

std::string JobsToCsv(const std::vector<JobOutcome>& jobs) {
  std::string out =
      "name,submit,first_start,finish,work_samples,samples_done,node_seconds,ideal_samples,"
      "resizes,preemptions,reclaims\n";
  for (const JobOutcome& j : jobs) {
    absl::StrAppend(&out, j.name, ",", Unix(j.submit), ",", Unix(j.first_start), ",",
                    Unix(j.finish), ",", Csv(j.work_samples), ",", Csv(j.samples_done), ",",
                    Csv(j.node_seconds), ",", Csv(j.ideal_samples), ",", j.resizes, ",",
                    j.preemptions, ",", j.reclaims, "\n");
  }
  return out;
}

std::string SummariesToCsv(const std::vector<Summary>& summaries) {
  std::string out =
      "policy,samples_trained,idle_node_hours,used_node_hours,efficiency,utilisation,"
      "jobs_submitted,jobs_finished,resizes,preemptions,reclaims,decisions,decisions_fell_back,"
      "decision_p50_ms,"
      "decision_p99_ms,decision_max_ms,wall_s,jct_mean_s,jct_median_s,makespan_s,"
      "preemption_cost,lost_to_preemptions,lost_to_snapshots,stops,jct_p95_s,jct_max_s\n";
  for (const Summary& s : summaries) {
    absl::StrAppend(&out, s.policy, ",", Csv(s.samples_trained), ",", Csv(s.idle_node_hours), ",",
                    Csv(s.used_node_hours), ",", Csv(s.efficiency), ",", Csv(s.utilisation), ",",
                    s.jobs_submitted, ",", s.jobs_finished, ",", s.resizes, ",", s.preemptions, ",",
                    s.reclaims, ",", s.decisions, ",", s.decisions_fell_back, ",",
                    Csv(s.decision_p50_ms), ",", Csv(s.decision_p99_ms), ",",
                    Csv(s.decision_max_ms), ",", Csv(s.wall_s), ",", Csv(s.jct_mean_s), ",",
                    Csv(s.jct_median_s), ",", Csv(s.makespan_s), ",",
                    // The mode's name only: the description has commas.
                    s.preemption_cost.substr(0, s.preemption_cost.find(' ')), ",",
                    Csv(s.lost_to_preemptions), ",", Csv(s.lost_to_snapshots), ",", s.stops, ",",
                    Csv(s.jct_p95_s), ",", Csv(s.jct_max_s), "\n");
  }
  return out;
}

namespace {

struct UserFigure {
  const char* name;
  bool higher_better;
  double Summary::*field;
};

constexpr UserFigure kUserFigures[] = {
    {"samples/nh", true, &Summary::samples_per_node_hour},
    {"JCT mean", false, &Summary::jct_mean_s},
    {"JCT p95", false, &Summary::jct_p95_s},
    {"eff", true, &Summary::efficiency},
};

// -1: ours worse, 0: equal (or both NaN), +1: ours better.
int CompareFigure(const UserFigure& f, const Summary& ours, const Summary& base) {
  const double a = ours.*f.field, b = base.*f.field;
  if (std::isnan(a) || std::isnan(b))
    return std::isnan(a) == std::isnan(b) ? 0 : std::isnan(a) ? -1 : 1;
  if (a == b) return 0;
  return (a > b) == f.higher_better ? 1 : -1;
}

}  // namespace

std::vector<std::string> WorseUserFigures(const Summary& ours, const Summary& base) {
  std::vector<std::string> out;
  for (const UserFigure& f : kUserFigures) {
    if (CompareFigure(f, ours, base) < 0) out.push_back(f.name);
  }
  return out;
}

bool DominatedOnUserFigures(const Summary& ours, const Summary& base) {
  bool worse_somewhere = false;
  for (const UserFigure& f : kUserFigures) {
    const int c = CompareFigure(f, ours, base);
    if (c > 0) return false;
    worse_somewhere = worse_somewhere || c < 0;
  }
  return worse_somewhere;
}

}  // namespace malle::sim
