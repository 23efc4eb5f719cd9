// Parking through the C++ API (issue 22): the state file format and the
// directory park store (round trip, truncated / corrupt / forged / unsigned
// files refused with the previous state used, a full disk keeping the
// previous state), and the engine: a one-rank job asked to leave parks, a new
// incarnation resumes at the exact step and ends bitwise equal to a run that
// never stopped; snapshots after an abrupt end; Save() / resume_from; another
// model's state is refused naming the mismatch.
#include "libmalle/elastic/park_store.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/adam.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libmalle/elastic/elastic_trainer.h"
#include "libmalle/elastic/job_state.h"
#include "tests/cpp/testing/group_options.h"
#include "tests/cpp/testing/status_matchers.h"

namespace malle::elastic {
namespace {

namespace fs = std::filesystem;
using ::malle::comm::testing::GroupOptions;
using ::malle::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path p = fs::path(base != nullptr ? base : fs::temp_directory_path().string()) /
               ("malle-park-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// A job state with a float and an int64 tensor and a part with bytes.
JobState SomeState(int64_t step, int n = 1000) {
  JobState s;
  s.logical_workers = 4;
  s.seed = 7;
  s.step = step;
  s.parameters.push_back({"w", at::arange(n, at::kFloat) * static_cast<float>(step + 1)});
  s.buffers.push_back({"count", at::tensor({step}, at::kLong)});
  StatePartRecord part;
  part.name = "extra";
  part.state.bytes = "schedule=" + std::to_string(step);
  s.parts.push_back(part);
  return s;
}

void ExpectSame(const PackedState& packed, const JobState& want) {
  absl::StatusOr<JobState> got = JobState::Unpack(packed);
  ASSERT_OK(got.status());
  EXPECT_EQ(got->step, want.step);
  ASSERT_EQ(got->parameters.size(), 1u);
  EXPECT_TRUE(at::equal(got->parameters[0].tensor, want.parameters[0].tensor));
  EXPECT_TRUE(at::equal(got->buffers[0].tensor, want.buffers[0].tensor));
  ASSERT_NE(got->part("extra"), nullptr);
  EXPECT_EQ(got->part("extra")->state.bytes, want.parts[0].state.bytes);
}

int64_t ThreadCpuNs() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

TEST(StateFileTest, RoundTripsSignedAndUnsigned) {
  const std::string dir = TempDir("roundtrip");
  const JobState s = SomeState(12);
  for (const std::string secret : {std::string(), std::string("deployment-secret")}) {
    const std::string path = dir + "/s" + std::to_string(secret.size()) + ".mstate";
    ASSERT_OK(WriteStateFile(path, s.Pack(), "digits", 12, secret));
    StateFileInfo info;
    absl::StatusOr<PackedState> back = ReadStateFile(path, secret, &info);
    ASSERT_OK(back.status());
    ExpectSame(*back, s);
    EXPECT_EQ(info.job, "digits");
    EXPECT_EQ(info.step, 12);
    EXPECT_EQ(info.signed_, !secret.empty());
    // No temporary file is left behind.
    for (const auto& e : fs::directory_iterator(dir)) {
      EXPECT_EQ(e.path().extension(), ".mstate") << e.path();
    }
  }
}

TEST(StateFileTest, TruncatedCorruptForgedAndUnsignedFilesAreRefusedNamingWhy) {
  const std::string dir = TempDir("bad");
  const std::string good = dir + "/good.mstate";
  ASSERT_OK(WriteStateFile(good, SomeState(3).Pack(), "j", 3, "secret-a"));
  const std::string bytes = ReadAll(good);

  const std::string truncated = dir + "/truncated.mstate";
  WriteAll(truncated, bytes.substr(0, bytes.size() / 2));
  EXPECT_THAT(ReadStateFile(truncated, "secret-a").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));

  const std::string corrupt = dir + "/corrupt.mstate";
  std::string flipped = bytes;
  flipped[bytes.size() - 100] ^= 0x40;  // a byte of a segment
  WriteAll(corrupt, flipped);
  EXPECT_THAT(ReadStateFile(corrupt, "secret-a").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum mismatch")));

  // Forged: a well-formed file signed with another key.
  const std::string forged = dir + "/forged.mstate";
  ASSERT_OK(WriteStateFile(forged, SomeState(3).Pack(), "j", 3, "attacker-key"));
  EXPECT_THAT(ReadStateFile(forged, "secret-a").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum mismatch")));

  // An unsigned file where the deployment has a secret.
  const std::string unsigned_path = dir + "/unsigned.mstate";
  ASSERT_OK(WriteStateFile(unsigned_path, SomeState(3).Pack(), "j", 3, ""));
  EXPECT_THAT(ReadStateFile(unsigned_path, "secret-a").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("unsigned")));

  const std::string other = dir + "/other.mstate";
  WriteAll(other, "PK\x03\x04 a zip file, not a state file at all");
  EXPECT_THAT(ReadStateFile(other, "secret-a").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a malletrain state file")));
  EXPECT_THAT(ReadStateFile(dir + "/missing.mstate", "secret-a").status(),
              StatusIs(absl::StatusCode::kNotFound));
  // The good one still reads.
  EXPECT_OK(ReadStateFile(good, "secret-a").status());
}

// A state larger than several I/O chunks, its parameters in one flat buffer
// (a direct segment, as the trainer keeps them): 12 M floats = 48 MB, three
// kStateIoChunkBytes chunks. `scale` 0: zeros (a fresh incarnation's model).
JobState BigFlatState(int64_t step, float scale) {
  // One intra-op thread: tensors this large would start OpenMP's pool, and a
  // later test forks (a child of a process that ran OpenMP hangs in it).
  at::set_num_threads(1);
  JobState s;
  s.logical_workers = 1;
  s.step = step;
  s.parameters.push_back({"w", at::arange(10'000'000, at::kFloat) * scale});
  s.parameters.push_back({"v", at::arange(2'000'000, at::kFloat) * -scale});
  s.buffers.push_back({"count", at::tensor({step}, at::kLong)});
  std::vector<at::Tensor> flat = {s.parameters[0].tensor, s.parameters[1].tensor};
  EXPECT_TRUE(FlattenTensors(flat));
  return s;
}

// Copying and hashing on helper threads or on the calling thread alone,
// through O_DIRECT or the page cache: each combination reads back bitwise
// what any other wrote (the format does not depend on how it was written),
// and a byte flipped in a middle chunk of a large segment is refused
// whichever way the file is read.
TEST(StateFileTest, ChunkedIoRoundTripsAndRefusesACorruptMiddleChunk) {
  const std::string dir = TempDir("chunks");
  const JobState s = BigFlatState(9, 0.5f);
  const PackedState packed = s.Pack();
  ASSERT_GT(packed.bytes(), 2 * kStateIoChunkBytes);
  struct Way {
    int helpers;
    bool direct;
  };
  const std::vector<Way> ways = {{-1, true}, {0, true}, {2, false}, {0, false}};
  for (const Way& w : ways) {
    StateIoOptions wio;
    wio.helper_threads = w.helpers;
    wio.direct_io = w.direct;
    const std::string path = absl::StrCat(dir, "/w", w.helpers, w.direct, ".mstate");
    ASSERT_OK(WriteStateFile(path, packed, "big", 9, "k", wio));
    // The last segment's end + the trailer: no O_DIRECT padding left at the end.
    const std::string written = ReadAll(path);
    uint64_t header_len = 0;
    std::memcpy(&header_len, written.data() + 16, sizeof(header_len));
    const nlohmann::json header = nlohmann::json::parse(written.substr(24, header_len));
    const nlohmann::json& last = header["segments"].back();
    EXPECT_EQ(written.size(), header["segment_offsets"].back().get<uint64_t>() + last[3].get<uint64_t>() + 32)
        << "no O_DIRECT padding left at the end";
    for (const Way& r : ways) {
      StateIoOptions rio;
      rio.helper_threads = r.helpers;
      rio.direct_io = r.direct;
      absl::StatusOr<PackedState> back = ReadStateFile(path, "k", nullptr, rio);
      ASSERT_OK(back.status()) << "written " << w.helpers << "/" << w.direct << ", read " << r.helpers << "/"
                               << r.direct;
      absl::StatusOr<JobState> got = JobState::Unpack(*std::move(back));
      ASSERT_OK(got.status());
      EXPECT_TRUE(at::equal(got->parameters[0].tensor, s.parameters[0].tensor));
      EXPECT_TRUE(at::equal(got->parameters[1].tensor, s.parameters[1].tensor));
    }
    // One byte in the second of the segment's three chunks.
    std::string bytes = ReadAll(path);
    const size_t middle = bytes.size() / 2;
    bytes[middle] ^= 0x10;
    const std::string bad = dir + "/middle.mstate";
    WriteAll(bad, bytes);
    for (const Way& r : ways) {
      StateIoOptions rio;
      rio.helper_threads = r.helpers;
      rio.direct_io = r.direct;
      EXPECT_THAT(ReadStateFile(bad, "k", nullptr, rio).status(),
                  StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum mismatch")));
    }
  }
}

// Format version 3 tags chunks separately (GMAC under a key of the file's
// own); the trailer must still bind every byte, the chunks' order, the
// chunking and the key's nonce.
TEST(StateFileTest, VersionThreeBindsEveryChunkTheirOrderTheChunkingAndTheNonce) {
  const std::string dir = TempDir("v3");
  const std::string path = dir + "/good.mstate";
  ASSERT_OK(WriteStateFile(path, BigFlatState(5, 1.5f).Pack(), "big", 5, "k"));
  const std::string good = ReadAll(path);
  ASSERT_EQ(good.substr(8, 4), std::string("\x03\0\0\0", 4));  // the version written
  const size_t chunk = static_cast<size_t>(kStateHashChunkBytes);
  ASSERT_GT(good.size(), 8 * chunk);
  auto refused = [&](const std::string& name, const std::string& bytes, const std::string& why) {
    const std::string p = dir + "/" + name + ".mstate";
    WriteAll(p, bytes);
    for (const int helpers : {-1, 0}) {
      StateIoOptions io;
      io.helper_threads = helpers;
      EXPECT_THAT(ReadStateFile(p, "k", nullptr, io).status(),
                  StatusIs(absl::StatusCode::kDataLoss, HasSubstr(why)))
          << name << ", helpers " << helpers;
    }
  };
  // A byte of the first chunk (the header: the job's name), of the last
  // (partial) chunk, and of the trailer.
  std::string b = good;
  b[good.find("\"big\"") + 2] = 'o';
  refused("header", b, "checksum mismatch");
  b = good;
  b[good.size() - 40] ^= 0x08;
  refused("last_chunk", b, "checksum mismatch");
  b = good;
  b[good.size() - 1] ^= 0x80;
  refused("trailer", b, "checksum mismatch");
  // Two whole chunks swapped: each chunk's digest is right, their order is not.
  b = good;
  std::swap_ranges(b.begin() + 3 * chunk, b.begin() + 4 * chunk, b.begin() + 5 * chunk);
  refused("swapped", b, "checksum mismatch");
  // Another chunk size in the header (as long as the old one: the file's
  // offsets stay valid): the reader cuts other chunks, and the MAC says no.
  const std::string field = "\"hash_chunk_bytes\":" + std::to_string(kStateHashChunkBytes);
  const size_t at = good.find(field);
  ASSERT_NE(at, std::string::npos);
  b = good;
  b.replace(at, field.size(), "\"hash_chunk_bytes\":" + std::to_string(kStateHashChunkBytes / 4));
  ASSERT_EQ(b.size(), good.size());
  refused("rechunked", b, "checksum mismatch");
  // A chunk size no writer uses: named.
  b = good;
  b.replace(at, field.size(), "\"hash_chunk_bytes\":" + std::to_string(kStateHashChunkBytes - 1));
  refused("bad_chunk", b, "hash_chunk_bytes");
  // Segment offsets that overlap the head or the previous segment: named.
  const size_t offs = good.find("\"segment_offsets\":[");
  ASSERT_NE(offs, std::string::npos);
  const size_t first = offs + std::string("\"segment_offsets\":[").size();
  const size_t comma = good.find(',', first);
  const size_t close = good.find(']', first);
  ASSERT_LT(comma, close);
  const std::string first_offset = good.substr(first, comma - first);
  b = good;
  b.replace(first, first_offset.size(), "1" + std::string(first_offset.size() - 1, ' '));
  refused("offset_in_head", b, "segment_offsets[0] is 1");
  const std::string second_offset = good.substr(comma + 1, close - comma - 1);
  ASSERT_LE(first_offset.size(), second_offset.size());
  b = good;
  b.replace(comma + 1, second_offset.size(),
            first_offset + std::string(second_offset.size() - first_offset.size(), ' '));
  refused("offsets_overlap", b, "segment_offsets[1]");
  b = good;
  b.replace(comma, 1, " ");  // one offset for two segments
  b.replace(comma + 1, second_offset.size(), std::string(second_offset.size(), ' '));
  refused("offsets_missing", b, "segment_offsets must list 2 offsets");
  // Another nonce (same length): every chunk's key is another, the MAC says
  // no. A nonce that is not 32 hex digits, or another chunk MAC: named.
  const std::string nonce_field = "\"chunk_key_nonce\":\"";
  const size_t nonce_at = good.find(nonce_field);
  ASSERT_NE(nonce_at, std::string::npos);
  const size_t digit = nonce_at + nonce_field.size();
  b = good;
  b[digit] = b[digit] == '0' ? '1' : '0';
  refused("renonced", b, "checksum mismatch");
  b = good;
  b[digit] = 'g';
  refused("bad_nonce", b, "chunk_key_nonce is");
  b = good;
  b.replace(digit + 31, 2, "\" ");  // 31 digits, the same length
  refused("short_nonce", b, "not 32 lowercase hex digits");
  const size_t mac_at = good.find("\"AES-256-GMAC\"");
  ASSERT_NE(mac_at, std::string::npos);
  b = good;
  b.replace(mac_at, 14, "\"AES-128-GMAC\"");
  refused("other_mac", b, "chunk_mac is \"AES-128-GMAC\"");
  // The good file still reads.
  EXPECT_OK(ReadStateFile(path, "k").status());
}

// A deployment whose readers are older asks for version 2: what it gets reads
// back and is a version-2 file; a version no writer has is refused by name.
TEST(StateFileTest, WritesVersionTwoOnRequestAndNoUnknownVersion) {
  const std::string dir = TempDir("write_v2");
  StateIoOptions io;
  io.write_version = 2;
  ASSERT_OK(WriteStateFile(dir + "/v2.mstate", BigFlatState(2, 0.5f).Pack(), "j", 2, "k", io));
  const std::string bytes = ReadAll(dir + "/v2.mstate");
  EXPECT_EQ(bytes.substr(8, 4), std::string("\x02\0\0\0", 4));
  EXPECT_EQ(bytes.find("chunk_key_nonce"), std::string::npos);
  absl::StatusOr<PackedState> back = ReadStateFile(dir + "/v2.mstate", "k");
  ASSERT_OK(back.status());
  absl::StatusOr<JobState> got = JobState::Unpack(*std::move(back));
  ASSERT_OK(got.status());
  const JobState want = BigFlatState(2, 0.5f);
  ASSERT_EQ(got->parameters.size(), 2u);
  EXPECT_TRUE(at::equal(got->parameters[0].tensor, want.parameters[0].tensor));
  EXPECT_TRUE(at::equal(got->parameters[1].tensor, want.parameters[1].tensor));
  for (const uint32_t v : {1u, 4u}) {
    io.write_version = v;
    EXPECT_THAT(WriteStateFile(dir + "/bad.mstate", SomeState(2).Pack(), "j", 2, "k", io),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot write format version " + std::to_string(v))));
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad.mstate"));
}

// A write whose cancel flag is set stops with kCancelled and leaves nothing
// (the store's older files stay); a write reports the CPU it took.
TEST(StateFileTest, ACancelledWriteLeavesNoFileAndAWriteReportsItsCpu) {
  const std::string dir = TempDir("cancel");
  const PackedState packed = BigFlatState(1, 1.0f).Pack();
  std::atomic<bool> cancel{true};
  StateIoOptions io;
  io.cancel = &cancel;
  for (const int helpers : {-1, 0}) {
    io.helper_threads = helpers;
    EXPECT_THAT(WriteStateFile(dir + "/c.mstate", packed, "j", 1, "k", io),
                StatusIs(absl::StatusCode::kCancelled, HasSubstr("write cancelled")));
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "helpers " << helpers;
  }
  cancel.store(false);
  double cpu = -1;
  io.cpu_seconds = &cpu;
  ASSERT_OK(WriteStateFile(dir + "/c.mstate", packed, "j", 1, "k", io));
  EXPECT_GT(cpu, 0.0);
  EXPECT_LT(cpu, 60.0);
  EXPECT_OK(ReadStateFile(dir + "/c.mstate", "k").status());
}

// Every file has a chunk key of its own: the same state written twice gets
// two nonces (and so two trailers), and both read back.
TEST(StateFileTest, EachFileHasItsOwnChunkKey) {
  const std::string dir = TempDir("nonce");
  const PackedState packed = SomeState(4).Pack();
  ASSERT_OK(WriteStateFile(dir + "/a.mstate", packed, "j", 4, "k"));
  ASSERT_OK(WriteStateFile(dir + "/b.mstate", packed, "j", 4, "k"));
  const std::string a = ReadAll(dir + "/a.mstate"), b = ReadAll(dir + "/b.mstate");
  auto nonce = [](const std::string& f) {
    const size_t at = f.find("\"chunk_key_nonce\":\"");
    return at == std::string::npos ? std::string() : f.substr(at + 19, 32);
  };
  ASSERT_EQ(nonce(a).size(), 32u);
  EXPECT_NE(nonce(a), nonce(b));
  EXPECT_NE(a.substr(a.size() - 32), b.substr(b.size() - 32));
  for (const std::string name : {"a", "b"}) {
    absl::StatusOr<PackedState> back = ReadStateFile(dir + "/" + name + ".mstate", "k");
    ASSERT_OK(back.status());
    ExpectSame(*back, SomeState(4));
  }
}

// Bytes move straight between memory and the disk where the memory's address
// is congruent to the file offset, through a bounce buffer elsewhere: a
// reader's own buffers at any alignment read back bitwise, both ways.
TEST(StateFileTest, SegmentsAtAnyAlignmentReadBackBitwise) {
  const std::string dir = TempDir("align");
  const int64_t n = 3'000'000;  // 12 MB: the aligned interior and both ragged edges
  for (const int64_t shift : {0, 1, 3, 1000}) {
    // The writer's segment starts `shift` floats into its storage; the
    // reader's own one 7 floats later than that (never congruent to it).
    at::Tensor src_base = at::arange(n + 2000, at::kFloat);
    at::Tensor src = src_base.narrow(0, shift, n);
    StatePacker w(/*direct_min_bytes=*/1);
    w.PutTensor(src);
    const PackedState written = std::move(w).Finish();
    ASSERT_TRUE(written.direct[0]);
    const std::string path = absl::StrCat(dir, "/s", shift, ".mstate");
    ASSERT_OK(WriteStateFile(path, written, "align", 1, "k"));
    at::Tensor dst_base = at::zeros({n + 2000}, at::kFloat);
    at::Tensor dst = dst_base.narrow(0, shift + 7, n);
    StatePacker r(1);
    r.PutTensor(dst);
    const PackedState own = std::move(r).Finish();
    for (const bool direct : {true, false}) {
      dst.zero_();
      StateIoOptions io;
      io.own = &own;
      io.direct_io = direct;
      absl::StatusOr<PackedState> back = ReadStateFile(path, "k", nullptr, io);
      ASSERT_OK(back.status()) << "shift " << shift;
      ASSERT_TRUE(back->direct[0]) << "read in place";
      EXPECT_TRUE(at::equal(dst, src)) << "shift " << shift << ", O_DIRECT " << direct;
      // Into fresh memory.
      io.own = nullptr;
      absl::StatusOr<PackedState> fresh = ReadStateFile(path, "k", nullptr, io);
      ASSERT_OK(fresh.status());
      EXPECT_TRUE(at::equal(fresh->buffers[0], src)) << "shift " << shift << ", O_DIRECT " << direct;
    }
  }
}

// Versions this malletrain does not know are refused naming the version.
TEST(StateFileTest, AnUnknownFormatVersionIsRefusedByName) {
  const std::string dir = TempDir("version");
  const std::string path = dir + "/s.mstate";
  ASSERT_OK(WriteStateFile(path, SomeState(3).Pack(), "j", 3, "k"));
  for (const uint32_t version : {0u, 4u, 77u}) {
    std::string bytes = ReadAll(path);
    std::memcpy(bytes.data() + 8, &version, sizeof(version));
    const std::string p = dir + "/v" + std::to_string(version) + ".mstate";
    WriteAll(p, bytes);
    EXPECT_THAT(ReadStateFile(p, "k").status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("format version " + std::to_string(version))));
  }
}

// Files parked by a malletrain that wrote an earlier format version
// (tests/data/park_state_v1.mstate, written by main at 95f5d68, and
// park_state_v2.mstate, written by main at 897e71e) still resume, and are
// still refused when a byte of them changed or the secret is another.
TEST(StateFileTest, ReadsVersionOneAndTwoFiles) {
  for (const int version : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("version ", version));
    const std::string fixture = absl::StrCat(MALLE_TEST_DATA_DIR, "/park_state_v", version, ".mstate");
    const std::string secret = absl::StrCat("v", version, "-fixture-secret");
    const std::string bytes = ReadAll(fixture);
    ASSERT_GT(bytes.size(), 12000u) << fixture;
    ASSERT_EQ(bytes.substr(8, 4), std::string(1, static_cast<char>(version)) + std::string("\0\0\0", 3));
    for (const int helpers : {-1, 0}) {
      for (const bool direct : {true, false}) {
        StateIoOptions io;
        io.helper_threads = helpers;
        io.direct_io = direct;
        StateFileInfo info;
        absl::StatusOr<PackedState> back = ReadStateFile(fixture, secret, &info, io);
        ASSERT_OK(back.status());
        ExpectSame(*back, SomeState(12, 3000));
        EXPECT_EQ(info.job, absl::StrCat("fixture-v", version));
        EXPECT_EQ(info.step, 12);
        EXPECT_TRUE(info.signed_);
      }
    }
    EXPECT_THAT(ReadStateFile(fixture, "another-secret").status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum mismatch")));
    const std::string dir = TempDir(absl::StrCat("v", version));
    std::string flipped = bytes;
    flipped[bytes.size() - 100] ^= 0x40;
    WriteAll(dir + "/flipped.mstate", flipped);
    EXPECT_THAT(ReadStateFile(dir + "/flipped.mstate", secret).status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum mismatch")));
    WriteAll(dir + "/truncated.mstate", bytes.substr(0, bytes.size() - 1000));
    EXPECT_THAT(ReadStateFile(dir + "/truncated.mstate", secret).status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  }
}

// A reader that passes its own state reads the segments of the same layout
// straight into its flat buffers (no fresh memory, no copy); a segment of
// another layout lands in fresh memory; a corrupt file is still refused.
TEST(StateFileTest, ReadsSegmentsOfTheSameLayoutInPlace) {
  const std::string dir = TempDir("inplace");
  const JobState s = BigFlatState(4, 2.0f);
  const std::string path = dir + "/s.mstate";
  ASSERT_OK(WriteStateFile(path, s.Pack(), "big", 4, ""));

  const JobState mine = BigFlatState(0, 0.0f);  // zeros, same layout
  const PackedState own = mine.Pack();
  ASSERT_EQ(own.buffers.size(), 2u);  // the flat parameters (direct), the packed int64 counter
  const int direct = own.direct[0] ? 0 : 1;
  ASSERT_TRUE(own.direct[direct]);
  StateIoOptions io;
  io.own = &own;
  absl::StatusOr<PackedState> back = ReadStateFile(path, "", nullptr, io);
  ASSERT_OK(back.status());
  int in_place = 0;
  for (size_t i = 0; i < back->buffers.size(); ++i) {
    if (back->buffers[i].data_ptr() == own.buffers[direct].data_ptr()) {
      ++in_place;
      EXPECT_TRUE(back->direct[i]);
    } else {
      EXPECT_FALSE(back->direct[i]);
    }
  }
  EXPECT_EQ(in_place, 1);
  // The reader's own parameters now hold the file's values.
  EXPECT_TRUE(at::equal(mine.parameters[0].tensor, s.parameters[0].tensor));
  EXPECT_TRUE(at::equal(mine.parameters[1].tensor, s.parameters[1].tensor));
  absl::StatusOr<JobState> got = JobState::Unpack(*std::move(back));
  ASSERT_OK(got.status());
  EXPECT_EQ(got->parameters[0].tensor.data_ptr(), mine.parameters[0].tensor.data_ptr());

  // Another layout (a smaller model): nothing is read into it.
  JobState small = SomeState(0);
  const PackedState small_own = small.Pack();
  io.own = &small_own;
  absl::StatusOr<PackedState> fresh = ReadStateFile(path, "", nullptr, io);
  ASSERT_OK(fresh.status());
  for (size_t i = 0; i < fresh->buffers.size(); ++i) EXPECT_FALSE(fresh->direct[i]);

  // A corrupt middle chunk read in place: refused.
  std::string bytes = ReadAll(path);
  bytes[bytes.size() / 2] ^= 0x01;
  WriteAll(path, bytes);
  io.own = &own;
  EXPECT_THAT(ReadStateFile(path, "", nullptr, io).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum mismatch")));
}

TEST(DirParkStoreTest, KeepsTheTwoNewestAndFallsBackWhenTheNewestIsBad) {
  const std::string dir = TempDir("store");
  auto store = DirParkStore::Open({dir, "digits", "k"});
  ASSERT_OK(store.status());
  absl::StatusOr<std::optional<ParkedState>> none = (*store)->ReadNewest();
  ASSERT_OK(none.status());
  EXPECT_FALSE(none->has_value());
  for (int64_t step : {5, 10, 15}) ASSERT_OK((*store)->Write(SomeState(step).Pack(), step));
  absl::StatusOr<std::vector<StateFileInfo>> listed = (*store)->List();
  ASSERT_OK(listed.status());
  ASSERT_EQ(listed->size(), 2u);  // step 5 was removed once 15 was durable
  EXPECT_EQ((*listed)[0].step, 15);
  EXPECT_EQ((*listed)[1].step, 10);

  absl::StatusOr<std::optional<ParkedState>> newest = (*store)->ReadNewest();
  ASSERT_OK(newest.status());
  ASSERT_TRUE(newest->has_value());
  ExpectSame((*newest)->state, SomeState(15));

  // Corrupt the newest: the previous one is used, and the refusal is named.
  std::string bytes = ReadAll((*newest)->path);
  bytes[bytes.size() / 2] ^= 1;
  WriteAll((*newest)->path, bytes);
  std::vector<std::string> refused;
  absl::StatusOr<std::optional<ParkedState>> fallback = (*store)->ReadNewest(&refused);
  ASSERT_OK(fallback.status());
  ASSERT_TRUE(fallback->has_value());
  ExpectSame((*fallback)->state, SomeState(10));
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_THAT(refused[0], HasSubstr("checksum mismatch"));
}

// A write that fails half-way (the disk fills up) returns kResourceExhausted
// and leaves the previous state readable. The full disk is a 256 KiB tmpfs
// mounted in a private mount namespace of a child process (root only).
TEST(DirParkStoreTest, AFullDiskIsAnErrorAndKeepsThePreviousState) {
  const std::string dir = TempDir("full");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0) _exit(77);
    if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(77);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=256k") != 0) _exit(77);
    auto store = DirParkStore::Open({dir + "/job", "j", ""});
    if (!store.ok()) _exit(10);
    if (!(*store)->Write(SomeState(1, 1000).Pack(), 1).ok()) _exit(11);  // 4 KB: fits
    absl::Status full = (*store)->Write(SomeState(2, 100000).Pack(), 2);  // 400 KB: does not
    if (full.code() != absl::StatusCode::kResourceExhausted) _exit(12);
    if (full.message().find("No space left") == std::string::npos) _exit(13);
    auto newest = (*store)->ReadNewest();
    if (!newest.ok() || !newest->has_value() || (*newest)->info.step != 1) _exit(14);
    int files = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir + "/job")) ++files;
    if (files != 1) _exit(15);  // no temporary file left behind
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "cannot mount a tmpfs in a mount namespace (not root)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's check that failed (see the test body)";
}

// A filesystem that refuses O_DIRECT (ramfs; NFS and FUSE mounts may too):
// the write and the read fall back to the page cache, and the file is the
// same. ramfs is mounted in a private mount namespace of a child (root only).
TEST(DirParkStoreTest, WhereODirectIsRefusedTheIoGoesThroughThePageCache) {
  const std::string dir = TempDir("ramfs");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0) _exit(77);
    if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(77);
    if (::mount("ramfs", dir.c_str(), "ramfs", 0, nullptr) != 0) _exit(77);
    const int probe = ::open((dir + "/probe").c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0600);
    if (probe >= 0) _exit(78);  // this kernel's ramfs takes O_DIRECT: nothing to test
    auto store = DirParkStore::Open({dir + "/job", "j", "k"});
    if (!store.ok()) _exit(10);
    const JobState s = BigFlatState(6, 3.0f);  // 48 MB: several I/O chunks
    if (!(*store)->Write(s.Pack(), 6).ok()) _exit(11);
    auto newest = (*store)->ReadNewest();
    if (!newest.ok() || !newest->has_value() || (*newest)->info.step != 6) _exit(12);
    absl::StatusOr<JobState> got = JobState::Unpack(std::move((*newest)->state));
    if (!got.ok() || !at::equal(got->parameters[0].tensor, s.parameters[0].tensor) ||
        !at::equal(got->parameters[1].tensor, s.parameters[1].tensor)) {
      _exit(13);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "cannot mount a ramfs in a mount namespace (not root)";
  if (WEXITSTATUS(status) == 78) GTEST_SKIP() << "this kernel's ramfs accepts O_DIRECT";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's check that failed (see the test body)";
}

// --- the engine ------------------------------------------------------------------------------

// One rank, L = 2, deterministic: a model with a running-mean buffer and a
// float64 counter, Adam, a tracked schedule and a learning-rate decay stepped
// after each FinishStep (what users write). Runs until `stop_after` steps are
// committed (then asks to leave: the last member parks) or the end (12).
struct JobRun {
  std::vector<at::Tensor> state;  // w, mean, count, Adam's exp_avg of w
  int64_t schedule = 0;
  double lr = 0;
  int64_t steps = 0;
  int64_t first_step = -1;
  bool parked = false;
  std::string resumed_from;
  absl::Status status;
};

struct RunSpec {
  std::shared_ptr<ParkStore> store;
  int stop_after = -1;        // RequestLeave once this step committed
  int abandon_after = -1;     // stop driving the engine (an abrupt end) after this step
  int snapshot_every = -1;
  int init_seed = 5;
  int width = 2;              // another model: 3
  std::string save_at_path;   // Save() after step 6
  std::string resume_from;
  int steps = 12;
  absl::Duration step_sleep;  // after each step: a step time the test controls
  std::function<void()> before_leave;  // called just before RequestLeave
};

JobRun TrainJob(const std::string& job, const RunSpec& spec) {
  JobRun out;
  at::Generator data = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor x = at::randn({40, 5}, data, at::TensorOptions());
  at::Generator init = at::make_generator<at::CPUGeneratorImpl>(spec.init_seed);
  at::Tensor w = at::randn({5, spec.width}, init, at::TensorOptions()).set_requires_grad(true);
  at::Tensor mean = at::zeros({5});
  at::Tensor count = at::zeros({}, at::kDouble);
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.05));
  ElasticTrainerOptions o;
  o.logical_workers = 2;
  o.seed = 3;
  o.deterministic = true;
  o.num_samples = 40;
  o.batch_size = 4;
  o.steps = spec.steps;
  o.park_store = spec.store;
  o.snapshot_every = spec.snapshot_every;
  o.resume_from = spec.resume_from;
  auto trainer = ElasticTrainer::Create(comm::ControlStore::InMemory(), GroupOptions(job, "m0", 1), o,
                                        ModelState::FromTensors({w}, {mean, count}), adam);
  if (!trainer.ok()) {
    out.status = trainer.status();
    return out;
  }
  int64_t schedule = 0;
  out.status = (*trainer)->Track(
      "schedule", [&] { return ExtraState{{}, std::to_string(schedule)}; },
      [&](const ExtraState& s) {
        schedule = std::stoll(s.bytes);
        return absl::OkStatus();
      });
  if (!out.status.ok()) return out;
  for (;;) {
    auto plan = (*trainer)->NextStep();
    if (!plan.ok()) {
      out.status = plan.status();
      return out;
    }
    if (!plan->has_value()) break;
    if (out.first_step < 0) out.first_step = (*plan)->step;
    for (size_t i = 0; i < (*plan)->workers.size(); ++i) {
      (*trainer)->BeginMicroBatch(i);
      at::Tensor xb = x.index_select(0, at::tensor((*plan)->workers[i].indices, at::kLong));
      mean.mul_(0.9).add_(xb.mean(0), 0.1);
      count.add_(xb.size(0));
      at::matmul(xb, w).pow(2).mean().backward();
      out.status = (*trainer)->EndMicroBatch();
      if (!out.status.ok()) return out;
    }
    auto committed = (*trainer)->FinishStep();
    if (!committed.ok() || !*committed) {
      out.status = committed.ok() ? absl::InternalError("not committed") : committed.status();
      return out;
    }
    ++schedule;
    adam.param_groups()[0].options().set_lr(adam.param_groups()[0].options().get_lr() * 0.9);
    const int64_t done = (*trainer)->step();
    if (!spec.save_at_path.empty() && done == 6) {
      out.status = (*trainer)->Save(spec.save_at_path);
      if (!out.status.ok()) return out;
    }
    if (done == spec.stop_after) {
      if (spec.before_leave) spec.before_leave();
      (void)(*trainer)->RequestLeave();
    }
    if (done == spec.abandon_after) break;
    absl::SleepFor(spec.step_sleep);
  }
  out.steps = (*trainer)->step();
  out.parked = (*trainer)->parked();
  out.resumed_from = (*trainer)->resumed_from();
  auto& state = adam.state();
  auto it = state.find(w.unsafeGetTensorImpl());
  at::Tensor exp_avg = it == state.end() ? at::Tensor()
                                         : static_cast<torch::optim::AdamParamState&>(*it->second).exp_avg();
  out.state = {w.detach().clone(), mean.clone(), count.clone(), exp_avg.defined() ? exp_avg.clone() : at::Tensor()};
  out.schedule = schedule;
  out.lr = adam.param_groups()[0].options().get_lr();
  return out;
}

void ExpectSameRun(const JobRun& got, const JobRun& want) {
  ASSERT_EQ(got.state.size(), want.state.size());
  EXPECT_TRUE(at::equal(got.state[0], want.state[0])) << "parameters";
  EXPECT_TRUE(at::equal(got.state[1], want.state[1])) << "running mean buffer";
  EXPECT_EQ(got.state[2].item<double>(), want.state[2].item<double>()) << "counter buffer";
  ASSERT_TRUE(got.state[3].defined());
  EXPECT_TRUE(at::equal(got.state[3], want.state[3])) << "Adam's first moment";
  EXPECT_EQ(got.schedule, want.schedule) << "tracked object";
  EXPECT_EQ(got.lr, want.lr) << "learning rate";
  EXPECT_EQ(got.steps, 12);
}

std::shared_ptr<ParkStore> Store(const std::string& dir, const std::string& secret = "") {
  auto s = DirParkStore::Open({dir, "job", secret});
  EXPECT_OK(s.status());
  return s.ok() ? std::shared_ptr<ParkStore>(*std::move(s)) : nullptr;
}

TEST(EngineParkTest, TheLastMemberParksAndANewIncarnationResumesAtTheExactStep) {
  const JobRun clean = TrainJob("clean", {});
  ASSERT_OK(clean.status);
  auto store = Store(TempDir("engine-park"));
  RunSpec first;
  first.store = store;
  first.stop_after = 5;
  const JobRun parked = TrainJob("p1", first);
  ASSERT_OK(parked.status);
  EXPECT_TRUE(parked.parked);
  // The leave is taken at a boundary after the request: where it parked.
  EXPECT_GE(parked.steps, 5);
  EXPECT_LT(parked.steps, 12);
  absl::StatusOr<std::vector<StateFileInfo>> files = store->List();
  ASSERT_OK(files.status());
  ASSERT_EQ(files->size(), 1u);
  EXPECT_EQ((*files)[0].step, parked.steps);

  RunSpec second;
  second.store = store;
  second.init_seed = 99;  // other initial weights: the parked state must win
  const JobRun resumed = TrainJob("p2", second);
  ASSERT_OK(resumed.status);
  EXPECT_EQ(resumed.first_step, parked.steps);
  EXPECT_THAT(resumed.resumed_from, HasSubstr(".mstate"));
  ExpectSameRun(resumed, clean);
}

TEST(EngineParkTest, WithoutAParkStoreTheLastMemberStaysAndKeepsItsProgress) {
  // Leaving would lose the state: the job trains on (whoever asked stops the
  // process at its own deadline; joiners may come and take the state over).
  const JobRun clean = TrainJob("clean", {});
  RunSpec spec;
  spec.stop_after = 5;
  const JobRun r = TrainJob("nopark", spec);
  ASSERT_OK(r.status);
  EXPECT_FALSE(r.parked);
  ExpectSameRun(r, clean);
}

TEST(EngineParkTest, AfterAnAbruptEndTheJobResumesFromItsLastSnapshot) {
  const JobRun clean = TrainJob("clean", {});
  auto store = Store(TempDir("engine-snap"));
  RunSpec first;
  first.store = store;
  first.snapshot_every = 3;
  first.abandon_after = 8;  // snapshots at the boundaries of steps 3 and 6, then it "dies"
  const JobRun died = TrainJob("s1", first);
  ASSERT_OK(died.status);
  EXPECT_FALSE(died.parked);
  RunSpec second;
  second.store = store;
  second.init_seed = 42;
  const JobRun resumed = TrainJob("s2", second);
  ASSERT_OK(resumed.status);
  EXPECT_EQ(resumed.first_step, 6) << "redoes only the steps since the snapshot";
  ExpectSameRun(resumed, clean);
}

TEST(EngineParkTest, SaveAndResumeFromAUsersCheckpoint) {
  const JobRun clean = TrainJob("clean", {});
  const std::string path = TempDir("engine-save") + "/mine.mstate";
  RunSpec first;
  first.save_at_path = path;
  ASSERT_OK(TrainJob("u1", first).status);
  RunSpec second;
  second.resume_from = path;
  second.init_seed = 17;
  const JobRun resumed = TrainJob("u2", second);
  ASSERT_OK(resumed.status);
  EXPECT_EQ(resumed.first_step, 6);
  EXPECT_EQ(resumed.resumed_from, path);
  ExpectSameRun(resumed, clean);

  // A corrupt checkpoint is an error naming it, not a fresh start.
  std::string bytes = ReadAll(path);
  bytes[bytes.size() - 40] ^= 2;
  WriteAll(path, bytes);
  EXPECT_THAT(TrainJob("u3", second).status,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("resume_from: ")));
}

TEST(EngineParkTest, AnotherModelsParkedStateIsRefusedNamingTheMismatch) {
  auto store = Store(TempDir("engine-other"));
  RunSpec first;
  first.store = store;
  first.stop_after = 4;
  ASSERT_OK(TrainJob("o1", first).status);
  RunSpec other;
  other.store = store;
  other.width = 3;
  const JobRun r = TrainJob("o2", other);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model mismatch")));
}

TEST(EngineParkTest, AStoreWhoseOnlyStatesAreForgedIsAnErrorNotAFreshStart) {
  const std::string dir = TempDir("engine-forged");
  RunSpec first;
  first.store = Store(dir, "attacker");
  first.stop_after = 4;
  ASSERT_OK(TrainJob("f1", first).status);
  RunSpec second;
  second.store = Store(dir, "deployment");
  const JobRun r = TrainJob("f2", second);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("none verifies")));
}

// A directory store whose writes take `delay` longer, and which counts them.
// Delays every write by `delay` (with `snapshots_only`, only the writes that
// can be cancelled: the snapshots), honouring a cancel, and records the nice
// value of the thread that writes the snapshots. `burn`: the delay is CPU
// spent (and reported in io.cpu_seconds, as a write's own CPU is), not a sleep.
class SlowStore : public ParkStore {
 public:
  struct Options {
    absl::Duration delay;
    bool snapshots_only = false;
    bool burn = false;
  };
  SlowStore(std::shared_ptr<ParkStore> inner, Options o) : inner_(std::move(inner)), o_(o) {}
  absl::Status Write(const PackedState& state, int64_t step, const StateIoOptions& io) override {
    if (io.cancel != nullptr) {
      snapshot_writer_nice_.store(::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid))));
      snapshot_started_.store(true);
    }
    const int64_t cpu0 = ThreadCpuNs();
    if (!o_.snapshots_only || io.cancel != nullptr) {
      const absl::Time until = absl::Now() + o_.delay;
      while (absl::Now() < until) {
        if (io.cancel != nullptr && io.cancel->load()) {
          ++cancelled_;
          return absl::CancelledError("cancelled while slow");
        }
        if (!o_.burn) absl::SleepFor(absl::Milliseconds(1));
      }
    }
    const double spent = 1e-9 * static_cast<double>(ThreadCpuNs() - cpu0);
    ++writes_;
    absl::Status s = inner_->Write(state, step, io);
    if (io.cpu_seconds != nullptr) *io.cpu_seconds += spent;
    return s;
  }
  absl::StatusOr<std::optional<ParkedState>> ReadNewest(std::vector<std::string>* refused,
                                                        const StateIoOptions& io) override {
    return inner_->ReadNewest(refused, io);
  }
  absl::StatusOr<std::vector<StateFileInfo>> List() override { return inner_->List(); }
  std::string where() const override { return inner_->where(); }
  int writes() const { return writes_.load(); }
  int cancelled() const { return cancelled_.load(); }
  int snapshot_writer_nice() const { return snapshot_writer_nice_.load(); }
  bool snapshot_started() const { return snapshot_started_.load(); }

 private:
  std::shared_ptr<ParkStore> inner_;
  Options o_;
  std::atomic<bool> snapshot_started_{false};
  std::atomic<int> writes_{0};
  std::atomic<int> cancelled_{0};
  std::atomic<int> snapshot_writer_nice_{-100};  // -100: no snapshot written
};

// A park does not wait for a snapshot still being written (at the writer's
// nice 19 that could take long on busy cores): it cancels it and writes its
// newer state; the new incarnation resumes from the park, at its step. The
// snapshot writer runs at nice 19.
TEST(EngineParkTest, AParkCancelsASnapshotStillBeingWritten) {
  const std::string dir = TempDir("engine-cancel");
  auto slow = std::make_shared<SlowStore>(Store(dir), SlowStore::Options{absl::Seconds(60), /*snapshots_only=*/true});
  RunSpec spec;
  spec.store = slow;
  spec.snapshot_every = 0;  // adaptive: the first snapshot at once, none while it is written
  spec.stop_after = 4;
  spec.before_leave = [&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!slow->snapshot_started() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  };
  const absl::Time t0 = absl::Now();
  const JobRun parked = TrainJob("cancel", spec);
  const absl::Duration took = absl::Now() - t0;
  ASSERT_OK(parked.status);
  EXPECT_TRUE(parked.parked);
  EXPECT_LT(took, absl::Seconds(20)) << "the park waited for the snapshot's write";
  EXPECT_EQ(slow->cancelled(), 1);
  EXPECT_EQ(slow->snapshot_writer_nice(), 19);
  RunSpec again;
  again.store = Store(dir);
  const JobRun resumed = TrainJob("cancel", again);
  ASSERT_OK(resumed.status);
  EXPECT_EQ(resumed.first_step, parked.steps) << "resumes from the park, not from the snapshot";
  ExpectSameRun(resumed, TrainJob("cancel-clean", {}));
}

TEST(EngineParkTest, AdaptiveSnapshotsPriceTheWriteBeforeTheSecondOne) {
  // Steps of ~2 ms, writes of 60 ms of CPU, budget 1 %: one snapshot per ~3,000
  // steps. The first snapshot's interval can only price its copy (its write
  // is not done when it is set); the write must be priced once it is over,
  // not after a second snapshot (which came ~30 steps after the first).
  auto slow = std::make_shared<SlowStore>(Store(TempDir("engine-adaptive")),
                                          SlowStore::Options{absl::Milliseconds(60), false, /*burn=*/true});
  RunSpec spec;
  spec.store = slow;
  spec.snapshot_every = 0;
  spec.steps = 120;
  spec.step_sleep = absl::Milliseconds(2);
  const JobRun r = TrainJob("adaptive", spec);
  ASSERT_OK(r.status);
  EXPECT_EQ(r.steps, 120);
  EXPECT_EQ(slow->writes(), 1) << "a second snapshot within 120 steps of ~2 ms: its write was not priced";
}

}  // namespace
}  // namespace malle::elastic
