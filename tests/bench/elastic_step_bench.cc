// elastic_step_bench: steady-state step time of the C++ ElasticTrainer against
// LibTorch's DDP engine on a fixed group, same model, same ranks, same run.
//
// Ranks are threads of this process (2 by default), each with its own replica
// of an MLP (1024 -> 2048 x5 -> 1024 by default: 21.0 M parameters) and Adam,
// on synthetic data. Three modes run in alternating blocks of --block steps
// (A B C, then B C A, ...) so that a change in the machine's load hits each:
//   ddp:      c10d::Reducer bound to a fixed 2-rank Gloo process group with
//             its built-in allreduce (what torch.nn.parallel.
//             DistributedDataParallel runs underneath), buckets in DDP's
//             order, Adam; DDP's default gradient_as_bucket_view = false
//             (--ddp_bucket_view: true, as the elastic reducer has it);
//   reducer:  ElasticTrainer, use_reducer = true (Reducer + elastic comm hook
//             over the current generation; the default);
//   flat:     ElasticTrainer, use_reducer = false (flat buckets after backward).
// L = ranks (one micro-batch per rank and step), --batch samples per rank.
// The figure per mode is the median of rank 0's step times over the measured
// blocks (the first block of each mode is warm-up), and the median of the
// per-round ratios against ddp.
//
//   build/ci/tests/bench/elastic_step_bench --blocks=8 --block=5
//
// A program, not a test: prints the table and the target (<= 1.02x ddp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/randn.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/activation.h>
#include <torch/optim/adam.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/barrier.h"
#include "libmalle/comm/backend.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/elastic/elastic_trainer.h"

ABSL_FLAG(int, ranks, 2, "ranks (threads)");
ABSL_FLAG(int, width, 2048, "hidden width of the MLP");
ABSL_FLAG(int, layers, 5, "hidden layers");
ABSL_FLAG(int, io, 1024, "input and output width");
ABSL_FLAG(int, batch, 4, "samples per rank and step");
ABSL_FLAG(int, blocks, 8, "measured blocks per mode (plus one warm-up block)");
ABSL_FLAG(int, block, 5, "steps per block");
ABSL_FLAG(int64_t, bucket_mb, 25, "bucket size, MiB (all modes)");
ABSL_FLAG(bool, ddp_bucket_view, false,
          "ddp mode with gradient_as_bucket_view = true (DDP's option; ElasticTrainer's reducer "
          "always uses it) instead of DDP's default");
ABSL_FLAG(std::string, only, "", "run only this mode (ddp, reducer or flat; for profiling), no table");

namespace {

using Clock = std::chrono::steady_clock;
using malle::elastic::ElasticTrainer;
using malle::elastic::ElasticTrainerOptions;

constexpr int kModes = 3;
const char* const kModeNames[kModes] = {"ddp", "reducer", "flat"};

torch::nn::Sequential MakeModel() {
  torch::nn::Sequential net;
  int in = absl::GetFlag(FLAGS_io);
  for (int i = 0; i < absl::GetFlag(FLAGS_layers); ++i) {
    net->push_back(torch::nn::Linear(in, absl::GetFlag(FLAGS_width)));
    net->push_back(torch::nn::ReLU());
    in = absl::GetFlag(FLAGS_width);
  }
  net->push_back(torch::nn::Linear(in, absl::GetFlag(FLAGS_io)));
  return net;
}

struct Replica {
  torch::nn::Sequential net;
  std::unique_ptr<torch::optim::Adam> adam;
  std::vector<at::Tensor> params;
};

Replica MakeReplica() {
  Replica r;
  r.net = MakeModel();
  for (const at::Tensor& p : r.net->parameters()) r.params.push_back(p);
  r.adam = std::make_unique<torch::optim::Adam>(r.params, torch::optim::AdamOptions(1e-4));
  return r;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int Run() {
  const int n = absl::GetFlag(FLAGS_ranks);
  const int block = absl::GetFlag(FLAGS_block);
  const int blocks = absl::GetFlag(FLAGS_blocks) + 1;  // + warm-up
  const int64_t bucket_bytes = absl::GetFlag(FLAGS_bucket_mb) << 20;
  const int batch = absl::GetFlag(FLAGS_batch);
  at::set_num_threads(1);  // ranks are threads; one intra-op thread each
  const std::string only = absl::GetFlag(FLAGS_only);
  if (!only.empty() && only != "ddp" && only != "reducer" && only != "flat") {
    std::fprintf(stderr, "--only: expected ddp, reducer or flat, got '%s'\n", only.c_str());
    return 2;
  }

  auto store = malle::comm::ControlStore::InMemory();
  absl::Barrier* start = new absl::Barrier(n);
  // [mode][round] -> rank 0's step times (ms) of that block
  std::vector<std::vector<std::vector<double>>> times(kModes, std::vector<std::vector<double>>(blocks));
  // Rank 0's phases, ms, over the measured blocks: step boundary (NextStep),
  // forward + backward (with the reduction where it overlaps), the rest
  // (FinishStep / optimizer step).
  std::vector<std::vector<double>> boundary(kModes), fwd_bwd(kModes), finish(kModes);
  int measuring_round = 0;
  std::vector<std::string> errors(n);
  int64_t num_params = 0;
  int num_buckets = 0;

  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const std::string& what) { errors[r] = what; };
      Replica mine[2] = {MakeReplica(), MakeReplica()};
      Replica ddp = MakeReplica();
      // DDP: a fixed group and the Reducer with its built-in allreduce.
      malle::comm::GroupSpec spec;
      spec.store = store->WithPrefix("ddp/")->c10d_store();
      spec.rank = r;
      spec.size = n;
      auto backend = malle::comm::MakeGlooBackend()->Create(spec);
      if (!backend.ok()) return fail(backend.status().ToString());
      auto pg = c10::make_intrusive<c10d::ProcessGroup>(spec.store, r, n);
      pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, *backend);
      pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
      auto [indices, limits] = c10d::compute_bucket_assignment_by_size(
          ddp.params, {static_cast<size_t>(bucket_bytes)}, std::vector<bool>(ddp.params.size(), false));
      std::reverse(indices.begin(), indices.end());
      const int buckets = static_cast<int>(indices.size());
      c10d::Reducer reducer(ddp.params, std::move(indices), pg, std::vector<bool>(ddp.params.size(), false),
                            bucket_bytes, false, absl::GetFlag(FLAGS_ddp_bucket_view), {}, bucket_bytes,
                            false, false,
                            std::vector<int64_t>(buckets, bucket_bytes));

      // Ours, twice.
      std::unique_ptr<ElasticTrainer> trainers[2];
      for (int k = 0; k < 2; ++k) {
        malle::comm::ElasticGroupOptions g;
        g.job_id = absl::StrCat("bench", k);
        g.member_id = absl::StrCat("m", r);
        g.bootstrap_size = n;
        ElasticTrainerOptions o;
        o.logical_workers = n;
        o.num_samples = 1 << 20;
        o.batch_size = batch;
        o.steps = 1 << 20;
        o.bucket_bytes = bucket_bytes;
        o.use_reducer = k == 0;
        o.publish_progress = false;
        auto t = ElasticTrainer::Create(store, g, o, malle::elastic::ModelState::FromModule(*mine[k].net),
                                        *mine[k].adam);
        if (!t.ok()) return fail(t.status().ToString());
        trainers[k] = *std::move(t);
      }
      const at::Tensor x = at::randn({batch, absl::GetFlag(FLAGS_io)});
      const at::Tensor y = at::randn({batch, absl::GetFlag(FLAGS_io)});
      if (r == 0) {
        for (const at::Tensor& p : ddp.params) num_params += p.numel();
        num_buckets = buckets;
      }

      auto since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
      auto ddp_step = [&] {
        for (at::Tensor& p : ddp.params) p.mutable_grad() = at::Tensor();
        const auto f0 = Clock::now();
        // As DDP's forward does: rebuild the buckets once, from the order the
        // gradients became ready in the first iteration.
        reducer.rebuild_buckets();
        at::Tensor loss = at::mse_loss(ddp.net->forward(x), y);
        reducer.prepare_for_backward({loss});
        loss.backward();
        const auto s0 = Clock::now();
        ddp.adam->step();
        if (r == 0 && measuring_round > 0) {
          fwd_bwd[0].push_back(std::chrono::duration<double, std::milli>(s0 - f0).count());
          finish[0].push_back(since(s0));
        }
        return true;
      };
      auto our_step = [&](int k) {
        const auto b0 = Clock::now();
        auto plan = trainers[k]->NextStep();
        if (r == 0 && measuring_round > 0) {
          boundary[k + 1].push_back(std::chrono::duration<double, std::milli>(Clock::now() - b0).count());
        }
        if (!plan.ok() || !plan->has_value()) return false;
        const auto f0 = Clock::now();
        for (size_t i = 0; i < (*plan)->workers.size(); ++i) {
          trainers[k]->BeginMicroBatch(i);
          at::mse_loss(mine[k].net->forward(x), y).backward();
          if (!trainers[k]->EndMicroBatch().ok()) return false;
        }
        const auto s0 = Clock::now();
        auto committed = trainers[k]->FinishStep();
        if (r == 0 && measuring_round > 0) {
          fwd_bwd[k + 1].push_back(std::chrono::duration<double, std::milli>(s0 - f0).count());
          finish[k + 1].push_back(since(s0));
        }
        return committed.ok() && *committed;
      };

      if (start->Block()) delete start;
      for (int round = 0; round < blocks; ++round) {
        if (r == 0) measuring_round = round;
        for (int j = 0; j < kModes; ++j) {
          const int mode = (round + j) % kModes;
          if (!only.empty() && only != kModeNames[mode]) continue;
          for (int s = 0; s < block; ++s) {
            const auto t0 = Clock::now();
            const bool ok = mode == 0 ? ddp_step() : our_step(mode - 1);
            if (!ok) return fail(absl::StrCat(kModeNames[mode], ": step failed"));
            if (r == 0) {
              times[mode][round].push_back(
                  std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
            }
          }
        }
      }
      for (auto& t : trainers) (void)t->RequestLeave();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!errors[r].empty()) {
      std::fprintf(stderr, "rank %d: %s\n", r, errors[r].c_str());
      return 1;
    }
  }

  if (!only.empty()) return 0;
  std::printf("elastic_step_bench: %d ranks (threads, 1 intra-op thread each), MLP %.1f M parameters, "
              "Adam, %d samples per rank, %d buckets of <= %ld MiB\n",
              n, num_params / 1e6, batch, num_buckets, static_cast<long>(absl::GetFlag(FLAGS_bucket_mb)));
  std::printf("%d measured blocks of %d steps per mode (1 warm-up block left out), rank 0, ms/step\n\n",
              blocks - 1, block);
  std::printf("%-9s %12s %16s %22s %20s %12s %22s\n", "mode", "median", "vs ddp (pooled)", "vs ddp (per round)",
              "boundary (NextStep)", "fwd+bwd", "FinishStep/optim step");
  std::vector<double> pooled(kModes);
  for (int m = 0; m < kModes; ++m) {
    std::vector<double> all;
    for (int round = 1; round < blocks; ++round) all.insert(all.end(), times[m][round].begin(), times[m][round].end());
    pooled[m] = Median(all);
  }
  double reducer_ratio = 0;
  for (int m = 0; m < kModes; ++m) {
    std::vector<double> ratios;
    for (int round = 1; round < blocks; ++round) ratios.push_back(Median(times[m][round]) / Median(times[0][round]));
    const double per_round = Median(ratios);
    if (m == 1) reducer_ratio = per_round;
    std::printf("%-9s %12.1f %15.3fx %21.3fx  (range %.2f-%.2f) %12s %12.1f %22.1f\n", kModeNames[m], pooled[m],
                pooled[m] / pooled[0], per_round, *std::min_element(ratios.begin(), ratios.end()),
                *std::max_element(ratios.begin(), ratios.end()),
                m == 0 ? "-" : absl::StrFormat("%.1f", Median(boundary[m])).c_str(), Median(fwd_bwd[m]),
                Median(finish[m]));
  }
  std::printf("\ntarget: steady state <= 1.02x DDP's engine (gradient_as_bucket_view = %s): reducer %.3fx per "
              "round, %.3fx pooled  %s\n",
              absl::GetFlag(FLAGS_ddp_bucket_view) ? "true" : "false, DDP's default", reducer_ratio,
              pooled[1] / pooled[0], reducer_ratio <= 1.02 ? "MET" : "MISSED");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return Run();
}
