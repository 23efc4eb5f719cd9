// elastic_group_demo: a local elastic job whose ranks leave, join and fail
// while it trains, watched from the outside.
//
// Hosts the control store, starts 4 malle-elastic-worker processes (synthetic
// ranks whose every allreduce result is checked) and drives a schedule while
// they compute: a planned leave, a join, a kill -9, two joins, a planned
// shrink to 2. It prints each event and each transition as the job's leader
// (rank 0) reports it, then stops the job and checks that every finishing
// rank holds the same model checksum and member list.
//
//   build/dev/examples/elastic_group_demo [--workdir DIR] [--pause_ms 1500]
//
// Exit code 0 (OK) or 1 (FAILED). Every wait is bounded; every process it
// starts is stopped by pid before it returns.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "libmalle/cluster/local_process.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/comm/elastic_group.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, workdir, "",
          "where event files and worker logs go (default: a new temp dir)");
ABSL_FLAG(int, pause_ms, 1500, "pause between schedule events");

namespace {

using malle::cluster::LocalProcess;
using malle::cluster::ProcessSpec;
using nlohmann::json;

const absl::Time kStart = absl::Now();
const absl::Duration kWait = absl::Seconds(30);  // bound for every wait below

std::string Stamp() {
  return absl::StrFormat("[%7.3fs]", absl::ToDoubleSeconds(absl::Now() - kStart));
}

struct Worker {
  std::string id;
  std::string events_path;
  std::unique_ptr<LocalProcess> process;
  std::streamoff offset = 0;
  std::vector<json> events;
  std::optional<int> exit_code;
};

class Demo {
 public:
  Demo(std::shared_ptr<malle::comm::ControlStore> store, std::string workdir)
      : store_(std::move(store)), workdir_(std::move(workdir)) {}

  bool Start(const std::string& id, int bootstrap) {
    auto w = std::make_unique<Worker>();
    w->id = id;
    w->events_path = absl::StrCat(workdir_, "/", id, ".jsonl");
    ProcessSpec spec;
    spec.argv = {MALLE_WORKER_PATH,
                 absl::StrCat("--store=127.0.0.1:", store_->port()),
                 "--job=demo",
                 absl::StrCat("--member=", id),
                 absl::StrCat("--bootstrap=", bootstrap),
                 "--step_ms=20",
                 absl::StrCat("--events=", w->events_path)};
    spec.stdout_path = spec.stderr_path = absl::StrCat(workdir_, "/", id, ".log");
    auto p = malle::cluster::LocalProcess::Spawn(spec);
    if (!p.ok()) {
      std::cout << Stamp() << " cannot start " << id << ": " << p.status() << "\n";
      return false;
    }
    w->process = *std::move(p);
    std::cout << Stamp() << " started " << id << " (pid " << w->process->pid() << ")\n";
    workers_.push_back(std::move(w));
    return true;
  }

  Worker* Find(const std::string& id) {
    for (auto& w : workers_)
      if (w->id == id) return w.get();
    return nullptr;
  }

  // Reads new event lines and reaps exits; prints what a reader wants to see.
  void Pump() {
    for (auto& w : workers_) {
      std::ifstream in(w->events_path);
      if (in) {
        in.seekg(w->offset);
        std::string line;
        while (std::getline(in, line) && !in.eof()) {  // complete lines only
          w->offset = in.tellg();
          json e = json::parse(line, nullptr, /*allow_exceptions=*/false);
          if (e.is_discarded()) continue;
          w->events.push_back(e);
          Print(*w, e);
        }
      }
      if (!w->exit_code && w->process) {
        w->exit_code = w->process->Poll();
        if (w->exit_code)
          std::cout << Stamp() << " " << w->id << " exited with code " << *w->exit_code << "\n";
      }
    }
  }

  void Print(const Worker& w, const json& e) {
    const std::string ev = e.value("ev", "");
    if (ev == "transition" && e.value("rank", -1) == 0) {
      leader_.push_back(e);
      std::vector<std::string> changes;
      for (const auto& m : e["joined"]) changes.push_back("+" + m.get<std::string>());
      for (const auto& m : e["removed"]) changes.push_back("-" + m.get<std::string>());
      std::cout << Stamp()
                << absl::StrFormat(
                       "   leader %s: gen %d %-9s size %d [%s] %s resume step %d | agree %.1f "
                       "build %.1f sync %.1f "
                       "total %.1f ms\n",
                       w.id, e["gen"].get<int64_t>(), e["kind"].get<std::string>(),
                       e["size"].get<int>(),
                       absl::StrJoin(e["members"].get<std::vector<std::string>>(), " "),
                       absl::StrJoin(changes, " "), e["resume"].get<int64_t>(),
                       e["agree_ms"].get<double>(), e["build_ms"].get<double>(),
                       e["sync_ms"].get<double>(), e["total_ms"].get<double>());
    } else if (ev == "transition" &&
               (e["kind"] == "joined" || e["kind"] == "left" || e["kind"] == "excluded")) {
      std::cout << Stamp() << "   " << w.id << " " << e["kind"].get<std::string>() << " at gen "
                << e["gen"] << "\n";
    } else if (ev == "error" || ev == "mismatch") {
      std::cout << Stamp() << "   " << w.id << " " << ev << ": " << e.dump() << "\n";
    }
  }

  // Pumps until `done()` holds or the bound passes.
  bool Until(const std::function<bool()>& done, absl::Duration bound, const std::string& what) {
    const absl::Time deadline = absl::Now() + bound;
    for (;;) {
      Pump();
      if (done()) return true;
      if (absl::Now() > deadline) {
        if (!what.empty()) std::cout << Stamp() << " TIMEOUT waiting for " << what << "\n";
        return false;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  void Sleep(absl::Duration d) {
    Until([] { return false; }, d, "");  // keeps printing while it waits
  }
  // Waits for a leader transition after the current one whose members satisfy `pred`.
  bool UntilMembers(const std::function<bool(const std::vector<std::string>&)>& pred,
                    const std::string& what) {
    return Until([&] { return !leader_.empty() && pred(Members()); }, kWait, what);
  }
  std::vector<std::string> Members() const {
    return leader_.empty() ? std::vector<std::string>{}
                           : leader_.back()["members"].get<std::vector<std::string>>();
  }

  std::vector<std::unique_ptr<Worker>>& workers() { return workers_; }
  const std::vector<json>& leader() const { return leader_; }

 private:
  std::shared_ptr<malle::comm::ControlStore> store_;
  std::string workdir_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<json> leader_;  // transitions seen by rank 0, in order
};

bool Has(const std::vector<std::string>& v, const std::string& m) {
  return std::find(v.begin(), v.end(), m) != v.end();
}

int RunDemo() {
  std::string workdir = absl::GetFlag(FLAGS_workdir);
  if (workdir.empty()) {
    char tmpl[] = "/tmp/malle-demo-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return 1;
    workdir = tmpl;
  }
  const absl::Duration pause = absl::Milliseconds(absl::GetFlag(FLAGS_pause_ms));
  auto store = malle::comm::ControlStore::Host("127.0.0.1", 0);
  if (!store.ok()) {
    std::cout << "cannot host the control store: " << store.status() << "\n";
    return 1;
  }
  std::cout << Stamp() << " control store on 127.0.0.1:" << (*store)->port() << ", files in "
            << workdir << "\n";
  Demo demo(*store, workdir);
  bool ok = true;
  auto step = [&](bool result) {
    ok = ok && result;
    return ok;
  };

  for (int i = 0; i < 4 && ok; ++i) step(demo.Start(absl::StrCat("w", i), 4));
  step(ok && demo.UntilMembers([](const auto& m) { return m.size() == 4; }, "generation 0 of 4"));

  if (ok) {
    demo.Sleep(pause);
    std::cout << Stamp() << " EVENT planned leave of w1\n";
    absl::Status s = malle::comm::ElasticGroup::RequestLeave(**store, "demo", "w1");
    step(s.ok() && demo.UntilMembers([](const auto& m) { return !Has(m, "w1"); }, "w1 to leave"));
  }
  if (ok) {
    demo.Sleep(pause);
    std::cout << Stamp() << " EVENT w4 joins the running job\n";
    step(demo.Start("w4", 0) &&
         demo.UntilMembers([](const auto& m) { return Has(m, "w4"); }, "w4 to join"));
  }
  if (ok) {
    demo.Sleep(pause);
    Worker* victim = demo.Find("w2");
    std::cout << Stamp() << " EVENT kill -9 w2 (pid " << victim->process->pid() << ")\n";
    step(victim->process->Signal(SIGKILL).ok() &&
         demo.UntilMembers([](const auto& m) { return !Has(m, "w2"); },
                           "recovery from w2's failure"));
  }
  if (ok) {
    demo.Sleep(pause);
    std::cout << Stamp() << " EVENT w5 and w6 join\n";
    step(demo.Start("w5", 0) && demo.Start("w6", 0) &&
         demo.UntilMembers([](const auto& m) { return Has(m, "w5") && Has(m, "w6"); },
                           "w5 and w6 to join"));
  }
  if (ok) {
    demo.Sleep(pause);
    const std::vector<std::string> members = demo.Members();
    std::cout << Stamp() << " EVENT planned shrink to 2: leave of";
    for (size_t i = 2; i < members.size(); ++i) {
      std::cout << " " << members[i];
      step(malle::comm::ElasticGroup::RequestLeave(**store, "demo", members[i]).ok());
    }
    std::cout << "\n";
    step(demo.UntilMembers([](const auto& m) { return m.size() == 2; }, "the shrink to 2"));
  }
  if (ok) demo.Sleep(pause);

  std::cout << Stamp() << " EVENT stop\n";
  (void)(*store)->WithPrefix(malle::comm::JobPrefix("demo"))->Set("ctl/stop", "1");
  step(demo.Until(
      [&] {
        for (auto& w : demo.workers())
          if (!w->exit_code) return false;
        return true;
      },
      kWait, "every worker to exit"));
  for (auto& w : demo.workers()) {
    if (!w->exit_code) {
      std::cout << Stamp() << " killing leftover " << w->id << " (pid " << w->process->pid()
                << ")\n";
      auto code = w->process->Kill(absl::Seconds(5));
      w->exit_code = code.ok() ? *code : -1;
    }
  }

  // Every rank that finished must hold the same state and agree on the group.
  std::optional<json> reference;
  int finished = 0;
  for (auto& w : demo.workers()) {
    const bool killed = w->id == "w2";
    const int expected_code = killed ? 128 + SIGKILL : 0;
    if (w->exit_code != expected_code) {
      std::cout << "CHECK " << w->id << " exit code " << w->exit_code.value_or(-1) << ", expected "
                << expected_code << " (log: " << workdir << "/" << w->id << ".log)\n";
      ok = false;
    }
    for (const json& e : w->events) {
      if (e.value("ev", "") != "done" || e.value("how", "") != "finished") continue;
      ++finished;
      if (!reference) reference = e;
      if (e["checksum"] != (*reference)["checksum"] || e["members"] != (*reference)["members"]) {
        std::cout << "CHECK " << w->id << " finished with " << e.dump() << ", but another with "
                  << reference->dump() << "\n";
        ok = false;
      }
    }
  }
  if (finished != 2) {
    std::cout << "CHECK " << finished << " workers finished, expected 2\n";
    ok = false;
  }

  std::cout << "\n gen  size  cause       removed/joined          total ms\n";
  for (const json& e : demo.leader()) {
    std::vector<std::string> changes;
    for (const auto& m : e["joined"]) changes.push_back("+" + m.get<std::string>());
    for (const auto& m : e["removed"]) changes.push_back("-" + m.get<std::string>());
    std::cout << absl::StrFormat(" %3d  %4d  %-10s  %-22s  %8.1f\n", e["gen"].get<int64_t>(),
                                 e["size"].get<int>(), e["kind"].get<std::string>(),
                                 absl::StrJoin(changes, " "), e["total_ms"].get<double>());
  }
  if (reference) {
    std::cout << "\nfinal: members ["
              << absl::StrJoin((*reference)["members"].get<std::vector<std::string>>(), " ")
              << "], " << (*reference)["steps"] << " steps, checksum " << (*reference)["checksum"]
              << "\n";
  }
  std::cout << (ok ? "OK" : "FAILED") << "  (events and logs in " << workdir << ")\n";
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return RunDemo();
}
