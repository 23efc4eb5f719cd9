// train_digits_cpp: the digits classifier of examples/train_digits.py as a
// LibTorch C++ training loop on malle::elastic::ElasticTrainer.
//
// An ordinary C++ loop (torch::nn modules, torch::optim::Adam) with the few
// lines ElasticTrainer needs: it reads its identity from the environment the
// launcher sets (MALLE_STORE, MALLE_JOB_ID, MALLE_MEMBER_ID,
// MALLE_BOOTSTRAP_SIZE; libmalle/cluster/rank_env.h), so it runs under
// `malletrain local` and under the allocator's node agents exactly like the
// Python example, and as a fixed-size job under `torchrun --no-python` and srun:
//
//   malletrain local --nodes 2 --schedule "step=20 join 2, step=40 leave 1" -- \
//       build/ci/examples/train_digits_cpp --data $(python -c "import sklearn, os; \
//       print(os.path.join(os.path.dirname(sklearn.__file__), 'datasets/data/digits.csv.gz'))")
//
// Data: the 8x8 digits set scikit-learn ships inside its package
// (sklearn/datasets/data/digits.csv.gz: 1,797 rows of 64 pixel values 0..16
// and the label), read here with zlib; a fixed split (seed 1234) keeps 297
// samples for the test. The split is not the Python example's (that one uses
// torch.randperm), so the two examples' numbers differ.
//
// SIGTERM (an agent stopping the job, a reclaim) asks to leave at the next
// step boundary: the step in flight is finished, the others carry on.
//
// Output: one line per membership change and per 10 steps; at the end rank 0
// prints the test accuracy and, with --out, writes DIR/result.json (steps,
// digest, accuracy, the resize history, the tensors' names and sizes) and
// DIR/params.bin (the parameters and Adam's moments as
// raw float32 in named_parameters() order) so a run can be compared with
// another schedule's.
//
// Exit codes: 0 finished or left, 1 error, 2 bad flags, data or job spec
// (kInvalidArgument, e.g. a model that does not match the running job's).
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/tensor.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <ATen/Context.h>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/cluster/rank_env.h"
#include "libmalle/elastic/elastic_trainer.h"
#include "libmalle/elastic/launch_session.h"
#include "libmalle/elastic/rank_engine.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, data, "", "digits.csv.gz (or .csv) from scikit-learn's package (required)");
ABSL_FLAG(int, logical_workers, 4, "L: logical workers (the global batch is L x --batch)");
ABSL_FLAG(int64_t, batch, 16, "samples per logical worker per step");
ABSL_FLAG(int64_t, steps, 60, "steps to train");
ABSL_FLAG(int, hidden, 64, "hidden width");
ABSL_FLAG(double, lr, 1e-2, "Adam learning rate");
ABSL_FLAG(uint64_t, seed, 0, "data order and the logical workers' RNG streams");
ABSL_FLAG(bool, deterministic, false, "bitwise the same result whatever the schedule");
ABSL_FLAG(std::string, out, "", "rank 0 writes result.json and params.bin here");
ABSL_FLAG(absl::Duration, step_sleep, absl::ZeroDuration(),
          "time to sleep after each committed step (e.g. 100ms): paces the job so that joiners "
          "are in before a schedule's later events (a demo, a test on a loaded machine)");

namespace {

namespace elastic = malle::elastic;
using nlohmann::json;

constexpr int kPixels = 64;
constexpr int kClasses = 10;
constexpr int kTest = 297;  // held out, as in examples/train_digits.py

std::atomic<bool> g_leave{false};
void OnSigterm(int) { g_leave.store(true); }

struct Digits {
  at::Tensor x_train, y_train, x_test, y_test;
};

// Reads scikit-learn's digits.csv.gz: 65 integers per line (64 pixels, label).
absl::StatusOr<Digits> LoadDigits(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files too
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("--data: cannot open ", path));
  std::string text;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) text.append(buf, n);
  const bool failed = n < 0;
  gzclose(f);
  if (failed) return absl::DataLossError(absl::StrCat("--data: ", path, ": not a readable gzip file"));

  std::vector<float> pixels;
  std::vector<int64_t> labels;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    ++line_no;
    std::vector<absl::string_view> cells = absl::StrSplit(line, ',');
    if (cells.size() != kPixels + 1) {
      return absl::InvalidArgumentError(absl::StrFormat("--data: %s line %d: %d values, expected %d", path,
                                                        line_no, cells.size(), kPixels + 1));
    }
    for (int i = 0; i <= kPixels; ++i) {
      double v;
      if (!absl::SimpleAtod(cells[i], &v) || v < 0 || v > (i < kPixels ? 16 : kClasses - 1)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("--data: %s line %d, value %d: bad value '%s'", path, line_no, i + 1, cells[i]));
      }
      if (i < kPixels) {
        pixels.push_back(static_cast<float>(v / 16.0));
      } else {
        labels.push_back(static_cast<int64_t>(v));
      }
    }
  }
  const int64_t rows = static_cast<int64_t>(labels.size());
  if (rows <= kTest) {
    return absl::InvalidArgumentError(absl::StrFormat("--data: %s has %d rows, need more than %d", path, rows, kTest));
  }
  at::Tensor x = at::from_blob(pixels.data(), {rows, kPixels}, at::kFloat).clone();
  at::Tensor y = at::tensor(labels, at::kLong);
  // A fixed split, independent of the job's seed.
  std::vector<int64_t> perm(rows);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(1234);
  std::shuffle(perm.begin(), perm.end(), rng);
  at::Tensor test = at::tensor(std::vector<int64_t>(perm.begin(), perm.begin() + kTest), at::kLong);
  at::Tensor train = at::tensor(std::vector<int64_t>(perm.begin() + kTest, perm.end()), at::kLong);
  return Digits{x.index_select(0, train), y.index_select(0, train), x.index_select(0, test),
                y.index_select(0, test)};
}

absl::Status Run() {
  const std::string out_dir = absl::GetFlag(FLAGS_out);
  MALLE_ASSIGN_OR_RETURN(Digits data, LoadDigits(absl::GetFlag(FLAGS_data)));

  // The model and optimizer, as in any LibTorch program. Replicas may start
  // different: the job's state (rank 0's at the start) is what every rank trains.
  at::manual_seed(0);
  const int hidden = absl::GetFlag(FLAGS_hidden);
  torch::nn::Sequential net(torch::nn::Linear(kPixels, hidden), torch::nn::ReLU(),
                            torch::nn::Linear(hidden, kClasses));
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(absl::GetFlag(FLAGS_lr)));

  // The elastic part: identity from the launcher (malletrain's, or torchrun / srun as a
  // fixed-size job: cluster::ReadLaunchEnv), then the engine that environment describes
  // (its park store, its reports to the allocator: elastic::CreateRankEngine), and the
  // trainer over it.
  MALLE_ASSIGN_OR_RETURN(malle::cluster::LaunchEnv launch, malle::cluster::ReadLaunchEnv());
  // Under torchrun or srun, task 0 hosts the job's store, and every member says it is done
  // at the end so that the store outlives the last generation's last step (docs/elastic.md).
  MALLE_ASSIGN_OR_RETURN(std::unique_ptr<elastic::LaunchSession> session,
                         elastic::LaunchSession::Open(launch, absl::Seconds(60)));
  int last_size = 0;  // the last generation's, once the loop ended
  // Declared before the trainer, so it runs once the trainer is gone, on every path.
  auto close_session = absl::MakeCleanup([&] {
    absl::Status closed = session->Close(last_size, absl::Seconds(60));
    if (!closed.ok()) std::cerr << "warning: " << closed << std::endl;
  });
  elastic::ElasticTrainerOptions o;
  o.num_samples = data.y_train.size(0);
  o.batch_size = absl::GetFlag(FLAGS_batch);
  o.steps = absl::GetFlag(FLAGS_steps);
  elastic::RankEngineOptions ro;
  ro.engine.logical_workers = absl::GetFlag(FLAGS_logical_workers);
  ro.engine.seed = absl::GetFlag(FLAGS_seed);
  ro.engine.deterministic = absl::GetFlag(FLAGS_deterministic);
  MALLE_ASSIGN_OR_RETURN(std::unique_ptr<elastic::Engine> engine, elastic::CreateRankEngine(launch.rank, ro));
  MALLE_ASSIGN_OR_RETURN(auto trainer, elastic::ElasticTrainer::Create(std::move(engine), o,
                                                                       elastic::ModelState::FromModule(*net), adam));

  size_t shown = 0;
  bool leave_asked = false;
  at::Tensor last_loss;
  for (;;) {
    if (g_leave.load() && !leave_asked && trainer->rank() >= 0) {
      leave_asked = true;
      MALLE_RETURN_IF_ERROR(trainer->RequestLeave());
    }
    MALLE_ASSIGN_OR_RETURN(std::optional<elastic::StepPlan> plan, trainer->NextStep());
    for (; shown < trainer->history().size(); ++shown) {
      const elastic::ResizeEvent& e = trainer->history()[shown];
      if (shown == 0 && !trainer->resumed_from().empty()) {  // a parked job's new incarnation
        std::cout << absl::StrFormat("[%s] resumed from %s at step %d", trainer->member_id(),
                                     trainer->resumed_from(), trainer->step())
                  << std::endl;
      }
      std::cout << absl::StrFormat("[%s] generation %d: %s, size %d, rank %d, resumes at step %d, "
                                   "pause %.1f ms (state %.1f ms, %.2f MB)",
                                   trainer->member_id(), e.generation,
                                   malle::comm::TransitionKindName(e.kind), e.size, e.rank, e.resume_step, absl::ToDoubleMilliseconds(e.phases.total),
                                   absl::ToDoubleMilliseconds(e.phases.state), e.state_bytes / 1e6)
                << std::endl;
    }
    if (!plan) break;
    for (size_t i = 0; i < plan->workers.size(); ++i) {
      trainer->BeginMicroBatch(i);
      at::Tensor rows = at::tensor(plan->workers[i].indices, at::kLong);
      at::Tensor logits = net->forward(data.x_train.index_select(0, rows));
      at::Tensor loss = at::cross_entropy_loss(logits, data.y_train.index_select(0, rows));
      loss.backward();
      last_loss = loss.detach();
      MALLE_RETURN_IF_ERROR(trainer->EndMicroBatch());
    }
    MALLE_ASSIGN_OR_RETURN(bool committed, trainer->FinishStep());
    if (committed) absl::SleepFor(absl::GetFlag(FLAGS_step_sleep));
    if (committed && plan->rank == 0 && plan->step % 10 == 0) {
      std::cout << absl::StrFormat("step %d: size %d, loss %.4f", plan->step, plan->size,
                                   last_loss.item<float>())
                << std::endl;
    }
  }

  last_size = trainer->size();
  if (trainer->left()) {
    std::cout << absl::StrFormat("[%s] left at step %d%s", trainer->member_id(), trainer->step(),
                                 trainer->parked() ? ", the job's last member: parked its state" : "")
              << std::endl;
    return absl::OkStatus();
  }
  MALLE_ASSIGN_OR_RETURN(std::string digest, trainer->StateDigest());
  if (trainer->rank() != 0) return absl::OkStatus();

  at::Tensor pred;
  {
    at::NoGradGuard no_grad;
    pred = at::argmax(net->forward(data.x_test), 1);
  }
  const double accuracy = pred.eq(data.y_test).to(at::kFloat).mean().item<float>();
  std::cout << absl::StrFormat("done: %d steps, %d redone, test accuracy %.3f, state digest %s",
                               trainer->step(), trainer->redone_steps(), accuracy, digest)
            << std::endl;
  if (!out_dir.empty()) {
    json history = json::array();
    for (const elastic::ResizeEvent& e : trainer->history()) {
      history.push_back({{"kind", std::string(malle::comm::TransitionKindName(e.kind))}, {"generation", e.generation}, {"size", e.size},
                         {"pause_s", absl::ToDoubleSeconds(e.phases.total)}, {"state_bytes", e.state_bytes}});
    }
    // The whole state, tensor by tensor: the parameters, then the optimizer's
    // (Adam's moments), as float32; result.json names them and their sizes.
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& item : net->named_parameters()) tensors.emplace_back(item.key(), item.value());
    for (const auto& item : net->named_parameters()) {
      auto it = adam.state().find(item.value().unsafeGetTensorImpl());
      if (it == adam.state().end()) continue;
      const auto& st = static_cast<const torch::optim::AdamParamState&>(*it->second);
      tensors.emplace_back("optimizer/" + item.key() + "/exp_avg", st.exp_avg());
      tensors.emplace_back("optimizer/" + item.key() + "/exp_avg_sq", st.exp_avg_sq());
    }
    json manifest = json::array();
    std::ofstream params(out_dir + "/params.bin", std::ios::binary);
    for (const auto& [name, t] : tensors) {
      at::Tensor c = t.detach().to(at::kFloat).contiguous();
      params.write(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float));
      manifest.push_back({name, c.numel()});
    }
    if (!params.good()) return absl::DataLossError(absl::StrCat("--out: cannot write ", out_dir, "/params.bin"));
    json result = {{"steps", trainer->step()},   {"redone", trainer->redone_steps()},
                   {"digest", digest},          {"accuracy", accuracy},
                   {"size", trainer->size()},   {"history", history},
                   {"tensors", manifest}};
    std::ofstream(out_dir + "/result.json") << result.dump(2) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("The digits classifier as an elastic LibTorch C++ job (run it under "
                               "`malletrain local` or a node agent).");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_data).empty()) {
    std::cerr << "train_digits_cpp: --data is required (scikit-learn's datasets/data/digits.csv.gz)\n";
    return 2;
  }
  std::signal(SIGTERM, OnSigterm);
  absl::Status s = Run();
  if (!s.ok()) {
    std::cerr << "train_digits_cpp: " << s << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kNotFound ||
                   s.code() == absl::StatusCode::kDataLoss
               ? 2
               : 1;
  }
  return 0;
}
