// Control messages between node agents, jobs and the allocator service, and
// their JSON form (protocol version 1; docs/protocol.md is the reference).
//
// A Message is one of the body structs below. An Envelope adds who sent it
// (sender), its per-sender sequence number and its timestamp. On the wire an
// envelope is compact JSON:
//
//   {"v":1,"type":"node_reclaim","sender":"agent-n7","seq":42,"ts":1700000000.25,
//    "body":{"node":"n7","grace_s":30,"reason":"slurm job 991 starts"}}
//
// and envelope.h signs it. This header knows nothing of keys: use Sign and
// Verify (envelope.h) for anything that crosses a process boundary;
// EncodeEnvelopeJson / DecodeEnvelopeJson are the unsigned layer beneath
// them (and the fuzzer's entry point).
//
//   NodeReclaim reclaim;
//   reclaim.node = "n7";
//   reclaim.grace = absl::Seconds(30);
//   MALLE_ASSIGN_OR_RETURN(std::string body, EncodeBody(reclaim));
//   MALLE_ASSIGN_OR_RETURN(Message m, DecodeBody(MessageType::kNodeReclaim, body));
//   if (const auto* r = std::get_if<NodeReclaim>(&m)) ...
//
// Validation is strict and the same in both directions (encoding validates
// first, decoding validates last): an unknown type or key, a missing required
// field, a wrong JSON type, a number out of range, an over-long string, an
// id that does not match ^[A-Za-z0-9._-]{1,128}$ or too many list entries is
// an InvalidArgument whose message starts with the field path and says the
// allowed range, e.g.
//   body.assignments[3].node: expected an id matching ^[A-Za-z0-9._-]{1,128}$, got "n 3"
// Integers must be JSON integers (2, not 2.0). Every string must be valid
// UTF-8; the JSON that is written is ASCII (non-ASCII is \u-escaped).
// Times and durations travel as seconds with microsecond resolution: a
// sub-microsecond part of an absl::Time is dropped when encoding.
//
// Thread-safety: pure functions on values; thread-safe.
#ifndef MALLE_CONTROL_MESSAGES_H_
#define MALLE_CONTROL_MESSAGES_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace malle::control {

inline constexpr int kProtocolVersion = 1;

// --- limits (docs/protocol.md lists them per field) ----------------------------------------------

inline constexpr size_t kMaxIdBytes = 128;            // ids: ^[A-Za-z0-9._-]{1,128}$
inline constexpr size_t kMaxReasonBytes = 256;        // reason of reclaim/leave/cancel
inline constexpr size_t kMaxTextBytes = 4096;         // plan reason, completion message, argv, env
inline constexpr size_t kMaxPolicyBytes = 128;        // AllocationPlan.policy
inline constexpr size_t kMaxCommandArgs = 256;        // JobSubmit.command entries
inline constexpr size_t kMaxEnvEntries = 64;          // JobSubmit.env entries
inline constexpr size_t kMaxEnvNameBytes = 256;       // JobSubmit.env keys
inline constexpr size_t kMaxReportBytes = 64 * 1024;  // AdvisorReport.report, serialised
inline constexpr size_t kMaxStatusBytes = 900 * 1024;  // AllocatorStatus.status, serialised
inline constexpr size_t kMaxPlanEntries = 100'000;    // AllocationPlan assignments, sizes
inline constexpr int kMaxNodes = 100'000;             // node counts (min/max_nodes, sizes)
inline constexpr int kMaxSlots = 1024;                // NodeRegister.slots
inline constexpr int kMaxLogicalWorkers = 1'000'000;
inline constexpr int kMinPriority = -1'000'000;
inline constexpr int kMaxPriority = 1'000'000;
inline constexpr double kMaxSpeed = 100;                  // node_class.speed in (0, 100]
inline constexpr double kMaxWeight = 1e6;                 // JobSubmit.weight in (0, 1e6]
inline constexpr int64_t kMaxCounter = int64_t{1} << 53;  // steps, samples, plan id
// Timestamps (ts, idle_until, decided_at) are unix seconds in [0, 1e10].
inline constexpr double kMaxUnixSeconds = 1e10;
inline constexpr absl::Duration kMaxGrace = absl::Hours(1);  // NodeReclaim.grace_s
inline constexpr absl::Duration kMaxSaveTime = absl::Hours(24);  // JobSaved.write_s
// JSON nesting (arrays and objects, the envelope included) is at most this
// deep; it bounds the recursion of the serialiser for AdvisorReport.report.
inline constexpr int kMaxJsonDepth = 64;

// --- bodies --------------------------------------------------------------------------------------

struct NodeClass {
  std::string group = "default";  // id: locality group (rack, switch, cell)
  double speed = 1;   // relative speed, (0, 100]
};

// An agent offers its node to the allocator. Sent on start and again after
// the allocator restarts (it is idempotent for the same node and agent).
struct NodeRegister {
  std::string node;   // id
  std::string agent;  // id of the agent incarnation
  NodeClass node_class;
  // Expected end of the node's idle window; nullopt: unknown.
  std::optional<absl::Time> idle_until;
  int slots = 1;  // ranks the node can run, [1, 1024]
};

// The main scheduler wants the node back: the allocator must vacate it by
// envelope ts + grace.
struct NodeReclaim {
  std::string node;
  absl::Duration grace = absl::ZeroDuration();  // [0, 1 h]
  std::string reason;                           // <= 256 bytes
};

// The agent is going away cleanly; its node is no longer offered.
struct NodeLeave {
  std::string node;
  std::string reason;  // <= 256 bytes
};

// Where a rank the agent runs is in its life (the allocator measures the node
// time that is held without training from it: docs/operations.md).
enum class RankPhase {
  kStarting,  // started, not yet a member of its job (imports, model build, waiting
              // to be admitted or for the bootstrap)
  kTraining,  // a member of its job's current generation
  kDraining,  // asked to leave, stopped, or finishing: the node is on its way back
};
absl::string_view RankPhaseName(RankPhase phase);  // "starting", "training", "draining"

struct RunningRank {
  std::string job;     // id
  std::string member;  // id
  int pid = 0;         // [1, 2^31 - 1]
  // Optional on the wire (absent: not said); agents of this version always send both.
  std::optional<RankPhase> phase;
  std::optional<absl::Time> phase_since;  // when it entered `phase`, unix seconds in [0, 1e10]
};

struct AgentHeartbeat {
  std::string node;
  std::optional<RunningRank> running;  // nullopt: the node runs nothing
};

// Why a rank ended, as its agent knows it.
enum class RankExitCause {
  kExited,   // by itself: its program ended (exit 0) or crashed
  kLeft,     // it left its job at a step boundary because the agent asked it to
  kStopped,  // the agent terminated or killed it
};
absl::string_view RankExitCauseName(RankExitCause cause);  // "exited", "left", "stopped"

// A rank the agent started has exited.
struct RankExit {
  std::string node;
  std::string job;  // the job's runtime id (JobLaunch.runtime_id)
  std::string member;
  int exit_code = 0;  // [0, 255]
  int signal = 0;     // [0, 127]; 0: not killed by a signal
  RankExitCause cause = RankExitCause::kExited;
};

struct JobSubmit {
  std::string job;                         // id
  std::vector<std::string> command;        // argv, 1..256 entries of <= 4096 bytes, no NUL
  std::map<std::string, std::string> env;  // <= 64 entries; names [A-Za-z_][A-Za-z0-9_]*
  std::string cwd;                         // empty (agent's default) or absolute, <= 4096
  int min_nodes = 1;                       // [1, 100000]
  int max_nodes = 1;                       // [min_nodes, 100000]
  // Logical workers L of the job; a job never runs more ranks than L.
  // nullopt: not fixed. Otherwise in [min_nodes, 1000000].
  std::optional<int> logical_workers;
  double weight = 1;  // (0, 1e6]
  int priority = 0;   // [-1e6, 1e6]
  // The job's length in optimizer steps, when its script knows it (epochs x
  // steps per epoch); nullopt: unknown. With the step its advisor reports
  // and the global batch, the allocator knows the work the job has left,
  // which the rank-weight objective orders jobs by. [1, 2^53].
  std::optional<int64_t> total_steps;

  // The most nodes the job can use: min(max_nodes, logical_workers).
  int EffectiveMaxNodes() const;
};

struct JobCancel {
  std::string job;
  std::string reason;  // <= 256 bytes
};

// A job's advisor recommendation. The report's content is validated by its
// consumer; here it is only required to be a JSON object of <= 64 KiB.
struct AdvisorReport {
  std::string job;
  // The report object as compact JSON. Decoding produces it with sorted keys
  // and non-ASCII characters as UTF-8; encoding accepts any JSON object text.
  std::string report_json = "{}";
};

enum class JobStatus { kSucceeded, kFailed, kCancelled };

struct JobComplete {
  std::string job;
  JobStatus status = JobStatus::kSucceeded;
  int64_t steps = 0;    // [0, 2^53]
  int64_t samples = 0;  // [0, 2^53]
  std::string message;  // <= 4096 bytes
};

// Where a saved state came from (JobSaved.kind).
enum class SaveKind {
  kPark,      // the job's last member was asked to leave and parked the job's state
  kSnapshot,  // a periodic snapshot, for the unplanned case (every rank dying at once)
};
absl::string_view SaveKindName(SaveKind kind);  // "park", "snapshot"

// A rank wrote the job's state to its park store (issue 22). A park of the
// job's current incarnation means no rank holds the job any more: the
// allocator queues it with the measured cost, and a new incarnation resumes
// from the parked state.
struct JobSaved {
  std::string job;         // id: the allocator's job id (JobSubmit.job)
  std::string runtime_id;  // id: the incarnation that saved (JobLaunch.runtime_id)
  SaveKind kind = SaveKind::kPark;
  int64_t step = 0;   // [0, 2^53]: the step the job resumes at
  int64_t bytes = 0;  // [0, 2^53]: the state's size
  absl::Duration write_time = absl::ZeroDuration();  // write_s: [0, 24 h], what saving took
};

struct Assignment {
  std::string node;
  std::optional<std::string> job;  // nullopt: the node is left idle
};

struct JobSize {
  std::string job;
  int nodes = 0;  // [0, 100000]
};

// How the ranks of a job that holds nodes find it: its id in the control
// store ("<job>.i<k>", new each time the job starts from zero nodes) and the
// node whose first rank starts (bootstraps) that incarnation.
struct JobLaunch {
  std::string job;             // id
  std::string runtime_id;      // id
  std::string bootstrap_node;  // id
};

// The allocator's decision. Not cross-checked against `sizes` here: the
// allocator and its consumers own the meaning of both lists.
struct AllocationPlan {
  int64_t plan = 0;  // plan id, increases with every plan; [0, 2^53]
  absl::Time decided_at = absl::UnixEpoch();
  std::string policy;                   // <= 128 bytes
  std::string reason;                   // <= 4096 bytes
  std::vector<Assignment> assignments;  // <= 100000, each node at most once
  std::vector<JobSize> sizes;           // <= 100000, each job at most once
  std::vector<JobLaunch> launches;      // <= 100000, each job at most once
};

// The allocator's status document (what `malletrain status` shows). Opaque
// here: a JSON object of at most kMaxStatusBytes when serialised.
struct AllocatorStatus {
  std::string status_json = "{}";
};

// The alternatives are in MessageType order.
using Message = std::variant<NodeRegister, NodeReclaim, NodeLeave, AgentHeartbeat, RankExit,
                             JobSubmit, JobCancel, AdvisorReport, JobComplete, AllocationPlan,
                             AllocatorStatus, JobSaved>;

enum class MessageType {
  kNodeRegister,
  kNodeReclaim,
  kNodeLeave,
  kAgentHeartbeat,
  kRankExit,
  kJobSubmit,
  kJobCancel,
  kAdvisorReport,
  kJobComplete,
  kAllocationPlan,
  kAllocatorStatus,
  kJobSaved,
};

MessageType TypeOf(const Message& message);
// The wire name: "node_register", "node_reclaim", ..., "allocation_plan".
absl::string_view MessageTypeName(MessageType type);
// kInvalidArgument for an unknown name (listing the known ones).
absl::StatusOr<MessageType> ParseMessageType(absl::string_view name);

// One message with its envelope fields.
struct Envelope {
  std::string sender;  // id of the sending process (replay bookkeeping, not an identity)
  uint64_t seq = 0;    // [1, 2^64 - 1], strictly increasing per sender
  absl::Time ts = absl::UnixEpoch();  // when it was sent, unix seconds in [0, 1e10]
  Message message;
};

// The envelope fields, decoded before the body is (DecodeEnvelopeJson).
struct EnvelopeHeader {
  MessageType type = MessageType::kNodeRegister;
  std::string sender;
  uint64_t seq = 0;
  absl::Time ts = absl::UnixEpoch();
};

// OK if `id` matches ^[A-Za-z0-9._-]{1,128}$; kInvalidArgument naming `field` otherwise.
absl::Status ValidateId(absl::string_view field, absl::string_view id);

// Checks every rule above; errors name the field as "body.<path>".
// kInvalidArgument only.
absl::Status ValidateMessage(const Message& message);

// The body object as compact JSON, after ValidateMessage (whose status it
// returns on failure).
absl::StatusOr<std::string> EncodeBody(const Message& message);

// Decodes a body object of the given type; kInvalidArgument naming the field.
absl::StatusOr<Message> DecodeBody(MessageType type, absl::string_view body_json);

// The whole envelope as compact ASCII JSON on one line. kInvalidArgument if
// the message or an envelope field is invalid (sender id, seq 0, ts outside
// [0, 1e10] s).
absl::StatusOr<std::string> EncodeEnvelopeJson(const Envelope& envelope);

// Decodes an unsigned envelope. Checks, in order: JSON syntax (also duplicate
// keys and nesting depth), the top level is an object, "v" is
// kProtocolVersion, no unknown key, "type" is known, "sender", "seq", "ts";
// then calls `check_header` (Verify checks staleness and replay there) and
// returns its status if it is not OK; then decodes and validates "body".
// Every failure of its own is kInvalidArgument.
absl::StatusOr<Envelope> DecodeEnvelopeJson(
    absl::string_view json, absl::FunctionRef<absl::Status(const EnvelopeHeader&)> check_header);
absl::StatusOr<Envelope> DecodeEnvelopeJson(absl::string_view json);

// Field-by-field equality (for tests and for idempotence checks).
bool operator==(const NodeClass& a, const NodeClass& b);
bool operator==(const NodeRegister& a, const NodeRegister& b);
bool operator==(const NodeReclaim& a, const NodeReclaim& b);
bool operator==(const NodeLeave& a, const NodeLeave& b);
bool operator==(const RunningRank& a, const RunningRank& b);
bool operator==(const AgentHeartbeat& a, const AgentHeartbeat& b);
bool operator==(const RankExit& a, const RankExit& b);
bool operator==(const JobSubmit& a, const JobSubmit& b);
bool operator==(const JobCancel& a, const JobCancel& b);
bool operator==(const AdvisorReport& a, const AdvisorReport& b);
bool operator==(const JobComplete& a, const JobComplete& b);
bool operator==(const Assignment& a, const Assignment& b);
bool operator==(const JobSize& a, const JobSize& b);
bool operator==(const JobLaunch& a, const JobLaunch& b);
bool operator==(const AllocationPlan& a, const AllocationPlan& b);
bool operator==(const AllocatorStatus& a, const AllocatorStatus& b);
bool operator==(const JobSaved& a, const JobSaved& b);
bool operator==(const Envelope& a, const Envelope& b);

}  // namespace malle::control

#endif  // MALLE_CONTROL_MESSAGES_H_
