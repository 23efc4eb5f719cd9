// The one translation unit that includes OpenSSL for state files (HMAC-SHA256,
// SHA-256) and does their POSIX I/O.
#include "libmalle/elastic/park_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include <ATen/ops/empty.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libmalle/base/status_macros.h"

namespace malle::elastic {
namespace {

constexpr char kMagic[8] = {'M', 'A', 'L', 'L', 'E', 'P', 'R', 'K'};
constexpr size_t kPrefixBytes = 8 + 4 + 4 + 8;
constexpr size_t kMacBytes = 32;
constexpr uint32_t kFlagSigned = 1;
constexpr uint64_t kMaxHeaderBytes = 1 << 20;
constexpr int64_t kChunkBytes = int64_t{64} << 20;  // device segments go through the host in chunks
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

// A file descriptor that writes everything and feeds the MAC.
class Writer {
 public:
  Writer(int fd, Mac& mac, const std::string& path) : fd_(fd), mac_(mac), path_(path) {}
  absl::Status Write(const void* data, size_t n, bool mac = true) {
    if (mac) mac_.Update(data, n);
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return IoError("cannot write", path_, errno);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return absl::OkStatus();
  }

 private:
  int fd_;
  Mac& mac_;
  const std::string& path_;
};

class Reader {
 public:
  Reader(int fd, Mac& mac, const std::string& path) : fd_(fd), mac_(mac), path_(path) {}
  absl::Status Read(void* data, size_t n, bool mac = true) {
    char* p = static_cast<char*>(data);
    size_t left = n;
    while (left > 0) {
      const ssize_t r = ::read(fd_, p, left);
      if (r < 0) {
        if (errno == EINTR) continue;
        return IoError("cannot read", path_, errno);
      }
      if (r == 0) return absl::DataLossError(absl::StrCat(path_, ": truncated state file"));
      p += r;
      left -= static_cast<size_t>(r);
    }
    if (mac) mac_.Update(data, n);
    return absl::OkStatus();
  }

 private:
  int fd_;
  Mac& mac_;
  const std::string& path_;
};

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
                            int64_t step, const std::string& secret) {
  MALLE_ASSIGN_OR_RETURN(std::vector<SegmentSpec> specs, SegmentSpecs(state.skeleton));
  if (specs.size() != state.buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("state file ", path, ": the state's segments do not match"));
  }
  nlohmann::json segments = nlohmann::json::array();
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t bytes = specs[i].numel * static_cast<int64_t>(c10::elementSize(specs[i].dtype));
    segments.push_back({c10::getDtypeNames(specs[i].dtype).first, specs[i].numel, DeviceName(specs[i].device), bytes});
  }
  const nlohmann::json header = {{"job", job},
                                 {"step", step},
                                 {"written_unix_ns", absl::ToUnixNanos(absl::Now())},
                                 {"skeleton_bytes", state.skeleton.size()},
                                 {"segments", segments}};
  const std::string header_text = header.dump();

  const std::filesystem::path target(path);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  std::random_device rd;
  const std::string tmp = absl::StrFormat("%s.tmp.%d.%08x", path, ::getpid(), rd());
  absl::Status s = [&]() -> absl::Status {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (f.fd < 0) return IoError("cannot create", tmp, errno);
    Mac mac(secret);
    Writer w(f.fd, mac, tmp);
    const uint32_t version = kStateFileVersion;
    const uint32_t flags = secret.empty() ? 0 : kFlagSigned;
    const uint64_t header_len = header_text.size();
    MALLE_RETURN_IF_ERROR(w.Write(kMagic, sizeof(kMagic)));
    MALLE_RETURN_IF_ERROR(w.Write(&version, sizeof(version)));
    MALLE_RETURN_IF_ERROR(w.Write(&flags, sizeof(flags)));
    MALLE_RETURN_IF_ERROR(w.Write(&header_len, sizeof(header_len)));
    MALLE_RETURN_IF_ERROR(w.Write(header_text.data(), header_text.size()));
    MALLE_RETURN_IF_ERROR(w.Write(state.skeleton.data(), state.skeleton.size()));
    for (const at::Tensor& seg : state.buffers) {
      at::Tensor bytes = seg.contiguous().view(at::kByte);
      if (bytes.is_cpu()) {
        MALLE_RETURN_IF_ERROR(w.Write(bytes.data_ptr(), static_cast<size_t>(bytes.numel())));
        continue;
      }
      for (int64_t off = 0; off < bytes.numel(); off += kChunkBytes) {
        at::Tensor host = bytes.narrow(0, off, std::min(kChunkBytes, bytes.numel() - off)).cpu();
        MALLE_RETURN_IF_ERROR(w.Write(host.data_ptr(), static_cast<size_t>(host.numel())));
      }
    }
    const std::string trailer = mac.Final();
    MALLE_RETURN_IF_ERROR(w.Write(trailer.data(), trailer.size(), /*mac=*/false));
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
                                          StateFileInfo* info) {
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
  Mac mac(secret);
  Reader r(f.fd, mac, path);
  char magic[8];
  uint32_t version = 0, flags = 0;
  uint64_t header_len = 0;
  MALLE_RETURN_IF_ERROR(r.Read(magic, sizeof(magic)));
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) return loss("not a malletrain state file");
  MALLE_RETURN_IF_ERROR(r.Read(&version, sizeof(version)));
  MALLE_RETURN_IF_ERROR(r.Read(&flags, sizeof(flags)));
  MALLE_RETURN_IF_ERROR(r.Read(&header_len, sizeof(header_len)));
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
  MALLE_RETURN_IF_ERROR(r.Read(header_text.data(), header_len));
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
  MALLE_RETURN_IF_ERROR(r.Read(out.skeleton.data(), skeleton_bytes));
  for (const Seg& s : segs) {
    at::Tensor t = at::empty({s.numel}, at::TensorOptions().dtype(s.dtype));
    MALLE_RETURN_IF_ERROR(r.Read(t.data_ptr(), s.bytes));
    out.buffers.push_back(std::move(t));
    out.direct.push_back(false);
  }
  std::string trailer(kMacBytes, '\0');
  MALLE_RETURN_IF_ERROR(r.Read(trailer.data(), kMacBytes, /*mac=*/false));
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

absl::Status DirParkStore::Write(const PackedState& state, int64_t step) {
  std::random_device rd;
  const std::string path =
      absl::StrFormat("%s/state-%012d-%020d-%d-%04x%s", options_.dir, step, absl::ToUnixNanos(absl::Now()),
                      ::getpid(), rd() & 0xffff, kSuffix);
  MALLE_RETURN_IF_ERROR(WriteStateFile(path, state, options_.job, step, options_.secret));
  // Durable: keep it and the one before it (the fallback), remove the rest.
  MALLE_ASSIGN_OR_RETURN(auto files, Files());
  for (size_t i = 2; i < files.size(); ++i) ::unlink(files[i].second.c_str());
  return absl::OkStatus();
}

absl::StatusOr<std::optional<ParkedState>> DirParkStore::ReadNewest(std::vector<std::string>* refused) {
  MALLE_ASSIGN_OR_RETURN(auto files, Files());
  for (const auto& [step, path] : files) {
    ParkedState p;
    absl::StatusOr<PackedState> s = ReadStateFile(path, options_.secret, &p.info);
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
