#include "libmalle/control/service/channel.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "libmalle/base/status_macros.h"

namespace malle::control {
namespace keys {
std::string InboxKey(int64_t ticket) { return absl::StrCat("malle/ctl/inbox/", ticket); }
std::string JobSpecKey(absl::string_view job) { return absl::StrCat("malle/ctl/job/", job); }
std::string ReportKey(absl::string_view job) { return absl::StrCat("malle/ctl/report/", job); }
}  // namespace keys

Outbox::Outbox(std::shared_ptr<comm::ControlStore> store, Secret secret, std::string sender)
    : store_(std::move(store)), secret_(std::move(secret)), sender_(std::move(sender)) {}

absl::StatusOr<std::string> Outbox::SignNow(const Message& message) {
  const absl::Time now = absl::Now();
  return Sign(message, secret_, sender_, seq_.Next(now), now);
}

absl::Status Outbox::Send(const Message& message) {
  MALLE_ASSIGN_OR_RETURN(std::string wire, SignNow(message));
  MALLE_ASSIGN_OR_RETURN(int64_t ticket, store_->Add(keys::kInboxNext, 1));
  return store_->Set(keys::InboxKey(ticket), wire);
}

absl::StatusOr<Envelope> VerifyDocument(absl::string_view wire, const Secret& secret, absl::Time now) {
  // A document is judged by its content (plan ids increase), not by replay
  // bookkeeping: a fresh guard, and any timestamp within a day (the
  // allocator re-signs what it publishes at least every minute).
  ReplayGuard guard;
  VerifyOptions options;
  options.max_skew = absl::Hours(24);
  options.max_message_bytes = size_t{64} << 20;
  return Verify(wire, secret, guard, now, options);
}

absl::StatusOr<std::optional<Envelope>> ReadDocument(comm::ControlStore& store, absl::string_view key,
                                                     const Secret& secret, absl::Time now) {
  MALLE_ASSIGN_OR_RETURN(std::optional<std::string> wire, store.TryGet(key));
  if (!wire) return std::optional<Envelope>();
  MALLE_ASSIGN_OR_RETURN(Envelope e, VerifyDocument(*wire, secret, now));
  return std::optional<Envelope>(std::move(e));
}

}  // namespace malle::control
