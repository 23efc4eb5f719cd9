// elastic_group_bench: how long membership changes cost, against restarting.
//
// For each job size n it runs real malle-elastic-worker processes on a
// control store hosted here and measures, --reps times:
//   (a) planned shrink n -> n-1 (RequestLeave): how long the survivors paused
//       (their transition's total_ms), and request -> new generation running;
//   (b) planned grow n-1 -> n (a new process joins): the survivors' pause, and
//       the joiner's own time from spawn to admitted and ready to step;
//   (c) kill -9 of one member: kill -> the survivors' recovered transition,
//       with its detect/agree/build/sync breakdown;
// and, as references in the same run,
//   (d) a restart from scratch of our workers: spawn n -> generation 0 built;
//   (e) a fresh PyTorch job: n `python -c "import torch ...
//       dist.init_process_group('gloo', ...)"` ranks over a TCPStore on
//       loopback, spawn -> all ranks initialised and one allreduce done. This
//       is the least a torchrun-style restart pays, before any checkpoint load.
// Workers use their default heartbeat settings (printed with the table).
//
//   build/dev/tests/bench/elastic_group_bench --sizes 2,4,8 --reps 3
//
// A program, not a test: it prints a table (median and max per row) and
// exits 0, or 1 if a measurement could not be taken. Every wait is bounded;
// every process it starts is stopped by pid.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libmalle/cluster/local_process.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/comm/elastic_group.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, sizes, "2,4,8", "job sizes n, comma-separated");
ABSL_FLAG(int, reps, 3, "repetitions per size");
ABSL_FLAG(int, step_ms, 20, "workers' simulated compute per step");
ABSL_FLAG(int, settle_ms, 300, "steady running between two measured events");
ABSL_FLAG(std::string, workdir, "", "event files and logs (default: a new temp dir)");

namespace {

using malle::cluster::LocalProcess;
using malle::cluster::ProcessSpec;
using nlohmann::json;

const absl::Duration kBound = absl::Seconds(60);  // every wait below

double NowMs() { return absl::ToUnixMicros(absl::Now()) / 1000.0; }

struct Proc {
  std::string id;
  std::string out_path;  // JSON lines
  std::unique_ptr<LocalProcess> process;
  std::streamoff offset = 0;
  std::vector<json> events;
  double spawned_ms = 0;
};

// Reads the complete new lines of `p`'s event file.
void Pump(Proc& p) {
  std::ifstream in(p.out_path);
  if (!in) return;
  in.seekg(p.offset);
  std::string line;
  while (std::getline(in, line) && !in.eof()) {
    p.offset = in.tellg();
    json e = json::parse(line, nullptr, false);
    if (e.is_discarded()) continue;
    if (e.value("ev", "") == "error" || e.value("ev", "") == "mismatch")
      std::cerr << "  [" << p.id << "] " << line << "\n";
    p.events.push_back(std::move(e));
  }
}

std::unique_ptr<Proc> SpawnProc(std::string id, std::string out_path, std::vector<std::string> argv,
                                std::vector<std::pair<std::string, std::string>> env,
                                const std::string& log, bool stdout_is_events) {
  auto p = std::make_unique<Proc>();
  p->id = std::move(id);
  p->out_path = std::move(out_path);
  ProcessSpec spec{std::move(argv), "", log, std::move(env)};
  if (p->out_path != log)
    spec.stdout_path = p->out_path;  // python ranks print their line on stdout
  p->spawned_ms = NowMs();
  auto spawned = LocalProcess::Spawn(spec);
  if (!spawned.ok()) {
    std::cerr << "cannot start " << p->id << ": " << spawned.status() << "\n";
    return nullptr;
  }
  p->process = *std::move(spawned);
  return p;
}

// Polls until every process in `ids` has an event matching `pred` (returns the
// first match of each, in `ids` order) or the bound passes.
std::optional<std::vector<json>> WaitAll(std::map<std::string, std::unique_ptr<Proc>>& procs,
                                         const std::vector<std::string>& ids,
                                         const std::function<bool(const json&)>& pred,
                                         const std::string& what) {
  const absl::Time deadline = absl::Now() + kBound;
  for (;;) {
    std::vector<json> found;
    for (const std::string& id : ids) {
      Proc& p = *procs.at(id);
      Pump(p);
      for (const json& e : p.events)
        if (pred(e)) {
          found.push_back(e);
          break;
        }
    }
    if (found.size() == ids.size()) return found;
    if (absl::Now() > deadline) {
      std::cerr << "TIMEOUT waiting for " << what << "\n";
      return std::nullopt;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// Stops everything in `procs`: waits `bound` for exits, then kills by pid.
void StopAll(std::map<std::string, std::unique_ptr<Proc>>& procs, absl::Duration bound) {
  const absl::Time deadline = absl::Now() + bound;
  for (auto& [id, p] : procs) {
    if (!p->process) continue;
    auto code = p->process->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!code.ok()) {
      std::cerr << "  killing leftover " << id << " (pid " << p->process->pid() << ")\n";
      (void)p->process->Kill(absl::Seconds(5));
    }
  }
}

// Rows of the table in the order first measured, each with its values (ms).
class Samples {
 public:
  std::vector<double>& operator[](const std::string& row) {
    for (auto& [name, v] : rows_)
      if (name == row) return v;
    rows_.push_back({row, {}});
    return rows_.back().second;
  }
  const std::vector<std::pair<std::string, std::vector<double>>>& rows() const { return rows_; }

 private:
  std::vector<std::pair<std::string, std::vector<double>>> rows_;
};

std::vector<std::string> Members(const json& t) {
  return t["members"].get<std::vector<std::string>>();
}
double MaxOf(const std::vector<json>& events, const std::string& key) {
  double m = 0;
  for (const json& e : events) m = std::max(m, e[key].get<double>());
  return m;
}

class Bench {
 public:
  Bench(std::shared_ptr<malle::comm::ControlStore> store, std::string workdir)
      : store_(std::move(store)), workdir_(std::move(workdir)) {}

  // (d) then (a), (b), (c) on one fresh job of n workers.
  bool OurJob(int n, int rep, Samples& s) {
    const std::string job = absl::StrCat("bench-n", n, "-r", rep);
    std::map<std::string, std::unique_ptr<Proc>> procs;
    auto start = [&](const std::string& id, int bootstrap) {
      const std::string base = absl::StrCat(workdir_, "/", job, "-", id);
      auto p = SpawnProc(
          id, base + ".jsonl",
          {MALLE_WORKER_PATH, absl::StrCat("--store=127.0.0.1:", store_->port()), "--job=" + job,
           "--member=" + id, absl::StrCat("--bootstrap=", bootstrap),
           absl::StrCat("--step_ms=", absl::GetFlag(FLAGS_step_ms)), "--events=" + base + ".jsonl"},
          {}, base + ".log", /*stdout_is_events=*/false);
      if (p) procs[id] = std::move(p);
      return procs.count(id) > 0;
    };
    auto transition = [](int64_t after_gen, std::function<bool(const json&)> also) {
      return [after_gen, also](const json& e) {
        return e.value("ev", "") == "transition" && e["gen"].get<int64_t>() > after_gen && also(e);
      };
    };
    const auto settle = [] { absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_settle_ms))); };
    bool ok = false;
    std::optional<double> boot_ms;  // (d), listed after (c)
    do {
      std::vector<std::string> ids;
      for (int i = 0; i < n; ++i) ids.push_back(absl::StrCat("w", i));
      const double t0 = NowMs();
      for (const auto& id : ids)
        if (!start(id, n)) break;
      auto boot =
          WaitAll(procs, ids, transition(-1, [](const json&) { return true; }), job + " bootstrap");
      if (!boot) break;
      boot_ms = MaxOf(*boot, "t_ms") - t0;
      std::vector<std::string> members = Members((*boot)[0]);
      int64_t gen = (*boot)[0]["gen"];

      // (a) planned shrink: the newest rank leaves.
      settle();
      const std::string leaver = members.back();
      std::vector<std::string> survivors(members.begin(), members.end() - 1);
      double t = NowMs();
      if (!malle::comm::ElasticGroup::RequestLeave(*store_, job, leaver).ok()) break;
      auto shrunk = WaitAll(procs, survivors, transition(gen, [](const json&) { return true; }),
                            job + " shrink");
      if (!shrunk) break;
      s["(a) planned shrink n->n-1: survivors' pause"].push_back(MaxOf(*shrunk, "total_ms"));
      s["(a) planned shrink: request -> new gen running"].push_back(MaxOf(*shrunk, "t_ms") - t);
      gen = (*shrunk)[0]["gen"];
      members = Members((*shrunk)[0]);

      // (b) planned grow: a new process joins the running job.
      settle();
      const std::string joiner = absl::StrCat("w", n + 1);
      if (!start(joiner, 0)) break;
      std::vector<std::string> all = members;
      all.push_back(joiner);
      auto grown =
          WaitAll(procs, all,
                  transition(gen, [&](const json& e) { return Members(e).size() == all.size(); }),
                  job + " grow");
      if (!grown) break;
      grown->pop_back();  // the joiner's own event
      s["(b) planned grow n-1->n: survivors' pause"].push_back(MaxOf(*grown, "total_ms"));
      const json joined =
          WaitAll(procs, {joiner}, transition(gen, [](const json&) { return true; }), "")->at(0);
      s["(b) planned grow: joiner spawn -> admitted, ready"].push_back(
          joined["t_ms"].get<double>() - procs[joiner]->spawned_ms);
      gen = joined["gen"];
      members = Members(joined);

      // (c) kill -9 of a member in the middle of the ring (never the leader).
      settle();
      const std::string victim = members[members.size() / 2];
      std::vector<std::string> rest;
      for (const auto& m : members)
        if (m != victim) rest.push_back(m);
      t = NowMs();
      if (!procs[victim]->process->Signal(SIGKILL).ok()) break;
      auto recovered = WaitAll(procs, rest,
                               transition(gen,
                                          [&](const json& e) {
                                            auto m = Members(e);
                                            return std::find(m.begin(), m.end(), victim) == m.end();
                                          }),
                               job + " recovery");
      if (!recovered) break;
      s["(c) kill -9: kill -> survivors recovered"].push_back(MaxOf(*recovered, "t_ms") - t);
      const json& lead = (*recovered)[0];
      if (lead.value("kind", "") != "recovered")
        std::cerr << "  note: " << job << " recovery came as " << lead.dump() << "\n";
      for (const char* phase : {"detect", "agree", "build", "sync"})
        s[absl::StrCat("    (c) of which ", phase, " (leader)")].push_back(
            lead.value(absl::StrCat(phase, "_ms"), std::nan("")));
      ok = true;
    } while (false);
    if (boot_ms) s["(d) restart from scratch, ours: spawn -> gen 0 built"].push_back(*boot_ms);
    (void)store_->WithPrefix(malle::comm::JobPrefix(job))->Set("ctl/stop", "1");
    StopAll(procs, absl::Seconds(10));
    return ok;
  }

  // (e) n fresh Python ranks: import torch, init Gloo over a TCPStore, one allreduce.
  bool TorchJob(int n, int rep, Samples& s) {
    static const char* kScript = R"(
import os, time, json, datetime
t0 = time.time()
import torch, torch.distributed as dist
t1 = time.time()
r, n = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
tcp = dist.TCPStore('127.0.0.1', int(os.environ['MASTER_PORT']), n, False, datetime.timedelta(seconds=60))
store = dist.PrefixStore(os.environ['MALLE_PREFIX'], tcp)
dist.init_process_group('gloo', store=store, rank=r, world_size=n, timeout=datetime.timedelta(seconds=60))
x = torch.ones(1024)
dist.all_reduce(x)
assert x[0].item() == n
print(json.dumps({'ev': 'ready', 't_ms': time.time() * 1000, 'import_ms': (t1 - t0) * 1000}), flush=True)
dist.destroy_process_group()
)";
    std::map<std::string, std::unique_ptr<Proc>> procs;
    std::vector<std::string> ids;
    const double t0 = NowMs();
    for (int r = 0; r < n; ++r) {
      const std::string id = absl::StrCat("py", r);
      const std::string base = absl::StrCat(workdir_, "/torch-n", n, "-r", rep, "-", id);
      auto p = SpawnProc(id, base + ".jsonl", {MALLE_PYTHON, "-c", kScript},
                         {{"RANK", absl::StrCat(r)},
                          {"WORLD_SIZE", absl::StrCat(n)},
                          {"MASTER_PORT", absl::StrCat(store_->port())},
                          {"MALLE_PREFIX", absl::StrCat("torch/n", n, "/r", rep, "/")},
                          {"GLOO_SOCKET_IFNAME", "lo"},
                          {"OMP_NUM_THREADS", "1"}},
                         base + ".log", /*stdout_is_events=*/true);
      if (!p) break;
      procs[id] = std::move(p);
      ids.push_back(id);
    }
    auto ready = ids.size() == static_cast<size_t>(n)
                     ? WaitAll(
                           procs, ids, [](const json& e) { return e.value("ev", "") == "ready"; },
                           absl::StrCat("torch n=", n))
                     : std::nullopt;
    if (ready) {
      s["(e) restart from scratch, torch: spawn -> init+allreduce"].push_back(
          MaxOf(*ready, "t_ms") - t0);
      s["    (e) of which import torch (slowest rank)"].push_back(MaxOf(*ready, "import_ms"));
    }
    StopAll(procs, absl::Seconds(30));
    return ready.has_value();
  }

 private:
  std::shared_ptr<malle::comm::ControlStore> store_;
  std::string workdir_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : (v[k - 1] + v[k]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int> sizes;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 2) {
      std::cerr << "--sizes: every size must be an integer >= 2, got '" << part << "'\n";
      return 2;
    }
    sizes.push_back(n);
  }
  std::string workdir = absl::GetFlag(FLAGS_workdir);
  if (workdir.empty()) {
    char tmpl[] = "/tmp/malle-bench-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return 1;
    workdir = tmpl;
  }
  auto store = malle::comm::ControlStore::Host("127.0.0.1", 0);
  if (!store.ok()) {
    std::cerr << "cannot host the control store: " << store.status() << "\n";
    return 1;
  }
  const malle::comm::ElasticGroupOptions defaults;
  std::cout << "elastic_group_bench: reps " << absl::GetFlag(FLAGS_reps) << ", step "
            << absl::GetFlag(FLAGS_step_ms) << " ms, worker defaults: heartbeat "
            << absl::FormatDuration(defaults.heartbeat_interval) << ", heartbeat timeout "
            << absl::FormatDuration(defaults.heartbeat_timeout) << ", recovery grace "
            << absl::FormatDuration(defaults.recovery_grace) << "; files in " << workdir << "\n";
  Bench bench(*store, workdir);
  bool ok = true;
  for (int n : sizes) {
    Samples s;
    for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
      ok = bench.OurJob(n, rep, s) && ok;
      ok = bench.TorchJob(n, rep, s) && ok;
      std::cerr << "  n=" << n << " rep " << rep << " done\n";
    }
    const auto& torch = s["(e) restart from scratch, torch: spawn -> init+allreduce"];
    const double restart = torch.empty() ? 0 : Median(torch);
    std::cout << absl::StrFormat("\nn = %d ranks (%d reps)\n  %-55s %10s %10s %14s\n", n,
                                 absl::GetFlag(FLAGS_reps), "", "median ms", "max ms",
                                 "torch restart/x");
    for (const auto& [row, v] : s.rows()) {
      if (v.empty()) continue;
      const double median = Median(v);
      const bool ours = row[1] != ' ' && row.find("restart") == std::string::npos;
      std::cout << absl::StrFormat("  %-55s %10.1f %10.1f", row, median,
                                   *std::max_element(v.begin(), v.end()));
      if (ours && restart > 0 && median > 0)
        std::cout << absl::StrFormat(" %13.0fx", restart / median);
      std::cout << "\n";
    }
  }
  std::cout << (ok ? "\nall measurements taken\n" : "\nSOME MEASUREMENTS FAILED (see stderr)\n");
  return ok ? 0 : 1;
}
