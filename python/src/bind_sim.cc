// Bindings of libmalle/sim: load an idle-node trace and a job mix once, then
// replay them under any policy. The Python API (keyword options, records,
// plots, progress bars) is malletrain/sim.py; this only adapts types and
// errors and releases the GIL while the replay runs.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libmalle/alloc/decide.h"
#include "libmalle/sim/engine.h"
#include "libmalle/sim/idle_trace.h"
#include "libmalle/sim/job_mix.h"
#include "libmalle/sim/swf.h"
#include "python/src/bind_common.h"

namespace py = pybind11;

namespace malle::python {
namespace {

struct TraceHandle {
  std::shared_ptr<const sim::IdleTrace> trace;
  // Set when the trace was derived from an SWF log.
  std::shared_ptr<const sim::SwfReplayReport> swf;
};
struct MixHandle {
  std::shared_ptr<const sim::JobMix> mix;
};

double UnixSeconds(absl::Time t) {
  if (t == absl::InfiniteFuture() || t == absl::InfinitePast()) return -1.0;
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

template <typename Enum>
Enum ParseName(const std::string& field, const std::string& value,
               const std::vector<std::pair<const char*, Enum>>& names) {
  std::string valid;
  for (const auto& [name, e] : names) {
    if (value == name) return e;
    absl::StrAppend(&valid, valid.empty() ? "" : ", ", name);
  }
  throw StatusError(absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown value \"", value, "\"; expected one of ", valid)));
}

py::object SwfReportDict(const TraceHandle& h) {
  if (!h.swf) return py::none();
  const sim::SwfReplayReport& r = *h.swf;
  py::dict d;
  d["nodes"] = r.nodes;
  d["procs_per_node"] = r.procs_per_node;
  d["jobs_replayed"] = r.jobs_replayed;
  d["jobs_zero_length"] = r.jobs_zero_length;
  d["jobs_unknown_times"] = r.jobs_unknown_times;
  d["jobs_unknown_procs"] = r.jobs_unknown_procs;
  d["jobs_requested_procs"] = r.jobs_requested_procs;
  d["summary_lines_replaced"] = r.summary_lines_replaced;
  d["oversized_jobs"] = r.oversized_jobs;
  d["oversubscribed_jobs"] = r.oversubscribed_jobs;
  d["oversubscribed_node_seconds"] = r.oversubscribed_node_seconds;
  d["asked_node_seconds"] = r.asked_node_seconds;
  d["busy_node_seconds"] = r.busy_node_seconds;
  d["peak_asked_nodes"] = r.peak_asked_nodes;
  d["jobs_wait_assumed_zero"] = r.jobs_wait_assumed_zero;
  d["absolute_times"] = r.absolute_times;
  if (r.ignored_unix_start_time >= 0) {
    d["ignored_unix_start_time"] = r.ignored_unix_start_time;
  } else {
    d["ignored_unix_start_time"] = py::none();
  }
  d["skipped_lead_s"] = r.skipped_lead_s;
  d["span_s"] = r.span_s;
  return std::move(d);
}

py::list LineErrors(const std::vector<sim::LineError>& errors) {
  py::list out;
  for (const sim::LineError& e : errors) {
    out.append(py::make_tuple(e.file, e.line, e.message));
  }
  return out;
}

// Keyword options of malletrain.sim.simulate, already checked for type in
// Python; ranges are checked by Simulate.
struct Options {
  std::string policy = "dp";
  std::string objective = "throughput";
  std::string resize_cost = "bftrainer";
  std::string accounting = "bftrainer";
  // sim::PreemptionCostOptions; the defaults are C++'s (see ToSimOptions).
  std::string preemption_cost = "park";
  double state_bytes = sim::PreemptionCostOptions{}.state_bytes;
  double write_bytes_per_s = sim::PreemptionCostOptions{}.write_bytes_per_s;
  double read_bytes_per_s = sim::PreemptionCostOptions{}.read_bytes_per_s;
  double copy_bytes_per_s = sim::PreemptionCostOptions{}.copy_bytes_per_s;
  double park_fixed_s = absl::ToDoubleSeconds(sim::PreemptionCostOptions{}.park_fixed);
  double unpark_fixed_s = absl::ToDoubleSeconds(sim::PreemptionCostOptions{}.unpark_fixed);
  double snapshot_interval_s = 0;
  double snapshot_budget = sim::PreemptionCostOptions{}.snapshot_budget;
  std::string curves = "oracle";
  std::string forecast = "none";
  // sim::ParseNodeClassShares's spec ("id:locality:speed:share,..."); empty:
  // one class.
  std::string node_classes;
  double cross_locality_factor = 1.0;
  bool reclaim_hazard = false;
  double resize_hysteresis = 1;
  double rank_weight_exponent = 0;
  double rank_aging_s = std::numeric_limits<double>::infinity();  // infinite: off
  double forward_window_s = 120;
  double debounce_s = 0;
  int max_waiting = 64;
  double learned_warmup_s = 0;
  double time_limit_s = 1;
  int skip_snapshots = 0;
  double start = -1, end = -1;  // Unix seconds; < 0: the trace's bounds
  bool align_submit_times = true;
  long long seed = 1;
  bool record_events = false;
  double timeline_step_s = 600;
};

sim::SimOptions ToSimOptions(const Options& o) {
  sim::SimOptions s;
  s.decide.policy = ValueOrThrow(alloc::ParsePolicyName(o.policy));
  s.decide.milp.time_limit = absl::Seconds(o.time_limit_s);
  s.objective = ValueOrThrow(alloc::ParseObjectiveName(o.objective));
  s.resize_cost = ParseName<alloc::ResizeCostModel>(
      "resize_cost", o.resize_cost,
      {{"bftrainer", alloc::ResizeCostModel::kBftrainer},
       {"lost_work", alloc::ResizeCostModel::kLostWork}});
  s.accounting = ParseName<sim::Accounting>(
      "accounting", o.accounting,
      {{"bftrainer", sim::Accounting::kBftrainer}, {"pause", sim::Accounting::kPause}});
  s.preemption.mode = ValueOrThrow(sim::ParsePreemptionCost(o.preemption_cost));
  s.preemption.state_bytes = o.state_bytes;
  s.preemption.write_bytes_per_s = o.write_bytes_per_s;
  s.preemption.read_bytes_per_s = o.read_bytes_per_s;
  s.preemption.copy_bytes_per_s = o.copy_bytes_per_s;
  s.preemption.park_fixed = absl::Seconds(o.park_fixed_s);
  s.preemption.unpark_fixed = absl::Seconds(o.unpark_fixed_s);
  s.preemption.snapshot_interval = absl::Seconds(o.snapshot_interval_s);
  s.preemption.snapshot_budget = o.snapshot_budget;
  s.curves = ParseName<sim::CurveMode>(
      "curves", o.curves,
      {{"oracle", sim::CurveMode::kOracle},
       {"learned", sim::CurveMode::kLearned},
       {"linear", sim::CurveMode::kLinear}});
  s.forecast = ParseName<sim::ForecastMode>("forecast", o.forecast,
                                            {{"none", sim::ForecastMode::kNone},
                                             {"oracle", sim::ForecastMode::kOracle},
                                             {"estimated", sim::ForecastMode::kEstimated},
                                             {"reservation", sim::ForecastMode::kReservation}});
  if (!o.node_classes.empty())
    s.node_classes = ValueOrThrow(sim::ParseNodeClassShares(o.node_classes));
  s.cross_locality_factor = o.cross_locality_factor;
  s.reclaim_hazard = o.reclaim_hazard;
  s.resize_hysteresis = o.resize_hysteresis;
  s.rank_weight_exponent = o.rank_weight_exponent;
  // SimOptions' validation names a value that is not > 0 (NaN reads as 0).
  s.rank_aging = std::isinf(o.rank_aging_s) && o.rank_aging_s > 0
                     ? absl::InfiniteDuration()
                     : absl::Seconds(std::isnan(o.rank_aging_s) ? 0 : o.rank_aging_s);
  s.forward_window = absl::Seconds(o.forward_window_s);
  s.debounce = absl::Seconds(o.debounce_s);
  s.max_waiting = o.max_waiting;
  s.learned_warmup = absl::Seconds(o.learned_warmup_s);
  s.skip_snapshots = o.skip_snapshots;
  if (o.start >= 0) s.start = absl::FromUnixSeconds(0) + absl::Seconds(o.start);
  if (o.end >= 0) s.end = absl::FromUnixSeconds(0) + absl::Seconds(o.end);
  s.align_submit_times = o.align_submit_times;
  s.seed = static_cast<uint64_t>(o.seed);
  s.record_events = o.record_events;
  s.timeline_step = absl::Seconds(o.timeline_step_s);
  return s;
}

py::dict SummaryDict(const sim::Summary& s) {
  py::dict d;
  d["policy"] = s.policy;
  d["samples_trained"] = s.samples_trained;
  d["idle_node_hours"] = s.idle_node_hours;
  d["used_node_hours"] = s.used_node_hours;
  d["efficiency"] = s.efficiency;
  d["utilisation"] = s.utilisation;
  d["jobs_submitted"] = s.jobs_submitted;
  d["jobs_finished"] = s.jobs_finished;
  d["resizes"] = s.resizes;
  d["preemptions"] = s.preemptions;
  d["reclaims"] = s.reclaims;
  d["decisions"] = s.decisions;
  d["decisions_fell_back"] = s.decisions_fell_back;
  d["decision_p50_ms"] = s.decision_p50_ms;
  d["decision_p99_ms"] = s.decision_p99_ms;
  d["decision_max_ms"] = s.decision_max_ms;
  d["wall_s"] = s.wall_s;
  d["jct_mean_s"] = s.jct_mean_s;
  d["jct_median_s"] = s.jct_median_s;
  d["makespan_s"] = s.makespan_s;
  d["jct_p95_s"] = s.jct_p95_s;
  d["jct_max_s"] = s.jct_max_s;
  d["samples_per_node_hour"] = s.samples_per_node_hour;
  d["lost_to_resizes"] = s.lost_to_resizes;
  d["lost_to_reclaims"] = s.lost_to_reclaims;
  d["preemption_cost"] = s.preemption_cost;
  d["lost_to_preemptions"] = s.lost_to_preemptions;
  d["lost_to_snapshots"] = s.lost_to_snapshots;
  d["stops"] = s.stops;
  d["active_hours"] = s.active_hours;
  d["active_idle_node_hours"] = s.active_idle_node_hours;
  d["active_utilisation"] = s.active_utilisation;
  d["contended_fraction"] = s.contended_fraction;
  d["warnings"] = s.warnings;
  return d;
}

py::dict ResultDict(const sim::SimResult& r) {
  py::dict out;
  out["summary"] = SummaryDict(r.summary);
  py::list jobs;
  for (const sim::JobOutcome& j : r.jobs) {
    py::dict d;
    d["name"] = j.name;
    d["submit"] = UnixSeconds(j.submit);
    d["first_start"] = UnixSeconds(j.first_start);
    d["finish"] = UnixSeconds(j.finish);
    d["work_samples"] = j.work_samples;
    d["samples_done"] = j.samples_done;
    d["node_seconds"] = j.node_seconds;
    d["ideal_samples"] = j.ideal_samples;
    d["resizes"] = j.resizes;
    d["preemptions"] = j.preemptions;
    d["reclaims"] = j.reclaims;
    d["stops"] = j.stops;
    d["lost_to_preemptions"] = j.lost_to_preemptions;
    jobs.append(std::move(d));
  }
  out["jobs"] = std::move(jobs);
  py::list timeline;
  for (const sim::TimelineSample& t : r.timeline) {
    timeline.append(py::make_tuple(UnixSeconds(t.time), t.idle_nodes, t.used_nodes,
                                   t.running_jobs, t.waiting_jobs));
  }
  out["timeline"] = std::move(timeline);
  py::list events;
  for (const sim::EventRecord& e : r.events) {
    events.append(py::make_tuple(UnixSeconds(e.time), e.kind, e.job, e.node, e.nodes_before,
                                 e.nodes_after, e.idle_nodes, e.used_nodes, e.decision_ms));
  }
  out["events"] = std::move(events);
  return out;
}

}  // namespace

void BindSim(py::module_& m) {
  py::class_<TraceHandle>(m, "IdleTrace", "A loaded idle-node trace (opaque).")
      .def_property_readonly("num_nodes", [](const TraceHandle& h) { return h.trace->nodes.size(); })
      .def_property_readonly("num_events", [](const TraceHandle& h) { return h.trace->events.size(); })
      .def_property_readonly("rows", [](const TraceHandle& h) { return h.trace->rows; })
      .def_property_readonly("redundant_rows",
                             [](const TraceHandle& h) { return h.trace->redundant_rows; })
      .def_property_readonly("start", [](const TraceHandle& h) { return UnixSeconds(h.trace->start); })
      .def_property_readonly("end", [](const TraceHandle& h) { return UnixSeconds(h.trace->end); })
      .def_property_readonly("rejected",
                             [](const TraceHandle& h) { return LineErrors(h.trace->rejected); })
      .def_property_readonly("swf_report", &SwfReportDict,
                             "What the SWF replay did (dict), or None for a CSV trace.");
  py::class_<MixHandle>(m, "JobMix", "A loaded job mix (opaque).")
      .def_property_readonly("num_jobs", [](const MixHandle& h) { return h.mix->jobs.size(); })
      .def_property_readonly("names",
                             [](const MixHandle& h) {
                               std::vector<std::string> names;
                               for (const sim::MixJob& j : h.mix->jobs) names.push_back(j.name);
                               return names;
                             })
      .def_property_readonly("rejected",
                             [](const MixHandle& h) { return LineErrors(h.mix->rejected); })
      .def(
          "to_csv", [](const MixHandle& h) { return sim::JobMixToCsv(h.mix->jobs); },
          "The mix in the job-mix CSV format (what load_job_mix reads).");

  // Synthetic mixes: the defaults are SyntheticMixOptions' (C++); times in seconds.
  py::class_<sim::SyntheticMixOptions>(m, "SyntheticMixOptions",
                                       "Ranges of a synthetic job mix (see "
                                       "malletrain.sim.synthetic_job_mix).")
      .def(py::init<>())
      .def_property(
          "first_submit",
          [](const sim::SyntheticMixOptions& o) { return UnixSeconds(o.first_submit); },
          [](sim::SyntheticMixOptions& o, double unix_s) {
            o.first_submit = absl::UnixEpoch() + absl::Seconds(unix_s);
          })
      .def_property(
          "mean_interarrival_s",
          [](const sim::SyntheticMixOptions& o) {
            return absl::ToDoubleSeconds(o.mean_interarrival);
          },
          [](sim::SyntheticMixOptions& o, double s) { o.mean_interarrival = absl::Seconds(s); })
      .def_readwrite("min_nodes_lo", &sim::SyntheticMixOptions::min_nodes_lo)
      .def_readwrite("min_nodes_hi", &sim::SyntheticMixOptions::min_nodes_hi)
      .def_readwrite("max_nodes_lo", &sim::SyntheticMixOptions::max_nodes_lo)
      .def_readwrite("max_nodes_hi", &sim::SyntheticMixOptions::max_nodes_hi)
      .def_readwrite("rate_lo", &sim::SyntheticMixOptions::rate_lo)
      .def_readwrite("rate_hi", &sim::SyntheticMixOptions::rate_hi)
      .def_readwrite("serial_lo", &sim::SyntheticMixOptions::serial_lo)
      .def_readwrite("serial_hi", &sim::SyntheticMixOptions::serial_hi)
      .def_readwrite("work_hours_lo", &sim::SyntheticMixOptions::work_hours_lo)
      .def_readwrite("work_hours_hi", &sim::SyntheticMixOptions::work_hours_hi)
      .def_readwrite("rescale_up_s_lo", &sim::SyntheticMixOptions::rescale_up_s_lo)
      .def_readwrite("rescale_up_s_hi", &sim::SyntheticMixOptions::rescale_up_s_hi)
      .def_readwrite("rescale_down_s_lo", &sim::SyntheticMixOptions::rescale_down_s_lo)
      .def_readwrite("rescale_down_s_hi", &sim::SyntheticMixOptions::rescale_down_s_hi);
  m.def(
      "sim_synthetic_job_mix",
      [](int n, unsigned long long seed, const sim::SyntheticMixOptions& options) {
        auto mix = ValueOrThrow(sim::SyntheticJobMix(n, seed, options));
        return MixHandle{std::make_shared<const sim::JobMix>(std::move(mix))};
      },
      py::arg("n"), py::arg("seed"), py::arg("options"),
      "Draws a job mix of n jobs from seed (deterministic). Never blocks.");

  m.def(
      "sim_load_trace",
      [](const std::string& path, bool strict) {
        sim::IdleTraceOptions o;
        o.strict = strict;
        auto trace = ValueOrThrow(sim::LoadIdleTrace(path, o));
        return TraceHandle{std::make_shared<const sim::IdleTrace>(std::move(trace)), nullptr};
      },
      py::arg("path"), py::arg("strict") = false, py::call_guard<py::gil_scoped_release>(),
      "Loads an idle-node trace (.csv or .csv.gz). Blocks on the file read.");
  m.def(
      "sim_load_swf",
      [](const std::string& path, bool strict, long long nodes, long long procs_per_node,
         bool unknown_wait_is_zero) {
        sim::SwfOptions o;
        o.strict = strict;
        auto log = ValueOrThrow(sim::LoadSwf(path, o));
        sim::SwfReplayOptions r;
        r.nodes = nodes;
        r.procs_per_node = procs_per_node;
        r.unknown_wait_is_zero = unknown_wait_is_zero;
        auto swf = ValueOrThrow(sim::SwfToIdleTrace(log, r));
        return TraceHandle{std::make_shared<const sim::IdleTrace>(std::move(swf.trace)),
                           std::make_shared<const sim::SwfReplayReport>(swf.report)};
      },
      py::arg("path"), py::arg("strict") = false, py::arg("nodes") = 0,
      py::arg("procs_per_node") = 0, py::arg("unknown_wait_is_zero") = false,
      py::call_guard<py::gil_scoped_release>(),
      "Loads an SWF scheduler log (.swf or .swf.gz) and derives its idle-node trace. Blocks on "
      "the file read.");
  m.def(
      "sim_repeat_mix",
      [](const MixHandle& mix, int copies, double period_s) {
        auto jobs = ValueOrThrow(sim::RepeatMix(mix.mix->jobs, copies, absl::Seconds(period_s)));
        auto out = std::make_shared<sim::JobMix>();
        out->jobs = std::move(jobs);
        return MixHandle{std::move(out)};
      },
      py::arg("mix"), py::arg("copies"), py::arg("period_s"),
      "copies of the mix, copy k submitted k x period_s later (a saturated regime). Never "
      "blocks.");
  m.def(
      "sim_load_job_mix",
      [](const std::string& path, bool strict) {
        sim::JobMixOptions o;
        o.strict = strict;
        auto mix = ValueOrThrow(sim::LoadJobMix(path, o));
        return MixHandle{std::make_shared<const sim::JobMix>(std::move(mix))};
      },
      py::arg("path"), py::arg("strict") = false, py::call_guard<py::gil_scoped_release>(),
      "Loads a job-mix CSV file.");

  py::class_<Options>(m, "SimOptions", "Options of one replay (see malletrain.sim.simulate).")
      .def(py::init<>())
      .def_readwrite("policy", &Options::policy)
      .def_readwrite("objective", &Options::objective)
      .def_readwrite("resize_cost", &Options::resize_cost)
      .def_readwrite("accounting", &Options::accounting)
      .def_readwrite("preemption_cost", &Options::preemption_cost)
      .def_readwrite("state_bytes", &Options::state_bytes)
      .def_readwrite("write_bytes_per_s", &Options::write_bytes_per_s)
      .def_readwrite("read_bytes_per_s", &Options::read_bytes_per_s)
      .def_readwrite("copy_bytes_per_s", &Options::copy_bytes_per_s)
      .def_readwrite("park_fixed_s", &Options::park_fixed_s)
      .def_readwrite("unpark_fixed_s", &Options::unpark_fixed_s)
      .def_readwrite("snapshot_interval_s", &Options::snapshot_interval_s)
      .def_readwrite("snapshot_budget", &Options::snapshot_budget)
      .def_readwrite("curves", &Options::curves)
      .def_readwrite("forecast", &Options::forecast)
      .def_readwrite("node_classes", &Options::node_classes)
      .def_readwrite("cross_locality_factor", &Options::cross_locality_factor)
      .def_readwrite("reclaim_hazard", &Options::reclaim_hazard)
      .def_readwrite("resize_hysteresis", &Options::resize_hysteresis)
      .def_readwrite("rank_weight_exponent", &Options::rank_weight_exponent)
      .def_readwrite("rank_aging_s", &Options::rank_aging_s)
      .def_readwrite("forward_window_s", &Options::forward_window_s)
      .def_readwrite("debounce_s", &Options::debounce_s)
      .def_readwrite("max_waiting", &Options::max_waiting)
      .def_readwrite("learned_warmup_s", &Options::learned_warmup_s)
      .def_readwrite("time_limit_s", &Options::time_limit_s)
      .def_readwrite("skip_snapshots", &Options::skip_snapshots)
      .def_readwrite("start", &Options::start)
      .def_readwrite("end", &Options::end)
      .def_readwrite("align_submit_times", &Options::align_submit_times)
      .def_readwrite("seed", &Options::seed)
      .def_readwrite("record_events", &Options::record_events)
      .def_readwrite("timeline_step_s", &Options::timeline_step_s);

  m.def(
      "sim_run",
      [](const TraceHandle& trace, const MixHandle& mix, const Options& options,
         std::function<void(double)> progress) {
        sim::SimOptions o = ToSimOptions(options);
        if (progress) {
          // Called from the replay thread without the GIL; take it briefly.
          o.progress = [progress](double fraction) {
            py::gil_scoped_acquire gil;
            try {
              progress(fraction);
            } catch (py::error_already_set& e) {
              // libmalle does not throw through; a broken progress bar must
              // not end the replay. Python reports it as unraisable.
              e.discard_as_unraisable("malletrain.sim progress callback");
            }
          };
        }
        absl::StatusOr<sim::SimResult> result;
        {
          py::gil_scoped_release release;
          result = sim::Simulate(*trace.trace, mix.mix->jobs, o);
        }
        return ResultDict(ValueOrThrow(std::move(result)));
      },
      py::arg("trace"), py::arg("mix"), py::arg("options"), py::arg("progress") = nullptr,
      "Replays the trace with the mix under options.policy; returns plain records. Blocks "
      "for the whole replay (the GIL is released; `progress` is called with it held).");

  // The four figures users feel, from a summary dict (sim_run's), by name.
  auto user_figures = [](const py::dict& d, const char* which) {
    sim::Summary s;
    const std::pair<const char*, double sim::Summary::*> fields[] = {
        {"samples_per_node_hour", &sim::Summary::samples_per_node_hour},
        {"jct_mean_s", &sim::Summary::jct_mean_s},
        {"jct_p95_s", &sim::Summary::jct_p95_s},
        {"efficiency", &sim::Summary::efficiency},
    };
    for (const auto& [key, field] : fields) {
      if (!d.contains(key)) {
        throw StatusError(absl::InvalidArgumentError(
            absl::StrCat(which, ": a simulation summary needs \"", key, "\"")));
      }
      s.*field = py::cast<double>(d[key]);
    }
    return s;
  };
  m.def(
      "sim_worse_user_figures",
      [user_figures](const py::dict& ours, const py::dict& base) {
        return sim::WorseUserFigures(user_figures(ours, "ours"), user_figures(base, "base"));
      },
      py::arg("ours"), py::arg("base"),
      "The figures users feel where `ours` is worse than `base` (two summaries of the same "
      "jobs): 'samples/nh', 'JCT mean', 'JCT p95', 'eff', in that order. Never blocks.");
  m.def(
      "sim_dominated_on_user_figures",
      [user_figures](const py::dict& ours, const py::dict& base) {
        return sim::DominatedOnUserFigures(user_figures(ours, "ours"), user_figures(base, "base"));
      },
      py::arg("ours"), py::arg("base"),
      "Whether `base` is at least as good as `ours` on all four figures users feel and better "
      "on one. Never blocks.");
}

}  // namespace malle::python
