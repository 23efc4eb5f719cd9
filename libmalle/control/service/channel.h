// The control plane's transport over the deployment's control store.
//
// Defines the store keys of the control plane (one place: docs/protocol.md
// lists them), Outbox (sign a message and append it to the allocator's
// inbox), ReadDocument (fetch and authenticate something the allocator
// published: the plan, a job's spec, the status) and Publish.
//
//   MALLE_ASSIGN_OR_RETURN(auto store, comm::ControlStore::Connect(host, port, absl::Seconds(10)));
//   Outbox out(store, secret, "agent.n3.1234");
//   MALLE_RETURN_IF_ERROR(out.Send(NodeLeave{"n3", "drained"}));
//   MALLE_ASSIGN_OR_RETURN(std::optional<Envelope> plan, ReadDocument(*store, keys::kPlan, secret));
//
// The inbox is a queue in the store: a sender takes a ticket with
// Add(kInboxNext, 1) and writes its signed message under InboxKey(ticket);
// the allocator consumes tickets in order (allocator_service.h says what it
// does with a ticket whose message never arrives). Published documents are
// single keys the allocator overwrites; readers authenticate them with the
// shared secret and judge freshness by content (a plan id that increases),
// so ReadDocument accepts any timestamp within a day.
//
// Thread-safety: Outbox::Send is thread-safe (it serialises on the store
// handle's connection); the free functions are as thread-safe as the store.
#ifndef MALLE_CONTROL_CHANNEL_H_
#define MALLE_CONTROL_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/control/wire/envelope.h"
#include "libmalle/control/wire/messages.h"
#include "libmalle/control/wire/secret.h"

namespace malle::control {
namespace keys {
inline constexpr char kInboxNext[] = "malle/ctl/inbox/next";        // ticket counter
inline constexpr char kInboxCursor[] = "malle/ctl/inbox/cursor";    // tickets consumed
inline constexpr char kPlan[] = "malle/ctl/plan";                   // signed AllocationPlan
inline constexpr char kPlanId[] = "malle/ctl/plan_id";              // its id (ASCII)
inline constexpr char kStatus[] = "malle/ctl/status";               // signed AllocatorStatus
inline constexpr char kEpoch[] = "malle/ctl/allocator_epoch";       // allocator incarnations
std::string InboxKey(int64_t ticket);       // "malle/ctl/inbox/<ticket>"
std::string JobSpecKey(absl::string_view job);  // "malle/ctl/job/<id>": signed JobSubmit
std::string ReportKey(absl::string_view job);   // "malle/ctl/report/<id>": the job's signed AdvisorReport
}  // namespace keys

class Outbox {
 public:
  // `sender` must be an id (messages.h); it must not be shared by two live
  // processes (each keeps its own sequence numbers).
  Outbox(std::shared_ptr<comm::ControlStore> store, Secret secret, std::string sender);

  // Signs `message` and appends it to the inbox. Blocks for two store round
  // trips. Errors: kInvalidArgument (the message is invalid; nothing is
  // sent), the store's errors (kUnavailable, kDeadlineExceeded).
  absl::Status Send(const Message& message);
  // Signs without sending (for publishing a document under a key).
  absl::StatusOr<std::string> SignNow(const Message& message);

  const std::string& sender() const { return sender_; }

 private:
  std::shared_ptr<comm::ControlStore> store_;
  Secret secret_;
  std::string sender_;
  SequenceCounter seq_;
};

// Reads and authenticates the document at `key`. nullopt if the key does not
// exist. Errors: kUnauthenticated / kInvalidArgument from Verify (a forged or
// malformed document), the store's errors.
absl::StatusOr<std::optional<Envelope>> ReadDocument(comm::ControlStore& store, absl::string_view key,
                                                     const Secret& secret, absl::Time now);
// Authenticates a document already read. Errors as Verify's.
absl::StatusOr<Envelope> VerifyDocument(absl::string_view wire, const Secret& secret, absl::Time now);

}  // namespace malle::control

#endif  // MALLE_CONTROL_CHANNEL_H_
