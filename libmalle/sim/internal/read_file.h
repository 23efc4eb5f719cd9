// Reads a whole input file of the simulator, gunzipping it when its name ends
// in ".gz". Internal to libmalle/sim (idle traces and SWF logs share it).
//
// Thread-safety: a pure function of the file; thread-safe.
#ifndef MALLE_SIM_INTERNAL_READ_FILE_H_
#define MALLE_SIM_INTERNAL_READ_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace malle::sim::internal {

// Blocks on the read. NotFound if `path` cannot be opened, DataLoss for a
// corrupt or truncated gzip stream, Unavailable for another read error.
absl::StatusOr<std::string> ReadMaybeGzipped(const std::string& path);

}  // namespace malle::sim::internal

#endif  // MALLE_SIM_INTERNAL_READ_FILE_H_
