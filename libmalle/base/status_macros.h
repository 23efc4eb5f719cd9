// Status propagation macros for libmalle.
//
// Defines MALLE_RETURN_IF_ERROR and MALLE_ASSIGN_OR_RETURN. Debian 12's Abseil
// (20220623) has neither, and c10/glog already own unprefixed names.
//
//   absl::StatusOr<int> ParsePort(absl::string_view s);
//   absl::Status Connect(absl::string_view s) {
//     MALLE_ASSIGN_OR_RETURN(int port, ParsePort(s));
//     MALLE_RETURN_IF_ERROR(Dial(port));
//     return absl::OkStatus();
//   }
//
// Thread-safety: macros only; they evaluate their argument once.
#ifndef MALLE_BASE_STATUS_MACROS_H_
#define MALLE_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MALLE_STATUS_CONCAT_INNER_(a, b) a##b
#define MALLE_STATUS_CONCAT_(a, b) MALLE_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function if it is not OK.
#define MALLE_RETURN_IF_ERROR(expr)                        \
  do {                                                     \
    ::absl::Status malle_status_ = (expr);                 \
    if (!malle_status_.ok()) return malle_status_;         \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from
// the enclosing function, otherwise moves the value into `lhs` (which may be
// a declaration such as `auto x` or `const Foo& y`... `auto&&` is not allowed).
#define MALLE_ASSIGN_OR_RETURN(lhs, rexpr) \
  MALLE_ASSIGN_OR_RETURN_IMPL_(MALLE_STATUS_CONCAT_(malle_statusor_, __LINE__), lhs, rexpr)

#define MALLE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // MALLE_BASE_STATUS_MACROS_H_
