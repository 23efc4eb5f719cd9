// elastic_trainer_worker: one rank of a small elastic training job, for
// elastic_trainer_process_test. Trains a 2-layer MLP with Adam on synthetic
// data (the same on every rank) through ElasticTrainer. Every rank starts
// from different random weights: only the state sync makes them agree.
//
// The model's state is more than its parameters: a batch-normalisation layer
// with running statistics and a counter (buffers), dropout, and a tracked
// counter and a learning-rate decay the loop steps after every FinishStep()
// whatever it returned (as users step a schedule).
//
// Test hooks: the job-prefixed store key "ctl/gate" (if present) holds the
// step this rank may not start before it is raised, so the test can order
// resizes by step; --hidden gives a rank a different model; --die_at=S:PHASE
// makes the rank SIGKILL itself during step S, after the forward of its first
// micro-batch (PHASE "forward") or after its last backward ("backward");
// --die_after_join does the latter in the first step after another member
// joined (before the joiner has committed anything).
// Output: JSON lines on --events, and the final parameters then buffers as
// raw float32 in --params.
//
// Exit codes: 0 finished or left, 1 error, 2 bad flags, 5 model mismatch.
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <set>
#include <iostream>

#include <ATen/Parallel.h>
#include <ATen/ops/batch_norm.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/tensor.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adam.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libmalle/elastic/elastic_trainer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, store, "", "control store HOST:PORT");
ABSL_FLAG(std::string, job, "", "job id");
ABSL_FLAG(std::string, member, "", "member id");
ABSL_FLAG(int, bootstrap, 0, "size of generation 0 (0 = join a running job)");
ABSL_FLAG(int, logical_workers, 4, "L");
ABSL_FLAG(int64_t, steps, 40, "steps to train");
ABSL_FLAG(bool, deterministic, false, "bitwise-reproducible mode");
ABSL_FLAG(int, hidden, 32, "hidden width");
ABSL_FLAG(int64_t, init_seed, -1, "seed of the initial weights (-1: the pid, a different start per process)");
ABSL_FLAG(std::string, events, "", "JSON lines output");
ABSL_FLAG(std::string, params, "", "final parameters and buffers output (raw float32)");
ABSL_FLAG(std::string, die_at, "", "STEP:PHASE (forward|backward): SIGKILL this rank during that step");
ABSL_FLAG(bool, die_after_join, false,
          "SIGKILL this rank after its last backward of the first step another member joined for");

namespace {

using malle::elastic::ElasticTrainer;
using nlohmann::json;

constexpr int64_t kSamples = 256;
constexpr int64_t kFeatures = 16;
constexpr int64_t kClasses = 4;

class Events {
 public:
  explicit Events(const std::string& path) : out_(path, std::ios::app) {}
  void Emit(json e) { out_ << e.dump() << std::endl; }

 private:
  std::ofstream out_;
};

int Run(Events& events) {
  at::set_num_threads(1);  // deterministic mode needs the same thread count everywhere
  const std::string addr = absl::GetFlag(FLAGS_store);
  const size_t colon = addr.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(addr.substr(colon + 1), &port)) return 2;
  auto store = malle::comm::ControlStore::Connect(addr.substr(0, colon), port, absl::Seconds(20));
  if (!store.ok()) {
    events.Emit({{"ev", "error"}, {"status", store.status().ToString()}});
    return 1;
  }
  auto job = (*store)->WithPrefix(malle::comm::JobPrefix(absl::GetFlag(FLAGS_job)));

  // Data: identical on every rank (fixed generator).
  at::Generator data_gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  at::Tensor x = at::randn({kSamples, kFeatures}, data_gen, at::TensorOptions());
  at::Tensor truth = at::randn({kFeatures, kClasses}, data_gen, at::TensorOptions());
  at::Tensor y = at::matmul(x, truth).argmax(1);
  // Model: a random start seeded by --init_seed, by default different on every
  // process (pid), so only the state sync can make the replicas agree.
  const int64_t init_seed = absl::GetFlag(FLAGS_init_seed);
  at::Generator init = at::make_generator<at::CPUGeneratorImpl>(
      static_cast<uint64_t>(init_seed >= 0 ? init_seed : ::getpid()));
  const int64_t hidden = absl::GetFlag(FLAGS_hidden);
  at::Tensor w1 = (at::randn({kFeatures, hidden}, init, at::TensorOptions()) * 0.3).set_requires_grad(true);
  at::Tensor b1 = (at::randn({hidden}, init, at::TensorOptions()) * 0.1).set_requires_grad(true);
  at::Tensor w2 = (at::randn({hidden, kClasses}, init, at::TensorOptions()) * 0.3).set_requires_grad(true);
  at::Tensor b2 = (at::randn({kClasses}, init, at::TensorOptions()) * 0.1).set_requires_grad(true);
  torch::optim::Adam adam({w1, b1, w2, b2}, torch::optim::AdamOptions(1e-2));
  // Buffers: batch-normalisation statistics of the hidden layer and its counter.
  at::Tensor running_mean = at::zeros({hidden});
  at::Tensor running_var = at::ones({hidden});
  at::Tensor batches = at::zeros({}, at::kLong);
  int64_t die_step = -1;
  std::string die_phase;
  if (const std::string die = absl::GetFlag(FLAGS_die_at); !die.empty()) {
    const size_t colon = die.find(':');
    if (colon == std::string::npos || !absl::SimpleAtoi(die.substr(0, colon), &die_step)) return 2;
    die_phase = die.substr(colon + 1);
  }

  malle::comm::ElasticGroupOptions group;
  group.job_id = absl::GetFlag(FLAGS_job);
  group.member_id = absl::GetFlag(FLAGS_member);
  group.bootstrap_size = absl::GetFlag(FLAGS_bootstrap);
  group.heartbeat_timeout = absl::Seconds(4);
  group.recovery_grace = absl::Milliseconds(300);
  group.rendezvous_timeout = absl::Seconds(40);
  malle::elastic::ElasticTrainerOptions options;
  options.logical_workers = absl::GetFlag(FLAGS_logical_workers);
  options.seed = 7;
  options.deterministic = absl::GetFlag(FLAGS_deterministic);
  options.num_samples = kSamples;
  options.batch_size = 8;
  options.steps = absl::GetFlag(FLAGS_steps);
  options.bucket_bytes = 1024;  // several buckets even for this small model
  // The model is a few KB: send its flat buffers as they are (the default
  // packs anything under 1 MiB), so joiners receive their parameters in place.
  options.state_direct_min_bytes = 1024;
  auto created = ElasticTrainer::Create(
      *store, group, options,
      malle::elastic::ModelState::FromTensors({w1, b1, w2, b2}, {running_mean, running_var, batches}), adam);
  if (!created.ok()) {
    events.Emit({{"ev", "error"}, {"status", created.status().ToString()}});
    return 1;
  }
  ElasticTrainer& trainer = **created;
  int64_t schedule = 0;  // the tracked counter
  absl::Status tracked = trainer.Track(
      "schedule", [&] { return malle::elastic::ExtraState{{}, absl::StrCat(schedule)}; },
      [&](const malle::elastic::ExtraState& s) {
        return absl::SimpleAtoi(s.bytes, &schedule) ? absl::OkStatus()
                                                     : absl::InvalidArgumentError("schedule: not a number");
      });
  if (!tracked.ok()) return 1;
  events.Emit({{"ev", "start"}, {"member", group.member_id}});
  std::set<int64_t> started;
  int64_t repeated = 0;  // steps this rank started more than once

  size_t seen_events = 0;
  for (;;) {
    // Test gate: hold before starting a step at or past it. The boundary
    // after the last step starts no step, so it is never held.
    for (;;) {
      if (trainer.step() >= trainer.total_steps()) break;
      auto gate = job->TryGet("ctl/gate");
      int64_t g = 0;
      if (!gate.ok() || !gate->has_value() || !absl::SimpleAtoi(**gate, &g) || trainer.step() < g) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    auto plan = trainer.NextStep();
    while (seen_events < trainer.history().size()) {
      const auto& ev = trainer.history()[seen_events++];
      if (absl::GetFlag(FLAGS_die_after_join) && die_step < 0 &&
          ev.kind != malle::comm::Transition::Kind::kJoined && !ev.joined.empty()) {
        die_step = ev.resume_step;
        die_phase = "backward";
      }
      events.Emit({{"ev", "transition"},
                   {"kind", std::string(malle::comm::TransitionKindName(ev.kind))},
                   {"gen", ev.generation},
                   {"size", ev.size},
                   {"rank", ev.rank},
                   {"resume", ev.resume_step},
                   {"state_bytes", ev.state_bytes},
                   {"state_in_place", ev.state_in_place},
                   {"state_landed", ev.state_landed},
                   {"state_ms", absl::ToDoubleMilliseconds(ev.phases.state)},
                   {"total_ms", absl::ToDoubleMilliseconds(ev.phases.total)}});
    }
    if (!plan.ok()) {
      events.Emit({{"ev", "error"}, {"status", plan.status().ToString()}});
      return absl::IsInvalidArgument(plan.status()) ? 5 : 1;
    }
    if (!plan->has_value()) break;
    const int64_t step = (*plan)->step;
    if (!started.insert(step).second) ++repeated;
    const size_t micro = (*plan)->workers.size();
    for (size_t i = 0; i < micro; ++i) {
      trainer.BeginMicroBatch(i);
      const auto& idx = (*plan)->workers[i].indices;
      at::Tensor rows = at::tensor(idx, at::kLong);
      at::Tensor xb = x.index_select(0, rows);
      at::Tensor yb = y.index_select(0, rows);
      // Normalised after the ReLU: a bias right before a normalisation gets a
      // zero gradient whose rounding noise Adam turns into full steps, i.e. a
      // parameter that depends on summation order.
      at::Tensor h = at::relu(at::matmul(xb, w1) + b1);
      h = at::batch_norm(h, {}, {}, running_mean, running_var, /*training=*/true, 0.1, 1e-5, false);
      batches.add_(1);
      h = at::dropout(h, 0.2, /*train=*/true);
      at::Tensor loss = at::cross_entropy_loss(at::matmul(h, w2) + b2, yb);
      if (step == die_step && i == 0 && die_phase == "forward") std::raise(SIGKILL);
      loss.backward();
      if (step == die_step && i + 1 == micro && die_phase == "backward") std::raise(SIGKILL);
      absl::Status ended = trainer.EndMicroBatch();
      if (!ended.ok()) {
        events.Emit({{"ev", "error"}, {"status", ended.ToString()}});
        return 1;
      }
    }
    auto committed = trainer.FinishStep();
    if (!committed.ok()) {
      events.Emit({{"ev", "error"}, {"status", committed.status().ToString()}});
      return 1;
    }
    // Unguarded, as users step a schedule: the trainer undoes both when the step
    // did not commit.
    ++schedule;
    for (auto& g : adam.param_groups()) g.options().set_lr(g.options().get_lr() * 0.97);
  }
  if (trainer.left()) {
    events.Emit({{"ev", "done"}, {"how", "left"}, {"step", trainer.step()}});
    return 0;
  }
  auto digest = trainer.StateDigest();
  std::vector<std::string> members = trainer.group()->members();
  events.Emit({{"ev", "done"},
               {"how", "finished"},
               {"step", trainer.step()},
               {"redone", trainer.redone_steps()},
               {"repeated", repeated},
               {"schedule", schedule},
               {"gen", trainer.generation()},
               {"members", members},
               {"digest", digest.ok() ? *digest : digest.status().ToString()}});
  std::ofstream out(absl::GetFlag(FLAGS_params), std::ios::binary);
  for (const at::Tensor& p : {w1, b1, w2, b2, running_mean, running_var, batches}) {
    at::Tensor c = p.detach().to(at::kFloat).contiguous();
    out.write(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float));
  }
  return out.good() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_store).empty() || absl::GetFlag(FLAGS_job).empty() ||
      absl::GetFlag(FLAGS_member).empty() || absl::GetFlag(FLAGS_events).empty() ||
      absl::GetFlag(FLAGS_params).empty()) {
    std::cerr << "--store, --job, --member, --events and --params are required\n";
    return 2;
  }
  Events events(absl::GetFlag(FLAGS_events));
  return Run(events);
}
