// malle-allocator: the shared allocator (libmalle/control/service/allocator_service.h)
// as a daemon.
//
//   malle-allocator --secret=/etc/malle/secret --store=HOST:PORT \
//       [--journal=/var/lib/malle/journal] [--policy=milp] [--forward_window=2m]
//   malle-allocator --secret=... --listen=127.0.0.1:29400 ...   # hosts the store itself
//
// With --store it uses a control store hosted elsewhere (`malletrain store`,
// a launcher): jobs keep training while the allocator restarts. With --listen
// it hosts the store (one process; a restart then interrupts the jobs' step
// boundaries). SIGTERM / SIGINT stop it.
// A control store outage does not stop it: it waits and re-seeds the store.
// Exit codes: 0 stopped by a signal, 1 an error (store unreachable at the
// start, journal not writable, another allocator took over), 2 bad flags,
// secret or journal.
#include <signal.h>

#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "libmalle/alloc/decide.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/control/service/metrics.h"
#include "libmalle/control/service/allocator_service.h"
#include "libmalle/control/wire/secret.h"

ABSL_FLAG(std::string, store, "", "control store HOST:PORT or etcd://H:P,H:P,... to connect to");
ABSL_FLAG(std::string, listen, "", "host the control store on HOST:PORT instead (port 0: any)");
ABSL_FLAG(std::string, metrics, "",
          "serve Prometheus metrics on HOST:PORT (port 0: any; e.g. 127.0.0.1:0); empty: none");
ABSL_FLAG(std::string, secret, "", "shared secret file, mode 0600 (required)");
ABSL_FLAG(std::string, journal, "", "journal file (empty: none; a restart then starts empty)");
ABSL_FLAG(std::string, policy, "milp", "milp, dp, greedy, equal_share or static");
ABSL_FLAG(absl::Duration, forward_window, absl::Minutes(2), "look-ahead of the objective");
ABSL_FLAG(std::string, objective, "throughput",
          "throughput, speedup or weighted (completion needs every job's work left: refused)");
ABSL_FLAG(double, resize_hysteresis, 1.0, "charge every resize this many times its pause (>= 1)");
ABSL_FLAG(bool, reclaim_hazard, false,
          "price the expected cost of a reclaim within the window, at the rate of this "
          "allocator's own history of reclaims");
ABSL_FLAG(double, rank_weight_exponent, 0.0,
          "each job's value times rank^P, rank 1 for the job with the most work left (jobs "
          "declare total_steps); 0 = off");
ABSL_FLAG(absl::Duration, rank_aging, absl::InfiniteDuration(),
          "with --rank_weight_exponent: a job's work left ranks as work / (1 + age / D), its age "
          "counted from its submit, so that no job stays ranked last; inf = off");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(15), "silent agents are withdrawn after this");
ABSL_FLAG(absl::Duration, debounce, absl::Milliseconds(200), "events closer than this are decided once");

namespace {

int Usage(const std::string& why) {
  std::cerr << "malle-allocator: " << why << "\n";
  return 2;
}

bool HostPort(const std::string& text, std::string* host, int* port) {
  std::vector<std::string> hp = absl::StrSplit(text, absl::MaxSplits(':', 1));
  return hp.size() == 2 && !hp[0].empty() && absl::SimpleAtoi(hp[1], port) && (*host = hp[0], true);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("the malletrain allocator (see docs/operations.md)");
  absl::ParseCommandLine(argc, argv);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  const std::string connect = absl::GetFlag(FLAGS_store), listen = absl::GetFlag(FLAGS_listen);
  if (connect.empty() == listen.empty()) return Usage("give exactly one of --store and --listen");
  std::string host;
  int port = 0;
  if (!listen.empty() && !HostPort(listen, &host, &port)) {
    return Usage(absl::StrCat("--listen: expected HOST:PORT, got '", listen, "'"));
  }
  if (absl::GetFlag(FLAGS_secret).empty()) return Usage("--secret is required");
  absl::StatusOr<malle::control::Secret> secret = malle::control::LoadSecret(absl::GetFlag(FLAGS_secret));
  if (!secret.ok()) return Usage(secret.status().ToString());
  absl::StatusOr<malle::alloc::PolicyKind> policy = malle::alloc::ParsePolicyName(absl::GetFlag(FLAGS_policy));
  if (!policy.ok()) return Usage(policy.status().ToString());

  absl::StatusOr<std::shared_ptr<malle::comm::ControlStore>> store =
      connect.empty() ? malle::comm::ControlStore::Host(host, port)
                      : malle::comm::ControlStore::Open(connect, absl::Seconds(30));
  if (absl::IsInvalidArgument(store.status())) return Usage(store.status().ToString());
  if (!store.ok()) {
    std::cerr << "malle-allocator: " << store.status() << "\n";
    return 1;
  }
  if (!listen.empty()) std::cout << "control store listening on " << host << ":" << (*store)->port() << std::endl;

  malle::control::AllocatorServiceOptions o;
  o.decide.policy = *policy;
  o.journal_path = absl::GetFlag(FLAGS_journal);
  o.state.forward_window = absl::GetFlag(FLAGS_forward_window);
  absl::StatusOr<malle::alloc::Objective> objective =
      malle::alloc::ParseObjectiveName(absl::GetFlag(FLAGS_objective));
  if (!objective.ok()) return Usage(absl::StrCat("--", objective.status().message()));
  o.state.objective = *objective;
  o.state.resize_hysteresis = absl::GetFlag(FLAGS_resize_hysteresis);
  o.state.rank_weight_exponent = absl::GetFlag(FLAGS_rank_weight_exponent);
  o.state.rank_aging = absl::GetFlag(FLAGS_rank_aging);
  o.state.reclaim_hazard = absl::GetFlag(FLAGS_reclaim_hazard);
  o.state.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  o.debounce = absl::GetFlag(FLAGS_debounce);
  absl::StatusOr<std::unique_ptr<malle::control::AllocatorService>> service =
      malle::control::AllocatorService::Create(*store, *secret, o);
  if (!service.ok()) return Usage(service.status().ToString());
  std::unique_ptr<malle::control::MetricsEndpoint> metrics;
  if (const std::string m = absl::GetFlag(FLAGS_metrics); !m.empty()) {
    const size_t colon = m.rfind(':');
    int mport = -1;
    if (colon == std::string::npos || !absl::SimpleAtoi(m.substr(colon + 1), &mport)) {
      return Usage(absl::StrCat("--metrics: expected HOST:PORT, got '", m, "'"));
    }
    auto* source = (*service).get();
    absl::StatusOr<std::unique_ptr<malle::control::MetricsEndpoint>> e = malle::control::MetricsEndpoint::Start(
        m.substr(0, colon), mport, [source] { return source->MetricsText(); });
    if (!e.ok()) return Usage(e.status().ToString());
    metrics = *std::move(e);
    std::cerr << "malle-allocator: metrics on http://" << m.substr(0, colon) << ":" << metrics->port() << "/metrics"
              << std::endl;
  }
  std::thread signals([&set, s = service->get()] {
    int sig = 0;
    if (sigwait(&set, &sig) == 0) (void)s->Stop();
  });
  signals.detach();
  absl::Status s = (*service)->Run();
  if (!s.ok()) {
    std::cerr << "malle-allocator: " << s << "\n";
    return 1;
  }
  return 0;
}
