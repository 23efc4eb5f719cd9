// JSON form of an AdvisorReport (carried in the allocator's control
// messages) and a human-readable scalability table.
//
//   {"version": 1, "job": "resnet", "step": 1200, "sizes_observed": [1, 2, 4],
//    "curve": [{"nodes": 1, "samples_per_s": 410.2, "lo": 401.9, "hi": 418.7,
//               "efficiency": 1.0}, ...],
//    "resize_cost_s": {"grow": 12.3, "shrink": 8.1, "failure": null},
//    "marginal_gain": {"up": 301.5, "down": 355.0},
//    "probe": null | {"nodes": 8, "steps": 30, "reason": "..."},
//    "model": {"fitted": true, "compute_fixed_s": ..., ...}}
//
// docs/advisor.md documents every key. Parsing is strict: an unknown,
// missing or duplicate key, a wrong type or a value out of range is an
// InvalidArgument naming the JSON path (`curve[2].lo: expected a number, got
// "x"`); the result is also checked with ValidateReport.
//
//   std::string wire = ReportToJson(advisor->Report());
//   MALLE_ASSIGN_OR_RETURN(AdvisorReport r, ParseReportJson(wire));
//   std::cout << FormatReportTable(r);
//
// Thread-safety: pure; thread-safe.
#ifndef MALLE_ADVISOR_REPORT_JSON_H_
#define MALLE_ADVISOR_REPORT_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libmalle/advisor/report.h"

namespace malle::advisor {

inline constexpr int kReportJsonVersion = 1;

// indent < 0: one line (control messages); >= 0: pretty-printed. Doubles are
// written with enough digits to read back exactly.
std::string ReportToJson(const AdvisorReport& report, int indent = -1);

absl::StatusOr<AdvisorReport> ParseReportJson(absl::string_view text);

// A table for people, e.g. at the end of a run:
//
//   Scalability of job "resnet" at step 1200 (1180 steps recorded, 640 used)
//   nodes   samples/s     95% band            efficiency
//       1       410.2   [   401.9,    418.7]      1.00  observed
//       2       790.4   [   760.0,    821.9]      0.96  observed, current
//   ...
std::string FormatReportTable(const AdvisorReport& report);

}  // namespace malle::advisor

#endif  // MALLE_ADVISOR_REPORT_JSON_H_
