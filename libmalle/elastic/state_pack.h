// Job state as a few large flat segments, for state sync to joiners and laggards.
//
// Defines StatePacker / StateUnpacker (a typed record stream whose tensors are
// references into a few flat segments) and TransferState (the transfer: a
// header, the skeleton, one message per segment, whatever the model). The
// one wire format of job state (job_state.h builds on it), for both APIs.
//
// Segments: tensors that share one storage and reference at least
// `direct_min_bytes` of it, densely, are sent from that storage as they are
// (a *direct* segment: no copy; the trainer keeps its parameters and its
// optimizer state in one buffer per dtype for this, FlattenTensors). The rest
// are concatenated into one *packed* segment per dtype. A receiver that has
// nothing to lose (a joiner) receives each segment whose layout matches one
// of its own direct segments straight into it (TransferState's `own`).
//
//   StatePacker packer;
//   packer.PutInt(step);
//   packer.PutTensor(weight);               // a reference into a segment
//   PackedState packed = std::move(packer).Finish();
//   MALLE_ASSIGN_OR_RETURN(PackedState got, BroadcastState(comm, root, rank == root ? &packed : nullptr));
//   MALLE_ASSIGN_OR_RETURN(StateUnpacker in, StateUnpacker::Open(std::move(got)));
//   MALLE_ASSIGN_OR_RETURN(int64_t s, in.Int());
//   MALLE_ASSIGN_OR_RETURN(at::Tensor w, in.Tensor());   // a view of the received segment
//
// Skeleton layout: magic "MSK3", u32 number of segments, then per segment
// (i8 dtype, i64 numel, i8 device: 0 CPU, 1 CUDA), then the records. Every record starts with a tag
// byte ('i' int64, 'd' double, 's' string, 't' tensor: dtype, shape, u32
// segment, i64 offset) so a reader out of step with the writer gets an error
// naming what it expected, never garbage.
//
// Thread-safety: packers and unpackers are single-threaded values.
// TransferState follows the Communicator's rule (one thread, same order on
// every rank). A direct segment is a view of the packed tensors' storage:
// do not modify them until the state is sent.
#ifndef MALLE_ELASTIC_STATE_PACK_H_
#define MALLE_ELASTIC_STATE_PACK_H_

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace malle::comm {
class Communicator;
}  // namespace malle::comm

namespace malle::elastic {

// Tensors sharing a storage are sent from it when they reference at least
// this many bytes of it (smaller ones are packed: a few messages at most).
inline constexpr int64_t kDirectMinBytes = int64_t{1} << 20;
// Pack everything by copying (a layout that depends only on the records).
inline constexpr int64_t kNeverDirect = std::numeric_limits<int64_t>::max();

struct PackedState {
  std::string skeleton;
  // The segments in skeleton order: contiguous 1-D tensors, on the device of
  // the packed tensors (CPU when received).
  std::vector<at::Tensor> buffers;
  // Per segment, local only: a view of this rank's own tensors (a direct
  // segment of the packer; a segment received in place).
  std::vector<bool> direct;
  int64_t bytes() const;  // skeleton + segments
};

struct SegmentSpec {
  at::ScalarType dtype;
  int64_t numel;
  c10::DeviceType device = c10::DeviceType::CPU;  // CPU or CUDA
};

class StatePacker {
 public:
  explicit StatePacker(int64_t direct_min_bytes = kDirectMinBytes) : direct_min_bytes_(direct_min_bytes) {}
  void PutInt(int64_t value);
  void PutDouble(double value);
  void PutString(absl::string_view value);
  // Records shape and dtype; Finish() decides the tensor's segment. An
  // undefined tensor is allowed (it unpacks as undefined). Tensors must be
  // dense, on the CPU or a CUDA device (MALLE_CHECK: job state is built by
  // the library from parameters and optimizer state).
  void PutTensor(const at::Tensor& tensor);
  PackedState Finish() &&;

 private:
  struct Pending {
    size_t pos;  // where the tensor's u32 segment and i64 offset go in body_
    at::Tensor tensor;
  };
  int64_t direct_min_bytes_;
  std::string body_;
  std::vector<Pending> tensors_;
};

// Typed records whose tensors stay outside the bytes: how a C++ part of the
// job state (an optimizer) writes itself into a PartState (job_state.h), so
// that its tensors travel in the job's flat segments, not copied into bytes.
// The same tags as the skeleton ('i', 'd', 's'; 't' is a u32 index into the
// tensor list).
class RecordWriter {
 public:
  void PutInt(int64_t value);
  void PutDouble(double value);
  void PutString(absl::string_view value);
  void PutTensor(const at::Tensor& tensor);  // referenced, not copied
  std::string& bytes() { return bytes_; }
  std::vector<at::Tensor>& tensors() { return tensors_; }

 private:
  std::string bytes_;
  std::vector<at::Tensor> tensors_;
};

class RecordReader {
 public:
  RecordReader(absl::string_view bytes, std::vector<at::Tensor> tensors)
      : bytes_(bytes), tensors_(std::move(tensors)) {}
  // kInvalidArgument if the next record is not of that kind or is truncated.
  absl::StatusOr<int64_t> Int();
  absl::StatusOr<double> Double();
  absl::StatusOr<std::string> String();
  absl::StatusOr<at::Tensor> Tensor();
  bool done() const { return pos_ == bytes_.size(); }

 private:
  absl::Status Expect(char tag, const char* what);
  absl::string_view bytes_;
  std::vector<at::Tensor> tensors_;
  size_t pos_ = 0;
};

// The segments a skeleton refers to.
// Errors: kInvalidArgument for a corrupt skeleton.
absl::StatusOr<std::vector<SegmentSpec>> SegmentSpecs(absl::string_view skeleton);

// For each segment of `skeleton`, the direct segment of `own` that holds
// tensors at the same records with the same shapes and offsets (same dtype
// and length), or an undefined tensor. Receiving into it overwrites exactly
// those tensors. Errors: kInvalidArgument for a corrupt skeleton.
absl::StatusOr<std::vector<at::Tensor>> InPlaceTargets(const PackedState& own, absl::string_view skeleton);

// One segment of a job state as the job's leader publishes it (the trainer's
// StateLayoutKey), so that a joiner can fault in, while it warms up, the
// memory the segments it cannot receive in place will land in.
struct SegmentLayout {
  at::ScalarType dtype = at::kFloat;
  int64_t numel = 0;
  std::string device_type = "cpu";  // "cpu" or "cuda" (C++ states are CPU)
  bool direct = false;              // sent from the source's own buffer
};

// The segments of a packed state, in skeleton order. Errors: kInvalidArgument
// for a corrupt skeleton.
absl::StatusOr<std::vector<SegmentLayout>> LayoutOf(const PackedState& state);

// JSON, the format of python/malletrain/state.py's encode_layout:
// [["float32", numel, "cpu", direct], ...] (torch's dtype names).
std::string EncodeLayout(const std::vector<SegmentLayout>& layout);
// Errors: kInvalidArgument naming the segment and what is wrong with it.
absl::StatusOr<std::vector<SegmentLayout>> DecodeLayout(absl::string_view json);

// Receive memory for a joiner, faulted in now (zero-filled), while nobody
// waits: one CPU buffer per `expected` segment of at least `min_bytes` that
// `own`'s direct segments (same dtype, length and device, counted as a
// multiset) will not take in place. A joiner has no optimizer state before its
// first step, and receiving it into fresh memory costs more than the transfer
// (168 MiB: 165-577 ms into fresh pages, 50-87 ms into touched ones, on the
// 2-core VM). Pass them to TransferState's `landing`.
std::vector<at::Tensor> LandingBuffers(const std::vector<SegmentLayout>& expected,
                                       const std::vector<SegmentLayout>& own, int64_t min_bytes);

// Makes `tensors` (dense, one device) views of one new buffer per dtype, each
// starting on a 64-byte boundary (zeros in between),
// keeping their values and TensorImpls (set_data), so that a packer sends
// them as one direct segment. Non-contiguous ones (e.g. channels_last) are
// left as they are. Returns false if nothing changed.
bool FlattenTensors(const std::vector<at::Tensor>& tensors);

class StateUnpacker {
 public:
  // Errors: kInvalidArgument if the skeleton is corrupt or the buffers do not
  // have the lengths and dtypes it names.
  static absl::StatusOr<StateUnpacker> Open(PackedState state);

  // Each returns kInvalidArgument if the next record is not of that kind or is
  // truncated.
  absl::StatusOr<int64_t> Int();
  absl::StatusOr<double> Double();
  absl::StatusOr<std::string> String();
  // A view of the received buffer (undefined if an undefined tensor was packed).
  absl::StatusOr<at::Tensor> Tensor();
  bool done() const { return pos_ == state_.skeleton.size(); }

 private:
  explicit StateUnpacker(PackedState state) : state_(std::move(state)) {}
  absl::Status Expect(char tag, const char* what);
  template <typename T>
  absl::StatusOr<T> Raw(const char* what);

  PackedState state_;
  size_t pos_ = 0;
};

// Sends `state` from `root` to every rank of `comm`: a 4 x int64 header, the
// skeleton bytes, then one byte-view broadcast per segment. `mine`
// must be non-null exactly on the root. Blocks. Returns the received state
// (the root's own, moved, on the root).
// Errors: the Communicator's (a peer failed: kAborted / kUnavailable /
// kDeadlineExceeded); kInvalidArgument for a corrupt header or skeleton.
absl::StatusOr<PackedState> BroadcastState(comm::Communicator& comm, int root, PackedState* mine);

// The same to `receivers` only (ranks other than `root`): broadcasts when
// every other rank receives, else the root sends each message to each
// receiver point to point (tags 0, 1, 2, ...), so ranks that already hold the
// state take no part. Call on the root and on every receiver, with the same
// `receivers`; on any other rank it returns an empty PackedState at once.
// A receiver passing `own` (its own state, packed with the same
// direct_min_bytes) receives matching segments into its own tensors
// (InPlaceTargets): only for a rank whose state may be lost, since a
// transfer cut by a failure leaves them half overwritten. A receiver passing
// `landing` (LandingBuffers) receives each other segment into one of those of
// the same dtype and length, which it removes from the list.
absl::StatusOr<PackedState> TransferState(comm::Communicator& comm, int root,
                                          const std::vector<int>& receivers, PackedState* mine,
                                          const PackedState* own = nullptr,
                                          std::vector<at::Tensor>* landing = nullptr);

// Who sends a state to whom when receivers share nodes, so that the state
// crosses into each node once: the root sends to the receivers on its own node
// and to one receiver per other node (that node's first receiver in rank
// order, its relay), and each relay copies what it received to the other
// receivers of its node. `nodes[r]` is the node of rank r ("" = unknown: a
// node of its own); an empty `nodes` puts every rank on a node of its own.
struct NodeTransferPlan {
  std::vector<int> from_root;  // relays first (their copies overlap the root's other sends)
  struct Relay {
    int rank = -1;
    std::vector<int> peers;  // on the relay's node, in rank order
  };
  std::vector<Relay> relays;
  // The root sends as one broadcast: every other rank receives and each is on
  // a node of its own (whatever tree the broadcast uses, each receiver then
  // takes one state from another node, as from the root).
  bool broadcast = false;
};
// Pure. MALLE_CHECK: root and receivers are ranks in [0, size), nodes is empty or has `size` entries.
NodeTransferPlan PlanNodeTransfer(int root, const std::vector<int>& receivers,
                                  const std::vector<std::string>& nodes, int size);

// What one rank's part of a TransferStateByNode moved.
struct NodeTransferCounts {
  int64_t state_bytes = 0;  // the state's size (PackedState::bytes), on every rank taking part
  // State bytes this rank received from a rank on another node (an unknown
  // node counts as another): summed over the ranks, the bytes the transfer
  // put on the network between nodes.
  int64_t received_remote = 0;
  // State bytes this rank sent: to ranks on other nodes, and to ranks on its
  // own node (a relay's copies; the root's to its node peers). A broadcast
  // counts the root as sending to every receiver.
  int64_t sent_remote = 0;
  int64_t sent_local = 0;
};

// TransferState (same contract: call on the root and on every receiver, with
// the same `receivers` and `nodes`; other ranks return at once) along
// PlanNodeTransfer(root, receivers, nodes, comm.size()). A relay receives
// with `own`/`landing` like any receiver, then forwards the state it holds.
// `counts` (optional) gets this rank's share.
absl::StatusOr<PackedState> TransferStateByNode(comm::Communicator& comm, int root,
                                                const std::vector<int>& receivers,
                                                const std::vector<std::string>& nodes, PackedState* mine,
                                                const PackedState* own = nullptr,
                                                std::vector<at::Tensor>* landing = nullptr,
                                                NodeTransferCounts* counts = nullptr);

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_STATE_PACK_H_
