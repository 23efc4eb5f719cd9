// Keys of one job in the control store (all under JobPrefix(job_id)).
// docs/elastic_protocol.md describes each key and who writes it.
#ifndef MALLE_COMM_INTERNAL_STORE_LAYOUT_H_
#define MALLE_COMM_INTERNAL_STORE_LAYOUT_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace malle::comm::internal {

inline std::string MemberKey(absl::string_view m) { return absl::StrCat("member/", m); }
// The node the member runs on (ElasticGroupOptions::node); absent: unknown.
inline std::string NodeKey(absl::string_view m) { return absl::StrCat("node/", m); }
inline std::string HeartbeatKey(absl::string_view m) { return absl::StrCat("hb/", m); }
inline std::string AdmitKey(absl::string_view m) { return absl::StrCat("admit/", m); }
inline constexpr absl::string_view kBootTicket = "boot/ticket";
inline std::string BootKey(int64_t i) { return absl::StrCat("boot/", i); }
inline constexpr absl::string_view kRequestTicket = "req/ticket";
inline std::string RequestKey(int64_t i) { return absl::StrCat("req/", i); }
inline std::string RecordKey(int64_t g) { return absl::StrCat("gen/", g, "/record"); }
inline std::string AbortKey(int64_t g) { return absl::StrCat("gen/", g, "/abort"); }
inline std::string AbortReasonKey(int64_t g) { return absl::StrCat("gen/", g, "/abort_reason"); }
inline std::string CheckInKey(int64_t g, absl::string_view m) {
  return absl::StrCat("gen/", g, "/checkin/", m);
}
inline std::string CheckInCountKey(int64_t g) { return absl::StrCat("gen/", g, "/checkin_count"); }
inline std::string GroupPrefix(int64_t g) { return absl::StrCat("gen/", g, "/pg/"); }
// A process that owns a member (launcher, node agent) saw it exit: recovery need
// not wait for its check-in. kDeadCount counts such reports.
inline std::string DeadKey(absl::string_view m) { return absl::StrCat("dead/", m); }
// "host:port" of the member's liveness listener (internal/liveness.h).
inline std::string ProbeKey(absl::string_view m) { return absl::StrCat("probe/", m); }
inline constexpr absl::string_view kDeadCount = "dead/count";

}  // namespace malle::comm::internal

#endif  // MALLE_COMM_INTERNAL_STORE_LAYOUT_H_
