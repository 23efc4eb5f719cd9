// Bindings of libmalle/alloc: solve or validate an allocation problem given
// as JSON. The Python API (dicts, paths, timedelta) is malletrain/alloc.py;
// this only adapts strings and errors.
#include <pybind11/pybind11.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/decide.h"
#include "libmalle/alloc/problem.h"
#include "libmalle/alloc/problem_json.h"
#include "python/src/bind_common.h"

namespace py = pybind11;

namespace malle::python {
namespace {

std::string Solve(const std::string& problem_json, const std::string& options_json) {
  alloc::Problem problem = ValueOrThrow(alloc::ParseProblemJson(problem_json));
  alloc::DecideOptions options = ValueOrThrow(alloc::ParseDecideOptionsJson(options_json));
  alloc::Decision decision = ValueOrThrow(alloc::Decide(problem, options));
  return alloc::DecisionToJson(problem, decision, /*indent=*/-1);
}

std::string Validate(const std::string& problem_json) {
  alloc::Problem problem = ValueOrThrow(alloc::ParseProblemJson(problem_json));
  alloc::CountModel model = ValueOrThrow(alloc::CompileCountModel(problem));
  return absl::StrCat("ok: ", problem.jobs.size(), " jobs, ", problem.nodes.size(), " nodes, ",
                      model.pools.size(), " pools");
}

}  // namespace

void BindAlloc(py::module_& m) {
  // The strings are copied into std::string before the GIL is released.
  m.def("alloc_solve", &Solve, py::arg("problem_json"), py::arg("options_json"),
        py::call_guard<py::gil_scoped_release>(),
        "Decides an allocation; returns the decision as compact JSON. Blocks for up to the "
        "MILP time limit (plus its kill grace).");
  m.def("alloc_validate", &Validate, py::arg("problem_json"),
        py::call_guard<py::gil_scoped_release>(),
        "Checks a problem; returns \"ok: N jobs, M nodes, K pools\".");
}

}  // namespace malle::python
