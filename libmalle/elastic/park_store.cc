// The one translation unit that includes OpenSSL for state files (HMAC-SHA256,
// SHA-256) and does their POSIX I/O.
#include "libmalle/elastic/park_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <random>
#include <thread>
#include <utility>

#include <ATen/ops/empty.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libmalle/base/status_macros.h"

namespace malle::elastic {
namespace {

constexpr char kMagic[8] = {'M', 'A', 'L', 'L', 'E', 'P', 'R', 'K'};
constexpr size_t kPrefixBytes = 8 + 4 + 4 + 8;
constexpr size_t kMacBytes = 32;
constexpr uint32_t kFlagSigned = 1;
constexpr uint64_t kMaxHeaderBytes = 1 << 20;
constexpr char kSuffix[] = ".mstate";

absl::Status IoError(const std::string& what, const std::string& path, int err) {
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (err == EACCES || err == EPERM || err == EROFS) return absl::PermissionDeniedError(msg);
  if (err == ENOENT) return absl::NotFoundError(msg);
  return absl::InternalError(msg);
}

// HMAC-SHA256 under `secret`, or SHA-256 when it is empty: the trailer.
class Mac {
 public:
  explicit Mac(const std::string& secret) {
    if (secret.empty()) {
      md_ = EVP_MD_CTX_new();
      EVP_DigestInit_ex(md_, EVP_sha256(), nullptr);
      return;
    }
    mac_ = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    ctx_ = EVP_MAC_CTX_new(mac_);
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_construct_end()};
    EVP_MAC_init(ctx_, reinterpret_cast<const unsigned char*>(secret.data()), secret.size(), params);
  }
  ~Mac() {
    if (md_) EVP_MD_CTX_free(md_);
    if (ctx_) EVP_MAC_CTX_free(ctx_);
    if (mac_) EVP_MAC_free(mac_);
  }
  Mac(const Mac&) = delete;
  Mac& operator=(const Mac&) = delete;
  void Update(const void* data, size_t n) {
    if (md_) {
      EVP_DigestUpdate(md_, data, n);
    } else {
      EVP_MAC_update(ctx_, static_cast<const unsigned char*>(data), n);
    }
  }
  std::string Final() {
    unsigned char out[EVP_MAX_MD_SIZE];
    size_t n = 0;
    if (md_) {
      unsigned int m = 0;
      EVP_DigestFinal_ex(md_, out, &m);
      n = m;
    } else {
      EVP_MAC_final(ctx_, out, &n, sizeof(out));
    }
    return std::string(reinterpret_cast<char*>(out), n);
  }

 private:
  EVP_MD_CTX* md_ = nullptr;
  EVP_MAC* mac_ = nullptr;
  EVP_MAC_CTX* ctx_ = nullptr;
};

// Feeds a Mac the byte ranges added to it, in order: on a thread of its own
// (beside the I/O of the caller, who adds each range once its bytes are there)
// or inline on the caller's. Every range must stay valid until Finish() or
// the destructor (which abandons what is left).
class Hasher {
 public:
  Hasher(Mac& mac, bool use_thread) : mac_(mac) {
    if (use_thread) thread_ = std::thread([this] { Run(); });
  }
  ~Hasher() { Stop(/*drain=*/false); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void Add(const void* data, size_t n) {
    if (n == 0) return;
    if (!thread_.joinable()) {
      mac_.Update(data, n);
      return;
    }
    absl::MutexLock lock(&mu_);
    queue_.emplace_back(static_cast<const char*>(data), n);
  }
  // Blocks until every range added is hashed; the Mac is then the caller's.
  void Finish() { Stop(/*drain=*/true); }

 private:
  void Run() {
    for (;;) {
      std::pair<const char*, size_t> next;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (abandon_ || queue_.empty()) return;
        next = queue_.front();
        queue_.pop_front();
      }
      mac_.Update(next.first, next.second);
    }
  }
  void Stop(bool drain) {
    if (!thread_.joinable()) return;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      abandon_ = !drain;
    }
    thread_.join();
  }

  Mac& mac_;
  absl::Mutex mu_;
  std::deque<std::pair<const char*, size_t>> queue_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool abandon_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Writes everything it is given to a file descriptor and starts the
// writeback of every kStateIoChunkBytes written (sync_file_range: the disk
// works while the caller copies and hashes the next chunks; the final fsync
// then waits for little). sync_file_range is advice: where the filesystem
// does not support it, the fsync alone makes the file durable.
class Writer {
 public:
  Writer(int fd, const std::string& path) : fd_(fd), path_(path) {}
  absl::Status Write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return IoError("cannot write", path_, errno);
      }
      p += w;
      n -= static_cast<size_t>(w);
      written_ += w;
    }
    if (written_ - started_ >= kStateIoChunkBytes) {
      ::sync_file_range(fd_, started_, written_ - started_, SYNC_FILE_RANGE_WRITE);
      started_ = written_;
    }
    return absl::OkStatus();
  }

 private:
  int fd_;
  const std::string& path_;
  int64_t written_ = 0;
  int64_t started_ = 0;  // the writeback of [0, started_) was started
};

// Reads exactly what is asked for; the end of the file is "truncated".
absl::Status ReadFully(int fd, void* data, size_t n, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return IoError("cannot read", path, errno);
    }
    if (r == 0) return absl::DataLossError(absl::StrCat(path, ": truncated state file"));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string DeviceName(c10::DeviceType d) { return d == c10::DeviceType::CUDA ? "cuda" : "cpu"; }

absl::Status FsyncDir(const std::string& dir) {
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (d.fd < 0) return IoError("cannot open directory", dir, errno);
  if (::fsync(d.fd) != 0) return IoError("cannot fsync directory", dir, errno);
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteStateFile(const std::string& path, const PackedState& state, const std::string& job,
                            int64_t step, const std::string& secret, const StateIoOptions& io) {
  MALLE_ASSIGN_OR_RETURN(std::vector<SegmentSpec> specs, SegmentSpecs(state.skeleton));
  if (specs.size() != state.buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("state file ", path, ": the state's segments do not match"));
  }
  nlohmann::json segments = nlohmann::json::array();
  bool all_cpu = true;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t bytes = specs[i].numel * static_cast<int64_t>(c10::elementSize(specs[i].dtype));
    segments.push_back({c10::getDtypeNames(specs[i].dtype).first, specs[i].numel, DeviceName(specs[i].device), bytes});
    all_cpu = all_cpu && state.buffers[i].is_cpu();
  }
  const nlohmann::json header = {{"job", job},
                                 {"step", step},
                                 {"written_unix_ns", absl::ToUnixNanos(absl::Now())},
                                 {"skeleton_bytes", state.skeleton.size()},
                                 {"segments", segments}};
  const std::string header_text = header.dump();
  // The prefix, the header and the skeleton: one small write.
  std::string head;
  {
    const uint32_t version = kStateFileVersion;
    const uint32_t flags = secret.empty() ? 0 : kFlagSigned;
    const uint64_t header_len = header_text.size();
    head.append(kMagic, sizeof(kMagic));
    head.append(reinterpret_cast<const char*>(&version), sizeof(version));
    head.append(reinterpret_cast<const char*>(&flags), sizeof(flags));
    head.append(reinterpret_cast<const char*>(&header_len), sizeof(header_len));
    head += header_text;
    head += state.skeleton;
  }
  // CPU segments are hashed where they are (on a second thread if asked);
  // device segments chunk by chunk through host copies, on this thread.
  std::vector<at::Tensor> bytes_views;
  for (const at::Tensor& seg : state.buffers) bytes_views.push_back(seg.contiguous().view(at::kByte));

  const std::filesystem::path target(path);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  std::random_device rd;
  const std::string tmp = absl::StrFormat("%s.tmp.%d.%08x", path, ::getpid(), rd());
  absl::Status s = [&]() -> absl::Status {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (f.fd < 0) return IoError("cannot create", tmp, errno);
    Mac mac(secret);
    Writer w(f.fd, tmp);
    {
      Hasher hash(mac, io.hash_thread && all_cpu);
      const bool ahead = io.hash_thread && all_cpu;
      hash.Add(head.data(), head.size());
      if (ahead) {
        // Everything is in memory: the hasher runs through it at its own pace.
        for (const at::Tensor& b : bytes_views) {
          const char* p = static_cast<const char*>(b.data_ptr());
          for (int64_t off = 0; off < b.numel(); off += kStateIoChunkBytes) {
            hash.Add(p + off, static_cast<size_t>(std::min(kStateIoChunkBytes, b.numel() - off)));
          }
        }
      }
      MALLE_RETURN_IF_ERROR(w.Write(head.data(), head.size()));
      for (const at::Tensor& b : bytes_views) {
        for (int64_t off = 0; off < b.numel(); off += kStateIoChunkBytes) {
          const int64_t n = std::min(kStateIoChunkBytes, b.numel() - off);
          at::Tensor host;  // a device chunk's host copy, alive until written and hashed
          const char* p = static_cast<const char*>(b.data_ptr()) + off;
          if (!b.is_cpu()) {
            host = b.narrow(0, off, n).cpu();
            p = static_cast<const char*>(host.data_ptr());
          }
          if (!ahead) hash.Add(p, static_cast<size_t>(n));
          MALLE_RETURN_IF_ERROR(w.Write(p, static_cast<size_t>(n)));
        }
      }
      hash.Finish();
    }
    const std::string trailer = mac.Final();
    MALLE_RETURN_IF_ERROR(w.Write(trailer.data(), trailer.size()));
    if (::fsync(f.fd) != 0) return IoError("cannot fsync", tmp, errno);
    if (::close(f.fd) != 0) {
      f.fd = -1;
      return IoError("cannot close", tmp, errno);
    }
    f.fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0) return IoError("cannot rename onto", path, errno);
    return FsyncDir(dir);
  }();
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

absl::StatusOr<PackedState> ReadStateFile(const std::string& path, const std::string& secret,
                                          StateFileInfo* info, const StateIoOptions& io) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) return IoError("cannot open state file", path, errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return IoError("cannot stat", path, errno);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  auto loss = [&](const std::string& why) { return absl::DataLossError(absl::StrCat(path, ": ", why)); };
  if (size < kPrefixBytes + kMacBytes) {
    char head[sizeof(kMagic)] = {};
    const bool ours = size >= sizeof(kMagic) && ::pread(f.fd, head, sizeof(head), 0) == sizeof(head) &&
                      std::memcmp(head, kMagic, sizeof(kMagic)) == 0;
    return loss(ours ? "truncated state file (too short)" : "not a malletrain state file");
  }
  ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // advice: a larger readahead
  Mac mac(secret);
  char prefix[kPrefixBytes];
  MALLE_RETURN_IF_ERROR(ReadFully(f.fd, prefix, sizeof(prefix), path));
  mac.Update(prefix, sizeof(prefix));
  uint32_t version = 0, flags = 0;
  uint64_t header_len = 0;
  if (std::memcmp(prefix, kMagic, sizeof(kMagic)) != 0) return loss("not a malletrain state file");
  std::memcpy(&version, prefix + 8, sizeof(version));
  std::memcpy(&flags, prefix + 12, sizeof(flags));
  std::memcpy(&header_len, prefix + 16, sizeof(header_len));
  if (version != kStateFileVersion) {
    return loss(absl::StrCat("state file format version ", version, "; this malletrain reads version ",
                             kStateFileVersion));
  }
  const bool is_signed = (flags & kFlagSigned) != 0;
  if (is_signed && secret.empty()) {
    return loss("the file is signed and no deployment secret is configured to verify it");
  }
  if (!is_signed && !secret.empty()) {
    return loss("the file is unsigned, and a deployment secret is configured: refused (forged?)");
  }
  if (header_len == 0 || header_len > kMaxHeaderBytes || header_len > size) {
    return loss(absl::StrCat("corrupt header length ", header_len));
  }
  std::string header_text(header_len, '\0');
  MALLE_RETURN_IF_ERROR(ReadFully(f.fd, header_text.data(), header_len, path));
  mac.Update(header_text.data(), header_len);
  const nlohmann::json header = nlohmann::json::parse(header_text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object() || !header.contains("segments") ||
      !header["segments"].is_array() || !header.value("skeleton_bytes", nlohmann::json()).is_number_unsigned() ||
      !header.value("step", nlohmann::json()).is_number_integer() ||
      !header.value("job", nlohmann::json()).is_string()) {
    return loss("corrupt header");
  }
  const uint64_t skeleton_bytes = header["skeleton_bytes"].get<uint64_t>();
  struct Seg {
    at::ScalarType dtype;
    int64_t numel;
    c10::DeviceType device;
    uint64_t bytes;
  };
  std::vector<Seg> segs;
  uint64_t total = kPrefixBytes + header_len + skeleton_bytes + kMacBytes;
  const auto& names = c10::getStringToDtypeMap();
  for (const nlohmann::json& item : header["segments"]) {
    if (!item.is_array() || item.size() != 4 || !item[0].is_string() || !item[1].is_number_integer() ||
        !item[2].is_string() || !item[3].is_number_unsigned()) {
      return loss(absl::StrCat("corrupt segment entry ", item.dump()));
    }
    auto dtype = names.find(item[0].get<std::string>());
    const std::string device = item[2].get<std::string>();
    if (dtype == names.end() || (device != "cpu" && device != "cuda") || item[1].get<int64_t>() < 0 ||
        item[3].get<uint64_t>() !=
            static_cast<uint64_t>(item[1].get<int64_t>()) * c10::elementSize(dtype->second)) {
      return loss(absl::StrCat("corrupt segment entry ", item.dump()));
    }
    segs.push_back({dtype->second, item[1].get<int64_t>(),
                    device == "cuda" ? c10::DeviceType::CUDA : c10::DeviceType::CPU, item[3].get<uint64_t>()});
    total += segs.back().bytes;
    if (total > size) break;
  }
  if (total > size) return loss(absl::StrCat("truncated state file (", size, " bytes, the header says ", total, ")"));
  if (total < size) return loss(absl::StrCat("corrupt: ", size - total, " bytes after the state"));
  PackedState out;
  out.skeleton.resize(skeleton_bytes);
  MALLE_RETURN_IF_ERROR(ReadFully(f.fd, out.skeleton.data(), skeleton_bytes, path));
  mac.Update(out.skeleton.data(), skeleton_bytes);
  // Where each segment lands: in place (the reader's own flat buffer of the
  // same layout) or fresh memory. The skeleton is not verified yet: a target
  // is used only where its dtype and length are the header's, so at worst a
  // refused file's bytes were read into it (io.own's contract).
  std::vector<at::Tensor> targets;
  if (io.own != nullptr) {
    absl::StatusOr<std::vector<at::Tensor>> t = InPlaceTargets(*io.own, out.skeleton);
    if (t.ok() && t->size() == segs.size()) targets = *std::move(t);
  }
  for (size_t i = 0; i < segs.size(); ++i) {
    const at::Tensor* t = i < targets.size() ? &targets[i] : nullptr;
    const bool in_place = t != nullptr && t->defined() && t->is_cpu() && t->is_contiguous() &&
                          segs[i].device == c10::DeviceType::CPU && t->scalar_type() == segs[i].dtype &&
                          t->numel() == segs[i].numel;
    out.buffers.push_back(in_place ? *t : at::empty({segs[i].numel}, at::TensorOptions().dtype(segs[i].dtype)));
    out.direct.push_back(in_place);
  }
  {
    // Read a chunk, hand it to the hasher, read the next: hashing (a second
    // thread) overlaps the reads.
    Hasher hash(mac, io.hash_thread);
    for (size_t i = 0; i < segs.size(); ++i) {
      char* p = static_cast<char*>(out.buffers[i].data_ptr());
      for (uint64_t off = 0; off < segs[i].bytes; off += static_cast<uint64_t>(kStateIoChunkBytes)) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(kStateIoChunkBytes, segs[i].bytes - off));
        MALLE_RETURN_IF_ERROR(ReadFully(f.fd, p + off, n, path));
        hash.Add(p + off, n);
      }
    }
    hash.Finish();
  }
  std::string trailer(kMacBytes, '\0');
  MALLE_RETURN_IF_ERROR(ReadFully(f.fd, trailer.data(), kMacBytes, path));
  const std::string expected = mac.Final();
  if (expected.size() != kMacBytes || CRYPTO_memcmp(expected.data(), trailer.data(), kMacBytes) != 0) {
    return loss(is_signed ? "checksum mismatch: the file is corrupt or was not written with this deployment's "
                            "secret (forged?)"
                          : "checksum mismatch: the file is corrupt");
  }
  // Verified. The skeleton must describe exactly these segments.
  MALLE_ASSIGN_OR_RETURN(std::vector<SegmentSpec> specs, SegmentSpecs(out.skeleton));
  if (specs.size() != segs.size()) return loss("the skeleton and the header disagree on the segments");
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].dtype != segs[i].dtype || specs[i].numel != segs[i].numel || specs[i].device != segs[i].device) {
      return loss(absl::StrCat("the skeleton and the header disagree on segment ", i));
    }
    if (segs[i].device == c10::DeviceType::CUDA) out.buffers[i] = out.buffers[i].to(c10::Device(c10::DeviceType::CUDA));
  }
  if (info != nullptr) {
    info->job = header["job"].get<std::string>();
    info->step = header["step"].get<int64_t>();
    info->written = absl::FromUnixNanos(header.value("written_unix_ns", int64_t{0}));
    info->bytes = static_cast<int64_t>(size);
    info->signed_ = is_signed;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<DirParkStore>> DirParkStore::Open(DirParkStoreOptions options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("park store: no directory given");
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("park store: cannot create ", options.dir, ": ", ec.message()));
  }
  if (::access(options.dir.c_str(), W_OK | X_OK) != 0) return IoError("park store: cannot write", options.dir, errno);
  return std::unique_ptr<DirParkStore>(new DirParkStore(std::move(options)));
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> DirParkStore::Files() const {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(options_.dir, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    // state-<step>-<unix ns>-<pid>.mstate
    if (name.rfind("state-", 0) != 0 || name.size() <= sizeof(kSuffix) ||
        name.compare(name.size() - (sizeof(kSuffix) - 1), sizeof(kSuffix) - 1, kSuffix) != 0) {
      continue;
    }
    try {
      step = std::stoll(name.substr(6, name.find('-', 6) - 6));
    } catch (const std::exception&) {
      continue;
    }
    out.emplace_back(step, entry.path().string());
  }
  if (ec) return absl::InternalError(absl::StrCat("park store: cannot list ", options_.dir, ": ", ec.message()));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  return out;
}

absl::Status DirParkStore::Write(const PackedState& state, int64_t step, const StateIoOptions& io) {
  std::random_device rd;
  const std::string path =
      absl::StrFormat("%s/state-%012d-%020d-%d-%04x%s", options_.dir, step, absl::ToUnixNanos(absl::Now()),
                      ::getpid(), rd() & 0xffff, kSuffix);
  MALLE_RETURN_IF_ERROR(WriteStateFile(path, state, options_.job, step, options_.secret, io));
  // Durable: keep it and the one before it (the fallback), remove the rest.
  MALLE_ASSIGN_OR_RETURN(auto files, Files());
  for (size_t i = 2; i < files.size(); ++i) ::unlink(files[i].second.c_str());
  return absl::OkStatus();
}

absl::StatusOr<std::optional<ParkedState>> DirParkStore::ReadNewest(std::vector<std::string>* refused,
                                                                    const StateIoOptions& io) {
  MALLE_ASSIGN_OR_RETURN(auto files, Files());
  for (const auto& [step, path] : files) {
    ParkedState p;
    absl::StatusOr<PackedState> s = ReadStateFile(path, options_.secret, &p.info, io);
    if (!s.ok()) {
      if (refused != nullptr) refused->push_back(std::string(s.status().message()));
      continue;
    }
    p.state = *std::move(s);
    p.path = path;
    return std::optional<ParkedState>(std::move(p));
  }
  return std::optional<ParkedState>();
}

absl::StatusOr<std::vector<StateFileInfo>> DirParkStore::List() {
  MALLE_ASSIGN_OR_RETURN(auto files, Files());
  std::vector<StateFileInfo> out;
  for (const auto& [step, path] : files) {
    StateFileInfo info;
    info.step = step;
    info.job = options_.job;
    std::error_code ec;
    info.bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace malle::elastic
