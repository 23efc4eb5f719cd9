// Signed control messages: Sign, Verify, the ReplayGuard that Verify keeps,
// and SequenceCounter for senders.
//
// A signed message is one line of ASCII text: the envelope JSON of
// messages.h, one space, and 64 lowercase hex digits of
//   HMAC-SHA256(secret, "malle-control-mac-v1\n" + <the envelope JSON bytes>)
//
//   {"v":1,"type":"node_leave","sender":"agent-n7","seq":17,...,"body":{...}} 9f86d0...
//
// The MAC covers exactly the bytes that are then parsed; nothing is
// re-serialised before checking it (docs/protocol.md has the reasons).
//
//   // sender
//   SequenceCounter counter;  // one per sender id, for the life of the process
//   MALLE_ASSIGN_OR_RETURN(std::string wire,
//                          Sign(NodeLeave{"n7", "drained"}, secret, "agent-n7",
//                               counter.Next(absl::Now()), absl::Now()));
//   // receiver (the allocator; one ReplayGuard for all senders)
//   absl::StatusOr<Envelope> got = Verify(wire, secret, guard, absl::Now());
//   if (!got.ok()) { log and drop; }
//
// Verify checks, in this order, and stops at the first failure:
//   1. size <= VerifyOptions.max_message_bytes        kInvalidArgument (nothing else is read)
//   2. a MAC is present: " " + 64 lowercase hex       kUnauthenticated "unsigned ..."
//   3. the MAC matches (constant-time)                kUnauthenticated "forged ..."
//   4. JSON, "v", unknown keys, "type", "sender", "seq", "ts"
//                                                     kInvalidArgument naming the field
//   5. |now - ts| <= max_skew                         kFailedPrecondition "stale ..."
//   6. seq above the sender's last accepted seq, or
//      an untracked sender with ts after the guard's eviction watermark
//                                                     kAlreadyExists "replayed ..."
//   7. the body (messages.h rules)                    kInvalidArgument naming "body...."
// and records (sender, seq, ts) in the guard only when all of them pass.
//
// The secret authenticates "a process of this deployment", not a sender:
// every holder of the secret can sign with any sender id. "sender" exists
// for replay bookkeeping; whether a sender may send a given message (an
// agent speaking for another node) is the receiver's policy.
//
// Thread-safety: Sign and Verify are thread-safe for distinct ReplayGuards;
// a ReplayGuard is not synchronised (calls on one guard must be serialised
// by the caller). SequenceCounter is thread-safe.
#ifndef MALLE_CONTROL_ENVELOPE_H_
#define MALLE_CONTROL_ENVELOPE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libmalle/control/wire/messages.h"
#include "libmalle/control/wire/secret.h"

namespace malle::control {

// Prepended to the envelope bytes inside the MAC (never sent): a MAC made
// with the same secret for anything else cannot pass as a control message.
inline constexpr absl::string_view kMacContext = "malle-control-mac-v1\n";
inline constexpr size_t kDefaultMaxMessageBytes = size_t{1} << 20;  // 1 MiB
inline constexpr absl::Duration kDefaultMaxSkew = absl::Seconds(30);

struct VerifyOptions {
  // Whole signed message, MAC included; [128, 64 MiB]. An AllocationPlan of
  // 100000 assignments needs about 4 MiB: raise it for such clusters.
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  // Largest accepted |now - ts|, [0, 1 day]. It bounds the clocks' disagreement plus
  // the store's delivery delay; it is also how long a captured message could
  // be replayed to a receiver that lost its ReplayGuard.
  absl::Duration max_skew = kDefaultMaxSkew;
};

struct ReplayGuardOptions {
  // Senders remembered; [1, 10^7]. Beyond it the least recently accepted
  // sender is forgotten (see ReplayGuard). About 200 bytes each.
  size_t max_senders = 65536;
};

// Remembers, per sender, the highest seq accepted and the latest ts seen,
// in bounded memory.
//
// A message is fresh if its sender is tracked and seq > the sender's highest
// seq. When max_senders are tracked and a new one arrives, the least
// recently accepted sender is evicted and the watermark rises to that
// sender's latest ts. A message from an untracked sender is fresh only if
// its ts is after the watermark: every message an evicted sender sent
// before its eviction has ts <= watermark, so none of them can be replayed.
// The price is that a genuinely new sender whose ts is not after the
// watermark is refused too; with max_skew = 30 s that happens only if a
// sender active in the last ~30 s was evicted, i.e. max_senders is smaller
// than the number of senders active at once.
//
// A sender that restarts must not reuse seqs (use SequenceCounter).
class ReplayGuard {
 public:
  explicit ReplayGuard(ReplayGuardOptions options = {});
  ReplayGuard(ReplayGuard&&) = default;
  ReplayGuard& operator=(ReplayGuard&&) = default;
  ReplayGuard(const ReplayGuard&) = delete;  // entries hold iterators into lru_
  ReplayGuard& operator=(const ReplayGuard&) = delete;

  // OK if a message (sender, seq, ts) would be fresh; kAlreadyExists saying
  // why not. Does not record it.
  absl::Status Check(absl::string_view sender, uint64_t seq, absl::Time ts) const;
  // Records an accepted message: the sender's highest seq and latest ts
  // become at least seq and ts, and it becomes the most recently accepted
  // sender. May evict the least recently accepted sender.
  void Record(absl::string_view sender, uint64_t seq, absl::Time ts);

  size_t size() const { return index_.size(); }
  const ReplayGuardOptions& options() const { return options_; }
  // The latest ts of any evicted sender; InfinitePast() if none was evicted.
  absl::Time watermark() const { return watermark_; }
  // The highest seq accepted from `sender`, nullopt if it is not tracked.
  std::optional<uint64_t> HighestSeq(absl::string_view sender) const;

  // The whole state as text (a header line, then one line per sender, least
  // recently accepted first; times rounded up to whole microseconds), for
  // the allocator's journal. Restore it with Load.
  std::string Save() const;
  // Restores a Save()d guard under `options`. If it holds more senders than
  // options.max_senders, the least recently accepted ones are evicted (the
  // watermark rises as usual). kInvalidArgument naming the line for
  // malformed text.
  static absl::StatusOr<ReplayGuard> Load(absl::string_view saved, ReplayGuardOptions options = {});

 private:
  struct Entry {
    std::string sender;
    uint64_t seq = 0;
    absl::Time latest_ts;
  };

  ReplayGuardOptions options_;
  std::list<Entry> lru_;  // front: least recently accepted
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_;
  absl::Time watermark_ = absl::InfinitePast();
};

// Signs `message` as sent by `sender` with sequence number `seq` at `ts`.
// Pure; does not block. kInvalidArgument if the message or an envelope field
// is invalid (messages.h rules; sender is an id, seq >= 1, ts in [0, 1e10]
// unix seconds), or if the signed message would exceed
// kDefaultMaxMessageBytes.
absl::StatusOr<std::string> Sign(const Message& message, const Secret& secret,
                                 absl::string_view sender, uint64_t seq, absl::Time ts);

// Authenticates and decodes one signed message (the order is above). Pure
// apart from `guard`, which it updates only when it returns OK; does not
// block. Status codes: kInvalidArgument (too large, malformed, unsupported
// version, invalid options), kUnauthenticated (unsigned, malformed MAC, MAC
// mismatch), kFailedPrecondition (stale), kAlreadyExists (replayed).
absl::StatusOr<Envelope> Verify(absl::string_view wire, const Secret& secret, ReplayGuard& guard,
                                absl::Time now, const VerifyOptions& options = {});

// Sequence numbers for one sender that increase across restarts without
// persistent state: Next(now) = max(previous + 1, unix microseconds of now).
// A restarted sender starts above everything it sent before as long as its
// clock did not step back by more than it gained, and it sent less than one
// message per microsecond on average. Thread-safe.
class SequenceCounter {
 public:
  uint64_t Next(absl::Time now);

 private:
  absl::Mutex mu_;
  uint64_t last_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace malle::control

#endif  // MALLE_CONTROL_ENVELOPE_H_
