#include "libmalle/base/check.h"

#include <cstdio>
#include <cstdlib>

namespace malle::base::internal {

CheckFailure::CheckFailure(const char* file, int line, const char* condition) {
  stream_ << "MALLE_CHECK failed at " << file << ":" << line << ": " << condition << " ";
}

CheckFailure::~CheckFailure() {
  const std::string message = stream_.str();
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace malle::base::internal
