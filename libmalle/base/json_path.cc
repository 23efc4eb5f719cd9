#include "libmalle/base/json_path.h"

#include <algorithm>
#include <limits>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace malle::json_path {
namespace {

using Json = nlohmann::json;

// Records the path of the first key that appears twice in one object.
// nlohmann keeps the last value silently; refusing means a pasted-together
// document never loses a field without a word.
class DuplicateKeyFinder {
 public:
  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        EnterValue();
        frames_.push_back(Frame{false});
        break;
      case Json::parse_event_t::array_start:
        EnterValue();
        frames_.push_back(Frame{true});
        break;
      case Json::parse_event_t::key: {
        Frame& top = frames_.back();
        top.key = parsed.get<std::string>();
        if (!top.keys.insert(top.key).second && duplicate_.empty()) duplicate_ = Path();
        break;
      }
      case Json::parse_event_t::value:
        EnterValue();
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        frames_.pop_back();
        break;
    }
    return true;
  }

  // Empty when every key was unique.
  const std::string& duplicate() const { return duplicate_; }

 private:
  struct Frame {
    bool is_array = false;
    size_t index = 0;  // arrays: elements seen so far
    std::string key;   // objects: the key being read
    std::set<std::string> keys;
  };

  void EnterValue() {
    if (!frames_.empty() && frames_.back().is_array) ++frames_.back().index;
  }

  std::string Path() const {
    std::string path;
    for (const Frame& frame : frames_) {
      path = frame.is_array ? Element(path, frame.index - 1) : Member(path, frame.key);
    }
    return path;
  }

  std::vector<Frame> frames_;
  std::string duplicate_;
};

// Rejects nesting deeper than `max_depth` before the parser sees the text.
absl::Status CheckDepth(absl::string_view text, int max_depth, int enclosing_depth) {
  int depth = enclosing_depth;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(absl::StrCat(
            "nested deeper than ", max_depth, " levels",
            enclosing_depth > 0 ? " (counting the enclosing document)" : "", " at byte ", i));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string Quote(absl::string_view text) {
  constexpr size_t kShown = 40;
  std::string out = "\"";
  for (size_t i = 0; i < text.size() && i < kShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, static_cast<char>(c)));
    } else if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    }
  }
  if (text.size() > kShown) out += "...";
  return out + "\"";
}

std::string Member(const std::string& path, absl::string_view key) {
  const bool plain = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
  if (!plain) return absl::StrCat(path, "[", Quote(key), "]");
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

std::string Element(const std::string& path, size_t index) {
  return absl::StrCat(path, "[", index, "]");
}

absl::Status PathError(const std::string& path, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(path.empty() ? "(top level)" : path, ": ", message));
}

// How a value appeared in the input, short enough for an error message.
std::string Describe(const Json& value) {
  switch (value.type()) {
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string:
      return absl::StrCat("the string ", Quote(value.get_ref<const std::string&>()));
    default:
      return value.dump();  // null, true, false, a number
  }
}

absl::StatusOr<Json> ParseStrictJson(absl::string_view text) {
  return ParseStrictJson(text, "", std::numeric_limits<int>::max());
}

absl::StatusOr<Json> ParseStrictJson(absl::string_view text, const std::string& prefix,
                                     int max_depth, int enclosing_depth) {
  auto malformed = [&prefix](absl::string_view what) {
    const std::string message = absl::StrCat("malformed JSON: ", what);
    return prefix.empty() ? absl::InvalidArgumentError(message) : PathError(prefix, message);
  };
  if (absl::Status depth = CheckDepth(text, max_depth, enclosing_depth); !depth.ok()) {
    return malformed(depth.message());
  }
  DuplicateKeyFinder finder;
  Json document;
  try {
    document = Json::parse(text.begin(), text.end(),
                           [&finder](int depth, Json::parse_event_t event, Json& parsed) {
                             return finder(depth, event, parsed);
                           });
  } catch (const Json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 7: ..."
    // or, for a number beyond double's range such as 1e999,
    // "[json.exception.out_of_range.406] number overflow parsing '1e999'".
    absl::string_view what = e.what();
    const size_t bracket = what.find("] ");
    if (what.substr(0, 1) == "[" && bracket != absl::string_view::npos) {
      what.remove_prefix(bracket + 2);
    }
    return malformed(what);
  }
  if (!finder.duplicate().empty()) {
    // The finder's path starts at this document; name it from `prefix`.
    const std::string& inner = finder.duplicate();
    std::string path = prefix;
    if (path.empty()) {
      path = inner;
    } else if (!inner.empty()) {
      path += inner[0] == '[' ? inner : absl::StrCat(".", inner);
    }
    return PathError(path, "duplicate key (each key may appear once per object)");
  }
  return document;
}

absl::Status CheckKeys(const Json& value, const std::string& path,
                       std::initializer_list<absl::string_view> allowed) {
  if (!value.is_object()) {
    return PathError(path, absl::StrCat("expected an object, got ", Describe(value)));
  }
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
      return PathError(Member(path, it.key()),
                       absl::StrCat("unknown key; expected one of ", absl::StrJoin(allowed, ", ")));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadString(const Json& value, const std::string& path) {
  if (!value.is_string()) {
    return PathError(path, absl::StrCat("expected a string, got ", Describe(value)));
  }
  return value.get<std::string>();
}

absl::StatusOr<bool> ReadBool(const Json& value, const std::string& path) {
  if (!value.is_boolean()) {
    return PathError(path, absl::StrCat("expected true or false, got ", Describe(value)));
  }
  return value.get<bool>();
}

}  // namespace malle::json_path
