// ParkStore: where a job's state goes when no rank is left to hold it.
//
// Defines the state file format (WriteStateFile / ReadStateFile: one packed
// JobState, streamed from and into flat buffers, no pickling), ParkStore (the
// interface the engine parks to, snapshots to and resumes from) and
// DirParkStore (a directory: a shared filesystem on a cluster, local disk for
// `malletrain local` and the demo).
//
// A state file is: the magic "MALLEPRK", u32 format version, u32 flags (bit 0:
// signed), u64 length of a JSON header (job, step, creation time, the
// segments' dtypes, lengths, devices, the skeleton's length and, from
// version 2, the hash chunk size and the segments' file offsets; from version
// 3, the chunk MAC's name and its key's nonce), the header, the skeleton,
// every segment's bytes in order (the *body* ends here), and a 32-byte
// trailer (integers are little-endian).
//
// Version 3 (written since 2026-11-28, later): each segment starts at its
// offset, fewer than 4096 bytes (zeros) after the previous one ends; the
// writer pads so that a segment's file offset is congruent to its address
// modulo 4096 (see the I/O below). The body is cut into chunks of
// `hash_chunk_bytes` (4 MiB) at file offsets 0, C, 2C, ...; chunk j's tag is
// its AES-256-GMAC (16 bytes) under the file's chunk key with IV = u64 j ||
// 4 zero bytes; the chunk key is HMAC-SHA256(secret, "MALLEPRK v3 chunk key"
// || nonce), the nonce 16 random bytes per file (the header's
// `chunk_key_nonce`). The trailer is the HMAC-SHA256 under the deployment
// secret of "MALLEPRK v3 chunks" || u64 body length || u64 C || nonce ||
// tag 0 || tag 1 || .... Without a secret SHA-256 replaces HMAC-SHA256 in
// both places (the file is flagged unsigned: the tags are then a checksum
// anyone can compute, and a reader that has a secret refuses it). The tags
// are independent, so several cores tag one file; the MAC over them in
// order binds every byte (the padding and the header's offsets included),
// the length and the chunking; GMAC runs at ~5x SHA-256's speed on a core
// with AES and carry-less multiply instructions. Version 2 (read, no longer
// written): the same layout, chunk tags are the chunks' SHA-256, the trailer
// MACs "MALLEPRK v2 chunks" || u64 body length || u64 C || the digests.
// Version 1 (read): no padding; the trailer is the HMAC-SHA256 (SHA-256) of
// the whole body, one stream. Any other version is refused, naming it. A
// reader verifies the trailer before it returns anything, so a truncated,
// corrupt or forged file is refused with an error naming what is wrong,
// never half-used.
//
// Writes are atomic and durable: a temporary file in the same directory,
// fsync, rename, fsync of the directory. A failed write (a full disk) leaves
// the previous files as they were.
//
// The I/O (versions 2 and 3): one I/O thread moves the file in kStateIoChunkBytes
// pieces while workers hash the chunks. Where the filesystem allows it the I/O
// bypasses the page cache (O_DIRECT; on a machine with busy cores the page
// cache's copy and reclaim competed with the hash, tests/bench/park_io_probe.py):
// the blocks of a segment whose memory is congruent to its file offset move
// straight between that memory and the disk (the writer's own, by its
// padding; a reader's fresh memory, which it allocates to match, faulted in
// ahead of the reads by a thread of its own); the ragged edges, the head, the
// trailer and other memory go through a few page-aligned bounce buffers. A
// file the page cache already holds is read through it, straight into the
// destinations; so is everything on a filesystem that refuses O_DIRECT. A
// read can land segments directly in the reader's own flat buffers
// (StateIoOptions::own). The format does not depend on how a file was moved.
//
//   MALLE_ASSIGN_OR_RETURN(auto store, DirParkStore::Open({"/shared/park/digits", secret}));
//   MALLE_RETURN_IF_ERROR(store->Write(state.Pack(), state.step));      // park or snapshot
//   MALLE_ASSIGN_OR_RETURN(std::optional<ParkedState> newest, store->ReadNewest());
//
// Thread-safety: a DirParkStore may be used from one thread at a time (the
// engine's snapshot thread and its training thread never use it at once);
// separate processes may write the same directory (names are unique per step
// and writer). WriteStateFile / ReadStateFile may run on several threads at
// once (each call has its own threads; the bounce buffers a process keeps
// for reuse are shared under a lock).
#ifndef MALLE_ELASTIC_PARK_STORE_H_
#define MALLE_ELASTIC_PARK_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libmalle/elastic/state_pack.h"

namespace malle::elastic {

// The version WriteStateFile writes; ReadStateFile reads it and every earlier one.
inline constexpr uint32_t kStateFileVersion = 3;

// How WriteStateFile / ReadStateFile do their I/O (not what they write).
struct StateIoOptions {
  // Threads that copy and hash beside the calling thread (which does its
  // share): -1, as many as the process has CPUs, minus one, at most 3 (a
  // park's or a resume's latency); 0: the calling thread alone, beside the
  // I/O thread, which mostly waits for the disk (a background snapshot,
  // where the cores training needs matter more than the write's wall time).
  // Forced to 0 when a segment is on a CUDA device. A version-1 file is
  // hashed as one stream: at most one helper.
  int helper_threads = -1;
  // O_DIRECT where the filesystem allows it (and, for a read, where the page
  // cache does not hold most of the file); false: always through the page
  // cache.
  bool direct_io = true;
  // Read only: this process's own state, packed (JobState::Pack, direct
  // segments). Each segment of the file whose layout matches one of its
  // direct segments (InPlaceTargets) is read straight into it: no fresh
  // memory, no second copy. If the file is then refused, those buffers hold
  // whatever was read: pass it only where they have nothing to lose (a new
  // incarnation before it resumes).
  const PackedState* own = nullptr;
  // Write only: the format version to write, 2 or kStateFileVersion (a
  // deployment whose readers are older; a benchmark's side-by-side). Any
  // other is kInvalidArgument.
  uint32_t write_version = kStateFileVersion;
  // Write only: when this turns true the write stops at the next chunk with
  // kCancelled and leaves no file (the previous ones stay). A park cancels a
  // background snapshot that is still being written: it writes a newer state.
  const std::atomic<bool>* cancel = nullptr;
  // Write only: if given, receives the CPU time the write took on all its
  // threads (the calling thread, the helpers, the I/O thread): what a
  // background write takes from training, whatever its wall time.
  double* cpu_seconds = nullptr;
};

// I/O chunk: the size of a bounce buffer, what one write() or read() moves.
inline constexpr int64_t kStateIoChunkBytes = int64_t{16} << 20;
// The hash chunk (the unit the workers share), written into the header.
inline constexpr int64_t kStateHashChunkBytes = int64_t{4} << 20;

struct StateFileInfo {
  std::string job;
  int64_t step = 0;
  absl::Time written;
  int64_t bytes = 0;  // the file's size
  bool signed_ = false;
};

// Writes `state` to `path` atomically (temp file, fsync, rename, fsync of the
// directory). `secret` empty: unsigned (SHA-256 in place of HMAC-SHA256). Device segments are
// copied to the host in chunks. Blocks for the I/O. Errors: kInvalidArgument
// (a corrupt skeleton), kResourceExhausted (disk full), kPermissionDenied,
// kInternal (other I/O errors), kCancelled (io.cancel), each naming the path;
// `path` is untouched.
absl::Status WriteStateFile(const std::string& path, const PackedState& state, const std::string& job,
                            int64_t step, const std::string& secret, const StateIoOptions& io = {});

// Reads and verifies a state file. Segments come back on the device types they
// were written from (CPU, or this process's current CUDA device). `info`, if
// given, receives the header. Errors: kNotFound, kDataLoss ("truncated",
// "checksum mismatch: corrupt or forged", "unsigned ... while a secret is
// configured", "not a malletrain state file", "format version N" for a
// version this malletrain does not read, "corrupt header" naming the field),
// each naming the path. Segments read in place (io.own) come back as those
// buffers, flagged direct.
absl::StatusOr<PackedState> ReadStateFile(const std::string& path, const std::string& secret,
                                          StateFileInfo* info = nullptr, const StateIoOptions& io = {});

// A state read back from a park store.
struct ParkedState {
  PackedState state;
  StateFileInfo info;
  std::string path;
};

class ParkStore {
 public:
  virtual ~ParkStore() = default;
  // Writes the job's state at `step` (what a state transfer sends). Once it
  // is durable, older states are removed but one (the fallback if the newest
  // is ever unreadable). Errors as WriteStateFile's; the previous states stay.
  virtual absl::Status Write(const PackedState& state, int64_t step, const StateIoOptions& io) = 0;
  absl::Status Write(const PackedState& state, int64_t step) { return Write(state, step, StateIoOptions{}); }
  // The newest state that verifies; states that do not are skipped, and each
  // is named with why in `refused` (if given). nullopt: nothing parked.
  // Errors: kInternal/kPermissionDenied (the store cannot be listed).
  virtual absl::StatusOr<std::optional<ParkedState>> ReadNewest(std::vector<std::string>* refused,
                                                                const StateIoOptions& io) = 0;
  absl::StatusOr<std::optional<ParkedState>> ReadNewest(std::vector<std::string>* refused = nullptr) {
    return ReadNewest(refused, StateIoOptions{});
  }
  // What is stored, newest first (headers only, not verified). Errors: as ReadNewest.
  virtual absl::StatusOr<std::vector<StateFileInfo>> List() = 0;
  virtual std::string where() const = 0;  // for messages
};

struct DirParkStoreOptions {
  std::string dir;     // the job's own directory (created if missing)
  std::string job;     // written into every file's header
  std::string secret;  // the deployment secret; empty: unsigned files
};

class DirParkStore : public ParkStore {
 public:
  // Creates the directory if needed. Errors: kInvalidArgument (empty dir),
  // kPermissionDenied / kInternal (cannot create or write it).
  static absl::StatusOr<std::unique_ptr<DirParkStore>> Open(DirParkStoreOptions options);

  using ParkStore::ReadNewest;
  using ParkStore::Write;
  absl::Status Write(const PackedState& state, int64_t step, const StateIoOptions& io) override;
  absl::StatusOr<std::optional<ParkedState>> ReadNewest(std::vector<std::string>* refused,
                                                        const StateIoOptions& io) override;
  absl::StatusOr<std::vector<StateFileInfo>> List() override;
  std::string where() const override { return options_.dir; }

 private:
  explicit DirParkStore(DirParkStoreOptions options) : options_(std::move(options)) {}
  // The state files of the directory, newest (highest step, then newest name) first.
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> Files() const;
  DirParkStoreOptions options_;
};

}  // namespace malle::elastic

#endif  // MALLE_ELASTIC_PARK_STORE_H_
