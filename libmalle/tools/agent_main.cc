// malle-agent: the node agent (libmalle/control/service/agent.h) as a program.
//
//   malle-agent --store=127.0.0.1:29400 --secret=/etc/malle/secret --node=n3 \
//       [--group=rack1] [--speed=1] [--idle_until=UNIX_SECONDS] [--grace=30s] \
//       [--log_dir=DIR] [--leave_timeout=60s] [--park_dir=DIR] [--slots=N] [--gpus=auto|LIST]
//
// --slots N: the node runs N ranks of the job it is assigned (LOCAL_RANK
// 0..N-1); --gpus auto: one slot per GPU of the node or of its Slurm
// allocation (cluster/node_slots.h says where it looks); --gpus 0,1: those.
// SIGTERM: the node is reclaimed (the main scheduler wants it back): its ranks
// leave at their next step boundary within --grace, then the agent exits.
// SIGINT: the same without a reclaim notice (the agent stops offering it).
// A control store outage does not stop it (the rank keeps running).
// Exit codes: 0 after a completed reclaim or stop, 1 an error (the store
// unreachable at the start, ...), 2 bad flags or a bad secret file.
#include <signal.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "libmalle/cluster/node_slots.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/control/service/metrics.h"
#include "libmalle/control/service/agent.h"
#include "libmalle/control/wire/secret.h"

ABSL_FLAG(std::string, store, "", "control store HOST:PORT or etcd://H:P,H:P,... (required)");
ABSL_FLAG(std::string, metrics, "",
          "serve Prometheus metrics on HOST:PORT (port 0: any; e.g. 127.0.0.1:0); empty: none");
ABSL_FLAG(std::string, secret, "", "shared secret file, mode 0600 (required)");
ABSL_FLAG(std::string, node, "", "this node's name (required)");
ABSL_FLAG(std::string, group, "default", "locality group (rack, switch)");
ABSL_FLAG(double, speed, 1.0, "relative speed of this node, (0, 100]");
ABSL_FLAG(double, idle_until, 0, "forecast end of the idle window, unix seconds (0: unknown)");
ABSL_FLAG(absl::Duration, grace, absl::Seconds(30), "time a SIGTERM (reclaim) leaves to vacate the node");
ABSL_FLAG(absl::Duration, leave_timeout, absl::Seconds(60), "planned leave not done by then: kill the rank");
ABSL_FLAG(std::string, park_dir, "",
          "jobs park here, in <dir>/<job> (a shared filesystem on a cluster); empty: no parking");
ABSL_FLAG(std::string, log_dir, "", "ranks' stdout/stderr files go here (default: inherited)");
ABSL_FLAG(int, slots, -1,
          "ranks per job on this node, [1, 1024] (LOCAL_RANK 0..N-1); default: one per GPU with --gpus, else 1");
ABSL_FLAG(std::string, gpus, "",
          "'auto': the GPUs of this node or its Slurm allocation (CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS, "
          "SLURM_JOB_GPUS, SLURM_GPUS_ON_NODE, then the driver's devices); a list such as 0,1: those "
          "(the ranks' CUDA_VISIBLE_DEVICES); empty: CPU ranks");
ABSL_FLAG(std::string, zygote_python, "",
          "warm rank starts: this interpreter, with --zygote_preload imported, forks the ranks of jobs whose "
          "command runs it (cluster/zygote.h); the node is offered once it is ready. Empty: ranks start cold");
ABSL_FLAG(std::string, zygote_preload, "torch,torch._dynamo,malletrain",
          "modules the zygote imports (comma-separated; torch._dynamo: torch imports it when a job builds its optimizer)");
ABSL_FLAG(absl::Duration, zygote_ready_timeout, absl::Seconds(120),
          "the node is offered after this even if the zygote is not ready (ranks start cold until it is)");

namespace {

int Usage(const std::string& why) {
  std::cerr << "malle-agent: " << why << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("the malletrain node agent (see docs/operations.md)");
  // --help lists this file's flags (absl matches the program's name otherwise: none).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) { return absl::StrContains(path, "agent_main"); };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  // Signals are taken by one thread with sigwait; every other thread (and,
  // through LocalProcess, no child) has them blocked.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  const std::string store_address = absl::GetFlag(FLAGS_store);
  if (store_address.empty()) return Usage("--store is required (HOST:PORT or etcd://H:P,...)");
  if (absl::GetFlag(FLAGS_secret).empty()) return Usage("--secret is required");
  absl::StatusOr<malle::control::Secret> secret = malle::control::LoadSecret(absl::GetFlag(FLAGS_secret));
  if (!secret.ok()) return Usage(secret.status().ToString());
  malle::control::AgentOptions o;
  o.node = absl::GetFlag(FLAGS_node);
  o.store_address = store_address;
  o.secret_path = absl::GetFlag(FLAGS_secret);
  o.node_class = malle::control::NodeClass{absl::GetFlag(FLAGS_group), absl::GetFlag(FLAGS_speed)};
  if (absl::GetFlag(FLAGS_idle_until) > 0) {
    o.idle_until = absl::FromUnixMicros(static_cast<int64_t>(absl::GetFlag(FLAGS_idle_until) * 1e6));
  }
  o.leave_timeout = absl::GetFlag(FLAGS_leave_timeout);
  o.log_dir = absl::GetFlag(FLAGS_log_dir);
  o.park_root = absl::GetFlag(FLAGS_park_dir);
  o.zygote_python = absl::GetFlag(FLAGS_zygote_python);
  o.zygote_preload = absl::StrSplit(absl::GetFlag(FLAGS_zygote_preload), ',', absl::SkipEmpty());
  o.zygote_ready_timeout = absl::GetFlag(FLAGS_zygote_ready_timeout);
  std::optional<malle::cluster::NodeGpus> gpus;
  if (const std::string g = absl::GetFlag(FLAGS_gpus); !g.empty()) {
    // No /dev/nvidia<N> (a container may map devices elsewhere): unknown, not zero.
    const int counted = malle::cluster::CountDriverDevices();
    const int devices = counted > 0 ? counted : -1;
    absl::StatusOr<malle::cluster::NodeGpus> found =
        g == "auto" ? malle::cluster::DetectGpus(malle::cluster::ProcessEnvRaw, devices)
                    : malle::cluster::ParseGpuList(g, devices);
    if (!found.ok()) return Usage(absl::StrCat("--gpus ", g, ": ", found.status().message()));
    gpus = *found;
    o.visible_devices = gpus->visible_devices;
  }
  absl::StatusOr<int> slots = malle::cluster::ResolveSlots(absl::GetFlag(FLAGS_slots), gpus);
  if (!slots.ok()) return Usage(std::string(slots.status().message()));
  o.slots = *slots;
  if (gpus) std::cerr << "malle-agent: " << o.slots << " slot(s) on " << gpus->count << " GPU(s) from " << gpus->source << std::endl;
  const absl::Duration grace = absl::GetFlag(FLAGS_grace);
  if (grace < absl::ZeroDuration() || grace > absl::Hours(1)) return Usage("--grace must be in [0, 1h]");

  absl::StatusOr<std::shared_ptr<malle::comm::ControlStore>> store =
      malle::comm::ControlStore::Open(store_address, absl::Seconds(30));
  if (absl::IsInvalidArgument(store.status())) return Usage(store.status().ToString());
  if (!store.ok()) {
    std::cerr << "malle-agent: " << store.status() << "\n";
    return 1;
  }
  absl::StatusOr<std::unique_ptr<malle::control::Agent>> agent =
      malle::control::Agent::Create(*store, *secret, o);
  if (!agent.ok()) return Usage(agent.status().ToString());

  std::unique_ptr<malle::control::MetricsEndpoint> metrics;
  if (const std::string m = absl::GetFlag(FLAGS_metrics); !m.empty()) {
    const size_t colon = m.rfind(':');
    int mport = -1;
    if (colon == std::string::npos || !absl::SimpleAtoi(m.substr(colon + 1), &mport)) {
      return Usage(absl::StrCat("--metrics: expected HOST:PORT, got '", m, "'"));
    }
    auto* source = (*agent).get();
    absl::StatusOr<std::unique_ptr<malle::control::MetricsEndpoint>> e = malle::control::MetricsEndpoint::Start(
        m.substr(0, colon), mport, [source] { return source->MetricsText(); });
    if (!e.ok()) return Usage(e.status().ToString());
    metrics = *std::move(e);
    std::cerr << "malle-agent: metrics on http://" << m.substr(0, colon) << ":" << metrics->port() << "/metrics"
              << std::endl;
  }
  std::thread signals([&set, a = agent->get(), grace] {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) return;
    if (sig == SIGTERM) {
      a->Reclaim(grace, "SIGTERM: the node is reclaimed");
    } else {
      a->Stop("SIGINT: the agent stops");
    }
  });
  signals.detach();  // the process ends when Run returns
  absl::Status s = (*agent)->Run();
  if (!s.ok()) {
    std::cerr << "malle-agent: " << s << "\n";
    return 1;
  }
  return 0;
}
