// Binding of libmalle/elastic/bucket_sync.h for the Python ElasticModel: the
// elastic comm hook is registered, in C++, on the torch.distributed Reducer
// that malletrain.elastic builds, so each gradient bucket is summed over the
// current generation and its future completed without Python.
//
// A translation unit of its own: reaching the Reducer behind a Python object
// needs c10d's reducer.hpp (autograd and c10d headers), kept out of
// bind_elastic.cc's rebuilds. The cast works because this module is built
// with torch's own pybind11 (python/CMakeLists.txt), so both share pybind11's
// type registry.
#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "libmalle/comm/elastic_group.h"
#include "libmalle/elastic/bucket_sync.h"
#include "python/src/bind_common.h"

namespace py = pybind11;

namespace malle::python {

void BindBucketSync(py::module_& m) {
  using elastic::BucketSync;
  py::class_<BucketSync, std::shared_ptr<BucketSync>>(
      m, "BucketSync",
      "The elastic comm hook: sums each gradient bucket over the armed generation and "
      "completes its future, all in C++.")
      .def(py::init([] { return std::make_shared<BucketSync>(); }))
      .def(
          "register",
          [](const std::shared_ptr<BucketSync>& s, py::object reducer) {
            c10d::Reducer* r = nullptr;
            try {
              r = &reducer.cast<c10d::Reducer&>();
            } catch (const py::cast_error&) {
              ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
                  "reducer: expected a torch.distributed.Reducer, got ",
                  py::str(py::type::of(reducer)).cast<std::string>())));
            }
            ThrowIfError(elastic::RegisterCommHook(*r, s));
          },
          py::arg("reducer"),
          "Makes this the comm hook of `reducer` (a torch.distributed.Reducer; once, before "
          "its first backward).")
      .def(
          "arm",
          [](BucketSync& s, comm::ElasticGroup* group) {
            comm::Communicator* comm = nullptr;
            if (group != nullptr) {
              if (!group->active()) {
                ThrowIfError(absl::FailedPreconditionError(absl::StrCat(
                    "member ", group->member_id(), " is no longer in job ", group->job_id())));
              }
              comm = &group->comm();
            }
            s.Arm(comm);
          },
          py::arg("group"),
          "The next buckets are summed over `group`'s current generation (None: handed back "
          "unreduced).")
      .def(
          "take",
          [](BucketSync& s) {
            BucketSync::Tally t = s.Take();
            ThrowIfError(t.error);
            py::object last = py::none();
            if (t.last_launch.has_value()) {
              // steady_clock is CLOCK_MONOTONIC, the clock of time.perf_counter().
              last = py::float_(
                  std::chrono::duration<double>(t.last_launch->time_since_epoch()).count());
            }
            return py::make_tuple(t.launched, t.completed, last);
          },
          "(launched, completed, time.perf_counter() of the last bucket's hook or None) since "
          "the last take(), and resets; raises the first failed collective's error (e.g. "
          "RankFailureError) if one failed.")
      .def(
          "close",
          [](BucketSync& s) {
            py::gil_scoped_release release;  // waits for the buckets in flight
            s.Close();
          },
          "Completes the buckets in flight and stops the waiter thread; later buckets are "
          "handed back unreduced.");
}

}  // namespace malle::python
