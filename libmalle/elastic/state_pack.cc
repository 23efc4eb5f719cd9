#include "libmalle/elastic/state_pack.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>

#include <ATen/ops/cat.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libmalle/base/check.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/comm/communicator.h"

namespace malle::elastic {
namespace {

// Tensors in a flat buffer start on 64-byte boundaries (FlattenTensors).
constexpr int64_t kFlatAlignBytes = 64;

// `numel` rounded up to the flat-buffer alignment: what a tensor takes in one.
int64_t PaddedNumel(int64_t numel, int64_t element_size) {
  const int64_t align = std::max<int64_t>(1, kFlatAlignBytes / element_size);
  return (numel + align - 1) / align * align;
}

constexpr char kMagic[4] = {'M', 'S', 'K', '3'};
constexpr int64_t kHeaderMagic = 0x4d414c4c45535433;  // "MALLEST3"
constexpr size_t kSpecBytes = 10;                      // i8 dtype + i64 numel + i8 device

// A segment's device on the wire: the receiver uses its current device of that type.
int8_t DeviceCode(c10::DeviceType d) { return d == c10::DeviceType::CUDA ? 1 : 0; }

template <typename T>
void Append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

bool KnownDtype(int code) {
  return code >= 0 && code < static_cast<int>(at::ScalarType::NumOptions);
}

absl::Status Corrupt(const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("state: corrupt state message (", why, ")"));
}

// Reads a T at `pos` of a skeleton and advances past it.
template <typename T>
absl::StatusOr<T> ReadRaw(absl::string_view skeleton, size_t& pos, const char* what) {
  if (skeleton.size() - pos < sizeof(T)) {
    return absl::InvalidArgumentError(absl::StrCat("state: truncated state message reading ", what));
  }
  T value;
  std::memcpy(&value, skeleton.data() + pos, sizeof(T));
  pos += sizeof(T);
  return value;
}

// A defined tensor record, after its tag and "defined" byte.
struct TensorRecord {
  int8_t code;
  std::vector<int64_t> shape;
  int64_t numel;
  uint32_t segment;
  int64_t offset;
};

absl::StatusOr<TensorRecord> ReadTensorRecord(absl::string_view skeleton, size_t& pos) {
  TensorRecord r;
  MALLE_ASSIGN_OR_RETURN(r.code, ReadRaw<int8_t>(skeleton, pos, "a tensor dtype"));
  MALLE_ASSIGN_OR_RETURN(int32_t ndim, ReadRaw<int32_t>(skeleton, pos, "a tensor rank"));
  if (!KnownDtype(r.code) || ndim < 0 || ndim > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: tensor with dtype code ", static_cast<int>(r.code), " and rank ", ndim));
  }
  r.shape.resize(ndim);
  r.numel = 1;
  for (int64_t& d : r.shape) {
    MALLE_ASSIGN_OR_RETURN(d, ReadRaw<int64_t>(skeleton, pos, "a tensor shape"));
    if (d < 0) return absl::InvalidArgumentError("state: negative tensor dimension");
    r.numel *= d;
  }
  MALLE_ASSIGN_OR_RETURN(r.segment, ReadRaw<uint32_t>(skeleton, pos, "a tensor segment"));
  MALLE_ASSIGN_OR_RETURN(r.offset, ReadRaw<int64_t>(skeleton, pos, "a tensor offset"));
  return r;
}

// One tensor record's place: which record it is, its shape and offset.
struct TensorPlace {
  int64_t record;
  std::vector<int64_t> shape;
  int64_t offset;
  bool operator==(const TensorPlace& o) const {
    return record == o.record && shape == o.shape && offset == o.offset;
  }
};

// Per segment, the places of the tensors that refer to it, in record order.
absl::StatusOr<std::vector<std::vector<TensorPlace>>> Layouts(absl::string_view skeleton, size_t segments) {
  std::vector<std::vector<TensorPlace>> out(segments);
  size_t pos = 8 + segments * kSpecBytes;
  for (int64_t record = 0; pos < skeleton.size(); ++record) {
    const char tag = skeleton[pos++];
    if (tag == 'i' || tag == 'd') {
      MALLE_RETURN_IF_ERROR(ReadRaw<int64_t>(skeleton, pos, "a number").status());
    } else if (tag == 's') {
      MALLE_ASSIGN_OR_RETURN(int64_t n, ReadRaw<int64_t>(skeleton, pos, "a string length"));
      if (n < 0 || static_cast<uint64_t>(n) > skeleton.size() - pos) return Corrupt("string overruns");
      pos += n;
    } else if (tag == 't') {
      MALLE_ASSIGN_OR_RETURN(int8_t defined, ReadRaw<int8_t>(skeleton, pos, "a tensor"));
      if (!defined) continue;
      MALLE_ASSIGN_OR_RETURN(TensorRecord r, ReadTensorRecord(skeleton, pos));
      if (r.segment >= segments) return Corrupt(absl::StrCat("tensor in segment ", r.segment));
      out[r.segment].push_back({record, std::move(r.shape), r.offset});
    } else {
      return Corrupt(absl::StrCat("record tag '", std::string(1, tag), "'"));
    }
  }
  return out;
}

}  // namespace

int64_t PackedState::bytes() const {
  int64_t n = static_cast<int64_t>(skeleton.size());
  for (const at::Tensor& buffer : buffers) n += buffer.numel() * static_cast<int64_t>(buffer.element_size());
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
  MALLE_CHECK(tensor.device().is_cpu() || tensor.device().is_cuda()) << "job state: CPU and CUDA tensors only";
  Append(body_, static_cast<int8_t>(1));
  Append(body_, static_cast<int8_t>(tensor.scalar_type()));
  Append(body_, static_cast<int32_t>(tensor.dim()));
  for (int64_t d : tensor.sizes()) Append(body_, d);
  tensors_.push_back({body_.size(), tensor.detach()});
  Append(body_, uint32_t{0});  // segment and offset: decided in Finish()
  Append(body_, int64_t{0});
}

PackedState StatePacker::Finish() && {
  PackedState out;
  std::vector<SegmentSpec> specs;
  std::vector<std::pair<uint32_t, int64_t>> place(tensors_.size());  // (segment, offset)
  std::vector<bool> placed(tensors_.size(), false);
  // Direct segments: the tensors of one storage, sent from it.
  std::vector<const void*> order;
  std::map<const void*, std::vector<size_t>> by_storage;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const at::Tensor& t = tensors_[i].tensor;
    if (t.numel() == 0) continue;
    const void* key = t.storage().data();
    if (!by_storage.count(key)) order.push_back(key);
    by_storage[key].push_back(i);
  }
  for (const void* key : order) {
    const std::vector<size_t>& idx = by_storage[key];
    const at::Tensor& first = tensors_[idx.front()].tensor;
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0, used = 0;
    bool ok = true;
    for (size_t i : idx) {
      const at::Tensor& t = tensors_[i].tensor;
      ok = ok && t.scalar_type() == first.scalar_type() && t.is_contiguous();
      lo = std::min(lo, t.storage_offset());
      hi = std::max(hi, t.storage_offset() + t.numel());
      used += PaddedNumel(t.numel(), static_cast<int64_t>(t.element_size()));  // gaps of a flat buffer are not slack
    }
    const int64_t bytes = (hi - lo) * static_cast<int64_t>(first.element_size());
    if (!ok || bytes < direct_min_bytes_ || static_cast<double>(hi - lo) > 1.25 * static_cast<double>(used)) continue;
    const uint32_t segment = static_cast<uint32_t>(specs.size());
    specs.push_back({first.scalar_type(), hi - lo, first.device().type()});
    out.buffers.push_back(first.as_strided({hi - lo}, {1}, lo));
    out.direct.push_back(true);
    for (size_t i : idx) {
      place[i] = {segment, tensors_[i].tensor.storage_offset() - lo};
      placed[i] = true;
    }
  }
  // Packed segments: everything else, one per dtype and device, by copying.
  std::map<std::pair<at::ScalarType, c10::DeviceType>, uint32_t> packed;
  std::vector<std::vector<at::Tensor>> parts(specs.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (placed[i]) continue;
    const at::Tensor& t = tensors_[i].tensor;
    const std::pair<at::ScalarType, c10::DeviceType> key{t.scalar_type(), t.device().type()};
    auto it = packed.find(key);
    if (it == packed.end()) {
      it = packed.emplace(key, static_cast<uint32_t>(specs.size())).first;
      specs.push_back({t.scalar_type(), 0, t.device().type()});
      parts.emplace_back();
      out.buffers.emplace_back();
      out.direct.push_back(false);
    }
    place[i] = {it->second, specs[it->second].numel};
    specs[it->second].numel += t.numel();
    parts[it->second].push_back(t.reshape({-1}));
  }
  for (const auto& [dtype, segment] : packed) {
    auto& list = parts[segment];
    out.buffers[segment] = list.size() == 1 ? list.front().clone() : at::cat(list);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    std::memcpy(&body_[tensors_[i].pos], &place[i].first, 4);
    std::memcpy(&body_[tensors_[i].pos + 4], &place[i].second, 8);
  }
  out.skeleton.append(kMagic, 4);
  Append(out.skeleton, static_cast<uint32_t>(specs.size()));
  for (const SegmentSpec& spec : specs) {
    Append(out.skeleton, static_cast<int8_t>(spec.dtype));
    Append(out.skeleton, spec.numel);
    Append(out.skeleton, DeviceCode(spec.device));
  }
  out.skeleton += body_;
  body_.clear();
  tensors_.clear();
  return out;
}

absl::StatusOr<std::vector<SegmentSpec>> SegmentSpecs(absl::string_view skeleton) {
  if (skeleton.size() < 8 || std::memcmp(skeleton.data(), kMagic, 4) != 0) return Corrupt("bad magic");
  uint32_t count;
  std::memcpy(&count, skeleton.data() + 4, 4);
  if (count > (1u << 20) || skeleton.size() < 8 + count * uint64_t{kSpecBytes}) {
    return Corrupt(absl::StrCat("segment count ", count));
  }
  std::vector<SegmentSpec> specs;
  for (uint32_t i = 0; i < count; ++i) {
    int8_t code;
    int64_t numel;
    int8_t device;
    std::memcpy(&code, skeleton.data() + 8 + i * kSpecBytes, 1);
    std::memcpy(&numel, skeleton.data() + 8 + i * kSpecBytes + 1, 8);
    std::memcpy(&device, skeleton.data() + 8 + i * kSpecBytes + 9, 1);
    if (!KnownDtype(code) || numel < 0 || (device != 0 && device != 1)) {
      return Corrupt(absl::StrCat("segment ", i, ": dtype ", static_cast<int>(code), ", numel ", numel, ", device ",
                                  static_cast<int>(device)));
    }
    specs.push_back({static_cast<at::ScalarType>(code), numel,
                     device == 1 ? c10::DeviceType::CUDA : c10::DeviceType::CPU});
  }
  return specs;
}

absl::StatusOr<std::vector<SegmentLayout>> LayoutOf(const PackedState& state) {
  MALLE_ASSIGN_OR_RETURN(std::vector<SegmentSpec> specs, SegmentSpecs(state.skeleton));
  std::vector<SegmentLayout> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    const bool direct = i < state.direct.size() && state.direct[i];
    out.push_back({specs[i].dtype, specs[i].numel, specs[i].device == c10::DeviceType::CUDA ? "cuda" : "cpu", direct});
  }
  return out;
}

std::string EncodeLayout(const std::vector<SegmentLayout>& layout) {
  nlohmann::json out = nlohmann::json::array();
  for (const SegmentLayout& s : layout) {
    out.push_back({c10::getDtypeNames(s.dtype).first, s.numel, s.device_type, s.direct});
  }
  return out.dump();
}

absl::StatusOr<std::vector<SegmentLayout>> DecodeLayout(absl::string_view json) {
  const nlohmann::json doc = nlohmann::json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("state layout: not JSON");
  if (!doc.is_array()) return absl::InvalidArgumentError(absl::StrCat("state layout: expected a list, got ", doc.type_name()));
  const auto& names = c10::getStringToDtypeMap();
  std::vector<SegmentLayout> out;
  for (size_t i = 0; i < doc.size(); ++i) {
    const nlohmann::json& item = doc[i];
    if (!item.is_array() || item.size() != 4 || !item[0].is_string() || !item[1].is_number_integer() ||
        item[1].get<int64_t>() < 0 || !item[2].is_string() || !item[3].is_boolean() ||
        (item[2] != "cpu" && item[2] != "cuda")) {
      return absl::InvalidArgumentError(absl::StrCat("state layout: segment ", i,
                                                     ": expected [dtype, numel >= 0, 'cpu'|'cuda', direct], got ",
                                                     item.dump()));
    }
    auto dtype = names.find(item[0].get<std::string>());
    if (dtype == names.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("state layout: segment ", i, ": unknown dtype '", item[0].get<std::string>(), "'"));
    }
    out.push_back({dtype->second, item[1].get<int64_t>(), item[2].get<std::string>(), item[3].get<bool>()});
  }
  return out;
}

std::vector<at::Tensor> LandingBuffers(const std::vector<SegmentLayout>& expected,
                                       const std::vector<SegmentLayout>& own, int64_t min_bytes) {
  std::map<std::tuple<at::ScalarType, int64_t, std::string>, int> spare;
  for (const SegmentLayout& s : own) {
    if (s.direct) ++spare[{s.dtype, s.numel, s.device_type}];
  }
  std::vector<at::Tensor> out;
  for (const SegmentLayout& s : expected) {
    auto mine = spare.find({s.dtype, s.numel, s.device_type});
    if (mine != spare.end() && mine->second > 0) {
      --mine->second;
      continue;
    }
    if (s.device_type != "cpu" || s.numel * static_cast<int64_t>(c10::elementSize(s.dtype)) < min_bytes) continue;
    out.push_back(at::zeros({s.numel}, at::TensorOptions().dtype(s.dtype)));  // every page written once
  }
  return out;
}

absl::StatusOr<std::vector<at::Tensor>> InPlaceTargets(const PackedState& own, absl::string_view skeleton) {
  MALLE_ASSIGN_OR_RETURN(std::vector<SegmentSpec> theirs, SegmentSpecs(skeleton));
  MALLE_ASSIGN_OR_RETURN(std::vector<SegmentSpec> mine, SegmentSpecs(own.skeleton));
  MALLE_ASSIGN_OR_RETURN(auto their_layouts, Layouts(skeleton, theirs.size()));
  MALLE_ASSIGN_OR_RETURN(auto my_layouts, Layouts(own.skeleton, mine.size()));
  std::vector<at::Tensor> out(theirs.size());
  std::vector<bool> used(mine.size(), false);
  for (size_t i = 0; i < theirs.size(); ++i) {
    for (size_t j = 0; j < mine.size() && j < own.buffers.size(); ++j) {
      if (used[j] || j >= own.direct.size() || !own.direct[j] || mine[j].dtype != theirs[i].dtype ||
          mine[j].numel != theirs[i].numel || mine[j].device != theirs[i].device ||
          my_layouts[j] != their_layouts[i]) {
        continue;
      }
      out[i] = own.buffers[j];
      used[j] = true;
      break;
    }
  }
  return out;
}

bool FlattenTensors(const std::vector<at::Tensor>& tensors) {
  std::map<at::ScalarType, std::vector<const at::Tensor*>> groups;
  for (const at::Tensor& t : tensors) {
    // A non-contiguous tensor (e.g. channels_last) keeps its storage and
    // layout; a state sync packs it.
    if (t.defined() && t.is_contiguous()) groups[t.scalar_type()].push_back(&t);
  }
  bool changed = false;
  for (auto& [dtype, list] : groups) {
    const void* storage = nullptr;
    bool flat = true;
    int64_t total = 0;
    for (const at::Tensor* t : list) {
      total += t->numel();
      if (t->numel() == 0) continue;
      flat = flat && t->is_contiguous() && (storage == nullptr || t->storage().data() == storage);
      storage = t->storage().data();
    }
    if (flat) continue;
    // Each tensor starts on a 64-byte boundary (the CPU allocator's alignment
    // of the buffer): vectorised kernels over it (the optimizer's update) do
    // not straddle cache lines at every load, as behind a 1-element tensor
    // such as Adam's step. The gaps are zeros. The same rule as
    // python/malletrain/state.py, so both APIs lay out a state alike.
    const auto elsize = static_cast<int64_t>(c10::elementSize(dtype));
    auto padded = [elsize](int64_t n) { return PaddedNumel(n, elsize); };
    total = 0;
    for (const at::Tensor* t : list) total += padded(t->numel());
    at::Tensor buffer = at::zeros({total}, list.front()->options().requires_grad(false));
    int64_t offset = 0;
    for (const at::Tensor* t : list) {
      at::Tensor view = buffer.narrow(0, offset, t->numel()).view(t->sizes());
      view.copy_(t->detach());
      const_cast<at::Tensor*>(t)->set_data(view);
      offset += padded(t->numel());
    }
    changed = true;
  }
  return changed;
}

absl::StatusOr<StateUnpacker> StateUnpacker::Open(PackedState state) {
  MALLE_ASSIGN_OR_RETURN(std::vector<SegmentSpec> specs, SegmentSpecs(state.skeleton));
  if (specs.size() != state.buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("state: skeleton names ", specs.size(),
                                                   " segments, got ", state.buffers.size()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const at::Tensor& b = state.buffers[i];
    if (!b.defined() || b.scalar_type() != specs[i].dtype || b.numel() != specs[i].numel || !b.is_contiguous() ||
        b.device().type() != specs[i].device) {
      return absl::InvalidArgumentError(absl::StrCat("state: segment ", i, " is not ", specs[i].numel,
                                                     " contiguous elements of ", c10::toString(specs[i].dtype),
                                                     " on ", c10::DeviceTypeName(specs[i].device, true)));
    }
  }
  StateUnpacker out(std::move(state));
  out.pos_ = 8 + specs.size() * kSpecBytes;
  return out;
}

template <typename T>
absl::StatusOr<T> StateUnpacker::Raw(const char* what) {
  return ReadRaw<T>(state_.skeleton, pos_, what);
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
  MALLE_ASSIGN_OR_RETURN(TensorRecord r, ReadTensorRecord(state_.skeleton, pos_));
  if (r.segment >= state_.buffers.size() || state_.buffers[r.segment].scalar_type() != static_cast<at::ScalarType>(r.code) ||
      r.offset < 0 || r.offset + r.numel > state_.buffers[r.segment].numel()) {
    return absl::InvalidArgumentError(absl::StrCat("state: tensor reference (", r.numel, " elements of dtype code ",
                                                   static_cast<int>(r.code), " at ", r.offset, " in segment ",
                                                   r.segment, ") outside the received segments"));
  }
  return state_.buffers[r.segment].narrow(0, r.offset, r.numel).view(r.shape);
}

void RecordWriter::PutInt(int64_t value) {
  bytes_.push_back('i');
  Append(bytes_, value);
}

void RecordWriter::PutDouble(double value) {
  bytes_.push_back('d');
  Append(bytes_, value);
}

void RecordWriter::PutString(absl::string_view value) {
  bytes_.push_back('s');
  Append(bytes_, static_cast<int64_t>(value.size()));
  bytes_.append(value.data(), value.size());
}

void RecordWriter::PutTensor(const at::Tensor& tensor) {
  bytes_.push_back('t');
  Append(bytes_, static_cast<uint32_t>(tensors_.size()));
  tensors_.push_back(tensor);  // the tensor itself: the engine may flatten it in place
}

absl::Status RecordReader::Expect(char tag, const char* what) {
  if (pos_ >= bytes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("state: record ends where ", what, " was expected"));
  }
  if (bytes_[pos_] != tag) {
    return absl::InvalidArgumentError(absl::StrCat("state: expected ", what, " at byte ", pos_,
                                                   ", found record tag '", std::string(1, bytes_[pos_]), "'"));
  }
  ++pos_;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RecordReader::Int() {
  MALLE_RETURN_IF_ERROR(Expect('i', "an integer"));
  return ReadRaw<int64_t>(bytes_, pos_, "an integer");
}

absl::StatusOr<double> RecordReader::Double() {
  MALLE_RETURN_IF_ERROR(Expect('d', "a double"));
  return ReadRaw<double>(bytes_, pos_, "a double");
}

absl::StatusOr<std::string> RecordReader::String() {
  MALLE_RETURN_IF_ERROR(Expect('s', "a string"));
  MALLE_ASSIGN_OR_RETURN(int64_t n, ReadRaw<int64_t>(bytes_, pos_, "a string length"));
  if (n < 0 || static_cast<uint64_t>(n) > bytes_.size() - pos_) {
    return absl::InvalidArgumentError(absl::StrCat("state: string of length ", n, " overruns the record"));
  }
  std::string out(bytes_.substr(pos_, n));
  pos_ += n;
  return out;
}

absl::StatusOr<at::Tensor> RecordReader::Tensor() {
  MALLE_RETURN_IF_ERROR(Expect('t', "a tensor"));
  MALLE_ASSIGN_OR_RETURN(uint32_t index, ReadRaw<uint32_t>(bytes_, pos_, "a tensor index"));
  if (index >= tensors_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: tensor ", index, " of a record that has ", tensors_.size()));
  }
  return tensors_[index];
}

absl::StatusOr<PackedState> BroadcastState(comm::Communicator& comm, int root, PackedState* mine) {
  std::vector<int> everyone;
  for (int r = 0; r < comm.size(); ++r) {
    if (r != root) everyone.push_back(r);
  }
  return TransferState(comm, root, everyone, mine);
}

namespace {

// TransferState; `allow_broadcast` false: point to point even when every
// other rank receives (a node-aware plan decides who crosses which link).
absl::StatusOr<PackedState> Transfer(comm::Communicator& comm, int root, const std::vector<int>& receivers,
                                     bool allow_broadcast, PackedState* mine, const PackedState* own,
                                     std::vector<at::Tensor>* landing) {
  const bool is_root = comm.rank() == root;
  MALLE_CHECK(is_root == (mine != nullptr)) << "TransferState: state given on a non-root rank or missing on the root";
  const bool receives = std::find(receivers.begin(), receivers.end(), comm.rank()) != receivers.end();
  if (!is_root && !receives) return PackedState();
  const bool broadcast = allow_broadcast && static_cast<int>(receivers.size()) == comm.size() - 1;
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
  MALLE_ASSIGN_OR_RETURN(std::vector<SegmentSpec> specs, SegmentSpecs(out.skeleton));
  if (!is_root) {
    std::vector<at::Tensor> targets(specs.size());
    if (own != nullptr) {
      MALLE_ASSIGN_OR_RETURN(targets, InPlaceTargets(*own, out.skeleton));
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      const bool in_place = targets[i].defined();
      at::Tensor buffer = targets[i];
      if (!in_place && landing != nullptr) {
        auto fits = std::find_if(landing->begin(), landing->end(), [&](const at::Tensor& b) {
          return b.scalar_type() == specs[i].dtype && b.numel() == specs[i].numel &&
                 b.device().type() == specs[i].device;
        });
        if (fits != landing->end()) {
          buffer = *fits;
          landing->erase(fits);
        }
      }
      if (!buffer.defined()) {
        // A CUDA segment lands on this rank's current CUDA device.
        buffer = at::empty({specs[i].numel}, at::TensorOptions().dtype(specs[i].dtype).device(specs[i].device));
      }
      out.buffers.push_back(buffer);
      out.direct.push_back(in_place);
    }
  } else if (out.buffers.size() != specs.size()) {
    return absl::InternalError("TransferState: the packed state's segments do not match its skeleton");
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].numel == 0) continue;
    // Bytes on the wire: every dtype (bool, bfloat16, ...) travels as uint8.
    MALLE_RETURN_IF_ERROR(move(out.buffers[i].view(at::kByte)));
  }
  return out;
}

}  // namespace

absl::StatusOr<PackedState> TransferState(comm::Communicator& comm, int root,
                                          const std::vector<int>& receivers, PackedState* mine,
                                          const PackedState* own, std::vector<at::Tensor>* landing) {
  return Transfer(comm, root, receivers, /*allow_broadcast=*/true, mine, own, landing);
}

namespace {

// Ranks r and q are on one node: both known and equal.
bool SameNode(const std::vector<std::string>& nodes, int r, int q) {
  if (nodes.empty()) return r == q;
  return r == q || (!nodes[r].empty() && nodes[r] == nodes[q]);
}

}  // namespace

NodeTransferPlan PlanNodeTransfer(int root, const std::vector<int>& receivers,
                                  const std::vector<std::string>& nodes, int size) {
  MALLE_CHECK(root >= 0 && root < size) << "PlanNodeTransfer: root " << root << " of " << size;
  MALLE_CHECK(nodes.empty() || static_cast<int>(nodes.size()) == size)
      << "PlanNodeTransfer: " << nodes.size() << " nodes for " << size << " ranks";
  std::vector<int> sorted = receivers;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  NodeTransferPlan plan;
  std::vector<int> direct;  // the root's node peers, and single receivers of other nodes
  std::vector<bool> placed(size, false);
  for (int r : sorted) {
    MALLE_CHECK(r >= 0 && r < size && r != root) << "PlanNodeTransfer: receiver " << r;
    if (placed[r]) continue;
    placed[r] = true;
    if (SameNode(nodes, r, root)) {
      direct.push_back(r);
      continue;
    }
    NodeTransferPlan::Relay relay;
    relay.rank = r;
    for (int q : sorted) {
      if (!placed[q] && q != r && SameNode(nodes, q, r)) {
        relay.peers.push_back(q);
        placed[q] = true;
      }
    }
    if (relay.peers.empty()) {
      direct.push_back(r);
    } else {
      plan.from_root.push_back(r);
      plan.relays.push_back(std::move(relay));
    }
  }
  plan.from_root.insert(plan.from_root.end(), direct.begin(), direct.end());
  if (static_cast<int>(sorted.size()) == size - 1) {
    bool distinct = true;
    for (int r = 0; r < size && distinct; ++r) {
      for (int q = r + 1; q < size && distinct; ++q) distinct = !SameNode(nodes, r, q);
    }
    plan.broadcast = distinct;
  }
  return plan;
}

absl::StatusOr<PackedState> TransferStateByNode(comm::Communicator& comm, int root,
                                                const std::vector<int>& receivers,
                                                const std::vector<std::string>& nodes, PackedState* mine,
                                                const PackedState* own, std::vector<at::Tensor>* landing,
                                                NodeTransferCounts* counts) {
  const int rank = comm.rank();
  if (!nodes.empty() && static_cast<int>(nodes.size()) != comm.size()) {
    return absl::InvalidArgumentError(absl::StrCat("state transfer: ", nodes.size(), " node names for ",
                                                   comm.size(), " ranks"));
  }
  const NodeTransferPlan plan = PlanNodeTransfer(root, receivers, nodes, comm.size());
  NodeTransferCounts local;
  if (counts == nullptr) counts = &local;
  *counts = NodeTransferCounts();
  if (rank == root) {
    const int64_t bytes = mine->bytes();
    MALLE_ASSIGN_OR_RETURN(PackedState out, Transfer(comm, root, plan.from_root, plan.broadcast, mine, nullptr, nullptr));
    counts->state_bytes = bytes;
    for (int r : plan.from_root) (SameNode(nodes, r, root) ? counts->sent_local : counts->sent_remote) += bytes;
    return out;
  }
  // Which stage this rank receives in: from the root, or from its node's relay.
  const bool from_root = std::find(plan.from_root.begin(), plan.from_root.end(), rank) != plan.from_root.end();
  const NodeTransferPlan::Relay* relay_of = nullptr;  // the relay this rank is a peer of
  const NodeTransferPlan::Relay* mine_relay = nullptr;  // this rank's own relay duty
  for (const NodeTransferPlan::Relay& relay : plan.relays) {
    if (relay.rank == rank) mine_relay = &relay;
    if (std::find(relay.peers.begin(), relay.peers.end(), rank) != relay.peers.end()) relay_of = &relay;
  }
  if (!from_root && relay_of == nullptr) return PackedState();  // takes no part
  const int sender = from_root ? root : relay_of->rank;
  const std::vector<int>& stage = from_root ? plan.from_root : relay_of->peers;
  MALLE_ASSIGN_OR_RETURN(PackedState got,
                         Transfer(comm, sender, stage, from_root && plan.broadcast, nullptr, own, landing));
  const int64_t bytes = got.bytes();
  counts->state_bytes = bytes;
  if (!SameNode(nodes, rank, sender)) counts->received_remote = bytes;
  if (mine_relay == nullptr) return got;
  // A relay: the state has crossed into this node once; copy it to the others here.
  MALLE_ASSIGN_OR_RETURN(PackedState out, Transfer(comm, rank, mine_relay->peers, false, &got, nullptr, nullptr));
  counts->sent_local = bytes * static_cast<int64_t>(mine_relay->peers.size());
  return out;
}

}  // namespace malle::elastic
