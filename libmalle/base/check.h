// Invariant checks that abort: MALLE_CHECK(cond) << "context";
//
// MALLE_CHECK is for programming errors only (a broken invariant inside
// libmalle). Anything that bad input, a peer or the network can cause is an
// absl::Status instead (see docs/errors.md).
//
//   MALLE_CHECK(rank < size) << "rank " << rank << " of " << size;
//   MALLE_CHECK_OK(store->Set("k", "v"));
//
// Thread-safety: safe from any thread; a failing check writes one line to
// stderr and calls std::abort().
#ifndef MALLE_BASE_CHECK_H_
#define MALLE_BASE_CHECK_H_

#include <sstream>

#include "absl/status/status.h"

namespace malle::base::internal {

// Collects the message of a failed check and aborts in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets MALLE_CHECK discard the stream expression when the check passes.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace malle::base::internal

#define MALLE_CHECK(condition)                                  \
  (condition) ? (void)0                                         \
              : ::malle::base::internal::Voidify() &            \
                    ::malle::base::internal::CheckFailure(      \
                        __FILE__, __LINE__, #condition)         \
                        .stream()

#define MALLE_CHECK_OK(expr)                                              \
  for (::absl::Status malle_check_status_ = (expr);                       \
       !malle_check_status_.ok();)                                        \
  ::malle::base::internal::CheckFailure(__FILE__, __LINE__, #expr ".ok()") \
          .stream()                                                       \
      << malle_check_status_.ToString() << " "

#endif  // MALLE_BASE_CHECK_H_
