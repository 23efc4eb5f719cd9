// malle-elastic-worker: one synthetic training rank of an elastic job.
//
// Used by the elastic-group demo, the multi-process tests and the benchmark.
// Each step it allreduces a tensor whose exact sum it can predict from the
// generation's member list, so every generation's result is checked; its
// "model state" is a running checksum that must come out the same on every
// member whatever the resizes and failures were. It reports what happens as
// JSON lines (one object per line) on --events (default: stdout).
//
// Stopping is agreed, like everything else that decides which collectives a
// member runs: a member that sees the job's stop key (`ctl/stop`, checked
// before each step) carries a flag in that step's allreduce, and every member
// stops after the first step whose result has the flag set. Members that read
// the key at different moments therefore still run the same steps; one that
// just walked away would leave the others' allreduce to fail, and they would
// recover into a generation without it.
//
//   malle-elastic-worker --store 127.0.0.1:29400 --job demo --member w0 --bootstrap 4
//
// Exit codes: 0 finished or left on request, 1 error, 2 bad flags,
// 3 wrong allreduce result, 4 excluded from the job (declared failed).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libmalle/base/log.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/comm/elastic_group.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, store, "", "control store HOST:PORT (required)");
ABSL_FLAG(std::string, job, "", "job id (required)");
ABSL_FLAG(std::string, member, "", "member id; must end in a number, e.g. w3 (required)");
ABSL_FLAG(int, bootstrap, 0, "form generation 0 with this many members (0 = join a running job)");
ABSL_FLAG(int64_t, steps, 0, "stop after this many steps (0 = until the job's stop key is set)");
ABSL_FLAG(int, step_ms, 5, "simulated compute per step, in milliseconds");
ABSL_FLAG(int64_t, numel, 1024, "float32 elements allreduced per step");
ABSL_FLAG(int64_t, die_at_step, -1, "SIGKILL itself in the middle of this step's allreduce");
ABSL_FLAG(int64_t, leave_at_step, -1, "request to leave after committing this step");
ABSL_FLAG(int64_t, stop_at_step, -1,
          "act as if this member alone saw the stop key before this step (tests agreement)");
ABSL_FLAG(int, heartbeat_ms, 100, "heartbeat interval");
ABSL_FLAG(int, heartbeat_timeout_ms, 2000, "heartbeat staleness that declares a member failed");
ABSL_FLAG(int, grace_ms, 500, "recovery check-in grace");
ABSL_FLAG(int, rendezvous_timeout_s, 60, "admission / bootstrap / group-build timeout");
ABSL_FLAG(std::string, events, "", "file to append JSON event lines to (default stdout)");

namespace {

using malle::comm::ElasticGroup;
using malle::comm::Transition;
using nlohmann::json;

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

class Events {
 public:
  explicit Events(const std::string& path) {
    if (!path.empty()) file_.open(path, std::ios::app);
  }
  void Emit(json event) {
    event["t_ms"] = absl::ToUnixMicros(absl::Now()) / 1000.0;
    event["pid"] = ::getpid();
    std::ostream& out = file_.is_open() ? static_cast<std::ostream&>(file_) : std::cout;
    out << event.dump() << std::endl;  // flushed: the driver reads it live
  }

 private:
  std::ofstream file_;
};

int MemberNumber(const std::string& member) {
  size_t i = member.size();
  while (i > 0 && isdigit(static_cast<unsigned char>(member[i - 1]))) --i;
  int n = 0;
  if (i == member.size() || !absl::SimpleAtoi(member.substr(i), &n)) return -1;
  return n;
}

json TransitionJson(const Transition& t) {
  return json{{"ev", "transition"},
              {"kind", std::string(malle::comm::TransitionKindName(t.kind))},
              {"gen", t.generation},
              {"rank", t.rank},
              {"size", t.size},
              {"members", t.members},
              {"joined", t.joined},
              {"removed", t.removed},
              {"resume", t.resume_step},
              {"source", t.state_source_rank},
              {"committed", t.committed_by_rank},
              {"reason", t.reason},
              {"detect_ms", Ms(t.phases.detect)},
              {"wait_ms", Ms(t.phases.wait)},
              {"agree_ms", Ms(t.phases.agree)},
              {"build_ms", Ms(t.phases.build)},
              {"sync_ms", Ms(t.phases.sync)},
              {"total_ms", Ms(t.phases.total)}};
}

// The per-step contribution of a member: small integers, so float sums are exact.
float Contribution(int member_number, int64_t step) {
  return static_cast<float>((member_number + 1) * (step % 7 + 1));
}

int Run(Events& events) {
  const std::string store_flag = absl::GetFlag(FLAGS_store);
  std::vector<std::string> host_port = absl::StrSplit(store_flag, ':');
  int port = 0;
  if (host_port.size() != 2 || !absl::SimpleAtoi(host_port[1], &port)) {
    std::cerr << "--store must be HOST:PORT, got '" << store_flag << "'\n";
    return 2;
  }
  const std::string member = absl::GetFlag(FLAGS_member);
  const int number = MemberNumber(member);
  if (number < 0) {
    std::cerr << "--member must end in a number (e.g. w3), got '" << member << "'\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_numel) < 1) {
    std::cerr << "--numel must be >= 1, got " << absl::GetFlag(FLAGS_numel) << "\n";
    return 2;
  }
  auto store = malle::comm::ControlStore::Connect(host_port[0], port, absl::Seconds(10));
  if (!store.ok()) {
    events.Emit({{"ev", "error"}, {"status", store.status().ToString()}});
    return 1;
  }
  malle::comm::ElasticGroupOptions options;
  options.job_id = absl::GetFlag(FLAGS_job);
  options.member_id = member;
  options.bootstrap_size = absl::GetFlag(FLAGS_bootstrap);
  options.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  options.heartbeat_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  options.recovery_grace = absl::Milliseconds(absl::GetFlag(FLAGS_grace_ms));
  options.rendezvous_timeout = absl::Seconds(absl::GetFlag(FLAGS_rendezvous_timeout_s));
  events.Emit({{"ev", "start"}, {"member", member}});

  auto joined = ElasticGroup::Join(*store, options);
  if (!joined.ok()) {
    events.Emit({{"ev", "error"}, {"status", joined.status().ToString()}});
    return 1;
  }
  std::unique_ptr<ElasticGroup> group = *std::move(joined);
  auto job = (*store)->WithPrefix(malle::comm::JobPrefix(options.job_id));

  const int64_t max_steps = absl::GetFlag(FLAGS_steps);
  const int64_t numel = absl::GetFlag(FLAGS_numel);
  const absl::Duration compute = absl::Milliseconds(absl::GetFlag(FLAGS_step_ms));
  // Model state: steps taken and a checksum of every allreduce result.
  int64_t step = 0;
  double checksum = 0;
  int64_t redone = 0;
  Transition t = group->last_transition();
  events.Emit(TransitionJson(t));
  bool need_sync = true;
  int64_t highest_started = -1;
  bool stop_seen = false;  // sticky: the stop key is never removed

  for (;;) {
    if (need_sync) {
      // Everyone takes the state of the member with the newest commit.
      at::Tensor state = at::zeros({2}, at::kDouble);
      state.data_ptr<double>()[0] = static_cast<double>(group->committed_step());
      state.data_ptr<double>()[1] = checksum;
      absl::Status synced = group->comm().Broadcast(state, t.state_source_rank);
      if (synced.ok()) {
        checksum = state.data_ptr<double>()[1];
        step = t.resume_step;
        // This member now holds the state of step resume_step - 1, whatever it
        // had committed itself: say so, or a later generation that has lost
        // the source would resume from this member's older commit and apply
        // steps to a state that already contains them.
        group->Commit(t.resume_step - 1);
        need_sync = false;
      }
    }
    if (!need_sync) {
      if (max_steps > 0 && step >= max_steps) break;
      if (!stop_seen) {
        auto stop = job->Exists("ctl/stop");
        if (!stop.ok()) {
          events.Emit({{"ev", "error"}, {"status", stop.status().ToString()}});
          return 1;
        }
        stop_seen = *stop || step == absl::GetFlag(FLAGS_stop_at_step);
      }
      if (step <= highest_started) ++redone;
      highest_started = std::max(highest_started, step);
      absl::SleepFor(compute);
      // Element `numel` is the stop vote: > 0 after the sum = someone saw it.
      at::Tensor x = at::full({numel + 1}, Contribution(number, step), at::kFloat);
      x.data_ptr<float>()[numel] = stop_seen ? 1.0f : 0.0f;
      if (step == absl::GetFlag(FLAGS_die_at_step)) {
        // Fault injection: die while the allreduce is on the wire.
        std::thread([] {
          absl::SleepFor(absl::Microseconds(300));
          ::kill(::getpid(), SIGKILL);
        }).detach();
      }
      absl::Status reduced = group->comm().AllReduce(x);
      if (reduced.ok()) {
        float expected = 0;
        for (const std::string& m : group->members()) expected += Contribution(MemberNumber(m), step);
        const float got = x.data_ptr<float>()[numel - 1];
        if (got != expected || x.data_ptr<float>()[0] != expected) {
          events.Emit({{"ev", "mismatch"}, {"step", step}, {"gen", group->generation()},
                       {"expected", expected}, {"got", got}});
          return 3;
        }
        checksum += got * static_cast<double>(step + 1);
        group->Commit(step);
        if (step == absl::GetFlag(FLAGS_leave_at_step)) {
          absl::Status asked = group->RequestLeave();
          if (!asked.ok()) events.Emit({{"ev", "error"}, {"status", asked.ToString()}});
        }
        ++step;
        // Everyone whose allreduce completed saw the same vote.
        if (x.data_ptr<float>()[numel] > 0) break;
      }
    }
    auto boundary = group->AtStepBoundary();
    if (!boundary.ok()) {
      events.Emit({{"ev", "error"}, {"status", boundary.status().ToString()}});
      return 1;
    }
    if (boundary->kind == Transition::Kind::kNone) continue;
    t = *boundary;
    events.Emit(TransitionJson(t));
    if (t.kind == Transition::Kind::kLeft) {
      events.Emit({{"ev", "done"}, {"how", "left"}, {"steps", step}, {"checksum", checksum}});
      return 0;
    }
    if (t.kind == Transition::Kind::kExcluded) {
      events.Emit({{"ev", "done"}, {"how", "excluded"}, {"steps", step}});
      return 4;
    }
    need_sync = true;
  }
  group->Finish();  // everyone stops after this step: closing must not fail the slower ones
  events.Emit({{"ev", "done"}, {"how", "finished"}, {"steps", step}, {"checksum", checksum},
               {"redone", redone}, {"gen", group->generation()}, {"members", group->members()},
               {"rank", group->rank()}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("one synthetic rank of an elastic job (see the file's header)");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "unexpected argument '" << rest[1] << "'\n";
    return 2;
  }
  for (const char* required : {"store", "job", "member"}) {
    const std::string value = std::string(required) == "store"  ? absl::GetFlag(FLAGS_store)
                              : std::string(required) == "job" ? absl::GetFlag(FLAGS_job)
                                                                : absl::GetFlag(FLAGS_member);
    if (value.empty()) {
      std::cerr << "--" << required << " is required\n";
      return 2;
    }
  }
  Events events(absl::GetFlag(FLAGS_events));
  return Run(events);
}
