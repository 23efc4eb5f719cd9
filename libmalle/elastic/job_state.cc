#include "libmalle/elastic/job_state.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libmalle/base/status_macros.h"

namespace malle::elastic {
namespace {

constexpr int64_t kMaxCount = int64_t{1} << 24;  // tensors or parts in one state: a corrupt count beyond

std::string Describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::string s = c10::toString(t.scalar_type());
  absl::StrAppend(&s, "[");
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&s, i ? "," : "", t.size(i));
  absl::StrAppend(&s, "]");
  return s;
}

absl::StatusOr<int64_t> Count(StateUnpacker& in, const char* what) {
  MALLE_ASSIGN_OR_RETURN(int64_t n, in.Int());
  if (n < 0 || n > kMaxCount) {
    return absl::InvalidArgumentError(absl::StrCat("state: corrupt ", what, " count ", n));
  }
  return n;
}

absl::StatusOr<std::vector<NamedTensor>> ReadNamed(StateUnpacker& in, const char* what) {
  MALLE_ASSIGN_OR_RETURN(int64_t n, Count(in, what));
  std::vector<NamedTensor> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    NamedTensor t;
    MALLE_ASSIGN_OR_RETURN(t.name, in.String());
    MALLE_ASSIGN_OR_RETURN(t.tensor, in.Tensor());
    out.push_back(std::move(t));
  }
  return out;
}

void PutNamed(StatePacker& out, const std::vector<NamedTensor>& list) {
  out.PutInt(static_cast<int64_t>(list.size()));
  for (const NamedTensor& t : list) {
    out.PutString(t.name);
    out.PutTensor(t.tensor);
  }
}

// The same bytes in the same order hash the same on every replica.
uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t HashTensor(uint64_t h, const at::Tensor& tensor) {
  if (!tensor.defined()) return Fnv1a(h, "U", 1);
  const std::string shape = Describe(tensor);
  h = Fnv1a(h, shape.data(), shape.size());
  at::Tensor t = tensor.detach().cpu().contiguous();
  return Fnv1a(h, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
}

}  // namespace

int64_t JobState::tensor_bytes() const {
  int64_t n = 0;
  auto add = [&n](const at::Tensor& t) {
    if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  };
  for (const NamedTensor& t : parameters) add(t.tensor);
  for (const NamedTensor& t : buffers) add(t.tensor);
  for (const StatePartRecord& p : parts) {
    for (const at::Tensor& t : p.state.tensors) add(t);
  }
  return n;
}

const StatePartRecord* JobState::part(const std::string& name) const {
  for (const StatePartRecord& p : parts) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

PackedState JobState::Pack(int64_t direct_min_bytes) const {
  StatePacker out(direct_min_bytes);
  out.PutInt(kJobStateVersion);
  out.PutInt(logical_workers);
  out.PutInt(static_cast<int64_t>(seed));
  out.PutInt(step);
  out.PutInt(position);
  out.PutDouble(lr_factor);
  PutNamed(out, parameters);
  PutNamed(out, buffers);
  out.PutInt(static_cast<int64_t>(parts.size()));
  for (const StatePartRecord& p : parts) {
    out.PutString(p.name);
    out.PutString(p.state.bytes);
    out.PutInt(static_cast<int64_t>(p.state.tensors.size()));
    for (const at::Tensor& t : p.state.tensors) out.PutTensor(t);
  }
  return std::move(out).Finish();
}

absl::StatusOr<JobState> JobState::Unpack(PackedState packed) {
  MALLE_ASSIGN_OR_RETURN(StateUnpacker in, StateUnpacker::Open(std::move(packed)));
  MALLE_ASSIGN_OR_RETURN(int64_t version, in.Int());
  if (version != kJobStateVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: format version ", version, " is not this library's ", kJobStateVersion));
  }
  JobState s;
  MALLE_ASSIGN_OR_RETURN(int64_t workers, in.Int());
  MALLE_ASSIGN_OR_RETURN(int64_t seed, in.Int());
  s.logical_workers = static_cast<int>(workers);
  s.seed = static_cast<uint64_t>(seed);
  MALLE_ASSIGN_OR_RETURN(s.step, in.Int());
  MALLE_ASSIGN_OR_RETURN(s.position, in.Int());
  MALLE_ASSIGN_OR_RETURN(s.lr_factor, in.Double());
  if (workers < 0 || s.step < 0 || s.position < 0 || !(s.lr_factor >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("state: corrupt counters (logical_workers ", workers, ", step ",
                                                   s.step, ", position ", s.position, ")"));
  }
  MALLE_ASSIGN_OR_RETURN(s.parameters, ReadNamed(in, "parameter"));
  MALLE_ASSIGN_OR_RETURN(s.buffers, ReadNamed(in, "buffer"));
  MALLE_ASSIGN_OR_RETURN(int64_t num_parts, Count(in, "part"));
  for (int64_t i = 0; i < num_parts; ++i) {
    StatePartRecord p;
    MALLE_ASSIGN_OR_RETURN(p.name, in.String());
    MALLE_ASSIGN_OR_RETURN(p.state.bytes, in.String());
    MALLE_ASSIGN_OR_RETURN(int64_t nt, Count(in, "part tensor"));
    for (int64_t j = 0; j < nt; ++j) {
      MALLE_ASSIGN_OR_RETURN(at::Tensor t, in.Tensor());
      p.state.tensors.push_back(std::move(t));
    }
    s.parts.push_back(std::move(p));
  }
  if (!in.done()) return absl::InvalidArgumentError("state: trailing bytes after the job state");
  return s;
}

absl::Status JobState::CheckCompatible(const JobState& mine, const JobState& theirs) {
  if (mine.logical_workers != theirs.logical_workers || mine.seed != theirs.seed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job mismatch: the state has logical_workers=", theirs.logical_workers, ", seed=", theirs.seed,
        "; this rank has ", mine.logical_workers, ", ", mine.seed));
  }
  std::vector<std::string> diffs;
  const std::vector<NamedTensor>* lists[2][2] = {{&mine.parameters, &theirs.parameters},
                                                 {&mine.buffers, &theirs.buffers}};
  const char* kinds[2] = {"parameter", "buffer"};
  for (int k = 0; k < 2; ++k) {
    const std::vector<NamedTensor>& a = *lists[k][0];
    const std::vector<NamedTensor>& b = *lists[k][1];
    const size_t n = std::max(a.size(), b.size());
    for (size_t i = 0; i < n && diffs.size() < 5; ++i) {
      if (i >= a.size()) {
        diffs.push_back(absl::StrCat(kinds[k], " '", b[i].name, "' only in the state"));
      } else if (i >= b.size()) {
        diffs.push_back(absl::StrCat(kinds[k], " '", a[i].name, "' only on this rank"));
      } else if (a[i].name != b[i].name || !b[i].tensor.defined() ||
                 a[i].tensor.sizes() != b[i].tensor.sizes() ||
                 a[i].tensor.scalar_type() != b[i].tensor.scalar_type()) {
        diffs.push_back(absl::StrCat(kinds[k], " ", i, ": here '", a[i].name, "' ", Describe(a[i].tensor),
                                     ", state '", b[i].name, "' ", Describe(b[i].tensor)));
      }
    }
  }
  if (!diffs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model mismatch: this rank's model differs from the state's (first differences: ",
        absl::StrJoin(diffs, "; "), "); every rank must build the same model"));
  }
  for (const StatePartRecord& p : mine.parts) {
    if (theirs.part(p.name) == nullptr) {
      std::vector<std::string> have;
      for (const StatePartRecord& q : theirs.parts) have.push_back(q.name);
      return absl::InvalidArgumentError(absl::StrCat("state mismatch: '", p.name,
                                                     "' is not in the state (it has: ",
                                                     have.empty() ? "nothing" : absl::StrJoin(have, ", "),
                                                     "); every rank must wrap and track the same objects"));
    }
  }
  return absl::OkStatus();
}

std::string JobState::Digest() const {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto* list : {&parameters, &buffers}) {
    for (const NamedTensor& t : *list) {
      h = Fnv1a(h, t.name.data(), t.name.size());
      h = HashTensor(h, t.tensor);
    }
  }
  if (const StatePartRecord* opt = part("optimizer")) {
    h = Fnv1a(h, opt->state.bytes.data(), opt->state.bytes.size());
    for (const at::Tensor& t : opt->state.tensors) h = HashTensor(h, t);
  }
  return absl::StrFormat("%016x", h);
}

}  // namespace malle::elastic
