// Control-plane load: one allocator service and N simulated node agents over
// one TCPStore on loopback, as in a deployment with N idle nodes.
//
//   control_load_bench [--agents=1000] [--threads=8] [--seconds=20] [--churn_per_s=10] [--jobs=100]
//
// Each simulated agent does what malle-agent does on the control plane: it
// registers its node, sends a heartbeat every --heartbeat (1 s), and polls the
// plan id every --plan_poll (200 ms), reading the plan when it changes. The
// agents run as --threads threads (one store connection each). Jobs are
// submitted at the start (nothing is launched: this measures the control
// plane, not training). During the run, --churn_per_s nodes per second leave
// and register again (reclaims and new idle nodes), each a decision.
//
// Printed, side by side with what the deployment needs:
//   - registration burst: time until every node is in a published plan;
//   - messages/s consumed vs offered, inbox lag (tickets not yet consumed);
//   - decisions/s and decision latency (solve) p50/p99;
//   - store latency seen by an agent (add, get) p50/p99 under that load;
//   - allocator loop: the share of one core it used.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/control/service/allocator_service.h"
#include "libmalle/control/service/channel.h"
#include "libmalle/control/wire/secret.h"
#include <variant>

ABSL_FLAG(int, agents, 1000, "simulated node agents");
ABSL_FLAG(int, threads, 8, "threads that run them (one store connection each)");
ABSL_FLAG(int, seconds, 20, "steady-state measurement after the registration burst");
ABSL_FLAG(int, churn_per_s, 10, "nodes per second that leave and register again");
ABSL_FLAG(int, jobs, 100, "jobs submitted (1..8 nodes each)");
ABSL_FLAG(std::string, policy, "dp", "allocation policy");
ABSL_FLAG(absl::Duration, heartbeat, absl::Seconds(1), "agent heartbeat interval");
ABSL_FLAG(absl::Duration, plan_poll, absl::Milliseconds(200), "agent plan-id poll interval");

namespace {

using malle::comm::ControlStore;
using namespace malle::control;  // NOLINT: a benchmark program

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Shared {
  std::atomic<bool> stop{false};
  std::atomic<bool> churn{false};
  std::atomic<int64_t> sent{0};
  std::atomic<int64_t> plan_reads{0};
  std::mutex mu;
  std::vector<double> add_ms, get_ms;
};

void RunAgents(int first, int count, const std::string& host, int port, const Secret& secret, Shared* s) {
  auto store = ControlStore::Connect(host, port, absl::Seconds(30));
  if (!store.ok()) {
    std::cerr << "agent thread: " << store.status() << "\n";
    return;
  }
  std::vector<std::unique_ptr<Outbox>> outs;
  std::vector<absl::Time> next_hb;
  std::mt19937 rng(first);
  for (int i = 0; i < count; ++i) {
    const std::string node = absl::StrCat("n", first + i);
    outs.push_back(std::make_unique<Outbox>(*store, secret, absl::StrCat("agent.", node)));
    NodeRegister r;
    r.node = node;
    r.agent = absl::StrCat("agent.", node);
    if (outs.back()->Send(r).ok()) ++s->sent;
    // Spread heartbeats over the interval.
    next_hb.push_back(absl::Now() + absl::GetFlag(FLAGS_heartbeat) * (static_cast<double>(rng() % 1000) / 1000));
  }
  int64_t plan_seen = 0;
  absl::Time next_poll = absl::Now();
  // Each thread churns at its own phase of the second, as independent nodes would.
  absl::Time next_churn = absl::Now() + absl::Seconds(1) * (1 + static_cast<double>(rng() % 1000) / 1000);
  const int churn_here = std::max(1, absl::GetFlag(FLAGS_churn_per_s) * count / absl::GetFlag(FLAGS_agents));
  std::vector<double> add_ms, get_ms;
  while (!s->stop.load()) {
    const absl::Time now = absl::Now();
    for (int i = 0; i < count; ++i) {
      if (now < next_hb[i]) continue;
      next_hb[i] = now + absl::GetFlag(FLAGS_heartbeat);
      const absl::Time t0 = absl::Now();
      if (outs[i]->Send(AgentHeartbeat{absl::StrCat("n", first + i), std::nullopt}).ok()) ++s->sent;
      add_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0) / 2);  // two round trips
    }
    if (now >= next_poll) {
      next_poll = now + absl::GetFlag(FLAGS_plan_poll);
      const absl::Time t0 = absl::Now();
      auto id = (*store)->TryGet(keys::kPlanId);
      get_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
      int64_t v = 0;
      if (id.ok() && *id && absl::SimpleAtoi(**id, &v) && v > plan_seen) {
        plan_seen = v;
        // Every simulated agent of this thread reads the same plan once.
        if ((*store)->TryGet(keys::kPlan).ok()) s->plan_reads += count;
      }
    }
    if (s->churn.load() && now >= next_churn) {
      next_churn = now + absl::Seconds(1);
      for (int k = 0; k < churn_here; ++k) {
        const int i = static_cast<int>(rng() % count);
        const std::string node = absl::StrCat("n", first + i);
        if (outs[i]->Send(NodeLeave{node, "churn"}).ok()) ++s->sent;
        // The node comes back under a new agent incarnation.
        const std::string agent = absl::StrCat("agent.", node, ".", rng() % 1000000);
        outs[i] = std::make_unique<Outbox>(*store, secret, agent);
        NodeRegister r;
        r.node = node;
        r.agent = agent;
        if (outs[i]->Send(r).ok()) ++s->sent;
      }
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  std::lock_guard<std::mutex> lock(s->mu);
  s->add_ms.insert(s->add_ms.end(), add_ms.begin(), add_ms.end());
  s->get_ms.insert(s->get_ms.end(), get_ms.begin(), get_ms.end());
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int n = absl::GetFlag(FLAGS_agents), threads = std::max(1, absl::GetFlag(FLAGS_threads));
  auto store = ControlStore::Host("127.0.0.1", 0);
  if (!store.ok()) {
    std::cerr << store.status() << "\n";
    return 1;
  }
  const Secret secret = *Secret::FromBytes("benchmark-secret-0123456789abcdef");
  AllocatorServiceOptions o;
  o.decide.policy = *malle::alloc::ParsePolicyName(absl::GetFlag(FLAGS_policy));
  o.state.heartbeat_timeout = absl::Seconds(15);
  auto service = AllocatorService::Create(*store, secret, o);
  if (!service.ok()) {
    std::cerr << service.status() << "\n";
    return 1;
  }
  // Jobs first (the registration burst then is what every decision sees).
  Outbox client(*store, secret, "client.bench");
  for (int j = 0; j < absl::GetFlag(FLAGS_jobs); ++j) {
    JobSubmit s;
    s.job = absl::StrCat("job", j);
    s.command = {"true"};
    s.max_nodes = 1 + j % 8;
    (void)client.Send(s);
  }
  double loop_cpu = 0;
  std::atomic<bool> service_stop{false};
  std::thread loop([&] {
    const double c0 = CpuSeconds();
    absl::Status s = (*service)->Begin(absl::Now());
    while (s.ok() && !service_stop.load()) {
      s = (*service)->Step(absl::Now());
      absl::SleepFor(o.poll_interval);
    }
    if (!s.ok()) std::cerr << "allocator: " << s << "\n";
    loop_cpu = CpuSeconds() - c0;
  });

  Shared shared;
  const absl::Time t_start = absl::Now();
  std::vector<std::thread> workers;
  const int per = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    const int first = t * per, count = std::min(per, n - first);
    if (count > 0) {
      workers.emplace_back(RunAgents, first, count, "127.0.0.1", (*store)->port(), std::cref(secret), &shared);
    }
  }
  // Registration burst: until a published plan lists every node.
  absl::Duration burst = absl::InfiniteDuration();
  const absl::Time burst_deadline = t_start + absl::Seconds(120);
  while (absl::Now() < burst_deadline) {
    auto doc = ReadDocument(**store, keys::kPlan, secret, absl::Now());
    if (doc.ok() && doc->has_value()) {
      const auto& plan = std::get<AllocationPlan>((*doc)->message);
      if (static_cast<int>(plan.assignments.size()) == n) {
        burst = absl::Now() - t_start;
        break;
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  // Steady state with churn.
  const AllocatorStats before = (*service)->stats();
  const int64_t sent_before = shared.sent.load();
  shared.churn.store(true);
  const absl::Time t0 = absl::Now();
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_seconds)));
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  const AllocatorStats after = (*service)->stats();
  const int64_t sent_after = shared.sent.load();
  auto next = (*store)->Add(keys::kInboxNext, 0);
  shared.stop.store(true);
  for (auto& w : workers) w.join();
  service_stop.store(true);
  loop.join();

  const double offered = (sent_after - sent_before) / secs;
  const double consumed = ((after.accepted + after.rejected) - (before.accepted + before.rejected)) / secs;
  const int64_t lag = next.ok() ? *next - after.cursor : -1;
  std::vector<double> dms(after.decision_ms.begin(), after.decision_ms.end());
  const double total_s = absl::ToDoubleSeconds(absl::Now() - t_start);
  std::printf("control plane: %d agents on %d threads, %d jobs, policy %s, churn %d nodes/s, 2-core machine\n",
              n, threads, absl::GetFlag(FLAGS_jobs), absl::GetFlag(FLAGS_policy).c_str(),
              absl::GetFlag(FLAGS_churn_per_s));
  std::printf("%-52s %14s %s\n", "measure", "measured", "needed / reference");
  std::printf("%-52s %12.2f s  %s\n", "registration burst: all nodes in a published plan",
              absl::ToDoubleSeconds(burst), "< heartbeat timeout (15 s)");
  std::printf("%-52s %12.0f /s  %s\n", "messages offered (heartbeats + churn)", offered,
              absl::StrFormat("%.0f/s = agents / heartbeat + 2 x churn", n / absl::ToDoubleSeconds(absl::GetFlag(FLAGS_heartbeat)) + 2.0 * absl::GetFlag(FLAGS_churn_per_s)).c_str());
  std::printf("%-52s %12.0f /s  %s\n", "messages consumed by the allocator", consumed, ">= offered");
  std::printf("%-52s %12lld     %s\n", "inbox lag at the end (tickets)", static_cast<long long>(lag), "~0: it keeps up");
  std::printf("%-52s %12.1f /s  %s\n", "decisions", (after.decisions - before.decisions) / secs,
              "debounced (200 ms): at most ~5/s");
  std::printf("%-52s %9.2f / %.2f ms  %s\n", "decision solve p50 / p99", Pct(dms, 0.5), Pct(dms, 0.99),
              "within the debounce");
  std::printf("%-52s %9.3f / %.3f ms  %s\n", "store round trip seen by an agent (send) p50 / p99",
              Pct(shared.add_ms, 0.5), Pct(shared.add_ms, 0.99), "<< heartbeat interval");
  std::printf("%-52s %9.3f / %.3f ms  %s\n", "store get (plan id poll) p50 / p99", Pct(shared.get_ms, 0.5),
              Pct(shared.get_ms, 0.99), "<< poll interval");
  std::printf("%-52s %12.0f %%   %s\n", "allocator loop CPU (one core = 100 %)", 100 * loop_cpu / total_s,
              "headroom left");
  std::printf("%-52s %12lld     %s\n", "messages rejected", static_cast<long long>(after.rejected), "0");
  return 0;
}
