// Shared by every bind_<module>.cc: the one C++ error type of the binding and
// the per-module binding entry points.
//
// libmalle never throws (absl::Status in, absl::Status out). A binding that
// gets a non-OK status throws StatusError; the translator registered by
// BindBase turns it into the matching class of malletrain.errors (the mapping
// itself is plain Python, malletrain.errors._from_status):
//
//   m.def("connect", [](const std::string& addr) {
//     py::gil_scoped_release release;  // may block
//     return malle::python::ValueOrThrow(Connect(addr));
//   });
//
// A status may name its Python class explicitly with a payload at
// kErrorClassPayloadUrl (e.g. "StoreError" for an UNAVAILABLE control store,
// which would otherwise map to RankFailureError).
//
// Thread-safety: StatusError is an ordinary value type; ThrowIfError and
// ValueOrThrow may be called with or without the GIL.
#ifndef MALLETRAIN_PYTHON_SRC_BIND_COMMON_H_
#define MALLETRAIN_PYTHON_SRC_BIND_COMMON_H_

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace malle::python {

// Payload type URL whose value is the name of a class in malletrain.errors.
inline constexpr char kErrorClassPayloadUrl[] = "malletrain/error_class";

// A non-OK absl::Status on its way to Python. what() is the status message.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(absl::Status status);

  absl::StatusCode code() const { return status_.code(); }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// Throws StatusError if `status` is not OK.
inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

// Returns the value of `value_or`, or throws StatusError with its status.
template <class T>
T ValueOrThrow(absl::StatusOr<T> value_or) {
  if (!value_or.ok()) throw StatusError(std::move(value_or).status());
  return *std::move(value_or);
}

// One per libmalle module, called from PYBIND11_MODULE in bind_main.cc.
// BindBase must run first: it registers the StatusError translator.
void BindBase(pybind11::module_& m);
void BindAlloc(pybind11::module_& m);
void BindSim(pybind11::module_& m);
void BindComm(pybind11::module_& m);
void BindElastic(pybind11::module_& m);  // after BindComm (takes its ControlStore)
void BindAdvisor(pybind11::module_& m);
void BindControl(pybind11::module_& m);
void BindCluster(pybind11::module_& m);

}  // namespace malle::python

#endif  // MALLETRAIN_PYTHON_SRC_BIND_COMMON_H_
