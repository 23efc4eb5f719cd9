// The one translation unit that includes OpenSSL for state files (HMAC-SHA256,
// SHA-256) and does their POSIX I/O.
#include "libmalle/elastic/park_store.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>
#include <utility>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
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
// What version 2's trailer MACs before the chunk digests (a domain separator:
// no other MAC of this deployment covers the same bytes).
constexpr char kV2Domain[] = "MALLEPRK v2 chunks";
// A hash chunk a reader accepts: a power of two in [64 KiB, 64 MiB] (the
// bounce buffers hold whole chunks).
constexpr int64_t kMinHashChunkBytes = int64_t{64} << 10;
constexpr int64_t kMaxHashChunkBytes = int64_t{64} << 20;
// O_DIRECT wants the memory, the file offset and the length aligned to the
// device's logical block (512 B or 4 KiB): 4 KiB covers both.
constexpr int64_t kDirectAlign = 4096;
// Bounce buffers in flight (one being written or read, the others filled or
// drained by the workers), and how many a process keeps for the next call.
constexpr int kRing = 3;
constexpr size_t kPoolKeep = 4;
// A worker copies and hashes a chunk in slices this size: the hash then reads
// what the copy just left in the core's cache.
constexpr int64_t kSliceBytes = int64_t{256} << 10;

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

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

int CpusOfThisProcess() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// Page-aligned bounce buffers. A process keeps a few for its next call: on the
// 2-core VM, faulting in fresh memory cost about as much as the copy into it,
// and snapshots write again and again.
class BouncePool {
 public:
  struct Release {
    size_t bytes = 0;
    void operator()(char* p) const { BouncePool::Put(p, bytes); }
  };
  using Buffer = std::unique_ptr<char, Release>;

  static absl::StatusOr<Buffer> Get(size_t bytes) {
    if (bytes == static_cast<size_t>(kStateIoChunkBytes)) {
      Pool& pool = ThePool();
      absl::MutexLock lock(&pool.mu);
      if (!pool.free.empty()) {
        char* p = pool.free.back();
        pool.free.pop_back();
        return Buffer(p, Release{bytes});
      }
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat("state file I/O: cannot map ", bytes, " bytes of memory: ",
                                                       std::strerror(errno)));
    }
    return Buffer(static_cast<char*>(p), Release{bytes});
  }

 private:
  struct Pool {
    absl::Mutex mu;
    std::vector<char*> free ABSL_GUARDED_BY(mu);
  };
  static Pool& ThePool() {
    static Pool* pool = new Pool;  // never destroyed: threads may return buffers at exit
    return *pool;
  }
  static void Put(char* p, size_t bytes) {
    if (p == nullptr) return;
    if (bytes == static_cast<size_t>(kStateIoChunkBytes)) {
      Pool& pool = ThePool();
      absl::MutexLock lock(&pool.mu);
      if (pool.free.size() < kPoolKeep) {
        pool.free.push_back(p);
        return;
      }
    }
    ::munmap(p, bytes);
  }
};

// Whether the page cache holds most of the file (a warm read: ordinary reads
// copy from memory, O_DIRECT would go to the disk).
bool MostlyCached(int fd, uint64_t size) {
  if (size == 0) return true;
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return false;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((size + page - 1) / page);
  size_t in = 0;
  if (::mincore(m, size, resident.data()) == 0) {
    for (unsigned char r : resident) in += r & 1;
  }
  ::munmap(m, size);
  return in * 2 >= resident.size();
}

// A stretch of the file and where its bytes are in memory: the source of a
// write, the destination of a read. A device piece is a CUDA segment's bytes
// (written only; a read lands CUDA segments on the host first).
struct Piece {
  int64_t at = 0;  // file offset
  int64_t n = 0;
  char* mem = nullptr;
  const at::Tensor* device = nullptr;  // bytes view, when the piece is on a device
  int64_t device_offset = 0;
};

using Digest = std::array<unsigned char, 32>;

// Moves the file's bytes [0, total) through a ring of bounce buffers of
// `io_bytes` each (a multiple of `chunk`): workers (the caller and
// `helpers` threads) copy chunk after chunk between the pieces and a bounce
// buffer and hash its bytes below `body` (one SHA-256 per chunk); one I/O
// thread writes the filled buffers in order, or reads the next buffers ahead
// of the workers. A write's trailer (bytes [body, total)) is made by
// `make_trailer` from the digests once every chunk before it is hashed.
class ChunkPipeline {
 public:
  struct Options {
    bool write = true;
    int fd = -1;
    bool direct = false;  // the fd has O_DIRECT (cleared on EINVAL)
    std::string path;     // for messages
    int64_t total = 0;
    int64_t body = 0;
    int64_t chunk = kStateHashChunkBytes;
    int64_t io_bytes = kStateIoChunkBytes;
    int helpers = 0;
    std::function<std::string(const std::vector<Digest>&)> make_trailer;  // write only
  };

  ChunkPipeline(Options o, std::vector<Piece> pieces) : o_(std::move(o)), pieces_(std::move(pieces)) {
    tasks_ = (o_.total + o_.chunk - 1) / o_.chunk;
    buffers_ = (o_.total + o_.io_bytes - 1) / o_.io_bytes;
    digests_.resize(static_cast<size_t>((o_.body + o_.chunk - 1) / o_.chunk));
    remaining_.assign(static_cast<size_t>(buffers_), 0);
    filled_.assign(static_cast<size_t>(buffers_), false);
    for (int64_t j = 0; j < tasks_; ++j) ++remaining_[static_cast<size_t>(j * o_.chunk / o_.io_bytes)];
  }

  const std::vector<Digest>& digests() const { return digests_; }
  bool direct() const { return o_.direct; }

  absl::Status Run() {
    const int ring = static_cast<int>(std::min<int64_t>(kRing, buffers_));
    for (int i = 0; i < ring; ++i) {
      MALLE_ASSIGN_OR_RETURN(BouncePool::Buffer b, BouncePool::Get(static_cast<size_t>(o_.io_bytes)));
      ring_.push_back(std::move(b));
    }
    std::thread io([this] { IoLoop(); });
    std::vector<std::thread> helpers;
    const int n_helpers = static_cast<int>(std::min<int64_t>(o_.helpers, tasks_ - 1));
    for (int i = 0; i < n_helpers; ++i) helpers.emplace_back([this] { WorkLoop(); });
    WorkLoop();
    for (std::thread& t : helpers) t.join();
    io.join();
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  char* Slot(int64_t k) { return ring_[static_cast<size_t>(k % static_cast<int64_t>(ring_.size()))].get(); }
  int64_t BufferBytes(int64_t k) const { return std::min(o_.io_bytes, o_.total - k * o_.io_bytes); }

  void Fail(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (error_.ok()) error_ = std::move(s);
  }

  // Copies the file range [a, b) between the pieces and `buf` (which holds
  // file offset a at buf[0]).
  absl::Status Copy(int64_t a, int64_t b, char* buf) {
    auto it = std::upper_bound(pieces_.begin(), pieces_.end(), a,
                               [](int64_t x, const Piece& p) { return x < p.at + p.n; });
    for (; it != pieces_.end() && it->at < b; ++it) {
      const int64_t from = std::max(a, it->at);
      const int64_t to = std::min(b, it->at + it->n);
      if (from >= to) continue;
      char* here = buf + (from - a);
      const int64_t off = from - it->at;
      if (it->device != nullptr) {
        try {
          at::from_blob(here, {to - from}, at::TensorOptions().dtype(at::kByte))
              .copy_(it->device->narrow(0, it->device_offset + off, to - from));
        } catch (const c10::Error& e) {
          return absl::InternalError(absl::StrCat("state file ", o_.path, ": copy from the device failed: ",
                                                  e.what_without_backtrace()));
        }
      } else if (o_.write) {
        std::memcpy(here, it->mem + off, static_cast<size_t>(to - from));
      } else {
        std::memcpy(it->mem + off, here, static_cast<size_t>(to - from));
      }
    }
    return absl::OkStatus();
  }

  // Task j: the file range [j * chunk, (j + 1) * chunk), within buffer k.
  absl::Status Task(int64_t j, EVP_MD_CTX* md) {
    const int64_t a = j * o_.chunk;
    const int64_t b = std::min(a + o_.chunk, o_.total);
    const int64_t k = a / o_.io_bytes;
    char* buf = Slot(k) + (a - k * o_.io_bytes);
    const bool hashed = a < o_.body;
    if (hashed) EVP_DigestInit_ex(md, EVP_sha256(), nullptr);
    for (int64_t s = a; s < b; s += kSliceBytes) {
      const int64_t e = std::min(s + kSliceBytes, b);
      if (o_.write) {
        // The trailer's bytes (>= body) are the I/O thread's.
        if (s < o_.body) MALLE_RETURN_IF_ERROR(Copy(s, std::min(e, o_.body), buf + (s - a)));
      } else {
        MALLE_RETURN_IF_ERROR(Copy(s, e, buf + (s - a)));
      }
      if (s < o_.body) EVP_DigestUpdate(md, buf + (s - a), static_cast<size_t>(std::min(e, o_.body) - s));
    }
    if (hashed) {
      unsigned int n = 0;
      EVP_DigestFinal_ex(md, digests_[static_cast<size_t>(j)].data(), &n);
    }
    return absl::OkStatus();
  }

  void WorkLoop() {
    EVP_MD_CTX* md = EVP_MD_CTX_new();
    for (;;) {
      int64_t j = 0;
      {
        absl::MutexLock lock(&mu_);
        // Write: the task's slot must have been written out; read: its buffer read in.
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (!error_.ok() || next_task_ >= tasks_) return true;
          const int64_t k = next_task_ * o_.chunk / o_.io_bytes;
          return o_.write ? k < written_ + static_cast<int64_t>(ring_.size()) : filled_[static_cast<size_t>(k)];
        };
        mu_.Await(absl::Condition(&ready));
        if (!error_.ok() || next_task_ >= tasks_) break;
        j = next_task_++;
      }
      absl::Status s = Task(j, md);
      absl::MutexLock lock(&mu_);
      if (!s.ok()) Fail(std::move(s));
      --remaining_[static_cast<size_t>(j * o_.chunk / o_.io_bytes)];
    }
    EVP_MD_CTX_free(md);
  }

  // pwrite/pread of the whole range, retrying short transfers; an O_DIRECT
  // transfer the filesystem refuses (EINVAL) is retried through the page cache.
  absl::Status Transfer(char* buf, int64_t n, int64_t at) {
    int64_t done = 0;
    while (done < n) {
      const int64_t want = o_.direct ? RoundUp(n, kDirectAlign) - done : n - done;
      const ssize_t r = o_.write ? ::pwrite(o_.fd, buf + done, static_cast<size_t>(want), at + done)
                                 : ::pread(o_.fd, buf + done, static_cast<size_t>(want), at + done);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && o_.direct) {
          MALLE_RETURN_IF_ERROR(DropDirect());
          continue;
        }
        return IoError(o_.write ? "cannot write" : "cannot read", o_.path, errno);
      }
      if (r == 0) {
        return o_.write ? IoError("cannot write", o_.path, EIO)
                        : absl::DataLossError(absl::StrCat(o_.path, ": truncated state file (it shrank while read)"));
      }
      done += r;
      // O_DIRECT continues at aligned offsets only.
      if (o_.direct && done < n && done % kDirectAlign != 0) MALLE_RETURN_IF_ERROR(DropDirect());
    }
    return absl::OkStatus();
  }

  absl::Status DropDirect() {
    const int flags = ::fcntl(o_.fd, F_GETFL);
    if (flags < 0 || ::fcntl(o_.fd, F_SETFL, flags & ~O_DIRECT) != 0) {
      return IoError("cannot turn O_DIRECT off for", o_.path, errno);
    }
    o_.direct = false;
    return absl::OkStatus();
  }

  void IoLoop() {
    std::string trailer;
    for (int64_t k = 0; k < buffers_; ++k) {
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this, k]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (!error_.ok()) return true;
          if (o_.write) return remaining_[static_cast<size_t>(k)] == 0;
          // A read reuses the slot of buffer k - ring once its workers are done.
          const int64_t prev = k - static_cast<int64_t>(ring_.size());
          return prev < 0 || remaining_[static_cast<size_t>(prev)] == 0;
        };
        mu_.Await(absl::Condition(&ready));
        if (!error_.ok()) return;
      }
      const int64_t at = k * o_.io_bytes;
      const int64_t n = BufferBytes(k);
      char* buf = Slot(k);
      if (o_.write && at + n > o_.body) {
        // Every chunk before this buffer was hashed (its buffer was written)
        // and this buffer's chunks are done: the trailer can be made.
        if (trailer.empty()) trailer = o_.make_trailer(digests_);
        const int64_t from = std::max(at, o_.body);
        std::memcpy(buf + (from - at), trailer.data() + (from - o_.body), static_cast<size_t>(at + n - from));
      }
      if (o_.write && o_.direct && n % kDirectAlign != 0) {
        std::memset(buf + n, 0, static_cast<size_t>(RoundUp(n, kDirectAlign) - n));  // cut off by ftruncate
      }
      absl::Status s = Transfer(buf, n, at);
      if (s.ok() && o_.write && !o_.direct) {
        // Start the writeback now (advice): the final fsync then waits for little.
        ::sync_file_range(o_.fd, at, n, SYNC_FILE_RANGE_WRITE);
      }
      absl::MutexLock lock(&mu_);
      if (!s.ok()) {
        Fail(std::move(s));
        return;
      }
      if (o_.write) {
        ++written_;
      } else {
        filled_[static_cast<size_t>(k)] = true;
      }
    }
  }

  Options o_;
  std::vector<Piece> pieces_;  // sorted by file offset, not overlapping
  int64_t tasks_ = 0;
  int64_t buffers_ = 0;
  std::vector<BouncePool::Buffer> ring_;
  std::vector<Digest> digests_;  // each written by one task

  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int64_t next_task_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;              // write: buffers written, in order
  std::vector<int64_t> remaining_ ABSL_GUARDED_BY(mu_);  // per buffer: tasks not done
  std::vector<bool> filled_ ABSL_GUARDED_BY(mu_);        // read: buffers read in
};

// Version 2's trailer: the MAC of the domain, the body's length, the chunk
// size and the chunks' digests in order.
std::string ChunkMac(const std::string& secret, int64_t body, int64_t chunk, const std::vector<Digest>& digests) {
  Mac mac(secret);
  mac.Update(kV2Domain, sizeof(kV2Domain) - 1);
  const uint64_t b = static_cast<uint64_t>(body), c = static_cast<uint64_t>(chunk);
  mac.Update(&b, sizeof(b));
  mac.Update(&c, sizeof(c));
  for (const Digest& d : digests) mac.Update(d.data(), d.size());
  return mac.Final();
}

int Helpers(const StateIoOptions& io) {
  if (io.helper_threads >= 0) return io.helper_threads;
  return std::min(3, CpusOfThisProcess() - 1);
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
                                 {"hash_chunk_bytes", kStateHashChunkBytes},
                                 {"segments", segments}};
  const std::string header_text = header.dump();
  // The prefix, the header and the skeleton.
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
  std::vector<at::Tensor> bytes_views;
  for (const at::Tensor& seg : state.buffers) bytes_views.push_back(seg.contiguous().view(at::kByte));
  std::vector<Piece> pieces;
  int64_t body = 0;
  pieces.push_back({0, static_cast<int64_t>(head.size()), head.data()});
  body += static_cast<int64_t>(head.size());
  for (const at::Tensor& b : bytes_views) {
    if (b.numel() == 0) continue;
    Piece p{body, b.numel()};
    if (b.is_cpu()) {
      p.mem = static_cast<char*>(b.data_ptr());
    } else {
      p.device = &b;
    }
    pieces.push_back(p);
    body += b.numel();
  }

  const std::filesystem::path target(path);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  std::random_device rd;
  const std::string tmp = absl::StrFormat("%s.tmp.%d.%08x", path, ::getpid(), rd());
  absl::Status s = [&]() -> absl::Status {
    Fd f;
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    bool direct = io.direct_io;
    f.fd = ::open(tmp.c_str(), flags | (direct ? O_DIRECT : 0), 0600);
    if (f.fd < 0 && direct && errno == EINVAL) {
      // A filesystem without O_DIRECT (it may have created the file first).
      ::unlink(tmp.c_str());
      direct = false;
      f.fd = ::open(tmp.c_str(), flags, 0600);
    }
    if (f.fd < 0) return IoError("cannot create", tmp, errno);
    ChunkPipeline::Options o;
    o.write = true;
    o.fd = f.fd;
    o.direct = direct;
    o.path = tmp;
    o.body = body;
    o.total = body + static_cast<int64_t>(kMacBytes);
    o.helpers = all_cpu ? Helpers(io) : 0;  // device chunks: copied on this thread
    o.make_trailer = [&](const std::vector<Digest>& d) { return ChunkMac(secret, body, o.chunk, d); };
    ChunkPipeline pipe(o, std::move(pieces));
    MALLE_RETURN_IF_ERROR(pipe.Run());
    // O_DIRECT wrote whole blocks: cut the last one's padding off.
    if (direct && ::ftruncate(f.fd, o.total) != 0) return IoError("cannot truncate", tmp, errno);
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
  char prefix[kPrefixBytes];
  MALLE_RETURN_IF_ERROR(ReadFully(f.fd, prefix, sizeof(prefix), path));
  uint32_t version = 0, flags = 0;
  uint64_t header_len = 0;
  if (std::memcmp(prefix, kMagic, sizeof(kMagic)) != 0) return loss("not a malletrain state file");
  std::memcpy(&version, prefix + 8, sizeof(version));
  std::memcpy(&flags, prefix + 12, sizeof(flags));
  std::memcpy(&header_len, prefix + 16, sizeof(header_len));
  if (version != 1 && version != 2) {
    return loss(absl::StrCat("state file format version ", version, "; this malletrain reads versions 1 and ",
                             kStateFileVersion, " (a newer malletrain wrote it?)"));
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
  const nlohmann::json header = nlohmann::json::parse(header_text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object() || !header.contains("segments") ||
      !header["segments"].is_array() || !header.value("skeleton_bytes", nlohmann::json()).is_number_unsigned() ||
      !header.value("step", nlohmann::json()).is_number_integer() ||
      !header.value("job", nlohmann::json()).is_string()) {
    return loss("corrupt header");
  }
  int64_t chunk = 0;
  if (version >= 2) {
    const nlohmann::json c = header.value("hash_chunk_bytes", nlohmann::json());
    chunk = c.is_number_unsigned() ? c.get<int64_t>() : 0;
    if (chunk < kMinHashChunkBytes || chunk > kMaxHashChunkBytes || (chunk & (chunk - 1)) != 0) {
      return loss(absl::StrCat("corrupt header: hash_chunk_bytes is ", c.dump(), ", not a power of two in [",
                               kMinHashChunkBytes, ", ", kMaxHashChunkBytes, "]"));
    }
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
  const uint64_t head_bytes = kPrefixBytes + header_len + skeleton_bytes;
  std::string trailer(kMacBytes, '\0');
  bool verified = false;
  if (version == 1) {
    // One hash over the whole body, in order: read a chunk, hand it to the
    // hasher (a second thread if allowed), read the next.
    ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // advice: a larger readahead
    Mac mac(secret);
    mac.Update(prefix, sizeof(prefix));
    mac.Update(header_text.data(), header_len);
    mac.Update(out.skeleton.data(), skeleton_bytes);
    {
      Hasher hash(mac, Helpers(io) > 0);
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
    MALLE_RETURN_IF_ERROR(ReadFully(f.fd, trailer.data(), kMacBytes, path));
    const std::string expected = mac.Final();
    verified = expected.size() == kMacBytes && CRYPTO_memcmp(expected.data(), trailer.data(), kMacBytes) == 0;
  } else {
    // The whole file again through the chunk pipeline (the head is hashed
    // with its chunk and must be what was parsed above).
    Fd direct_fd;
    int fd = f.fd;
    bool direct = false;
    if (io.direct_io && !MostlyCached(f.fd, size)) {
      direct_fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (direct_fd.fd >= 0) {
        fd = direct_fd.fd;
        direct = true;
      }
    }
    if (!direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    std::string head_read(head_bytes, '\0');
    std::vector<Piece> pieces;
    pieces.push_back({0, static_cast<int64_t>(head_bytes), head_read.data()});
    int64_t at = static_cast<int64_t>(head_bytes);
    for (size_t i = 0; i < segs.size(); ++i) {
      if (segs[i].bytes == 0) continue;
      pieces.push_back({at, static_cast<int64_t>(segs[i].bytes), static_cast<char*>(out.buffers[i].data_ptr())});
      at += static_cast<int64_t>(segs[i].bytes);
    }
    pieces.push_back({at, static_cast<int64_t>(kMacBytes), trailer.data()});
    ChunkPipeline::Options o;
    o.write = false;
    o.fd = fd;
    o.direct = direct;
    o.path = path;
    o.total = static_cast<int64_t>(size);
    o.body = at;
    o.chunk = chunk;
    o.io_bytes = std::max(kStateIoChunkBytes, chunk);
    o.helpers = Helpers(io);
    ChunkPipeline pipe(o, std::move(pieces));
    MALLE_RETURN_IF_ERROR(pipe.Run());
    std::string parsed(prefix, sizeof(prefix));
    parsed += header_text;
    parsed += out.skeleton;
    if (parsed != head_read) return loss("the file changed while it was read");
    const std::string expected = ChunkMac(secret, at, chunk, pipe.digests());
    verified = expected.size() == kMacBytes && CRYPTO_memcmp(expected.data(), trailer.data(), kMacBytes) == 0;
  }
  if (!verified) {
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
