// Agent: the node agent. One per node; it offers the node to the allocator
// and runs, on it, the ranks of whichever job the allocator's plan assigns:
// `slots` ranks (one per GPU on a GPU node), LOCAL_RANK 0..slots-1.
//
//   AgentOptions o;
//   o.node = "n3";
//   o.store_address = "127.0.0.1:29400";
//   o.secret_path = "/etc/malle/secret";
//   o.slots = 4;                            // a node with 4 GPUs: 4 ranks per job
//   MALLE_ASSIGN_OR_RETURN(auto agent, Agent::Create(store, secret, o));
//   // SIGTERM handler thread: agent->Reclaim(absl::Seconds(30), "slurm preemption");
//   MALLE_RETURN_IF_ERROR(agent->Run());   // until Stop() or the reclaim is done
//
// The node's ranks are one unit: they start together (on the job's bootstrap
// node they form its first generation together), are asked to leave together
// (one change request: one generation change, not `slots`), and when one of
// them crashes the agent stops the others and reports them all dead at once,
// so that the job recovers once, without the node. Below, "the rank" is the
// node's set of ranks.
//
// What it does, each poll_interval:
//   - registers the node (again, if a plan that does not list it is older
//     than reregister_after: the allocator restarted empty, or refused it);
//   - sends a heartbeat every heartbeat_interval, saying what it runs;
//   - reads the plan when its id changes (authenticated; older plans are
//     ignored) and reconciles: a rank of a job the node no longer serves is
//     asked to leave at its next step boundary (ElasticGroup::RequestLeave),
//     or terminated when its job gets no node at all; if it has not left by
//     leave_timeout it is killed and reported dead, so the others recover at
//     once. A rank that is not yet a member (still warming up) is stopped at
//     once instead: it has nothing to lose and cannot be asked to leave. A
//     member of a job that has succeeded finishes in the background (it may
//     write its results for finish_timeout) while the node takes its next
//     rank: the node goes back to the pool at once;
//   - follows each rank's phase (RankPhase: starting until the job's latest
//     generation lists it, training, draining once asked to end) and reports
//     it with the time it began in every heartbeat, at once when it changes:
//     the allocator measures the node time held without training from it. A node assigned a job gets a rank of it: the job's command from
//     its published spec, with MALLE_* variables (docs/protocol.md) that make
//     it join the job's current incarnation; on the incarnation's bootstrap
//     node the first rank starts the job (bootstrap size 1), every other rank
//     joins, after warming up (the Python and C++ APIs join at their first
//     step);
//   - reports every rank exit (RankExit: exited by itself, left on request,
//     or stopped by the agent); a rank that crashed is reported dead to its
//     job's group at once.
// Reclaim(grace): NodeReclaim to the allocator, the rank leaves at its next
// step boundary or is killed at the grace deadline (less a margin), then
// NodeLeave and Run returns. Stop(): the same without the reclaim notice.
//
// Every process the agent starts is its child (cluster::LocalProcess: it
// dies with the agent, leads its own process group, gets the rank
// environment contract of cluster/rank_env.h) and is stopped by pid.
//
// Warm starts (zygote_python set): before it offers the node, the agent
// starts a zygote (cluster/zygote.h: an interpreter that has imported
// zygote_preload) and waits for it, up to zygote_ready_timeout; a rank whose
// command runs that interpreter is then forked from it (a grandchild of the
// agent, still stopped and reaped by pid through LocalProcess), so process
// start and imports are not paid on the allocated node's clock. A rank the
// zygote cannot start exactly as execve would is started cold (the log says
// why); a zygote that dies is started again (after 5 s, doubling while
// they keep failing, up to 5 min), meanwhile ranks start cold.
//
// Thread-safety: Run on one thread; Reclaim, Stop and running() from any.
#ifndef MALLE_CONTROL_AGENT_H_
#define MALLE_CONTROL_AGENT_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libmalle/cluster/local_process.h"
#include "libmalle/cluster/zygote.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/control/service/channel.h"
#include "libmalle/control/wire/messages.h"
#include "libmalle/control/wire/secret.h"

namespace malle::control {

struct AgentOptions {
  std::string node;      // id, required
  std::string agent_id;  // default "agent.<node>.<pid>"
  NodeClass node_class{"default", 1.0};
  std::optional<absl::Time> idle_until;  // forecast end of the node's idle window
  std::string store_address;  // host:port the ranks connect to (MALLE_STORE), required
  std::string secret_path;    // passed to ranks (MALLE_CONTROL_SECRET), may be empty
  std::string log_dir;        // ranks' stdout/stderr as <log_dir>/<member>.{out,err}; empty: inherit
  // Ranks per job on this node, [1, 1024] (cluster/node_slots.h resolves
  // `--slots` / `--gpus`); the allocator still allocates whole nodes.
  int slots = 1;
  // CUDA_VISIBLE_DEVICES of the ranks (from --gpus or the Slurm allocation);
  // empty: they inherit the agent's environment.
  std::string visible_devices;
  std::vector<std::pair<std::string, std::string>> extra_env;  // added to every rank
  // Park stores: a job's ranks get <park_root>/<job> (MALLE_PARK_DIR), where its
  // last member parks the state and snapshots go (a shared filesystem on a
  // cluster, so that the job resumes on any node). Empty: jobs do not park.
  std::string park_root;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration poll_interval = absl::Milliseconds(50);
  absl::Duration reregister_after = absl::Seconds(3);
  absl::Duration leave_timeout = absl::Seconds(60);  // planned leave -> kill
  absl::Duration stop_timeout = absl::Seconds(10);   // SIGTERM -> SIGKILL
  absl::Duration finish_timeout = absl::Seconds(60); // job succeeded -> the rank must end by then
  absl::Duration member_poll = absl::Milliseconds(250);  // a starting rank: is it a member yet?
  absl::Duration respawn_backoff = absl::Seconds(1); // after a crash, times the crash count (max 30 s)
  // Warm starts: the interpreter of the zygote (empty: every rank starts
  // cold), what it imports, and how long the node waits for it before it is
  // offered anyway (ranks then start cold until it is ready).
  std::string zygote_python;
  std::vector<std::string> zygote_preload = {"torch", "torch._dynamo", "malletrain"};
  absl::Duration zygote_ready_timeout = absl::Seconds(120);

  absl::Status Validate() const;  // kInvalidArgument naming the field
};

class Agent {
 public:
  static absl::StatusOr<std::unique_ptr<Agent>> Create(std::shared_ptr<comm::ControlStore> store,
                                                       Secret secret, AgentOptions options);
  ~Agent();  // kills a rank that still runs

  // The agent's loop. Returns OK after Stop() or a completed reclaim. A
  // control store outage does not end it: the rank keeps running, rank exits
  // and reclaims are kept and sent when the store is back, and the agent
  // registers again. Other errors end it after killing its rank.
  absl::Status Run();
  // Asks the loop to vacate the node within `grace` and return. Thread-safe,
  // does not block.
  void Reclaim(absl::Duration grace, std::string reason);
  // Asks the loop to leave cleanly (the rank leaves at a step boundary, then
  // NodeLeave) and return. Thread-safe, does not block.
  void Stop(std::string reason);

  // What runs now (job runtime id; the member, pid of the node's first rank;
  // the phase of the least advanced one). Thread-safe.
  std::optional<RunningRank> running() const;
  // How many of the node's ranks run now. Thread-safe.
  int running_ranks() const;
  int64_t plan_seen() const { return plan_seen_.load(); }
  // The Prometheus text exposition of this agent (docs/operations.md, "Metrics"). Thread-safe.
  std::string MetricsText() const;
  const std::string& agent_id() const { return options_.agent_id; }

 private:
  struct Rank {
    std::unique_ptr<cluster::LocalProcess> process;
    std::string job;         // allocator job id
    std::string runtime_id;  // store job id
    std::string member;
    // kFinishing: its job succeeded; the rank is given finish_timeout to end
    // by itself (write its results) before it is killed.
    enum class Ending { kNone, kLeaving, kStopping, kFinishing, kKilled } ending = Ending::kNone;
    absl::Time deadline;     // for kLeaving / kStopping
    RankPhase phase = RankPhase::kStarting;
    absl::Time phase_since;
    absl::Time member_checked = absl::InfinitePast();
    std::optional<cluster::ExitStatus> exit;  // once it has exited
  };
  struct Wanted {
    std::string job, runtime_id, bootstrap_node;
    int job_nodes = 0;
  };

  Agent(std::shared_ptr<comm::ControlStore> store, Secret secret, AgentOptions options);
  absl::Status Register();
  absl::Status Heartbeat();
  absl::Status PollPlan(absl::Time now);
  absl::Status Reconcile(absl::Time now);
  absl::Status Spawn(const Wanted& w, absl::Time now);
  absl::Status Reap(absl::Time now);   // ranks that exited: report them
  absl::Status ReapFinishing(absl::Time now);  // ranks finishing in the background
  absl::Status Report(Rank& r, const cluster::ExitStatus& status, absl::Time now);
  // Sends `m`, or keeps it for later if the store is down (rank exits, reclaims).
  absl::Status SendReliably(const Message& m);
  absl::Status FlushUnsent();
  // A starting rank whose job's latest generation now lists it is training.
  absl::Status CheckMembership(absl::Time now);
  void SetPhase(Rank& r, RankPhase phase, absl::Time now);
  // Ends every rank of the node not ending yet; kLeaving: one leave request for all.
  absl::Status EndRanks(Rank::Ending how, absl::Time deadline);
  absl::Status StopStartingRanks(absl::Time now);  // ranks that are not members yet
  absl::Status Vacate(absl::Time deadline, bool reclaim);
  // Kills every rank still running and reports them (and `also`) dead together.
  absl::Status KillAndReportDead(std::vector<std::string> also = {});
  bool AnyRankNotEnding() const;
  void KillAll();
  // The job's phase in the allocator's status document ("" if unknown).
  std::string JobPhase(absl::string_view job, absl::Time now);
  void SetRunning();
  // Starts the zygote (again) if one is configured and none is usable.
  void EnsureZygote(absl::Time now);
  // Before the node is offered: waits for the zygote (or its timeout, Stop, Reclaim).
  void WaitForZygote();

  std::shared_ptr<comm::ControlStore> store_;
  Secret secret_;
  AgentOptions options_;
  Outbox outbox_;

  std::vector<Rank> ranks_;      // the node's ranks, all of one job (empty: none)
  std::vector<Rank> finishing_;  // members of succeeded jobs writing their results
  bool heartbeat_due_ = false;   // a phase changed: tell the allocator now
  std::deque<Message> unsent_;   // kept while the store is down, oldest first
  bool store_down_ = false;
  int64_t store_failures_ = 0;
  std::optional<Wanted> wanted_;
  bool in_plan_ = false;
  int64_t plan_id_ = 0;
  std::atomic<int64_t> plan_seen_{0};
  absl::Time last_register_ = absl::InfinitePast();
  absl::Time last_heartbeat_ = absl::InfinitePast();
  absl::Time next_spawn_ = absl::InfinitePast();
  int crashes_ = 0;
  int spawned_ = 0;
  std::map<std::string, bool> bootstrapped_;  // runtime ids this agent has started
  // Runtime ids whose rank here ended by itself with status 0: the program
  // is done, so no new rank is started for it even while the plan (not yet
  // updated) still lists the job here.
  std::map<std::string, bool> finished_;
  std::map<std::string, JobSubmit> specs_;     // job specs read so far
  std::shared_ptr<cluster::Zygote> zygote_;    // null: none configured, or not started yet
  absl::Time zygote_next_start_ = absl::InfinitePast();
  int zygote_failures_ = 0;         // in a row (its backoff)
  bool zygote_ready_seen_ = false;  // the current zygote's readiness was noted

  mutable absl::Mutex mu_;
  std::optional<RunningRank> running_ ABSL_GUARDED_BY(mu_);
  struct Counters {
    int64_t rank_starts = 0;
    int64_t warm_starts = 0;     // forked from the zygote
    int64_t zygote_starts = 0;
    double zygote_warmup_s = 0;  // the latest zygote's start to ready
    std::map<std::string, int64_t> rank_exits;  // by cause
    int64_t store_errors = 0;
    int64_t unsent = 0;
    int finishing = 0;
    int ranks = 0;
  } counters_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool reclaim_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration grace_ ABSL_GUARDED_BY(mu_);
  std::string why_ ABSL_GUARDED_BY(mu_);
};

}  // namespace malle::control

#endif  // MALLE_CONTROL_AGENT_H_
