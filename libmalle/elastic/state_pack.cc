#include "libmalle/elastic/state_pack.h"

#include <algorithm>

#include <cstring>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libmalle/base/check.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/comm/communicator.h"

namespace malle::elastic {
namespace {

constexpr char kMagic[4] = {'M', 'S', 'K', '1'};
constexpr int64_t kHeaderMagic = 0x4d414c4c45535431;  // "MALLEST1"

template <typename T>
void Append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

bool KnownDtype(int code) {
  return code >= 0 && code < static_cast<int>(at::ScalarType::NumOptions);
}

}  // namespace

int64_t PackedState::bytes() const {
  int64_t n = static_cast<int64_t>(skeleton.size());
  for (const auto& [dtype, buffer] : buffers) n += buffer.numel() * static_cast<int64_t>(buffer.element_size());
  return n;
}

void StatePacker::PutInt(int64_t value) {
  body_.push_back('i');
  Append(body_, value);
}

void StatePacker::PutDouble(double value) {
  body_.push_back('d');
  Append(body_, value);
}

void StatePacker::PutString(absl::string_view value) {
  body_.push_back('s');
  Append(body_, static_cast<int64_t>(value.size()));
  body_.append(value.data(), value.size());
}

void StatePacker::PutTensor(const at::Tensor& tensor) {
  body_.push_back('t');
  if (!tensor.defined()) {
    Append(body_, static_cast<int8_t>(0));
    return;
  }
  MALLE_CHECK(tensor.layout() == at::kStrided) << "job state: only dense tensors";
  Append(body_, static_cast<int8_t>(1));
  const at::ScalarType dtype = tensor.scalar_type();
  Append(body_, static_cast<int8_t>(dtype));
  Append(body_, static_cast<int32_t>(tensor.dim()));
  for (int64_t d : tensor.sizes()) Append(body_, d);
  int64_t& offset = sizes_[dtype];
  Append(body_, offset);
  offset += tensor.numel();
  tensors_[dtype].push_back(tensor.detach().reshape({-1}));
}

PackedState StatePacker::Finish() && {
  PackedState out;
  out.skeleton.append(kMagic, 4);
  Append(out.skeleton, static_cast<uint32_t>(sizes_.size()));
  for (const auto& [dtype, numel] : sizes_) {
    Append(out.skeleton, static_cast<int8_t>(dtype));
    Append(out.skeleton, numel);
  }
  out.skeleton += body_;
  for (auto& [dtype, list] : tensors_) {
    out.buffers[dtype] = list.size() == 1 ? list.front().clone() : at::cat(list);
  }
  body_.clear();
  tensors_.clear();
  sizes_.clear();
  return out;
}

absl::StatusOr<std::map<at::ScalarType, int64_t>> BufferSizes(absl::string_view skeleton) {
  auto corrupt = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("state: corrupt state message (", why, ")"));
  };
  if (skeleton.size() < 8 || std::memcmp(skeleton.data(), kMagic, 4) != 0) return corrupt("bad magic");
  uint32_t count;
  std::memcpy(&count, skeleton.data() + 4, 4);
  if (count > static_cast<uint32_t>(at::ScalarType::NumOptions) || skeleton.size() < 8 + count * 9ULL) {
    return corrupt(absl::StrCat("buffer count ", count));
  }
  std::map<at::ScalarType, int64_t> sizes;
  for (uint32_t i = 0; i < count; ++i) {
    int8_t code;
    int64_t numel;
    std::memcpy(&code, skeleton.data() + 8 + i * 9, 1);
    std::memcpy(&numel, skeleton.data() + 8 + i * 9 + 1, 8);
    if (!KnownDtype(code) || numel < 0 || sizes.count(static_cast<at::ScalarType>(code))) {
      return corrupt(absl::StrCat("buffer ", i, ": dtype ", static_cast<int>(code), ", numel ", numel));
    }
    sizes[static_cast<at::ScalarType>(code)] = numel;
  }
  return sizes;
}

absl::StatusOr<StateUnpacker> StateUnpacker::Open(PackedState state) {
  MALLE_ASSIGN_OR_RETURN(auto sizes, BufferSizes(state.skeleton));
  if (sizes.size() != state.buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("state: skeleton names ", sizes.size(),
                                                   " buffers, got ", state.buffers.size()));
  }
  for (const auto& [dtype, numel] : sizes) {
    auto it = state.buffers.find(dtype);
    if (it == state.buffers.end() || it->second.scalar_type() != dtype || it->second.numel() != numel ||
        !it->second.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat("state: buffer of dtype ", c10::toString(dtype),
                                                     " missing or not ", numel, " contiguous elements"));
    }
  }
  StateUnpacker out(std::move(state));
  out.pos_ = 8 + sizes.size() * 9;
  return out;
}

template <typename T>
absl::StatusOr<T> StateUnpacker::Raw(const char* what) {
  if (state_.skeleton.size() - pos_ < sizeof(T)) {
    return absl::InvalidArgumentError(absl::StrCat("state: truncated state message reading ", what));
  }
  T value;
  std::memcpy(&value, state_.skeleton.data() + pos_, sizeof(T));
  pos_ += sizeof(T);
  return value;
}

absl::Status StateUnpacker::Expect(char tag, const char* what) {
  if (pos_ >= state_.skeleton.size()) {
    return absl::InvalidArgumentError(absl::StrCat("state: message ends where ", what, " was expected"));
  }
  const char got = state_.skeleton[pos_];
  if (got != tag) {
    return absl::InvalidArgumentError(absl::StrCat("state: expected ", what, " at byte ", pos_,
                                                   ", found record tag '", std::string(1, got), "'"));
  }
  ++pos_;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> StateUnpacker::Int() {
  MALLE_RETURN_IF_ERROR(Expect('i', "an integer"));
  return Raw<int64_t>("an integer");
}

absl::StatusOr<double> StateUnpacker::Double() {
  MALLE_RETURN_IF_ERROR(Expect('d', "a double"));
  return Raw<double>("a double");
}

absl::StatusOr<std::string> StateUnpacker::String() {
  MALLE_RETURN_IF_ERROR(Expect('s', "a string"));
  MALLE_ASSIGN_OR_RETURN(int64_t n, Raw<int64_t>("a string length"));
  if (n < 0 || static_cast<uint64_t>(n) > state_.skeleton.size() - pos_) {
    return absl::InvalidArgumentError(absl::StrCat("state: string of length ", n, " overruns the message"));
  }
  std::string out = state_.skeleton.substr(pos_, n);
  pos_ += n;
  return out;
}

absl::StatusOr<at::Tensor> StateUnpacker::Tensor() {
  MALLE_RETURN_IF_ERROR(Expect('t', "a tensor"));
  MALLE_ASSIGN_OR_RETURN(int8_t defined, Raw<int8_t>("a tensor"));
  if (defined == 0) return at::Tensor();
  MALLE_ASSIGN_OR_RETURN(int8_t code, Raw<int8_t>("a tensor dtype"));
  MALLE_ASSIGN_OR_RETURN(int32_t ndim, Raw<int32_t>("a tensor rank"));
  if (!KnownDtype(code) || ndim < 0 || ndim > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: tensor with dtype code ", static_cast<int>(code), " and rank ", ndim));
  }
  std::vector<int64_t> shape(ndim);
  int64_t numel = 1;
  for (int32_t i = 0; i < ndim; ++i) {
    MALLE_ASSIGN_OR_RETURN(shape[i], Raw<int64_t>("a tensor shape"));
    if (shape[i] < 0) return absl::InvalidArgumentError("state: negative tensor dimension");
    numel *= shape[i];
  }
  MALLE_ASSIGN_OR_RETURN(int64_t offset, Raw<int64_t>("a tensor offset"));
  auto it = state_.buffers.find(static_cast<at::ScalarType>(code));
  if (it == state_.buffers.end() || offset < 0 || offset + numel > it->second.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("state: tensor reference (", numel, " elements at ",
                                                   offset, ") outside the received buffers"));
  }
  return it->second.narrow(0, offset, numel).view(shape);
}

absl::StatusOr<PackedState> BroadcastState(comm::Communicator& comm, int root, PackedState* mine) {
  std::vector<int> everyone;
  for (int r = 0; r < comm.size(); ++r) {
    if (r != root) everyone.push_back(r);
  }
  return TransferState(comm, root, everyone, mine);
}

absl::StatusOr<PackedState> TransferState(comm::Communicator& comm, int root,
                                          const std::vector<int>& receivers, PackedState* mine) {
  const bool is_root = comm.rank() == root;
  MALLE_CHECK(is_root == (mine != nullptr)) << "TransferState: state given on a non-root rank or missing on the root";
  const bool receives = std::find(receivers.begin(), receivers.end(), comm.rank()) != receivers.end();
  if (!is_root && !receives) return PackedState();
  const bool broadcast = static_cast<int>(receivers.size()) == comm.size() - 1;
  int tag = 0;
  // One message: a broadcast, or the root's sends / a receiver's recv.
  auto move = [&](at::Tensor tensor) -> absl::Status {
    const int t = tag++;
    if (broadcast) return comm.Broadcast(tensor, root);
    if (!is_root) return comm.Recv(tensor, root, t);
    for (int r : receivers) MALLE_RETURN_IF_ERROR(comm.Send(tensor, r, t));
    return absl::OkStatus();
  };
  at::Tensor header = at::zeros({4}, at::kLong);
  if (is_root) {
    int64_t* h = header.data_ptr<int64_t>();
    h[0] = kHeaderMagic;
    h[1] = static_cast<int64_t>(mine->skeleton.size());
    h[2] = mine->bytes();
  }
  MALLE_RETURN_IF_ERROR(move(header));
  const int64_t* h = header.data_ptr<int64_t>();
  if (h[0] != kHeaderMagic || h[1] < 8 || h[1] > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat("state: bad state header from rank ", root));
  }
  at::Tensor raw = at::empty({h[1]}, at::kByte);
  if (is_root) std::memcpy(raw.data_ptr<uint8_t>(), mine->skeleton.data(), mine->skeleton.size());
  MALLE_RETURN_IF_ERROR(move(raw));
  PackedState out;
  if (is_root) {
    out = std::move(*mine);
  } else {
    out.skeleton.assign(reinterpret_cast<const char*>(raw.data_ptr<uint8_t>()), raw.numel());
  }
  MALLE_ASSIGN_OR_RETURN(auto sizes, BufferSizes(out.skeleton));
  for (const auto& [dtype, numel] : sizes) {
    at::Tensor& buffer = out.buffers[dtype];
    if (!is_root) buffer = at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (numel == 0) continue;
    // Bytes on the wire: every dtype (bool, bfloat16, ...) travels as uint8.
    MALLE_RETURN_IF_ERROR(move(buffer.view(at::kByte)));
  }
  return out;
}

}  // namespace malle::elastic
