// Strict JSON documents with error paths, shared by the JSON formats of
// libmalle (alloc/problem_json, advisor/report_json, control/wire/messages).
//
// ParseStrictJson parses a document and refuses duplicate keys (nlohmann
// keeps the last value silently); errors are kInvalidArgument with a message
// that names where in the document the problem is ("jobs[2].min_nodes: ...").
// Member/Element build such paths, PathError makes the status, Describe says
// how a value appeared in the input, short enough for a message.
//
// Thread-safety: pure functions.
#ifndef MALLE_BASE_JSON_PATH_H_
#define MALLE_BASE_JSON_PATH_H_

#include <cstddef>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace malle::json_path {

// "a.b" ("b" at the top level). A key that is not made of [A-Za-z0-9_-] is
// quoted and escaped, a["k e y"], so that no input can put a newline or a
// misleading path into an error message.
std::string Member(const std::string& path, absl::string_view key);
// "a[3]".
std::string Element(const std::string& path, size_t index);
// kInvalidArgument "<path>: <message>" ("(top level)" for an empty path).
absl::Status PathError(const std::string& path, absl::string_view message);
// "an object", "an array", a string quoted and cut at ~40 characters, or the value.
std::string Describe(const nlohmann::json& value);
// Parses `text`; "malformed JSON: ..." or "<path>: duplicate key ..." errors.
absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text);

// The same for a document that sits at `prefix` inside a larger one (errors
// are named from there: "body.report: malformed JSON: ..."), below
// `enclosing_depth` levels of that larger one, with nesting (arrays and
// objects, the enclosing levels included) limited to `max_depth`, checked
// before parsing (the parser and the serialiser recurse; a message from the
// network must not choose how deep).
absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text, const std::string& prefix,
                                               int max_depth, int enclosing_depth = 0);

// `text` (a string from a struct: maybe not UTF-8, maybe long) as a short
// quoted literal for an error message: printable ASCII kept, the rest \xNN,
// cut at 40 bytes with "...".
std::string Quote(absl::string_view text);

// `value` is an object whose keys are all in `allowed` (none is required):
// "<path>: expected an object, got ..." or "<path>.<key>: unknown key; expected one of ...".
absl::Status CheckKeys(const nlohmann::json& value, const std::string& path,
                       std::initializer_list<absl::string_view> allowed);
// A JSON string / true or false: "<path>: expected a string, got ..." otherwise.
absl::StatusOr<std::string> ReadString(const nlohmann::json& value, const std::string& path);
absl::StatusOr<bool> ReadBool(const nlohmann::json& value, const std::string& path);

}  // namespace malle::json_path

#endif  // MALLE_BASE_JSON_PATH_H_
