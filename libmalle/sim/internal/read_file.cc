#include "libmalle/sim/internal/read_file.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace malle::sim::internal {

absl::StatusOr<std::string> ReadMaybeGzipped(const std::string& path) {
  std::string text;
  if (absl::EndsWith(path, ".gz")) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (f == nullptr) {
      return absl::NotFoundError(absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
    }
    gzbuffer(f, 1 << 20);
    char buffer[1 << 16];
    while (true) {
      const int got = gzread(f, buffer, sizeof(buffer));
      if (got < 0) {
        int code = 0;
        const std::string message = gzerror(f, &code);
        gzclose(f);
        return absl::DataLossError(absl::StrCat(path, ": corrupt gzip stream: ", message));
      }
      if (got == 0) break;
      text.append(buffer, got);
    }
    // A truncated file reads as a short stream; zlib only says so through
    // gzerror (Z_BUF_ERROR) after the last read.
    int code = Z_OK;
    const char* message = gzerror(f, &code);
    if (code != Z_OK || !gzeof(f)) {
      const std::string why = code != Z_OK ? message : "stream ended early";
      gzclose(f);
      return absl::DataLossError(absl::StrCat(path, ": corrupt gzip stream: ", why));
    }
    gzclose(f);
    return text;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::UnavailableError(absl::StrCat(path, ": read error"));
  return std::move(buffer).str();
}

}  // namespace malle::sim::internal
