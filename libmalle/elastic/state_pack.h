// Job state in a few large flat buffers, for state sync to joiners and laggards.
//
// Defines StatePacker / StateUnpacker (a typed record stream whose tensors are
// references into one flat buffer per dtype) and BroadcastState (the transfer:
// three kinds of broadcast whatever the model). Same design as
// python/malletrain/state.py; the skeleton is a C++ byte format, not a pickle,
// so C++ and Python ranks cannot exchange state (they never share a job).
//
//   StatePacker packer;
//   packer.PutInt(step);
//   packer.PutTensor(weight);               // a reference; the bytes go to the fp32 buffer
//   PackedState packed = std::move(packer).Finish();
//   MALLE_ASSIGN_OR_RETURN(PackedState got, BroadcastState(comm, root, rank == root ? &packed : nullptr));
//   MALLE_ASSIGN_OR_RETURN(StateUnpacker in, StateUnpacker::Open(std::move(got)));
//   MALLE_ASSIGN_OR_RETURN(int64_t s, in.Int());
//   MALLE_ASSIGN_OR_RETURN(at::Tensor w, in.Tensor());   // a view of the received buffer
//
// Skeleton layout: magic "MSK1", u32 number of buffers, then per buffer
// (i8 dtype, i64 numel), then the records. Every record starts with a tag
// byte ('i' int64, 'd' double, 's' string, 't' tensor) so a reader out of
// step with the writer gets an error naming what it expected, never garbage.
//
// Thread-safety: packers and unpackers are single-threaded values.
// BroadcastState follows the Communicator's rule (one thread, same order on
// every rank).
#ifndef MALLE_ELASTIC_STATE_PACK_H_
#define MALLE_ELASTIC_STATE_PACK_H_

#include <cstdint>
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

struct PackedState {
  std::string skeleton;
  // One contiguous 1-D buffer per dtype, on the device of the packed tensors.
  std::map<at::ScalarType, at::Tensor> buffers;
  int64_t bytes() const;  // skeleton + buffers
};

class StatePacker {
 public:
  void PutInt(int64_t value);
  void PutDouble(double value);
  void PutString(absl::string_view value);
  // Records shape and dtype and appends the elements to the buffer of its
  // dtype. An undefined tensor is allowed (it unpacks as undefined). Tensors
  // must be dense and all on one device (MALLE_CHECK: job state is built by
  // the library from parameters and optimizer state).
  void PutTensor(const at::Tensor& tensor);
  PackedState Finish() &&;

 private:
  std::string body_;
  std::map<at::ScalarType, std::vector<at::Tensor>> tensors_;
  std::map<at::ScalarType, int64_t> sizes_;
};

// The buffer lengths (elements per dtype) a skeleton refers to.
// Errors: kInvalidArgument for a corrupt skeleton.
absl::StatusOr<std::map<at::ScalarType, int64_t>> BufferSizes(absl::string_view skeleton);

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
// skeleton bytes, then one byte-view broadcast per dtype buffer (CPU). `mine`
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
absl::StatusOr<PackedState> TransferState(comm::Communicator& comm, int root,
                                          const std::vector<int>& receivers, PackedState* mine);

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_STATE_PACK_H_
