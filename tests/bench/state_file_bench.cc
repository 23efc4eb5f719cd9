// State files (park_store.h) against the disk floor, in one process, side by
// side: how each way of doing the I/O compares with a plain write + fsync and
// a plain read of the same bytes, measured in the same run, in rotating order.
//
//   build/ci/tests/bench/state_file_bench [--mb=252] [--reps=5] [--dir=build] [--versions=2,3]
//
// The state is three float32 segments of mb/3 each (the resize_bench model's
// parameters, exp_avg and exp_avg_sq), signed with a secret. For every rep:
//
// * floor write: the same bytes, write() in 64 MiB pieces + fsync (park_bench's
//   floor, here from the segments' own memory);
// * WriteStateFile with O_DIRECT or through the page cache, with the default
//   helpers or none (a snapshot's setting), in each format version of
//   --versions (2: SHA-256 chunk digests; 3: AES-256-GMAC chunk tags);
// * floor read, cold: the floor file's pages evicted (posix_fadvise DONTNEED),
//   read() in 64 MiB pieces into fresh memory (as a new process lands a state);
// * ReadStateFile, cold, into fresh memory (a new incarnation's optimizer
//   state) or in place (`own`: its parameters), each way; and warm (the page
//   cache holds the file).
//
// Each line: median seconds (min-max), median of the per-rep ratios to the
// floor of the same rep, and the process's CPU seconds per call (user + sys,
// all threads): on a shared machine the CPU a way takes is what competes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libmalle/elastic/park_store.h"
#include "libmalle/elastic/state_pack.h"

ABSL_FLAG(int, mb, 252, "state size in MB (three float32 segments)");
ABSL_FLAG(int, reps, 5, "repetitions, in rotating order");
ABSL_FLAG(std::string, dir, "build", "directory on the disk to measure");
ABSL_FLAG(bool, reads, true, "measure reads");
ABSL_FLAG(bool, writes, true, "measure writes");
ABSL_FLAG(std::string, only, "", "run only the ways whose name contains this (and the floor)");
ABSL_FLAG(std::vector<std::string>, versions, {"3"}, "format versions to write and read, side by side (2, 3)");

namespace {

using malle::elastic::PackedState;
using malle::elastic::ReadStateFile;
using malle::elastic::StateIoOptions;
using malle::elastic::WriteStateFile;

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double CpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::string g_dir;  // removed on the way out, whatever happens

void Die(const std::string& what) {
  std::fprintf(stderr, "state_file_bench: %s\n", what.c_str());
  if (!g_dir.empty()) std::filesystem::remove_all(g_dir);
  std::exit(1);
}

void Evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) Die("cannot open " + path);
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void WarmUp(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  std::vector<char> buf(64 << 20);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
}

constexpr size_t kFloorPiece = size_t{64} << 20;

void FloorWrite(const std::string& path, const PackedState& s) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) Die("cannot create " + path);
  for (const at::Tensor& b : s.buffers) {
    const char* p = static_cast<const char*>(b.data_ptr());
    const size_t n = static_cast<size_t>(b.nbytes());
    for (size_t off = 0; off < n;) {
      const ssize_t w = ::write(fd, p + off, std::min(kFloorPiece, n - off));
      if (w <= 0) Die("floor write failed");
      off += static_cast<size_t>(w);
    }
  }
  if (::fsync(fd) != 0) Die("floor fsync failed");
  ::close(fd);
}

void FloorRead(const std::string& path, size_t n) {
  char* dst = static_cast<char*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  const int fd = ::open(path.c_str(), O_RDONLY);
  for (size_t off = 0; off < n;) {
    const ssize_t r = ::read(fd, dst + off, std::min(kFloorPiece, n - off));
    if (r <= 0) Die("floor read failed");
    off += static_cast<size_t>(r);
  }
  ::close(fd);
  ::munmap(dst, n);
}

struct Result {
  std::vector<double> seconds, ratio, cpu;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t seg_floats = int64_t{absl::GetFlag(FLAGS_mb)} * 1000 * 1000 / 4 / 3;
  const std::string dir = std::filesystem::absolute(absl::GetFlag(FLAGS_dir)).string() +
                          absl::StrFormat("/state_file_bench.%d", ::getpid());
  std::filesystem::create_directories(dir);
  g_dir = dir;
  const std::string secret = "bench-secret";

  // The state: three segments, packed by hand (one record per segment).
  malle::elastic::StatePacker packer(/*direct_min_bytes=*/1);
  std::vector<at::Tensor> segs;
  for (int i = 0; i < 3; ++i) segs.push_back(at::arange(seg_floats, at::kFloat).mul_(static_cast<float>(i + 1)));
  for (const at::Tensor& t : segs) packer.PutTensor(t);
  const PackedState state = std::move(packer).Finish();
  size_t bytes = 0;  // the floor file's: the segments
  for (const at::Tensor& b : state.buffers) bytes += static_cast<size_t>(b.nbytes());
  // In-place targets: the same layout, touched memory (a model's parameters).
  malle::elastic::StatePacker own_packer(1);
  std::vector<at::Tensor> own_segs;
  for (int i = 0; i < 3; ++i) own_segs.push_back(at::arange(seg_floats, at::kFloat));
  for (const at::Tensor& t : own_segs) own_packer.PutTensor(t);
  const PackedState own = std::move(own_packer).Finish();

  const std::string floor_path = dir + "/floor.bin";
  std::vector<uint32_t> versions;
  for (const std::string& v : absl::GetFlag(FLAGS_versions)) {
    if (v != "2" && v != "3") Die("--versions: " + v + " is not 2 or 3");
    versions.push_back(static_cast<uint32_t>(std::stoi(v)));
  }
  if (versions.empty()) Die("--versions: none given");
  auto state_path = [&](uint32_t v) { return absl::StrCat(dir, "/state.v", v, ".mstate"); };

  struct Way {
    std::string name;
    bool direct;
    int helpers;
    uint32_t version;
  };
  std::vector<Way> ways;
  for (const uint32_t v : versions) {
    const std::string tag = versions.size() > 1 ? absl::StrCat("v", v, ", ") : "";
    ways.push_back({tag + "O_DIRECT, helpers auto", true, -1, v});
    ways.push_back({tag + "O_DIRECT, no helper (snapshot)", true, 0, v});
    ways.push_back({tag + "page cache, helpers auto", false, -1, v});
    ways.push_back({tag + "page cache, no helper", false, 0, v});
  }
  std::map<std::string, Result> res;
  std::vector<std::string> order;
  auto add = [&](const std::string& name, double s, double floor, double cpu) {
    if (!res.count(name)) order.push_back(name);
    res[name].seconds.push_back(s);
    res[name].ratio.push_back(s / floor);
    res[name].cpu.push_back(cpu);
  };
  double load[3] = {};
  ::getloadavg(load, 3);
  const double load0 = load[0];
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int r = 0; r < reps; ++r) {
    if (absl::GetFlag(FLAGS_writes)) {
      // Writes: the floor, then each way, in rotating order.
      double c0 = CpuSeconds(), t0 = Now();
      FloorWrite(floor_path, state);
      const double floor_w = Now() - t0;
      add("floor: write + fsync (64 MiB pieces)", floor_w, floor_w, CpuSeconds() - c0);
      for (size_t i = 0; i < ways.size(); ++i) {
        const Way& w = ways[(i + static_cast<size_t>(r)) % ways.size()];
        if (w.name.find(absl::GetFlag(FLAGS_only)) == std::string::npos) continue;
        StateIoOptions io;
        io.direct_io = w.direct;
        io.helper_threads = w.helpers;
        io.write_version = w.version;
        std::filesystem::remove(state_path(w.version));
        c0 = CpuSeconds();
        t0 = Now();
        absl::Status s = WriteStateFile(state_path(w.version), state, "bench", 1, secret, io);
        const double took = Now() - t0;
        if (!s.ok()) Die(s.ToString());
        add("write " + w.name, took, floor_w, CpuSeconds() - c0);
      }
    }
    if (absl::GetFlag(FLAGS_reads)) {
      for (const uint32_t v : versions) {
        if (!std::filesystem::exists(state_path(v))) Die("no state file: run with --writes");
      }
      if (!std::filesystem::exists(floor_path)) FloorWrite(floor_path, state);
      Evict(floor_path);
      double c0 = CpuSeconds(), t0 = Now();
      FloorRead(floor_path, bytes);
      const double floor_r = Now() - t0;
      add("floor: read, cold (64 MiB pieces, fresh memory)", floor_r, floor_r, CpuSeconds() - c0);
      // Each way of reading, and per version an in-place cold read and a warm one.
      const size_t n_reads = ways.size() + 2 * versions.size();
      for (size_t i = 0; i < n_reads; ++i) {
        const size_t k = (i + static_cast<size_t>(r)) % n_reads;
        StateIoOptions io;
        std::string name;
        bool warm = false;
        uint32_t v = 0;
        if (k < ways.size()) {
          io.direct_io = ways[k].direct;
          io.helper_threads = ways[k].helpers;
          v = ways[k].version;
          name = "read cold, fresh memory, " + ways[k].name;
        } else {
          const size_t e = k - ways.size();
          v = versions[e / 2];
          const std::string tag = versions.size() > 1 ? absl::StrCat("v", v, ", ") : "";
          if (e % 2 == 0) {
            io.own = &own;
            name = "read cold, in place, " + tag + "default";
          } else {
            warm = true;
            name = "read warm, fresh memory, " + tag + "default";
          }
        }
        if (name.find(absl::GetFlag(FLAGS_only)) == std::string::npos) continue;
        if (warm) {
          WarmUp(state_path(v));
        } else {
          Evict(state_path(v));
        }
        c0 = CpuSeconds();
        t0 = Now();
        absl::StatusOr<PackedState> back = ReadStateFile(state_path(v), secret, nullptr, io);
        const double took = Now() - t0;
        if (!back.ok()) Die(back.status().ToString());
        add(name, took, floor_r, CpuSeconds() - c0);
      }
    }
    std::fprintf(stderr, "rep %d/%d done\n", r + 1, reps);
  }
  ::getloadavg(load, 3);
  std::printf("state_file_bench: %.0f MB, %d reps, load %.1f -> %.1f, %s\n", bytes / 1e6, reps, load0, load[0],
              dir.c_str());
  std::printf("%-56s %8s %17s %8s %8s\n", "", "median s", "min-max", "/ floor", "CPU s");
  for (const std::string& name : order) {
    const Result& x = res[name];
    std::printf("%-56s %8.3f %8.3f-%8.3f %7.2fx %8.3f\n", name.c_str(), Median(x.seconds),
                *std::min_element(x.seconds.begin(), x.seconds.end()),
                *std::max_element(x.seconds.begin(), x.seconds.end()), Median(x.ratio), Median(x.cpu));
  }
  std::filesystem::remove_all(dir);
  return 0;
}
