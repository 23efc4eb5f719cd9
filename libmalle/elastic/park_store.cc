// The one translation unit that includes OpenSSL for state files (HMAC-SHA256,
// SHA-256, AES-256-GMAC, random nonces) and does their POSIX I/O.
#include "libmalle/elastic/park_store.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
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
// What version 2's and 3's trailers MAC before the chunk tags (domain
// separators: no other MAC of this deployment covers the same bytes), and
// what version 3's chunk key is derived from, with the file's nonce.
constexpr char kV2Domain[] = "MALLEPRK v2 chunks";
constexpr char kV3Domain[] = "MALLEPRK v3 chunks";
constexpr char kV3KeyDomain[] = "MALLEPRK v3 chunk key";
// Version 3's chunk MAC, as the header names it, and its sizes.
constexpr char kV3ChunkMac[] = "AES-256-GMAC";
constexpr size_t kChunkNonceBytes = 16;
constexpr size_t kGmacKeyBytes = 32;
constexpr size_t kGmacIvBytes = 12;
constexpr size_t kGmacTagBytes = 16;
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

// CPU time of the calling thread, in ns.
int64_t ThreadCpuNs() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

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
  // The file range [in_from, in_to) of the piece moves straight between its
  // memory and the disk (set by ChunkPipeline); the rest through a bounce buffer.
  int64_t in_from = 0;
  int64_t in_to = 0;
};

// A chunk's tag (version 2: its SHA-256; version 3: its GMAC in the first 16 bytes).
using Digest = std::array<unsigned char, 32>;

// Version 3's chunk key: derived per file from the deployment secret and the
// file's random nonce (ChunkKeyOf), so that no two files share a key and a
// chunk's index is a unique GMAC IV under it.
struct ChunkKey {
  std::array<unsigned char, kGmacKeyBytes> key{};
};

// OpenSSL's GMAC, fetched once (never freed: workers of any call use it).
absl::StatusOr<EVP_MAC*> Gmac() {
  static EVP_MAC* gmac = EVP_MAC_fetch(nullptr, "GMAC", nullptr);
  if (gmac == nullptr) return absl::UnimplementedError("state file: this OpenSSL has no GMAC (AES-256-GMAC)");
  return gmac;
}

// Tags chunks one after the other on one thread: the SHA-256 of the chunk
// (version 2, `key` null) or AES-256-GMAC under `key` with the chunk's index
// as the IV (version 3; ~5x faster than SHA-256 on a core with AES and
// carry-less multiply instructions: 10 GB/s against 2 GB/s on this project's
// VMs, docs/benchmarks.md's park section).
class ChunkTagger {
 public:
  // `gmac` is Gmac()'s answer when `key` is given.
  ChunkTagger(const ChunkKey* key, EVP_MAC* gmac) : key_(key) {
    if (key_ == nullptr) {
      md_ = EVP_MD_CTX_new();
    } else {
      mac_ = EVP_MAC_CTX_new(gmac);
    }
  }
  ~ChunkTagger() {
    if (md_) EVP_MD_CTX_free(md_);
    if (mac_) EVP_MAC_CTX_free(mac_);
  }
  ChunkTagger(const ChunkTagger&) = delete;
  ChunkTagger& operator=(const ChunkTagger&) = delete;

  bool Begin(int64_t chunk_index) {
    if (key_ == nullptr) return md_ != nullptr && EVP_DigestInit_ex(md_, EVP_sha256(), nullptr) == 1;
    std::array<unsigned char, kGmacIvBytes> iv{};
    const uint64_t j = static_cast<uint64_t>(chunk_index);
    std::memcpy(iv.data(), &j, sizeof(j));  // little-endian, as every integer of the format
    char cipher[] = "AES-256-GCM";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_CIPHER, cipher, 0),
                           OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_IV, iv.data(), iv.size()),
                           OSSL_PARAM_construct_end()};
    return mac_ != nullptr && EVP_MAC_init(mac_, key_->key.data(), key_->key.size(), params) == 1;
  }
  bool Update(const void* data, size_t n) {
    if (key_ == nullptr) return EVP_DigestUpdate(md_, data, n) == 1;
    return EVP_MAC_update(mac_, static_cast<const unsigned char*>(data), n) == 1;
  }
  bool End(Digest& out) {
    out.fill(0);
    if (key_ == nullptr) {
      unsigned int n = 0;
      return EVP_DigestFinal_ex(md_, out.data(), &n) == 1;
    }
    size_t n = 0;
    return EVP_MAC_final(mac_, out.data(), &n, kGmacTagBytes) == 1 && n == kGmacTagBytes;
  }

 private:
  const ChunkKey* key_;
  EVP_MD_CTX* md_ = nullptr;
  EVP_MAC_CTX* mac_ = nullptr;
};

// Moves the file's bytes [0, total) between the pieces and the disk, in
// buffers of `io_bytes` (a multiple of `chunk`), while workers (the caller
// and `helpers` threads) tag the bytes below `body`, one ChunkTagger tag per
// chunk.
// One I/O thread writes the buffers in order, or reads them ahead of the
// workers.
//
// Each byte moves one of two ways:
// * in place: straight between the piece's memory and the disk. Through the
//   page cache every byte of a host piece does (the kernel's copy is the only
//   copy); with O_DIRECT the blocks of a piece whose memory is congruent to
//   its file offset modulo kDirectAlign (the writer pads segments so that its
//   own are; a reader allocates its fresh memory so) do: the disk reads or
//   writes that memory itself, no copy at all.
// * bounced: through a ring of page-aligned bounce buffers (O_DIRECT's
//   ragged edges, the head and the trailer, memory that is not congruent,
//   device pieces): a worker copies its chunk's share between the piece and
//   the bounce buffer, slice by slice.
// The workers hash from the pieces' memory (a device piece: from the bounce
// buffer), each slice right after its copy, while it is in the core's cache.
// A write's trailer (bytes [body, total)) is made by `make_trailer` from the
// digests once every chunk is hashed.
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
    const ChunkKey* key = nullptr;  // version 3's chunk key; null: SHA-256 tags (version 2)
    const std::atomic<bool>* cancel = nullptr;  // StateIoOptions::cancel
    std::function<std::string(const std::vector<Digest>&)> make_trailer;  // write only
  };

  // `pieces` cover [0, body) (a write) or [0, total) (a read), sorted, not
  // overlapping; each stays valid (and, for a write, unchanged) until Run returns.
  ChunkPipeline(Options o, std::vector<Piece> pieces) : o_(std::move(o)), pieces_(std::move(pieces)) {
    tasks_ = (o_.total + o_.chunk - 1) / o_.chunk;
    buffers_ = (o_.total + o_.io_bytes - 1) / o_.io_bytes;
    digests_.resize(static_cast<size_t>((o_.body + o_.chunk - 1) / o_.chunk));
    remaining_.assign(static_cast<size_t>(buffers_), 0);
    filled_.assign(static_cast<size_t>(buffers_), false);
    for (int64_t j = 0; j < tasks_; ++j) ++remaining_[static_cast<size_t>(BufferOf(j))];
    if (o_.write) {
      // The trailer is a piece of its own, filled before its buffer moves.
      trailer_.assign(static_cast<size_t>(o_.total - o_.body), '\0');
      pieces_.push_back({o_.body, o_.total - o_.body, trailer_.data()});
    }
    bool on_device = false;
    for (const Piece& p : pieces_) on_device = on_device || p.device != nullptr;
    bounce_ = o_.direct || on_device;
    for (Piece& p : pieces_) {
      p.in_from = p.in_to = p.at;
      if (p.mem == nullptr) continue;
      if (!bounce_) {
        p.in_to = p.at + p.n;
      } else if (o_.direct && (reinterpret_cast<uintptr_t>(p.mem) - static_cast<uintptr_t>(p.at)) % kDirectAlign == 0) {
        const int64_t from = RoundUp(p.at, kDirectAlign);
        const int64_t to = (p.at + p.n) / kDirectAlign * kDirectAlign;
        if (from < to) p.in_from = from, p.in_to = to;
      }
    }
  }

  const std::vector<Digest>& digests() const { return digests_; }
  // CPU time of the I/O thread and the helpers (after Run).
  int64_t other_threads_cpu_ns() const { return other_threads_cpu_ns_.load(); }

  absl::Status Run() {
    if (bounce_) {
      const int ring = static_cast<int>(std::min<int64_t>(kRing, buffers_));
      for (int i = 0; i < ring; ++i) {
        MALLE_ASSIGN_OR_RETURN(BouncePool::Buffer b, BouncePool::Get(static_cast<size_t>(o_.io_bytes)));
        ring_.push_back(std::move(b));
      }
    }
    if (o_.key != nullptr) {
      MALLE_ASSIGN_OR_RETURN(gmac_, Gmac());
    }
    // The other threads' CPU time, for StateIoOptions::cpu_seconds (the caller measures its own).
    auto timed = [this](void (ChunkPipeline::*loop)()) {
      const int64_t c0 = ThreadCpuNs();
      (this->*loop)();
      other_threads_cpu_ns_.fetch_add(ThreadCpuNs() - c0);
    };
    std::thread io(timed, &ChunkPipeline::IoLoop);
    std::vector<std::thread> helpers;
    const int n_helpers = static_cast<int>(std::min<int64_t>(o_.helpers, tasks_ - 1));
    for (int i = 0; i < n_helpers; ++i) helpers.emplace_back(timed, &ChunkPipeline::WorkLoop);
    WorkLoop();
    for (std::thread& t : helpers) t.join();
    io.join();
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  char* Slot(int64_t k) { return ring_[static_cast<size_t>(k % static_cast<int64_t>(ring_.size()))].get(); }
  int64_t BufferBytes(int64_t k) const { return std::min(o_.io_bytes, o_.total - k * o_.io_bytes); }
  int64_t BufferOf(int64_t task) const { return task * o_.chunk / o_.io_bytes; }

  void Fail(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (error_.ok()) error_ = std::move(s);
  }

  // Calls fn(piece, file offset, length, in_place) for every stretch of the
  // file range [a, b), in order: each piece's overlap, cut where it moves in
  // place and where it is bounced. A stretch no piece covers is bounced
  // (piece nullptr).
  template <typename Fn>
  absl::Status ForStretches(int64_t a, int64_t b, Fn fn) {
    auto it = std::upper_bound(pieces_.begin(), pieces_.end(), a,
                               [](int64_t x, const Piece& p) { return x < p.at + p.n; });
    int64_t x = a;
    for (; x < b && it != pieces_.end(); ++it) {
      if (it->at > x) {
        MALLE_RETURN_IF_ERROR(fn(nullptr, x, std::min(b, it->at) - x, false));
        x = std::min(b, it->at);
      }
      const int64_t end = std::min(b, it->at + it->n);
      // [x, end) within the piece: before, inside and after its in-place range.
      const int64_t cuts[4] = {x, std::clamp(it->in_from, x, end), std::clamp(it->in_to, x, end), end};
      for (int c = 0; c < 3; ++c) {
        if (cuts[c] < cuts[c + 1]) MALLE_RETURN_IF_ERROR(fn(&*it, cuts[c], cuts[c + 1] - cuts[c], c == 1));
      }
      x = std::max(x, end);
    }
    if (x < b) MALLE_RETURN_IF_ERROR(fn(nullptr, x, b - x, false));
    return absl::OkStatus();
  }

  // Copies a bounced stretch between its piece and buffer k's bounce slot.
  absl::Status Bounce(const Piece& p, int64_t pos, int64_t n, int64_t k) {
    char* slot = Slot(k) + (pos - k * o_.io_bytes);
    const int64_t off = pos - p.at;
    if (p.device != nullptr) {
      try {
        at::from_blob(slot, {n}, at::TensorOptions().dtype(at::kByte)).copy_(p.device->narrow(0, off, n));
      } catch (const c10::Error& e) {
        return absl::InternalError(absl::StrCat("state file ", o_.path, ": copy from the device failed: ",
                                                e.what_without_backtrace()));
      }
    } else if (o_.write) {
      std::memcpy(slot, p.mem + off, static_cast<size_t>(n));
    } else {
      std::memcpy(p.mem + off, slot, static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status CheckCancel() const {
    if (o_.cancel == nullptr || !o_.cancel->load(std::memory_order_relaxed)) return absl::OkStatus();
    return absl::CancelledError(absl::StrCat("state file ", o_.path, ": write cancelled"));
  }

  // Task j: the file range [j * chunk, (j + 1) * chunk), within buffer k.
  absl::Status Task(int64_t j, ChunkTagger& tagger) {
    MALLE_RETURN_IF_ERROR(CheckCancel());
    const int64_t a = j * o_.chunk;
    const int64_t b = std::min(a + o_.chunk, o_.total);
    const int64_t k = BufferOf(j);
    const int64_t hashed_end = std::min(b, o_.body);
    bool tagged = true;
    if (a < o_.body) tagged = tagger.Begin(j);
    for (int64_t s = a; s < b; s += kSliceBytes) {
      const int64_t e = std::min(s + kSliceBytes, b);
      // A write's trailer is the I/O thread's.
      const int64_t end = o_.write ? std::min(e, o_.body) : e;
      if (s >= end) break;
      MALLE_RETURN_IF_ERROR(ForStretches(s, end, [&](const Piece* p, int64_t pos, int64_t n, bool in_place) {
        if (p == nullptr) return absl::InternalError(absl::StrCat("state file ", o_.path, ": no piece at ", pos));
        if (!in_place) MALLE_RETURN_IF_ERROR(Bounce(*p, pos, n, k));
        const int64_t h = std::min(n, hashed_end - pos);
        if (h > 0) {
          const char* from = p->device != nullptr ? Slot(k) + (pos - k * o_.io_bytes) : p->mem + (pos - p->at);
          tagged = tagger.Update(from, static_cast<size_t>(h)) && tagged;
        }
        return absl::OkStatus();
      }));
    }
    if (a < o_.body) tagged = tagger.End(digests_[static_cast<size_t>(j)]) && tagged;
    if (!tagged) return absl::InternalError(absl::StrCat("state file ", o_.path, ": OpenSSL failed to tag chunk ", j));
    return absl::OkStatus();
  }

  void WorkLoop() {
    ChunkTagger tagger(o_.key, gmac_);
    for (;;) {
      int64_t j = 0;
      {
        absl::MutexLock lock(&mu_);
        // A read's task waits for its buffer to be read in; a bounced
        // write's for its slot to be written out.
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (!error_.ok() || next_task_ >= tasks_) return true;
          const int64_t k = BufferOf(next_task_);
          if (!o_.write) return static_cast<bool>(filled_[static_cast<size_t>(k)]);
          return !bounce_ || k < written_ + static_cast<int64_t>(ring_.size());
        };
        mu_.Await(absl::Condition(&ready));
        if (!error_.ok() || next_task_ >= tasks_) break;
        j = next_task_++;
      }
      absl::Status s = Task(j, tagger);
      absl::MutexLock lock(&mu_);
      if (!s.ok()) Fail(std::move(s));
      --remaining_[static_cast<size_t>(BufferOf(j))];
      ++tasks_done_;
    }
  }

  // pwrite/pread of the whole range, retrying short transfers; an O_DIRECT
  // transfer the filesystem refuses (EINVAL) is retried through the page
  // cache. With O_DIRECT a range that ends the file is rounded up to a whole
  // block (a read comes back short; a write's padding is cut off later).
  absl::Status Transfer(char* buf, int64_t n, int64_t pos) {
    int64_t done = 0;
    while (done < n) {
      const int64_t want = o_.direct ? RoundUp(n, kDirectAlign) - done : n - done;
      const ssize_t r = o_.write ? ::pwrite(o_.fd, buf + done, static_cast<size_t>(want), pos + done)
                                 : ::pread(o_.fd, buf + done, static_cast<size_t>(want), pos + done);
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

  // Buffer k's I/O, once it may start; false on an error (recorded).
  bool MoveBuffer(int64_t k) {
    const int64_t start = k * o_.io_bytes;
    const int64_t n = BufferBytes(k);
    const bool has_trailer = o_.write && start + n > o_.body;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, k, has_trailer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (!error_.ok()) return true;
        if (has_trailer && tasks_done_ < tasks_) return false;  // the trailer needs every digest
        if (!bounce_) return true;
        if (o_.write) return remaining_[static_cast<size_t>(k)] == 0;
        // A read reuses the slot of buffer k - ring once its workers are done.
        const int64_t prev = k - static_cast<int64_t>(ring_.size());
        return prev < 0 || remaining_[static_cast<size_t>(prev)] == 0;
      };
      mu_.Await(absl::Condition(&ready));
      if (!error_.ok()) return false;
    }
    if (absl::Status c = CheckCancel(); !c.ok()) {
      absl::MutexLock lock(&mu_);
      Fail(std::move(c));
      return false;
    }
    if (has_trailer && !trailer_made_) {
      const std::string mac = o_.make_trailer(digests_);
      std::memcpy(trailer_.data(), mac.data(), std::min(mac.size(), trailer_.size()));
      trailer_made_ = true;
    }
    // The buffer's stretches, in order; consecutive bounced ones as one transfer.
    absl::Status s;
    int64_t run = -1;  // start of the pending bounced run
    auto flush = [&](int64_t upto) -> absl::Status {
      if (run < 0) return absl::OkStatus();
      char* slot = Slot(k) + (run - start);
      const int64_t len = upto - run;
      if (o_.write && o_.direct && upto == start + n && len % kDirectAlign != 0) {
        std::memset(slot + len, 0, static_cast<size_t>(RoundUp(len, kDirectAlign) - len));  // cut off later
      }
      run = -1;
      return Transfer(slot, len, upto - len);
    };
    s = ForStretches(start, start + n, [&](const Piece* p, int64_t x, int64_t len, bool in_place) -> absl::Status {
      if (in_place) {
        MALLE_RETURN_IF_ERROR(flush(x));
        return Transfer(p->mem + (x - p->at), len, x);
      }
      // The trailer's bytes go to the bounce buffer here (the workers never touch them).
      if (o_.write && p != nullptr && x >= o_.body) MALLE_RETURN_IF_ERROR(Bounce(*p, x, len, k));
      if (run < 0) run = x;
      return absl::OkStatus();
    });
    if (s.ok()) s = flush(start + n);
    if (s.ok() && o_.write && !o_.direct) {
      // Start the writeback now (advice): the final fsync then waits for little.
      ::sync_file_range(o_.fd, start, n, SYNC_FILE_RANGE_WRITE);
    }
    absl::MutexLock lock(&mu_);
    if (!s.ok()) {
      Fail(std::move(s));
      return false;
    }
    if (o_.write) {
      ++written_;
    } else {
      filled_[static_cast<size_t>(k)] = true;
    }
    return true;
  }

  void IoLoop() {
    for (int64_t k = 0; k < buffers_; ++k) {
      if (!MoveBuffer(k)) return;
    }
  }

  Options o_;
  std::vector<Piece> pieces_;  // sorted by file offset, not overlapping
  bool bounce_ = false;        // a ring of bounce buffers is in use
  std::atomic<int64_t> other_threads_cpu_ns_{0};
  EVP_MAC* gmac_ = nullptr;    // with o_.key
  int64_t tasks_ = 0;
  int64_t buffers_ = 0;
  std::vector<BouncePool::Buffer> ring_;
  std::vector<Digest> digests_;  // each written by one task
  std::string trailer_;          // a write's; the I/O thread's
  bool trailer_made_ = false;    // the I/O thread's

  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int64_t next_task_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tasks_done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;              // write: buffers written, in order
  std::vector<int64_t> remaining_ ABSL_GUARDED_BY(mu_);  // per buffer: tasks not done
  std::vector<bool> filled_ ABSL_GUARDED_BY(mu_);        // read: buffers read in
};

// Version 2's and 3's trailer: the MAC of the version's domain, the body's
// length, the chunk size, (version 3) the file's nonce, and the chunks' tags
// in order (32 bytes each in version 2, 16 in version 3).
std::string ChunkMac(const std::string& secret, uint32_t version, int64_t body, int64_t chunk,
                     const std::string& nonce, const std::vector<Digest>& digests) {
  Mac mac(secret);
  if (version == 2) {
    mac.Update(kV2Domain, sizeof(kV2Domain) - 1);
  } else {
    mac.Update(kV3Domain, sizeof(kV3Domain) - 1);
  }
  const uint64_t b = static_cast<uint64_t>(body), c = static_cast<uint64_t>(chunk);
  mac.Update(&b, sizeof(b));
  mac.Update(&c, sizeof(c));
  if (version >= 3) mac.Update(nonce.data(), nonce.size());
  const size_t tag = version == 2 ? sizeof(Digest) : kGmacTagBytes;
  for (const Digest& d : digests) mac.Update(d.data(), tag);
  return mac.Final();
}

// Version 3's chunk key: the MAC (under the secret; the SHA-256 unsigned,
// when anyone can compute it and the tags are a checksum) of the key domain
// and the file's nonce.
ChunkKey ChunkKeyOf(const std::string& secret, const std::string& nonce) {
  Mac mac(secret);
  mac.Update(kV3KeyDomain, sizeof(kV3KeyDomain) - 1);
  mac.Update(nonce.data(), nonce.size());
  const std::string k = mac.Final();
  ChunkKey key;
  std::memcpy(key.key.data(), k.data(), std::min(k.size(), key.key.size()));
  return key;
}

// Lowercase hex digits back to bytes; nullopt unless `hex` is exactly 2 *
// `bytes` of them (absl::HexStringToBytes itself checks nothing).
std::optional<std::string> Unhex(const std::string& hex, size_t bytes) {
  if (hex.size() != 2 * bytes) return std::nullopt;
  for (const char c : hex) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c)) && (c < 'a' || c > 'f')) {
      return std::nullopt;
    }
  }
  return absl::HexStringToBytes(hex);
}

// Faults in fresh memory on a thread of its own, in order, ahead of the
// reads that land in it: a read (O_DIRECT's page pinning, or the kernel's
// copy) would otherwise fault each page itself, on the I/O thread, between
// two transfers. MADV_POPULATE_WRITE (Linux 5.14) leaves the contents alone,
// so it may race with the reads; without it, nothing is done. Stops early
// when destroyed.
class Prefaulter {
 public:
  explicit Prefaulter(std::vector<std::pair<char*, int64_t>> ranges) : ranges_(std::move(ranges)) {
    if (!ranges_.empty()) thread_ = std::thread([this] { Run(); });
  }
  ~Prefaulter() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;

 private:
  void Run() {
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    constexpr uintptr_t kStep = uintptr_t{4} << 20;
    for (const auto& [mem, n] : ranges_) {
      // Whole pages only: the ragged edges are faulted by whoever gets there.
      uintptr_t a = (reinterpret_cast<uintptr_t>(mem) + page - 1) / page * page;
      const uintptr_t b = (reinterpret_cast<uintptr_t>(mem) + static_cast<uintptr_t>(n)) / page * page;
      for (; a < b && !stop_.load(); a += kStep) {
        if (::madvise(reinterpret_cast<void*>(a), std::min(kStep, b - a), MADV_POPULATE_WRITE) != 0) return;
      }
    }
  }
  std::vector<std::pair<char*, int64_t>> ranges_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Fresh memory for a segment that starts at file offset `at`, its address
// congruent to `at` modulo kDirectAlign (a view into a slightly larger
// buffer), so that O_DIRECT reads its blocks straight into it; plain memory
// where the element size does not allow the shift.
at::Tensor CongruentEmpty(at::ScalarType dtype, int64_t numel, uint64_t offset) {
  const auto esize = static_cast<int64_t>(c10::elementSize(dtype));
  at::Tensor raw = at::empty({numel * esize + kDirectAlign}, at::TensorOptions().dtype(at::kByte));
  const auto addr = static_cast<int64_t>(reinterpret_cast<uintptr_t>(raw.data_ptr()) % kDirectAlign);
  const int64_t shift = ((static_cast<int64_t>(offset % kDirectAlign) - addr) % kDirectAlign + kDirectAlign) % kDirectAlign;
  if (shift % esize != 0 || (addr + shift) % esize != 0) return at::empty({numel}, at::TensorOptions().dtype(dtype));
  return raw.narrow(0, shift, numel * esize).view(dtype);
}

int Helpers(const StateIoOptions& io) {
  if (io.helper_threads >= 0) return io.helper_threads;
  return std::min(3, CpusOfThisProcess() - 1);
}

}  // namespace

absl::Status WriteStateFile(const std::string& path, const PackedState& state, const std::string& job,
                            int64_t step, const std::string& secret, const StateIoOptions& io) {
  const int64_t cpu0 = ThreadCpuNs();
  int64_t other_cpu_ns = 0;
  const uint32_t version = io.write_version;
  if (version != 2 && version != kStateFileVersion) {
    return absl::InvalidArgumentError(absl::StrCat("state file ", path, ": cannot write format version ", version,
                                                   "; this malletrain writes versions 2 and ", kStateFileVersion));
  }
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
  std::vector<at::Tensor> bytes_views;
  for (const at::Tensor& seg : state.buffers) bytes_views.push_back(seg.contiguous().view(at::kByte));
  // Where each segment starts: after the previous one, padded (< kDirectAlign
  // zeros) so that the file offset is congruent to the segment's address:
  // then O_DIRECT writes its blocks straight from memory. The header holds
  // the offsets, so its length depends on them: lay out for a guessed length,
  // pad the header with spaces to it, or guess again (longer).
  const uint64_t prefix_and_skeleton = kPrefixBytes + state.skeleton.size();
  // Version 3: the chunk key, from a nonce random per file.
  std::string nonce;
  ChunkKey key;
  if (version >= 3) {
    nonce.assign(kChunkNonceBytes, '\0');
    if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()),
                   static_cast<int>(nonce.size())) != 1) {
      return absl::InternalError(
          absl::StrCat("state file ", path, ": OpenSSL could not make a random nonce"));
    }
    key = ChunkKeyOf(secret, nonce);
  }
  nlohmann::json header_base = {{"job", job},
                                {"step", step},
                                {"written_unix_ns", absl::ToUnixNanos(absl::Now())},
                                {"skeleton_bytes", state.skeleton.size()},
                                {"hash_chunk_bytes", kStateHashChunkBytes},
                                {"segments", segments}};
  if (version >= 3) {
    header_base["chunk_mac"] = kV3ChunkMac;
    header_base["chunk_key_nonce"] = absl::BytesToHexString(nonce);
  }
  std::string header_text;
  std::vector<int64_t> offsets(bytes_views.size());
  int64_t body = 0;
  for (size_t guess = header_base.dump().size() + 16 * bytes_views.size() + 32;;) {
    int64_t pos = static_cast<int64_t>(prefix_and_skeleton + guess);
    for (size_t i = 0; i < bytes_views.size(); ++i) {
      const at::Tensor& b = bytes_views[i];
      if (b.is_cpu() && b.numel() > 0) {
        const auto addr = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.data_ptr()) % kDirectAlign);
        pos += ((addr - pos) % kDirectAlign + kDirectAlign) % kDirectAlign;
      }
      offsets[i] = pos;
      pos += b.numel();
    }
    nlohmann::json header = header_base;
    header["segment_offsets"] = offsets;
    header_text = header.dump();
    if (header_text.size() <= guess) {
      header_text.append(guess - header_text.size(), ' ');  // JSON allows trailing whitespace
      body = pos;
      break;
    }
    guess = header_text.size() + 64;
  }
  // The prefix, the header and the skeleton.
  std::string head;
  {
    const uint32_t flags = secret.empty() ? 0 : kFlagSigned;
    const uint64_t header_len = header_text.size();
    head.append(kMagic, sizeof(kMagic));
    head.append(reinterpret_cast<const char*>(&version), sizeof(version));
    head.append(reinterpret_cast<const char*>(&flags), sizeof(flags));
    head.append(reinterpret_cast<const char*>(&header_len), sizeof(header_len));
    head += header_text;
    head += state.skeleton;
  }
  static const char kZeros[kDirectAlign] = {};
  std::vector<Piece> pieces;
  pieces.push_back({0, static_cast<int64_t>(head.size()), head.data()});
  int64_t end = static_cast<int64_t>(head.size());
  for (size_t i = 0; i < bytes_views.size(); ++i) {
    const at::Tensor& b = bytes_views[i];
    if (b.numel() == 0) continue;
    if (offsets[i] > end) pieces.push_back({end, offsets[i] - end, const_cast<char*>(kZeros)});  // padding
    Piece p{offsets[i], b.numel()};
    if (b.is_cpu()) {
      p.mem = static_cast<char*>(b.data_ptr());
    } else {
      p.device = &b;
    }
    pieces.push_back(p);
    end = offsets[i] + b.numel();
  }
  if (body > end) pieces.push_back({end, body - end, const_cast<char*>(kZeros)});

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
    o.cancel = io.cancel;
    if (version >= 3) o.key = &key;
    o.make_trailer = [&](const std::vector<Digest>& d) { return ChunkMac(secret, version, body, o.chunk, nonce, d); };
    ChunkPipeline pipe(o, std::move(pieces));
    absl::Status run = pipe.Run();
    other_cpu_ns = pipe.other_threads_cpu_ns();
    MALLE_RETURN_IF_ERROR(run);
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
  if (io.cpu_seconds != nullptr) *io.cpu_seconds = 1e-9 * static_cast<double>(ThreadCpuNs() - cpu0 + other_cpu_ns);
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
  if (version < 1 || version > kStateFileVersion) {
    return loss(absl::StrCat("state file format version ", version, "; this malletrain reads versions 1 to ",
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
  // Version 3: the chunks' MAC and the nonce of their key.
  std::string nonce;
  if (version >= 3) {
    const nlohmann::json m = header.value("chunk_mac", nlohmann::json());
    if (m != kV3ChunkMac) {
      return loss(absl::StrCat("corrupt header: chunk_mac is ", m.dump().substr(0, 100), "; this malletrain knows \"",
                               kV3ChunkMac, "\""));
    }
    const nlohmann::json n = header.value("chunk_key_nonce", nlohmann::json());
    std::optional<std::string> bytes = n.is_string() ? Unhex(n.get<std::string>(), kChunkNonceBytes) : std::nullopt;
    if (!bytes) {
      return loss(absl::StrCat("corrupt header: chunk_key_nonce is ", n.dump().substr(0, 100), ", not ",
                               2 * kChunkNonceBytes, " lowercase hex digits"));
    }
    nonce = *std::move(bytes);
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
  // Version 2: where each segment starts (after the previous one, fewer than
  // kDirectAlign bytes of padding between).
  const uint64_t head_bytes = kPrefixBytes + header_len + skeleton_bytes;
  std::vector<uint64_t> offsets;
  if (version >= 2 && total <= size) {
    const nlohmann::json o = header.value("segment_offsets", nlohmann::json());
    if (!o.is_array() || o.size() != segs.size()) {
      return loss(absl::StrCat("corrupt header: segment_offsets must list ", segs.size(), " offsets, got ",
                               o.dump().substr(0, 200)));
    }
    uint64_t end = head_bytes;
    for (size_t i = 0; i < segs.size(); ++i) {
      if (!o[i].is_number_unsigned() || o[i].get<uint64_t>() < end ||
          o[i].get<uint64_t>() - end >= static_cast<uint64_t>(kDirectAlign) || o[i].get<uint64_t>() > size) {
        return loss(absl::StrCat("corrupt header: segment_offsets[", i, "] is ", o[i].dump(), ", segment ", i,
                                 " must start within ", kDirectAlign, " bytes after byte ", end));
      }
      offsets.push_back(o[i].get<uint64_t>());
      end = offsets.back() + segs[i].bytes;
      if (end > size) break;
    }
    total = end + kMacBytes;
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
    if (in_place) {
      out.buffers.push_back(*t);
    } else if (!offsets.empty() && segs[i].bytes > 0) {
      out.buffers.push_back(CongruentEmpty(segs[i].dtype, segs[i].numel, offsets[i]));
    } else {
      out.buffers.push_back(at::empty({segs[i].numel}, at::TensorOptions().dtype(segs[i].dtype)));
    }
    out.direct.push_back(in_place);
  }
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
    std::string padding(segs.size() * kDirectAlign, '\0');  // where the padding lands (not used)
    std::vector<Piece> pieces;
    pieces.push_back({0, static_cast<int64_t>(head_bytes), head_read.data()});
    int64_t pos = static_cast<int64_t>(head_bytes);
    for (size_t i = 0; i < segs.size(); ++i) {
      if (segs[i].bytes == 0) continue;
      const auto start = static_cast<int64_t>(offsets[i]);
      if (start > pos) pieces.push_back({pos, start - pos, padding.data() + i * kDirectAlign});
      pieces.push_back({start, static_cast<int64_t>(segs[i].bytes), static_cast<char*>(out.buffers[i].data_ptr())});
      pos = start + static_cast<int64_t>(segs[i].bytes);
    }
    pieces.push_back({pos, static_cast<int64_t>(kMacBytes), trailer.data()});
    ChunkPipeline::Options o;
    o.write = false;
    o.fd = fd;
    o.direct = direct;
    o.path = path;
    o.total = static_cast<int64_t>(size);
    o.body = pos;
    o.chunk = chunk;
    o.io_bytes = std::max(kStateIoChunkBytes, chunk);
    o.helpers = Helpers(io);
    ChunkKey key;
    if (version >= 3) {
      key = ChunkKeyOf(secret, nonce);
      o.key = &key;
    }
    std::vector<std::pair<char*, int64_t>> fresh;
    for (size_t i = 0; i < segs.size(); ++i) {
      if (!out.direct[i]) fresh.emplace_back(static_cast<char*>(out.buffers[i].data_ptr()), segs[i].bytes);
    }
    ChunkPipeline pipe(o, std::move(pieces));
    {
      Prefaulter prefault(std::move(fresh));
      MALLE_RETURN_IF_ERROR(pipe.Run());
    }
    std::string parsed(prefix, sizeof(prefix));
    parsed += header_text;
    parsed += out.skeleton;
    if (parsed != head_read) return loss("the file changed while it was read");
    const std::string expected = ChunkMac(secret, version, pos, chunk, nonce, pipe.digests());
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
