// Bindings of libmalle/base: versions, log level, and the StatusError
// translator that every other bind_<module>.cc relies on.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libmalle/base/log.h"
#include "python/src/bind_common.h"

#ifndef MALLE_VERSION
#error "MALLE_VERSION must be defined by python/CMakeLists.txt"
#endif
#ifndef MALLE_TORCH_VERSION
#error "MALLE_TORCH_VERSION must be defined by python/CMakeLists.txt"
#endif

namespace py = pybind11;

namespace malle::python {

StatusError::StatusError(absl::Status status)
    : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}

namespace {

// absl::StatusCode values are stable (they are the gRPC codes); 16 is the last.
constexpr int kMaxStatusCode = static_cast<int>(absl::StatusCode::kUnauthenticated);

// Sets the Python error for `status`. The code -> class table is plain Python
// (malletrain.errors._from_status) so that it sits next to the classes it
// names; this only adapts. Called with the GIL held (pybind11 translators are).
void SetPythonError(const absl::Status& status) {
  const std::string message(status.message());
  try {
    py::object from_status = py::module_::import("malletrain.errors").attr("_from_status");
    py::object error_class = py::none();
    // Debian's Abseil keeps its own absl::optional (not an alias of std::optional).
    if (auto name = status.GetPayload(kErrorClassPayloadUrl)) {
      error_class = py::str(std::string(*name));
    }
    py::object exc = from_status(static_cast<int>(status.code()), message, error_class);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (py::error_already_set& e) {
    // malletrain.errors itself failed; still surface the original error.
    const std::string text = absl::StrCat(absl::StatusCodeToString(status.code()), ": ", message,
                                          " (malletrain.errors failed: ", e.what(), ")");
    PyErr_SetString(PyExc_RuntimeError, text.c_str());
  }
}

std::string LogLevelName(base::LogLevel level) {
  switch (level) {
    case base::LogLevel::kDebug:
      return "debug";
    case base::LogLevel::kInfo:
      return "info";
    case base::LogLevel::kWarning:
      return "warning";
    case base::LogLevel::kError:
      return "error";
  }
  return "unknown";
}

}  // namespace

void BindBase(py::module_& m) {
  // Module-local: StatusError is ours; other extensions' translators are
  // untouched. Anything else propagates to pybind11's default translation.
  py::register_local_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      SetPythonError(e.status());
    }
  });

  m.def(
      "version", [] { return std::string(MALLE_VERSION); },
      "malletrain version this extension was built as.");
  m.def(
      "torch_version", [] { return std::string(MALLE_TORCH_VERSION); },
      "torch.__version__ of the torch this extension was compiled against.");

  m.def(
      "set_log_level",
      [](const std::string& level) {
        base::LogLevel parsed;
        if (!base::ParseLogLevel(level, &parsed)) {
          ThrowIfError(absl::InvalidArgumentError(absl::StrFormat(
              "log level: got '%s'; expected one of debug, info, warning, error", level)));
        }
        base::SetLogLevel(parsed);
      },
      py::arg("level"), "Sets the threshold of libmalle's log (stderr).");
  m.def(
      "get_log_level", [] { return LogLevelName(base::GetLogLevel()); },
      "Current threshold of libmalle's log: debug, info, warning or error.");

  // Test hooks for the error translation.
  m.def(
      "_raise_status",
      [](int code, const std::string& message, std::optional<std::string> error_class) {
        if (code <= 0 || code > kMaxStatusCode) {
          ThrowIfError(absl::InvalidArgumentError(
              absl::StrFormat("code: got %d; expected a non-OK absl::StatusCode in [1, %d]", code,
                              kMaxStatusCode)));
        }
        absl::Status status(static_cast<absl::StatusCode>(code), message);
        if (error_class.has_value()) {
          status.SetPayload(kErrorClassPayloadUrl, absl::Cord(*error_class));
        }
        ThrowIfError(status);
      },
      py::arg("code"), py::arg("message"), py::arg("error_class") = py::none(),
      "Throws a StatusError; lets tests check the translation.");
  m.def(
      "_status_code_names",
      [] {
        py::dict names;
        for (int code = 0; code <= kMaxStatusCode; ++code) {
          names[py::int_(code)] =
              py::str(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
        }
        return names;
      },
      "absl's name of every status code, {int: str}.");
}

}  // namespace malle::python
