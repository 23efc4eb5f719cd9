// malletrain._C bindings of libmalle/advisor: the in-process Job Profiling
// Advisor that malletrain.elastic feeds one sample per step. Record() is
// cheap and does not release the GIL (it never blocks); report_json() fits
// and releases it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <string>

#include "libmalle/advisor/advisor.h"
#include "libmalle/advisor/report_json.h"
#include "python/src/bind_common.h"

namespace malle::python {
namespace {

namespace py = pybind11;

absl::Duration Secs(double s) {
  // Validate() names the field; a NaN must reach it as something invalid.
  return std::isfinite(s) ? absl::Seconds(s) : absl::InfiniteDuration();
}

}  // namespace

void BindAdvisor(py::module_& m) {
  py::class_<advisor::Advisor>(m, "Advisor", "The job profiling advisor (one per rank).")
      .def(py::init([](const std::string& job, int min_nodes, int max_nodes, int skip_steps_after_resize,
                       int min_samples_per_config) {
             advisor::AdvisorOptions o;
             o.job_id = job;
             o.min_nodes = min_nodes;
             o.max_nodes = max_nodes;
             o.skip_steps_after_resize = skip_steps_after_resize;
             o.min_samples_per_config = min_samples_per_config;
             return ValueOrThrow(advisor::Advisor::Create(o)).release();
           }),
           py::arg("job"), py::arg("min_nodes"), py::arg("max_nodes"), py::arg("skip_steps_after_resize") = 3,
           py::arg("min_samples_per_config") = 10)
      .def(
          "record",
          [](advisor::Advisor& a, int64_t step, int world_size, int logical_workers, int64_t local_batch,
             int64_t global_batch, double data_wait_s, double compute_s, double comm_s, double optimizer_s,
             double resize_pause_s, double total_s, bool after_resize, bool after_failure, bool warmup) {
            advisor::StepSample s;
            s.step = step;
            s.world_size = world_size;
            s.logical_workers = logical_workers;
            s.local_batch = local_batch;
            s.global_batch = global_batch;
            s.data_wait = Secs(data_wait_s);
            s.compute = Secs(compute_s);
            s.comm = Secs(comm_s);
            s.optimizer = Secs(optimizer_s);
            s.resize_pause = Secs(resize_pause_s);
            s.total = Secs(total_s);
            s.after_resize = after_resize;
            s.after_failure = after_failure;
            s.warmup = warmup;
            ThrowIfError(a.Record(s));
          },
          py::arg("step"), py::arg("world_size"), py::arg("logical_workers"), py::arg("local_batch"),
          py::arg("global_batch"), py::arg("data_wait_s"), py::arg("compute_s"), py::arg("comm_s"),
          py::arg("optimizer_s"), py::arg("resize_pause_s"), py::arg("total_s"), py::arg("after_resize"),
          py::arg("after_failure"), py::arg("warmup"))
      .def(
          "report_json",
          [](advisor::Advisor& a) {
            advisor::AdvisorReport r;
            {
              py::gil_scoped_release release;
              r = a.Report();
            }
            return advisor::ReportToJson(r);
          },
          "The current report as JSON (fits the model; docs/advisor.md has the format).");
  m.def(
      "advisor_report_table",
      [](const std::string& report_json) {
        return advisor::FormatReportTable(ValueOrThrow(advisor::ParseReportJson(report_json)));
      },
      py::arg("report_json"), "A report as a human-readable scalability table.");
  m.def(
      "advisor_validate_report",
      [](const std::string& report_json) { ThrowIfError(advisor::ParseReportJson(report_json).status()); },
      py::arg("report_json"), "Raises ValueError naming the field if the report is malformed.");
}

}  // namespace malle::python
