// sim_bench: the trace-driven simulator on real data, every policy and curve
// mode side by side in one run, next to the figures BFTrainer and MalleTrain
// published.
//
// For every job mix in --jobs, every policy in --policies and every curve
// mode in --curves it replays --trace with Simulate (libmalle/sim/engine.h,
// the same alloc::Decide as the live allocator) and prints one row: samples
// trained, efficiency (ours and the stricter "best dedicated size" reading),
// utilisation, resizes, preemptions, job completion time, makespan, decision
// latency and the wall time of the replay. Then:
//   - the reference figures, cited: BFTrainer's "efficiencies of up to 93%
//     compared with running the same training tasks on dedicated nodes"
//     (Liu et al., arXiv:2106.12091) and MalleTrain's "improving training
//     throughput by up to 22.3% without requiring users to provide job
//     scalability information" (Ma et al., ICPE '24, doi:10.1145/3629526.3645035),
//     with our ratios learned/linear and learned/oracle;
//   - for MILP runs, an audit of every decision the MILP did not prove
//     optimal (time limit or fallback): the same problem solved by the exact
//     DP, and the objective gap;
//   - the speed targets (full replay < 60 s with DP, < 5 min with MILP).
//
//   build/sim/tests/bench/sim_bench --jobs=.../jobs-hpo-shufflenet-10.csv --policies=dp,milp
//
// A program, not a test: exits 0, or 1 if a replay failed, 2 for bad flags.
// Replays run one after another (one core each); wall times are of the
// replay alone (loading and the audit excluded).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/decide.h"
#include "libmalle/alloc/problem_json.h"
#include "libmalle/sim/engine.h"
#include "libmalle/sim/idle_trace.h"
#include "libmalle/sim/job_mix.h"
#include "libmalle/sim/swf.h"

ABSL_FLAG(std::string, trace, MALLE_SHARED_DATA_DIR "/summit-idle-2021-02.csv.gz",
          "idle-node trace (.csv or .csv.gz)");
ABSL_FLAG(std::string, jobs,
          MALLE_SHARED_DATA_DIR "/jobs-imagenet-1001.csv," MALLE_SHARED_DATA_DIR
                                "/jobs-hpo-shufflenet-10.csv",
          "job-mix CSVs, comma-separated; each is replayed under every policy and curve mode");
ABSL_FLAG(std::string, policies, "milp,dp,greedy,equal_share,static",
          "policies, comma-separated (milp, dp, greedy, equal_share, static)");
ABSL_FLAG(std::string, curves, "oracle,learned,linear",
          "curve modes, comma-separated (oracle, learned, linear)");
ABSL_FLAG(std::string, curves_for, "milp,dp",
          "policies that run every mode in --curves; the others run only the first one "
          "('all' for every policy)");
ABSL_FLAG(std::string, forecast, "none", "none, oracle, estimated or reservation");
ABSL_FLAG(double, rank_weights, 0,
          "rank weights: each job's objective times rank^P, rank 1 for the job with the most "
          "work left (alloc::Problem::rank_weight_exponent); 0 = off");
ABSL_FLAG(double, rank_aging_h, 0,
          "with --rank_weights: a job's work left ranks as work / (1 + age / H) "
          "(alloc::Problem::rank_aging); 0 = off");
ABSL_FLAG(double, hysteresis, 1, "the policies charge each resize this many times its pause");
ABSL_FLAG(double, terms_t_fwd_s, 0,
          "forward window of the policies in --terms_for, seconds (0: --t_fwd_s)");
ABSL_FLAG(std::string, terms_for, "milp,dp",
          "policies that get --reclaim_hazard, --hysteresis, --rank_weights, --rank_aging_h and "
          "--objective; the others run with the plain throughput objective, BFTrainer's "
          "settings ('all' for every policy)");
ABSL_FLAG(std::string, node_classes, "",
          "node classes over the trace's nodes in order, id:locality:speed:share[,...] (e.g. "
          "fast:r0:1:0.25,slow:r0:0.85:0.25,fast1:r1:1:0.25,slow1:r1:0.85:0.25); empty: one class");
ABSL_FLAG(double, cross_locality_factor, 1.0,
          "with --node_classes: a job spanning several locality groups trains at this factor");
ABSL_FLAG(bool, reclaim_hazard, false,
          "tell the policies the machine's reclaim rate so far (they price forced shrinks)");
ABSL_FLAG(std::string, accounting, "bftrainer", "bftrainer or pause");
ABSL_FLAG(std::string, preemption_cost, "park",
          "what a stop costs: park (the simulator's default), snapshot, restart or free "
          "(BFTrainer's replayer); the other parameters at their defaults (sim_preemption_bench "
          "varies them)");
ABSL_FLAG(std::string, objective, "throughput", "throughput, speedup or weighted");
ABSL_FLAG(std::string, resize_cost, "bftrainer", "bftrainer or lost_work");
ABSL_FLAG(double, t_fwd_s, 120, "forward window T_fwd, seconds");
ABSL_FLAG(double, debounce_s, 0, "decision debounce, seconds");
ABSL_FLAG(int, max_waiting, 64, "waiting jobs the policy considers (FIFO)");
ABSL_FLAG(int, max_jobs, 0,
          "jobs in play at once (BFTrainer's replayer's maxJ, 10 there); 0 = no limit");
ABSL_FLAG(int, skip_snapshots, 999,
          "distinct trace times skipped before the replay starts (BFTrainer: 999)");
ABSL_FLAG(double, hours, 0, "replay only this many hours from the start (0 = the whole trace)");
ABSL_FLAG(double, learned_warmup_s, 0, "learned curves: seconds at a size before it counts");
ABSL_FLAG(double, milp_time_limit_s, 1,
          "MILP time limit per decision (branch-and-price, or CBC), seconds");
ABSL_FLAG(double, milp_relative_gap, 1e-9, "CBC relative gap");
ABSL_FLAG(bool, milp_fork, true, "solve the MILP in a forked child (the live default)");
ABSL_FLAG(bool, milp_dp_start, false,
          "give CBC the DP's answer as its MIP start (single-pool problems)");
ABSL_FLAG(int, milp_cut_rounds, -1,
          "rounds of MIR cuts at the root of the MILP's branch-and-price "
          "(MilpOptions::decomposition_cut_rounds; -1: its default, 0: none)");
ABSL_FLAG(int64_t, dp_max_work, 0,
          "the DP's largest multi-pool work, states x per-pool vectors (DpOptions::max_work; "
          "0: its default); beyond it the DP policy's decision goes to the MILP");
ABSL_FLAG(std::string, dump_unproven, "",
          "write every MILP decision with >= 8 pools that its answer was not proven within 1e-4 "
          "as a problem JSON to DIR/<machine>_<regime>_<mix>_<curves>_<n>.json (at most 50 per "
          "row), to be solved again with malle-alloc solve");
ABSL_FLAG(double, dump_over_ms, 0,
          "with --dump_unproven: also write the decisions with >= 8 pools that took longer than "
          "this many ms, proven or not (0: only the unproven)");
ABSL_FLAG(bool, audit_all, false,
          "audit every MILP decision against the DP, not only those not proven optimal");
ABSL_FLAG(std::string, csv, "", "also write every row as CSV to this file");
ABSL_FLAG(std::string, dump_dir, "",
          "write every replay's per-job outcomes (and, with --dump_events, its events) to "
          "DIR/<machine>_<regime>_<mix>_<policy>_<curves>.{jobs,events}.csv, to trace why a "
          "policy wins or loses");
ABSL_FLAG(bool, dump_events, false, "with --dump_dir: record and write every replay's events");
ABSL_FLAG(bool, summit, true, "replay the Summit idle trace (--trace) as one machine");
ABSL_FLAG(std::string, swf, "",
          "SWF logs replayed as further machines, comma-separated, each "
          "PATH[:PROCS_PER_NODE][:wait0] (.swf or .swf.gz; the machine is named after the file; "
          "wait0: unknown waits are 0, for logs whose submit times are start times)");
ABSL_FLAG(std::string, regimes, "light",
          "light (each mix as published) and/or saturated (the mix repeated "
          "--saturated_copies times, --saturated_period_h apart: the idle pool the bottleneck)");
ABSL_FLAG(int, saturated_copies, 3, "copies of the mix in the saturated regime");
ABSL_FLAG(double, saturated_period_h, 10, "hours between the copies in the saturated regime");

namespace {

namespace alloc = malle::alloc;
namespace sim = malle::sim;

// Published figures (abstracts of the papers; see docs/benchmarks.md).
constexpr double kBftrainerEfficiency = 0.93;  // "efficiencies of up to 93%"
constexpr double kMalletrainGain = 0.223;      // "training throughput by up to 22.3%"

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct MilpAudit {
  int decisions = 0;
  int optimal = 0;        // proven optimal by CBC
  int time_limit = 0;     // the MILP's incumbent at the time limit
  int fell_back = 0;      // answered by the DP fallback (crash, hang, no incumbent...)
  int audited = 0;        // solved again by the DP
  int worse_than_dp = 0;  // objective below the DP's by more than 1e-9 relative
  double max_gap_bound = 0;  // (bound - objective) / objective over time-limit answers
  double max_gap_dp = 0;     // (dp - milp) / |dp| over audited answers
  double sum_gap_dp = 0;
  double milp_ms = 0;        // sum of decision times
  double audit_s = 0;        // wall time spent in the audit (not part of the replay)
  std::vector<double> slow_ms;  // decisions slower than 100 ms
  // Decisions by the number of jobs in the problem (bucket upper bounds):
  // all of them, the slow ones, and the time they took.
  std::map<int, int> all_by_jobs, slow_by_jobs;
  std::map<int, double> ms_by_jobs;
  // By the number of pools in the problem (PoolBucket): each decision's
  // jobs, time and whether it was proven.
  struct PoolDecision {
    int jobs;
    double ms;
    bool proven;
    double gap;  // (bound - objective) / |objective|; 0 by the DP fallback, +inf by a heuristic
  };
  std::map<int, std::vector<PoolDecision>> by_pools;
  // The DP policy's rows: decisions the DP handed to the MILP (beyond its
  // multi-pool limits), those the MILP proved, and their time.
  int dp_by_milp = 0, dp_by_milp_proven = 0, dp_by_heuristic = 0;
  int dumped = 0;  // --dump_unproven files written
  double dp_by_milp_ms = 0, dp_own_ms = 0;
};

// The multi-pool targets' problems (>= 8 pools) and proven gap.
constexpr int kMultiPoolTargetPools = 8;
constexpr double kMultiPoolTargetGap = 1e-4;

// Buckets of problems by their pools (1, 2-7, 8-15, 16+: the issue's
// multi-pool target starts at 8) and by their jobs, by upper bound.
constexpr int kPoolBuckets[] = {1, 7, 15};
constexpr int kJobBuckets[] = {10, 30, 60, 90};
constexpr int kOpenBucket = 1 << 30;  // the last bucket's bound: no bound

template <size_t N>
int Bucket(const int (&bounds)[N], int count) {
  for (int b : bounds) {
    if (count <= b) return b;
  }
  return kOpenBucket;
}
int PoolBucket(int pools) { return Bucket(kPoolBuckets, pools); }
int JobBucket(int jobs) { return Bucket(kJobBuckets, jobs); }

// "1", "2-7", "16+", "31-60" for the bucket with upper bound `hi`: it starts
// after the bound before it, whether or not that bucket has any problems.
template <size_t N>
std::string BucketLabel(const int (&bounds)[N], int hi) {
  int lo = 1;
  for (int b : bounds) {
    if (b >= hi) break;
    lo = b + 1;
  }
  if (hi == kOpenBucket) return absl::StrCat(lo, "+");
  return lo == hi ? absl::StrCat(lo) : absl::StrCat(lo, "-", hi);
}

struct Row {
  std::string mix;  // machine/regime/mix
  std::string machine, regime, mix_name;
  std::string policy;
  std::string curves;
  sim::Summary s;
  double eff_best = kNaN;  // samples / (node-hours x best per-node rate)
  // Samples / node-hours they would take at each job's best per-node rate.
  double samples_nh_ceiling = kNaN;
  double replay_s = 0;  // replayed seconds (for throughput when a job did not finish)
  double wall_s = 0;    // replay only
  bool milp = false;
  MilpAudit audit;
};

absl::StatusOr<std::vector<std::string>> SplitList(const std::string& flag,
                                                   const std::string& text) {
  std::vector<std::string> out = absl::StrSplit(text, ',', absl::SkipEmpty());
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty list"));
  return out;
}

absl::StatusOr<sim::CurveMode> ParseCurves(const std::string& s) {
  if (s == "oracle") return sim::CurveMode::kOracle;
  if (s == "learned") return sim::CurveMode::kLearned;
  if (s == "linear") return sim::CurveMode::kLinear;
  return absl::InvalidArgumentError(
      absl::StrCat("--curves: unknown mode '", s, "'; expected oracle, learned or linear"));
}

absl::StatusOr<sim::SimOptions> BaseOptions() {
  sim::SimOptions o;
  const std::string forecast = absl::GetFlag(FLAGS_forecast);
  if (forecast == "none") {
    o.forecast = sim::ForecastMode::kNone;
  } else if (forecast == "oracle") {
    o.forecast = sim::ForecastMode::kOracle;
  } else if (forecast == "estimated") {
    o.forecast = sim::ForecastMode::kEstimated;
  } else if (forecast == "reservation") {
    o.forecast = sim::ForecastMode::kReservation;
  } else {
    return absl::InvalidArgumentError(
        "--forecast: expected none, oracle, estimated or reservation");
  }
  const std::string accounting = absl::GetFlag(FLAGS_accounting);
  if (accounting == "bftrainer") {
    o.accounting = sim::Accounting::kBftrainer;
  } else if (accounting == "pause") {
    o.accounting = sim::Accounting::kPause;
  } else {
    return absl::InvalidArgumentError("--accounting: expected bftrainer or pause");
  }
  absl::StatusOr<alloc::Objective> objective =
      alloc::ParseObjectiveName(absl::GetFlag(FLAGS_objective));
  if (!objective.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", objective.status().message()));
  }
  o.objective = *objective;
  const std::string cost = absl::GetFlag(FLAGS_resize_cost);
  if (cost == "bftrainer") {
    o.resize_cost = alloc::ResizeCostModel::kBftrainer;
  } else if (cost == "lost_work") {
    o.resize_cost = alloc::ResizeCostModel::kLostWork;
  } else {
    return absl::InvalidArgumentError("--resize_cost: expected bftrainer or lost_work");
  }
  const double t_fwd = absl::GetFlag(FLAGS_t_fwd_s);
  const double debounce = absl::GetFlag(FLAGS_debounce_s);
  const double limit = absl::GetFlag(FLAGS_milp_time_limit_s);
  const double warmup = absl::GetFlag(FLAGS_learned_warmup_s);
  if (!(t_fwd > 0) || !(debounce >= 0) || !(limit > 0) || !(warmup >= 0) ||
      !(absl::GetFlag(FLAGS_hours) >= 0)) {
    return absl::InvalidArgumentError(
        "--t_fwd_s and --milp_time_limit_s must be > 0; --debounce_s, --learned_warmup_s and "
        "--hours >= 0");
  }
  o.forward_window = absl::Seconds(t_fwd);
  o.debounce = absl::Seconds(debounce);
  o.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  o.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  o.skip_snapshots = absl::GetFlag(FLAGS_skip_snapshots);
  o.learned_warmup = absl::Seconds(warmup);
  o.reclaim_hazard = absl::GetFlag(FLAGS_reclaim_hazard);
  o.resize_hysteresis = absl::GetFlag(FLAGS_hysteresis);
  o.rank_weight_exponent = absl::GetFlag(FLAGS_rank_weights);
  if (absl::GetFlag(FLAGS_rank_aging_h) != 0) {
    o.rank_aging = absl::Hours(absl::GetFlag(FLAGS_rank_aging_h));
  }
  o.record_events = false;
  if (!absl::GetFlag(FLAGS_node_classes).empty()) {
    absl::StatusOr<std::vector<sim::NodeClassShare>> classes =
        sim::ParseNodeClassShares(absl::GetFlag(FLAGS_node_classes));
    if (!classes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", classes.status().message()));
    }
    o.node_classes = *std::move(classes);
  }
  o.cross_locality_factor = absl::GetFlag(FLAGS_cross_locality_factor);
  absl::StatusOr<sim::PreemptionCost> preemption =
      sim::ParsePreemptionCost(absl::GetFlag(FLAGS_preemption_cost));
  if (!preemption.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--preemption_cost: ", preemption.status().message()));
  }
  o.preemption.mode = *preemption;
  o.decide.milp.time_limit = absl::Seconds(limit);
  o.decide.milp.relative_gap = absl::GetFlag(FLAGS_milp_relative_gap);
  o.decide.milp.isolation =
      absl::GetFlag(FLAGS_milp_fork) ? alloc::SolveIsolation::kFork : alloc::SolveIsolation::kInProcess;
  o.decide.milp.dp_start = absl::GetFlag(FLAGS_milp_dp_start);
  if (absl::GetFlag(FLAGS_milp_cut_rounds) >= 0) {
    o.decide.milp.decomposition_cut_rounds = absl::GetFlag(FLAGS_milp_cut_rounds);
  }
  if (absl::GetFlag(FLAGS_dp_max_work) < 0) {
    return absl::InvalidArgumentError("--dp_max_work must be >= 0 (0: the DP's default)");
  }
  if (absl::GetFlag(FLAGS_dp_max_work) > 0) o.decide.dp.max_work = absl::GetFlag(FLAGS_dp_max_work);
  return o;
}

// The replay start Simulate will use (the (skip + 1)-th distinct event time).
absl::Time ReplayStart(const sim::IdleTrace& trace, int skip) {
  absl::Time start = trace.events.front().time;
  int skipped = 0;
  for (size_t i = 1; i < trace.events.size() && skipped < skip; ++i) {
    if (trace.events[i].time != trace.events[i - 1].time) {
      ++skipped;
      start = trace.events[i].time;
    }
  }
  return start;
}

// Samples trained over what the same node-hours give each job at its most
// efficient size (highest samples/s per node within [min, max]): the
// strictest reading of "the same training tasks on dedicated nodes".
// The fastest node's speed in a replay with `o` (1 without node classes).
double FastestSpeed(const sim::SimOptions& o) {
  if (o.node_classes.empty()) return 1.0;
  double speed = 0;
  for (const sim::NodeClassShare& c : o.node_classes) speed = std::max(speed, c.node_class.speed);
  return speed;
}

// A job's best per-node rate over its sizes (samples/s per node), on nodes of
// `speed` (FastestSpeed: on one node there is no cross-locality factor, so
// this is a ceiling for any placement).
double BestPerNodeRate(const sim::MixJob& job, double speed) {
  double per_node = 0;
  for (int n = job.min_nodes; n <= job.max_nodes; ++n) {
    per_node = std::max(per_node, alloc::Interpolate(job.throughput, n) / n);
  }
  return per_node * speed;
}

double BestSizeEfficiency(const std::vector<sim::MixJob>& mix, const sim::SimResult& r,
                          double speed) {
  double best = 0;
  for (size_t k = 0; k < mix.size(); ++k) {
    best += r.jobs[k].node_seconds * BestPerNodeRate(mix[k], speed);
  }
  return best > 0 ? r.summary.samples_trained / best : kNaN;
}

// The most samples per node-hour the samples this replay trained could have
// had: every job on its most efficient size all along, without a pause.
double SamplesPerNodeHourCeiling(const std::vector<sim::MixJob>& mix, const sim::SimResult& r,
                                 double speed) {
  double samples = 0, node_hours = 0;
  for (size_t k = 0; k < mix.size(); ++k) {
    const double per_node = BestPerNodeRate(mix[k], speed);
    if (per_node <= 0 || r.jobs[k].samples_done <= 0) continue;
    samples += r.jobs[k].samples_done;
    node_hours += r.jobs[k].samples_done / per_node / 3600;
  }
  return node_hours > 0 ? samples / node_hours : kNaN;
}

// Writes `text` to `path`; false, and the path named on stderr, when it
// could not.
bool WriteText(const std::string& path, const std::string& text) {
  std::ofstream file(path);
  file << text;
  if (file) return true;
  std::cerr << "\n  " << path << " COULD NOT BE WRITTEN";
  return false;
}

std::string Pct(double v) { return std::isnan(v) ? "-" : absl::StrFormat("%.1f%%", 100 * v); }
std::string Hours(double s) { return std::isnan(s) ? "-" : absl::StrFormat("%.2f", s / 3600); }
// The nearest-rank q-quantile of `sorted` (ascending, not empty).
double NearestRank(const std::vector<double>& sorted, double q) {
  return sorted[std::max<size_t>(1, static_cast<size_t>(std::ceil(q * sorted.size()))) - 1];
}

std::string Ms(double ms) {
  return ms < 10 ? absl::StrFormat("%.2f", ms) : absl::StrFormat("%.0f", ms);
}

// Aggregate training throughput: samples over the time from the first
// arrival to the last finish (or to the end of the replay if a job did not
// finish). With every job finished, samples are equal across policies and
// this is their inverse makespan.
double Throughput(const Row& r) {
  const double span = std::isnan(r.s.makespan_s) ? r.replay_s : r.s.makespan_s;
  return span > 0 ? r.s.samples_trained / span : kNaN;
}

std::string Ratio(double a, double b) {
  if (std::isnan(a) || std::isnan(b) || b == 0) return "-";
  return absl::StrFormat("%+.1f%%", 100 * (a / b - 1));
}

void PrintTable(const std::vector<Row>& rows) {
  const std::string header = absl::StrFormat(
      "%-30s %-11s %-7s | %9s %7s %8s %8s %9s | %7s %6s %6s | %6s %6s %8s | %7s %7s %7s | %8s",
      "mix", "policy", "curves", "samples", "jobs", "eff", "eff_best", "used_nh", "util", "resizes",
      "preempt", "JCT_mn", "JCT_md", "makespan", "dec_p50", "dec_p99", "dec_n", "wall_s");
  std::cout << header << "\n" << std::string(header.size(), '-') << "\n";
  for (const Row& r : rows) {
    std::cout << absl::StrFormat(
        "%-30s %-11s %-7s | %9.4g %7s %8s %8s %9.0f | %7s %6d %6d | %6s %6s %8s | %7s %7s %7d | "
        "%8.1f\n",
        r.mix, r.policy, r.curves, r.s.samples_trained,
        absl::StrCat(r.s.jobs_finished, "/", r.s.jobs_submitted), Pct(r.s.efficiency),
        Pct(r.eff_best), r.s.used_node_hours, Pct(r.s.utilisation), r.s.resizes, r.s.preemptions,
        Hours(r.s.jct_mean_s), Hours(r.s.jct_median_s), Hours(r.s.makespan_s),
        Ms(r.s.decision_p50_ms), Ms(r.s.decision_p99_ms), r.s.decisions, r.wall_s);
  }
  std::cout << "  samples: trained in the replay; jobs: finished/submitted; eff: samples / the same\n"
               "  node counts without resize and preemption losses (docs/simulator.md); eff_best:\n"
               "  samples / the same node-hours at each job's most efficient size; used_nh: node-\n"
               "  hours held; util: used / idle node-hours offered; JCT mean/median and makespan in\n"
               "  hours; dec: decision latency p50/p99 (ms) and count; wall_s: the replay alone.\n";
}

const Row* Find(const std::vector<Row>& rows, const std::string& mix, const std::string& policy,
                const std::string& curves) {
  for (const Row& r : rows) {
    if (r.mix == mix && r.policy == policy && r.curves == curves) return &r;
  }
  return nullptr;
}

void PrintReferences(const std::vector<Row>& rows, const std::vector<std::string>& mixes) {
  std::cout << "\nReference figures (from the papers' abstracts):\n"
               "  BFTrainer (Liu et al., arXiv:2106.12091): \"efficiencies of up to 93% compared "
               "with running\n"
               "    the same training tasks on dedicated nodes\" (Summit logs, its MILP).\n"
               "  MalleTrain (Ma et al., ICPE '24, doi:10.1145/3629526.3645035): \"improving "
               "training throughput\n"
               "    by up to 22.3% without requiring users to provide job scalability "
               "information\".\n\n";
  const std::string header = absl::StrFormat(
      "%-30s %-11s | %8s %8s %9s | %13s %13s | %13s %13s", "mix", "policy", "eff", "eff_best",
      "vs 93%", "tput lrn/lin", "tput lrn/orc", "JCT lrn/lin", "JCT lrn/orc");
  std::cout << header << "\n" << std::string(header.size(), '-') << "\n";
  for (const std::string& mix : mixes) {
    std::vector<std::string> policies;
    for (const Row& r : rows) {
      if (r.mix == mix && std::find(policies.begin(), policies.end(), r.policy) == policies.end())
        policies.push_back(r.policy);
    }
    for (const std::string& p : policies) {
      const Row* orc = Find(rows, mix, p, "oracle");
      const Row* lrn = Find(rows, mix, p, "learned");
      const Row* lin = Find(rows, mix, p, "linear");
      const Row* any = orc ? orc : (lrn ? lrn : lin);
      auto tput = [](const Row* r) { return r ? Throughput(*r) : kNaN; };
      // JCT: lower is better; printed as the change of 1/JCT so that + is better.
      auto inv_jct = [](const Row* r) { return r ? 1 / r->s.jct_mean_s : kNaN; };
      std::cout << absl::StrFormat("%-30s %-11s | %8s %8s %+8.1fpp | %13s %13s | %13s %13s\n", mix,
                                   p, Pct(any->s.efficiency), Pct(any->eff_best),
                                   100 * (any->s.efficiency - kBftrainerEfficiency),
                                   Ratio(tput(lrn), tput(lin)), Ratio(tput(lrn), tput(orc)),
                                   Ratio(inv_jct(lrn), inv_jct(lin)),
                                   Ratio(inv_jct(lrn), inv_jct(orc)));
    }
  }
  std::cout << absl::StrFormat(
      "  eff columns: the oracle-curve run (first mode run otherwise); vs 93%%: eff minus "
      "BFTrainer's\n"
      "  %.0f%% in percentage points. tput: samples / (first arrival .. last finish); JCT: "
      "1 / mean JCT;\n"
      "  lrn/lin is our counterpart of MalleTrain's +%.1f%% (learned curves vs no "
      "scalability\n"
      "  information), lrn/orc what learning still costs against the true curves (0 = "
      "nothing).\n",
      100 * kBftrainerEfficiency, 100 * kMalletrainGain);
}

// The DP policy's decisions, by the method that answered them.
void PrintDpAudit(const std::vector<Row>& rows) {
  bool any = false;
  for (const Row& r : rows) any = any || r.policy == "dp";
  if (!any) return;
  std::cout << absl::StrFormat(
      "\nDP decisions (beyond its multi-pool limits, max_work %.3g steps, the MILP answers):\n",
      static_cast<double>(absl::GetFlag(FLAGS_dp_max_work) > 0
                              ? absl::GetFlag(FLAGS_dp_max_work)
                              : alloc::DecideOptions().dp.max_work));
  for (const Row& r : rows) {
    if (r.policy != "dp") continue;
    const MilpAudit& a = r.audit;
    std::cout << absl::StrFormat(
        "  %-30s %-7s %d decisions: %d by the DP (%.1f s), %d by the MILP (%.1f s, %d of them "
        "proven), %d by a heuristic or the current allocation\n",
        r.mix, r.curves, a.decisions, a.decisions - a.dp_by_milp - a.dp_by_heuristic,
        a.dp_own_ms / 1000, a.dp_by_milp, a.dp_by_milp_ms / 1000, a.dp_by_milp_proven,
        a.dp_by_heuristic);
  }
}

void PrintAudit(const std::vector<Row>& rows) {
  bool any = false;
  for (const Row& r : rows) any = any || r.milp;
  if (!any) return;
  std::cout << absl::StrFormat(
      "\nMILP decisions (time limit %.3g s, %s, MIP start: %s):\n",
      absl::GetFlag(FLAGS_milp_time_limit_s),
      absl::GetFlag(FLAGS_milp_fork) ? "forked child" : "in process",
      absl::GetFlag(FLAGS_milp_dp_start) ? "the DP's answer" : "the current allocation");
  const std::string header = absl::StrFormat(
      "%-30s %-7s | %7s %7s %6s %6s | %7s %9s %9s %9s %6s | %9s %6s %s", "mix", "curves", "decs",
      "optimal", "limit", "fellbk", "audited", "gap_bound", "gap_dp_mx", "gap_dp_mn", "<dp",
      "milp_s", ">100ms", "by jobs in the problem: decisions/>100ms/time");
  std::cout << header << "\n" << std::string(header.size(), '-') << "\n";
  for (const Row& r : rows) {
    if (!r.milp) continue;
    const MilpAudit& a = r.audit;
    std::vector<std::string> slow;
    for (const auto& [hi, count] : a.all_by_jobs) {
      const auto it = a.slow_by_jobs.find(hi);
      slow.push_back(absl::StrFormat("%s:%d/%d/%.0fs", BucketLabel(kJobBuckets, hi), count,
                                     it == a.slow_by_jobs.end() ? 0 : it->second,
                                     a.ms_by_jobs.at(hi) / 1000));
    }
    std::cout << absl::StrFormat(
        "%-30s %-7s | %7d %7d %6d %6d | %7d %9.2e %9.2e %9.2e %6d | %9.1f %6d %s\n", r.mix,
        r.curves, a.decisions, a.optimal, a.time_limit, a.fell_back, a.audited, a.max_gap_bound,
        a.max_gap_dp, a.audited > 0 ? a.sum_gap_dp / a.audited : 0.0, a.worse_than_dp,
        a.milp_ms / 1000, static_cast<int>(a.slow_ms.size()), absl::StrJoin(slow, " "));
  }
  std::cout << "  optimal: proven by the MILP; limit: its incumbent at the time limit; fellbk: "
               "answered by the DP\n"
               "  fallback; audited: decisions solved again by the exact DP (those not proven "
               "optimal, or all\n"
               "  with --audit_all); gap_bound: max (MILP bound - objective) / objective; "
               "gap_dp: (DP - MILP) /\n"
               "  DP objective, max and mean; <dp: answers worse than the DP's; milp_s: total "
               "decision time;\n"
               "  >100ms: decisions slower than that; then, per range of jobs in the problem: "
               "decisions, those\n"
               "  slower than 100 ms, and their total time.\n";
  for (const Row& r : rows) {
    if (!r.milp) continue;
    const MilpAudit& a = r.audit;
    std::vector<std::string> parts;
    for (const auto& [hi, decisions] : a.by_pools) {
      // Count, proven, p50 / p99 ms of the decisions with at most `max_jobs`.
      const auto stats = [&decisions = decisions](int max_jobs) {
        std::vector<double> ms;
        int proven = 0;
        for (const MilpAudit::PoolDecision& d : decisions) {
          if (d.jobs > max_jobs) continue;
          ms.push_back(d.ms);
          proven += d.proven;
        }
        if (ms.empty()) return std::string("0");
        std::sort(ms.begin(), ms.end());
        return absl::StrFormat("%d, %d proven, p50/p99 %s/%s ms", ms.size(), proven,
                               Ms(NearestRank(ms, 0.5)), Ms(NearestRank(ms, 0.99)));
      };
      parts.push_back(absl::StrCat(BucketLabel(kPoolBuckets, hi), ": ", stats(kOpenBucket),
                                   " (<= 100 jobs: ", stats(100), ")"));
    }
    std::cout << absl::StrFormat("  %s, decisions by pools in the problem: %s\n", r.mix,
                                 absl::StrJoin(parts, "; "));
  }
}

// The multi-pool targets (>= 8 pools: classes x locality x
// idle-window buckets), judged on the decisions the replay's MILP met, as
// alloc_pools_bench judges its random instances: at most 100 jobs, p99 <
// 200 ms and every answer proven within 1e-4; any number of jobs, p99 < 1 s.
void PrintMultiPoolTargets(const std::vector<Row>& rows) {
  bool header = false;
  for (const Row& r : rows) {
    if (!r.milp) continue;
    if (!header) {
      std::cout << "\nMulti-pool targets, on the MILP's decisions with >= 8 pools:\n";
      header = true;
    }
    std::vector<double> small_ms, all_ms;
    std::vector<std::string> missed;  // the answers of <= 100 jobs not proven within the gap
    int small_proven = 0, max_jobs = 0;
    for (const auto& [hi, decisions] : r.audit.by_pools) {
      // Buckets by upper bound: 1, 7, then 15 and open.
      if (hi < kMultiPoolTargetPools) continue;
      for (const MilpAudit::PoolDecision& d : decisions) {
        all_ms.push_back(d.ms);
        max_jobs = std::max(max_jobs, d.jobs);
        if (d.jobs > 100) continue;
        small_ms.push_back(d.ms);
        if (d.gap <= kMultiPoolTargetGap) {
          ++small_proven;
        } else if (missed.size() < 5) {
          missed.push_back(absl::StrFormat("%d jobs, %s ms, gap %.2g", d.jobs, Ms(d.ms), d.gap));
        }
      }
    }
    if (all_ms.empty()) {
      std::cout << absl::StrFormat(
          "  %-30s %-7s no decision had >= 8 pools: not a measurement of the targets\n", r.mix,
          r.curves);
      continue;
    }
    std::sort(small_ms.begin(), small_ms.end());
    std::sort(all_ms.begin(), all_ms.end());
    if (small_ms.empty()) {
      std::cout << absl::StrFormat("  %-30s %-7s <= 100 jobs: no decision\n", r.mix, r.curves);
    } else {
      const double p = NearestRank(small_ms, 0.99);
      const int n = static_cast<int>(small_ms.size());
      std::cout << absl::StrFormat(
          "  %-30s %-7s <= 100 jobs, %d decisions: p99 %s ms < 200 ms %s; gap <= %.0e proven "
          "%d/%d %s\n",
          r.mix, r.curves, n, Ms(p), p < 200 ? "MET" : "MISSED", kMultiPoolTargetGap, small_proven,
          n, small_proven == n ? "MET" : "MISSED");
      if (!missed.empty()) {
        std::cout << "    not proven within the gap: " << absl::StrJoin(missed, "; ")
                  << (n - small_proven > static_cast<int>(missed.size()) ? "; ..." : "") << "\n";
      }
    }
    const double p = NearestRank(all_ms, 0.99);
    std::cout << absl::StrFormat(
        "  %-30s %-7s any jobs (up to %d), %d decisions: p99 %s ms < 1000 ms %s\n", r.mix, r.curves,
        max_jobs, static_cast<int>(all_ms.size()), Ms(p), p < 1000 ? "MET" : "MISSED");
  }
}

std::string Num(double v, const char* fmt) {
  return std::isnan(v) ? std::string("-") : absl::StrFormat(fmt, v);
}

// The figures a user feels, per machine, regime and mix, every policy side
// by side, and the summary's warnings.
void PrintUserTable(const std::vector<Row>& rows) {
  const std::string header = absl::StrFormat(
      "%-30s %-11s %-7s | %11s %9s %9s %9s | %6s %8s %7s %7s | %8s %9s %9s", "machine/regime/mix",
      "policy", "curves", "samples/nh", "JCT mn h", "JCT p95 h", "JCT max h", "eff", "eff_best",
      "lost_rs", "lost_rc", "util_act", "contended", "jobs");
  std::cout << "\nWhat users feel (samples per node-hour held, completion times in hours, "
               "efficiency):\n"
            << header << "\n"
            << std::string(header.size(), '-') << "\n";
  for (const Row& r : rows) {
    std::cout << absl::StrFormat(
        "%-30s %-11s %-7s | %11s %9s %9s %9s | %6s %8s %7s %7s | %8s %9s %9s\n", r.mix, r.policy,
        r.curves, Num(r.s.samples_per_node_hour, "%.4g"), Hours(r.s.jct_mean_s),
        Hours(r.s.jct_p95_s), Hours(r.s.jct_max_s), Pct(r.s.efficiency), Pct(r.eff_best),
        Pct(r.s.lost_to_resizes /
            std::max(1.0, r.s.samples_trained + r.s.lost_to_resizes + r.s.lost_to_reclaims)),
        Pct(r.s.lost_to_reclaims /
            std::max(1.0, r.s.samples_trained + r.s.lost_to_resizes + r.s.lost_to_reclaims)),
        Pct(r.s.active_utilisation), Pct(r.s.contended_fraction),
        absl::StrCat(r.s.jobs_finished, "/", r.s.jobs_submitted));
  }
  std::cout
      << "  samples/nh: samples trained per node-hour held; JCT: job completion time "
         "(mean, nearest-rank p95,\n"
         "  max) over finished jobs; lost_rs / lost_rc: samples the policy's resizes / the "
         "reclaims cost, as a\n"
         "  share of samples trained + lost; util_act: used / idle node-hours while jobs were "
         "present; contended: share\n"
         "  of that time when the jobs present could use more nodes than were idle (the "
         "policies competed).\n";
  bool any = false;
  for (const Row& r : rows) {
    for (const std::string& w : r.s.warnings) {
      if (!any) std::cout << "Warnings:\n";
      any = true;
      std::cout << "  " << r.mix << " " << r.policy << " " << r.curves << ": " << w << "\n";
    }
  }
}

// Target: the MILP (and the DP) at least as good as every baseline on
// samples per node-hour, mean and p95 JCT and efficiency, per machine and
// regime. Prints MET / MISSED with what lost, by how much. No schedule can
// meet it in general (EngineTest.NoScheduleBeatsStaticAndEqualShareAtOnce),
// so the target that can be asked of one policy is printed below it: no
// baseline dominates it (sim::DominatedOnUserFigures). Last, the ceiling on
// samples per node-hour, and how near each policy comes to it.
void PrintWinTargets(const std::vector<Row>& rows, const std::string& first_curves) {
  std::vector<std::string> labels;
  for (const Row& r : rows) {
    if (std::find(labels.begin(), labels.end(), r.mix) == labels.end()) labels.push_back(r.mix);
  }
  struct Metric {
    const char* name;
    double (*get)(const Row&);
    const char* fmt;
  };
  const Metric metrics[] = {
      {"samples/nh", [](const Row& r) { return r.s.samples_per_node_hour; }, "%.4g"},
      {"JCT mean", [](const Row& r) { return r.s.jct_mean_s / 3600; }, "%.2f h"},
      {"JCT p95", [](const Row& r) { return r.s.jct_p95_s / 3600; }, "%.2f h"},
      {"eff", [](const Row& r) { return 100 * r.s.efficiency; }, "%.2f%%"},
  };
  const char* const kBaselines[] = {"greedy", "equal_share", "static"};
  std::cout << "\nTarget: MILP and DP >= every baseline (greedy, equal_share, static) on "
               "samples/nh, JCT mean, JCT p95, eff\n(no schedule can meet it in general: "
               "EngineTest.NoScheduleBeatsStaticAndEqualShareAtOnce):\n";
  for (const std::string& label : labels) {
    for (const char* ours : {"milp", "dp"}) {
      const Row* o = Find(rows, label, ours, first_curves);
      if (o == nullptr) continue;
      std::vector<std::string> lost;
      int compared = 0;
      for (const char* base : kBaselines) {
        const Row* b = Find(rows, label, base, first_curves);
        if (b == nullptr) continue;
        ++compared;
        for (const std::string& worse : sim::WorseUserFigures(o->s, b->s)) {
          for (const Metric& m : metrics) {
            if (worse != m.name) continue;
            lost.push_back(absl::StrCat(m.name, " ", Num(m.get(*o), m.fmt), " vs ", base, " ",
                                        Num(m.get(*b), m.fmt)));
          }
        }
      }
      if (compared == 0) continue;
      std::cout << absl::StrFormat("  %-30s %-4s %s%s\n", label, ours,
                                   lost.empty() ? "MET" : "MISSED: ", absl::StrJoin(lost, "; "));
    }
  }
  std::cout << "\nTarget: MILP and DP dominated by no baseline (every baseline worse on some "
               "figure; in brackets, the figures where ours is better):\n";
  for (const std::string& label : labels) {
    for (const char* ours : {"milp", "dp"}) {
      const Row* o = Find(rows, label, ours, first_curves);
      if (o == nullptr) continue;
      std::vector<std::string> by, better;
      for (const char* base : kBaselines) {
        const Row* b = Find(rows, label, base, first_curves);
        if (b == nullptr) continue;
        if (sim::DominatedOnUserFigures(o->s, b->s)) by.push_back(base);
        better.push_back(
            absl::StrCat(base, ": ", absl::StrJoin(sim::WorseUserFigures(b->s, o->s), ", ")));
      }
      if (better.empty()) continue;
      std::cout << absl::StrFormat(
          "  %-30s %-4s %s (%s)\n", label, ours,
          by.empty() ? "MET" : absl::StrCat("MISSED: dominated by ", absl::StrJoin(by, ", ")),
          absl::StrJoin(better, "; "));
    }
  }
  std::cout << "\nSamples per node-hour, ceiling (every job on its most efficient size all "
               "along, no pause;\nthe bound for any policy that trains what this one trained) "
               "and each policy's share of it:\n";
  for (const std::string& label : labels) {
    std::vector<std::string> parts;
    for (const Row& r : rows) {
      if (r.mix != label || r.curves != first_curves) continue;
      parts.push_back(absl::StrFormat("%s %.2f%%", r.policy,
                                      100 * r.s.samples_per_node_hour / r.samples_nh_ceiling));
    }
    const Row* any = Find(rows, label, "dp", first_curves);
    if (any == nullptr) any = Find(rows, label, "equal_share", first_curves);
    std::cout << absl::StrFormat("  %-30s %s: %s\n", label,
                                 any == nullptr ? "-" : Num(any->samples_nh_ceiling, "%.4g"),
                                 absl::StrJoin(parts, ", "));
  }
}

// Every row as CSV (--csv); false when the file could not be written.
bool WriteCsv(const std::string& path, const std::vector<Row>& rows) {
  std::string text = absl::StrCat("mix,curves,eff_best,replay_wall_s,",
                                  absl::StripSuffix(sim::SummariesToCsv({}), "\n"), "\n");
  for (const Row& r : rows) {
    std::string line = sim::SummariesToCsv({r.s});
    line = line.substr(line.find('\n') + 1);
    absl::StrAppend(&text, r.mix, ",", r.curves, ",", absl::StrFormat("%.17g", r.eff_best), ",",
                    absl::StrFormat("%.17g", r.wall_s), ",", line);
  }
  return WriteText(path, text);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "replays an idle-node trace with job mixes under every policy and curve mode; "
      "prints one table");
  absl::ParseCommandLine(argc, argv);
  const absl::Time program_start = absl::Now();

  auto mix_paths = SplitList("jobs", absl::GetFlag(FLAGS_jobs));
  auto policy_names = SplitList("policies", absl::GetFlag(FLAGS_policies));
  auto curve_names = SplitList("curves", absl::GetFlag(FLAGS_curves));
  auto curves_for = SplitList("curves_for", absl::GetFlag(FLAGS_curves_for));
  for (const auto* l : {&mix_paths, &policy_names, &curve_names, &curves_for}) {
    if (!l->ok()) {
      std::cerr << l->status().message() << "\n";
      return 2;
    }
  }
  std::vector<alloc::PolicyKind> policies;
  for (const std::string& p : *policy_names) {
    auto k = alloc::ParsePolicyName(p);
    if (!k.ok()) {
      std::cerr << "--policies: " << k.status().message() << "\n";
      return 2;
    }
    policies.push_back(*k);
  }
  std::vector<sim::CurveMode> curves;
  for (const std::string& c : *curve_names) {
    auto m = ParseCurves(c);
    if (!m.ok()) {
      std::cerr << m.status().message() << "\n";
      return 2;
    }
    curves.push_back(*m);
  }
  auto base = BaseOptions();
  if (!base.ok()) {
    std::cerr << base.status().message() << "\n";
    return 2;
  }

  const absl::Time t_load = absl::Now();
  // Machines: the Summit idle trace and the SWF logs, each with its report.
  struct Machine {
    std::string name;
    sim::IdleTrace trace;
    int skip_snapshots = 0;
    std::string note;  // what the SWF replay did
    double span_days = 0;
  };
  std::vector<Machine> machines;
  if (absl::GetFlag(FLAGS_summit)) {
    auto trace = sim::LoadIdleTrace(absl::GetFlag(FLAGS_trace));
    if (!trace.ok()) {
      std::cerr << "cannot load the trace: " << trace.status() << "\n";
      return 1;
    }
    if (trace->events.empty()) {
      std::cerr << "the trace has no events\n";
      return 1;
    }
    Machine m;
    m.name = "summit";
    m.trace = *std::move(trace);
    m.skip_snapshots = base->skip_snapshots;
    machines.push_back(std::move(m));
  }
  const std::vector<std::string> swf_specs =
      absl::StrSplit(absl::GetFlag(FLAGS_swf), ',', absl::SkipEmpty());
  for (const std::string& spec : swf_specs) {
    std::vector<std::string> parts = absl::StrSplit(spec, ':');
    sim::SwfReplayOptions ro;
    if (parts.size() >= 2 && parts.back() == "wait0") {
      ro.unknown_wait_is_zero = true;
      parts.pop_back();
    }
    if (parts.size() > 2 ||
        (parts.size() == 2 &&
         (!absl::SimpleAtoi(parts[1], &ro.procs_per_node) || ro.procs_per_node < 1))) {
      std::cerr << "--swf: expected PATH[:PROCS_PER_NODE][:wait0], got '" << spec << "'\n";
      return 2;
    }
    auto log = sim::LoadSwf(parts[0]);
    if (!log.ok()) {
      std::cerr << "cannot load " << parts[0] << ": " << log.status() << "\n";
      return 1;
    }
    auto swf = sim::SwfToIdleTrace(*log, ro);
    if (!swf.ok()) {
      std::cerr << "cannot replay " << parts[0] << ": " << swf.status() << "\n";
      return 1;
    }
    Machine m;
    m.name = parts[0].substr(parts[0].find_last_of('/') + 1);
    m.name = std::string(absl::StripSuffix(absl::StripSuffix(m.name, ".gz"), ".swf"));
    {
      // "RICC-2010-2" -> "RICC-2010": up to the year, the archive's naming.
      std::vector<std::string> tokens = absl::StrSplit(m.name, '-');
      std::string shortname;
      for (const std::string& t : tokens) {
        absl::StrAppend(&shortname, shortname.empty() ? "" : "-", t);
        int year = 0;
        if (t.size() == 4 && absl::SimpleAtoi(t, &year) && year > 1900) break;
      }
      m.name = shortname;
    }
    const sim::SwfReplayReport& rep = swf->report;
    m.span_days = rep.span_s / 86400;
    m.note = absl::StrFormat(
        "%d nodes x %d procs, %.1f days, %d jobs replayed (%d with wait 0 assumed; %d rejected "
        "lines, %d unknown times/sizes, %d zero-length), %.2f%% of the asked node-hours beyond "
        "the machine%s",
        rep.nodes, rep.procs_per_node, m.span_days, rep.jobs_replayed, rep.jobs_wait_assumed_zero,
        log->rejected.size(), rep.jobs_unknown_times + rep.jobs_unknown_procs, rep.jobs_zero_length,
        rep.asked_node_seconds > 0 ? 100 * rep.oversubscribed_node_seconds / rep.asked_node_seconds
                                   : 0.0,
        !rep.absolute_times ? ""
        : rep.ignored_unix_start_time < 0
            ? "; absolute submit times: replayed from the first event"
            : absl::StrCat("; absolute submit times (the header's UnixStartTime ",
                           rep.ignored_unix_start_time,
                           " not added): replayed from the first event"));
    m.trace = std::move(swf->trace);
    machines.push_back(std::move(m));
  }
  if (machines.empty()) {
    std::cerr << "no machine: give --summit or --swf\n";
    return 2;
  }
  std::vector<std::pair<std::string, sim::JobMix>> mixes;
  for (const std::string& path : *mix_paths) {
    auto mix = sim::LoadJobMix(path, {/*strict=*/true});
    if (!mix.ok()) {
      std::cerr << "cannot load the job mix: " << mix.status() << "\n";
      return 1;
    }
    std::string name = path.substr(path.find_last_of('/') + 1);
    name = std::string(absl::StripSuffix(absl::StripPrefix(name, "jobs-"), ".csv"));
    mixes.emplace_back(name, *std::move(mix));
  }
  auto regime_names = SplitList("regimes", absl::GetFlag(FLAGS_regimes));
  if (!regime_names.ok()) {
    std::cerr << regime_names.status().message() << "\n";
    return 2;
  }
  for (const std::string& r : *regime_names) {
    if (r != "light" && r != "saturated") {
      std::cerr << "--regimes: unknown regime '" << r << "'; expected light or saturated\n";
      return 2;
    }
  }
  if (absl::GetFlag(FLAGS_dump_over_ms) < 0 ||
      (absl::GetFlag(FLAGS_dump_over_ms) > 0 && absl::GetFlag(FLAGS_dump_unproven).empty())) {
    std::cerr << "--dump_over_ms: must be >= 0, and > 0 only with --dump_unproven (its folder); "
                 "got "
              << absl::GetFlag(FLAGS_dump_over_ms) << "\n";
    return 2;
  }
  // The output folders exist, before replays that may take an hour (a
  // missing one used to make --dump_dir write nothing, silently): those of
  // --dump_dir and --dump_unproven, and the one --csv's file goes into.
  for (const auto& [flag, dir] :
       {std::pair<const char*, std::string>{"dump_dir", absl::GetFlag(FLAGS_dump_dir)},
        {"dump_unproven", absl::GetFlag(FLAGS_dump_unproven)},
        {"csv", std::filesystem::path(absl::GetFlag(FLAGS_csv)).parent_path().string()}}) {
    std::error_code error;
    if (!dir.empty() && !std::filesystem::is_directory(dir, error)) {
      std::cerr << "--" << flag << ": " << dir << " is not a folder (create it first)\n";
      return 2;
    }
  }
  const int copies = absl::GetFlag(FLAGS_saturated_copies);
  const double period_h = absl::GetFlag(FLAGS_saturated_period_h);
  if (copies < 1 || !(period_h >= 0)) {
    std::cerr << "--saturated_copies must be >= 1 and --saturated_period_h >= 0\n";
    return 2;
  }

  std::cout << absl::StrFormat(
      "sim_bench: T_fwd %.0f s, debounce %.0f s, forecast %s%s, accounting %s (preemption cost "
      "%s), objective %s, "
      "resize cost %s (objective terms%s for %s; the others: throughput, BFTrainer's),\n  "
      "max_waiting %d, max_jobs %d%s; regimes %s (saturated: %d copies of "
      "the mix, %.0f h apart); loaded in %.1f s\n",
      absl::GetFlag(FLAGS_t_fwd_s), absl::GetFlag(FLAGS_debounce_s), absl::GetFlag(FLAGS_forecast),
      absl::StrCat(absl::GetFlag(FLAGS_reclaim_hazard) ? " + reclaim hazard" : "",
                   absl::GetFlag(FLAGS_hysteresis) != 1
                       ? absl::StrFormat(", hysteresis %.3g", absl::GetFlag(FLAGS_hysteresis))
                       : "",
                   absl::GetFlag(FLAGS_rank_weights) > 0
                       ? absl::StrFormat(", rank weights ^%.3g", absl::GetFlag(FLAGS_rank_weights))
                       : "",
                   absl::GetFlag(FLAGS_rank_aging_h) != 0
                       ? absl::StrFormat(" aged over %.3g h", absl::GetFlag(FLAGS_rank_aging_h))
                       : "",
                   absl::GetFlag(FLAGS_node_classes).empty()
                       ? ""
                       : absl::StrFormat(", node classes %s (cross-locality factor %.3g)",
                                         absl::GetFlag(FLAGS_node_classes),
                                         absl::GetFlag(FLAGS_cross_locality_factor))),
      absl::GetFlag(FLAGS_accounting), absl::GetFlag(FLAGS_preemption_cost),
      absl::GetFlag(FLAGS_objective), absl::GetFlag(FLAGS_resize_cost),
      absl::GetFlag(FLAGS_terms_t_fwd_s) > 0
          ? absl::StrFormat(" and T_fwd %.0f s", absl::GetFlag(FLAGS_terms_t_fwd_s))
          : "",
      absl::GetFlag(FLAGS_terms_for), base->max_waiting, base->max_jobs,
      base->max_jobs > 0 ? "" : " (no limit)", absl::GetFlag(FLAGS_regimes), copies, period_h,
      absl::ToDoubleSeconds(absl::Now() - t_load));
  struct Window {
    absl::Time start, end;
  };
  std::vector<Window> windows;
  for (Machine& m : machines) {
    const absl::Time start = ReplayStart(m.trace, m.skip_snapshots);
    absl::Time end = std::max(m.trace.end, m.trace.events.back().time);
    if (absl::GetFlag(FLAGS_hours) > 0)
      end = std::min(end, start + absl::Hours(absl::GetFlag(FLAGS_hours)));
    windows.push_back({start, end});
    std::cout << absl::StrFormat(
        "  machine %s: %d nodes, %d events; replay %s .. %s (%.1f days, skip_snapshots %d)%s%s\n",
        m.name, m.trace.nodes.size(), m.trace.events.size(),
        absl::FormatTime("%Y-%m-%d %H:%M", start, absl::UTCTimeZone()),
        absl::FormatTime("%Y-%m-%d %H:%M", end, absl::UTCTimeZone()),
        absl::ToDoubleHours(end - start) / 24, m.skip_snapshots, m.note.empty() ? "" : "\n    ",
        m.note);
  }
  for (const auto& [name, mix] : mixes) {
    std::cout << absl::StrFormat("  mix %s: %d jobs\n", name, mix.jobs.size());
  }
  std::cout << std::flush;

  const bool all_curves = *curves_for == std::vector<std::string>{"all"};
  const std::vector<std::string> terms_for =
      absl::StrSplit(absl::GetFlag(FLAGS_terms_for), ',', absl::SkipEmpty());
  const bool terms_for_all = terms_for == std::vector<std::string>{"all"};
  std::vector<Row> rows;
  int failures = 0;
  for (size_t mi = 0; mi < machines.size(); ++mi) {
    const Machine& machine = machines[mi];
    const absl::Time start = windows[mi].start, end = windows[mi].end;
    for (const std::string& regime : *regime_names) {
      for (const auto& [mix_name, mix] : mixes) {
        std::vector<sim::MixJob> jobs = mix.jobs;
        std::string label = absl::StrCat(machine.name, "/", regime, "/", mix_name);
        if (regime == "saturated") {
          auto repeated = sim::RepeatMix(mix.jobs, copies, absl::Hours(period_h));
          if (!repeated.ok()) {
            std::cerr << repeated.status() << "\n";
            return 2;
          }
          jobs = *std::move(repeated);
          absl::StrAppend(&label, "x", copies);
        }
        for (alloc::PolicyKind policy : policies) {
          const std::string policy_name(alloc::PolicyName(policy));
          const bool every_mode = all_curves || std::find(curves_for->begin(), curves_for->end(),
                                                          policy_name) != curves_for->end();
          for (size_t c = 0; c < curves.size(); ++c) {
            if (c > 0 && !every_mode) break;
            Row row;
            row.mix = label;
            row.machine = machine.name;
            row.regime = regime;
            row.mix_name = mix_name;
            row.policy = policy_name;
            row.curves = (*curve_names)[c];
            row.milp = policy == alloc::PolicyKind::kMilp;
            sim::SimOptions o = *base;
            if (!terms_for_all &&
                std::find(terms_for.begin(), terms_for.end(), policy_name) == terms_for.end()) {
              o.reclaim_hazard = false;
              o.resize_hysteresis = 1;
              o.rank_weight_exponent = 0;
              o.rank_aging = absl::InfiniteDuration();
              o.objective = alloc::Objective::kThroughput;
            } else if (absl::GetFlag(FLAGS_terms_t_fwd_s) > 0) {
              o.forward_window = absl::Seconds(absl::GetFlag(FLAGS_terms_t_fwd_s));
            }
            o.skip_snapshots = machine.skip_snapshots;
            o.end = end;
            o.decide.policy = policy;
            o.curves = curves[c];
            const std::string dump_dir = absl::GetFlag(FLAGS_dump_dir);
            o.record_events = !dump_dir.empty() && absl::GetFlag(FLAGS_dump_events);
            MilpAudit& audit = row.audit;
            if (row.milp) {
              const bool audit_all = absl::GetFlag(FLAGS_audit_all);
              const std::string unproven_stem =
                  absl::GetFlag(FLAGS_dump_unproven).empty()
                      ? std::string()
                      : absl::StrCat(absl::GetFlag(FLAGS_dump_unproven), "/", machine.name, "_",
                                     regime, "_", mix_name, "_", row.curves, "_");
              const double dump_over_ms = absl::GetFlag(FLAGS_dump_over_ms);
              o.on_decision = [&audit, audit_all, unproven_stem, dump_over_ms,
                               model_options = o.decide.model](const alloc::Problem& problem,
                                                               const alloc::Decision& d,
                                                               absl::Duration took) {
                const absl::Time t0 = absl::Now();
                ++audit.decisions;
                const double ms = absl::ToDoubleMilliseconds(took);
                audit.milp_ms += ms;
                const int bucket = JobBucket(static_cast<int>(problem.jobs.size()));
                ++audit.all_by_jobs[bucket];
                audit.ms_by_jobs[bucket] += ms;
                if (ms > 100) {
                  audit.slow_ms.push_back(ms);
                  ++audit.slow_by_jobs[bucket];
                }
                const alloc::PolicyResult& pr = d.result;
                // The bound the MILP reached (proven: within --milp_relative_gap);
                // a fallback is proven only if the exact DP answered.
                const double gap =
                    pr.fell_back ? (pr.optimal ? 0.0 : std::numeric_limits<double>::infinity())
                                 : std::max(0.0, pr.best_bound - d.objective) /
                                       std::max(std::fabs(d.objective), 1e-12);
                // The pools the MILP saw (the count model Decide compiled).
                if (absl::StatusOr<alloc::CountModel> model =
                        alloc::CompileCountModel(problem, model_options);
                    model.ok()) {
                  const bool proven = pr.optimal && !pr.fell_back;
                  audit.by_pools[PoolBucket(static_cast<int>(model->pools.size()))].push_back(
                      {static_cast<int>(problem.jobs.size()), ms, proven, gap});
                  if (!unproven_stem.empty() &&
                      static_cast<int>(model->pools.size()) >= kMultiPoolTargetPools &&
                      (gap > kMultiPoolTargetGap || (dump_over_ms > 0 && ms > dump_over_ms)) &&
                      audit.dumped < 50) {
                    const std::string path = absl::StrCat(unproven_stem, audit.dumped++, ".json");
                    std::cerr << "\n  " << (gap > kMultiPoolTargetGap ? "unproven" : "slow")
                              << " (gap " << gap << ", " << ms << " ms, " << problem.jobs.size()
                              << " jobs): " << path;
                    WriteText(path, alloc::ProblemToJson(problem));
                  }
                }
                if (pr.fell_back) {
                  ++audit.fell_back;
                } else if (pr.optimal) {
                  ++audit.optimal;
                } else {
                  ++audit.time_limit;
                  audit.max_gap_bound = std::max(audit.max_gap_bound, gap);
                }
                if (audit_all || !pr.optimal || pr.fell_back) {
                  // The exact DP with its own limits; a problem beyond them,
                  // which Decide hands to the MILP, is not audited.
                  alloc::DecideOptions dp;
                  dp.policy = alloc::PolicyKind::kDp;
                  dp.dp = alloc::DpOptions{};
                  auto exact = alloc::Decide(problem, dp);
                  if (exact.ok() && exact->result.optimal && !exact->result.fell_back) {
                    ++audit.audited;
                    const double gap = (exact->objective - d.objective) /
                                       std::max(std::fabs(exact->objective), 1e-12);
                    audit.max_gap_dp = std::max(audit.max_gap_dp, gap);
                    audit.sum_gap_dp += std::max(0.0, gap);
                    if (gap > 1e-9) ++audit.worse_than_dp;
                  }
                }
                audit.audit_s += absl::ToDoubleSeconds(absl::Now() - t0);
              };
            }
            if (policy == alloc::PolicyKind::kDp) {
              o.on_decision = [&audit](const alloc::Problem&, const alloc::Decision& d,
                                       absl::Duration took) {
                const double ms = absl::ToDoubleMilliseconds(took);
                ++audit.decisions;
                if (d.result.fell_back && d.result.answered_by != "milp") {
                  // Neither the DP nor the MILP's search could answer: a
                  // heuristic's answer or the current allocation.
                  ++audit.dp_by_heuristic;
                } else if (d.result.fell_back) {
                  ++audit.dp_by_milp;
                  audit.dp_by_milp_proven += d.result.optimal;
                  audit.dp_by_milp_ms += ms;
                } else {
                  audit.dp_own_ms += ms;
                }
              };
            }
            std::cerr << absl::StrFormat("[%6.0f s] %s %s %s ...",
                                         absl::ToDoubleSeconds(absl::Now() - program_start),
                                         row.mix, row.policy, row.curves)
                      << std::flush;
            absl::StatusOr<sim::SimResult> r = sim::Simulate(machine.trace, jobs, o);
            if (!r.ok()) {
              std::cerr << " failed: " << r.status() << "\n";
              ++failures;
              continue;
            }
            if (!dump_dir.empty()) {
              const std::string stem = absl::StrCat(dump_dir, "/", machine.name, "_", regime, "_",
                                                    mix_name, "_", row.policy, "_", row.curves);
              failures += !WriteText(stem + ".jobs.csv", sim::JobsToCsv(r->jobs));
              if (o.record_events) {
                failures += !WriteText(stem + ".events.csv", sim::EventsToCsv(r->events));
              }
            }
            row.s = r->summary;
            row.wall_s = r->summary.wall_s - audit.audit_s;
            row.eff_best = BestSizeEfficiency(jobs, *r, FastestSpeed(o));
            row.samples_nh_ceiling = SamplesPerNodeHourCeiling(jobs, *r, FastestSpeed(o));
            row.replay_s = absl::ToDoubleSeconds(end - start);
            std::cerr << absl::StrFormat(" %.1f s, eff %.1f%%, %d/%d jobs\n", row.wall_s,
                                         100 * row.s.efficiency, row.s.jobs_finished,
                                         row.s.jobs_submitted);
            rows.push_back(std::move(row));
          }
        }
      }
    }
  }

  std::cout << "\n";
  PrintTable(rows);
  std::vector<std::string> labels;
  for (const Row& r : rows) {
    if (std::find(labels.begin(), labels.end(), r.mix) == labels.end()) labels.push_back(r.mix);
  }
  PrintReferences(rows, labels);
  PrintDpAudit(rows);
  PrintAudit(rows);
  PrintUserTable(rows);
  PrintWinTargets(rows, (*curve_names)[0]);

  // Speed targets: the full replays.
  const bool full = absl::GetFlag(FLAGS_hours) == 0;
  std::cout << "\nSpeed targets (one core per replay):\n";
  for (const Row& r : rows) {
    if (r.curves != (*curve_names)[0]) continue;
    if (r.regime == "light" && r.machine == "summit" && r.s.jobs_submitted == 1001 &&
        (r.policy == "dp" || r.policy == "milp")) {
      const double target = r.policy == "dp" ? 60 : 300;
      std::cout << absl::StrFormat(
          "  full 15-day Summit replay, 1,001-job mix, %-4s < %3.0f s: %7.1f s  %s\n", r.policy,
          target, r.wall_s,
          !full               ? "(partial replay: not a measurement of the target)"
          : r.wall_s < target ? "MET"
                              : "MISSED");
    }
    if (r.machine != "summit" && r.policy == "dp") {
      double days = 0;
      for (const Machine& m : machines) {
        if (m.name == r.machine) days = m.span_days;
      }
      // A year of log with the mix done in its first hours is a short
      // replay, not a year's decisions: the target counts only where jobs
      // were present most of the year.
      const double present = r.s.active_hours / std::max(days * 24.0, 1e-9);
      std::cout << absl::StrFormat(
          "  year-long log with the dp < 300 s: %s, %s (%.0f days, %d jobs, present %.0f %% of "
          "the log): %7.1f s  %s\n",
          r.machine, r.regime, days, r.s.jobs_submitted, 100.0 * present, r.wall_s,
          !full           ? "(partial replay: not a measurement of the target)"
          : days < 300    ? "(not a year-long log: not a measurement of the target)"
          : present < 0.5 ? "(jobs present less than half the log: not a measurement of the target)"
          : r.wall_s < 300 ? "MET"
                           : "MISSED");
    }
  }
  PrintMultiPoolTargets(rows);
  std::cout << absl::StrFormat("\ntotal wall time %.1f s\n",
                               absl::ToDoubleSeconds(absl::Now() - program_start));
  if (!absl::GetFlag(FLAGS_csv).empty() && !WriteCsv(absl::GetFlag(FLAGS_csv), rows)) {
    std::cerr << "\n";
    ++failures;
  }
  return failures > 0 ? 1 : 0;
}
